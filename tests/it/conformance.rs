//! Upstream's own node tests against nodelet: a fixed, fast subset of the [NodeConformance]
//! tests of e2e.test (built from the control plane's module by hack/k8s/build.sh), run against
//! one nodelet node, so a regression against upstream's expectations fails `make test`.
//! `make conformance` runs all of them.

use std::time::Duration;

use crate::bed::{eventually, testbed_dir};
use crate::cluster::join_serving;
use crate::control_plane::ControlPlane;

/// The subset, by the full names of upstream's tests (each matched at its end): pods, probes,
/// service links, lifecycle hooks, ConfigMap/Secret/downward API/projected and emptyDir volumes,
/// the container runtime's statuses and termination messages, logs and exec, active deadlines,
/// OS admission, ephemeral containers.
const SUBSET: &[&str] = &[
    "[sig-node] Pods should get a host IP [NodeConformance] [Conformance]",
    "[sig-node] Pods should be submitted and removed [NodeConformance] [Conformance]",
    "[sig-node] Pods should contain environment variables for services [NodeConformance] [Conformance]",
    "[sig-node] Probing container should be restarted with a /healthz http liveness probe [NodeConformance] [Conformance]",
    "[sig-node] [NodeConformance] [FeatureGate:SidecarContainers] Probing restartable init container should be ready immediately after startupProbe succeeds",
    "[sig-node] Container Lifecycle Hook when create a pod with lifecycle hook should execute poststart http hook properly [NodeConformance] [Conformance]",
    "[sig-node] Container Lifecycle Hook when create a pod with lifecycle hook should execute prestop exec hook properly [NodeConformance] [Conformance]",
    "[sig-storage] ConfigMap should be consumable from pods in volume with mappings [NodeConformance] [Conformance]",
    "[sig-storage] Secrets should be consumable from pods in volume with defaultMode set [LinuxOnly] [NodeConformance] [Conformance]",
    "[sig-storage] Downward API volume should update labels on modification [NodeConformance] [Conformance]",
    "[sig-storage] Projected combined should project all components that make up the projection API [Projection] [NodeConformance] [Conformance]",
    "[sig-storage] EmptyDir volumes should support (non-root,0644,tmpfs) [LinuxOnly] [NodeConformance] [Conformance]",
    "[sig-node] Container Runtime blackbox test when starting a container that exits should run with the expected status [NodeConformance] [Conformance]",
    "[sig-node] Container Runtime blackbox test on terminated container should report termination message from log output if TerminationMessagePolicy FallbackToLogsOnError is set [NodeConformance] [Conformance]",
    "[sig-node] Kubelet when scheduling a busybox command in a pod should print the output to logs [NodeConformance] [Conformance]",
    "[sig-node] Pods should support remote command execution over websockets [NodeConformance] [Conformance]",
    "[sig-node] InitContainer [NodeConformance] should invoke init containers on a RestartNever pod [Conformance]",
    "[sig-node] Downward API should provide pod name, namespace and IP address as env vars [NodeConformance] [Conformance]",
    "[sig-node] Pods should allow activeDeadlineSeconds to be updated [NodeConformance] [Conformance]",
    "[sig-node] Ephemeral Containers [NodeConformance] will start an ephemeral container in an existing pod [Conformance]",
    "[sig-node] Ephemeral Containers [NodeConformance] should update the ephemeral containers in an existing pod [Conformance]",
    "[sig-node] PodOSRejection [NodeConformance] Kubelet [LinuxOnly] should reject pod when the node OS doesn't match pod's OS",
];

/// `text` as a regular expression that matches it literally.
fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[tokio::test]
async fn upstreams_node_conformance_subset_passes() {
    let cp = ControlPlane::start("conformance", true).await;
    // The tests read logs and exec through the API server.
    let (node, _) = join_serving(&cp, "conformance", &[]).await;
    let nodes = cp.nodes();
    eventually("the node Ready", Duration::from_secs(60), || async {
        let n = nodes.get_opt(&node.name).await.ok().flatten()?;
        let ready = n
            .status?
            .conditions?
            .into_iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(())
    })
    .await;

    let repo_list = testbed_dir().join("e2e/repo-list.yaml");
    assert!(
        repo_list.exists(),
        "no {} (make e2e-images builds and pushes upstream's test images)",
        repo_list.display()
    );
    let focus = SUBSET
        .iter()
        .map(|t| format!("{}$", literal(t)))
        .collect::<Vec<_>>()
        .join("|");
    let report = node.path("e2e");
    std::fs::create_dir_all(&report).expect("the report dir");
    let bin = cp.bin();
    let out = tokio::process::Command::new(bin.join("ginkgo"))
        .args(["--procs=3", "--timeout=15m", "--no-color", "--succinct"])
        .arg(format!("--focus={focus}"))
        .arg(bin.join("e2e.test"))
        .arg("--")
        .arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .arg("--kubectl-path")
        .arg(bin.join("kubectl"))
        .arg("--kube-test-repo-list")
        .arg(&repo_list)
        .arg("--report-dir")
        .arg(&report)
        .arg("--e2e-output-dir")
        .arg(&report)
        .args(["--disable-log-dump", "--non-blocking-taints="])
        .output()
        .await
        .expect("ginkgo runs e2e.test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "upstream's tests failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every test of the subset was selected: a renamed upstream test must not pass by matching
    // nothing. Ginkgo's header says how many specs the focus selected.
    let selected = format!("suite - {}/", SUBSET.len());
    assert!(
        stdout.contains(&selected),
        "expected the focus to select all {} tests of the subset:\n{stdout}",
        SUBSET.len()
    );
    node.finish().await;
}

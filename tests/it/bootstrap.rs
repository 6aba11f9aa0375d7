//! A control plane bootstrapped the way clusters are built: `kubeadm init` with nodelet as the
//! node agent (hack/k8s/bootstrap.sh), in a machine of its own (private mount, network and UTS
//! namespaces over a containerd of its own), with kubeadm's addons (kube-proxy, CoreDNS), checked
//! with the kubectl built beside it.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use nodelet::runtime::{ContainerState, RuntimeClient};
use serde_json::Value;

use crate::bed::{eventually, registry, runtime_at, testbed_dir};

const CONTROL_PLANE: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// A machine bootstrapped by `bootstrap.sh up`, taken down on drop (a failed test included).
struct Machine {
    name: &'static str,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/k8s/bootstrap.sh")
}

fn command(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg(script())
        .args(args)
        .env("NODELET", env!("CARGO_BIN_EXE_nodelet"))
        .stdin(std::process::Stdio::null());
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl Machine {
    /// Runs `kubeadm init` in a new machine; it must exit 0.
    async fn init(name: &'static str, net: u8) -> Machine {
        let machine = Machine { name };
        let out = command(&["up", name, &net.to_string()])
            .output()
            .await
            .expect("run bootstrap.sh up");
        assert!(
            out.status.success(),
            "kubeadm init with nodelet failed:\n{}\nnodelet's log (last lines):\n{}",
            text(&out),
            machine.nodelet_log_tail()
        );
        machine
    }

    fn dir(&self) -> PathBuf {
        testbed_dir()
            .join("beds")
            .join(format!("kubeadm-{}", self.name))
    }

    fn node(&self) -> String {
        format!("kubeadm-{}", self.name)
    }

    fn nodelet_log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir().join("nodelet.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    async fn runtime(&self) -> RuntimeClient {
        runtime_at(&self.dir().join("containerd.sock")).await
    }

    async fn exec(&self, args: &[&str]) -> Output {
        let mut all = vec!["exec", self.name];
        all.extend_from_slice(args);
        command(&all).output().await.expect("run bootstrap.sh exec")
    }

    /// kubectl in the machine, with kubeadm's admin.conf; it must succeed.
    async fn kubectl(&self, args: &[&str]) -> String {
        let mut all = vec!["kubectl"];
        all.extend_from_slice(args);
        let out = self.exec(&all).await;
        assert!(out.status.success(), "kubectl {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// An object as JSON, or None while kubectl cannot get it (the API server restarting).
    async fn get(&self, args: &[&str]) -> Option<Value> {
        let mut all = vec!["kubectl", "get", "-o", "json"];
        all.extend_from_slice(args);
        let out = self.exec(&all).await;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    async fn mirror(&self, component: &str) -> Option<Value> {
        let name = format!("{component}-{}", self.node());
        self.get(&["-n", "kube-system", "pod", &name]).await
    }

    async fn script(&self, command_name: &str) {
        let out = command(&[command_name, self.name])
            .output()
            .await
            .expect("run bootstrap.sh");
        assert!(
            out.status.success(),
            "bootstrap.sh {command_name}: {}",
            text(&out)
        );
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("nodelet's log (last lines):\n{}", self.nodelet_log_tail());
        }
        let _ = std::process::Command::new("bash")
            .arg(script())
            .args(["down", self.name])
            .env("NODELET", env!("CARGO_BIN_EXE_nodelet"))
            .stdin(std::process::Stdio::null())
            .status();
    }
}

fn condition_true(object: &Value, kind: &str) -> bool {
    object["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

fn annotation<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod["metadata"]["annotations"][key].as_str()
}

fn restarts(pod: &Value) -> i64 {
    pod["status"]["containerStatuses"][0]["restartCount"]
        .as_i64()
        .unwrap_or(0)
}

fn ready(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running" && condition_true(pod, "Ready")
}

/// Ready, mirroring its static pod, Running.
fn mirror_ready(pod: &Value) -> bool {
    annotation(pod, "kubernetes.io/config.mirror").is_some() && ready(pod)
}

#[tokio::test]
async fn kubeadm_init_bootstraps_a_control_plane_that_nodelet_runs_and_keeps() {
    let machine = Machine::init("t", 5).await;
    let node = machine.node();

    eventually("the node Ready", Duration::from_secs(120), || async {
        let n = machine.get(&["node", &node]).await?;
        condition_true(&n, "Ready").then_some(())
    })
    .await;
    for component in CONTROL_PLANE {
        eventually(
            &format!("the mirror pod of {component} Running and Ready"),
            Duration::from_secs(120),
            || async {
                let pod = machine.mirror(component).await?;
                (mirror_ready(&pod) && pod["spec"]["nodeName"] == node.as_str()).then_some(())
            },
        )
        .await;
    }

    // kubeadm's addons: kube-proxy (a DaemonSet of host-network, privileged pods) and CoreDNS.
    eventually(
        "kube-proxy Running and Ready on the node",
        Duration::from_secs(120),
        || async {
            let pods = machine
                .get(&["-n", "kube-system", "pods", "-l", "k8s-app=kube-proxy"])
                .await?;
            let items = pods["items"].as_array()?;
            items
                .iter()
                .any(|p| p["spec"]["nodeName"] == node.as_str() && ready(p))
                .then_some(())
        },
    )
    .await;

    // A single node: workloads run on it once the control-plane taint is gone.
    machine
        .kubectl(&[
            "taint",
            "nodes",
            &node,
            "node-role.kubernetes.io/control-plane:NoSchedule-",
        ])
        .await;
    let image = format!("{}/library/busybox:1", registry(false));
    machine
        .kubectl(&[
            "create",
            "deployment",
            "web",
            "--image",
            &image,
            "--replicas=2",
            "--",
            "sleep",
            "3600",
        ])
        .await;
    eventually(
        "the Deployment's 2 pods Running on the node",
        Duration::from_secs(120),
        || async {
            let pods = machine.get(&["pods", "-l", "app=web"]).await?;
            let items = pods["items"].as_array()?;
            let running = items
                .iter()
                .filter(|p| {
                    p["status"]["phase"] == "Running"
                        && p["spec"]["nodeName"] == node.as_str()
                        && p["status"]["podIP"].is_string()
                })
                .count();
            (running == 2).then_some(())
        },
    )
    .await;

    // Cluster DNS: CoreDNS reaches the API server through kube-proxy's Service rules, and a
    // pod resolves the API server's Service through it.
    eventually(
        "CoreDNS's 2 pods Ready",
        Duration::from_secs(180),
        || async {
            let pods = machine
                .get(&["-n", "kube-system", "pods", "-l", "k8s-app=kube-dns"])
                .await?;
            let items = pods["items"].as_array()?;
            (items.iter().filter(|p| ready(p)).count() == 2).then_some(())
        },
    )
    .await;
    eventually(
        "kubernetes.default resolved in a pod",
        Duration::from_secs(60),
        || async {
            let out = machine
                .exec(&[
                    "kubectl",
                    "exec",
                    "deploy/web",
                    "--",
                    "nslookup",
                    "kubernetes.default.svc.cluster.local",
                ])
                .await;
            String::from_utf8_lossy(&out.stdout)
                .contains("10.96.0.1")
                .then_some(())
        },
    )
    .await;

    // The API server's container killed: nodelet starts it again and the cluster answers.
    let rt = machine.runtime().await;
    let apiserver = rt
        .list_containers(Some(("io.kubernetes.container.name", "kube-apiserver")))
        .await
        .expect("list containers")
        .into_iter()
        .find(|c| c.state == ContainerState::Running)
        .expect("a running kube-apiserver container");
    rt.stop_container(&apiserver.id, 0)
        .await
        .expect("kill the kube-apiserver container");
    eventually(
        "kube-apiserver restarted and Ready",
        Duration::from_secs(120),
        || async {
            let pod = machine.mirror("kube-apiserver").await?;
            (restarts(&pod) >= 1 && mirror_ready(&pod)).then_some(())
        },
    )
    .await;

    // A flag added to its manifest rolls the API server; its mirror shows the new hash.
    let before = machine
        .mirror("kube-apiserver")
        .await
        .and_then(|p| annotation(&p, "kubernetes.io/config.hash").map(str::to_string))
        .expect("the mirror pod's config hash");
    let manifest = "/etc/kubernetes/manifests/kube-apiserver.yaml";
    let out = machine
        .exec(&[
            "sed",
            "-i",
            r"s/^    - --allow-privileged=true$/&\n    - --v=2/",
            manifest,
        ])
        .await;
    assert!(out.status.success(), "edit the manifest: {}", text(&out));
    eventually(
        "the API server back with the edited manifest",
        Duration::from_secs(120),
        || async {
            let pod = machine.mirror("kube-apiserver").await?;
            let hash = annotation(&pod, "kubernetes.io/config.hash")?;
            let args = pod["spec"]["containers"][0]["command"].as_array()?;
            (hash != before && args.iter().any(|a| a == "--v=2") && mirror_ready(&pod))
                .then_some(())
        },
    )
    .await;

    // kubeadm reset, with the node agent stopped first (kubeadm would ask systemd to stop it),
    // leaves no pod in the runtime and nothing mounted under the agent's root dir.
    machine.script("stop-node").await;
    let socket = format!("unix://{}", machine.dir().join("containerd.sock").display());
    let out = machine
        .exec(&["kubeadm", "reset", "--force", "--cri-socket", &socket])
        .await;
    assert!(out.status.success(), "kubeadm reset: {}", text(&out));
    let sandboxes = rt.list_sandboxes(None).await.expect("list sandboxes");
    assert!(sandboxes.is_empty(), "pods left after reset: {sandboxes:?}");
    let out = machine.exec(&["cat", "/proc/self/mountinfo"]).await;
    let mounts = String::from_utf8_lossy(&out.stdout);
    assert!(
        !mounts.contains(" /var/lib/kubelet/"),
        "mounts left under /var/lib/kubelet:\n{mounts}"
    );
    let out = machine
        .exec(&["ls", "-A", "/etc/kubernetes/manifests", "/var/lib/kubelet"])
        .await;
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.lines().all(|l| l.is_empty() || l.ends_with(':')),
        "files left after reset:\n{listing}"
    );
}

//! The upstream kubelet beside nodelet: the same static pods under each, each agent on a
//! containerd of its own of the same build and configuration, and what the runtime recorded for
//! them (CRI configs and the OCI specs containerd generated) compared. Every difference is fixed
//! or listed in [`ALLOWED`] with why nodelet differs on purpose.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nodelet::runtime::RuntimeClient;
use serde_json::Value;

use crate::bed::{BUSYBOX, Node, OtherRuntime, free_port, runtime_at, test_dir};
use crate::kubelet::{HostChanges, Settings};

/// The node name both agents run as, so that static pods get the same names and UIDs.
const NODE: &str = "t-diff";

/// Differences nodelet keeps on purpose: a JSON path prefix (`pod/container:` dropped) and why.
const ALLOWED: &[(&str, &str)] = &[
    (
        ".config.annotations.io.kubernetes.container.hash",
        "upstream hashes its Go container object; nodelet hashes its own encoding, and compares only its own hashes",
    ),
    (
        ".config.labels.nodelet.io/container-digest",
        "nodelet's versioned digest of the container spec, what decides whether a container still matches it (so an upgrade of nodelet restarts nothing); upstream decides by its hash annotation",
    ),
    (
        ".config.annotations.nodelet.io/",
        "nodelet's own bookkeeping on the runtime (resources digest, owning node), read back after a restart",
    ),
    (
        ".config.annotations.kubernetes.io/config.seen",
        "when each agent first saw the manifest",
    ),
    (
        ".config.mounts[",
        "the termination-log file's name under the pod dir (upstream: random hex; nodelet: <restartCount>.termination-log)",
    ),
    (
        ".runtimeSpec.mounts[",
        "the termination-log file's name, as in the CRI mounts",
    ),
    (
        ".config.linux.security_context.namespace_options.userns_options",
        "nodelet sends no user namespace option for pods in the node's (upstream sends mode NODE): sandboxes made before the field keep matching their new containers on containerd 2.x",
    ),
    (
        "status.hostIP",
        "without an API server the kubelet has no Node to read its address from and reports no host IP; nodelet knows the node's IP (--node-ip, or the default route's) and reports it, so a static pod's downward API status.hostIP works",
    ),
    (
        "host-network-t-diff/status.podIP",
        "a host-network pod's IP is the node's, which the kubelet without an API server does not know (see status.hostIP)",
    ),
    (
        "summary.pods[].containers[].cpu.psi.",
        "nodelet reads each container's pressure stall information from its cgroup on the unified hierarchy; the CRI's container stats, the kubelet's source, carry none",
    ),
    (
        "summary.pods[].containers[].memory.psi.",
        "each container's pressure stall information, as for cpu.psi",
    ),
    (
        "summary.pods[].containers[].io.psi.",
        "each container's pressure stall information, as for cpu.psi",
    ),
    (
        "metrics/cadvisor/container_pressure_",
        "nodelet reads each cgroup's pressure stall information on the unified hierarchy, which hybrid hosts like this one mount beside the v1 controllers; the kubelet's cAdvisor reads it only where the controllers are on v2",
    ),
    (
        "summary.pods[].process_stats.",
        "nodelet counts each pod's processes in its cgroups; the kubelet's cAdvisor finds none for these pods on this host",
    ),
    (
        "summary.pods[].network.",
        "nodelet reads each pod's network counters in the pod's network namespace; the kubelet's cAdvisor finds none for these pods on this host",
    ),
    (
        "metrics/go_",
        "the Go runtime's own metrics: nodelet is not written in Go",
    ),
    (
        "metrics/kubelet_metrics_provider",
        "nodelet says where its container stats come from (the CRI); the kubelet serves it in some runs only (see RACY)",
    ),
    (
        "metrics/cadvisor/cadvisor_version_info",
        "cAdvisor's own build, which nodelet does not link",
    ),
    (
        "metrics/apiserver_",
        "metrics of API server libraries linked into the kubelet's binary, about requests it never serves",
    ),
    (
        "metrics/aggregator_",
        "metrics of API server libraries linked into the kubelet's binary",
    ),
    (
        "metrics/cardinality_enforcement_",
        "component-base's metrics about its own metrics registry",
    ),
    (
        "metrics/disabled_metrics_total",
        "component-base's metrics about its own metrics registry",
    ),
    (
        "metrics/hidden_metrics_total",
        "component-base's metrics about its own metrics registry",
    ),
    (
        "metrics/registered_metrics_total",
        "component-base's metrics about its own metrics registry",
    ),
    (
        "metrics/workqueue_",
        "client-go's work queues, which nodelet does not use",
    ),
    (
        "metrics/rest_client_exec_plugin_",
        "client-go's exec credential plugins and transport cache, which nodelet does not use",
    ),
    (
        "metrics/rest_client_transport_",
        "client-go's exec credential plugins and transport cache, which nodelet does not use",
    ),
];

/// Allow-list entries that apply in some runs only. The kubelet sets `kubelet_metrics_provider`
/// when its server starts, which may come before the family is registered (a sample set on a
/// family not yet registered is dropped), so whether it serves one is a race.
const RACY: &[&str] = &["metrics/kubelet_metrics_provider"];

/// Differences that are gaps still to close in nodelet: what the kubelet serves and nodelet does
/// not yet. Listed so that the test holds the line everywhere else; each entry goes once it is
/// closed (the test fails on an entry that no longer matches anything).
const GAPS: &[(&str, &str)] = &[(
    "metrics/kubelet_pod_watch_events_dropped_total",
    "the alpha PodsAPI's dropped watch events: nodelet does not serve the PodsAPI, whose gRPC messages carry pods in Kubernetes' protobuf encoding",
)];

/// The upstream kubelet in standalone mode on a containerd of its own, stopped and cleaned up
/// on drop: its pods, its cgroup root, the host sysctls it changed, and the symlinks and
/// directories it makes at fixed host paths.
struct Kubelet {
    child: std::process::Child,
    dir: tempfile::TempDir,
    host: HostChanges,
}

impl Kubelet {
    fn start(bed: &OtherRuntime, cgroup_root: &str, read_only: u16) -> Kubelet {
        let bin = PathBuf::from(std::env::var("K8S_BIN").expect("K8S_BIN (make test sets it)"))
            .join("kubelet");
        assert!(
            bin.is_file(),
            "no kubelet at {}: hack/k8s/build.sh bin builds it",
            bin.display()
        );
        let dir = test_dir("diff-kubelet");
        let host = HostChanges::record(cgroup_root).expect("record the host's state");
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            crate::kubelet::config(&Settings {
                dir: dir.path(),
                endpoint: &bed.endpoint,
                cgroup_root,
                port: free_port(),
                read_only_port: read_only,
                healthz_port: free_port(),
                extra: "fileCheckFrequency: 1s\n",
            }),
        )
        .expect("write the kubelet's config");
        let log = std::fs::File::create(dir.path().join("kubelet.log")).expect("kubelet log");
        let child = std::process::Command::new(bin)
            .arg("--config")
            .arg(&config)
            .arg("--root-dir")
            .arg(dir.path().join("root"))
            .arg("--cert-dir")
            .arg(dir.path().join("pki"))
            .args(["--hostname-override", NODE, "--v=2"])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start the kubelet");
        Kubelet { child, dir, host }
    }

    fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log =
                std::fs::read_to_string(self.dir.path().join("kubelet.log")).unwrap_or_default();
            let errors: Vec<&str> = log.lines().filter(|l| l.starts_with('E')).collect();
            eprintln!(
                "the kubelet's errors:\n{}",
                errors[errors.len().saturating_sub(40)..].join("\n")
            );
        }
        self.host.undo(self.dir.path());
        crate::bed::unmount_all_under(self.dir.path());
    }
}

/// What the runtime recorded for one pod: the sandbox's and each container's CRI config and
/// OCI spec, by container name (the latest attempt).
async fn recorded(rt: &RuntimeClient, pod: &str) -> BTreeMap<String, Value> {
    let sandboxes = rt.list_sandboxes(None).await.expect("list sandboxes");
    let sandbox = sandboxes
        .iter()
        .filter(|s| s.name == pod)
        .max_by_key(|s| s.attempt)
        .unwrap_or_else(|| panic!("a sandbox of {pod}"));
    let parse = |info: std::collections::HashMap<String, String>| -> Value {
        let mut info: Value =
            serde_json::from_str(info.get("info").map_or("{}", String::as_str)).expect("json");
        // The kubelet orders the environment at random (it goes through a Go map): compared
        // as sets.
        if let Some(envs) = info["config"]["envs"].as_array_mut() {
            envs.sort_by_key(|e| e["key"].as_str().unwrap_or_default().to_string());
        }
        if let Some(env) = info["runtimeSpec"]["process"]["env"].as_array_mut() {
            env.sort_by_key(|e| e.as_str().unwrap_or_default().to_string());
        }
        serde_json::json!({"config": info["config"], "runtimeSpec": info["runtimeSpec"]})
    };
    let mut out = BTreeMap::new();
    out.insert(
        "sandbox".to_string(),
        parse(rt.sandbox_info(&sandbox.id).await.expect("sandbox info")),
    );
    let mut containers = rt.list_containers(None).await.expect("list containers");
    containers.retain(|c| c.sandbox_id == sandbox.id);
    containers.sort_by_key(|c| c.attempt);
    for c in containers {
        out.insert(
            c.name.clone(),
            parse(rt.container_info(&c.id).await.expect("container info")),
        );
    }
    out
}

/// Every leaf of `v` as `path = value`, with the strings that must differ replaced.
fn leaves(prefix: &str, v: &Value, replace: &[(String, &str)], out: &mut BTreeMap<String, String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                leaves(&format!("{prefix}.{k}"), v, replace, out);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                leaves(&format!("{prefix}[{i}]"), v, replace, out);
            }
        }
        other => {
            let mut text = other.to_string();
            for (from, to) in replace {
                text = text.replace(from.as_str(), to);
            }
            // network namespaces are named by the runtime at random
            if let Some(at) = text.find("/netns/cni-") {
                text = format!("{}/netns/<netns>\"", &text[..at]);
            }
            out.insert(prefix.to_string(), text);
        }
    }
}

/// Ids, addresses and directories that differ between the two runs by nature.
async fn replacements(
    rt: &RuntimeClient,
    dir: &Path,
    bed_dir: &Path,
    cgroup: &str,
) -> Vec<(String, &'static str)> {
    let mut out = vec![
        (dir.display().to_string(), "<dir>"),
        (bed_dir.display().to_string(), "<bed>"),
        (cgroup.to_string(), "<cgroup>"),
    ];
    for s in rt.list_sandboxes(None).await.expect("list") {
        out.push((s.id.clone(), "<id>"));
        // Static pod UIDs hash the pod as each agent decodes it: upstream hashes its Go object.
        out.push((s.uid.0.clone(), "<uid>"));
        if let Ok(Some(pid)) = rt.sandbox_pid(&s.id).await {
            out.push((format!("/proc/{pid}/"), "/proc/<pid>/"));
        }
    }
    for c in rt.list_containers(None).await.expect("list") {
        out.push((c.id.clone(), "<id>"));
    }
    // longest first, so a path is replaced before a part of it
    out.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
    out
}

/// The pods both agents run: each a side of a pod spec the runtime sees. ConfigMap, Secret and
/// projected volumes are left out: the upstream kubelet mounts them only with an API server.
fn manifests() -> Vec<(&'static str, usize, String)> {
    let sh = |script: &str| {
        serde_json::to_string(&format!(
            "trap 'exit 0' TERM; {script}; while true; do sleep 1; done"
        ))
        .expect("json")
    };
    let pod = |name: &str, spec: &str| {
        format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: diff}}, annotations: {{note: x}}}}
spec:
{spec}"
        )
    };
    let c = |name: &str, extra: &str| {
        format!(
            "  - name: {name}\n    image: {BUSYBOX}\n    command: [sh, -c, {}]\n{extra}",
            sh("echo hi")
        )
    };
    vec![
        (
            "plain",
            1,
            pod(
                "plain",
                &format!(
                    "  containers:\n{}",
                    c(
                        "c",
                        "    env: [{name: A, value: b}, {name: P, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]\n    workingDir: /tmp\n"
                    )
                ),
            ),
        ),
        (
            "qos-guaranteed",
            1,
            pod(
                "qos-guaranteed",
                &format!(
                    "  containers:\n{}",
                    c("c", "    resources: {limits: {cpu: 250m, memory: 64Mi}}\n")
                ),
            ),
        ),
        (
            "qos-burstable",
            2,
            pod(
                "qos-burstable",
                &format!(
                    "  containers:\n{}{}",
                    c(
                        "a",
                        "    resources: {requests: {cpu: 100m, memory: 32Mi}, limits: {memory: 128Mi}}\n"
                    ),
                    c("b", "")
                ),
            ),
        ),
        (
            "pod-level",
            2,
            pod(
                "pod-level",
                &format!(
                    "  resources: {{requests: {{cpu: 100m}}, limits: {{cpu: 300m, memory: 96Mi}}}}\n  containers:\n{}{}",
                    c("a", "    resources: {limits: {memory: 32Mi}}\n"),
                    c("b", "")
                ),
            ),
        ),
        (
            "security",
            2,
            pod(
                "security",
                &format!(
                    "  securityContext: {{runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000, supplementalGroups: [4000], sysctls: [{{name: net.ipv4.ip_unprivileged_port_start, value: '80'}}]}}\n  containers:\n{}{}",
                    c(
                        "locked",
                        "    securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}, seccompProfile: {type: RuntimeDefault}}\n"
                    ),
                    c("group", "    securityContext: {runAsGroup: 5000}\n")
                ),
            ),
        ),
        (
            "host-network",
            1,
            pod(
                "host-network",
                &format!(
                    "  hostNetwork: true\n  containers:\n{}",
                    c(
                        "c",
                        "    ports: [{containerPort: 18181, hostPort: 18181}]\n"
                    )
                ),
            ),
        ),
        (
            "dns",
            1,
            pod(
                "dns",
                &format!(
                    "  hostAliases: [{{ip: 10.1.2.3, hostnames: [foo.local, bar.local]}}]\n  dnsPolicy: None\n  dnsConfig: {{nameservers: [10.0.0.10], searches: [ns.svc.example], options: [{{name: ndots, value: '2'}}]}}\n  containers:\n{}",
                    c(
                        "c",
                        "    ports: [{containerPort: 8080, hostPort: 18182, protocol: TCP}]\n"
                    )
                ),
            ),
        ),
        (
            "init",
            2,
            pod(
                "init",
                &format!(
                    "  initContainers:\n  - name: first\n    image: {BUSYBOX}\n    command: [sh, -c, 'echo init']\n{}  containers:\n{}",
                    c("sidecar", "    restartPolicy: Always\n"),
                    c("main", "")
                ),
            ),
        ),
        (
            "probes",
            1,
            pod(
                "probes",
                &format!(
                    "  containers:\n{}",
                    c(
                        "c",
                        "    livenessProbe: {exec: {command: [\"true\"]}, periodSeconds: 5}\n    readinessProbe: {tcpSocket: {port: 1}, periodSeconds: 5}\n    startupProbe: {httpGet: {path: /, port: 1}, failureThreshold: 100}\n"
                    )
                ),
            ),
        ),
        (
            "hooks",
            1,
            pod(
                "hooks",
                &format!(
                    "  terminationGracePeriodSeconds: 7\n  containers:\n{}",
                    c(
                        "c",
                        "    lifecycle: {postStart: {exec: {command: [\"true\"]}}, preStop: {exec: {command: [sh, -c, 'sleep 1']}}}\n    terminationMessagePolicy: FallbackToLogsOnError\n"
                    )
                ),
            ),
        ),
        (
            "volumes",
            1,
            pod(
                "volumes",
                &format!(
                    "  volumes:\n  - {{name: scratch, emptyDir: {{}}}}\n  - {{name: memory, emptyDir: {{medium: Memory, sizeLimit: 16Mi}}}}\n  - {{name: host, hostPath: {{path: /etc/os-release, type: File}}}}\n  - {{name: info, downwardAPI: {{items: [{{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}]}}}}\n  containers:\n{}",
                    c(
                        "c",
                        "    volumeMounts: [{name: scratch, mountPath: /scratch}, {name: memory, mountPath: /memory}, {name: host, mountPath: /host/os-release, readOnly: true}, {name: info, mountPath: /info}, {name: scratch, mountPath: /sub, subPath: part}]\n"
                    )
                ),
            ),
        ),
        (
            "downward-env",
            1,
            pod(
                "downward-env",
                &format!(
                    "  containers:\n{}",
                    c(
                        "c",
                        "    resources: {requests: {cpu: 50m, memory: 16Mi}, limits: {cpu: 100m, memory: 32Mi}}\n    env:\n    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}\n    - {name: NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}\n    - {name: CPU, valueFrom: {resourceFieldRef: {resource: limits.cpu, divisor: 1m}}}\n    - {name: MEM, valueFrom: {resourceFieldRef: {resource: requests.memory}}}\n    - {name: REF, value: $(NS)-x}\n"
                    )
                ),
            ),
        ),
        (
            "shared-pid",
            2,
            pod(
                "shared-pid",
                &format!(
                    "  shareProcessNamespace: true\n  containers:\n{}{}",
                    c("a", "    stdin: true\n    tty: true\n"),
                    c("b", "    imagePullPolicy: Never\n")
                ),
            ),
        ),
    ]
}

#[tokio::test]
async fn the_kubelet_and_nodelet_give_the_runtime_the_same_pods() {
    let kubelet_bed = OtherRuntime::up("diffk", 3).await;
    let nodelet_bed = OtherRuntime::up("diffn", 4).await;
    let kubelet_cgroup = format!("/nodelet-test/{NODE}-kubelet");
    let (k_port, n_port) = (free_port(), free_port());
    let kubelet = Kubelet::start(&kubelet_bed, &kubelet_cgroup, k_port);
    let n_read_only = [
        "--read-only-port",
        &n_port.to_string(),
        "--address",
        "127.0.0.1",
    ];
    let node = Node::start_on(&nodelet_bed.endpoint, "diff", &n_read_only).await;
    assert_eq!(node.name, NODE);
    let pods = manifests();
    for (name, _, yaml) in &pods {
        std::fs::write(kubelet.manifests().join(format!("{name}.yaml")), yaml).expect("write");
        node.write_manifest(&format!("{name}.yaml"), yaml);
    }
    let k_rt = runtime_at(&kubelet_bed.endpoint).await;
    let n_rt = runtime_at(&nodelet_bed.endpoint).await;
    for (side, rt) in [("the kubelet", &k_rt), ("nodelet", &n_rt)] {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let sandboxes = rt.list_sandboxes(None).await.expect("list sandboxes");
            let running = rt.list_containers(None).await.expect("list containers");
            let missing: Vec<&str> = pods
                .iter()
                .filter(|(name, want, _)| {
                    let pod = format!("{name}-{NODE}");
                    !sandboxes.iter().filter(|s| s.name == pod).any(|s| {
                        running
                            .iter()
                            .filter(|c| {
                                c.sandbox_id == s.id
                                    && c.state == nodelet::runtime::ContainerState::Running
                            })
                            .count()
                            == *want
                    })
                })
                .map(|(name, _, _)| *name)
                .collect();
            if missing.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "under {side}, not every container of {missing:?} runs after 120 s"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    let k_replace = replacements(
        &k_rt,
        kubelet.dir.path(),
        kubelet_bed.endpoint.parent().expect("bed dir"),
        &kubelet_cgroup,
    )
    .await;
    let n_replace = replacements(
        &n_rt,
        node.dir.path(),
        nodelet_bed.endpoint.parent().expect("bed dir"),
        &crate::bed::cgroup_root(NODE),
    )
    .await;
    let mut differences = Vec::new();
    let mut used = BTreeSet::new();
    for (name, _, _) in &pods {
        let pod = format!("{name}-{NODE}");
        let (k, n) = (recorded(&k_rt, &pod).await, recorded(&n_rt, &pod).await);
        let names: BTreeSet<&String> = k.keys().chain(n.keys()).collect();
        for part in names {
            let (mut kl, mut nl) = (BTreeMap::new(), BTreeMap::new());
            leaves("", k.get(part).unwrap_or(&Value::Null), &k_replace, &mut kl);
            leaves("", n.get(part).unwrap_or(&Value::Null), &n_replace, &mut nl);
            let paths: BTreeSet<&String> = kl.keys().chain(nl.keys()).collect();
            for path in paths {
                let (kv, nv) = (kl.get(path), nl.get(path));
                if kv == nv {
                    continue;
                }
                match ALLOWED.iter().find(|(prefix, _)| path.starts_with(prefix)) {
                    Some((prefix, _)) => {
                        used.insert(*prefix);
                    }
                    None => differences.push(format!(
                        "{name}/{part}{path}: kubelet {} nodelet {}",
                        kv.map_or("-", String::as_str),
                        nv.map_or("-", String::as_str)
                    )),
                }
            }
        }
    }
    let pod_names: Vec<String> = pods.iter().map(|(n, _, _)| format!("{n}-{NODE}")).collect();
    let sides = [
        (k_port, kubelet.dir.path().join("pods"), &k_replace),
        (n_port, node.pod_logs(), &n_replace),
    ];
    differences.extend(served_differences(&sides, &pod_names, &mut used).await);
    let unused: Vec<&str> = ALLOWED
        .iter()
        .chain(GAPS)
        .map(|(p, _)| *p)
        .filter(|p| !used.contains(p) && !RACY.contains(p))
        .collect();
    node.finish().await;
    drop(kubelet);
    kubelet_bed.down().await;
    nodelet_bed.down().await;
    let _ = nodelet::cgroups::remove_tree(kubelet_cgroup.trim_start_matches('/'));
    assert!(
        differences.is_empty(),
        "{} differences:\n{}",
        differences.len(),
        differences.join("\n")
    );
    assert!(
        unused.is_empty(),
        "allow-list entries that no longer apply: {unused:?}"
    );
}

/// Status fields that hold times, which differ between any two runs.
const TIMES: [&str; 5] = [
    "startTime",
    "lastTransitionTime",
    "startedAt",
    "finishedAt",
    "lastProbeTime",
];

/// What an agent serves and writes about its pods, reduced to what both must agree on: each
/// pod's status (times dropped, IDs and addresses replaced), the layout and lines of its pod
/// logs (timestamps dropped), the shape of /stats/summary (its key paths) and the metric
/// families on /metrics, /metrics/resource and /metrics/cadvisor as Prometheus reads them: their names, and each
/// one's type and help text (without the stability level the kubelet's start with).
#[derive(Default)]
struct Served {
    statuses: BTreeMap<String, String>,
    logs: BTreeMap<String, String>,
    summary: BTreeSet<String>,
    metrics: BTreeSet<String>,
    metric_docs: BTreeMap<String, String>,
    /// What Prometheus's parser refused.
    unreadable: Vec<String>,
}

/// What the agent on `port` serves about `pods`, with `logs` its pod logs dir.
async fn served(port: u16, logs: &Path, pods: &[String], replace: &[(String, &str)]) -> Served {
    // An answer within 10 s, or none.
    let fetch = async |path: &str| {
        let answer = crate::healthz::get(port, path);
        tokio::time::timeout(Duration::from_secs(10), answer)
            .await
            .ok()
            .flatten()
    };
    let get = async |path: &str| -> Value {
        match fetch(path).await {
            Some((200, body)) => serde_json::from_str(&body).unwrap_or(Value::Null),
            _ => Value::Null,
        }
    };
    let mut out = Served::default();
    let listed = get("/pods").await;
    let mut replace = replace.to_vec();
    for item in listed["items"].as_array().into_iter().flatten() {
        for ip in item["status"]["podIPs"].as_array().into_iter().flatten() {
            if let Some(ip) = ip["ip"].as_str() {
                replace.push((format!("\"{ip}\""), "\"<pod-ip>\""));
            }
        }
    }
    for item in listed["items"].as_array().into_iter().flatten() {
        let Some(name) = item["metadata"]["name"]
            .as_str()
            .filter(|n| pods.iter().any(|p| p == n))
        else {
            continue;
        };
        let mut all = BTreeMap::new();
        leaves(
            &format!("{name}/status"),
            &item["status"],
            &replace,
            &mut all,
        );
        out.statuses.extend(all.into_iter().filter(|(path, _)| {
            let last = path.rsplit(['.', ']']).next().unwrap_or_default();
            !TIMES.contains(&last)
        }));
    }
    for file in walk(logs) {
        let rel = file
            .strip_prefix(logs)
            .unwrap_or(&file)
            .display()
            .to_string();
        let mut rel = rel;
        for (from, to) in &replace {
            rel = rel.replace(from.as_str(), to);
        }
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .map(|l| l.split_once(' ').map_or(l, |(_, rest)| rest))
            .collect();
        out.logs.insert(format!("logs/{rel}"), lines.join("\n"));
    }
    shape("summary", &get("/stats/summary").await, &mut out.summary);
    for (path, prefix) in [
        ("/metrics", ""),
        ("/metrics/resource", "resource/"),
        ("/metrics/cadvisor", "cadvisor/"),
    ] {
        let Some((200, text)) = fetch(path).await else {
            continue;
        };
        let families = match crate::bed::prometheus_families(&text) {
            Ok(f) => f,
            Err(e) => {
                out.unreadable.push(format!("{path}: {e}"));
                continue;
            }
        };
        // nodelet's own metrics are under a prefix of their own.
        for (name, family) in families.iter().filter(|(n, _)| !n.starts_with("nodelet_")) {
            let name = format!("{prefix}{name}");
            let help = ["[ALPHA] ", "[BETA] ", "[STABLE] ", "[INTERNAL] "]
                .iter()
                .find_map(|level| family.help.strip_prefix(level))
                .unwrap_or(&family.help);
            out.metric_docs
                .insert(format!("{name}.type"), family.kind.clone());
            out.metric_docs
                .insert(format!("{name}.help"), help.to_string());
            out.metrics.insert(name);
        }
    }
    out
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// The key paths of `v`, arrays as `[]`.
fn shape(prefix: &str, v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                shape(&format!("{prefix}.{k}"), v, out);
            }
        }
        Value::Array(a) => {
            for v in a {
                shape(&format!("{prefix}[]"), v, out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

/// One agent's read-only port, pod logs dir, and the strings that differ by nature.
type Side<'a> = (u16, PathBuf, &'a Vec<(String, &'static str)>);

/// The differences between what the kubelet (first of `sides`) and nodelet serve and write
/// about `pods` (their read-only port, pod logs dir and replacements), less those allowed (each
/// allowed prefix that matched goes in `used`). Both settle at their own pace (probes, the first
/// stats), so this waits up to a minute for them to agree.
async fn served_differences(
    sides: &[Side<'_>; 2],
    pods: &[String],
    used: &mut BTreeSet<&'static str>,
) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    // What the allow-lists matched in any round: an allowed difference may settle away.
    let mut matched = BTreeSet::new();
    loop {
        let [(kp, kl, kr), (np, nl, nr)] = sides;
        let (k, n) = (
            served(*kp, kl, pods, kr).await,
            served(*np, nl, pods, nr).await,
        );
        let mut differences = Vec::new();
        // Neither side may pass by serving nothing.
        for (side, got) in [("the kubelet", &k), ("nodelet", &n)] {
            for e in &got.unreadable {
                differences.push(format!("Prometheus cannot read {side}'s {e}"));
            }
            for pod in pods {
                if !got.statuses.contains_key(&format!("{pod}/status.phase")) {
                    differences.push(format!("{side} serves no status of {pod} on /pods"));
                }
            }
            if !got
                .summary
                .contains("summary.node.cpu.usageCoreNanoSeconds")
            {
                differences.push(format!("{side} serves no node CPU in /stats/summary"));
            }
            if !got
                .metrics
                .contains("resource/node_cpu_usage_seconds_total")
            {
                differences.push(format!("{side} serves no node CPU in /metrics/resource"));
            }
        }
        let mut note = |path: String, kv: Option<&str>, nv: Option<&str>| {
            // A status path is matched with and without its pod's name.
            let bare = path.split_once('/').map_or("", |(_, rest)| rest);
            let matches =
                |(prefix, _): &&(&str, &str)| path.starts_with(prefix) || bare.starts_with(prefix);
            // A gap is what the kubelet serves and nodelet does not, never the other way.
            let gaps = (kv.is_some() && nv.is_none()).then_some(GAPS);
            match ALLOWED
                .iter()
                .chain(gaps.into_iter().flatten())
                .find(matches)
            {
                Some((prefix, _)) => {
                    matched.insert(*prefix);
                }
                None => differences.push(format!(
                    "{path}: kubelet {} nodelet {}",
                    kv.unwrap_or("-"),
                    nv.unwrap_or("-")
                )),
            }
        };
        for (kmap, nmap) in [(&k.statuses, &n.statuses), (&k.logs, &n.logs)] {
            let paths: BTreeSet<&String> = kmap.keys().chain(nmap.keys()).collect();
            for path in paths {
                let (kv, nv) = (kmap.get(path), nmap.get(path));
                if kv != nv {
                    note(path.clone(), kv.map(String::as_str), nv.map(String::as_str));
                }
            }
        }
        // The type and help of each family both serve.
        for (path, kv) in &k.metric_docs {
            if let Some(nv) = n.metric_docs.get(path)
                && kv != nv
            {
                note(format!("metrics/{path}"), Some(kv), Some(nv));
            }
        }
        for (kset, nset, what) in [
            (&k.summary, &n.summary, ""),
            (&k.metrics, &n.metrics, "metrics/"),
        ] {
            for path in kset.symmetric_difference(nset) {
                let has = |set: &BTreeSet<String>| set.contains(path).then_some("served");
                note(format!("{what}{path}"), has(kset), has(nset));
            }
        }
        if differences.is_empty() || std::time::Instant::now() > deadline {
            used.extend(matched);
            return differences;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

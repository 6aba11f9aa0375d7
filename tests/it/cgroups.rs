//! Pod cgroups on the machine's real cgroups: the QoS hierarchy, pod limits, containers beneath
//! their pod, cleanup, and admission.

use std::path::PathBuf;
use std::time::Duration;

use nodelet::server::pod_resources::proto::{
    AllocatableResourcesRequest, GetPodResourcesRequest, ListPodResourcesRequest,
};

use crate::bed::{BUSYBOX, FOREVER, Node, cgroup_root, eventually, free_port, metrics_show};

/// A cgroup file of the given controller (v1) or the unified hierarchy (v2).
fn cgroup_dir(controller: &str, relative: &str) -> PathBuf {
    let v1 = PathBuf::from("/sys/fs/cgroup").join(controller);
    let base = if v1.is_dir() {
        v1
    } else {
        PathBuf::from("/sys/fs/cgroup")
    };
    base.join(relative.trim_start_matches('/'))
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

fn pod(name: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: {BUSYBOX}
    resources: {resources}
    command: [sh, -c, \"trap 'exit 0' TERM; {FOREVER}\"]
"
    )
}

#[tokio::test]
async fn pods_get_cgroups_per_qos_class_with_their_limits() {
    let node = Node::start("cgqos", &[]).await;
    node.write_manifest("g.yaml", &pod("g", "{limits: {cpu: 200m, memory: 64Mi}}"));
    node.write_manifest("b.yaml", &pod("b", "{requests: {cpu: 100m}}"));
    node.write_manifest("be.yaml", &pod("be", "{}"));
    let root = cgroup_root(&node.name);
    let (g, gc) = node.wait_running("g", 1).await;
    let (b, bc) = node.wait_running("b", 1).await;
    let (be, _) = node.wait_running("be", 1).await;
    let g_dir = format!("{root}/kubepods/pod{}", g.uid);
    let b_dir = format!("{root}/kubepods/burstable/pod{}", b.uid);
    let be_dir = format!("{root}/kubepods/besteffort/pod{}", be.uid);
    assert_eq!(
        read(cgroup_dir("memory", &g_dir).join("memory.limit_in_bytes")),
        (64 * 1024 * 1024).to_string()
    );
    assert_eq!(
        read(cgroup_dir("cpu", &g_dir).join("cpu.cfs_quota_us")),
        "20000"
    );
    // 200m: 204.8 shares, rounded down as upstream.
    assert_eq!(read(cgroup_dir("cpu", &g_dir).join("cpu.shares")), "204");
    assert_eq!(read(cgroup_dir("cpu", &b_dir).join("cpu.shares")), "102");
    assert_eq!(read(cgroup_dir("cpu", &be_dir).join("cpu.shares")), "2");
    assert!(
        cgroup_dir("memory", &g_dir).join(&gc[0].id).is_dir(),
        "the container's cgroup sits beneath its pod's"
    );
    assert!(cgroup_dir("memory", &b_dir).join(&bc[0].id).is_dir());
    eventually(
        "the burstable tier's shares to follow its pods",
        Duration::from_secs(30),
        || async {
            (read(cgroup_dir("cpu", &format!("{root}/kubepods/burstable")).join("cpu.shares"))
                == "102")
                .then_some(())
        },
    )
    .await;

    node.remove_manifest("b.yaml");
    node.wait_gone(&b.uid, Duration::from_secs(30)).await;
    eventually(
        "the pod cgroup to be removed",
        Duration::from_secs(30),
        || async {
            (!cgroup_dir("memory", &b_dir).exists() && !cgroup_dir("cpu", &b_dir).exists())
                .then_some(())
        },
    )
    .await;
    node.finish().await;
}

#[tokio::test]
async fn admission_refuses_pods_that_do_not_fit() {
    let node = Node::start("admission", &["--max-pods", "2"]).await;
    node.write_manifest("a.yaml", &pod("a", "{}"));
    node.write_manifest("b.yaml", &pod("b", "{}"));
    node.wait_running("a", 1).await;
    node.wait_running("b", 1).await;
    node.write_manifest("c.yaml", &pod("c", "{}"));
    let st = node
        .wait_status("c", "OutOfpods", |s| {
            s.reason.as_deref() == Some("OutOfpods")
        })
        .await;
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert!(node.sandboxes("c").await.is_empty());
    node.remove_manifest("b.yaml");
    node.remove_manifest("c.yaml");
    node.write_manifest("huge.yaml", &pod("huge", "{requests: {memory: 1000Ti}}"));
    let st = node
        .wait_status("huge", "OutOfmemory", |s| {
            s.reason.as_deref() == Some("OutOfmemory")
        })
        .await;
    assert!(st.message.unwrap_or_default().contains("memory"));
    node.write_manifest(
        "disk.yaml",
        &pod("disk", "{requests: {ephemeral-storage: 1000Ti}}"),
    );
    let st = node
        .wait_status("disk", "OutOfephemeral-storage", |s| {
            s.reason.as_deref() == Some("OutOfephemeral-storage")
        })
        .await;
    assert!(
        st.message
            .unwrap_or_default()
            .starts_with("Pod was rejected: Node didn't have enough resource: ephemeral-storage")
    );
    node.finish().await;
}

#[tokio::test]
async fn pod_max_pids_caps_the_processes_of_a_pod() {
    let node = Node::start("cgpids", &["--pod-max-pids", "20"]).await;
    // Forty sleeps in a pod capped at twenty: the forks past the cap fail (which ends the
    // subshell making them), so the pod settles just under its cap instead of at forty-odd.
    let script = serde_json::to_string(
        "(for i in $(seq 40); do sleep 1000 & done) 2>/dev/null; exec sleep 1000",
    )
    .expect("json");
    node.write_manifest(
        "p.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: p}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, {script}]
"
        ),
    );
    let (sandbox, _) = node.wait_running("p", 1).await;
    let dir = format!(
        "{}/kubepods/besteffort/pod{}",
        cgroup_root(&node.name),
        sandbox.uid
    );
    assert_eq!(read(cgroup_dir("pids", &dir).join("pids.max")), "20");
    let pids = cgroup_dir("pids", &dir);
    eventually(
        "the pod to fill up to its cap",
        Duration::from_secs(30),
        || async {
            let current: u32 = read(pids.join("pids.current")).parse().ok()?;
            (18..=20).contains(&current).then_some(())
        },
    )
    .await;
    node.finish().await;
}

#[tokio::test]
async fn kubepods_is_limited_to_allocatable_unless_enforcement_is_off() {
    let limit = |node: &Node| {
        let root = cgroup_root(&node.name);
        read(cgroup_dir("memory", &format!("{root}/kubepods")).join("memory.limit_in_bytes"))
            .parse::<u64>()
            .expect("a number")
    };
    let enforced = Node::start("cgenforce", &["--system-reserved", "memory=1Gi"]).await;
    let capacity = nodelet::host::NodeResources::detect(&enforced.path("root"));
    let wanted = capacity.memory as u64 - (1 << 30) - 100 * 1024 * 1024;
    // The kernel rounds limits down to whole pages.
    assert_eq!(limit(&enforced), wanted / 4096 * 4096);
    enforced.finish().await;
    let open = Node::start("cgnoenforce", &["--enforce-node-allocatable", "none"]).await;
    assert!(limit(&open) > capacity.memory as u64, "{}", limit(&open));
    open.finish().await;
}

#[tokio::test]
async fn a_runtime_class_picks_the_handler_and_its_overhead_counts_in_the_pod_cgroup() {
    let handler = std::env::var("NODELET_TEST_ALT_HANDLER").expect("NODELET_TEST_ALT_HANDLER");
    let alt_root = PathBuf::from(
        std::env::var("NODELET_TEST_ALT_RUNC_ROOT").expect("NODELET_TEST_ALT_RUNC_ROOT"),
    );
    let node = Node::start("rtclass", &[]).await;
    let class = format!(
        "apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {{name: alt}}
handler: {handler}
overhead: {{podFixed: {{cpu: 100m, memory: 32Mi}}}}
---
"
    );
    let with_class = |name: &str, class: &str| {
        pod(name, "{limits: {cpu: 200m, memory: 64Mi}}")
            .replace("spec:\n", &format!("spec:\n  runtimeClassName: {class}\n"))
    };
    node.write_manifest("alt.yaml", &(class + &with_class("alt", "alt")));
    node.write_manifest("nope.yaml", &with_class("nope", "nope"));
    let (sandbox, containers) = node.wait_running("alt", 1).await;
    for id in [&sandbox.id, &containers[0].id] {
        assert!(
            alt_root.join("k8s.io").join(id).is_dir(),
            "{id} runs under the {handler} handler's runc root"
        );
    }
    let dir = format!("{}/kubepods/pod{}", cgroup_root(&node.name), sandbox.uid);
    assert_eq!(
        read(cgroup_dir("memory", &dir).join("memory.limit_in_bytes")),
        (96 * 1024 * 1024).to_string(),
        "64Mi for the container and 32Mi of overhead"
    );
    assert_eq!(
        read(cgroup_dir("cpu", &dir).join("cpu.cfs_quota_us")),
        "30000"
    );
    assert_eq!(read(cgroup_dir("cpu", &dir).join("cpu.shares")), "307");
    eventually(
        "the missing RuntimeClass to be reported",
        Duration::from_secs(30),
        || async {
            crate::bed::logs()
                .contains(
                    r#"Failed to create pod sandbox: runtimeclass.node.k8s.io "nope" not found"#,
                )
                .then_some(())
        },
    )
    .await;
    assert!(node.sandboxes("nope").await.is_empty());
    node.finish().await;
}

/// No cgroup driver setting is needed: `--cgroup-driver=systemd` on this host (whose runtime
/// uses cgroupfs, and which systemd did not boot) is overridden, said in one line, and pods run
/// in cgroupfs paths.
#[tokio::test]
async fn a_wrong_cgroup_driver_setting_is_overridden_not_fatal() {
    let node = Node::start("cgdriver", &["--cgroup-driver", "systemd"]).await;
    node.write_manifest("g.yaml", &pod("g", "{limits: {cpu: 100m, memory: 32Mi}}"));
    let (g, _) = node.wait_running("g", 1).await;
    let dir = format!("{}/kubepods/pod{}", cgroup_root(&node.name), g.uid);
    assert!(cgroup_dir("memory", &dir).is_dir(), "no cgroup {dir}");
    let logs = crate::bed::logs();
    assert!(
        logs.contains("not --cgroup-driver") || logs.contains("systemd did not boot this host"),
        "no line says which driver is used instead"
    );
    node.finish().await;
}

/// --cpu-cfs-quota=false leaves cpu limits without a quota, in the pod's cgroup and the
/// container's; a custom period (behind its feature gate) is what quotas are counted in.
#[tokio::test]
async fn cpu_quotas_follow_the_cfs_settings() {
    let cases: [(&str, &[&str], &str, &str); 2] = [
        ("cfsoff", &["--cpu-cfs-quota=false"], "-1", "100000"),
        (
            "cfsperiod",
            &[
                "--feature-gates=CustomCPUCFSQuotaPeriod=true",
                "--cpu-cfs-quota-period=50ms",
            ],
            "25000",
            "50000",
        ),
    ];
    for (test, flags, quota, period) in cases {
        let node = Node::start(test, flags).await;
        node.write_manifest("g.yaml", &pod("g", "{limits: {cpu: 500m, memory: 64Mi}}"));
        let (g, gc) = node.wait_running("g", 1).await;
        let pod_dir = format!("{}/kubepods/pod{}", cgroup_root(&node.name), g.uid);
        for dir in [pod_dir.clone(), format!("{pod_dir}/{}", gc[0].id)] {
            let cpu = cgroup_dir("cpu", &dir);
            assert_eq!(read(cpu.join("cpu.cfs_quota_us")), quota, "{test}: {dir}");
            assert_eq!(read(cpu.join("cpu.cfs_period_us")), period, "{test}: {dir}");
        }
        node.finish().await;
    }
}

/// With the QOSReserved feature gate and --qos-reserved=memory=100%, the burstable tier leaves
/// the Guaranteed pods' memory requests free, and the besteffort tier the Burstable pods' too.
#[tokio::test]
async fn qos_reserved_memory_limits_the_lower_tiers() {
    let node = Node::start(
        "qosreserve",
        &[
            "--feature-gates=QOSReserved=true",
            "--qos-reserved=memory=100%",
        ],
    )
    .await;
    node.write_manifest("g.yaml", &pod("g", "{limits: {cpu: 100m, memory: 64Mi}}"));
    node.write_manifest("b.yaml", &pod("b", "{requests: {memory: 32Mi}}"));
    node.wait_running("g", 1).await;
    node.wait_running("b", 1).await;
    let root = cgroup_root(&node.name);
    let limit = |tier: &str| -> i64 {
        read(cgroup_dir("memory", &format!("{root}/kubepods{tier}")).join("memory.limit_in_bytes"))
            .parse()
            .expect("a byte count")
    };
    const MIB: i64 = 1 << 20;
    let allocatable = limit("");
    eventually(
        "the lower tiers to leave the higher ones' requests",
        Duration::from_secs(30),
        || async {
            (limit("/burstable") == allocatable - 64 * MIB
                && limit("/besteffort") == allocatable - 96 * MIB)
                .then_some(())
        },
    )
    .await;
    node.finish().await;
}

/// enforceNodeAllocatable with kube-reserved limits the existing cgroup that
/// --kube-reserved-cgroup names to the reserve: cpu as shares, and memory; with
/// kube-reserved-compressible, cpu alone.
#[tokio::test]
async fn the_kube_reserve_is_enforced_on_its_cgroup() {
    let daemons = "/nodelet-test/t-kubereserve-daemons";
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").expect("the cgroup mounts") {
        let dir = hierarchy.expect("a cgroup mount").path();
        if dir.join("cgroup.procs").exists() {
            std::fs::create_dir_all(dir.join(daemons.trim_start_matches('/')))
                .expect("the daemons' cgroup");
        }
    }
    let flag = format!("--kube-reserved-cgroup={daemons}");
    let node = Node::start(
        "kubereserve",
        &[
            "--kube-reserved=cpu=100m,memory=64Mi",
            &flag,
            "--enforce-node-allocatable=pods,kube-reserved",
        ],
    )
    .await;
    assert_eq!(
        read(cgroup_dir("memory", daemons).join("memory.limit_in_bytes")),
        (64 << 20).to_string()
    );
    assert_eq!(read(cgroup_dir("cpu", daemons).join("cpu.shares")), "102");
    node.finish().await;

    // The -compressible form limits cpu alone.
    let memory_limit = cgroup_dir("memory", daemons).join("memory.limit_in_bytes");
    std::fs::write(&memory_limit, "-1").expect("lift the memory limit");
    let unlimited = read(memory_limit.clone());
    let node = Node::start(
        "kubereserve-cpu",
        &[
            "--kube-reserved=cpu=200m,memory=32Mi",
            &flag,
            "--enforce-node-allocatable=pods,kube-reserved-compressible",
        ],
    )
    .await;
    assert_eq!(read(cgroup_dir("cpu", daemons).join("cpu.shares")), "204");
    assert_eq!(read(memory_limit), unlimited);
    node.finish().await;
    nodelet::cgroups::remove_tree(daemons.trim_start_matches('/'))
        .expect("remove the daemons' cgroup");
}

/// The CPUs a container's process may run on, as its last log line says (the container prints
/// its Cpus_allowed_list twice a second).
fn allowed_cpus(node: &Node, pod: &str) -> Option<String> {
    let prefix = format!("default_{}_", node.pod_name(pod));
    let log = crate::bed::read_container_logs(&node.pod_logs(), &prefix, "c");
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("Cpus_allowed_list"))?;
    Some(line.rsplit(['\t', ' ']).next()?.trim().to_string())
}

#[tokio::test]
async fn the_static_cpu_manager_gives_a_guaranteed_container_a_cpu_of_its_own_and_says_so() {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("online CPUs");
    let all = nodelet::cm::cpuset::CpuSet::parse(&online).expect("a CPU list");
    assert!(
        all.len() >= 2,
        "the test needs two CPUs, the machine has {all}"
    );
    let exclusive = nodelet::cm::cpuset::CpuSet::parse("1").expect("a CPU list");
    let shared = all.difference(&exclusive).to_string();
    let port = free_port();
    let node = Node::start(
        "cpumanager",
        &[
            "--cpu-manager-policy=static",
            "--reserved-cpus=0",
            "--cpu-manager-reconcile-period=1s",
            "--read-only-port",
            &port.to_string(),
        ],
    )
    .await;
    let report = "while true; do grep Cpus_allowed_list /proc/self/status; sleep 0.5; done";
    let with = |name: &str, resources: &str| {
        format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {BUSYBOX}
    resources: {resources}
    command: [sh, -c, \"trap 'exit 0' TERM; {report}\"]
"
        )
    };
    let guaranteed = "{requests: {cpu: 1, memory: 64Mi}, limits: {cpu: 1, memory: 64Mi}}";
    node.write_manifest("shared.yaml", &with("shared", "{}"));
    let all_text = all.to_string();
    eventually(
        "the shared container on every CPU",
        Duration::from_secs(60),
        || async { (allowed_cpus(&node, "shared")? == all_text).then_some(()) },
    )
    .await;
    node.write_manifest("excl.yaml", &with("excl", guaranteed));
    eventually(
        "the Guaranteed container on CPU 1 alone",
        Duration::from_secs(60),
        || async { (allowed_cpus(&node, "excl")? == "1").then_some(()) },
    )
    .await;
    eventually(
        "the shared container off CPU 1",
        Duration::from_secs(30),
        || async { (allowed_cpus(&node, "shared")? == shared).then_some(()) },
    )
    .await;
    // The assignment is in upstream's state file, under the pod's UID.
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(node.path("root/cpu_manager_state")).expect("cpu_manager_state"),
    )
    .expect("JSON");
    assert_eq!(state["policyName"], "static");
    assert_eq!(state["defaultCpuSet"], shared.as_str());
    let uid = node.wait_sandbox("excl").await.uid.0;
    assert_eq!(state["entries"][uid.as_str()]["c"], "1", "{state}");
    // The pod-resources API tells the same, as upstream's clients ask it.
    let mut api = node.pod_resources().await;
    let listed = api
        .list(ListPodResourcesRequest {})
        .await
        .expect("List")
        .into_inner();
    let cpus_of = |pod: &str| -> Option<Vec<i64>> {
        let name = node.pod_name(pod);
        let p = listed.pod_resources.iter().find(|p| p.name == name)?;
        Some(p.containers.iter().find(|c| c.name == "c")?.cpu_ids.clone())
    };
    assert_eq!(cpus_of("excl"), Some(vec![1]), "{listed:?}");
    assert_eq!(cpus_of("shared"), Some(vec![]), "{listed:?}");
    let allocatable = api
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .expect("GetAllocatableResources")
        .into_inner();
    let expected: Vec<i64> = all.iter().filter(|c| *c != 0).map(i64::from).collect();
    assert_eq!(allocatable.cpu_ids, expected);
    let one = api
        .get(GetPodResourcesRequest {
            pod_name: node.pod_name("excl"),
            pod_namespace: "default".into(),
        })
        .await
        .expect("Get")
        .into_inner();
    let containers = one.pod_resources.map(|p| p.containers).unwrap_or_default();
    assert_eq!(containers.first().map(|c| c.cpu_ids.clone()), Some(vec![1]));
    let missing = api
        .get(GetPodResourcesRequest {
            pod_name: "nope".into(),
            pod_namespace: "default".into(),
        })
        .await
        .expect_err("no such pod");
    assert_eq!(missing.code(), tonic::Code::NotFound);
    // No CPU is left for another Guaranteed container: allocatable holds one CPU fewer.
    node.write_manifest("second.yaml", &with("second", guaranteed));
    node.wait_status("second", "refused", |s| {
        s.phase.as_deref() == Some("Failed")
    })
    .await;
    // The metrics count the request for a CPU of its own and the two admissions, and show the
    // pools: the shared one but the reserved and the exclusive CPU. nodelet refuses the third
    // pod for the node's allocatable CPUs before the managers see it; the kubelet asks its
    // managers first, and would count it as a refused pinning.
    let pools = |shared: usize, exclusive: usize| {
        vec![
            format!(
                "kubelet_cpu_manager_shared_pool_size_millicores {}",
                shared * 1000
            ),
            format!("kubelet_cpu_manager_exclusive_cpu_allocation_count {exclusive}"),
        ]
    };
    let mut lines = pools(all.len() - 2, 1);
    lines.extend(
        [
            "kubelet_cpu_manager_pinning_requests_total 1",
            "kubelet_cpu_manager_pinning_errors_total 0",
            "kubelet_cpu_manager_allocation_per_numa{numa_node=\"0\"} 1",
            "kubelet_topology_manager_admission_requests_total 2",
            "kubelet_topology_manager_admission_errors_total 0",
            "kubelet_topology_manager_admission_duration_ms_count 2",
            "kubelet_container_aligned_compute_resources_count{scope=\"container\",boundary=\"physical_cpu\"} 0",
            "kubelet_container_aligned_compute_resources_failure_count{scope=\"container\",boundary=\"physical_cpu\"} 0",
        ]
        .map(String::from),
    );
    metrics_show(port, "the CPU manager's metrics", &lines).await;
    node.remove_manifest("second.yaml");
    // Once the exclusive container is gone its CPU goes back to the shared pool.
    node.remove_manifest("excl.yaml");
    eventually(
        "the shared container on every CPU again",
        Duration::from_secs(60),
        || async { (allowed_cpus(&node, "shared")? == all_text).then_some(()) },
    )
    .await;
    metrics_show(
        port,
        "the CPU back in the shared pool",
        &pools(all.len() - 1, 0),
    )
    .await;
    node.finish().await;
}

/// The pod `pinned`'s sandbox and its running container `c`.
async fn running_c(node: &Node) -> (nodelet::runtime::Sandbox, nodelet::runtime::Container) {
    eventually("container c running", Duration::from_secs(60), || async {
        let (sandbox, running) = node.wait_running("pinned", 1).await;
        let c = running.into_iter().find(|c| c.name == "c")?;
        Some((sandbox, c))
    })
    .await
}

/// The OCI spec the runtime made for a container.
async fn oci_spec(node: &Node, container_id: &str) -> serde_json::Value {
    let info = node
        .runtime
        .container_info(container_id)
        .await
        .expect("container info");
    let info: serde_json::Value =
        serde_json::from_str(info.get("info").map_or("{}", String::as_str)).expect("JSON");
    info["runtimeSpec"].clone()
}

#[tokio::test]
async fn the_static_memory_manager_pins_a_guaranteed_pod_to_its_numa_node_and_keeps_it() {
    let flags = [
        "--memory-manager-policy=Static",
        "--reserved-memory=0:memory=100Mi",
        "--topology-manager-policy=single-numa-node",
        "--topology-manager-scope=pod",
    ];
    let port = free_port().to_string();
    let served = [&flags[..], &["--read-only-port", &port]].concat();
    let mut node = Node::start("memorymanager", &served).await;
    let resources = |memory: &str| {
        format!(
            "{{requests: {{cpu: 100m, memory: {memory}}}, limits: {{cpu: 100m, memory: {memory}}}}}"
        )
    };
    node.write_manifest(
        "pinned.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: pinned}}
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - {{name: init, image: {BUSYBOX}, command: [\"true\"], resources: {}}}
  containers:
  - {{name: c, image: {BUSYBOX}, command: [sh, -c, \"{FOREVER}\"], resources: {}}}
",
            resources("32Mi"),
            resources("64Mi")
        ),
    );
    node.write_manifest(
        "loose.yaml",
        &crate::bed::pod_yaml("loose", &[("c", FOREVER)], ""),
    );
    let (sandbox, c) = running_c(&node).await;
    // Both of the Guaranteed pod's containers asked for pinned memory; each pod, the
    // BestEffort one too, was admitted aligned on one NUMA node, as upstream counts them.
    let lines = [
        "kubelet_memory_manager_pinning_requests_total 2",
        "kubelet_memory_manager_pinning_errors_total 0",
        "kubelet_container_aligned_compute_resources_count{scope=\"pod\",boundary=\"numa_node\"} 2",
        "kubelet_container_aligned_compute_resources_count{scope=\"container\",boundary=\"numa_node\"} 0",
    ]
    .map(String::from);
    let port: u16 = port.parse().expect("a port");
    metrics_show(port, "the memory manager's metrics", &lines).await;
    // cAdvisor's endpoint: the container's limit as its cgroup holds it.
    let (_, text) = crate::healthz::get(port, "/metrics/cadvisor")
        .await
        .expect("/metrics/cadvisor");
    assert!(
        text.lines().any(|l| l.starts_with("machine_memory_bytes{")),
        "{text}"
    );
    let limited = text.lines().any(|l| {
        l.starts_with("container_spec_memory_limit_bytes{container=\"c\",")
            && l.contains(&format!("name=\"{}\"", c.id))
            && l.split(' ').nth(1) == Some("67108864")
    });
    assert!(limited, "{text}");
    // The container's memory is pinned to NUMA node 0; a BestEffort one is not pinned.
    let spec = oci_spec(&node, &c.id).await;
    assert_eq!(spec["linux"]["resources"]["cpu"]["mems"], "0", "{spec}");
    let (_, loose) = node.wait_running("loose", 1).await;
    let spec = oci_spec(&node, &loose[0].id).await;
    assert!(
        spec["linux"]["resources"]["cpu"]["mems"]
            .as_str()
            .is_none_or(str::is_empty),
        "{spec}"
    );
    // Upstream's state file holds the reservation; the init container's memory was reused by
    // the app container, so its block is empty.
    let state_file = node.path("root/memory_manager_state");
    let state = || -> serde_json::Value {
        let text = std::fs::read(&state_file).expect("state file");
        serde_json::from_slice(&text).expect("JSON")
    };
    let uid = sandbox.uid.0.clone();
    let s = state();
    assert_eq!(s["policyName"], "Static");
    let block =
        |size: u64| serde_json::json!([{"numaAffinity": [0], "type": "memory", "size": size}]);
    assert_eq!(s["entries"][&uid]["c"], block(64 << 20), "{s}");
    assert_eq!(s["entries"][&uid]["init"], block(0), "{s}");
    assert_eq!(
        s["machineState"]["0"]["memoryMap"]["memory"]["reserved"],
        64 << 20
    );
    let total = s["machineState"]["0"]["memoryMap"]["memory"]["total"]
        .as_u64()
        .expect("total");
    // The pod-resources API reports the memory and where it is.
    let mut api = node.pod_resources().await;
    let one = api
        .get(GetPodResourcesRequest {
            pod_name: node.pod_name("pinned"),
            pod_namespace: "default".into(),
        })
        .await
        .expect("Get")
        .into_inner();
    let containers = one.pod_resources.map(|p| p.containers).unwrap_or_default();
    let memory = &containers.iter().find(|c| c.name == "c").expect("c").memory;
    assert_eq!(memory.len(), 1, "{memory:?}");
    assert_eq!(
        (memory[0].memory_type.as_str(), memory[0].size),
        ("memory", 64 << 20)
    );
    let nodes = memory[0].topology.as_ref().map(|t| t.nodes.clone());
    assert_eq!(
        nodes.map(|n| n.iter().map(|n| n.id).collect::<Vec<_>>()),
        Some(vec![0])
    );
    let allocatable = api
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .expect("GetAllocatableResources")
        .into_inner();
    assert_eq!(allocatable.memory.len(), 1, "{:?}", allocatable.memory);
    assert_eq!(allocatable.memory[0].size, total - (100 << 20));
    // A start with reserves that do not add up to node allocatable's, or that no longer match
    // the state file, is refused with the reason, and the running pod is left alone.
    node.stop_agent().await;
    let (dir, name) = (node.path(""), node.name.clone());
    let refused = |extra: &[&str]| {
        let out = crate::bed::nodelet_command(&dir, &name)
            .args(flags.iter().filter(|f| !f.starts_with("--reserved-memory")))
            .args(extra)
            .output()
            .expect("nodelet runs");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let stderr = refused(&["--reserved-memory=0:memory=50Mi"]);
    assert!(
        stderr.contains("reserved by --reserved-memory is not equal to the 104857600 bytes node allocatable keeps back"),
        "{stderr}"
    );
    let stderr = refused(&[
        "--kube-reserved=memory=100Mi",
        "--reserved-memory=0:memory=200Mi",
    ]);
    assert!(
        stderr.contains("the expected machine state is different from the real one")
            && stderr.contains("memory_manager_state"),
        "{stderr}"
    );
    node.restart(&served).await;
    let (_, c_again) = running_c(&node).await;
    assert_eq!(
        c_again.id, c.id,
        "the pinned container is kept across the restart"
    );
    assert_eq!(state()["entries"][&uid]["c"], block(64 << 20));
    // Once the pod is gone its memory is free again.
    node.remove_manifest("pinned.yaml");
    eventually(
        "the pod's memory released",
        Duration::from_secs(60),
        || async {
            let s = state();
            (s["entries"].get(&uid).is_none()
                && s["machineState"]["0"]["memoryMap"]["memory"]["reserved"] == 0)
                .then_some(())
        },
    )
    .await;
    node.finish().await;
}

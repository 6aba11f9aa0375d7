//! The eviction manager on the machine's real memory cgroups: a threshold the node always
//! breaches makes it evict, one pod a pass, BestEffort before Burstable, and never a critical
//! pod; new BestEffort pods are refused while the pressure lasts.

use crate::bed::{BUSYBOX, FOREVER, Node, eventually, pod_yaml};

fn burstable(name: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: app
    image: {BUSYBOX}
    command: [sh, -c, {}]
    resources:
      requests:
        memory: 10Mi
        cpu: 10m
",
        serde_json::to_string(&format!("trap 'exit 0' TERM; {FOREVER}")).unwrap()
    )
}

fn evicted(s: &k8s_openapi::api::core::v1::PodStatus) -> bool {
    s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some("Evicted")
}

#[tokio::test]
async fn memory_pressure_evicts_best_effort_then_burstable_and_never_a_critical_pod() {
    let mut node = Node::start("evict", &["--testing-eviction-period=1s"]).await;
    node.write_manifest("be.yaml", &pod_yaml("be", &[("app", FOREVER)], ""));
    node.write_manifest("bu.yaml", &burstable("bu"));
    let critical = "  priorityClassName: system-node-critical\n  priority: 2000001000\n";
    node.write_manifest("cp.yaml", &pod_yaml("cp", &[("app", FOREVER)], critical));
    for name in ["be", "bu", "cp"] {
        node.wait_running(name, 1).await;
    }
    // Restarted with a threshold the node always breaches: 99% of its memory must be free.
    node.stop_agent().await;
    node.restart(&["--eviction-hard", "memory.available<99%"])
        .await;

    let be = node
        .wait_status("be", "the BestEffort pod to be evicted", evicted)
        .await;
    let message = be.message.unwrap_or_default();
    assert!(
        message.starts_with("The node was low on resource: memory."),
        "{message}"
    );
    assert!(
        message.contains("(memory.available is the capacity ") && message.contains("working set"),
        "the event names the signal's inputs: {message}"
    );
    node.wait_status("bu", "the Burstable pod to be evicted", evicted)
        .await;
    let (sandbox, _) = node.wait_running("cp", 1).await;
    assert!(!sandbox.id.is_empty());

    // The order, from the node's events: the BestEffort pod went first.
    let out = node.cli(&["events"]).output().await.expect("the CLI runs");
    let events = String::from_utf8_lossy(&out.stdout);
    let position = |pod: &str| {
        events
            .lines()
            .position(|l| {
                l.contains("Evicted") && l.contains(&format!("pod/{}", node.pod_name(pod)))
            })
            .unwrap_or_else(|| panic!("no eviction of {pod} in:\n{events}"))
    };
    assert!(position("be") < position("bu"), "{events}");

    // Evicted pods are down; a new BestEffort pod is refused while the pressure lasts.
    eventually(
        "the evicted pods' sandboxes to stop",
        std::time::Duration::from_secs(30),
        || async {
            let mut all_down = true;
            for pod in ["be", "bu"] {
                for s in node.sandboxes(pod).await {
                    all_down &= s.state != nodelet::runtime::SandboxState::Ready;
                }
            }
            all_down.then_some(())
        },
    )
    .await;
    node.write_manifest("late.yaml", &pod_yaml("late", &[("app", FOREVER)], ""));
    let late = node
        .wait_status("late", "the late BestEffort pod to be refused", evicted)
        .await;
    assert_eq!(
        late.message.as_deref(),
        Some("Pod was rejected: The node had condition: [MemoryPressure]. ")
    );
    assert!(
        node.status("cp")
            .is_some_and(|s| s.phase.as_deref() == Some("Running"))
    );
    node.finish().await;
}

/// The node's memory.available as nodelet computes it on this (cgroup v1) machine: MemTotal less
/// the root memory cgroup's working set.
fn node_memory_available() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let total: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemTotal");
    let root = std::path::Path::new("/sys/fs/cgroup/memory");
    let usage: u64 = std::fs::read_to_string(root.join("memory.usage_in_bytes"))
        .expect("the memory controller's v1 root")
        .trim()
        .parse()
        .expect("a byte count");
    let stat = std::fs::read_to_string(root.join("memory.stat")).expect("memory.stat");
    let inactive: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_inactive_file");
    (total * 1024).saturating_sub(usage.saturating_sub(inactive))
}

#[tokio::test]
async fn memory_pressure_is_seen_when_it_comes_not_at_the_next_poll() {
    // The poll is made rare (10 min): only the kernel's notifications can show the pressure in
    // time. The threshold lies 2 GiB below what is free now; the pod then fills 4 GiB of memory.
    const MIB: u64 = 1 << 20;
    let threshold = (node_memory_available() - 2048 * MIB) / MIB;
    let hard = format!("memory.available<{threshold}Mi");
    let node = Node::start(
        "evictnow",
        &["--testing-eviction-period=10m", "--eviction-hard", &hard],
    )
    .await;
    let fill = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: fill
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: mem
    emptyDir:
      medium: Memory
  containers:
  - name: app
    image: {BUSYBOX}
    command: [sh, -c, "dd if=/dev/zero of=/mem/fill bs=1M count=4096; {FOREVER}"]
    volumeMounts:
    - name: mem
      mountPath: /mem
"#
    );
    node.write_manifest("fill.yaml", &fill);
    let status = node
        .wait_status("fill", "evicted well before the next poll", evicted)
        .await;
    let message = status.message.unwrap_or_default();
    assert!(
        message.starts_with("The node was low on resource: memory."),
        "{message}"
    );
    node.finish().await;
}

//! The eviction manager on the machine's real memory cgroups: a threshold the node always
//! breaches makes it evict, one pod a pass, BestEffort before Burstable, and never a critical
//! pod; new BestEffort pods are refused while the pressure lasts.

use crate::bed::{BUSYBOX, FOREVER, Node, eventually, pod_yaml};

fn burstable(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 5\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    command: [sh, -c, {}]\n    resources:\n      requests:\n        memory: 10Mi\n        cpu: 10m\n",
        serde_json::to_string(&format!("trap 'exit 0' TERM; {FOREVER}")).unwrap()
    )
}

fn evicted(s: &k8s_openapi::api::core::v1::PodStatus) -> bool {
    s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some("Evicted")
}

#[tokio::test]
async fn memory_pressure_evicts_best_effort_then_burstable_and_never_a_critical_pod() {
    // SAFETY: nextest runs each test in a process of its own.
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

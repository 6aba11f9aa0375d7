//! Attacks on a real node, as a container, a local user or a network client would make them:
//! each must get nothing the upstream kubelet's trust model does not give them.

use std::time::Duration;

use crate::bed::{BUSYBOX, FOREVER, Node, eventually};

/// Containers that crash-loop with the raced subPath.
const VICTIMS: usize = 6;

#[tokio::test]
async fn a_container_racing_symlinks_never_gets_a_sub_path_outside_its_volume() {
    let node = Node::start("subrace", &[]).await;
    // A host directory the containers cannot see: a subPath through a link to it must not
    // make anything in it.
    let host_dir = node.path("host-only");
    std::fs::create_dir_all(&host_dir).expect("make the host directory");
    let host = host_dir.display();
    // `plant` points `y` at the host directory before the others start; `racer` swaps `x`
    // between a directory and a link to the host's root in a tight loop while six victims
    // crash-loop with subPath `x`, and `maker` asks for `y/made`.
    let victims: String = (0..VICTIMS)
        .map(|i| {
            format!(
                r#"  - name: v{i}
    image: {BUSYBOX}
    volumeMounts: [{{name: data, mountPath: /mnt, subPath: x}}]
    command: [sh, -c, "if [ -n \"$(ls -A /mnt)\" ]; then echo ESCAPED: $(ls /mnt); fi; exit 1"]
"#
            )
        })
        .collect();
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: race}}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{{name: data, emptyDir: {{}}}}]
  initContainers:
  - name: plant
    image: {BUSYBOX}
    volumeMounts: [{{name: data, mountPath: /data}}]
    command: [sh, -c, "ln -s {host} /data/y"]
  containers:
  - name: racer
    image: {BUSYBOX}
    volumeMounts: [{{name: data, mountPath: /data}}]
    command: [sh, -c, "trap 'exit 0' TERM; cd /data; while true; do mkdir x; rmdir x; ln -s / x; rm x; done 2>/dev/null"]
  - name: maker
    image: {BUSYBOX}
    volumeMounts: [{{name: data, mountPath: /mnt, subPath: y/made}}]
    command: [sh, -c, "{FOREVER}"]
{victims}"#
    );
    node.write_manifest("race.yaml", &pod);
    // Every start of a victim is an attempt, whether nodelet refused it, the runtime failed it
    // or it ran; none may see outside the volume.
    let pod_logs = node.pod_logs();
    eventually(
        "the victims to be started 24 times",
        Duration::from_secs(150),
        || async {
            for i in 0..VICTIMS {
                let text =
                    crate::bed::read_container_logs(&pod_logs, "default_race-", &format!("v{i}"));
                assert!(
                    !text.contains("ESCAPED"),
                    "victim {i} saw outside its volume: {text}"
                );
            }
            let logs = crate::bed::logs();
            let attempts = logs
                .lines()
                .filter(|l| l.contains(r#"object="spec.containers{v"#))
                .filter(|l| {
                    l.contains(r#"event="Created""#)
                        || (l.contains(r#"event="Failed""#)
                            && l.contains("CreateContainerConfigError"))
                })
                .count();
            (attempts >= 24).then_some(())
        },
    )
    .await;
    let status = node.status("race").expect("the pod has a status");
    let maker = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "maker")
        .expect("the maker's status");
    let waiting = maker
        .state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .expect("the maker waits");
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    assert!(
        waiting
            .message
            .as_deref()
            .is_some_and(|m| m.contains("symlink")),
        "{waiting:?}"
    );
    assert!(
        !host_dir.join("made").exists(),
        "nodelet made a directory through the container's link"
    );
    node.finish().await;
}

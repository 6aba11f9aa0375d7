//! Static pods from a manifest directory, end to end against containerd.

use std::time::Duration;

use nodelet::runtime::{
    ANNOTATION_CONTAINER_HASH, ANNOTATION_RESTART_COUNT, LABEL_CONTAINER_NAME, LABEL_POD_NAMESPACE,
    LABEL_POD_UID,
};

use crate::bed::{FOREVER, Node, eventually, metrics_show, pod_yaml};

#[tokio::test]
async fn a_busybox_pod_starts_and_its_output_appears_in_its_log() {
    let node = Node::start("hello", &[]).await;
    node.write_manifest(
        "hello.yaml",
        &pod_yaml(
            "hello",
            &[("greeter", &format!("echo hello-static-pod; {FOREVER}"))],
            "",
        ),
    );
    let (sandbox, containers) = node.wait_running("hello", 1).await;
    node.wait_log("hello", "greeter", "hello-static-pod").await;

    let c = node
        .runtime
        .container_status(&containers[0].id)
        .await
        .unwrap();
    assert_eq!(c.labels[LABEL_CONTAINER_NAME], "greeter");
    assert_eq!(c.labels[LABEL_POD_NAMESPACE], "default");
    assert_eq!(c.labels[LABEL_POD_UID], sandbox.uid.0);
    assert_eq!(c.annotations[ANNOTATION_RESTART_COUNT], "0");
    assert!(!c.annotations[ANNOTATION_CONTAINER_HASH].is_empty());
    assert_eq!(sandbox.annotations["kubernetes.io/config.source"], "file");
    assert_eq!(
        sandbox.annotations["kubernetes.io/config.hash"],
        sandbox.uid.0
    );
    assert_eq!(sandbox.name, node.pod_name("hello"));
    let expected_log = node
        .pod_logs()
        .join(format!(
            "default_{}_{}",
            node.pod_name("hello"),
            sandbox.uid
        ))
        .join("greeter/0.log");
    assert_eq!(c.log_path, expected_log.display().to_string());
    let link = node.path("containers").join(format!(
        "{}_default_greeter-{}.log",
        node.pod_name("hello"),
        c.id
    ));
    assert_eq!(
        std::fs::read_link(&link).expect("container log symlink"),
        expected_log
    );
    node.finish().await;
}

#[tokio::test]
async fn a_host_network_pod_sees_the_host_network() {
    let node = Node::start("hostnet", &[]).await;
    let host_netns = std::fs::read_link("/proc/self/ns/net")
        .unwrap()
        .display()
        .to_string();
    node.write_manifest(
        "hostnet.yaml",
        &pod_yaml(
            "hostnet",
            &[(
                "c",
                &format!("echo netns=$(readlink /proc/self/ns/net); {FOREVER}"),
            )],
            "  hostNetwork: true\n",
        ),
    );
    node.wait_running("hostnet", 1).await;
    node.wait_log("hostnet", "c", &format!("netns={host_netns}"))
        .await;

    node.write_manifest(
        "podnet.yaml",
        &pod_yaml(
            "podnet",
            &[(
                "c",
                &format!("echo netns=$(readlink /proc/self/ns/net); {FOREVER}"),
            )],
            "",
        ),
    );
    node.wait_running("podnet", 1).await;
    let log = node.wait_log("podnet", "c", "netns=").await;
    assert!(
        !log.contains(&host_netns),
        "a pod-network pod has its own namespace: {log}"
    );
    node.finish().await;
}

#[tokio::test]
async fn a_host_path_file_and_an_empty_dir_are_shared_by_two_containers() {
    let port = crate::bed::free_port();
    let read_only = ["--read-only-port".to_string(), port.to_string()];
    let read_only = read_only.each_ref().map(String::as_str);
    let mut node = Node::start("volumes", &read_only).await;
    let host_dir = node.path("host-data");
    std::fs::create_dir_all(&host_dir).unwrap();
    std::fs::write(host_dir.join("greeting"), "from-the-host\n").unwrap();
    let extra = format!(
        "  volumes:\n  - name: shared\n    emptyDir: {{}}\n  - name: host\n    hostPath: {{path: {}, type: Directory}}\n  - name: made\n    hostPath: {{path: {}, type: DirectoryOrCreate}}\n",
        host_dir.display(),
        node.path("created-by-nodelet").display()
    );
    let mut yaml = pod_yaml(
        "volumes",
        &[
            (
                "writer",
                &format!("cat /host/greeting > /shared/msg; {FOREVER}"),
            ),
            (
                "reader",
                &format!(
                    "until [ -s /shared/msg ]; do sleep 0.2; done; echo got=$(cat /shared/msg); echo made > /made/file; {FOREVER}"
                ),
            ),
        ],
        &extra,
    );
    yaml = yaml.replacen(
        "    command:",
        "    volumeMounts: [{name: shared, mountPath: /shared}, {name: host, mountPath: /host, readOnly: true}]\n    command:",
        1,
    );
    let idx = yaml.rfind("    command:").unwrap();
    yaml.insert_str(
        idx,
        "    volumeMounts: [{name: shared, mountPath: /shared}, {name: made, mountPath: /made}]\n",
    );
    node.write_manifest("volumes.yaml", &yaml);
    let (sandbox, _) = node.wait_running("volumes", 2).await;
    node.wait_log("volumes", "reader", "got=from-the-host")
        .await;
    eventually(
        "the hostPath DirectoryOrCreate to be made and written",
        Duration::from_secs(30),
        || async {
            std::fs::read_to_string(node.path("created-by-nodelet/file"))
                .ok()
                .filter(|s| s.trim() == "made")
        },
    )
    .await;
    let empty_dir = node
        .path("root/pods")
        .join(&sandbox.uid.0)
        .join("volumes/kubernetes.io~empty-dir/shared/msg");
    assert_eq!(
        std::fs::read_to_string(&empty_dir).unwrap(),
        "from-the-host\n"
    );
    let operation = |plugin: &str, operation: &str, n: usize| {
        format!(
            "storage_operation_duration_seconds_count{{volume_plugin=\"kubernetes.io/{plugin}\",operation_name=\"{operation}\",status=\"success\",migrated=\"false\"}} {n}"
        )
    };
    let volumes = |plugin: &str, n: usize| {
        ["desired", "actual"].map(|state| {
            format!("volume_manager_total_volumes{{plugin_name=\"kubernetes.io/{plugin}\",state=\"{state}_state_of_world\"}} {n}")
        })
    };
    let mut lines = vec![
        operation("empty-dir", "verify_controller_attached_volume", 1),
        operation("empty-dir", "volume_mount", 1),
        operation("host-path", "verify_controller_attached_volume", 2),
        operation("host-path", "volume_mount", 2),
        "volume_operation_total_seconds_count{plugin_name=\"kubernetes.io/empty-dir\",operation_name=\"overall_volume_mount\"} 1".into(),
        "reconstruct_volume_operations_total 0".into(),
    ];
    lines.extend(volumes("empty-dir", 1));
    lines.extend(volumes("host-path", 2));
    metrics_show(port, "the volume manager's metrics", &lines).await;

    // A restarted agent takes the emptyDir back from the disk: it is not mounted again. The
    // hostPath volumes, which leave nothing under the pod, are (as upstream).
    node.stop_agent().await;
    node.restart(&read_only).await;
    node.wait_running("volumes", 2).await;
    let lines = [
        "reconstruct_volume_operations_total 1".to_string(),
        "reconstruct_volume_operations_errors_total 0".into(),
        operation("empty-dir", "volume_mount", 1),
        operation("host-path", "volume_mount", 4),
    ];
    metrics_show(port, "the volumes taken back after a restart", &lines).await;

    node.remove_manifest("volumes.yaml");
    node.wait_gone(&sandbox.uid, Duration::from_secs(30)).await;
    eventually(
        "the pod directory to be removed",
        Duration::from_secs(10),
        || async { (!node.path("root/pods").join(&sandbox.uid.0).exists()).then_some(()) },
    )
    .await;
    assert!(
        host_dir.join("greeting").exists(),
        "hostPath content is never removed"
    );
    let lines = [
        operation("empty-dir", "volume_unmount", 1),
        operation("host-path", "volume_unmount", 2),
    ];
    metrics_show(port, "the volumes unmounted", &lines).await;
    let metrics = crate::healthz::get(port, "/metrics").await.unwrap().1;
    assert!(
        !metrics.contains("volume_manager_total_volumes{"),
        "no pod wants or has volumes: {metrics}"
    );
    node.finish().await;
}

#[tokio::test]
async fn an_edited_manifest_replaces_the_pod_with_a_new_uid() {
    let node = Node::start("edit", &[]).await;
    node.write_manifest(
        "edit.yaml",
        &pod_yaml(
            "edit",
            &[("c", &format!("echo version-one; {FOREVER}"))],
            "",
        ),
    );
    let (first, _) = node.wait_running("edit", 1).await;
    node.wait_log("edit", "c", "version-one").await;

    node.write_manifest(
        "edit.yaml",
        &pod_yaml(
            "edit",
            &[("c", &format!("echo version-two; {FOREVER}"))],
            "",
        ),
    );
    node.wait_gone(&first.uid, Duration::from_secs(30)).await;
    let (second, _) = node.wait_running("edit", 1).await;
    assert_ne!(first.uid, second.uid);
    node.wait_log("edit", "c", "version-two").await;
    node.finish().await;
}

#[tokio::test]
async fn a_manifest_removed_and_put_back_runs_its_pod_afresh() {
    let node = Node::start("readd", &[]).await;
    let yaml = pod_yaml("readd", &[("c", FOREVER)], "");
    node.write_manifest("readd.yaml", &yaml);
    let (first, _) = node.wait_running("readd", 1).await;
    node.remove_manifest("readd.yaml");
    node.wait_gone(&first.uid, Duration::from_secs(30)).await;
    // The same manifest is the same pod (the same UID) again: it must not be taken for the
    // one just removed, whatever the latest relist of the runtime still showed of that.
    node.write_manifest("readd.yaml", &yaml);
    let (second, _) = node.wait_running("readd", 1).await;
    assert_eq!(first.uid, second.uid);
    assert_ne!(first.id, second.id);
    // Its second removal is a termination of its own: the pod leaves the node's statuses.
    node.remove_manifest("readd.yaml");
    node.wait_gone(&second.uid, Duration::from_secs(30)).await;
    eventually(
        "the pod gone from the statuses",
        Duration::from_secs(30),
        || async { node.status("readd").is_none().then_some(()) },
    )
    .await;
    node.finish().await;
}

/// A manifest deleted and written again at once (upstream's "Mirror Pod, recreate" test) is a
/// pod removed and added again: it restarts, its container counted as restarted once.
#[tokio::test]
async fn a_manifest_deleted_and_written_again_at_once_restarts_its_pod() {
    let node = Node::start("recreate", &[]).await;
    let yaml = pod_yaml("recreate", &[("c", FOREVER)], "");
    node.write_manifest("recreate.yaml", &yaml);
    let (first, first_containers) = node.wait_running("recreate", 1).await;
    node.remove_manifest("recreate.yaml");
    std::fs::write(node.manifests().join("recreate.yaml"), &yaml).expect("write it again");
    node.wait_status("recreate", "its container restarted once", |s| {
        let statuses = s.container_statuses.iter().flatten();
        statuses
            .map(|c| {
                (
                    c.restart_count,
                    c.state.as_ref().and_then(|s| s.running.as_ref()),
                )
            })
            .any(|(count, running)| count == 1 && running.is_some())
    })
    .await;
    let (second, second_containers) = node.wait_running("recreate", 1).await;
    assert_eq!(first.uid, second.uid, "the same manifest is the same pod");
    assert_ne!(first_containers[0].id, second_containers[0].id);
    node.finish().await;
}

#[tokio::test]
async fn a_manifest_put_back_while_its_pod_terminates_restarts_it_once_it_is_down() {
    let port = crate::bed::free_port();
    let node = Node::start(
        "early",
        &[
            "--read-only-port",
            &port.to_string(),
            "--address",
            "127.0.0.1",
        ],
    )
    .await;
    let marker = node.path("marker");
    std::fs::create_dir_all(&marker).unwrap();
    // The container notes SIGTERM and runs on, so the pod stays terminating for its grace.
    let yaml = pod_yaml(
        "early",
        &[(
            "c",
            "trap 'touch /m/term' TERM; while true; do sleep 0.1; done",
        )],
        &format!(
            "  volumes: [{{name: m, hostPath: {{path: {}}}}}]\n",
            marker.display()
        ),
    )
    .replace(
        "    command:",
        "    volumeMounts: [{name: m, mountPath: /m}]\n    command:",
    );
    node.write_manifest("early.yaml", &yaml);
    let (first, first_containers) = node.wait_running("early", 1).await;
    node.remove_manifest("early.yaml");
    eventually(
        "the container to get SIGTERM",
        Duration::from_secs(30),
        || async { marker.join("term").exists().then_some(()) },
    )
    .await;
    node.write_manifest("early.yaml", &yaml);
    // Upstream's count of pods recreated with the same UID while the agent watched them.
    let restarted = "kubelet_restarted_pods_total{static=\"true\"} 1";
    eventually(
        "the restart to be counted",
        Duration::from_secs(30),
        || async {
            let (_, body) = crate::healthz::get(port, "/metrics").await?;
            body.lines().any(|l| l == restarted).then_some(())
        },
    )
    .await;
    let (second, second_containers) = node.wait_running("early", 1).await;
    assert_eq!(first.uid, second.uid);
    assert_ne!(first_containers[0].id, second_containers[0].id);
    node.finish().await;
}

#[tokio::test]
async fn removal_stops_containers_within_the_grace_period() {
    let node = Node::start("grace", &[]).await;
    let marker = node.path("marker");
    std::fs::create_dir_all(&marker).unwrap();
    let yaml = format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: grace}}
spec:
  terminationGracePeriodSeconds: 3
  volumes: [{{name: m, hostPath: {{path: {}}}}}]
  containers:
  - name: polite
    image: {}
    volumeMounts: [{{name: m, mountPath: /m}}]
    command: [sh, -c, \"trap 'echo got-term > /m/polite; exit 0' TERM; while true; do sleep 0.1; done\"]
  - name: stubborn
    image: {}
    command: [sh, -c, \"trap '' TERM; while true; do sleep 0.1; done\"]
",
        marker.display(),
        crate::bed::BUSYBOX,
        crate::bed::BUSYBOX
    );
    node.write_manifest("grace.yaml", &yaml);
    let (sandbox, _) = node.wait_running("grace", 2).await;
    node.remove_manifest("grace.yaml");
    eventually(
        "the polite container to get SIGTERM",
        Duration::from_secs(10),
        || async {
            std::fs::read_to_string(marker.join("polite"))
                .ok()
                .filter(|s| s.contains("got-term"))
        },
    )
    .await;
    // The stubborn one ignores SIGTERM and is killed at the 3 s deadline.
    node.wait_gone(&sandbox.uid, Duration::from_secs(20)).await;
    node.finish().await;
}

#[tokio::test]
async fn editor_artifacts_and_dotfiles_never_create_pods() {
    let node = Node::start("artifacts", &[]).await;
    let dir = node.manifests();
    for (i, name) in [
        ".hidden.yaml",
        "web.yaml.swp",
        "web.yaml~",
        "4913",
        "web.yaml.bak",
        "web.tmp",
        "web.yaml.dpkg-new",
        "web.yaml.rpmsave",
    ]
    .iter()
    .enumerate()
    {
        std::fs::write(
            dir.join(name),
            pod_yaml(&format!("artifact{i}"), &[("c", FOREVER)], ""),
        )
        .unwrap();
    }
    std::fs::create_dir_all(dir.join("subdir")).unwrap();
    std::fs::write(
        dir.join("subdir/nested.yaml"),
        pod_yaml("nested", &[("c", FOREVER)], ""),
    )
    .unwrap();
    node.write_manifest("real.yaml", &pod_yaml("real", &[("c", FOREVER)], ""));
    node.wait_running("real", 1).await;
    let all = node.all_sandboxes().await;
    assert_eq!(
        all.len(),
        1,
        "only the real manifest makes a pod: {:?}",
        all.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    node.finish().await;
}

#[tokio::test]
async fn a_data_symlink_swap_and_an_atomic_rename_are_picked_up() {
    let node = Node::start("swap", &[]).await;
    let dir = node.manifests();
    std::fs::create_dir_all(dir.join("..v1")).unwrap();
    std::fs::write(
        dir.join("..v1/swap.yaml"),
        pod_yaml(
            "swap",
            &[("c", &format!("echo generation-1; {FOREVER}"))],
            "",
        ),
    )
    .unwrap();
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/swap.yaml", dir.join("swap.yaml")).unwrap();
    let (first, _) = node.wait_running("swap", 1).await;
    node.wait_log("swap", "c", "generation-1").await;

    std::fs::create_dir_all(dir.join("..v2")).unwrap();
    std::fs::write(
        dir.join("..v2/swap.yaml"),
        pod_yaml(
            "swap",
            &[("c", &format!("echo generation-2; {FOREVER}"))],
            "",
        ),
    )
    .unwrap();
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    node.wait_gone(&first.uid, Duration::from_secs(30)).await;
    node.wait_log("swap", "c", "generation-2").await;

    // A plain atomic rename over an existing manifest.
    let (second, _) = node.wait_running("swap", 1).await;
    std::fs::remove_file(dir.join("swap.yaml")).unwrap();
    node.write_manifest(
        "swap.yaml",
        &pod_yaml(
            "swap",
            &[("c", &format!("echo generation-3; {FOREVER}"))],
            "",
        ),
    );
    node.wait_gone(&second.uid, Duration::from_secs(30)).await;
    node.wait_log("swap", "c", "generation-3").await;
    node.finish().await;
}

#[tokio::test]
async fn a_half_written_file_breaks_nothing_and_the_finished_file_runs() {
    let node = Node::start("half", &[]).await;
    node.write_manifest("steady.yaml", &pod_yaml("steady", &[("c", FOREVER)], ""));
    let (steady, _) = node.wait_running("steady", 1).await;

    let full = pod_yaml(
        "half",
        &[("c", &format!("echo finished-file; {FOREVER}"))],
        "",
    );
    let (head, tail) = full.split_at(full.len() / 2);
    let path = node.manifests().join("half.yaml");
    std::fs::write(&path, head).unwrap();
    // Binary garbage beside it must not hurt either.
    std::fs::write(
        node.manifests().join("garbage.yaml"),
        [0xffu8, 0x00, 0x9c, b':', b'\n', b'-'],
    )
    .unwrap();
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(tail.as_bytes()).unwrap();
    drop(f);
    node.wait_running("half", 1).await;
    node.wait_log("half", "c", "finished-file").await;
    assert!(node.agent_alive());
    let (still, _) = node.wait_running("steady", 1).await;
    assert_eq!(still.id, steady.id, "the other pod was not touched");
    node.finish().await;
}

#[tokio::test]
async fn a_broken_manifest_beside_two_good_ones_loses_nothing() {
    let node = Node::start("broken", &[]).await;
    node.write_manifest("a.yaml", &pod_yaml("good-a", &[("c", FOREVER)], ""));
    node.write_manifest(
        "b.yaml",
        "apiVersion: v1
kind: Pod
metadata: {name: Bad_Name}
spec:
  containers: [{name: c, image: ''}]
",
    );
    node.write_manifest("c.yaml", &pod_yaml("good-c", &[("c", FOREVER)], ""));
    node.wait_running("good-a", 1).await;
    node.wait_running("good-c", 1).await;
    assert_eq!(node.all_sandboxes().await.len(), 2);
    assert!(node.agent_alive());
    node.finish().await;
}

#[tokio::test]
async fn a_multi_document_file_runs_every_pod_in_it() {
    let node = Node::start("multi", &[]).await;
    let text = format!(
        "---\n{}---\n{}",
        pod_yaml("first", &[("c", FOREVER)], ""),
        pod_yaml("second", &[("c", FOREVER)], "")
    );
    node.write_manifest("both.yaml", &text);
    node.wait_running("first", 1).await;
    node.wait_running("second", 1).await;
    node.finish().await;
}

#[tokio::test]
async fn pods_of_a_manifest_removed_while_nodelet_was_down_are_collected() {
    let mut node = Node::start("orphan", &[]).await;
    node.write_manifest("orphan.yaml", &pod_yaml("orphan", &[("c", FOREVER)], ""));
    node.write_manifest("kept.yaml", &pod_yaml("kept", &[("c", FOREVER)], ""));
    let (orphan, _) = node.wait_running("orphan", 1).await;
    let (_, kept) = node.wait_running("kept", 1).await;
    node.stop_agent().await;
    node.remove_manifest("orphan.yaml");
    node.restart(&[]).await;
    node.wait_gone(&orphan.uid, Duration::from_secs(30)).await;
    let (_, still) = node.wait_running("kept", 1).await;
    assert_eq!(
        still[0].id, kept[0].id,
        "a running pod is adopted, not restarted"
    );
    node.finish().await;
}

#[tokio::test]
async fn a_single_manifest_file_path_and_a_memory_empty_dir_work() {
    let mut node = Node::start("single", &[]).await;
    node.stop_agent().await;
    let file = node.path("only.yaml");
    let extra = "  volumes: [{name: scratch, emptyDir: {medium: Memory, sizeLimit: 8Mi}}]\n";
    let yaml = pod_yaml(
        "single",
        &[(
            "c",
            &format!("df -k /scratch | tail -1; grep ' /scratch ' /proc/mounts; {FOREVER}"),
        )],
        extra,
    )
    .replacen(
        "    command:",
        "    volumeMounts: [{name: scratch, mountPath: /scratch}]\n    command:",
        1,
    );
    std::fs::write(&file, yaml).unwrap();
    let path = file.display().to_string();
    node.restart(&["--pod-manifest-path", &path]).await;
    let (sandbox, _) = node.wait_running("single", 1).await;
    let log = node.wait_log("single", "c", "tmpfs").await;
    assert!(log.contains(" 8192 "), "an 8 MiB tmpfs: {log}");
    std::fs::remove_file(&file).unwrap();
    node.wait_gone(&sandbox.uid, Duration::from_secs(30)).await;
    let volume = node.path("root/pods").join(&sandbox.uid.0);
    eventually(
        "the tmpfs to be unmounted and removed",
        Duration::from_secs(10),
        || async {
            let mounted = std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap_or_default()
                .contains(&sandbox.uid.0);
            (!mounted && !volume.exists()).then_some(())
        },
    )
    .await;
    node.finish().await;
}

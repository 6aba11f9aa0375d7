//! The CRI client against the real containerd: a sandbox and a busybox container that echoes a
//! line, read back from the CRI log file, seen running and then exited, then removed.

use std::collections::HashMap;
use std::time::Duration;

use nodelet::runtime::{ANNOTATION_NODE_NAME, ContainerState, LABEL_POD_UID, cri};
use nodelet::types::PodUid;

use crate::bed::{BUSYBOX, eventually, runtime, testbed_dir};

#[tokio::test]
async fn the_cri_client_runs_a_container_whose_output_lands_in_its_log() {
    let rt = runtime().await;
    let version = rt.version().await.expect("Version");
    assert_eq!(version.runtime_name, "containerd");

    std::fs::create_dir_all(testbed_dir().join("tests")).unwrap();
    let dir = tempfile::Builder::new()
        .prefix("cri-client-")
        .tempdir_in(testbed_dir().join("tests"))
        .unwrap();
    let uid = format!("cri-client-{}", std::process::id());
    let labels: HashMap<String, String> = [(LABEL_POD_UID.to_string(), uid.clone())].into();
    let sandbox_config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "cri-client".into(),
            uid: uid.clone(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "cri-client".into(),
        log_directory: dir.path().display().to_string(),
        labels: labels.clone(),
        // Of a node no test runs: the nodelets of tests running meanwhile would otherwise
        // collect this pod-labelled sandbox as their orphan (and stop its container).
        annotations: [(
            ANNOTATION_NODE_NAME.to_string(),
            "t-cri-client-only".to_string(),
        )]
        .into(),
        ..Default::default()
    };
    let sandbox = rt
        .run_pod_sandbox(sandbox_config.clone(), String::new())
        .await
        .expect("RunPodSandbox");
    assert!(
        !rt.pod_sandbox_status(&sandbox)
            .await
            .expect("PodSandboxStatus")
            .id
            .is_empty()
    );

    let image = rt
        .image_status(BUSYBOX)
        .await
        .expect("ImageStatus")
        .expect("busybox image imported");
    let config = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "echo".into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: image.id,
            ..Default::default()
        }),
        command: vec![
            "sh".into(),
            "-c".into(),
            "echo hello from nodelet; exec sleep 3600".into(),
        ],
        log_path: "echo.log".into(),
        labels,
        ..Default::default()
    };
    let id = rt
        .create_container(&sandbox, config, sandbox_config, None)
        .await
        .expect("CreateContainer");
    rt.start_container(&id).await.expect("StartContainer");

    let log = dir.path().join("echo.log");
    let line = eventually(
        "the echoed line in the CRI log",
        Duration::from_secs(30),
        || async {
            let text = std::fs::read_to_string(&log).ok()?;
            text.lines()
                .find(|l| l.ends_with("hello from nodelet"))
                .map(String::from)
        },
    )
    .await;
    let fields: Vec<&str> = line.splitn(4, ' ').collect();
    assert_eq!(&fields[1..3], ["stdout", "F"], "CRI log format: {line}");
    assert!(
        fields[0].contains('T') && fields[0].ends_with('Z'),
        "RFC 3339 time: {line}"
    );

    // A running container's details are asked once and then reused while the listing shows it
    // running; once it exits, the pod's view shows the exit, not the remembered run.
    for _ in 0..2 {
        let pod = rt
            .pod_runtime(&PodUid(uid.clone()))
            .await
            .expect("pod runtime");
        assert_eq!(pod.containers.len(), 1);
        assert_eq!(pod.containers[0].state, ContainerState::Running);
        assert!(pod.containers[0].started_at > 0);
        assert_eq!(pod.containers[0].finished_at, 0);
    }
    assert!(
        !rt.sandbox_ips(&sandbox)
            .await
            .expect("sandbox IPs")
            .is_empty(),
        "a sandbox on the pod network has an IP"
    );
    rt.stop_container(&id, 0).await.expect("StopContainer");
    let pod = rt
        .pod_runtime(&PodUid(uid.clone()))
        .await
        .expect("pod runtime");
    let exited = &pod.containers[0];
    assert_eq!(exited.state, ContainerState::Exited);
    assert!(exited.finished_at >= exited.started_at && exited.finished_at > 0);
    assert_eq!(exited.exit_code, 137, "killed by SIGKILL");
    let listed = rt
        .list_containers(Some((LABEL_POD_UID, &uid)))
        .await
        .expect("ListContainers");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, ContainerState::Exited);

    rt.remove_container(&id).await.expect("RemoveContainer");
    rt.stop_pod_sandbox(&sandbox).await.expect("StopPodSandbox");
    rt.remove_pod_sandbox(&sandbox)
        .await
        .expect("RemovePodSandbox");
    let err = rt
        .container_status(&id)
        .await
        .expect_err("removed container");
    assert!(err.is_not_found(), "{err}");
    assert!(
        err.to_string().contains("ContainerStatus"),
        "errors name the call: {err}"
    );
    assert!(
        rt.list_sandboxes(Some((LABEL_POD_UID, &uid)))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn an_unreachable_runtime_gives_an_error_naming_the_call() {
    let missing = testbed_dir().join("tests/no-such.sock");
    let rt = nodelet::runtime::RuntimeClient::new(&missing, &missing, Duration::from_secs(2));
    let err = rt.version().await.expect_err("no runtime there");
    assert!(err.to_string().contains("Version"), "{err}");
}

/// containerd 2.x answers the CRI's RuntimeConfig and pins its sandbox image; 1.6 does neither,
/// and tells both in its verbose status instead. nodelet reads whichever the runtime offers.
#[tokio::test]
async fn the_test_beds_runtime_reports_its_cgroup_driver_and_sandbox_image() {
    let rt = crate::bed::runtime().await;
    let config = rt
        .runtime_config()
        .await
        .expect("Status answers")
        .expect("containerd reports its config");
    let reported = rt.reported_cgroup_driver().await.expect("RuntimeConfig");
    let pause = rt
        .list_images()
        .await
        .expect("ListImages")
        .into_iter()
        .find(|i| i.repo_tags.iter().any(|t| t == "localhost/pause:local"))
        .expect("the test bed's pause image");
    if crate::bed::containerd2() {
        assert_eq!(
            reported,
            Some(nodelet::types::CgroupDriver::Cgroupfs),
            "the test bed runs runc with SystemdCgroup = false, as nodelet's default driver"
        );
        assert!(pause.pinned, "containerd 2.x pins its sandbox image");
    } else {
        assert_eq!(reported, None, "containerd 1.6 predates RuntimeConfig");
        assert_eq!(
            nodelet::runtime::configured_cgroup_driver(&config),
            Some(nodelet::types::CgroupDriver::Cgroupfs),
            "the test bed runs runc with SystemdCgroup = false, as nodelet's default driver"
        );
        assert_eq!(
            nodelet::runtime::configured_sandbox_image(&config).as_deref(),
            Some("localhost/pause:local")
        );
    }
}

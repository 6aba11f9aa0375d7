//! Promises that keep control planes alive: adoption across restarts (even kill -9), pods left
//! running on shutdown, orphans collected and strangers left alone, hostile manifests survived.

use std::collections::HashMap;
use std::process::{Child, Stdio};
use std::time::Duration;

use nodelet::runtime::{
    ANNOTATION_CONTAINER_HASH, ANNOTATION_NODE_NAME, ContainerState, LABEL_CONTAINER_DIGEST,
    LABEL_POD_UID, cri,
};

use crate::bed::{
    BUSYBOX, FOREVER, Node, OtherRuntime, clean_node, eventually, free_port, node_sandboxes,
    nodelet_command, pod_yaml, runtime, test_dir,
};

/// nodelet as a child process with its own dirs and node name.
struct Process {
    dir: tempfile::TempDir,
    node: String,
    child: Option<Child>,
}

impl Process {
    fn new(test: &str) -> Process {
        Process {
            dir: test_dir(test),
            node: format!("t-{test}"),
            child: None,
        }
    }

    fn manifest(&self, name: &str, content: &str) {
        let tmp = self.dir.path().join(format!("manifests/.{name}.tmp"));
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(tmp, self.dir.path().join("manifests").join(name)).unwrap();
    }

    fn start(&mut self) {
        self.start_with(&[]);
    }

    /// Starts nodelet with `extra` flags; its log goes to `nodelet.log` in the test dir.
    fn start_with(&mut self, extra: &[&str]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("nodelet.log"))
            .expect("open the agent's log");
        let child = nodelet_command(self.dir.path(), &self.node)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start nodelet");
        self.child = Some(child);
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nodelet.log")).unwrap_or_default()
    }

    fn signal(&mut self, signal: i32) {
        let pid = self.child.as_ref().expect("running").id() as i32;
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(pid, signal) };
    }

    async fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + within;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "nodelet did not exit within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Running containers of this node's pods, by pod name: (container ID, start time).
    async fn running(&self) -> HashMap<String, (String, i64)> {
        let rt = runtime().await;
        let mut out = HashMap::new();
        for sb in node_sandboxes(&rt, &self.node).await {
            let Ok(uid_runtime) = rt.pod_runtime(&sb.uid).await else {
                continue;
            };
            for c in uid_runtime
                .containers
                .iter()
                .filter(|c| c.state == ContainerState::Running)
            {
                out.insert(sb.name.clone(), (c.id.clone(), c.started_at));
            }
        }
        out
    }

    async fn finish(mut self) {
        if self.child.is_some() {
            self.signal(libc::SIGKILL);
            self.wait_exit(Duration::from_secs(10)).await;
        }
        clean_node(&self.node, self.dir.path()).await;
    }
}

/// A failed test leaves no agent running.
impl Drop for Process {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test]
async fn kill_9_and_restart_adopts_running_pods_without_restarting_them() {
    let mut p = Process::new("kill9");
    for i in 0..5 {
        p.manifest(
            &format!("p{i}.yaml"),
            &pod_yaml(&format!("p{i}"), &[("c", FOREVER)], ""),
        );
    }
    p.start();
    let before = eventually("five running pods", Duration::from_secs(60), || async {
        let r = p.running().await;
        (r.len() == 5).then_some(r)
    })
    .await;
    p.signal(libc::SIGKILL);
    p.wait_exit(Duration::from_secs(10)).await;
    p.start();
    // A pod added after the restart runs only once nodelet is up and has synced the others.
    p.manifest("late.yaml", &pod_yaml("late", &[("c", FOREVER)], ""));
    let after = eventually(
        "the late pod to run too",
        Duration::from_secs(60),
        || async {
            let r = p.running().await;
            (r.len() == 6).then_some(r)
        },
    )
    .await;
    for (pod, (id, started)) in &before {
        assert_eq!(
            after.get(pod),
            Some(&(id.clone(), *started)),
            "{pod} was restarted"
        );
    }
    p.finish().await;
}

/// An upgrade restarts nothing: a container made by a nodelet that recorded no spec digest (or
/// one of a version this nodelet does not compute) and a container hash this one would not
/// compute is adopted as it runs.
#[tokio::test]
async fn a_container_from_another_nodelet_version_is_adopted_not_restarted() {
    let mut p = Process::new("olddigest");
    // Whatever an earlier, failed run of this test left of its node goes first.
    clean_node(&p.node, p.dir.path()).await;
    let pod = format!("old-{}", p.node);
    // Ready once /tmp/ready exists: the test makes it in the container it expects nodelet to keep.
    p.manifest(
        "old.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: old
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, "trap 'exit 0' TERM; {FOREVER}"]
    readinessProbe:
      exec:
        command: [test, -f, /tmp/ready]
      periodSeconds: 1
"#
        ),
    );
    p.start();
    let rt = runtime().await;
    let (original, _) = eventually("the pod running", Duration::from_secs(60), || async {
        p.running().await.remove(&pod)
    })
    .await;
    p.signal(libc::SIGKILL);
    p.wait_exit(Duration::from_secs(10)).await;

    // The same container as an older nodelet would have made it.
    let status = rt
        .container_status(&original)
        .await
        .expect("ContainerStatus");
    let sandbox = rt
        .list_containers(None)
        .await
        .expect("list containers")
        .into_iter()
        .find(|c| c.id == original)
        .expect("the container")
        .sandbox_id;
    let mut labels = status.labels.clone();
    assert!(
        labels.remove(LABEL_CONTAINER_DIGEST).is_some(),
        "{labels:?}"
    );
    let mut annotations = status.annotations.clone();
    annotations.insert(ANNOTATION_CONTAINER_HASH.into(), "0123456789abcdef".into());
    let log = std::path::PathBuf::from(&status.log_path);
    let log_directory = log
        .parent()
        .and_then(|container_dir| container_dir.parent())
        .expect("the pod's log directory");
    rt.stop_container(&original, 0).await.expect("stop it");
    rt.remove_container(&original).await.expect("remove it");
    // As nodelet sets them: the pod's network and IPC, a PID namespace of its own.
    let namespaces = cri::NamespaceOption {
        network: cri::NamespaceMode::Pod as i32,
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    };
    let config = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "c".into(),
            attempt: 0,
        }),
        // By the pod's own reference: the one the runtime reports may name another test's copy
        // of the same image, which that test removes.
        image: Some(cri::ImageSpec {
            image: BUSYBOX.into(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), FOREVER.into()],
        labels,
        annotations,
        log_path: "c/0.log".into(),
        linux: Some(cri::LinuxContainerConfig {
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(namespaces.clone()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sb = rt
        .list_sandboxes(None)
        .await
        .expect("list sandboxes")
        .into_iter()
        .find(|s| s.id == sandbox)
        .expect("its sandbox");
    let sandbox_config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: sb.name.clone(),
            uid: sb.uid.to_string(),
            namespace: sb.namespace.clone(),
            attempt: sb.attempt,
        }),
        log_directory: log_directory.display().to_string(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let older = rt
        .create_container(&sandbox, config, sandbox_config, None)
        .await
        .expect("CreateContainer");
    rt.start_container(&older).await.expect("StartContainer");

    // nodelet's first sync of the pod would replace it; a later one reports it Ready.
    p.start();
    let cli = |args: Vec<std::ffi::OsString>| async move {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_nodelet"))
            .args(args)
            .output()
            .await
            .expect("the CLI runs")
    };
    let root = p.dir.path().join("root");
    let status_of = || async {
        let args = vec![
            "--root-dir".into(),
            root.clone().into_os_string(),
            "get".into(),
            "pod".into(),
            pod.clone().into(),
            "-o".into(),
            "json".into(),
        ];
        let out = cli(args).await;
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let c = &status["status"]["containerStatuses"][0];
        c["state"]["running"].is_object().then(|| c.clone())
    };
    eventually(
        "nodelet's status of the pod",
        Duration::from_secs(60),
        status_of,
    )
    .await;
    let out = rt
        .exec_sync(
            &older,
            vec!["touch".into(), "/tmp/ready".into()],
            Duration::from_secs(10),
        )
        .await
        .expect("the container nodelet found still runs");
    assert_eq!(out.exit_code, 0);
    // The sync that reports it Ready comes after the first one.
    let adopted = eventually("the pod Ready", Duration::from_secs(60), || async {
        status_of().await.filter(|c| c["ready"] == true)
    })
    .await;
    assert_eq!(
        adopted["containerID"],
        format!("containerd://{older}").as_str(),
        "the container was replaced: {adopted}"
    );
    assert_eq!(adopted["restartCount"], 0, "{adopted}");
    // A replacement would have begun in the first sync, before the container could turn Ready
    // (the probe reads the file made after that sync's status), and stopping it takes its grace
    // period: its Killing event would be recorded by now.
    let out = cli(vec![
        "--root-dir".into(),
        root.clone().into_os_string(),
        "events".into(),
    ])
    .await;
    let events = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{events}");
    assert!(
        !events.contains("Killing"),
        "nodelet replaced the container:\n{events}"
    );
    p.finish().await;
}

/// Graceful node shutdown without logind: SIGTERM with a shutdown grace period stops every pod
/// before nodelet exits, critical pods last and only once the others are down, each pod within
/// its stage's time even when its preStop hook hangs; every pod's final status is Failed /
/// Terminated; after a restart the static pods run again.
#[tokio::test]
async fn sigterm_with_a_shutdown_grace_period_stops_pods_by_priority_then_exits() {
    let mut p = Process::new("shutdown");
    clean_node(&p.node, p.dir.path()).await;
    let m = p.dir.path().join("m");
    std::fs::create_dir_all(&m).unwrap();
    let m = m.display();
    let pod = |name: &str, extra: &str, script: &str| {
        format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 60
{extra}  volumes: [{{name: m, hostPath: {{path: {m}}}}}]
  containers:
  - name: c
    image: {BUSYBOX}
    volumeMounts: [{{name: m, mountPath: /m}}]
{script}"
        )
    };
    let traps = |name: &str| {
        format!(
            "    command: [sh, -c, \"trap 'sleep 1; echo {name} >> /m/order; exit 0' TERM; {FOREVER}\"]\n"
        )
    };
    p.manifest("app.yaml", &pod("app", "", &traps("app")));
    p.manifest(
        "critical.yaml",
        &pod(
            "critical",
            "  priorityClassName: system-node-critical\n",
            &traps("critical"),
        ),
    );
    // A preStop hook that never ends: the pod gets its stage's 8 s (not its own 60 s).
    p.manifest(
        "hangs.yaml",
        &pod(
            "hangs",
            "",
            &format!(
                "    lifecycle: {{preStop: {{exec: {{command: [sleep, '600']}}}}}}\n    command: [sh, -c, \"trap '' TERM; {FOREVER}\"]\n"
            ),
        ),
    );
    p.start_with(&[
        "--shutdown-grace-period=12s",
        "--shutdown-grace-period-critical-pods=4s",
    ]);
    eventually("three running pods", Duration::from_secs(60), || async {
        (p.running().await.len() == 3).then_some(())
    })
    .await;
    p.signal(libc::SIGTERM);
    // The 12 s budget, the 2 s a hung preStop's container gets after it, and exit.
    let status = p.wait_exit(Duration::from_secs(30)).await;
    assert!(status.success(), "{status:?}\n{}", p.log());
    let order = std::fs::read_to_string(p.dir.path().join("m/order")).unwrap_or_default();
    assert_eq!(
        order, "app\ncritical\n",
        "critical pods stop last, once the others are down"
    );
    eventually(
        "no container left running",
        Duration::from_secs(10),
        || async { p.running().await.is_empty().then_some(()) },
    )
    .await;
    let log = p.log();
    // Containers that exited 0 on SIGTERM leave their pod Succeeded, as upstream keeps it;
    // the one killed at its deadline leaves it Failed.
    for (name, phase) in [
        ("app", "Succeeded"),
        ("critical", "Succeeded"),
        ("hangs", "Failed"),
    ] {
        let line = log
            .lines()
            .find(|l| l.contains("final pod status") && l.contains(&format!("{name}-{}", p.node)))
            .unwrap_or_else(|| panic!("no final status for {name}:\n{log}"));
        assert!(line.contains(&format!("phase=\"{phase}\"")), "{line}");
        assert!(line.contains("reason=\"Terminated\""), "{line}");
    }
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(p.dir.path().join("root/graceful_node_shutdown_state")).unwrap(),
    )
    .unwrap();
    assert!(
        record["startTime"].is_string() && record["endTime"].is_string(),
        "{record}"
    );
    p.start_with(&["--shutdown-grace-period=12s"]);
    eventually(
        "the static pods to run again after the restart",
        Duration::from_secs(60),
        || async { (p.running().await.len() == 3).then_some(()) },
    )
    .await;
    p.finish().await;
}

/// What an observer of a pod's status sees of its readiness: the pod's Ready condition, and its
/// container's ready, started, ID and restart count; none while the agent does not know the pod.
async fn observed(root: &std::path::Path, pod: &str) -> Option<serde_json::Value> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .arg("--root-dir")
        .arg(root)
        .args(["get", "pod", pod, "-o", "json"])
        .output()
        .await
        .expect("the CLI runs");
    let pod: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let status = &pod["status"];
    let ready = status["conditions"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["type"] == "Ready"))
        .map_or(serde_json::Value::Null, |c| c["status"].clone());
    let c = &status["containerStatuses"][0];
    Some(serde_json::json!({
        "Ready": ready,
        "ready": c["ready"],
        "started": c["started"],
        "containerID": c["containerID"],
        "restartCount": c["restartCount"],
    }))
}

/// A restart is invisible: after a clean restart and after kill -9, for two probe periods, a
/// Ready pod stays Ready and Started and a NotReady one stays NotReady, with the same
/// containers and restart counts, although their probes take seconds to answer.
#[tokio::test]
async fn a_restart_changes_no_pods_readiness_in_either_direction() {
    let mut p = Process::new("invisible");
    clean_node(&p.node, p.dir.path()).await;
    let probed = |name: &str, probes: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, "trap 'exit 0' TERM; {FOREVER}"]
{probes}"#
        )
    };
    // Each probe takes two seconds: an agent that waited for them after a restart would show
    // the first pod not Started and NotReady for at least that long.
    p.manifest(
        "up.yaml",
        &probed(
            "up",
            r#"    startupProbe:
      exec:
        command: [sleep, "2"]
      periodSeconds: 3
      timeoutSeconds: 10
    readinessProbe:
      exec:
        command: [sleep, "2"]
      periodSeconds: 3
      timeoutSeconds: 10
"#,
        ),
    );
    p.manifest(
        "down.yaml",
        &probed(
            "down",
            r#"    readinessProbe:
      exec:
        command: [test, -f, /tmp/ready]
      periodSeconds: 3
"#,
        ),
    );
    p.start();
    let root = p.dir.path().join("root");
    let (up, down) = (format!("up-{}", p.node), format!("down-{}", p.node));
    let expected = eventually(
        "one pod Ready, the other running but NotReady",
        Duration::from_secs(90),
        || async {
            let up = observed(&root, &up).await?;
            let down = observed(&root, &down).await?;
            (up["Ready"] == "True"
                && up["started"] == true
                && down["Ready"] == "False"
                && down["started"] == true
                && down["containerID"].is_string())
            .then_some((up, down))
        },
    )
    .await;
    for signal in [libc::SIGTERM, libc::SIGKILL] {
        p.signal(signal);
        p.wait_exit(Duration::from_secs(30)).await;
        p.start();
        // From the restarted agent's first answer, over two probe periods.
        eventually(
            "the restarted agent's answer",
            Duration::from_secs(60),
            || observed(&root, &up),
        )
        .await;
        let until = std::time::Instant::now() + Duration::from_secs(6);
        let mut seen = 0;
        while std::time::Instant::now() < until {
            for (pod, want) in [(&up, &expected.0), (&down, &expected.1)] {
                let Some(now) = observed(&root, pod).await else {
                    continue;
                };
                assert_eq!(&now, want, "{pod} after a restart by signal {signal}");
                seen += 1;
            }
        }
        assert!(seen > 10, "only {seen} observations");
    }
    p.finish().await;
}

#[tokio::test]
async fn sigterm_stops_nodelet_quickly_and_leaves_pods_running() {
    let mut p = Process::new("sigterm");
    clean_node(&p.node, p.dir.path()).await;
    p.manifest("a.yaml", &pod_yaml("a", &[("c", FOREVER)], ""));
    p.start_with(&["--oom-score-adj=500"]);
    let before = eventually("the pod to run", Duration::from_secs(60), || async {
        let r = p.running().await;
        (r.len() == 1).then_some(r)
    })
    .await;
    // The agent sets its own oom_score_adj (--oom-score-adj; -999 by default, which needs
    // CAP_SYS_RESOURCE, which these test machines do not grant: the test raises it instead).
    let pid = p.child.as_ref().expect("running").id();
    let adj = format!("/proc/{pid}/oom_score_adj");
    eventually("the agent's oom_score_adj", Duration::from_secs(10), || {
        let now = std::fs::read_to_string(&adj).unwrap_or_default();
        std::future::ready((now.trim() == "500").then_some(()))
    })
    .await;
    p.signal(libc::SIGTERM);
    let status = p.wait_exit(Duration::from_secs(5)).await;
    assert!(status.success(), "{status:?}");
    assert_eq!(
        p.running().await,
        before,
        "pods keep running after nodelet stops"
    );
    p.finish().await;
}

pub async fn make_sandbox(node: &str, name: &str, with_labels: bool) -> String {
    make_sandbox_with_uid(
        node,
        name,
        &format!("{name}-{}", std::process::id()),
        with_labels,
    )
    .await
}

/// A sandbox as another kubelet-like agent would have left it (`with_labels`), for `uid`.
pub async fn make_sandbox_with_uid(node: &str, name: &str, uid: &str, with_labels: bool) -> String {
    let rt = runtime().await;
    let uid = uid.to_string();
    let labels = if with_labels {
        [
            ("io.kubernetes.pod.name".to_string(), name.to_string()),
            (
                "io.kubernetes.pod.namespace".to_string(),
                "default".to_string(),
            ),
            (LABEL_POD_UID.to_string(), uid.clone()),
        ]
        .into()
    } else {
        HashMap::new()
    };
    let config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid,
            namespace: "default".into(),
            attempt: 0,
        }),
        labels,
        annotations: [
            (ANNOTATION_NODE_NAME.to_string(), node.to_string()),
            (
                "kubernetes.io/config.source".to_string(),
                "file".to_string(),
            ),
        ]
        .into(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    rt.run_pod_sandbox(config, String::new())
        .await
        .expect("RunPodSandbox")
}

#[tokio::test]
async fn orphans_with_pod_labels_are_collected_and_strangers_left_alone() {
    let node = Node::start("orphans", &[]).await;
    let orphan = make_sandbox(&node.name, "orphan", true).await;
    let stranger = make_sandbox(&node.name, "stranger", false).await;
    node.write_manifest("real.yaml", &pod_yaml("real", &[("c", FOREVER)], ""));
    node.wait_running("real", 1).await;
    eventually(
        "the orphan to be removed",
        Duration::from_secs(30),
        || async {
            node.runtime
                .pod_sandbox_status(&orphan)
                .await
                .is_err()
                .then_some(())
        },
    )
    .await;
    assert!(
        node.runtime.pod_sandbox_status(&stranger).await.is_ok(),
        "a sandbox without pod labels is never touched"
    );
    let _ = node.runtime.stop_pod_sandbox(&stranger).await;
    let _ = node.runtime.remove_pod_sandbox(&stranger).await;
    // A pod directory (with a volume still mounted) and a log directory of a pod the node no
    // longer has are removed; the running pod's, and those of no pod, are kept. The orphan is
    // made beside the pods and moved in whole, so no sweep sees it half made.
    let ghost = "0f0e0d0c-0b0a-4909-8807-060504030201";
    let staged = node.path(&format!("root/staging/{ghost}"));
    let volume = staged.join("volumes/kubernetes.io~empty-dir/v");
    std::fs::create_dir_all(&volume).expect("the orphan's volume");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&volume)
        .status()
        .expect("mount runs");
    assert!(mounted.success(), "the orphan's volume is mounted");
    let orphan_dir = node.path(&format!("root/pods/{ghost}"));
    std::fs::rename(&staged, &orphan_dir).expect("the orphan moved in");
    let ghost_logs = node.pod_logs().join(format!("default_ghost_{ghost}"));
    std::fs::create_dir_all(ghost_logs.join("c")).expect("the orphan's logs");
    let no_pods = ["notes", "default_x_notauid_x"].map(|d| node.pod_logs().join(d));
    for d in &no_pods {
        std::fs::create_dir_all(d).expect("a directory of no pod");
    }
    eventually(
        "the orphan's directories to be removed",
        Duration::from_secs(30),
        || async { (!orphan_dir.exists() && !ghost_logs.exists()).then_some(()) },
    )
    .await;
    let (sandbox, _) = node.wait_running("real", 1).await;
    assert!(node.path(&format!("root/pods/{}", sandbox.uid.0)).is_dir());
    let real_logs = format!("default_{}_{}", node.pod_name("real"), sandbox.uid.0);
    assert!(node.pod_logs().join(real_logs).is_dir());
    assert!(no_pods.iter().all(|d| d.is_dir()));
    node.finish().await;
}

#[tokio::test]
async fn hostile_manifests_break_nothing() {
    // 500 manifests arrive at once below: the node takes 50 pods, admission refuses the rest.
    let node = Node::start("hostile", &["--max-pods", "50"]).await;
    node.write_manifest("good-a.yaml", &pod_yaml("good-a", &[("c", FOREVER)], ""));
    node.write_manifest("good-b.yaml", &pod_yaml("good-b", &[("c", FOREVER)], ""));
    let (a, _) = node.wait_running("good-a", 1).await;
    let (b, _) = node.wait_running("good-b", 1).await;
    let dir = node.manifests();
    let mut bomb = String::from(
        "apiVersion: v1
kind: Pod
metadata: {name: bomb}
x0: &x0 [a, a, a, a, a, a, a, a, a, a]
",
    );
    for i in 1..10 {
        bomb += &format!(
            "x{i}: &x{i} [{}]\n",
            vec![format!("*x{}", i - 1); 10].join(", ")
        );
    }
    let hostile: Vec<(&str, Vec<u8>)> = vec![
        ("empty.yaml", Vec::new()),
        (
            "junk.yaml",
            (0..4096u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect(),
        ),
        (
            "malformed.yaml",
            b"apiVersion: v1
kind: Pod
metadata: {name: x
  - [
"
            .to_vec(),
        ),
        ("bomb.yaml", bomb.into_bytes()),
        (
            "deep.json",
            format!("{}{}", "[".repeat(200_000), "]".repeat(200_000)).into_bytes(),
        ),
        ("huge.yaml", vec![b'#'; 11 * 1024 * 1024]),
        (
            "kind.yaml",
            b"apiVersion: v1
kind: Service
metadata: {name: svc}
"
            .to_vec(),
        ),
        (
            "noname.yaml",
            pod_yaml("x", &[("c", FOREVER)], "")
                .replace("  name: x\n", "")
                .into_bytes(),
        ),
        (
            "badname.yaml",
            pod_yaml("Not_Valid", &[("c", FOREVER)], "").into_bytes(),
        ),
        (
            "dupes.yaml",
            pod_yaml("dupes", &[("c", FOREVER), ("c", FOREVER)], "").into_bytes(),
        ),
    ];
    for (name, bytes) in &hostile {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    std::fs::create_dir_all(dir.join("directory.yaml")).unwrap();
    std::os::unix::fs::symlink("loop-b.yaml", dir.join("loop-a.yaml")).unwrap();
    std::os::unix::fs::symlink("loop-a.yaml", dir.join("loop-b.yaml")).unwrap();
    // One file rewritten 200 times within a second, ending valid.
    for i in 0..200 {
        let content = if i % 2 == 0 {
            b"garbage: [".to_vec()
        } else {
            pod_yaml("churn", &[("c", FOREVER)], "").into_bytes()
        };
        std::fs::write(dir.join("churn.yaml"), content).unwrap();
    }
    // Many manifests at once.
    for i in 0..500 {
        std::fs::write(
            dir.join(format!("many-{i}.yaml")),
            pod_yaml(
                &format!("many-{i}"),
                &[("c", FOREVER)],
                "  hostNetwork: true\n",
            ),
        )
        .unwrap();
    }
    let ready = || async {
        node.all_sandboxes()
            .await
            .into_iter()
            .filter(|s| s.state == nodelet::runtime::SandboxState::Ready)
            .count()
    };
    eventually(
        "the node to fill up to --max-pods",
        Duration::from_secs(120),
        || async { (ready().await == 50).then_some(()) },
    )
    .await;
    let refused = eventually(
        "the rest to be refused",
        Duration::from_secs(60),
        || async {
            let refused = (0..500)
                .filter(|i| {
                    node.status(&format!("many-{i}"))
                        .is_some_and(|s| s.reason.as_deref() == Some("OutOfpods"))
                })
                .count();
            (refused >= 452).then_some(refused)
        },
    )
    .await;
    // good-a, good-b and 48 of churn and the 500 run; the other 453 are refused.
    assert!(refused <= 453, "{refused} refused");
    assert!(node.agent_alive(), "nodelet survived the corpus");
    let logs = crate::bed::logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("empty.yaml") && l.contains("holds no object")),
        "an empty manifest is reported by name"
    );
    let (a2, _) = node.wait_running("good-a", 1).await;
    let (b2, _) = node.wait_running("good-b", 1).await;
    assert_eq!(
        (a2.id, b2.id),
        (a.id, b.id),
        "the valid pods were never touched"
    );
    assert_eq!(
        ready().await,
        50,
        "only valid manifests made pods, up to --max-pods"
    );
    node.finish().await;
}

#[tokio::test]
async fn pods_come_back_whole_when_containerd_is_killed_and_restarted() {
    let node = Node::start("crirestart", &[]).await;
    node.write_manifest("a.yaml", &pod_yaml("a", &[("c", FOREVER)], ""));
    node.write_manifest("b.yaml", &pod_yaml("b", &[("c", FOREVER)], ""));
    node.write_manifest(
        "h.yaml",
        &pod_yaml("h", &[("c", FOREVER)], "  hostNetwork: true\n"),
    );
    let mut before = Vec::new();
    for name in ["a", "b", "h"] {
        before.push(node.wait_running(name, 1).await);
    }
    let pid_file = crate::bed::testbed_dir().join("containerd.pid");
    let old_pid = std::fs::read_to_string(&pid_file).expect("containerd's pid");
    let restarted = tokio::task::spawn_blocking(|| {
        std::process::Command::new("bash")
            .args(["hack/testbed.sh", "restart"])
            .status()
    })
    .await
    .expect("the task runs")
    .expect("the test bed script runs");
    assert!(restarted.success(), "containerd restarted");
    let new_pid = std::fs::read_to_string(&pid_file).expect("containerd's pid");
    assert_ne!(old_pid, new_pid, "a new containerd runs");
    // Its CRI service takes a moment longer than containerd itself to answer.
    eventually(
        "the CRI service to answer",
        Duration::from_secs(30),
        || async { node.runtime.list_sandboxes(None).await.ok() },
    )
    .await;
    // nodelet rode out the outage and reconciles: the same sandboxes and containers, one each.
    for (name, (sandbox, containers)) in ["a", "b", "h"].iter().zip(&before) {
        let (now, running) = node.wait_running(name, 1).await;
        assert_eq!(now.id, sandbox.id, "{name} kept its sandbox");
        assert_eq!(running[0].id, containers[0].id, "{name} kept its container");
        assert_eq!(running[0].attempt, 0, "{name} was not restarted");
        assert_eq!(
            node.sandboxes(name).await.len(),
            1,
            "{name} has one sandbox"
        );
    }
    assert!(node.agent_alive(), "nodelet kept running");
    node.finish().await;
}

/// A process stopped with SIGSTOP, continued when dropped (also after a failure).
struct Frozen(i32);

impl Frozen {
    fn new(pid: i32) -> Frozen {
        // SAFETY: signals a process of the test's own runtime.
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGSTOP) },
            0,
            "SIGSTOP {pid}"
        );
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// The runtime shim that serves the sandbox `sandbox_id`.
fn shim_of(sandbox_id: &str) -> i32 {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_shim = args
            .first()
            .is_some_and(|a| String::from_utf8_lossy(a).contains("containerd-shim"));
        let serves = args
            .windows(2)
            .any(|w| w[0] == b"-id" && w[1] == sandbox_id.as_bytes());
        if is_shim && serves {
            found.push(pid);
        }
    }
    assert_eq!(
        found.len(),
        1,
        "the shim of sandbox {sandbox_id}: {found:?}"
    );
    found[0]
}

/// One stuck pod never makes the node sick: with one pod's runtime shim frozen, so that the
/// runtime's calls about that pod hang, and that pod deleted (its stop hangs), another pod's
/// container exit shows in its status, a new pod starts, and healthz stays ok; the frozen pod
/// alone is reported, and goes once its shim runs again. On a containerd
/// of its own: a frozen shim also holds up calls about every container, such as stats.
#[tokio::test]
async fn a_frozen_pod_holds_back_no_other_pod() {
    let bed = OtherRuntime::up("frozen", 6).await;
    let port = free_port();
    let healthz = format!("--healthz-port={port}");
    let node = Node::start_on(&bed.endpoint, "frozen", &[healthz.as_str()]).await;
    node.write_manifest("stuck.yaml", &pod_yaml("stuck", &[("c", FOREVER)], ""));
    let steady = "while [ ! -f /tmp/exit ]; do sleep 0.2; done; rm /tmp/exit; exit 3";
    node.write_manifest("steady.yaml", &pod_yaml("steady", &[("c", steady)], ""));
    let (stuck, stuck_containers) = node.wait_running("stuck", 1).await;
    let (_, steady_containers) = node.wait_running("steady", 1).await;

    let frozen = Frozen::new(shim_of(&stuck.id));
    let rt = nodelet::runtime::RuntimeClient::new(
        &bed.endpoint,
        &bed.endpoint,
        Duration::from_secs(120),
    );
    let call = rt.exec_sync(
        &stuck_containers[0].id,
        vec!["true".into()],
        Duration::from_secs(2),
    );
    assert!(
        !matches!(
            tokio::time::timeout(Duration::from_secs(5), call).await,
            Ok(Ok(_))
        ),
        "calls about the frozen pod hang or fail"
    );
    node.remove_manifest("stuck.yaml");
    let removed = tokio::time::Instant::now();

    // Other pods go on: a container's exit shows, a new pod starts, healthz says ok.
    node.touch(&steady_containers[0].id, "/tmp/exit").await;
    let restarted = async {
        node.wait_status("steady", "restarted after its exit", |st| {
            st.container_statuses
                .iter()
                .flatten()
                .any(|c| c.restart_count >= 1)
        })
        .await
    };
    tokio::time::timeout(Duration::from_secs(10), restarted)
        .await
        .expect("the other pod's exit shows within 10 s");
    node.write_manifest("fresh.yaml", &pod_yaml("fresh", &[("c", FOREVER)], ""));
    tokio::time::timeout(Duration::from_secs(30), node.wait_running("fresh", 1))
        .await
        .expect("a new pod starts within 30 s");
    let answer = crate::healthz::get(port, "/healthz").await;
    assert_eq!(answer, Some((200, "ok".to_string())), "healthz");

    // The frozen pod alone is reported, with the runtime's failure (containerd gives up on a
    // frozen shim within seconds) or, for a call that hangs, as stale.
    let reported = |line: &str| line.contains("FailedKillPod") || line.contains("RuntimeStalled");
    let stuck_name = node.pod_name("stuck");
    eventually(
        "the frozen pod reported",
        Duration::from_secs(60),
        || async {
            let out = node.cli(&["events"]).output().await.ok()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.lines()
                .any(|l| reported(l) && l.contains(&stuck_name))
                .then_some(())
        },
    )
    .await;
    // Its termination is a deadline: within its grace period and 10 s it has ended (Failed)
    // although the runtime never confirmed its stop.
    let ended = node.wait_status("stuck", "ended, its stop unconfirmed", |st| {
        st.phase.as_deref() == Some("Failed") && st.reason.as_deref() == Some("StopUnconfirmed")
    });
    let left = (removed + Duration::from_secs(5 + 10 + 5))
        .saturating_duration_since(tokio::time::Instant::now());
    tokio::time::timeout(left, ended)
        .await
        .expect("the frozen pod ended within its grace period and 10 s");
    drop(frozen);
    node.wait_gone(&stuck.uid, Duration::from_secs(60)).await;
    let out = node.cli(&["events"]).output().await.expect("the CLI runs");
    let events = String::from_utf8_lossy(&out.stdout);
    assert!(
        !events
            .lines()
            .any(|l| reported(l) && !l.contains(&stuck_name)),
        "only the frozen pod is reported:\n{events}"
    );
    node.finish().await;
    bed.down().await;
}

/// The agent protects itself through a memory storm: it moves into a cgroup of its own
/// (--kubelet-cgroups), beside the pods' cgroup, whose limit is the node's allocatable memory
/// (500 MiB here, the rest reserved); three pods that each grab 200 MiB in a loop are OOM-killed
/// again and again inside it, and healthz answers every time it is asked meanwhile.
#[tokio::test]
async fn the_agent_keeps_a_cgroup_of_its_own_and_serves_healthz_through_a_memory_storm() {
    let mut p = Process::new("storm");
    clean_node(&p.node, p.dir.path()).await;
    let total_mib: u64 = std::fs::read_to_string("/proc/meminfo")
        .expect("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("MemTotal")
        / 1024;
    // Allocatable: the capacity less the reserves and the 100Mi eviction threshold.
    let reserved = format!("memory={}Mi", total_mib - 600);
    let own = format!("{}/agent", crate::bed::cgroup_root(&p.node));
    let port = free_port();
    let grab = "trap 'exit 0' TERM; while true; do x=$(head -c 200m /dev/zero | tr '\\0' x); sleep 1; done";
    for name in ["grab-a", "grab-b", "grab-c"] {
        p.manifest(&format!("{name}.yaml"), &pod_yaml(name, &[("c", grab)], ""));
    }
    p.start_with(&[
        "--kubelet-cgroups",
        &own,
        "--system-reserved",
        &reserved,
        &format!("--healthz-port={port}"),
    ]);
    let pid = p.child.as_ref().expect("running").id();
    let memory_cgroup = || {
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        cgroups
            .lines()
            .find(|l| {
                l.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|c| c == "memory"))
            })
            .and_then(|l| l.rsplit(':').next())
            .map(str::to_string)
    };
    eventually(
        "the agent in its own cgroup",
        Duration::from_secs(10),
        || std::future::ready((memory_cgroup().as_deref() == Some(own.as_str())).then_some(())),
    )
    .await;
    let healthz = || async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        stream
            .write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.ok()?;
        let status = answer.lines().next().unwrap_or_default();
        status.contains(" 200 ").then_some(())
    };
    eventually("healthz to answer", Duration::from_secs(60), healthz).await;
    // The storm: until the pods' containers were OOM-killed and restarted three times, each
    // healthz asked meanwhile must answer within 2 s.
    let rt = runtime().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut asked = 0;
    loop {
        let answered = tokio::time::timeout(Duration::from_secs(2), healthz()).await;
        assert!(
            matches!(answered, Ok(Some(()))),
            "healthz did not answer during the storm (after {asked} answers)\n{}",
            p.log()
        );
        asked += 1;
        let (mut oom_killed, mut restarts) = (false, 0);
        for sb in node_sandboxes(&rt, &p.node).await {
            if let Ok(pod) = rt.pod_runtime(&sb.uid).await {
                oom_killed |= pod.containers.iter().any(|c| c.reason == "OOMKilled");
                restarts += pod.containers.iter().map(|c| c.attempt).max().unwrap_or(0);
            }
        }
        if oom_killed && restarts >= 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "OOM-killed: {oom_killed}, restarts: {restarts} in 2 minutes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    p.finish().await;
}

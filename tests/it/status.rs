//! Pod status computed the upstream way, observed through the agent's status store.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};

use crate::bed::{BUSYBOX, FOREVER, Node, eventually, pod_yaml};

fn app(status: &PodStatus, i: usize) -> ContainerStatus {
    status
        .container_statuses
        .as_ref()
        .expect("container statuses")[i]
        .clone()
}

fn condition(status: &PodStatus, kind: &str) -> String {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

fn phase(status: &PodStatus) -> &str {
    status.phase.as_deref().unwrap_or("")
}

fn terminated_reason(c: &ContainerStatus) -> Option<(String, i32)> {
    let t = c.state.as_ref()?.terminated.as_ref()?;
    Some((t.reason.clone().unwrap_or_default(), t.exit_code))
}

fn waiting_reason(c: &ContainerStatus) -> Option<String> {
    c.state.as_ref()?.waiting.as_ref()?.reason.clone()
}

#[tokio::test]
async fn phases_follow_the_restart_policy() {
    let node = Node::start("phases", &[]).await;
    let marker = node.path("marker");
    std::fs::create_dir_all(&marker).unwrap();
    node.write_manifest(
        "done.yaml",
        &pod_yaml("done", &[("c", "echo ok")], "  restartPolicy: Never\n"),
    );
    node.write_manifest(
        "fails.yaml",
        &pod_yaml("fails", &[("c", "exit 3")], "  restartPolicy: Never\n"),
    );
    let retry = pod_yaml(
        "retry",
        &[(
            "c",
            "if [ -f /m/once ]; then exit 0; fi; touch /m/once; exit 1",
        )],
        &format!(
            "  restartPolicy: OnFailure\n  volumes: [{{name: m, hostPath: {{path: {}}}}}]\n",
            marker.display()
        ),
    )
    .replacen(
        "    command:",
        "    volumeMounts: [{name: m, mountPath: /m}]\n    command:",
        1,
    );
    node.write_manifest("retry.yaml", &retry);
    node.write_manifest("long.yaml", &pod_yaml("long", &[("c", FOREVER)], ""));

    let done = node
        .wait_status("done", "Succeeded", |s| phase(s) == "Succeeded")
        .await;
    assert_eq!(
        terminated_reason(&app(&done, 0)),
        Some(("Completed".into(), 0))
    );
    assert_eq!(condition(&done, "Ready"), "False");
    let fails = node
        .wait_status("fails", "Failed", |s| phase(s) == "Failed")
        .await;
    assert_eq!(
        terminated_reason(&app(&fails, 0)),
        Some(("Error".into(), 3))
    );
    let retry = node
        .wait_status("retry", "Succeeded", |s| phase(s) == "Succeeded")
        .await;
    assert_eq!(app(&retry, 0).restart_count, 1);
    let last = app(&retry, 0).last_state.unwrap().terminated.unwrap();
    assert_eq!(last.exit_code, 1);

    let long = node
        .wait_status("long", "Running and Ready", |s| {
            phase(s) == "Running" && condition(s, "Ready") == "True"
        })
        .await;
    let c = app(&long, 0);
    assert!(c.ready && c.started == Some(true));
    assert!(
        c.container_id
            .as_deref()
            .unwrap_or("")
            .starts_with("containerd://")
    );
    assert!(!c.image_id.is_empty());
    assert_eq!(c.image, BUSYBOX);
    assert!(c.state.unwrap().running.unwrap().started_at.is_some());
    assert!(long.pod_ip.is_some(), "{long:?}");
    assert_eq!(long.qos_class.as_deref(), Some("BestEffort"));
    for kind in [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "PodScheduled",
    ] {
        assert_eq!(condition(&long, kind), "True", "{kind}");
    }
    assert!(long.start_time.is_some());
    node.finish().await;
}

#[tokio::test]
async fn init_containers_run_in_order_and_report_their_status() {
    let node = Node::start("init", &[]).await;
    let yaml = format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: init}}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{{name: w, emptyDir: {{}}}}]
  initContainers:
  - {{name: one, image: {BUSYBOX}, command: [sh, -c, 'echo one > /w/seq'], volumeMounts: [{{name: w, mountPath: /w}}]}}
  - {{name: two, image: {BUSYBOX}, command: [sh, -c, 'echo two >> /w/seq'], volumeMounts: [{{name: w, mountPath: /w}}]}}
  containers:
  - {{name: app, image: {BUSYBOX}, command: [sh, -c, \"tr '\\\\n' ' ' < /w/seq; echo; trap 'exit 0' TERM; {FOREVER}\"], volumeMounts: [{{name: w, mountPath: /w}}]}}
"
    );
    node.write_manifest("init.yaml", &yaml);
    node.wait_log("init", "app", "one two").await;
    let st = node
        .wait_status("init", "Running", |s| phase(s) == "Running")
        .await;
    let inits = st.init_container_statuses.clone().expect("init statuses");
    assert_eq!(inits.len(), 2);
    for c in &inits {
        assert_eq!(
            terminated_reason(c),
            Some(("Completed".into(), 0)),
            "{}",
            c.name
        );
    }
    assert_eq!(condition(&st, "Initialized"), "True");

    node.write_manifest(
        "bad-init.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: bad-init}}
spec:
  restartPolicy: Never
  initContainers:
  - {{name: fail, image: {BUSYBOX}, command: [sh, -c, 'exit 1']}}
  containers:
  - {{name: app, image: {BUSYBOX}, command: [sh, -c, 'echo never']}}
"
        ),
    );
    let st = node
        .wait_status("bad-init", "Failed", |s| phase(s) == "Failed")
        .await;
    assert_eq!(
        waiting_reason(&app(&st, 0)).as_deref(),
        Some("PodInitializing")
    );
    assert_eq!(condition(&st, "Initialized"), "False");
    node.finish().await;
}

#[tokio::test]
async fn an_oom_killed_container_reports_oom_killed() {
    let node = Node::start("oom", &[]).await;
    let yaml = pod_yaml(
        "oom",
        &[("c", "tail /dev/zero")],
        "  restartPolicy: Never\n",
    )
    .replacen(
        "    command:",
        "    resources: {limits: {memory: 16Mi}}\n    command:",
        1,
    );
    node.write_manifest("oom.yaml", &yaml);
    let st = node
        .wait_status("oom", "Failed", |s| phase(s) == "Failed")
        .await;
    assert_eq!(
        terminated_reason(&app(&st, 0)),
        Some(("OOMKilled".into(), 137))
    );
    assert_eq!(st.qos_class.as_deref(), Some("Burstable"));
    node.finish().await;
}

#[tokio::test]
async fn a_missing_image_with_pull_policy_never_waits_with_err_image_never_pull() {
    let node = Node::start("neverpull", &[]).await;
    node.write_manifest(
        "np.yaml",
        "apiVersion: v1
kind: Pod
metadata: {name: np}
spec:
  containers:
  - {name: c, image: 'localhost/not-here:1', imagePullPolicy: Never}
",
    );
    let st = node
        .wait_status("np", "ErrImageNeverPull", |s| {
            s.container_statuses
                .as_ref()
                .and_then(|c| waiting_reason(&c[0]))
                .as_deref()
                == Some("ErrImageNeverPull")
        })
        .await;
    assert_eq!(phase(&st), "Pending");
    let msg = app(&st, 0)
        .state
        .unwrap()
        .waiting
        .unwrap()
        .message
        .unwrap_or_default();
    assert!(msg.contains("localhost/not-here:1"), "{msg}");
    node.finish().await;
}

#[tokio::test]
async fn a_crashing_container_is_restarted_on_its_lifecycle_event_then_backs_off() {
    // A 10 minute resync: only the PLEG's event can bring the restart.
    let node = Node::start("crash", &["--sync-frequency", "10m"]).await;
    node.write_manifest(
        "crash.yaml",
        &pod_yaml("crash", &[("c", "echo ran; exit 1")], ""),
    );
    let st = node
        .wait_status("crash", "CrashLoopBackOff after one restart", |s| {
            s.container_statuses.as_ref().is_some_and(|c| {
                c[0].restart_count >= 1
                    && waiting_reason(&c[0]).as_deref() == Some("CrashLoopBackOff")
            })
        })
        .await;
    let c = app(&st, 0);
    assert_eq!(
        c.restart_count, 1,
        "the second restart waits out the 10 s backoff"
    );
    assert_eq!(c.last_state.unwrap().terminated.unwrap().exit_code, 1);
    assert_eq!(phase(&st), "Running");
    node.finish().await;
}

#[tokio::test]
async fn status_survives_a_restart_of_nodelet() {
    let mut node = Node::start("survive", &[]).await;
    let marker = node.path("marker");
    std::fs::create_dir_all(&marker).unwrap();
    let yaml = pod_yaml(
        "survive",
        &[(
            "c",
            &format!("if [ ! -f /m/once ]; then touch /m/once; exit 2; fi; {FOREVER}"),
        )],
        &format!(
            "  volumes: [{{name: m, hostPath: {{path: {}}}}}]\n",
            marker.display()
        ),
    )
    .replacen(
        "    command:",
        "    volumeMounts: [{name: m, mountPath: /m}]\n    command:",
        1,
    );
    node.write_manifest("survive.yaml", &yaml);
    let before = node
        .wait_status("survive", "running after one restart", |s| {
            s.container_statuses
                .as_ref()
                .is_some_and(|c| c[0].restart_count == 1 && c[0].ready)
        })
        .await;
    node.stop_agent().await;
    node.restart(&[]).await;
    let after = node
        .wait_status("survive", "running after one restart", |s| {
            s.container_statuses
                .as_ref()
                .is_some_and(|c| c[0].restart_count == 1 && c[0].ready)
        })
        .await;
    let (b, a) = (app(&before, 0), app(&after, 0));
    assert_eq!(
        a.container_id, b.container_id,
        "the running container was adopted"
    );
    assert_eq!(a.state, b.state, "same start time");
    assert_eq!(a.last_state, b.last_state, "same last state");
    assert_eq!(a.last_state.unwrap().terminated.unwrap().exit_code, 2);
    node.finish().await;
}

#[tokio::test]
async fn a_system_oom_kill_in_the_kernel_log_is_a_node_event() {
    let node = Node::start("sysoom", &[]).await;
    // A machine-wide OOM kill, as the kernel reports it, written to the kernel's log: a real
    // one would take the shared machine's memory from everything else on it.
    let pid = std::process::id();
    let victim = format!("nodelet-test-{pid}");
    let report = [
        format!(
            "{victim} invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0"
        ),
        format!(
            "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/nodelet-test,task={victim},pid={pid},uid=0"
        ),
        format!(
            "Out of memory: Killed process {pid} ({victim}) total-vm:0kB, anon-rss:0kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:0kB oom_score_adj:0"
        ),
    ];
    let want = format!("System OOM encountered, victim process: {victim}, pid: {pid}");
    // The watcher reads only what the kernel logs after it opened the log (nodelet runs in
    // this process).
    eventually(
        "the OOM watcher to open the kernel log",
        Duration::from_secs(30),
        || async {
            std::fs::read_dir("/proc/self/fd")
                .expect("/proc/self/fd")
                .flatten()
                .any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|l| l == std::path::Path::new("/dev/kmsg"))
                })
                .then_some(())
        },
    )
    .await;
    let mut kmsg = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .expect("/dev/kmsg");
    for line in &report {
        // One write is one record of the kernel's log.
        std::io::Write::write_all(&mut kmsg, line.as_bytes()).expect("write /dev/kmsg");
    }
    eventually(
        "a SystemOOM event on the node",
        Duration::from_secs(30),
        || async {
            let out = node.cli(&["events"]).output().await.expect("the CLI runs");
            let shown = String::from_utf8_lossy(&out.stdout).into_owned();
            (shown.contains("SystemOOM") && shown.contains(&want) && shown.contains("node/"))
                .then_some(())
        },
    )
    .await;
    node.finish().await;
}

#[tokio::test]
async fn an_apparmor_profile_is_refused_where_the_host_has_no_apparmor() {
    let enabled = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|v| v.starts_with('Y'));
    let node = Node::start("apparmor", &[]).await;
    let yaml = pod_yaml("aa", &[("c", FOREVER)], "").replacen(
        "spec:\n",
        "spec:\n  securityContext: {appArmorProfile: {type: RuntimeDefault}}\n",
        1,
    );
    node.write_manifest("aa.yaml", &yaml);
    if enabled {
        node.wait_running("aa", 1).await;
    } else {
        let st = node
            .wait_status("aa", "refused", |s| phase(s) == "Failed")
            .await;
        assert_eq!(st.reason.as_deref(), Some("AppArmor"));
        assert_eq!(
            st.message.as_deref(),
            Some("Pod was rejected: Cannot enforce AppArmor: AppArmor is not enabled on the host")
        );
        assert!(node.sandboxes("aa").await.is_empty());
    }
    node.finish().await;
}

/// Recursive read-only mounts follow what the runtime handler reports in the CRI status:
/// containerd 2.x with runc 1.5 makes them (a mount below the volume is read-only too);
/// containerd 1.6 names no handler features, so `IfPossible` falls back and `Enabled` is a
/// config error, with upstream's message.
#[tokio::test]
async fn recursive_read_only_mounts_follow_the_runtime_handlers_features() {
    let node = Node::start("rro", &[]).await;
    // a host dir with a mount below it: only a recursive read-only bind covers the submount
    let host = node.path("rro-host");
    std::fs::create_dir_all(host.join("sub")).expect("mkdir");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "rro-sub"])
        .arg(host.join("sub"))
        .status()
        .expect("mount");
    assert!(mounted.success(), "mount a tmpfs below the host dir");
    let script = format!(
        "if touch /v/sub/x 2>/dev/null; then echo sub=writable; else echo sub=read-only; fi; {FOREVER}"
    );
    let with_mode = |name: &str, mode: &str| {
        pod_yaml(
            name,
            &[("c", &script)],
            &format!(
                "  volumes: [{{name: v, hostPath: {{path: {}, type: Directory}}}}]\n",
                host.display()
            ),
        )
        .replacen(
            "    command:",
            &format!(
                "    volumeMounts: [{{name: v, mountPath: /v, readOnly: true, recursiveReadOnly: {mode}}}]\n    command:"
            ),
            1,
        )
    };
    node.write_manifest("maybe.yaml", &with_mode("maybe", "IfPossible"));
    node.write_manifest("must.yaml", &with_mode("must", "Enabled"));
    node.wait_running("maybe", 1).await;
    let st = node
        .wait_status("maybe", "its mounts reported", |s| {
            s.container_statuses
                .as_ref()
                .is_some_and(|c| c[0].volume_mounts.is_some())
        })
        .await;
    let mounts = st.container_statuses.unwrap_or_default()[0]
        .volume_mounts
        .clone()
        .unwrap_or_default();
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0].read_only, Some(true));
    if crate::bed::containerd2() {
        assert_eq!(mounts[0].recursive_read_only.as_deref(), Some("Enabled"));
        node.wait_log("maybe", "c", "sub=read-only").await;
        node.wait_running("must", 1).await;
        node.wait_log("must", "c", "sub=read-only").await;
    } else {
        assert_eq!(mounts[0].recursive_read_only.as_deref(), Some("Disabled"));
        node.wait_log("maybe", "c", "sub=writable").await;
        let st = node
            .wait_status("must", "CreateContainerConfigError", |s| {
                s.container_statuses
                    .as_ref()
                    .and_then(|c| waiting_reason(&c[0]))
                    .as_deref()
                    == Some("CreateContainerConfigError")
            })
            .await;
        let message = st
            .container_statuses
            .as_ref()
            .and_then(|c| c[0].state.as_ref()?.waiting.as_ref()?.message.clone());
        assert!(
            message.as_deref().is_some_and(|m| m.contains(
                "requested recursive read-only mode, but it is not supported by the runtime"
            )),
            "{message:?}"
        );
    }
    node.finish().await;
}

/// Where the runtime streams container events (containerd 2.x), nodelet follows them and
/// relists only as a safety net; a container that exits by itself is still seen at once. On
/// containerd 1.6, which has no events, the relist every second sees it.
#[tokio::test]
async fn a_container_exiting_by_itself_is_seen_through_the_runtimes_events() {
    let node = Node::start("events", &[]).await;
    node.write_manifest(
        "e.yaml",
        &pod_yaml(
            "e",
            &[("c", "while [ ! -e /tmp/go ]; do sleep 0.1; done; exit 3")],
            "  restartPolicy: Never\n",
        ),
    );
    let (_, containers) = node.wait_running("e", 1).await;
    node.touch(&containers[0].id, "/tmp/go").await;
    node.wait_status("e", "its container exited with 3", |s| {
        s.container_statuses.as_ref().is_some_and(|c| {
            c[0].state
                .as_ref()
                .and_then(|st| st.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 3)
        })
    })
    .await;
    let metric = |name: &str| {
        nodelet::metrics::get()
            .render()
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let connected = metric("kubelet_evented_pleg_connection_success_count");
    if crate::bed::containerd2() {
        assert!(connected >= 1.0, "nodelet follows containerd 2.x's events");
    } else {
        assert_eq!(connected, 0.0, "containerd 1.6 streams no events");
    }
    node.finish().await;
}

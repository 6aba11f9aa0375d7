//! Container lifecycle against containerd: restart backoff, sidecars, hooks, termination
//! messages, the downward API, resources and security context.

use std::collections::BTreeMap;
use std::time::Duration;

use nodelet::runtime::LABEL_POD_UID;

use crate::bed::{BUSYBOX, FOREVER, Node, eventually};

fn terminated(
    st: &k8s_openapi::api::core::v1::PodStatus,
    i: usize,
) -> Option<k8s_openapi::api::core::v1::ContainerStateTerminated> {
    st.container_statuses
        .as_ref()?
        .get(i)?
        .state
        .as_ref()?
        .terminated
        .clone()
}

fn waiting_reason(st: &k8s_openapi::api::core::v1::PodStatus, i: usize) -> Option<String> {
    st.container_statuses
        .as_ref()?
        .get(i)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test]
async fn restarts_back_off_with_growing_gaps() {
    let node = Node::start("backoff", &["--testing-backoff=1s"]).await;
    node.write_manifest(
        "crash.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: crash}}
spec:
  containers:
  - {{name: c, image: {BUSYBOX}, command: [sh, -c, 'exit 1']}}
"
        ),
    );
    let sandbox = node.wait_sandbox("crash").await;
    // Containers are collected as the pod restarts, so their creation times are recorded as seen.
    let mut created: BTreeMap<u32, i64> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while created.len() < 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "five starts never came: {created:?}"
        );
        for c in node
            .runtime
            .list_containers(Some((LABEL_POD_UID, &sandbox.uid.0)))
            .await
            .unwrap_or_default()
        {
            created.entry(c.attempt).or_insert(c.created_at);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let times: Vec<i64> = created.values().copied().collect();
    let gaps: Vec<i64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps[2] > gaps[1] && gaps[3] > gaps[2],
        "gaps between starts must grow: {gaps:?} ns"
    );
    node.finish().await;
}

#[tokio::test]
async fn a_sidecar_runs_beside_the_app_and_stops_last() {
    let node = Node::start("sidecar", &[]).await;
    let marks = node.path("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let yaml = format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: side}}
spec:
  terminationGracePeriodSeconds: 5
  volumes: [{{name: m, hostPath: {{path: {m}}}}}]
  initContainers:
  - name: proxy
    image: {BUSYBOX}
    restartPolicy: Always
    volumeMounts: [{{name: m, mountPath: /m}}]
    command: [sh, -c, \"trap 'sleep 1; echo proxy >> /m/stopped; exit 0' TERM; echo up > /m/proxy; {FOREVER}\"]
  containers:
  - name: app
    image: {BUSYBOX}
    volumeMounts: [{{name: m, mountPath: /m}}]
    command: [sh, -c, \"trap 'echo app >> /m/stopped; exit 0' TERM; test -f /m/proxy && echo proxy-was-up; {FOREVER}\"]
",
        m = marks.display()
    );
    node.write_manifest("side.yaml", &yaml);
    let (sandbox, _) = node.wait_running("side", 2).await;
    node.wait_log("side", "app", "proxy-was-up").await;
    let st = node
        .wait_status("side", "Running", |s| s.phase.as_deref() == Some("Running"))
        .await;
    let sidecar = &st.init_container_statuses.as_ref().unwrap()[0];
    assert!(
        sidecar.state.as_ref().unwrap().running.is_some(),
        "{sidecar:?}"
    );
    node.remove_manifest("side.yaml");
    node.wait_gone(&sandbox.uid, Duration::from_secs(30)).await;
    assert_eq!(
        read(&marks.join("stopped")),
        "app\nproxy\n",
        "the app stops first, the sidecar last"
    );

    node.write_manifest(
        "batch.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: batch}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  initContainers:
  - {{name: helper, image: {BUSYBOX}, restartPolicy: Always, command: [sh, -c, \"trap 'exit 0' TERM; {FOREVER}\"]}}
  containers:
  - {{name: job, image: {BUSYBOX}, command: [sh, -c, 'echo done']}}
"
        ),
    );
    node.wait_status("batch", "Succeeded with its sidecar stopped", |s| {
        s.phase.as_deref() == Some("Succeeded")
            && s.init_container_statuses.as_ref().is_some_and(|i| {
                i[0].state
                    .as_ref()
                    .is_some_and(|st| st.terminated.is_some())
            })
    })
    .await;
    node.finish().await;
}

#[tokio::test]
async fn hooks_run_around_the_container() {
    let node = Node::start("hooks", &[]).await;
    let marks = node.path("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let m = marks.display();
    node.write_manifest(
        "order.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: order}}
spec:
  terminationGracePeriodSeconds: 10
  volumes: [{{name: m, hostPath: {{path: {m}}}}}]
  containers:
  - name: c
    image: {BUSYBOX}
    volumeMounts: [{{name: m, mountPath: /m}}]
    lifecycle:
      postStart: {{exec: {{command: [sh, -c, 'echo post-start >> /m/order']}}}}
      preStop: {{exec: {{command: [sh, -c, 'echo pre-stop >> /m/order']}}}}
    command: [sh, -c, \"trap 'echo term >> /m/order; exit 0' TERM; {FOREVER}\"]
"
        ),
    );
    let (order, _) = node.wait_running("order", 1).await;
    eventually("postStart to run", Duration::from_secs(30), || async {
        read(&marks.join("order"))
            .contains("post-start")
            .then_some(())
    })
    .await;
    node.remove_manifest("order.yaml");
    node.wait_gone(&order.uid, Duration::from_secs(30)).await;
    assert_eq!(read(&marks.join("order")), "post-start\npre-stop\nterm\n");

    node.write_manifest(
        "slow.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: slow}}
spec:
  terminationGracePeriodSeconds: 3
  containers:
  - name: c
    image: {BUSYBOX}
    lifecycle: {{preStop: {{exec: {{command: [sleep, '600']}}}}}}
    command: [sh, -c, \"trap '' TERM; {FOREVER}\"]
"
        ),
    );
    let (slow, _) = node.wait_running("slow", 1).await;
    node.remove_manifest("slow.yaml");
    // A 10 minute preStop is cut at the 3 s grace deadline (plus upstream's 2 s minimum).
    node.wait_gone(&slow.uid, Duration::from_secs(30)).await;

    node.write_manifest(
        "fails.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: fails}}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{{name: m, hostPath: {{path: {m}}}}}]
  containers:
  - name: c
    image: {BUSYBOX}
    volumeMounts: [{{name: m, mountPath: /m}}]
    lifecycle: {{postStart: {{exec: {{command: [sh, -c, 'echo hook >> /m/failing; exit 1']}}}}}}
    command: [sh, -c, \"trap 'echo killed >> /m/killed; exit 0' TERM; {FOREVER}\"]
"
        ),
    );
    node.wait_status("fails", "restarted after the failed postStart hook", |s| {
        s.container_statuses
            .as_ref()
            .is_some_and(|c| c[0].restart_count >= 1)
    })
    .await;
    assert!(
        read(&marks.join("killed")).contains("killed"),
        "the container was killed after its hook failed"
    );
    node.finish().await;
}

#[tokio::test]
async fn termination_messages_come_from_the_file_or_the_log() {
    let node = Node::start("termmsg", &[]).await;
    node.write_manifest(
        "file.yaml",
        &format!("apiVersion: v1
kind: Pod
metadata: {{name: file}}
spec:
  restartPolicy: Never
  containers:
  - {{name: c, image: {BUSYBOX}, command: [sh, -c, 'echo -n goodbye > /dev/termination-log; exit 1']}}
"),
    );
    node.write_manifest(
        "logs.yaml",
        &format!("apiVersion: v1
kind: Pod
metadata: {{name: logs}}
spec:
  restartPolicy: Never
  containers:
  - {{name: c, image: {BUSYBOX}, terminationMessagePolicy: FallbackToLogsOnError, command: [sh, -c, 'echo first; echo last words; exit 2']}}
"),
    );
    let st = node
        .wait_status("file", "Failed", |s| s.phase.as_deref() == Some("Failed"))
        .await;
    assert_eq!(
        terminated(&st, 0).unwrap().message.as_deref(),
        Some("goodbye")
    );
    let st = node
        .wait_status("logs", "Failed", |s| s.phase.as_deref() == Some("Failed"))
        .await;
    assert_eq!(
        terminated(&st, 0).unwrap().message.as_deref(),
        Some("first\nlast words")
    );
    node.finish().await;
}

#[tokio::test]
async fn env_expansion_and_every_downward_api_field() {
    let node = Node::start("downward", &["--node-ip", "127.0.0.1"]).await;
    let field = |name: &str, path: &str| {
        format!("    - {{name: {name}, valueFrom: {{fieldRef: {{fieldPath: \"{path}\"}}}}}}\n")
    };
    let resource = |name: &str, res: &str, divisor: &str| {
        format!(
            "    - {{name: {name}, valueFrom: {{resourceFieldRef: {{resource: {res}, divisor: {divisor}}}}}}}\n"
        )
    };
    let mut env = String::new();
    for (name, path) in [
        ("NAME", "metadata.name"),
        ("NS", "metadata.namespace"),
        ("UID", "metadata.uid"),
        ("LABEL", "metadata.labels['app']"),
        ("NOTE", "metadata.annotations['note']"),
        ("NODE", "spec.nodeName"),
        ("SA", "spec.serviceAccountName"),
        ("HOST_IP", "status.hostIP"),
        ("HOST_IPS", "status.hostIPs"),
        ("POD_IP", "status.podIP"),
        ("POD_IPS", "status.podIPs"),
    ] {
        env += &field(name, path);
    }
    env += &resource("MEM_MI", "limits.memory", "1Mi");
    env += &resource("CPU_M", "requests.cpu", "1m");
    env += &resource("CPU_LIMIT", "limits.cpu", "1");
    env += "    - {name: GREETING, value: \"hi-$(NAME)\"}\n    - {name: LITERAL, value: \"$$(NAME)\"}\n";
    let script = "env; echo arg=$1; trap 'exit 0' TERM; while true; do sleep 1; done";
    let yaml = format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: dw, labels: {{app: web}}, annotations: {{note: hello}}}}
spec:
  serviceAccountName: robot
  containers:
  - name: c
    image: {BUSYBOX}
    resources: {{requests: {{cpu: 250m}}, limits: {{memory: 64Mi}}}}
    env:
{env}    command: [sh, -c, {}, sh, \"$(GREETING)\"]
",
        serde_json::to_string(script).unwrap()
    );
    node.write_manifest("dw.yaml", &yaml);
    let (sandbox, _) = node.wait_running("dw", 1).await;
    let log = node.wait_log("dw", "c", "arg=").await;
    let st = node
        .wait_status("dw", "a pod IP", |s| s.pod_ip.is_some())
        .await;
    let pod_ip = st.pod_ip.unwrap();
    let name = node.pod_name("dw");
    let cpus = std::thread::available_parallelism().unwrap().get();
    for expected in [
        format!("NAME={name}"),
        "NS=default".into(),
        format!("UID={}", sandbox.uid),
        "LABEL=web".into(),
        "NOTE=hello".into(),
        format!("NODE={}", node.name),
        "SA=robot".into(),
        "HOST_IP=127.0.0.1".into(),
        "HOST_IPS=127.0.0.1".into(),
        format!("POD_IP={pod_ip}"),
        format!("POD_IPS={pod_ip}"),
        "MEM_MI=64".into(),
        "CPU_M=250".into(),
        format!("CPU_LIMIT={cpus}"),
        format!("GREETING=hi-{name}"),
        "LITERAL=$(NAME)".into(),
        format!("arg=hi-{name}"),
    ] {
        assert!(
            log.lines().any(|l| l.ends_with(&expected)),
            "{expected} missing in:\n{log}"
        );
    }
    node.finish().await;
}

#[tokio::test]
async fn resources_and_security_context_are_seen_inside_the_container() {
    let node = Node::start("secctx", &[]).await;
    let script = "cat /sys/fs/cgroup/memory/memory.limit_in_bytes; echo uid=$(id -u) gid=$(id -g); touch /rootfs-write 2>/dev/null || echo read-only-root; grep CapBnd /proc/self/status; trap 'exit 0' TERM; while true; do sleep 1; done";
    let yaml = format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: sec}}
spec:
  securityContext: {{runAsUser: 1000, runAsGroup: 3000, runAsNonRoot: true}}
  containers:
  - name: c
    image: {BUSYBOX}
    resources: {{limits: {{memory: 32Mi}}}}
    securityContext: {{readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {{drop: [ALL], add: [NET_BIND_SERVICE]}}}}
    command: [sh, -c, {}]
",
        serde_json::to_string(script).unwrap()
    );
    node.write_manifest("sec.yaml", &yaml);
    let log = node.wait_log("sec", "c", "CapBnd").await;
    for expected in [
        "33554432",
        "uid=1000 gid=3000",
        "read-only-root",
        "CapBnd:\t0000000000000400",
    ] {
        assert!(log.contains(expected), "{expected} missing in:\n{log}");
    }

    node.write_manifest(
        "root.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: root}}
spec:
  securityContext: {{runAsNonRoot: true}}
  containers:
  - {{name: c, image: {BUSYBOX}, command: [sh, -c, 'echo should-not-run']}}
"
        ),
    );
    let st = node
        .wait_status("root", "CreateContainerConfigError", |s| {
            waiting_reason(s, 0).as_deref() == Some("CreateContainerConfigError")
        })
        .await;
    let msg = st.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap()
        .message
        .unwrap_or_default();
    assert!(msg.contains("runAsNonRoot"), "{msg}");
    node.finish().await;
}

#[tokio::test]
async fn proc_mount_default_masks_proc_and_unmasked_does_not() {
    let node = Node::start("procmount", &[]).await;
    let report = "echo \"keys=$(stat -c %F /proc/keys) sys=$(grep ' /proc/sys ' /proc/mounts | cut -d ' ' -f 4 | cut -d , -f 1)\"";
    let script =
        serde_json::to_string(&format!("{report}; trap 'exit 0' TERM; {FOREVER}")).expect("json");
    node.write_manifest(
        "p.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: p}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: def
    image: {BUSYBOX}
    command: [sh, -c, {script}]
  - name: unm
    image: {BUSYBOX}
    command: [sh, -c, {script}]
    securityContext: {{procMount: Unmasked}}
"
        ),
    );
    let masked = node.wait_log("p", "def", "keys=").await;
    assert!(
        masked.contains("keys=character special file sys=ro"),
        "procMount Default masks /proc/keys and makes /proc/sys read-only: {masked}"
    );
    let unmasked = node.wait_log("p", "unm", "keys=").await;
    assert!(
        unmasked.contains("keys=regular empty file") && !unmasked.contains("sys=ro"),
        "procMount Unmasked leaves /proc alone: {unmasked}"
    );
    node.finish().await;
}

#[tokio::test]
async fn a_container_is_stopped_with_its_own_stop_signal() {
    let node = Node::start("stopsignal", &[]).await;
    let script = serde_json::to_string(
        "trap 'echo got USR1; exit 0' USR1; trap 'echo got TERM; exit 0' TERM; echo ready; while true; do sleep 1; done",
    )
    .expect("json");
    // A failing liveness probe has the container killed (and restarted); the first run's log
    // says which signal stopped it.
    node.write_manifest(
        "s.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: s}}
spec:
  os: {{name: linux}}
  terminationGracePeriodSeconds: 10
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, {script}]
    lifecycle: {{stopSignal: SIGUSR1}}
    livenessProbe: {{exec: {{command: ['false']}}, initialDelaySeconds: 1, periodSeconds: 1, failureThreshold: 1}}
"
        ),
    );
    let log = node.wait_log("s", "c", "got ").await;
    assert!(
        log.contains("got USR1") && !log.contains("got TERM"),
        "{log}"
    );
    let st = node.status("s").expect("a status");
    let c = &st.container_statuses.expect("container statuses")[0];
    assert_eq!(c.stop_signal.as_deref(), Some("SIGUSR1"));
    // Stopped by the runtime alone: containerd 2.x took the signal at creation (the CRI's
    // stop_signal); 1.6 predates the field and sends SIGTERM, so nodelet sends it itself there.
    node.write_manifest(
        "r.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: r}}
spec:
  os: {{name: linux}}
  restartPolicy: Never
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, {script}]
    lifecycle: {{stopSignal: SIGUSR1}}
"
        ),
    );
    let (_, containers) = node.wait_running("r", 1).await;
    node.wait_log("r", "c", "ready").await;
    node.runtime
        .stop_container(&containers[0].id, 10)
        .await
        .expect("StopContainer");
    let log = node.wait_log("r", "c", "got ").await;
    let by_runtime = if crate::bed::containerd2() {
        "got USR1"
    } else {
        "got TERM"
    };
    assert!(log.contains(by_runtime), "{log}");
    node.finish().await;
}

#[tokio::test]
async fn garbage_collection_keeps_one_dead_container_per_container_with_its_log() {
    let node = Node::start("gcdead", &["--testing-backoff=1s"]).await;
    node.write_manifest(
        "g.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: g}}
spec:
  containers:
  - {{name: c, image: {BUSYBOX}, command: [sh, -c, 'echo run; sleep 1; exit 1']}}
"
        ),
    );
    node.wait_status("g", "restarted four times", |s| {
        s.container_statuses
            .as_ref()
            .is_some_and(|c| c[0].restart_count >= 4)
    })
    .await;
    let sandbox = node.wait_sandbox("g").await;
    let log_dir = node
        .pod_logs()
        .join(format!("default_{}_{}", node.pod_name("g"), sandbox.uid))
        .join("c");
    eventually(
        "one dead container and two logs at most",
        Duration::from_secs(30),
        || async {
            let containers = node
                .runtime
                .list_containers(Some((LABEL_POD_UID, &sandbox.uid.0)))
                .await
                .ok()?;
            let dead = containers
                .iter()
                .filter(|c| c.state == nodelet::runtime::ContainerState::Exited)
                .count();
            let running = containers.len() - dead;
            let logs = std::fs::read_dir(&log_dir).ok()?.count();
            (running == 1 && dead == 1 && logs == 2).then_some(())
        },
    )
    .await;
    node.finish().await;
}

#[tokio::test]
async fn the_restart_backoff_goes_on_after_nodelet_restarts() {
    let mut node = Node::start("backoffkeep", &["--testing-backoff=1s"]).await;
    node.write_manifest(
        "k.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: k}}
spec:
  containers:
  - {{name: c, image: {BUSYBOX}, command: [sh, -c, 'exit 1']}}
"
        ),
    );
    // Restarts 1 to 4 come after 0, 1, 2 and 4 s; the fifth is due 8 s after the fourth ends.
    node.wait_status("k", "restarted four times", |s| {
        s.container_statuses
            .as_ref()
            .is_some_and(|c| c[0].restart_count >= 4)
    })
    .await;
    node.stop_agent().await;
    let sandbox = node.wait_sandbox("k").await;
    let runtime = node.runtime.clone();
    let uid = sandbox.uid.0.clone();
    let latest = || async {
        runtime
            .list_containers(Some((LABEL_POD_UID, &uid)))
            .await
            .unwrap_or_default()
            .into_iter()
            .max_by_key(|c| c.attempt)
    };
    let before = eventually(
        "the latest container to exit",
        Duration::from_secs(30),
        || async {
            latest()
                .await
                .filter(|c| c.state == nodelet::runtime::ContainerState::Exited)
        },
    )
    .await;
    let finished_at = node
        .runtime
        .container_status(&before.id)
        .await
        .expect("the exited container's status")
        .finished_at;
    node.restart(&["--testing-backoff=1s"]).await;
    let restarted = std::time::SystemTime::now();
    let next = eventually("the next restart", Duration::from_secs(60), || async {
        latest().await.filter(|c| c.attempt > before.attempt)
    })
    .await;
    let at = |nanos: i64| std::time::UNIX_EPOCH + Duration::from_nanos(nanos.max(0) as u64);
    let due = at(finished_at) + Duration::from_secs(1 << (before.attempt - 1).min(8));
    assert!(
        restarted < due,
        "nodelet took too long to come back for this test to tell anything: attempt {} ended at {:?}, restarted at {restarted:?}",
        before.attempt,
        at(finished_at)
    );
    assert!(
        at(next.created_at) + Duration::from_millis(500) >= due,
        "restart {} came before its backoff ended: the backoff started over",
        next.attempt
    );
    node.finish().await;
}

/// A termination is a deadline: a pod whose preStop hook hangs and whose volume cannot be
/// removed (a file in it made immutable) is gone from the node's pods within its grace period
/// and 10 s; what it left is on the cleanup list with why, a new pod of its name starts at
/// once, and the leftover goes as soon as it can.
#[tokio::test]
async fn a_termination_ends_on_time_and_its_leftovers_are_cleaned_in_the_background() {
    let node = Node::start("leftover", &[]).await;
    let pod = |marker: &str| {
        format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: kept}}
spec:
  terminationGracePeriodSeconds: 3
  volumes: [{{name: scratch, emptyDir: {{}}}}]
  containers:
  - name: c
    image: {BUSYBOX}
    env: [{{name: MARK, value: {marker}}}]
    volumeMounts: [{{name: scratch, mountPath: /scratch}}]
    lifecycle: {{preStop: {{exec: {{command: [sleep, '600']}}}}}}
    command: [sh, -c, \"touch /scratch/pin; trap '' TERM; {FOREVER}\"]
"
        )
    };
    node.write_manifest("kept.yaml", &pod("one"));
    let (sandbox, _) = node.wait_running("kept", 1).await;
    let pin = node
        .path("root/pods")
        .join(&sandbox.uid.0)
        .join("volumes/kubernetes.io~empty-dir/scratch/pin");
    eventually("the pinned file", Duration::from_secs(30), || {
        std::future::ready(pin.exists().then_some(()))
    })
    .await;
    let chattr = |flag: &str| {
        let done = std::process::Command::new("chattr")
            .arg(flag)
            .arg(&pin)
            .status()
            .expect("chattr runs");
        assert!(done.success(), "chattr {flag}");
    };
    chattr("+i");
    node.remove_manifest("kept.yaml");
    let ended = eventually(
        "the pod gone from the node's pods",
        Duration::from_secs(60),
        || std::future::ready(node.status("kept").is_none().then_some(())),
    );
    tokio::time::timeout(Duration::from_secs(3 + 10), ended)
        .await
        .expect("the pod ended within its grace period and 10 s");
    node.wait_gone(&sandbox.uid, Duration::from_secs(30)).await;
    let listed = eventually(
        "the leftover on the cleanup list",
        Duration::from_secs(30),
        || async {
            let out = node.cli(&["get", "cleanups"]).output().await.ok()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.lines()
                .any(|l| {
                    l.contains(&sandbox.uid.0)
                        && l.contains("volumes")
                        && l.contains("not permitted")
                })
                .then_some(text)
        },
    )
    .await;
    assert!(listed.contains(&node.pod_name("kept")), "{listed}");
    // Its leftover holds nothing up: the pod of the same name runs again at once.
    node.write_manifest("kept.yaml", &pod("two"));
    node.wait_running("kept", 1).await;
    chattr("-i");
    eventually("the leftover removed", Duration::from_secs(90), || async {
        let out = node.cli(&["get", "cleanups"]).output().await.ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (!text.contains(&sandbox.uid.0) && !pin.exists()).then_some(())
    })
    .await;
    let out = node.cli(&["events"]).output().await.expect("the CLI runs");
    let events = String::from_utf8_lossy(&out.stdout);
    assert!(events.contains("CleanupPending"), "{events}");
    node.finish().await;
}

//! The admin socket and the CLI (`nodelet get/describe/logs/exec/events`) against a running
//! agent with pods on containerd.

use std::process::Output;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use crate::bed::{FOREVER, Node, eventually, pod_yaml, test_dir};

/// Runs the nodelet CLI against the node's root dir.
async fn cli(node: &Node, args: &[&str]) -> Output {
    node.cli(args).output().await.expect("the CLI runs")
}

/// Runs the CLI with `input` on its stdin (kept open) and waits, at most a minute, for it.
async fn with_input(node: &Node, args: &[&str], input: &[u8]) -> Output {
    let mut piped = node
        .cli(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the CLI runs");
    let mut stdin = piped.stdin.take().expect("stdin");
    tokio::io::AsyncWriteExt::write_all(&mut stdin, input)
        .await
        .expect("write stdin");
    tokio::time::timeout(Duration::from_secs(60), piped.wait_with_output())
        .await
        .expect("the CLI ends with its command")
        .expect("output")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test]
async fn the_cli_lists_describes_logs_and_execs_like_kubectl() {
    let node = Node::start("admin-cli", &[]).await;
    let script = format!("for i in 1 2 3; do echo line $i; done; {FOREVER}");
    node.write_manifest(
        "web.yaml",
        &pod_yaml("web", &[("app", &script), ("side", FOREVER)], ""),
    );
    node.wait_running("web", 2).await;
    node.wait_log("web", "app", "line 3").await;
    let pod = node.pod_name("web");

    let listed = eventually(
        "get pods to show the pod ready",
        Duration::from_secs(30),
        || async {
            let text = stdout(&cli(&node, &["get", "pods"]).await);
            text.lines()
                .any(|l| l.starts_with(&pod) && l.contains("2/2") && l.contains("Running"))
                .then_some(text)
        },
    )
    .await;
    assert!(listed.starts_with("NAME"), "{listed}");
    let wide = stdout(&cli(&node, &["get", "pods", "-o", "wide"]).await);
    assert!(wide.contains("NODE") && wide.contains(&node.name), "{wide}");
    let json: serde_json::Value =
        serde_json::from_slice(&cli(&node, &["get", "pod", &pod, "-o", "json"]).await.stdout)
            .expect("-o json prints JSON");
    assert_eq!(json["metadata"]["name"], pod.as_str());
    assert_eq!(json["status"]["phase"], "Running");
    let yaml = stdout(&cli(&node, &["get", "pods", "-o", "yaml"]).await);
    assert!(yaml.contains("kind: List"), "{yaml}");

    let described = stdout(&cli(&node, &["describe", "pod", &pod]).await);
    for needle in [
        &format!("Name:         {pod}"),
        "Containers:",
        "  app:",
        "Restart Count:  0",
        "Events:",
        "Started",
        "Started container app",
    ] {
        assert!(
            described.contains(needle),
            "{needle:?} missing in:\n{described}"
        );
    }
    let events = stdout(&cli(&node, &["events"]).await);
    assert!(events.starts_with("LAST SEEN"), "{events}");
    assert!(
        events.contains(&format!("pod/{pod} (spec.containers{{side}})"))
            && events.contains("Created"),
        "{events}"
    );

    let all = cli(&node, &["logs", &pod, "-c", "app"]).await;
    assert_eq!(stdout(&all), "line 1\nline 2\nline 3\n");
    let tail = cli(&node, &["logs", &pod, "-c", "app", "--tail", "1"]).await;
    assert_eq!(stdout(&tail), "line 3\n");
    let which = cli(&node, &["logs", &pod]).await;
    assert!(!which.status.success());
    assert!(
        String::from_utf8_lossy(&which.stderr).contains("choose one of"),
        "{which:?}"
    );

    let exec = cli(
        &node,
        &[
            "exec",
            &pod,
            "-c",
            "app",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
    )
    .await;
    assert_eq!(stdout(&exec), "out\n", "{exec:?}");
    assert_eq!(String::from_utf8_lossy(&exec.stderr), "err\n");
    assert_eq!(exec.status.code(), Some(3));
    let got = with_input(
        &node,
        &[
            "exec",
            "-i",
            &pod,
            "-c",
            "app",
            "--",
            "sh",
            "-c",
            "read x; echo got $x",
        ],
        b"hello\n",
    )
    .await;
    assert_eq!(stdout(&got), "got hello\n");
    assert_eq!(got.status.code(), Some(0));
    let ok = cli(&node, &["exec", &pod, "-c", "side", "--", "true"]).await;
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");

    let missing = cli(&node, &["describe", "pod", "nothing"]).await;
    assert!(String::from_utf8_lossy(&missing.stderr).contains("not found"));
    node.finish().await;
}

#[tokio::test]
async fn logs_follow_to_the_end_and_show_the_previous_instance() {
    let node = Node::start("admin-logs", &["--sync-frequency", "1s"]).await;
    // Each instance prints its marker, waits for a file, and exits (restartPolicy Always).
    let script =
        "echo start-$(date +%s%N); while [ ! -f /tmp/go ]; do sleep 0.2; done; echo done; exit 1";
    node.write_manifest("f.yaml", &pod_yaml("f", &[("app", script)], ""));
    node.wait_running("f", 1).await;
    node.wait_log("f", "app", "start-").await;
    // The agent knows a pod once its first sync has recorded a status.
    node.wait_status("f", "recorded", |_| true).await;
    let pod = node.pod_name("f");
    let mut follow = node
        .cli(&["logs", "-f", &pod])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("logs -f runs");
    let mut lines = BufReader::new(follow.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the follower prints the first line")
        .expect("read");
    assert!(first.is_some_and(|l| l.starts_with("start-")));
    // The follower is attached: the container's last line must reach it by following.
    let (_, containers) = node.wait_running("f", 1).await;
    node.touch(&containers[0].id, "/tmp/go").await;
    let next = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the last line arrives")
        .expect("read");
    assert_eq!(next.as_deref(), Some("done"));
    let status = tokio::time::timeout(Duration::from_secs(30), follow.wait())
        .await
        .expect("logs -f ends when the container exits")
        .expect("wait");
    assert!(status.success());

    let previous = eventually("a restarted instance", Duration::from_secs(60), || async {
        let out = cli(&node, &["logs", &pod, "--previous"]).await;
        out.status.success().then(|| stdout(&out))
    })
    .await;
    assert!(previous.ends_with("done\n"), "{previous:?}");
    node.finish().await;
}

#[tokio::test]
async fn the_cli_says_when_no_agent_runs() {
    let dir = test_dir("admin-none");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args(["get", "pods", "--root-dir"])
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is nodelet running"), "{err}");
}

#[tokio::test]
async fn the_cli_takes_the_root_dir_before_the_command_or_finds_the_agent() {
    let dir = test_dir("admin-find");
    let node = "t-admin-find";
    let mut command = crate::bed::nodelet_command(dir.path(), node);
    command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // Killed however the test ends, a failed assertion included.
    let mut agent = tokio::process::Command::from(command)
        .kill_on_drop(true)
        .spawn()
        .expect("start nodelet");
    let root = dir.path().join("root");
    let run = |args: Vec<std::ffi::OsString>| async move {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_nodelet"))
            .args(args)
            .output()
            .await
            .expect("the CLI runs")
    };
    let before: Vec<std::ffi::OsString> = vec![
        "--root-dir".into(),
        root.clone().into(),
        "get".into(),
        "pods".into(),
    ];
    eventually(
        "the CLI with --root-dir first",
        Duration::from_secs(30),
        || async { run(before.clone()).await.status.success().then_some(()) },
    )
    .await;
    // Without --root-dir: this agent is found, or (when other agents run too, as in parallel
    // tests) named among the flags to pass.
    let out = run(vec!["get".into(), "pods".into()]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || err.contains(&format!("--root-dir {}", root.display())),
        "{err}"
    );
    let _ = agent.kill().await;
    crate::bed::clean_node(node, dir.path()).await;
}

#[tokio::test]
async fn debug_adds_an_ephemeral_container_to_a_static_pod() {
    let node = Node::start("admin-debug", &[]).await;
    node.write_manifest(
        "dbg.yaml",
        &pod_yaml("dbg", &[("app", "exec sleep 3600")], ""),
    );
    node.wait_running("dbg", 1).await;
    let pod = node.pod_name("dbg");
    let image = crate::bed::BUSYBOX;
    // In the target's process namespace, the debugging container sees its processes.
    let looked = cli(
        &node,
        &[
            "debug", &pod, "--image", image, "--target", "app", "-c", "look", "--", "ps",
        ],
    )
    .await;
    assert_eq!(looked.status.code(), Some(0), "{looked:?}");
    node.wait_log("dbg", "look", "sleep 3600").await;
    // Interactive: the CLI attaches once the container runs and relays stdin.
    let got = with_input(
        &node,
        &[
            "debug",
            "-i",
            &pod,
            "--image",
            image,
            "--",
            "sh",
            "-c",
            "read x; echo got $x",
        ],
        b"hello\n",
    )
    .await;
    assert_eq!(stdout(&got), "got hello\n", "{got:?}");
    assert!(
        String::from_utf8_lossy(&got.stderr)
            .contains("Defaulting debug container name to debugger-"),
        "{got:?}"
    );
    // Refusals name what is wrong.
    let again = cli(&node, &["debug", &pod, "--image", image, "-c", "look"]).await;
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already has a container named \"look\""),
        "{again:?}"
    );
    let nowhere = cli(&node, &["debug", "nothing", "--image", image]).await;
    assert!(
        String::from_utf8_lossy(&nowhere.stderr).contains("not found"),
        "{nowhere:?}"
    );
    node.finish().await;
}

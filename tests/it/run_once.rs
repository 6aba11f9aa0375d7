//! Run-once mode and the lock file, through the nodelet binary.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::bed::{
    BUSYBOX, FOREVER, clean_node, eventually, node_sandboxes, nodelet_command, pod_yaml, runtime,
    test_dir,
};

/// A directory and node name of its own for one run of the binary.
struct Batch {
    dir: tempfile::TempDir,
    node: String,
}

impl Batch {
    fn new(test: &str) -> Batch {
        Batch {
            dir: test_dir(test),
            node: format!("t-{test}"),
        }
    }

    fn manifest(&self, file: &str, content: &str) {
        std::fs::write(self.dir.path().join("manifests").join(file), content).unwrap();
    }

    fn command(&self, extra: &[&str]) -> Command {
        let mut cmd = nodelet_command(self.dir.path(), &self.node);
        cmd.args(extra);
        cmd
    }

    async fn run(&self, extra: &[&str]) -> Output {
        let mut cmd = self.command(extra);
        tokio::task::spawn_blocking(move || cmd.output().expect("run nodelet"))
            .await
            .unwrap()
    }

    async fn finish(self) {
        clean_node(&self.node, self.dir.path()).await;
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn a_batch_that_succeeds_exits_0_with_a_json_report_and_cleans_up() {
    let b = Batch::new("batchok");
    b.manifest(
        "a.yaml",
        &pod_yaml("a", &[("c", "echo a")], "  restartPolicy: Never\n"),
    );
    b.manifest(
        "b.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: b}}
spec:
  restartPolicy: OnFailure
  initContainers:
  - {{name: prepare, image: {BUSYBOX}, command: [sh, -c, 'echo prepared']}}
  containers:
  - {{name: main, image: {BUSYBOX}, command: [sh, -c, 'echo main']}}
"
        ),
    );
    b.manifest(
        "c.yaml",
        &pod_yaml("c", &[("c", "sleep 1")], "  restartPolicy: Never\n"),
    );
    let out = b
        .run(&[
            "--run-once",
            "--run-once-output",
            "json",
            "--run-once-cleanup",
        ])
        .await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report on stdout");
    assert_eq!(report["succeeded"], true);
    let pods = report["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 3);
    for pod in pods {
        assert_eq!(pod["result"], "ok", "{pod}");
        assert_eq!(pod["phase"], "Succeeded", "{pod}");
        for c in pod["containers"].as_array().unwrap() {
            assert_eq!(c["exitCode"], 0, "{c}");
            assert!(
                c["startedAt"].is_string() && c["finishedAt"].is_string(),
                "{c}"
            );
            assert!(
                c["logPath"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!("/{}/0.log", c["name"].as_str().unwrap())),
                "{c}"
            );
        }
    }
    let b_pod = pods
        .iter()
        .find(|p| p["name"] == format!("b-{}", b.node))
        .unwrap();
    assert_eq!(b_pod["containers"][0]["init"], true);
    assert!(
        stderr.contains("CONTAINER"),
        "the table goes to stderr with json output: {stderr}"
    );
    assert!(
        node_sandboxes(&runtime().await, &b.node).await.is_empty(),
        "cleanup removed the pods"
    );
    b.finish().await;
}

#[tokio::test]
async fn a_failing_pod_fails_the_run_by_name() {
    let b = Batch::new("batchfail");
    b.manifest(
        "ok.yaml",
        &pod_yaml("fine", &[("c", "true")], "  restartPolicy: Never\n"),
    );
    b.manifest(
        "bad.yaml",
        &pod_yaml("broken", &[("c", "exit 3")], "  restartPolicy: Never\n"),
    );
    let out = b.run(&["--run-once", "--run-once-cleanup"]).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stderr.contains(&format!("failed: default/broken-{}", b.node)),
        "{stderr}"
    );
    assert!(
        stdout.contains("exited(3)"),
        "the table shows the exit code: {stdout}"
    );
    b.finish().await;
}

#[tokio::test]
async fn an_always_pod_is_waited_for_until_ready() {
    let b = Batch::new("batchready");
    let yaml = pod_yaml("server", &[("c", &format!("sleep 2; touch /tmp/ready; {FOREVER}"))], "").replacen(
        "    command:",
        "    readinessProbe: {exec: {command: [test, -f, /tmp/ready]}, periodSeconds: 1}\n    command:",
        1,
    );
    b.manifest("server.yaml", &yaml);
    let out = b.run(&["--run-once", "--run-once-output=json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(report["pods"][0]["phase"], "Running");
    assert_eq!(report["pods"][0]["containers"][0]["state"], "running,ready");
    assert_eq!(
        node_sandboxes(&runtime().await, &b.node).await.len(),
        1,
        "without cleanup the pod is left running"
    );
    b.finish().await;
}

#[tokio::test]
async fn the_timeout_fails_the_run_naming_the_pending_pods() {
    let b = Batch::new("batchslow");
    b.manifest(
        "slow.yaml",
        &pod_yaml("slow", &[("c", FOREVER)], "  restartPolicy: Never\n"),
    );
    let out = b
        .run(&[
            "--run-once",
            "--run-once-timeout",
            "3s",
            "--run-once-cleanup",
        ])
        .await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "timed out after 3s; still pending: default/slow-{}",
            b.node
        )),
        "{stderr}"
    );
    b.finish().await;
}

/// Does some process hold a flock on the file? Read from /proc/locks, without opening the file:
/// taking the lock to find out could win the race against nodelet, and an open is what
/// --exit-on-lock-contention watches for.
fn lock_is_held(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let inode = format!(":{} ", meta.ino());
    std::fs::read_to_string("/proc/locks").is_ok_and(|locks| {
        locks
            .lines()
            .any(|l| l.contains("FLOCK") && format!("{l} ").contains(&inode))
    })
}

#[tokio::test]
async fn a_second_nodelet_on_a_held_lock_file_refuses_to_start() {
    let b = Batch::new("lockheld");
    let lock = b.dir.path().join("nodelet.lock");
    let _held = nodelet::lock::acquire(&lock).unwrap();
    let out = b.run(&["--lock-file", lock.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("held by another process"),
        "{}",
        text(&out.stderr)
    );
    b.finish().await;
}

#[tokio::test]
async fn exit_on_lock_contention_stops_nodelet_when_another_process_opens_the_file() {
    let b = Batch::new("lockwatch");
    let lock = b.dir.path().join("nodelet.lock");
    let mut child = b
        .command(&[
            "--lock-file",
            lock.to_str().unwrap(),
            "--exit-on-lock-contention",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually(
        "nodelet to hold the lock",
        Duration::from_secs(30),
        || async { lock_is_held(&lock).then_some(()) },
    )
    .await;
    drop(std::fs::File::open(&lock).unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nodelet did not exit on lock contention"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(0));
    b.finish().await;
}

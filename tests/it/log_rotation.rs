//! Container log rotation against the real runtime: a chatty container's log is rotated by size,
//! no more than --container-log-max-files files are ever kept, and the container goes on writing
//! to the new log the runtime reopens.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::bed::{Node, eventually, pod_yaml};

/// The file names in `dir` (none when it does not exist yet).
fn files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The highest `line <n>` number in a log file (0 when none).
fn last_line_number(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.rsplit_once("line ")?.1.trim().parse().ok())
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn a_chatty_containers_log_is_rotated_and_capped() {
    let node = Node::start(
        "logrotate",
        &[
            "--testing-log-rotation-period=200ms",
            "--container-log-max-size",
            "1Ki",
            "--container-log-max-files",
            "3",
        ],
    )
    .await;
    node.write_manifest(
        "chatty.yaml",
        &pod_yaml(
            "chatty",
            &[(
                "talk",
                "i=0; while true; do i=$((i+1)); echo line $i; sleep 0.02; done",
            )],
            "",
        ),
    );
    let (sandbox, _) = node.wait_running("chatty", 1).await;
    let dir = node
        .pod_logs()
        .join(format!(
            "default_{}_{}",
            node.pod_name("chatty"),
            sandbox.uid.0
        ))
        .join("talk");
    let current = dir.join("0.log");

    // Watch the directory until three rotations happened (so the oldest had to go), checking
    // every listing. A listing taken while a file is renamed may show it twice, so one over
    // the cap is looked at again before it counts.
    let mut rotated_seen = BTreeSet::new();
    eventually(
        "three rotations of the chatty container's log",
        Duration::from_secs(60),
        || {
            let mut listing = files(&dir);
            if listing.len() > 3 {
                listing = files(&dir);
            }
            assert!(
                listing.len() <= 3,
                "more than 3 files for one log: {listing:?}"
            );
            assert!(
                listing
                    .iter()
                    .all(|f| f == "0.log" || f.starts_with("0.log.")),
                "unexpected files: {listing:?}"
            );
            rotated_seen.extend(listing.into_iter().filter(|f| f != "0.log"));
            std::future::ready((rotated_seen.len() >= 3).then_some(()))
        },
    )
    .await;
    let kept = files(&dir);
    let oldest = rotated_seen.first().expect("a rotated file");
    assert!(
        !kept.contains(oldest),
        "{oldest} was never removed: {kept:?}"
    );

    // The container writes to the reopened log: it gets lines newer than any rotated file has.
    let rotated_max = kept
        .iter()
        .filter(|f| *f != "0.log")
        .map(|f| last_line_number(&dir.join(f)))
        .max()
        .unwrap_or(0);
    eventually(
        "newer lines in the current log",
        Duration::from_secs(30),
        || std::future::ready((last_line_number(&current) > rotated_max).then_some(())),
    )
    .await;
    assert!(node.agent_alive());
    node.finish().await;
}

/// CRI log lines decoded into the lines the container wrote: a line the runtime wrote in parts
/// (tag `P`, up to the `F` that ends it) is joined, across files too.
fn texts(log: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut partial = String::new();
    for line in log.lines() {
        let mut fields = line.splitn(4, ' ');
        let (Some(tag), Some(text)) = (fields.nth(2), fields.next()) else {
            continue;
        };
        partial.push_str(text);
        if tag == "F" {
            out.push(std::mem::take(&mut partial));
        }
    }
    out
}

/// Asserts that `who` got exactly the `expected` lines, naming the first one that differs.
fn same_lines(who: &str, got: &[String], expected: &[String]) {
    assert!(
        got == expected,
        "{who}: {} lines for {}, the first wrong one at {:?}",
        got.len(),
        expected.len(),
        got.iter().zip(expected).position(|(a, b)| a != b)
    );
}

/// Rotation loses nothing: a container writes 400 000 numbered lines in bursts while its log is
/// rotated over a hundred times. The rotated files and the live one, in order, hold every line
/// exactly once; no file outgrows the maximum by more than a few checks' worth of writes; a
/// `nodelet logs -f` that follows throughout sees every line; `--tail` reaches back across the
/// rotated files.
#[tokio::test]
async fn rotation_loses_no_line_and_a_follower_sees_them_all() {
    const LINES: u64 = 400_000;
    let max_size: u64 = 64 << 10;
    let node = Node::start(
        "logkeep",
        &[
            "--testing-log-rotation-period=100ms",
            "--container-log-max-size",
            "64Ki",
            "--container-log-max-files",
            "1000",
        ],
    )
    .await;
    node.write_manifest(
        "writer.yaml",
        &pod_yaml(
            "writer",
            &[(
                "w",
                "while [ ! -f /tmp/go ]; do sleep 0.1; done; i=0; while [ $i -lt 200 ]; do seq $((i*2000+1)) $((i*2000+2000)); i=$((i+1)); sleep 0.05; done; while true; do sleep 1; done",
            )],
            "",
        ),
    );
    let (sandbox, containers) = node.wait_running("writer", 1).await;
    let pod = node.pod_name("writer");
    let mut follower = node
        .cli(&["logs", "-f", &pod])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the CLI runs");
    let stdout = follower.stdout.take().expect("the follower's output");
    let followed = tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut seen = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            let last = line == LINES.to_string();
            seen.push(line);
            if last {
                break;
            }
        }
        seen
    });
    node.touch(&containers[0].id, "/tmp/go").await;
    let seen = tokio::time::timeout(Duration::from_secs(120), followed)
        .await
        .expect("the follower saw the last line within 2 minutes")
        .expect("the follower task");
    let _ = follower.kill().await;
    let expected: Vec<String> = (1..=LINES).map(|n| n.to_string()).collect();
    same_lines("the follower", &seen, &expected);

    let dir = node
        .pod_logs()
        .join(format!("default_{pod}_{}", sandbox.uid.0))
        .join("w");
    let names = files(&dir);
    let rotated: Vec<&String> = names.iter().filter(|f| *f != "0.log").collect();
    assert!(rotated.len() >= 100, "only {} rotations", rotated.len());
    let mut raw = String::new();
    for name in rotated
        .iter()
        .copied()
        .chain(std::iter::once(&"0.log".to_string()))
    {
        let path = dir.join(name);
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(
            size <= max_size + (1 << 20),
            "{name} grew to {size} bytes, far past the {max_size} maximum"
        );
        raw.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
    }
    let all = texts(&raw);
    same_lines("the files", &all, &expected);

    let out = node
        .cli(&["logs", &pod, "--tail", "100000"])
        .output()
        .await
        .expect("the CLI runs");
    let tail: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    same_lines(
        "--tail 100000",
        &tail,
        &expected[(LINES as usize - 100_000)..],
    );
    node.finish().await;
}

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
    // SAFETY: nextest runs each test in its own process; set before the agent reads it.
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

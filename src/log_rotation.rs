//! Container log rotation, as upstream's ContainerLogManager: the log of each running container
//! of this node that has reached the maximum size is renamed to
//! `<log>.<UTC time as 20060102-150405>` (with `.001`, `.002`... for more rotations within that
//! second), the runtime is asked to reopen it (so the container writes to a fresh file), and the
//! oldest rotated files are removed so that at most `max_files` files exist per log, the
//! current one included. Nothing written is lost: the runtime writes to the renamed file until
//! it reopens the log. The containers are listed every monitor interval, but their logs' sizes
//! are looked at every second (a stat each, no runtime call), so no file outgrows the maximum
//! by more than a second of writes.
//!
//! Unlike upstream, rotated files are not gzip-compressed: that would need a compression crate
//! for little gain at the default sizes. Rotated `.gz` files an upstream kubelet left are still
//! counted and removed in turn, and its unfinished compressions (`.tmp`, or a plain file beside
//! its `.gz`) are cleaned up as upstream does.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::runtime::{self, ContainerState, RuntimeClient};

/// When a log is rotated and how many of its files are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Bytes at which the current log is rotated.
    pub max_size: u64,
    /// Most files per log, the current one included (at least 2).
    pub max_files: usize,
}

/// What the rotation task needs.
#[derive(Clone, Debug)]
pub struct Config {
    pub policy: Policy,
    /// How often the logs are checked (containerLogMonitorInterval).
    pub interval: Duration,
    /// Only the containers of this node's pods are rotated: other agents may share the runtime.
    pub node_name: String,
}

/// Why one log could not be rotated.
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("{action} {}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the runtime did not reopen the log (it is kept as it was)")]
    Reopen(#[source] runtime::Error),
}

type Result<T, E = Error> = std::result::Result<T, E>;

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        action,
        path,
        source,
    }
}

/// Suffix of a temporary file of an unfinished compression (upstream's).
const TMP_SUFFIX: &str = ".tmp";
/// Suffix of a compressed rotated log (upstream's).
const GZ_SUFFIX: &str = ".gz";

/// How often the listed logs' sizes are looked at (or every interval, when that is shorter).
const SIZE_CHECK: Duration = Duration::from_secs(1);

/// A running container's log, as listed.
struct Log {
    pod: String,
    container: String,
    id: String,
    path: PathBuf,
}

/// Rotates the logs of this node's running containers until `cancel`: lists them every
/// interval, and rotates those that reached the maximum size every [`SIZE_CHECK`]. Failures are
/// logged with the container and the file, and tried again.
pub async fn run(runtime: RuntimeClient, config: Config, cancel: CancellationToken) {
    tracing::info!(
        max_size = config.policy.max_size,
        max_files = config.policy.max_files,
        interval = ?config.interval,
        "container log rotation on"
    );
    let mut ticker = tokio::time::interval(config.interval.min(SIZE_CHECK));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut logs: Vec<Log> = Vec::new();
    let mut listed: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        if listed.is_none_or(|at| at.elapsed() >= config.interval) {
            listed = Some(tokio::time::Instant::now());
            match list(&runtime, &config).await {
                Ok(now) => logs = now,
                Err(e) => {
                    tracing::warn!(error = %crate::types::error_chain(&e), "cannot list the containers whose logs to rotate; trying again next interval")
                }
            }
        }
        for log in &logs {
            rotate_one(&runtime, log, config.policy).await;
        }
    }
}

/// Rotates one listed log if it is full; a failure is logged.
async fn rotate_one(runtime: &RuntimeClient, log: &Log, policy: Policy) {
    let Log {
        pod,
        container,
        id,
        path,
    } = log;
    match rotate(runtime, id, path, policy).await {
        Ok(Some(rotated)) => {
            tracing::debug!(%pod, %container, rotated = %rotated.display(), "container log rotated")
        }
        Ok(None) => {}
        // The container is gone since it was listed.
        Err(Error::Reopen(e)) if e.is_not_found() => {}
        Err(e) => {
            tracing::warn!(%pod, %container, %id, path = %path.display(), error = %crate::types::error_chain(&e), "cannot rotate the container's log; trying again");
        }
    }
}

/// The logs of this node's running containers. A running container's log path is the runtime
/// client's remembered answer, not asked at every listing (with 110 pods that was 11
/// ContainerStatus calls a second at idle).
async fn list(runtime: &RuntimeClient, config: &Config) -> runtime::Result<Vec<Log>> {
    let pods: HashMap<String, String> = runtime
        .list_sandboxes(None)
        .await?
        .into_iter()
        .filter(|sb| sb.owned_by(&config.node_name))
        .map(|sb| (sb.id, format!("{}/{}", sb.namespace, sb.name)))
        .collect();
    let containers = runtime.list_containers(None).await?;
    let mut logs = Vec::new();
    // Only running containers: the others write nothing more, so a fresh empty log would be
    // pointless (upstream's rule).
    for c in containers
        .iter()
        .filter(|c| c.state == ContainerState::Running)
    {
        let Some(pod) = pods.get(&c.sandbox_id) else {
            continue;
        };
        let path = match runtime.log_path(&c.id).await {
            Ok(path) if !path.as_os_str().is_empty() => path,
            Ok(_) => continue,
            // Gone since the listing.
            Err(e) if e.is_not_found() => continue,
            Err(e) => {
                tracing::warn!(%pod, container = %c.name, id = %c.id, error = %crate::types::error_chain(&e), "cannot find the container's log to rotate it; trying again next interval");
                continue;
            }
        };
        logs.push(Log {
            pod: pod.clone(),
            container: c.name.clone(),
            id: c.id.clone(),
            path,
        });
    }
    Ok(logs)
}

/// Rotates the log at `path` of container `id` when it has reached the maximum size; returns
/// the rotated file's path when it did.
async fn rotate(
    runtime: &RuntimeClient,
    id: &str,
    path: &Path,
    policy: Policy,
) -> Result<Option<PathBuf>> {
    match std::fs::symlink_metadata(path) {
        Ok(_) => {}
        // Someone removed the log: a reopen makes the runtime write a new one (as upstream).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            runtime
                .reopen_container_log(id)
                .await
                .map_err(Error::Reopen)?;
        }
        Err(e) => return Err(io("cannot read the size of", path)(e)),
    }
    let Some(rotated) = rename_if_full(path, policy, crate::types::now())? else {
        return Ok(None);
    };
    if let Err(e) = runtime.reopen_container_log(id).await {
        // Put the log back, so nothing is lost and the next interval tries again (as upstream).
        if let Err(back) = std::fs::rename(&rotated, path) {
            tracing::error!(id, rotated = %rotated.display(), path = %path.display(), error = %back,
                "cannot rename the rotated log back after the runtime did not reopen it; the container's output now goes to the rotated file");
        }
        return Err(Error::Reopen(e));
    }
    Ok(Some(rotated))
}

/// The file part of a rotation: when the log at `path` has reached the maximum size, removes
/// the stale files beside it and renames it to its rotated name, which it returns. The caller
/// then has the runtime reopen the log.
fn rename_if_full(
    path: &Path,
    policy: Policy,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<Option<PathBuf>> {
    let size = std::fs::metadata(path)
        .map_err(io("cannot read the size of", path))?
        .len();
    if size < policy.max_size {
        return Ok(None);
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Ok(None);
    };
    let siblings: Vec<String> = std::fs::read_dir(dir)
        .map_err(io("cannot list", dir))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    // More rotations within one second get numbered names (upstream's second overwrites the
    // first one's file).
    let Some(rotated) = rotated_name(name, now, |n| siblings.iter().any(|s| s == n)) else {
        return Ok(None);
    };
    let rotated = dir.join(rotated);
    for stale in stale_files(name, &siblings, policy.max_files) {
        let stale = dir.join(stale);
        match std::fs::remove_file(&stale) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io("cannot remove the old log", &stale)(e));
            }
            _ => {}
        }
    }
    std::fs::rename(path, &rotated).map_err(io("cannot rename", path))?;
    Ok(Some(rotated))
}

/// `<name>.<UTC time as YYYYMMDD-hhmmss>`, or the first of `.001` to `.999` after it that is not
/// `taken` (more rotations within that second): fixed widths, so names sort by age. `None`
/// when every one is taken.
fn rotated_name(
    name: &str,
    now: k8s_openapi::jiff::Timestamp,
    taken: impl Fn(&str) -> bool,
) -> Option<String> {
    let plain = format!("{name}.{}", now.strftime("%Y%m%d-%H%M%S"));
    std::iter::once(plain.clone())
        .chain((1..1000).map(|n| format!("{plain}.{n:03}")))
        .find(|candidate| !taken(candidate))
}

/// The files beside the log `name` (in `siblings`) to remove before it is rotated: what an
/// unfinished compression left (`.tmp` files, plain files beside their `.gz`), then the oldest
/// rotated files, so that together with the file about to be rotated and the new current log
/// at most `max_files` remain.
fn stale_files(name: &str, siblings: &[String], max_files: usize) -> Vec<String> {
    let prefix = format!("{name}.");
    let rotated: HashSet<&str> = siblings
        .iter()
        .map(String::as_str)
        .filter(|s| s.starts_with(&prefix))
        .collect();
    let (mut kept, mut stale): (Vec<&str>, Vec<&str>) = rotated.iter().partition(|s| {
        !s.ends_with(TMP_SUFFIX)
            && (s.ends_with(GZ_SUFFIX) || !rotated.contains(format!("{s}{GZ_SUFFIX}").as_str()))
    });
    kept.sort_unstable();
    stale.sort_unstable();
    let excess = kept.len().saturating_sub(max_files.saturating_sub(2));
    stale.extend(kept.drain(..excess));
    stale.into_iter().map(str::to_string).collect()
}

/// Removes a container's log and its rotated files, when the container itself is removed
/// (upstream's Clean). Failures are logged: a leftover file is harmless.
pub fn remove_logs(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let prefix = format!("{name}.");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let file = file.to_string_lossy();
        if file == name || file.starts_with(&prefix) {
            let target = entry.path();
            if let Err(e) = std::fs::remove_file(&target)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %target.display(), error = %e, "cannot remove a container log");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn rotated_names_carry_the_utc_time_and_sort_by_age() {
        let at = |secs: i64| k8s_openapi::jiff::Timestamp::from_second(secs).unwrap();
        let free = |_: &str| false;
        let name = |secs| rotated_name("0.log", at(secs), free).unwrap();
        assert_eq!(name(0), "0.log.19700101-000000");
        assert_eq!(
            rotated_name("3.log", at(1_700_000_000), free).as_deref(),
            Some("3.log.20231114-221320")
        );
        assert!(name(59) < name(60));
        // More rotations within a second are numbered, and still sort by age.
        let taken = ["0.log.19700101-000059", "0.log.19700101-000059.001"];
        let third = rotated_name("0.log", at(59), |n| taken.contains(&n)).unwrap();
        assert_eq!(third, "0.log.19700101-000059.002");
        assert!(taken[1] < third.as_str() && third < name(60));
    }

    #[test]
    fn the_oldest_rotated_files_go_so_that_max_files_remain() {
        let siblings = names(&[
            "0.log",
            "0.log.20240101-000003",
            "0.log.20240101-000001",
            "0.log.20240101-000002",
            "1.log",
            "1.log.20240101-000000",
            "10.log.20240101-000000",
        ]);
        // Five files at most: the current log, the one about to be rotated, three older ones.
        assert!(stale_files("0.log", &siblings, 5).is_empty());
        // Three: one older file stays.
        assert_eq!(
            stale_files("0.log", &siblings, 3),
            names(&["0.log.20240101-000001", "0.log.20240101-000002"])
        );
        // Two: no older file stays; other logs of the container are never touched.
        assert_eq!(
            stale_files("0.log", &siblings, 2),
            names(&[
                "0.log.20240101-000001",
                "0.log.20240101-000002",
                "0.log.20240101-000003"
            ])
        );
    }

    #[test]
    fn leftovers_of_upstream_compression_are_removed_and_gz_files_count() {
        let siblings = names(&[
            "0.log",
            "0.log.20240101-000001.gz",
            "0.log.20240101-000002",
            "0.log.20240101-000002.gz",
            "0.log.20240101-000003.tmp",
            "0.log.20240101-000004",
        ]);
        assert_eq!(
            stale_files("0.log", &siblings, 4),
            names(&[
                "0.log.20240101-000002",
                "0.log.20240101-000003.tmp",
                "0.log.20240101-000001.gz"
            ])
        );
    }

    fn files_in(dir: &Path) -> Vec<String> {
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        files
    }

    #[test]
    fn a_full_log_is_renamed_and_the_oldest_rotated_files_removed() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        for f in ["0.log.20240101-000001", "0.log.20240101-000002", "1.log"] {
            std::fs::write(dir.path().join(f), "old").unwrap();
        }
        std::fs::write(&log, "x".repeat(100)).unwrap();
        let policy = Policy {
            max_size: 100,
            max_files: 3,
        };
        let now = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap();

        let rotated = rename_if_full(&log, policy, now).unwrap();
        assert_eq!(rotated, Some(dir.path().join("0.log.20231114-221320")));
        // With the new log the runtime opens, three files: the current one and two rotated.
        assert_eq!(
            files_in(dir.path()),
            names(&["0.log.20231114-221320", "0.log.20240101-000002", "1.log"])
        );

        // A log below the size is left alone; a second rotation within the second is numbered.
        std::fs::write(&log, "x".repeat(99)).unwrap();
        assert_eq!(rename_if_full(&log, policy, now).unwrap(), None);
        std::fs::write(&log, "x".repeat(200)).unwrap();
        assert_eq!(
            rename_if_full(&log, policy, now).unwrap(),
            Some(dir.path().join("0.log.20231114-221320.001"))
        );
        assert_eq!(
            files_in(dir.path()),
            names(&[
                "0.log.20231114-221320.001",
                "0.log.20240101-000002",
                "1.log"
            ])
        );
    }

    #[test]
    fn removing_a_containers_logs_takes_the_rotated_files_too() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["0.log", "0.log.20240101-000001", "1.log", "10.log"] {
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        remove_logs(&dir.path().join("0.log"));
        assert_eq!(files_in(dir.path()), names(&["1.log", "10.log"]));
    }
}

//! Storage figures of the Summary API: each pod's volumes, its containers' logs and its
//! ephemeral storage, counted like `du` over their files, with capacities from statvfs.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::host::{FsStats, fs_stats};

/// Bytes and inodes in use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Usage {
    bytes: u64,
    inodes: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.bytes += other.bytes;
        self.inodes += other.inodes;
    }
}

/// What everything below `path` (itself included) uses, as `du -x` and `find -xdev` count it
/// for upstream: allocated blocks, each inode once (hard links too), symlinks not followed,
/// other filesystems not entered.
fn usage(path: &Path) -> Usage {
    let Ok(root) = std::fs::symlink_metadata(path) else {
        return Usage::default();
    };
    let mut seen = HashSet::new();
    let mut total = Usage::default();
    let mut pending = vec![(path.to_path_buf(), root.clone())];
    while let Some((path, meta)) = pending.pop() {
        if meta.dev() != root.dev() || !seen.insert(meta.ino()) {
            continue;
        }
        total += Usage {
            bytes: meta.blocks() * 512,
            inodes: 1,
        };
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                // DirEntry::metadata does not follow symlinks.
                if let Ok(meta) = entry.metadata() {
                    pending.push((entry.path(), meta));
                }
            }
        }
    }
    total
}

/// What the files directly in `dir` use (subdirectories left out), as upstream counts a log
/// directory.
fn files_usage(dir: &Path) -> Usage {
    let mut total = Usage::default();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if let Ok(meta) = entry.metadata()
            && !meta.is_dir()
        {
            total += Usage {
                bytes: meta.blocks() * 512,
                inodes: 1,
            };
        }
    }
    total
}

/// The Summary API's FsStats: `used` on the filesystem `fs`.
fn fs_json(fs: Option<FsStats>, used: Usage, time: &str) -> Value {
    let mut out = json!({
        "time": time,
        "usedBytes": used.bytes,
        "inodesUsed": used.inodes,
    });
    if let Some(fs) = fs {
        out["availableBytes"] = json!(fs.available);
        out["capacityBytes"] = json!(fs.capacity);
        out["inodes"] = json!(fs.inodes);
        out["inodesFree"] = json!(fs.inodes_free);
    }
    out
}

fn fs_of(path: &Path) -> Option<FsStats> {
    fs_stats(&*path.to_string_lossy())
}

/// Where one pod's files are.
pub(super) struct PodFiles<'a> {
    /// The pod as last synced (its volumes); `None` for a pod nodelet does not know.
    pub pod: Option<&'a Pod>,
    pub uid: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub root_dir: &'a Path,
    pub pod_logs_dir: &'a Path,
}

impl PodFiles<'_> {
    /// `<pod-logs-dir>/<namespace>_<name>_<uid>`, the kubelet's pod log directory.
    fn log_dir(&self) -> PathBuf {
        self.pod_logs_dir
            .join(format!("{}_{}_{}", self.namespace, self.name, self.uid))
    }
}

/// What the log directory of each container with a status in `pods` uses, in bytes, by
/// (uid, namespace, pod, container); containers without a log directory are left out.
pub(super) fn log_usage(
    root_dir: &Path,
    pod_logs_dir: &Path,
    pods: &[crate::status::Entry],
) -> Vec<([String; 4], u64)> {
    let mut out = Vec::new();
    for entry in pods {
        let pod = &*entry.pod;
        let namespace = crate::types::namespace(pod);
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let files = PodFiles {
            pod: Some(pod),
            uid,
            name,
            namespace,
            root_dir,
            pod_logs_dir,
        };
        let log_dir = files.log_dir();
        let statuses = pod.status.iter().flat_map(|s| {
            [
                &s.init_container_statuses,
                &s.container_statuses,
                &s.ephemeral_container_statuses,
            ]
        });
        for c in statuses.flatten().flatten() {
            let dir = log_dir.join(&c.name);
            if dir.is_dir() {
                let labels = [uid, namespace, name, &c.name].map(String::from);
                out.push((labels, files_usage(&dir).bytes));
            }
        }
    }
    out
}

/// A pod's storage figures: `logs` added to each of its `containers` entries, and the pod's
/// `volume` list and `ephemeral-storage` returned. Ephemeral storage is upstream's sum: the
/// containers' writable layers and logs, the volumes on the node's disk (emptyDir, configMap),
/// the pod's own log files and its managed hosts file, on the root directory's filesystem.
pub(super) fn pod_stats(
    files: &PodFiles<'_>,
    containers: &mut [Value],
    time: &str,
) -> (Value, Value) {
    let log_dir = files.log_dir();
    let logs_fs = fs_of(files.pod_logs_dir);
    let mut ephemeral = Usage::default();
    let mut counted_logs = HashSet::new();
    for c in containers.iter_mut() {
        let name = c["name"].as_str().unwrap_or_default().to_string();
        let logs = files_usage(&log_dir.join(&name));
        // Several entries (restarts) share one log directory: count it once.
        if counted_logs.insert(name) {
            ephemeral += logs;
        }
        ephemeral += Usage {
            bytes: c["rootfs"]["usedBytes"].as_u64().unwrap_or(0),
            inodes: c["rootfs"]["inodesUsed"].as_u64().unwrap_or(0),
        };
        c["logs"] = fs_json(logs_fs, logs, time);
    }
    let pod_dir = crate::volumes::pod_dir(files.root_dir, files.uid);
    let mut volumes = Vec::new();
    let specs = files.pod.and_then(|p| p.spec.as_ref()?.volumes.as_ref());
    for v in specs.into_iter().flatten() {
        let Some(dir) = crate::volumes::volume_dir(&pod_dir, v) else {
            continue;
        };
        if !dir.path.exists() {
            continue;
        }
        let started = std::time::Instant::now();
        let used = usage(&dir.path);
        crate::metrics::get().volume_stats_measured(started.elapsed());
        if !dir.tmpfs {
            ephemeral += used;
        }
        let mut stats = fs_json(fs_of(&dir.path), used, time);
        stats["name"] = json!(v.name);
        volumes.push(stats);
    }
    ephemeral += files_usage(&log_dir);
    ephemeral += usage(&pod_dir.join("etc-hosts"));
    let ephemeral = fs_json(fs_of(files.root_dir), ephemeral, time);
    (Value::Array(volumes), ephemeral)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_blocks_and_inodes_once_without_following_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("a"), vec![7u8; 100_000]).unwrap();
        std::fs::hard_link(data.join("a"), data.join("b")).unwrap();
        std::os::unix::fs::symlink("/usr", data.join("usr")).unwrap();
        let used = usage(dir.path());
        // The two directories, the file (once) and the symlink.
        assert_eq!(used.inodes, 4);
        assert!(used.bytes >= 100_000, "{used:?}");
        assert!(used.bytes < 1_000_000, "{used:?}");
        assert_eq!(usage(&dir.path().join("missing")), Usage::default());
    }

    #[test]
    fn a_pods_volumes_logs_and_ephemeral_storage_add_up() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let logs = dir.path().join("logs");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [], "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "host", "hostPath": {"path": "/tmp"}},
                {"name": "never-made", "configMap": {"name": "x"}},
            ]},
        }))
        .unwrap();
        let scratch = root.join("pods/u1/volumes/kubernetes.io~empty-dir/scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        std::fs::write(scratch.join("f"), vec![1u8; 50_000]).unwrap();
        let c_logs = logs.join("ns_p_u1/c");
        std::fs::create_dir_all(&c_logs).unwrap();
        std::fs::write(c_logs.join("0.log"), vec![2u8; 20_000]).unwrap();
        std::fs::write(c_logs.join("0.log.20240101-000000"), vec![2u8; 20_000]).unwrap();
        let files = PodFiles {
            pod: Some(&pod),
            uid: "u1",
            name: "p",
            namespace: "ns",
            root_dir: &root,
            pod_logs_dir: &logs,
        };
        let mut containers = vec![
            json!({"name": "c", "rootfs": {"usedBytes": 1000, "inodesUsed": 3}}),
            json!({"name": "c", "rootfs": {"usedBytes": 500, "inodesUsed": 1}}),
        ];
        let (volumes, ephemeral) = pod_stats(&files, &mut containers, "t");

        let logs_used = containers[0]["logs"]["usedBytes"].as_u64().unwrap();
        assert!(logs_used >= 40_000, "{containers:?}");
        assert_eq!(containers[0]["logs"]["inodesUsed"], 2);
        assert!(containers[1]["logs"]["capacityBytes"].as_u64().unwrap() > 0);

        let volumes = volumes.as_array().unwrap();
        assert_eq!(volumes.len(), 1, "{volumes:?}");
        assert_eq!(volumes[0]["name"], "scratch");
        let volume_used = volumes[0]["usedBytes"].as_u64().unwrap();
        assert!(volume_used >= 50_000, "{volumes:?}");
        assert_eq!(volumes[0]["inodesUsed"], 2);
        assert!(volumes[0]["availableBytes"].as_u64().unwrap() > 0);

        // Both writable layers, the log directory once, the emptyDir.
        assert_eq!(
            ephemeral["usedBytes"].as_u64().unwrap(),
            1500 + logs_used + volume_used
        );
        assert_eq!(ephemeral["inodesUsed"], 4 + 2 + 2);
        assert!(ephemeral["capacityBytes"].as_u64().unwrap() > 0);
    }
}

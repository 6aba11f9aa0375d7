//! Pressure stall information (PSI): the share of time tasks waited for CPU, memory or I/O. The
//! node's is in /proc/pressure; each cgroup's is on the unified hierarchy, which hybrid hosts
//! mount beside the v1 controllers (runc makes every pod and container cgroup there too).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One line of a pressure file: the stall's running averages (percent) and total (µs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stall {
    pub total: u64,
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
}

/// A pressure file: some tasks stalled, and all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Psi {
    pub some: Stall,
    pub full: Stall,
}

/// The CPU, memory and I/O pressure of the node or of one cgroup; `None` where unreadable.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pressure {
    pub cpu: Option<Psi>,
    pub memory: Option<Psi>,
    pub io: Option<Psi>,
}

/// Each pod's and each container's pressure, by pod UID and by container ID; and, read in the
/// same walk, each pod's process count (the members of its cgroup and every cgroup below it).
#[derive(Debug, Default)]
pub struct Pressures {
    pub pods: HashMap<String, Pressure>,
    pub containers: HashMap<String, Pressure>,
    pub processes: HashMap<String, u64>,
}

/// Parses a pressure file (`some avg10=.. avg60=.. avg300=.. total=..`, then `full ...`). A
/// kernel without `full` for CPU leaves it zero, as upstream shows it.
pub fn parse(text: &str) -> Option<Psi> {
    let mut psi = Psi::default();
    let mut some = false;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let stall = match words.next() {
            Some("some") => {
                some = true;
                &mut psi.some
            }
            Some("full") => &mut psi.full,
            _ => continue,
        };
        for word in words {
            let Some((key, value)) = word.split_once('=') else {
                continue;
            };
            match key {
                "total" => stall.total = value.parse().ok()?,
                "avg10" => stall.avg10 = value.parse().ok()?,
                "avg60" => stall.avg60 = value.parse().ok()?,
                "avg300" => stall.avg300 = value.parse().ok()?,
                _ => {}
            }
        }
    }
    some.then_some(psi)
}

fn read(path: &Path) -> Option<Psi> {
    parse(&std::fs::read_to_string(path).ok()?)
}

/// The node's pressure.
pub fn node() -> Pressure {
    let dir = Path::new("/proc/pressure");
    Pressure {
        cpu: read(&dir.join("cpu")),
        memory: read(&dir.join("memory")),
        io: read(&dir.join("io")),
    }
}

/// The pressure of the cgroup at `dir` (a directory of the unified hierarchy).
fn of_dir(dir: &Path) -> Pressure {
    Pressure {
        cpu: read(&dir.join("cpu.pressure")),
        memory: read(&dir.join("memory.pressure")),
        io: read(&dir.join("io.pressure")),
    }
}

/// The unified hierarchy's mount on this host, if it has one (found once: mounts are read
/// from /proc/self/mountinfo, too dear for every scrape).
fn unified_mount() -> Option<&'static Path> {
    static MOUNT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    MOUNT
        .get_or_init(|| {
            super::usage::host_mounts()
                .into_iter()
                .find(|m| m.v2)
                .map(|m| m.point)
        })
        .as_deref()
}

/// The pressure of each cgroup of `paths` (absolute cgroup names); `None` for one that cannot
/// be read.
pub fn of(paths: &[&str]) -> Vec<Option<Pressure>> {
    let mount = unified_mount();
    paths
        .iter()
        .map(|path| {
            let dir = mount?.join(path.trim_start_matches('/'));
            Some(of_dir(&dir)).filter(|p| p.cpu.is_some() || p.memory.is_some())
        })
        .collect()
}

/// The pressure of the agent's own cgroup on the unified hierarchy (`0::` in /proc/self/cgroup).
pub fn own() -> Option<Pressure> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    of(&[path]).pop().flatten()
}

/// The members of the cgroup at `dir`.
fn members(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("cgroup.procs")).map_or(0, |p| p.lines().count() as u64)
}

/// The processes in the cgroup at `dir` and in every cgroup below it (at most `depth` deep).
fn processes(dir: &Path, depth: usize) -> u64 {
    let below = std::fs::read_dir(dir).into_iter().flatten().flatten();
    let below: u64 = below
        .filter(|e| depth > 0 && e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| processes(&e.path(), depth - 1))
        .sum();
    members(dir) + below
}

/// The pod UID a pod cgroup's name holds: `pod<uid>` (cgroupfs) or `...-pod<uid>.slice`
/// (systemd, with `_` for `-`).
fn pod_uid(name: &str) -> Option<String> {
    let slice = name.strip_suffix(".slice");
    let rest = match slice {
        Some(s) => s.rsplit_once("-pod")?.1,
        None => name.strip_prefix("pod")?,
    };
    let uid = rest.replace('_', "-");
    (!uid.is_empty() && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')).then_some(uid)
}

/// The container ID a container cgroup's name holds: the ID itself (cgroupfs) or
/// `<runtime>-<id>.scope` (systemd).
fn container_id(name: &str) -> Option<&str> {
    let id = match name.strip_suffix(".scope") {
        Some(scope) => scope.rsplit_once('-')?.1,
        None => name,
    };
    (id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())).then_some(id)
}

/// Every pod and container cgroup under `pods` (the cgroup the pods live in, QoS tiers below
/// it) on the unified hierarchy, with its pressure, and each pod's process count.
pub fn pods(pods: &str) -> Pressures {
    let mut out = Pressures::default();
    let Some(mount) = unified_mount() else {
        return out;
    };
    let root = mount.join(pods.trim_start_matches('/'));
    let subdirs = |dir: &Path| -> Vec<(String, PathBuf)> {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Pods are children of the root or of a QoS tier; their containers are their children.
    let mut candidates = subdirs(&root);
    let tiers: Vec<(String, PathBuf)> = candidates
        .iter()
        .filter(|(name, _)| pod_uid(name).is_none())
        .cloned()
        .collect();
    for (_, tier) in tiers {
        candidates.extend(subdirs(&tier));
    }
    for (name, dir) in candidates {
        let Some(uid) = pod_uid(&name) else { continue };
        let mut count = members(&dir);
        for (child, child_dir) in subdirs(&dir) {
            if let Some(id) = container_id(&child) {
                out.containers.insert(id.to_string(), of_dir(&child_dir));
            }
            count += processes(&child_dir, 3);
        }
        out.processes.insert(uid.clone(), count);
        out.pods.insert(uid, of_dir(&dir));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_files_parse_with_and_without_full() {
        let psi = parse(
            "some avg10=1.81 avg60=0.32 avg300=0.06 total=219895\nfull avg10=1.50 avg60=0.30 avg300=0.05 total=213047\n",
        )
        .expect("parses");
        assert_eq!(psi.some.total, 219895);
        assert_eq!(psi.some.avg10, 1.81);
        assert_eq!(psi.full.avg300, 0.05);
        let cpu = parse("some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n").expect("parses");
        assert_eq!(cpu.some.total, 7);
        assert_eq!(cpu.full, Stall::default());
        assert_eq!(parse(""), None);
        assert_eq!(parse("some avg10=x total=1"), None);
    }

    #[test]
    fn pod_and_container_cgroups_are_known_by_their_names() {
        let uid = "3ac8e83d-9508-ec20-de5e-ba2121f65d03";
        assert_eq!(pod_uid(&format!("pod{uid}")).as_deref(), Some(uid));
        assert_eq!(
            pod_uid(&format!(
                "kubepods-besteffort-pod{}.slice",
                uid.replace('-', "_")
            ))
            .as_deref(),
            Some(uid)
        );
        assert_eq!(pod_uid("besteffort"), None);
        assert_eq!(pod_uid("kubepods-besteffort.slice"), None);
        let id = "8547bd923ff86594621e4a2e6606d0b3dd09b6d6e1255640c915432751161cb7";
        assert_eq!(container_id(id), Some(id));
        assert_eq!(
            container_id(&format!("cri-containerd-{id}.scope")),
            Some(id)
        );
        assert_eq!(container_id("burstable"), None);
    }
}

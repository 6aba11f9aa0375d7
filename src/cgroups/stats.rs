//! Everything a cgroup accounts, as cAdvisor reads it for the kubelet's `/metrics/cadvisor`:
//! CPU, memory, block I/O, tasks and the limits set on it, from cgroup v1's controller
//! hierarchies or the unified v2 one, and its processes' open files from /proc. A file that is
//! missing or unreadable counts as zero, as cAdvisor counts it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::usage::{Mount, host_mounts, mount_of};

/// CPU time and throttling, in nanoseconds and CFS periods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cpu {
    pub usage_ns: u64,
    pub user_ns: u64,
    pub system_ns: u64,
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
    pub bursts: u64,
    pub burst_ns: u64,
}

/// Memory use in bytes, page faults and OOM kills.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    pub usage: u64,
    pub max_usage: u64,
    pub cache: u64,
    pub rss: u64,
    pub kernel: u64,
    pub mapped_file: u64,
    pub swap: u64,
    pub failcnt: u64,
    pub working_set: u64,
    pub active_file: u64,
    pub inactive_file: u64,
    /// Page faults of this cgroup's own tasks, and of its whole subtree (v2 counts only the
    /// subtree, so both are the same there).
    pub faults: (u64, u64),
    pub major_faults: (u64, u64),
    pub oom_kills: u64,
}

/// One block device's I/O: bytes and operations by kind (`Read`, `Write`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceIo {
    pub major: u64,
    pub minor: u64,
    /// `/dev/<name>` as the kernel names the device; empty if unknown.
    pub device: String,
    pub bytes: Vec<(String, u64)>,
    pub ops: Vec<(String, u64)>,
}

impl DeviceIo {
    /// The bytes or operations of `kind` (zero if not counted).
    pub fn of(counts: &[(String, u64)], kind: &str) -> u64 {
        counts
            .iter()
            .find(|(k, _)| k == kind)
            .map_or(0, |(_, v)| *v)
    }
}

/// The limits set on the cgroup. Memory values as the kernel reports them: cgroup v1's
/// "unlimited" is its largest page-aligned value, v2's `max` is `u64::MAX`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spec {
    pub cpu_shares: u64,
    pub cpu_period: u64,
    /// Zero when there is no quota.
    pub cpu_quota: u64,
    pub memory_limit: u64,
    pub swap_limit: u64,
    pub memory_reservation: u64,
}

/// Threads by state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tasks {
    pub sleeping: u64,
    pub running: u64,
    pub stopped: u64,
    pub uninterruptible: u64,
}

/// What one cgroup accounts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub cpu: Cpu,
    pub memory: Memory,
    pub io: Vec<DeviceIo>,
    pub spec: Spec,
    pub threads: u64,
    /// Zero when unlimited.
    pub threads_max: u64,
    /// The cgroup's own threads by state: sleeping, running, stopped, uninterruptible (as
    /// /proc/<tid>/stat gives them).
    pub tasks: Tasks,
    /// The processes in the cgroup itself, their open files and sockets.
    pub processes: u64,
    pub fds: u64,
    pub sockets: u64,
    /// The soft open-files limit of the cgroup's first process, when asked for (-1:
    /// unlimited).
    pub open_files_soft: Option<i64>,
    /// The first process in the cgroup (a container's own process, as the runtime started it
    /// first).
    pub first_process: Option<u32>,
    /// When the cgroup was made (its directories' oldest change), in Unix seconds.
    pub created: Option<i64>,
}

/// The host's cgroup hierarchies, found once for many reads.
pub struct Reader {
    v2: bool,
    cpu: Option<PathBuf>,
    cpuacct: Option<PathBuf>,
    memory: Option<PathBuf>,
    blkio: Option<PathBuf>,
    pids: Option<PathBuf>,
    /// Block device names by (major, minor), looked up once per reader.
    devices: std::cell::RefCell<HashMap<(u64, u64), String>>,
}

impl Reader {
    /// This host's hierarchies.
    pub fn host() -> Reader {
        Reader::of(&host_mounts())
    }

    fn of(mounts: &[Mount]) -> Reader {
        let point = |controller: &str| mount_of(mounts, controller).map(|m| m.point);
        let io = mount_of(mounts, "io").or_else(|| mount_of(mounts, "blkio"));
        Reader {
            v2: mount_of(mounts, "memory").is_some_and(|m| m.v2),
            cpu: point("cpu"),
            cpuacct: point("cpuacct").or_else(|| point("cpu")),
            memory: point("memory"),
            blkio: io.map(|m| m.point),
            pids: point("pids"),
            devices: Default::default(),
        }
    }

    /// The cgroups below `path` (relative to the hierarchies), each parent before its children, as paths of the
    /// same form.
    pub fn descendants(&self, path: &str) -> Vec<String> {
        let Some(root) = self.memory.as_ref().or(self.cpu.as_ref()) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        let mut next = vec![path.trim_end_matches('/').to_string()];
        while let Some(parent) = next.pop() {
            let Ok(entries) = std::fs::read_dir(root.join(parent.trim_start_matches('/'))) else {
                continue;
            };
            for entry in entries.flatten() {
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                if let Some(name) = entry.file_name().to_str() {
                    let child = format!("{parent}/{name}");
                    found.push(child.clone());
                    next.push(child);
                }
            }
        }
        found
    }

    /// What the cgroup at `path` accounts; `None` once it is gone. `ulimits`: also read its
    /// first process's open-files limit.
    pub fn read(&self, path: &str, ulimits: bool) -> Option<Stats> {
        let at =
            |point: &Option<PathBuf>| point.as_ref().map(|p| p.join(path.trim_start_matches('/')));
        let memory = at(&self.memory)?;
        if !memory.is_dir() {
            return None;
        }
        let cpu = at(&self.cpu).unwrap_or_else(|| memory.clone());
        let cpuacct = at(&self.cpuacct).unwrap_or_else(|| cpu.clone());
        let pids = at(&self.pids).unwrap_or_else(|| memory.clone());
        let procs = read_pids(&cpu, "cgroup.procs");
        let mut stats = Stats {
            cpu: self.cpu_stats(&cpu, &cpuacct),
            memory: self.memory_stats(&memory),
            io: at(&self.blkio).map_or_else(Vec::new, |dir| self.io_stats(&dir)),
            spec: self.spec(&cpu, &memory),
            threads: num(&pids, "pids.current"),
            threads_max: match num(&pids, "pids.max") {
                u64::MAX => 0,
                max => max,
            },
            processes: procs.len() as u64,
            first_process: procs.first().copied(),
            created: [&cpu, &memory]
                .iter()
                .filter_map(|d| d.metadata().ok()?.modified().ok())
                .min()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs() as i64),
            ..Stats::default()
        };
        let threads = if self.v2 { "cgroup.threads" } else { "tasks" };
        for tid in read_pids(&cpu, threads) {
            let stat = std::fs::read_to_string(format!("/proc/{tid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            let t = &mut stats.tasks;
            match state {
                Some('R') => t.running += 1,
                Some('S' | 'I') => t.sleeping += 1,
                Some('D') => t.uninterruptible += 1,
                Some('T' | 't') => t.stopped += 1,
                _ => {}
            }
        }
        for pid in &procs {
            let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
                continue;
            };
            for fd in fds.flatten() {
                stats.fds += 1;
                let socket = std::fs::read_link(fd.path())
                    .is_ok_and(|l| l.to_string_lossy().starts_with("socket"));
                stats.sockets += u64::from(socket);
            }
        }
        if ulimits {
            stats.open_files_soft = procs.first().and_then(|pid| {
                let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
                open_files_soft(&limits)
            });
        }
        Some(stats)
    }

    fn cpu_stats(&self, cpu: &Path, cpuacct: &Path) -> Cpu {
        let stat = keyed(cpu, "cpu.stat");
        if self.v2 {
            return Cpu {
                usage_ns: stat.get("usage_usec").copied().unwrap_or(0) * 1000,
                user_ns: stat.get("user_usec").copied().unwrap_or(0) * 1000,
                system_ns: stat.get("system_usec").copied().unwrap_or(0) * 1000,
                periods: stat.get("nr_periods").copied().unwrap_or(0),
                throttled_periods: stat.get("nr_throttled").copied().unwrap_or(0),
                throttled_ns: stat.get("throttled_usec").copied().unwrap_or(0) * 1000,
                bursts: stat.get("nr_bursts").copied().unwrap_or(0),
                burst_ns: stat.get("burst_usec").copied().unwrap_or(0) * 1000,
            };
        }
        // cpuacct.stat counts USER_HZ ticks, 100 a second on Linux.
        let ticks = keyed(cpuacct, "cpuacct.stat");
        Cpu {
            usage_ns: num(cpuacct, "cpuacct.usage"),
            user_ns: ticks.get("user").copied().unwrap_or(0) * 10_000_000,
            system_ns: ticks.get("system").copied().unwrap_or(0) * 10_000_000,
            periods: stat.get("nr_periods").copied().unwrap_or(0),
            throttled_periods: stat.get("nr_throttled").copied().unwrap_or(0),
            throttled_ns: stat.get("throttled_time").copied().unwrap_or(0),
            bursts: stat.get("nr_bursts").copied().unwrap_or(0),
            burst_ns: stat.get("burst_time").copied().unwrap_or(0),
        }
    }

    fn memory_stats(&self, dir: &Path) -> Memory {
        let stat = keyed(dir, "memory.stat");
        let get = |key: &str| stat.get(key).copied().unwrap_or(0);
        if self.v2 {
            let usage = num(dir, "memory.current");
            let events = keyed(dir, "memory.events");
            return Memory {
                usage,
                max_usage: num(dir, "memory.peak"),
                cache: get("file"),
                rss: get("anon"),
                kernel: get("kernel"),
                mapped_file: get("file_mapped"),
                swap: num(dir, "memory.swap.current"),
                failcnt: events.get("max").copied().unwrap_or(0),
                working_set: usage.saturating_sub(get("inactive_file")),
                active_file: get("active_file"),
                inactive_file: get("inactive_file"),
                faults: (get("pgfault"), get("pgfault")),
                major_faults: (get("pgmajfault"), get("pgmajfault")),
                oom_kills: events.get("oom_kill").copied().unwrap_or(0),
            };
        }
        let usage = num(dir, "memory.usage_in_bytes");
        let with_swap = num(dir, "memory.memsw.usage_in_bytes");
        Memory {
            usage,
            max_usage: num(dir, "memory.max_usage_in_bytes"),
            cache: get("total_cache"),
            rss: get("total_rss"),
            kernel: num(dir, "memory.kmem.usage_in_bytes"),
            mapped_file: get("total_mapped_file"),
            swap: with_swap.saturating_sub(usage),
            failcnt: num(dir, "memory.failcnt"),
            working_set: usage.saturating_sub(get("total_inactive_file")),
            active_file: get("total_active_file"),
            inactive_file: get("total_inactive_file"),
            faults: (get("pgfault"), get("total_pgfault")),
            major_faults: (get("pgmajfault"), get("total_pgmajfault")),
            oom_kills: keyed(dir, "memory.oom_control")
                .get("oom_kill")
                .copied()
                .unwrap_or(0),
        }
    }

    fn io_stats(&self, dir: &Path) -> Vec<DeviceIo> {
        // (major, minor, kind, value, whether bytes or operations)
        let mut counts: Vec<(u64, u64, String, u64, bool)> = Vec::new();
        if self.v2 {
            let text = std::fs::read_to_string(dir.join("io.stat")).unwrap_or_default();
            for (major, minor, fields) in text.lines().filter_map(v2_io_line) {
                for (key, value) in fields {
                    let (kind, bytes) = match key {
                        "rbytes" => ("Read", true),
                        "wbytes" => ("Write", true),
                        "dbytes" => ("Discard", true),
                        "rios" => ("Read", false),
                        "wios" => ("Write", false),
                        "dios" => ("Discard", false),
                        _ => continue,
                    };
                    counts.push((major, minor, kind.to_string(), value, bytes));
                }
            }
        } else {
            for (file, bytes) in [("io_service_bytes", true), ("io_serviced", false)] {
                // The throttling policy counts every device; the older CFQ files only its own.
                let text = [
                    format!("blkio.throttle.{file}_recursive"),
                    format!("blkio.throttle.{file}"),
                    format!("blkio.{file}_recursive"),
                ]
                .iter()
                .filter_map(|f| std::fs::read_to_string(dir.join(f)).ok())
                .find(|t| t.lines().any(|l| v1_io_line(l).is_some()))
                .unwrap_or_default();
                for (major, minor, kind, value) in text.lines().filter_map(v1_io_line) {
                    counts.push((major, minor, kind.to_string(), value, bytes));
                }
            }
        }
        let mut devices: Vec<DeviceIo> = Vec::new();
        for (major, minor, kind, value, bytes) in counts {
            let i = match devices
                .iter()
                .position(|d| (d.major, d.minor) == (major, minor))
            {
                Some(i) => i,
                None => {
                    devices.push(DeviceIo {
                        major,
                        minor,
                        device: self
                            .devices
                            .borrow_mut()
                            .entry((major, minor))
                            .or_insert_with(|| device_name(major, minor))
                            .clone(),
                        ..DeviceIo::default()
                    });
                    devices.len() - 1
                }
            };
            let device = &mut devices[i];
            let list = if bytes {
                &mut device.bytes
            } else {
                &mut device.ops
            };
            list.push((kind, value));
        }
        devices
    }

    fn spec(&self, cpu: &Path, memory: &Path) -> Spec {
        if self.v2 {
            let max = std::fs::read_to_string(cpu.join("cpu.max")).unwrap_or_default();
            let mut parts = max.split_whitespace();
            let quota = parts.next().and_then(|q| q.parse().ok()).unwrap_or(0);
            let period = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
            let weight = num(cpu, "cpu.weight");
            return Spec {
                // cpu.weight (1..10000) back to cpu.shares (2..262144).
                cpu_shares: if (1..=10_000).contains(&weight) {
                    2 + ((weight - 1) * 262_142) / 9999
                } else {
                    0
                },
                cpu_period: period,
                cpu_quota: quota,
                memory_limit: num(memory, "memory.max"),
                swap_limit: num(memory, "memory.swap.max"),
                memory_reservation: num(memory, "memory.min"),
            };
        }
        let quota = std::fs::read_to_string(cpu.join("cpu.cfs_quota_us")).unwrap_or_default();
        Spec {
            cpu_shares: num(cpu, "cpu.shares"),
            cpu_period: num(cpu, "cpu.cfs_period_us"),
            cpu_quota: quota.trim().parse().unwrap_or(0),
            memory_limit: num(memory, "memory.limit_in_bytes"),
            swap_limit: num(memory, "memory.memsw.limit_in_bytes"),
            memory_reservation: num(memory, "memory.soft_limit_in_bytes"),
        }
    }
}

/// A one-number file: `max` is `u64::MAX`; missing or unreadable is zero.
fn num(dir: &Path, file: &str) -> u64 {
    let text = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
    match text.trim() {
        "max" => u64::MAX,
        v => v.parse().unwrap_or(0),
    }
}

/// A file of `key value` lines.
fn keyed(dir: &Path, file: &str) -> HashMap<String, u64> {
    let text = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (key, value) = l.split_once(' ')?;
            Some((key.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// The processes or threads in the cgroup at `dir` (its cgroup.procs, or its threads' file).
fn read_pids(dir: &Path, file: &str) -> Vec<u32> {
    let text = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// A v1 blkio line: `MAJOR:MINOR Kind value` (the closing `Total value` line is not one).
fn v1_io_line(line: &str) -> Option<(u64, u64, &str, u64)> {
    let mut parts = line.split_whitespace();
    let (major, minor) = parts.next()?.split_once(':')?;
    let kind = parts.next()?;
    let value = parts.next()?.parse().ok()?;
    Some((major.parse().ok()?, minor.parse().ok()?, kind, value))
}

/// The `key=value` fields of an io.stat line.
type Fields<'a> = Vec<(&'a str, u64)>;

/// A v2 io.stat line: `MAJOR:MINOR key=value ...`.
fn v2_io_line(line: &str) -> Option<(u64, u64, Fields<'_>)> {
    let mut parts = line.split_whitespace();
    let (major, minor) = parts.next()?.split_once(':')?;
    let fields = parts
        .filter_map(|f| {
            let (k, v) = f.split_once('=')?;
            Some((k, v.parse().ok()?))
        })
        .collect();
    Some((major.parse().ok()?, minor.parse().ok()?, fields))
}

/// The device's name under /dev, from sysfs; empty when unknown.
fn device_name(major: u64, minor: u64) -> String {
    let uevent = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/uevent"))
        .unwrap_or_default();
    uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .map_or_else(String::new, |name| format!("/dev/{name}"))
}

/// The soft limit of the "Max open files" line of a /proc/<pid>/limits text (-1: unlimited).
fn open_files_soft(limits: &str) -> Option<i64> {
    let line = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    match line.split_whitespace().next()? {
        "unlimited" => Some(-1),
        soft => soft.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (file, text) in files {
            std::fs::write(dir.join(file), text).unwrap();
        }
    }

    #[test]
    fn a_v1_cgroup_is_read_from_its_controllers() {
        let root = tempfile::tempdir().unwrap();
        let (cpu, memory, blkio, pids) = (
            root.path().join("cpu"),
            root.path().join("memory"),
            root.path().join("blkio"),
            root.path().join("pids"),
        );
        write(
            &cpu.join("kubepods/pod1/c1"),
            &[
                ("cpuacct.usage", "2500000000\n"),
                ("cpuacct.stat", "user 150\nsystem 50\n"),
                (
                    "cpu.stat",
                    "nr_periods 10\nnr_throttled 2\nthrottled_time 3000\n",
                ),
                ("cpu.shares", "2\n"),
                ("cpu.cfs_period_us", "100000\n"),
                ("cpu.cfs_quota_us", "-1\n"),
                ("cgroup.procs", "4242424\n"),
            ],
        );
        write(
            &memory.join("kubepods/pod1/c1"),
            &[
                ("memory.usage_in_bytes", "1000000\n"),
                ("memory.max_usage_in_bytes", "2000000\n"),
                ("memory.limit_in_bytes", "79998976\n"),
                ("memory.soft_limit_in_bytes", "9223372036854771712\n"),
                ("memory.failcnt", "0\n"),
                (
                    "memory.stat",
                    "cache 5\npgfault 7\npgmajfault 1\ntotal_cache 400000\ntotal_rss 500000\ntotal_mapped_file 1000\ntotal_inactive_file 300000\ntotal_active_file 100000\ntotal_pgfault 70\ntotal_pgmajfault 10\n",
                ),
                (
                    "memory.oom_control",
                    "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
                ),
            ],
        );
        write(
            &blkio.join("kubepods/pod1/c1"),
            &[
                (
                    "blkio.throttle.io_service_bytes_recursive",
                    "8:0 Read 4096\n8:0 Write 8192\n8:0 Total 12288\nTotal 12288\n",
                ),
                (
                    "blkio.throttle.io_serviced_recursive",
                    "8:0 Read 1\n8:0 Write 2\nTotal 3\n",
                ),
            ],
        );
        write(
            &pids.join("kubepods/pod1/c1"),
            &[("pids.current", "3\n"), ("pids.max", "max\n")],
        );
        let mount = |point: &Path, options: &str| Mount {
            point: point.to_path_buf(),
            v2: false,
            options: options.into(),
        };
        let reader = Reader::of(&[
            mount(&cpu, "rw,cpu,cpuacct"),
            mount(&memory, "rw,memory"),
            mount(&blkio, "rw,blkio"),
            mount(&pids, "rw,pids"),
        ]);
        assert_eq!(
            reader.descendants("/kubepods"),
            vec![
                "/kubepods/pod1".to_string(),
                "/kubepods/pod1/c1".to_string()
            ]
        );
        let s = reader.read("/kubepods/pod1/c1", true).expect("stats");
        assert_eq!(
            s.cpu,
            Cpu {
                usage_ns: 2_500_000_000,
                user_ns: 1_500_000_000,
                system_ns: 500_000_000,
                periods: 10,
                throttled_periods: 2,
                throttled_ns: 3000,
                bursts: 0,
                burst_ns: 0,
            }
        );
        let m = &s.memory;
        assert_eq!(
            (m.usage, m.max_usage, m.cache, m.rss),
            (1_000_000, 2_000_000, 400_000, 500_000)
        );
        assert_eq!((m.working_set, m.swap, m.oom_kills), (700_000, 0, 1));
        assert_eq!((m.faults, m.major_faults), ((7, 70), (1, 10)));
        assert_eq!(s.io.len(), 1);
        assert_eq!((s.io[0].major, s.io[0].minor), (8, 0));
        assert_eq!(DeviceIo::of(&s.io[0].bytes, "Write"), 8192);
        assert_eq!(DeviceIo::of(&s.io[0].ops, "Read"), 1);
        assert_eq!(
            s.spec,
            Spec {
                cpu_shares: 2,
                cpu_period: 100_000,
                cpu_quota: 0,
                memory_limit: 79_998_976,
                swap_limit: 0,
                memory_reservation: 9_223_372_036_854_771_712,
            }
        );
        assert_eq!((s.threads, s.threads_max, s.processes), (3, 0, 1));
        assert!(s.created.is_some());
        assert_eq!(reader.read("/kubepods/gone", false), None);
    }

    #[test]
    fn a_v2_cgroup_is_read_from_the_unified_hierarchy() {
        let root = tempfile::tempdir().unwrap();
        write(
            root.path(),
            &[("cgroup.controllers", "cpu io memory pids\n")],
        );
        write(
            &root.path().join("kubepods/c1"),
            &[
                (
                    "cpu.stat",
                    "usage_usec 2000\nuser_usec 1500\nsystem_usec 500\nnr_periods 4\nnr_throttled 1\nthrottled_usec 7\n",
                ),
                ("cpu.weight", "1\n"),
                ("cpu.max", "max 100000\n"),
                ("memory.current", "1000\n"),
                (
                    "memory.stat",
                    "anon 600\nfile 300\nfile_mapped 20\ninactive_file 100\nactive_file 200\npgfault 9\npgmajfault 2\nkernel 50\n",
                ),
                ("memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"),
                ("memory.max", "max\n"),
                ("memory.min", "0\n"),
                (
                    "io.stat",
                    "8:0 rbytes=4096 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n",
                ),
                ("pids.current", "2\n"),
                ("pids.max", "100\n"),
            ],
        );
        let reader = Reader::of(&[Mount {
            point: root.path().to_path_buf(),
            v2: true,
            options: "rw".into(),
        }]);
        let s = reader.read("/kubepods/c1", false).expect("stats");
        assert_eq!(
            (s.cpu.usage_ns, s.cpu.user_ns, s.cpu.throttled_ns),
            (2_000_000, 1_500_000, 7000)
        );
        let m = &s.memory;
        assert_eq!(
            (m.cache, m.rss, m.kernel, m.working_set, m.failcnt),
            (300, 600, 50, 900, 3)
        );
        assert_eq!((m.faults, m.oom_kills), ((9, 9), 1));
        assert_eq!(DeviceIo::of(&s.io[0].bytes, "Read"), 4096);
        assert_eq!(
            (s.spec.cpu_shares, s.spec.cpu_quota, s.spec.cpu_period),
            (2, 0, 100_000)
        );
        assert_eq!(
            (s.spec.memory_limit, s.spec.memory_reservation),
            (u64::MAX, 0)
        );
        assert_eq!(
            (s.threads, s.threads_max, s.open_files_soft),
            (2, 100, None)
        );
    }

    #[test]
    fn the_open_files_limit_is_read_from_proc_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax processes             63704                63704                processes\nMax open files            1048576              1048576              files\n";
        assert_eq!(open_files_soft(limits), Some(1_048_576));
        assert_eq!(
            open_files_soft("Max open files            unlimited  unlimited  files\n"),
            Some(-1)
        );
        assert_eq!(open_files_soft("nothing"), None);
        let own = std::fs::read_to_string("/proc/self/limits").unwrap();
        assert!(open_files_soft(&own).is_some());
    }
}

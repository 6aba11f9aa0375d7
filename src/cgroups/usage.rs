//! What cgroups use, read from whichever hierarchy holds the controller: a v1 controller mount,
//! or the unified v2 mount when its `cgroup.controllers` lists it (hybrid hosts, like these
//! machines, mount an unused v2 hierarchy beside the v1 controllers). Files are read directly:
//! the eviction manager must never fail on a missing one.

use std::path::{Path, PathBuf};

/// One cgroup hierarchy's mount: where, whether unified (v2), and its options (a v1 mount
/// names its controllers there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Mount {
    pub point: PathBuf,
    pub v2: bool,
    pub(super) options: String,
}

/// Every cgroup and cgroup2 mount in a /proc/self/mountinfo text.
pub(super) fn cgroup_mounts(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let mut fs = after.split(' ');
            let (kind, _, options) = (fs.next()?, fs.next(), fs.next()?);
            let v2 = match kind {
                "cgroup" => false,
                "cgroup2" => true,
                _ => return None,
            };
            Some(Mount {
                point: PathBuf::from(before.split(' ').nth(4)?),
                v2,
                options: options.to_string(),
            })
        })
        .collect()
}

/// This host's cgroup mounts (read as bytes: one mount point that is not UTF-8 must not hide
/// the others).
pub(super) fn host_mounts() -> Vec<Mount> {
    let info = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    cgroup_mounts(&String::from_utf8_lossy(&info))
}

/// The mount holding `controller`: its v1 mount, else the unified one whose
/// `cgroup.controllers` lists it.
pub(super) fn controller_mount(
    mounts: &[Mount],
    controller: &str,
    v2_lists: impl Fn(&Path) -> bool,
) -> Option<Mount> {
    mounts
        .iter()
        .find(|m| !m.v2 && m.options.split(',').any(|o| o == controller))
        .or_else(|| mounts.iter().find(|m| m.v2 && v2_lists(&m.point)))
        .cloned()
}

/// Where `controller` lives among `mounts` on this host.
pub(super) fn mount_of(mounts: &[Mount], controller: &str) -> Option<Mount> {
    controller_mount(mounts, controller, |dir| {
        std::fs::read_to_string(dir.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|n| n == controller))
    })
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn stat_field(dir: &Path, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The memory the cgroup at `dir` uses, page cache included (v1: memory.usage_in_bytes; v2:
/// memory.current).
pub(super) fn usage(dir: &Path, v2: bool) -> Option<u64> {
    read_u64(&dir.join(if v2 {
        "memory.current"
    } else {
        "memory.usage_in_bytes"
    }))
}

/// The working set of the cgroup at `dir`: its memory use minus inactive file pages, as
/// upstream counts it (v1: usage_in_bytes and total_inactive_file; v2: memory.current and
/// inactive_file).
pub(super) fn working_set(dir: &Path, v2: bool) -> Option<u64> {
    let (usage, inactive) = if v2 {
        (
            read_u64(&dir.join("memory.current"))?,
            stat_field(dir, "inactive_file").unwrap_or(0),
        )
    } else {
        (
            read_u64(&dir.join("memory.usage_in_bytes"))?,
            stat_field(dir, "total_inactive_file").unwrap_or(0),
        )
    };
    Some(usage.saturating_sub(inactive))
}

/// Arms cgroup v1's memory threshold notification on the cgroup at `dir`: the returned eventfd
/// becomes readable when the cgroup's working set crosses `working_set` bytes, either way. The
/// kernel compares memory.usage_in_bytes, so the inactive file pages of now are added (upstream's
/// memcg notifier does the same and re-arms after each observation). Closing the eventfd
/// removes the notification. The kernel reports crossings only, so the second value says whether
/// the usage was already past the mark once it was armed (the rise then went unreported).
pub(super) fn arm_threshold(
    dir: &Path,
    working_set: u64,
) -> std::io::Result<(std::os::fd::OwnedFd, bool)> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let inactive = stat_field(dir, "total_inactive_file").unwrap_or(0);
    let usage = std::fs::File::open(dir.join("memory.usage_in_bytes"))?;
    // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` was just returned by eventfd and nothing else owns it.
    let event = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
    let mark = working_set.saturating_add(inactive);
    let line = format!("{} {} {mark}", event.as_raw_fd(), usage.as_raw_fd());
    std::fs::write(dir.join("cgroup.event_control"), line)?;
    let past = read_u64(&dir.join("memory.usage_in_bytes")).is_some_and(|now| now >= mark);
    Ok((event, past))
}

/// What a cgroup used, as /stats/summary reports a system container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time in nanoseconds.
    pub cpu_ns: u64,
    pub memory: u64,
    pub working_set: u64,
    pub rss: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
    /// The memory limit; `None` when there is none.
    pub limit: Option<u64>,
    /// Swap in use (zero where swap is not accounted).
    pub swap: u64,
}

/// The memory limit of the cgroup at `dir`, unless unlimited (v1 writes the largest page
/// count as its "none"; v2 writes `max`).
fn limit(dir: &Path, v2: bool) -> Option<u64> {
    if v2 {
        read_u64(&dir.join("memory.max"))
    } else {
        read_u64(&dir.join("memory.limit_in_bytes")).filter(|l| *l < 1 << 62)
    }
}

/// The swap the cgroup at `dir` uses: v2's memory.swap.current; on v1 what memory and swap
/// use together less memory alone, where the kernel accounts swap.
fn swap(dir: &Path, v2: bool) -> u64 {
    if v2 {
        read_u64(&dir.join("memory.swap.current")).unwrap_or(0)
    } else {
        read_u64(&dir.join("memory.memsw.usage_in_bytes"))
            .zip(read_u64(&dir.join("memory.usage_in_bytes")))
            .map_or(0, |(both, memory)| both.saturating_sub(memory))
    }
}

/// The usage of the cgroup at `path` (relative to each hierarchy) among `mounts`.
pub(super) fn of(mounts: &[Mount], path: &str) -> Option<Usage> {
    of_paths(mounts, path, path)
}

/// The usage of a process whose memory is accounted in the cgroup `memory_path` and its CPU
/// time in `cpu_path` (they differ where the hierarchies were moved apart).
pub(super) fn of_paths(mounts: &[Mount], memory_path: &str, cpu_path: &str) -> Option<Usage> {
    let relative = cpu_path.trim_start_matches('/');
    let memory = mount_of(mounts, "memory")?;
    let dir = memory.point.join(memory_path.trim_start_matches('/'));
    let v2 = memory.v2;
    let cpu_ns = if v2 {
        std::fs::read_to_string(memory.point.join(relative).join("cpu.stat"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse::<u64>().ok())?
            * 1000
    } else {
        read_u64(
            &mount_of(mounts, "cpuacct")?
                .point
                .join(relative)
                .join("cpuacct.usage"),
        )?
    };
    let (rss, faults, major) = if v2 {
        ("anon", "pgfault", "pgmajfault")
    } else {
        ("total_rss", "total_pgfault", "total_pgmajfault")
    };
    Some(Usage {
        cpu_ns,
        memory: usage(&dir, v2)?,
        working_set: working_set(&dir, v2)?,
        rss: stat_field(&dir, rss).unwrap_or(0),
        page_faults: stat_field(&dir, faults).unwrap_or(0),
        major_page_faults: stat_field(&dir, major).unwrap_or(0),
        limit: limit(&dir, v2),
        swap: swap(&dir, v2),
    })
}

/// The number of processes in the cgroup at `dir` (same file in v1 and v2).
pub(super) fn pids(dir: &Path) -> Option<u64> {
    read_u64(&dir.join("pids.current"))
}

/// MemTotal - MemAvailable from /proc/meminfo, for a v2 root cgroup (which has no
/// memory.current).
pub(super) fn meminfo_used(meminfo: &str) -> Option<u64> {
    let kib = |key: &str| -> Option<u64> {
        meminfo.lines().find_map(|l| {
            l.strip_prefix(key)?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        })
    };
    Some(kib("MemTotal:")?.saturating_sub(kib("MemAvailable:")?) * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_system_containers_usage_is_read_from_either_hierarchy() {
        let v1 = tempfile::tempdir().expect("tempdir");
        let (memory, cpuacct) = (v1.path().join("memory"), v1.path().join("cpuacct"));
        for (dir, file, text) in [
            (&memory, "memory.usage_in_bytes", "1000"),
            (
                &memory,
                "memory.stat",
                "total_inactive_file 300\ntotal_rss 500\ntotal_pgfault 7\ntotal_pgmajfault 1\n",
            ),
            (&cpuacct, "cpuacct.usage", "123456"),
        ] {
            std::fs::create_dir_all(dir.join("sys")).unwrap();
            std::fs::write(dir.join("sys").join(file), text).unwrap();
        }
        let mounts = vec![
            Mount {
                point: memory.clone(),
                v2: false,
                options: "rw,memory".into(),
            },
            Mount {
                point: cpuacct.clone(),
                v2: false,
                options: "rw,cpu,cpuacct".into(),
            },
        ];
        let u = of(&mounts, "/sys").expect("v1 usage");
        assert_eq!(
            (
                u.cpu_ns,
                u.memory,
                u.working_set,
                u.rss,
                u.page_faults,
                u.major_page_faults
            ),
            (123_456, 1000, 700, 500, 7, 1)
        );

        let v2 = tempfile::tempdir().expect("tempdir");
        let dir = v2.path().join("sys");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(v2.path().join("cgroup.controllers"), "cpu memory pids").unwrap();
        std::fs::write(dir.join("memory.current"), "2000").unwrap();
        std::fs::write(
            dir.join("memory.stat"),
            "anon 900\ninactive_file 500\npgfault 3\npgmajfault 0\n",
        )
        .unwrap();
        std::fs::write(dir.join("cpu.stat"), "usage_usec 42\nuser_usec 40\n").unwrap();
        let unified = vec![Mount {
            point: v2.path().to_path_buf(),
            v2: true,
            options: "rw".into(),
        }];
        let u = of(&unified, "/sys").expect("v2 usage");
        assert_eq!(
            (u.cpu_ns, u.memory, u.working_set, u.rss, u.page_faults),
            (42_000, 2000, 1500, 900, 3)
        );
    }

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const UNIFIED: &str = "\
29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn controllers_are_found_on_v1_mounts_before_an_unused_v2_one() {
        let found = |info: &str, controller: &str, v2_lists: bool| {
            controller_mount(&cgroup_mounts(info), controller, |_| v2_lists)
                .map(|m| (m.point, m.v2))
        };
        let hybrid = cgroup_mounts(HYBRID);
        assert_eq!(hybrid.len(), 3);
        assert_eq!(
            found(HYBRID, "memory", false),
            Some((PathBuf::from("/sys/fs/cgroup/memory"), false))
        );
        assert_eq!(
            found(HYBRID, "pids", true),
            Some((PathBuf::from("/sys/fs/cgroup/pids"), false))
        );
        assert_eq!(found(HYBRID, "hugetlb", false), None);
        assert_eq!(
            found(UNIFIED, "memory", true),
            Some((PathBuf::from("/sys/fs/cgroup"), true))
        );
        assert_eq!(found(UNIFIED, "memory", false), None);
    }

    #[test]
    fn the_working_set_leaves_out_inactive_file_pages_in_both_formats() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("memory.current"), "1000000\n").unwrap();
        std::fs::write(
            d.join("memory.stat"),
            "anon 600000\nfile 400000\ninactive_file 250000\nactive_file 150000\n",
        )
        .unwrap();
        std::fs::write(d.join("pids.current"), "7\n").unwrap();
        assert_eq!(working_set(d, true), Some(750_000));
        assert_eq!(pids(d), Some(7));
        std::fs::write(d.join("memory.usage_in_bytes"), "5000\n").unwrap();
        std::fs::write(
            d.join("memory.stat"),
            "cache 3000\ninactive_file 100\ntotal_inactive_file 2000\n",
        )
        .unwrap();
        assert_eq!(working_set(d, false), Some(3000));
        assert_eq!(working_set(&d.join("missing"), false), None);
    }

    #[test]
    fn meminfo_gives_what_is_not_available() {
        let text = "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    400 kB\n";
        assert_eq!(meminfo_used(text), Some(600 * 1024));
    }
}

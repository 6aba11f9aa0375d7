//! The one place for facts about the machine the agent runs on: its IP, its ids, whether swap is
//! on, its capacity (cores, memory, the root dir's filesystem), the sizes of any filesystem
//! (statvfs) and its process ids; and the check of the kernel settings the kubelet expects
//! (upstream's setupKernelTunables).

use std::net::IpAddr;
use std::path::Path;

/// The node's IP when --node-ip is not given: the IPv4 address of the default route's
/// interface, else the first non-loopback IPv4 address.
pub(crate) fn detect_node_ip() -> Option<IpAddr> {
    let default_iface = std::fs::read_to_string("/proc/net/route")
        .ok()
        .and_then(|routes| {
            routes.lines().skip(1).find_map(|line| {
                let mut fields = line.split_whitespace();
                let iface = fields.next()?;
                (fields.next()? == "00000000").then(|| iface.to_string())
            })
        });
    let mut found: Vec<(String, IpAddr)> = Vec::new();
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `addrs` with a list we only read and then free once.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return None;
    }
    let mut cursor = addrs;
    while !cursor.is_null() {
        // SAFETY: `cursor` points into the list getifaddrs returned, which is still alive.
        let entry = unsafe { &*cursor };
        cursor = entry.ifa_next;
        if entry.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr whose family we check first.
        let family = i32::from(unsafe { (*entry.ifa_addr).sa_family });
        if family != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in) };
        let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        if ip.is_loopback() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(entry.ifa_name) }
            .to_string_lossy()
            .into_owned();
        found.push((name, IpAddr::V4(ip)));
    }
    // SAFETY: `addrs` came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(addrs) };
    found
        .iter()
        .find(|(name, _)| Some(name) == default_iface.as_ref())
        .or(found.first())
        .map(|(_, ip)| *ip)
}

/// Who the machine is, as the Node's `nodeInfo` and cAdvisor's machine metrics name it; each
/// empty where the host does not say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct MachineIds {
    pub(crate) machine_id: String,
    pub(crate) system_uuid: String,
    pub(crate) boot_id: String,
}

/// This machine's [`MachineIds`]: /etc/machine-id, the DMI product UUID and the kernel's boot id.
pub(crate) fn machine_ids() -> MachineIds {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    MachineIds {
        machine_id: read("/etc/machine-id"),
        system_uuid: read("/sys/class/dmi/id/product_uuid"),
        boot_id: read("/proc/sys/kernel/random/boot_id"),
    }
}

/// Is swap on (a non-empty /proc/swaps)?
pub(crate) fn swap_enabled() -> bool {
    std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1)
}

/// The node's capacity: cores, memory bytes and root-dir filesystem bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NodeResources {
    pub cpu: f64,
    pub memory: f64,
    pub ephemeral_storage: f64,
}

impl NodeResources {
    /// Reads the machine's capacity; the filesystem is the one holding `root_dir`.
    pub fn detect(root_dir: &Path) -> NodeResources {
        let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            })
            .map_or(0.0, |kib| kib * 1024.0);
        let probe = std::iter::successors(Some(root_dir), |p| p.parent()).find(|p| p.exists());
        let ephemeral_storage = probe
            .and_then(fs_stats)
            .map_or(0.0, |fs| fs.capacity as f64);
        NodeResources {
            cpu,
            memory,
            ephemeral_storage,
        }
    }
}

/// Sizes of a filesystem, in bytes and inodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FsStats {
    pub(crate) capacity: u64,
    /// Free to unprivileged users.
    pub(crate) available: u64,
    pub(crate) free: u64,
    pub(crate) inodes: u64,
    pub(crate) inodes_free: u64,
}

/// statvfs(2) of the filesystem holding `path`.
pub(crate) fn fs_stats(path: impl AsRef<Path>) -> Option<FsStats> {
    let c = std::ffi::CString::new(path.as_ref().as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path; `st` is written by statvfs only.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some(FsStats {
        capacity: st.f_blocks as u64 * frsize,
        available: st.f_bavail as u64 * frsize,
        free: st.f_bfree as u64 * frsize,
        inodes: st.f_files as u64,
        inodes_free: st.f_ffree as u64,
    })
}

/// The machine's process ids: how many the kernel hands out (kernel.pid_max) and how many
/// processes hold one now (the numbered entries of /proc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pids {
    pub(crate) max: u64,
    pub(crate) running: u64,
}

/// This machine's [`Pids`], or `None` if /proc cannot be read.
pub(crate) fn pids() -> Option<Pids> {
    let max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let running = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .count() as u64;
    Some(Pids { max, running })
}

/// The kernel settings the kubelet expects, with their /proc/sys paths and values.
const KERNEL_DEFAULTS: [(&str, &str, i64); 6] = [
    ("vm.overcommit_memory", "vm/overcommit_memory", 1),
    ("vm.panic_on_oom", "vm/panic_on_oom", 0),
    ("kernel.panic", "kernel/panic", 10),
    ("kernel.panic_on_oops", "kernel/panic_on_oops", 1),
    (
        "kernel.keys.root_maxkeys",
        "kernel/keys/root_maxkeys",
        1_000_000,
    ),
    (
        "kernel.keys.root_maxbytes",
        "kernel/keys/root_maxbytes",
        25_000_000,
    ),
];

/// Each kernel setting that differs from what the kubelet expects (or cannot be read), as
/// "name is X, expected Y", reading each through `read` (a /proc/sys path).
fn kernel_differences(read: impl Fn(&str) -> std::io::Result<String>) -> Vec<String> {
    KERNEL_DEFAULTS
        .iter()
        .filter_map(|(name, path, expected)| match read(path) {
            Ok(text) => match text.trim().parse::<i64>() {
                Ok(v) if v == *expected => None,
                _ => Some(format!("{name} is {}, expected {expected}", text.trim())),
            },
            Err(e) => Some(format!("{name} cannot be read ({e}), expected {expected}")),
        })
        .collect()
}

/// This host's kernel settings that differ from what the kubelet expects.
pub(crate) fn kernel_defaults_differences() -> Vec<String> {
    kernel_differences(|path| std::fs::read_to_string(std::path::Path::new("/proc/sys").join(path)))
}

/// When this machine booted (/proc/stat's btime).
pub(crate) fn boot_time() -> Option<k8s_openapi::jiff::Timestamp> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let secs: i64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    k8s_openapi::jiff::Timestamp::from_second(secs).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kernel_setting_that_differs_is_named_with_both_values() {
        let host = |path: &str| -> std::io::Result<String> {
            match path {
                "vm/overcommit_memory" => Ok("0\n".into()),
                "kernel/panic" => Ok("10\n".into()),
                "kernel/panic_on_oops" => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
                "vm/panic_on_oom" => Ok("0".into()),
                "kernel/keys/root_maxkeys" => Ok("1000000".into()),
                _ => Ok("200".into()),
            }
        };
        let found = kernel_differences(host);
        assert_eq!(found.len(), 3, "{found:?}");
        assert_eq!(found[0], "vm.overcommit_memory is 0, expected 1");
        assert!(found[1].starts_with("kernel.panic_on_oops cannot be read ("));
        assert_eq!(
            found[2],
            "kernel.keys.root_maxbytes is 200, expected 25000000"
        );
    }

    #[test]
    fn the_capacity_counts_the_filesystem_of_the_root_dirs_nearest_existing_parent() {
        let dir = tempfile::tempdir().unwrap();
        let node = NodeResources::detect(&dir.path().join("not/made/yet"));
        let fs = fs_stats(dir.path()).expect("statvfs of a temporary dir");
        assert!(fs.capacity > 0);
        assert_eq!(node.ephemeral_storage, fs.capacity as f64);
        assert!(node.cpu >= 1.0);
        assert_eq!(fs_stats("a\0b"), None, "a path with a NUL is no path");
    }
}

//! The upstream kubelet run standalone beside nodelet, on a containerd of its own: its
//! configuration, and what it changes on the host whatever its directories, undone after it.
//! Shared by the differential test and `make bench` (examples/bench includes this file).

use std::path::{Path, PathBuf};

/// Host sysctls the kubelet sets at start (protectKernelDefaults off).
const SYSCTLS: [&str; 3] = [
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
];

/// Host paths the kubelet uses whatever its root dir.
const FIXED_DIRS: [&str; 2] = ["/var/log/containers", "/var/lib/kubelet/device-plugins"];

/// What the kubelet changes on the host: recorded before it starts, undone after it stops.
pub struct HostChanges {
    sysctls: Vec<(PathBuf, String)>,
    /// The first missing directory of each fixed path: the kubelet makes it.
    made: Vec<PathBuf>,
}

impl HostChanges {
    /// Records the host's state, and makes the kubelet's cgroup root (`/name`) in every cgroup
    /// hierarchy, where it must exist.
    pub fn record(cgroup_root: &str) -> std::io::Result<HostChanges> {
        let sysctls = SYSCTLS
            .iter()
            .map(|s| {
                let path = Path::new("/proc/sys").join(s);
                let value = std::fs::read_to_string(&path)?;
                Ok((path, value))
            })
            .collect::<std::io::Result<_>>()?;
        let made = FIXED_DIRS
            .into_iter()
            .filter_map(|p| {
                Path::new(p)
                    .ancestors()
                    .take_while(|a| !a.exists())
                    .last()
                    .map(Path::to_path_buf)
            })
            .collect();
        for mount in cgroup_mounts() {
            std::fs::create_dir_all(mount.join(cgroup_root.trim_start_matches('/')))?;
        }
        Ok(HostChanges { sysctls, made })
    }

    /// Puts the sysctls back, and removes the container log links the kubelet made into `dir`
    /// (its pod logs dir is there) and the fixed directories it made.
    pub fn undo(&self, dir: &Path) {
        for (path, value) in &self.sysctls {
            let _ = std::fs::write(path, value);
        }
        if let Ok(entries) = std::fs::read_dir("/var/log/containers") {
            for entry in entries.flatten() {
                if std::fs::read_link(entry.path()).is_ok_and(|t| t.starts_with(dir)) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        for path in &self.made {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// Every cgroup hierarchy's mount point (v1's, and the unified one).
fn cgroup_mounts() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" - cgroup ") || l.contains(" - cgroup2 "))
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .collect()
}

/// Where the kubelet runs: its directories under `dir`, its runtime, cgroup root and ports.
pub struct Settings<'a> {
    pub dir: &'a Path,
    pub endpoint: &'a Path,
    pub cgroup_root: &'a str,
    pub port: u16,
    pub read_only_port: u16,
    pub healthz_port: u16,
    /// More KubeletConfiguration lines.
    pub extra: &'a str,
}

/// The KubeletConfiguration of a standalone kubelet: no API server to authenticate against,
/// cgroup v1 and swap allowed, the host's iptables and images left alone; its static pods in
/// `dir/manifests`, its pod logs in `dir/pods`.
pub fn config(s: &Settings<'_>) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: {manifests}
containerRuntimeEndpoint: unix://{endpoint}
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
failCgroupV1: false
failSwapOn: false
authentication: {{anonymous: {{enabled: false}}, webhook: {{enabled: false}}}}
authorization: {{mode: AlwaysAllow}}
address: 127.0.0.1
port: {port}
readOnlyPort: {read_only}
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
podLogsDir: {logs}
volumePluginDir: {plugins}
makeIPTablesUtilChains: false
imageGCHighThresholdPercent: 100
{extra}",
        manifests = s.dir.join("manifests").display(),
        endpoint = s.endpoint.display(),
        cgroup_root = s.cgroup_root,
        port = s.port,
        read_only = s.read_only_port,
        healthz = s.healthz_port,
        logs = s.dir.join("pods").display(),
        plugins = s.dir.join("volume-plugins").display(),
        extra = s.extra,
    )
}

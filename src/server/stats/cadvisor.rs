//! `/metrics/cadvisor` as the kubelet serves it with its built-in cAdvisor: the machine's facts,
//! and cAdvisor's `container_*` families for every cgroup it watches (the root, the system
//! containers, and the pods' tree: QoS classes, pods, and each pod's containers and sandbox),
//! read from the cgroups themselves, so they do not depend on the runtime's version. Labels as
//! the kubelet gives them: `id` (the cgroup), `name` (the runtime's container ID), `image`,
//! `pod`, `namespace` and `container`.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::network::{self, Interface};
use super::resource::{Sample, write_family};
use crate::cgroups::pressure::{Pressure, Psi};
use crate::cgroups::stats::{DeviceIo, Reader, Stats};
use crate::host::MachineIds;
use crate::metrics::label_value;

/// What cAdvisor's machine collector reports under the kubelet's metric set.
#[derive(Debug)]
pub(crate) struct Machine {
    pub(crate) ids: MachineIds,
    /// Logical CPUs.
    pub(crate) cores: usize,
    pub(crate) physical_cores: usize,
    pub(crate) sockets: usize,
    pub(crate) memory_bytes: u64,
    pub(crate) swap_bytes: u64,
}

impl Machine {
    /// This machine, from sysfs and /proc/meminfo.
    pub(crate) fn detect() -> std::io::Result<Machine> {
        let topology = crate::cm::cpu::Topology::discover(Path::new("/sys/devices/system/cpu"))?;
        let count = |key: fn(&crate::cm::cpu::Cpu) -> (u32, u32)| {
            let keys: std::collections::BTreeSet<_> = topology.cpus.iter().map(key).collect();
            keys.len()
        };
        let mem = super::meminfo();
        Ok(Machine {
            ids: crate::host::machine_ids(),
            cores: topology.cpus.len(),
            physical_cores: count(|c| (c.socket, c.core)),
            sockets: count(|c| (c.socket, 0)),
            memory_bytes: mem.get("MemTotal").copied().unwrap_or(0),
            swap_bytes: mem.get("SwapTotal").copied().unwrap_or(0),
        })
    }

    /// The machine families.
    fn families(&self) -> [MachineFamily; 9] {
        let one = |v: f64| vec![(String::new(), v)];
        let nvm = ["app_direct_mode", "memory_mode"]
            .iter()
            .map(|mode| (format!(",mode=\"{mode}\""), 0.0))
            .collect();
        [
            ("machine_cpu_books", "Number of CPU books.", one(0.0)),
            (
                "machine_cpu_cores",
                "Number of logical CPU cores.",
                one(self.cores as f64),
            ),
            ("machine_cpu_drawers", "Number of CPU drawers.", one(0.0)),
            (
                "machine_cpu_physical_cores",
                "Number of physical CPU cores.",
                one(self.physical_cores as f64),
            ),
            (
                "machine_cpu_sockets",
                "Number of CPU sockets.",
                one(self.sockets as f64),
            ),
            (
                "machine_memory_bytes",
                "Amount of memory installed on the machine.",
                one(self.memory_bytes as f64),
            ),
            (
                "machine_nvm_avg_power_budget_watts",
                "NVM power budget.",
                one(0.0),
            ),
            (
                "machine_nvm_capacity",
                "NVM capacity value labeled by NVM mode (memory mode or app direct mode).",
                nvm,
            ),
            (
                "machine_swap_bytes",
                "Amount of swap memory available on the machine.",
                one(self.swap_bytes as f64),
            ),
        ]
    }
}

/// A machine family: name, help, and samples as (labels after the machine's ids, value).
type MachineFamily = (&'static str, &'static str, Vec<(String, f64)>);

/// The labels the kubelet gives a cgroup's series: the cgroup's name (`id`), and for a container
/// its runtime ID (`name`), image, pod, namespace and container name (`POD` for a sandbox); a
/// pod's cgroup has only the pod and namespace; the others only `id`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Labels {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) image: String,
    pub(crate) pod: String,
    pub(crate) namespace: String,
    pub(crate) container: String,
}

/// One cgroup as `/metrics/cadvisor` reports it.
#[derive(Debug, Default)]
pub(crate) struct Cgroup {
    pub(crate) labels: Labels,
    pub(crate) stats: Stats,
    pub(crate) pressure: Option<Pressure>,
    /// The interfaces of a sandbox's network namespace, or the host's for the root cgroup.
    pub(crate) network: Vec<Interface>,
    /// The file systems: a container's writable layer's, or every host file system for the
    /// root cgroup.
    pub(crate) filesystems: Vec<Filesystem>,
}

/// A file system as cAdvisor reports it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Filesystem {
    pub(crate) device: String,
    pub(crate) used: u64,
    /// The capacity and the inodes (total, free), known for the host's file systems.
    pub(crate) limit: Option<u64>,
    pub(crate) inodes: Option<(u64, u64)>,
    /// The device's eleven /proc/diskstats counters, from reads completed to weighted I/O time.
    pub(crate) disk: Option<[u64; 11]>,
}

/// One line of /proc/self/mountinfo: the device number (`major:minor`), the mount point and
/// the source.
struct MountEntry<'a> {
    devno: &'a str,
    point: &'a str,
    source: &'a str,
}

/// The mounts of a /proc/self/mountinfo text.
fn mount_entries(mountinfo: &str) -> Vec<MountEntry<'_>> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let mut fields = before.split(' ');
            Some(MountEntry {
                devno: fields.nth(2)?,
                point: fields.nth(1)?,
                source: after.split(' ').nth(1)?,
            })
        })
        .collect()
}

/// The host's block-device file systems among `mounts` (each device once), with their sizes
/// and the devices' /proc/diskstats counters.
fn host_filesystems(mounts: &[MountEntry<'_>], diskstats: &str) -> Vec<Filesystem> {
    let mut seen = HashSet::new();
    mounts
        .iter()
        .filter(|m| m.source.starts_with("/dev/") && seen.insert(m.source))
        .filter_map(|m| {
            let st = crate::host::fs_stats(m.point)?;
            Some(Filesystem {
                device: m.source.to_string(),
                used: st.capacity.saturating_sub(st.free),
                limit: Some(st.capacity),
                inodes: Some((st.inodes, st.inodes_free)),
                disk: disk_counters(diskstats, m.devno),
            })
        })
        .collect()
}

/// The eleven counters of the device `major:minor` in a /proc/diskstats text.
fn disk_counters(diskstats: &str, devno: &str) -> Option<[u64; 11]> {
    let (major, minor) = devno.split_once(':')?;
    diskstats.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first() != Some(&major) || fields.get(1) != Some(&minor) {
            return None;
        }
        let mut counters = [0; 11];
        for (slot, value) in counters.iter_mut().zip(fields.get(3..)?) {
            *slot = value.parse().ok()?;
        }
        Some(counters)
    })
}

/// What the runtime says of the cgroups to watch, and where they are.
#[derive(Default)]
pub(crate) struct Watched {
    /// Each pod's name and namespace, by UID.
    pub(crate) pods: HashMap<String, (String, String)>,
    /// Each container's and sandbox's labels by runtime ID, and whether it is a sandbox.
    pub(crate) containers: HashMap<String, (Labels, bool)>,
    /// Each container's writable layer: its file system's mount point and the bytes it uses.
    pub(crate) layers: HashMap<String, (String, u64)>,
    /// The system containers' cgroups, each watched alone.
    pub(crate) roots: Vec<String>,
    /// The pods' cgroup, watched with everything below it.
    pub(crate) pods_root: Option<String>,
}

impl Watched {
    /// Reads the root cgroup, the system containers' and the pods' tree. A cgroup gone while
    /// it is read is left out.
    pub(crate) fn read(self) -> Vec<Cgroup> {
        let reader = Reader::host();
        let mut paths = vec!["/".to_string()];
        paths.extend(self.roots.iter().cloned());
        if let Some(root) = &self.pods_root {
            paths.push(root.clone());
            paths.extend(reader.descendants(root));
        }
        let mut seen = HashSet::new();
        paths.retain(|p| seen.insert(p.clone()));
        let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
        let pressures = crate::cgroups::pressure::of(&refs);
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mounts = mount_entries(&mountinfo);
        // The writable layers' devices, by mount point (the containers share a few).
        let mut layer_devices: HashMap<&str, String> = HashMap::new();
        let mut cgroups = Vec::new();
        for (path, pressure) in paths.iter().zip(pressures) {
            let name = path.rsplit('/').next().unwrap_or_default();
            let (mut labels, container) = self.labels(name);
            labels.id = path.clone();
            let Some(stats) = reader.read(path, container.is_some()) else {
                continue;
            };
            let network = match container {
                Some(true) => stats.first_process.and_then(network::pod_interfaces),
                None if path == "/" => std::fs::read_to_string("/proc/net/dev")
                    .ok()
                    .map(|t| network::parse_net_dev(&t)),
                _ => None,
            };
            let filesystems = match container {
                Some(false) => self
                    .layers
                    .get(container_id(name))
                    .map(|(mountpoint, used)| Filesystem {
                        device: layer_devices
                            .entry(mountpoint.as_str())
                            .or_insert_with(|| mount_source(&mounts, mountpoint))
                            .clone(),
                        used: *used,
                        ..Filesystem::default()
                    })
                    .into_iter()
                    .collect(),
                None if path == "/" => host_filesystems(
                    &mounts,
                    &std::fs::read_to_string("/proc/diskstats").unwrap_or_default(),
                ),
                _ => Vec::new(),
            };
            cgroups.push(Cgroup {
                labels,
                stats,
                pressure,
                network: network.unwrap_or_default(),
                filesystems,
            });
        }
        cgroups
    }

    /// The labels of the cgroup named `name` (its last path component), and for a container's
    /// or sandbox's, whether it is a sandbox.
    fn labels(&self, name: &str) -> (Labels, Option<bool>) {
        if let Some((labels, sandbox)) = self.containers.get(container_id(name)) {
            return (labels.clone(), Some(*sandbox));
        }
        let pod = pod_uid(name).and_then(|uid| self.pods.get(&uid));
        let labels = pod.map_or_else(Labels::default, |(pod, namespace)| Labels {
            pod: pod.clone(),
            namespace: namespace.clone(),
            ..Labels::default()
        });
        (labels, None)
    }
}

/// The runtime ID in a container cgroup's name: the name itself (cgroupfs), or the ID in a
/// systemd scope (`cri-containerd-<id>.scope`).
fn container_id(leaf: &str) -> &str {
    let name = leaf.strip_suffix(".scope").unwrap_or(leaf);
    name.rsplit('-').next().unwrap_or(name)
}

/// The pod UID in a pod cgroup's name: `pod<uid>` (cgroupfs), or
/// `kubepods-<qos>-pod<uid with _ for ->.slice` (systemd).
fn pod_uid(leaf: &str) -> Option<String> {
    let name = leaf.strip_suffix(".slice").unwrap_or(leaf);
    let uid = name
        .strip_prefix("pod")
        .or_else(|| name.rsplit_once("-pod").map(|(_, uid)| uid))?;
    Some(uid.replace('_', "-"))
}

/// The source (the device) of the mount among `mounts` holding `path`; empty when none does.
fn mount_source(mounts: &[MountEntry<'_>], path: &str) -> String {
    let within = |point: &str| {
        point == "/"
            || path == point
            || path.strip_prefix(point).is_some_and(|r| r.starts_with('/'))
    };
    mounts
        .iter()
        .filter(|m| within(m.point))
        .max_by_key(|m| m.point.len())
        .map_or_else(String::new, |m| m.source.to_string())
}

/// Extra labels and a value.
type Values = Vec<(Vec<(&'static str, String)>, f64)>;

/// A container family: name, help, type, whether its samples carry the scrape's time (the
/// spec's do not), and its values for a cgroup.
type ContainerFamily = (
    &'static str,
    &'static str,
    &'static str,
    bool,
    fn(&Cgroup) -> Values,
);

fn one(v: impl Into<f64>) -> Values {
    vec![(Vec::new(), v.into())]
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// cAdvisor's spec memory value: anything above 2^62 (cgroup v1's and v2's "unlimited") is 0.
fn memory_spec(v: u64) -> f64 {
    if v > 1 << 62 { 0.0 } else { v as f64 }
}

/// The block devices' `kind` counts, by device.
fn io(c: &Cgroup, bytes: bool, kind: &str) -> Values {
    c.stats
        .io
        .iter()
        .map(|d| {
            let counts = if bytes { &d.bytes } else { &d.ops };
            (
                vec![("device", d.device.clone())],
                DeviceIo::of(counts, kind) as f64,
            )
        })
        .collect()
}

/// A value of each file system that has it.
fn fs(c: &Cgroup, value: fn(&Filesystem) -> Option<f64>) -> Values {
    c.filesystems
        .iter()
        .filter_map(|f| Some((vec![("device", f.device.clone())], value(f)?)))
        .collect()
}

/// The /proc/diskstats counter `i` of each file system; `ms`: a time in milliseconds, as
/// seconds.
fn disk(c: &Cgroup, i: usize, ms: bool) -> Values {
    c.filesystems
        .iter()
        .filter_map(|f| {
            let v = f.disk?[i] as f64;
            Some((
                vec![("device", f.device.clone())],
                if ms { v / 1000.0 } else { v },
            ))
        })
        .collect()
}

/// The interfaces' values.
fn net(c: &Cgroup, value: fn(&Interface) -> u64) -> Values {
    c.network
        .iter()
        .map(|i| (vec![("interface", i.name.clone())], value(i) as f64))
        .collect()
}

/// A pressure total in seconds (PSI totals are in µs), where the cgroup has one.
fn stalled(p: Option<Psi>, full: bool) -> Values {
    p.map(|p| one((if full { p.full } else { p.some }).total as f64 / 1e6))
        .unwrap_or_default()
}

/// A time in seconds, with the CFS quota set only, as cAdvisor.
fn quota_secs(c: &Cgroup, ns: u64) -> Values {
    if c.stats.spec.cpu_quota == 0 {
        Vec::new()
    } else {
        one(secs(ns))
    }
}

/// With the CFS quota set only, as cAdvisor.
fn with_quota(c: &Cgroup, v: u64) -> Values {
    if c.stats.spec.cpu_quota == 0 {
        Vec::new()
    } else {
        one(v as f64)
    }
}

const GAUGE: &str = "gauge";
const COUNTER: &str = "counter";

/// cAdvisor's container families under the kubelet's metric set, by name.
const FAMILIES: &[ContainerFamily] = &[
    (
        "container_blkio_device_usage_total",
        "Blkio Device bytes usage",
        COUNTER,
        true,
        |c| {
            c.stats
                .io
                .iter()
                .flat_map(|d| {
                    d.bytes.iter().map(|(kind, v)| {
                        let labels = vec![
                            ("device", d.device.clone()),
                            ("major", d.major.to_string()),
                            ("minor", d.minor.to_string()),
                            ("operation", kind.clone()),
                        ];
                        (labels, *v as f64)
                    })
                })
                .collect()
        },
    ),
    (
        "container_cpu_cfs_burst_periods_total",
        "Number of periods when burst occurs.",
        COUNTER,
        true,
        |c| with_quota(c, c.stats.cpu.bursts),
    ),
    (
        "container_cpu_cfs_burst_seconds_total",
        "Total time duration the container has been bursted.",
        COUNTER,
        true,
        |c| quota_secs(c, c.stats.cpu.burst_ns),
    ),
    (
        "container_cpu_cfs_periods_total",
        "Number of elapsed enforcement period intervals.",
        COUNTER,
        true,
        |c| with_quota(c, c.stats.cpu.periods),
    ),
    (
        "container_cpu_cfs_throttled_periods_total",
        "Number of throttled period intervals.",
        COUNTER,
        true,
        |c| with_quota(c, c.stats.cpu.throttled_periods),
    ),
    (
        "container_cpu_cfs_throttled_seconds_total",
        "Total time duration the container has been throttled.",
        COUNTER,
        true,
        |c| quota_secs(c, c.stats.cpu.throttled_ns),
    ),
    (
        "container_cpu_load_average_10s",
        "Value of container cpu load average over the last 10 seconds.",
        GAUGE,
        true,
        |_| one(0.0),
    ),
    (
        "container_cpu_load_d_average_10s",
        "Value of container cpu load.d average over the last 10 seconds.",
        GAUGE,
        true,
        |_| one(0.0),
    ),
    (
        "container_cpu_system_seconds_total",
        "Cumulative system cpu time consumed in seconds.",
        COUNTER,
        true,
        |c| one(secs(c.stats.cpu.system_ns)),
    ),
    (
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed in seconds.",
        COUNTER,
        true,
        |c| {
            vec![(
                vec![("cpu", "total".to_string())],
                secs(c.stats.cpu.usage_ns),
            )]
        },
    ),
    (
        "container_cpu_user_seconds_total",
        "Cumulative user cpu time consumed in seconds.",
        COUNTER,
        true,
        |c| one(secs(c.stats.cpu.user_ns)),
    ),
    (
        "container_file_descriptors",
        "Number of open file descriptors for the container.",
        GAUGE,
        true,
        |c| one(c.stats.fds as f64),
    ),
    (
        "container_fs_inodes_free",
        "Number of available Inodes",
        GAUGE,
        true,
        |c| fs(c, |f| Some(f.inodes?.1 as f64)),
    ),
    (
        "container_fs_inodes_total",
        "Number of Inodes",
        GAUGE,
        true,
        |c| fs(c, |f| Some(f.inodes?.0 as f64)),
    ),
    (
        "container_fs_io_current",
        "Number of I/Os currently in progress",
        GAUGE,
        true,
        |c| disk(c, 8, false),
    ),
    (
        "container_fs_io_time_seconds_total",
        "Cumulative count of seconds spent doing I/Os",
        COUNTER,
        true,
        |c| disk(c, 9, true),
    ),
    (
        "container_fs_io_time_weighted_seconds_total",
        "Cumulative weighted I/O time in seconds",
        COUNTER,
        true,
        |c| disk(c, 10, true),
    ),
    (
        "container_fs_limit_bytes",
        "Number of bytes that can be consumed by the container on this filesystem.",
        GAUGE,
        true,
        |c| fs(c, |f| Some(f.limit? as f64)),
    ),
    (
        "container_fs_read_seconds_total",
        "Cumulative count of seconds spent reading",
        COUNTER,
        true,
        |c| disk(c, 3, true),
    ),
    (
        "container_fs_reads_bytes_total",
        "Cumulative count of bytes read",
        COUNTER,
        true,
        |c| io(c, true, "Read"),
    ),
    (
        "container_fs_reads_merged_total",
        "Cumulative count of reads merged",
        COUNTER,
        true,
        |c| disk(c, 1, false),
    ),
    (
        "container_fs_reads_total",
        "Cumulative count of reads completed",
        COUNTER,
        true,
        |c| {
            let mut values = io(c, false, "Read");
            values.extend(disk(c, 0, false));
            values
        },
    ),
    (
        "container_fs_sector_reads_total",
        "Cumulative count of sector reads completed",
        COUNTER,
        true,
        |c| disk(c, 2, false),
    ),
    (
        "container_fs_sector_writes_total",
        "Cumulative count of sector writes completed",
        COUNTER,
        true,
        |c| disk(c, 6, false),
    ),
    (
        "container_fs_usage_bytes",
        "Number of bytes that are consumed by the container on this filesystem.",
        GAUGE,
        true,
        |c| fs(c, |f| Some(f.used as f64)),
    ),
    (
        "container_fs_write_seconds_total",
        "Cumulative count of seconds spent writing",
        COUNTER,
        true,
        |c| disk(c, 7, true),
    ),
    (
        "container_fs_writes_bytes_total",
        "Cumulative count of bytes written",
        COUNTER,
        true,
        |c| io(c, true, "Write"),
    ),
    (
        "container_fs_writes_merged_total",
        "Cumulative count of writes merged",
        COUNTER,
        true,
        |c| disk(c, 5, false),
    ),
    (
        "container_fs_writes_total",
        "Cumulative count of writes completed",
        COUNTER,
        true,
        |c| {
            let mut values = io(c, false, "Write");
            values.extend(disk(c, 4, false));
            values
        },
    ),
    (
        "container_health_state",
        "The result of the container's health check",
        GAUGE,
        true,
        |_| one(-1.0),
    ),
    (
        "container_last_seen",
        "Last time a container was seen by the exporter",
        GAUGE,
        true,
        |_| one(crate::types::now().as_second() as f64),
    ),
    (
        "container_memory_cache",
        "Number of bytes of page cache memory.",
        GAUGE,
        true,
        |c| one(c.stats.memory.cache as f64),
    ),
    (
        "container_memory_failcnt",
        "Number of memory usage hits limits",
        COUNTER,
        true,
        |c| one(c.stats.memory.failcnt as f64),
    ),
    (
        "container_memory_failures_total",
        "Cumulative count of memory allocation failures.",
        COUNTER,
        true,
        |c| {
            let m = &c.stats.memory;
            let sample = |kind: &str, scope: &str, v: u64| {
                (
                    vec![
                        ("failure_type", kind.to_string()),
                        ("scope", scope.to_string()),
                    ],
                    v as f64,
                )
            };
            vec![
                sample("pgfault", "container", m.faults.0),
                sample("pgmajfault", "container", m.major_faults.0),
                sample("pgfault", "hierarchy", m.faults.1),
                sample("pgmajfault", "hierarchy", m.major_faults.1),
            ]
        },
    ),
    (
        "container_memory_kernel_usage",
        "Size of kernel memory allocated in bytes.",
        GAUGE,
        true,
        |c| one(c.stats.memory.kernel as f64),
    ),
    (
        "container_memory_mapped_file",
        "Size of memory mapped files in bytes.",
        GAUGE,
        true,
        |c| one(c.stats.memory.mapped_file as f64),
    ),
    (
        "container_memory_max_usage_bytes",
        "Maximum memory usage recorded in bytes",
        GAUGE,
        true,
        |c| one(c.stats.memory.max_usage as f64),
    ),
    (
        "container_memory_rss",
        "Size of RSS in bytes.",
        GAUGE,
        true,
        |c| one(c.stats.memory.rss as f64),
    ),
    (
        "container_memory_swap",
        "Container swap usage in bytes.",
        GAUGE,
        true,
        |c| one(c.stats.memory.swap as f64),
    ),
    (
        "container_memory_total_active_file_bytes",
        "Current total active file in bytes.",
        GAUGE,
        true,
        |c| one(c.stats.memory.active_file as f64),
    ),
    (
        "container_memory_total_inactive_file_bytes",
        "Current total inactive file in bytes.",
        GAUGE,
        true,
        |c| one(c.stats.memory.inactive_file as f64),
    ),
    (
        "container_memory_usage_bytes",
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
        GAUGE,
        true,
        |c| one(c.stats.memory.usage as f64),
    ),
    (
        "container_memory_working_set_bytes",
        "Current working set in bytes.",
        GAUGE,
        true,
        |c| one(c.stats.memory.working_set as f64),
    ),
    (
        "container_network_receive_bytes_total",
        "Cumulative count of bytes received",
        COUNTER,
        true,
        |c| net(c, |i| i.rx_bytes),
    ),
    (
        "container_network_receive_errors_total",
        "Cumulative count of errors encountered while receiving",
        COUNTER,
        true,
        |c| net(c, |i| i.rx_errors),
    ),
    (
        "container_network_receive_packets_dropped_total",
        "Cumulative count of packets dropped while receiving",
        COUNTER,
        true,
        |c| net(c, |i| i.rx_dropped),
    ),
    (
        "container_network_receive_packets_total",
        "Cumulative count of packets received",
        COUNTER,
        true,
        |c| net(c, |i| i.rx_packets),
    ),
    (
        "container_network_transmit_bytes_total",
        "Cumulative count of bytes transmitted",
        COUNTER,
        true,
        |c| net(c, |i| i.tx_bytes),
    ),
    (
        "container_network_transmit_errors_total",
        "Cumulative count of errors encountered while transmitting",
        COUNTER,
        true,
        |c| net(c, |i| i.tx_errors),
    ),
    (
        "container_network_transmit_packets_dropped_total",
        "Cumulative count of packets dropped while transmitting",
        COUNTER,
        true,
        |c| net(c, |i| i.tx_dropped),
    ),
    (
        "container_network_transmit_packets_total",
        "Cumulative count of packets transmitted",
        COUNTER,
        true,
        |c| net(c, |i| i.tx_packets),
    ),
    (
        "container_oom_events_total",
        "Count of out of memory events observed for the container",
        COUNTER,
        true,
        |c| one(c.stats.memory.oom_kills as f64),
    ),
    (
        "container_pressure_cpu_stalled_seconds_total",
        "Total time duration no tasks in the container could make progress due to CPU congestion.",
        COUNTER,
        true,
        |c| stalled(c.pressure.and_then(|p| p.cpu), true),
    ),
    (
        "container_pressure_cpu_waiting_seconds_total",
        "Total time duration tasks in the container have waited due to CPU congestion.",
        COUNTER,
        true,
        |c| stalled(c.pressure.and_then(|p| p.cpu), false),
    ),
    (
        "container_pressure_io_stalled_seconds_total",
        "Total time duration no tasks in the container could make progress due to IO congestion.",
        COUNTER,
        true,
        |c| stalled(c.pressure.and_then(|p| p.io), true),
    ),
    (
        "container_pressure_io_waiting_seconds_total",
        "Total time duration tasks in the container have waited due to IO congestion.",
        COUNTER,
        true,
        |c| stalled(c.pressure.and_then(|p| p.io), false),
    ),
    (
        "container_pressure_memory_stalled_seconds_total",
        "Total time duration no tasks in the container could make progress due to memory congestion.",
        COUNTER,
        true,
        |c| stalled(c.pressure.and_then(|p| p.memory), true),
    ),
    (
        "container_pressure_memory_waiting_seconds_total",
        "Total time duration tasks in the container have waited due to memory congestion.",
        COUNTER,
        true,
        |c| stalled(c.pressure.and_then(|p| p.memory), false),
    ),
    (
        "container_processes",
        "Number of processes running inside the container.",
        GAUGE,
        true,
        |c| one(c.stats.processes as f64),
    ),
    (
        "container_sockets",
        "Number of open sockets for the container.",
        GAUGE,
        true,
        |c| one(c.stats.sockets as f64),
    ),
    (
        "container_spec_cpu_period",
        "CPU period of the container.",
        GAUGE,
        false,
        |c| one(c.stats.spec.cpu_period as f64),
    ),
    (
        "container_spec_cpu_quota",
        "CPU quota of the container.",
        GAUGE,
        false,
        |c| with_quota(c, c.stats.spec.cpu_quota),
    ),
    (
        "container_spec_cpu_shares",
        "CPU share of the container.",
        GAUGE,
        false,
        |c| one(c.stats.spec.cpu_shares as f64),
    ),
    (
        "container_spec_memory_limit_bytes",
        "Memory limit for the container.",
        GAUGE,
        false,
        |c| one(memory_spec(c.stats.spec.memory_limit)),
    ),
    (
        "container_spec_memory_reservation_limit_bytes",
        "Memory reservation limit for the container.",
        GAUGE,
        false,
        |c| one(memory_spec(c.stats.spec.memory_reservation)),
    ),
    (
        "container_spec_memory_swap_limit_bytes",
        "Memory swap limit for the container.",
        GAUGE,
        false,
        |c| one(memory_spec(c.stats.spec.swap_limit)),
    ),
    (
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds.",
        GAUGE,
        false,
        |c| c.stats.created.map(|t| one(t as f64)).unwrap_or_default(),
    ),
    (
        "container_tasks_state",
        "Number of tasks in given state",
        GAUGE,
        true,
        |c| {
            let t = c.stats.tasks;
            [
                ("sleeping", t.sleeping),
                ("running", t.running),
                ("stopped", t.stopped),
                ("uninterruptible", t.uninterruptible),
                ("iowaiting", 0),
            ]
            .into_iter()
            .map(|(state, n)| (vec![("state", state.to_string())], n as f64))
            .collect()
        },
    ),
    (
        "container_threads",
        "Number of threads running inside the container",
        GAUGE,
        true,
        |c| one(c.stats.threads as f64),
    ),
    (
        "container_threads_max",
        "Maximum number of threads allowed inside the container, infinity if value is zero",
        GAUGE,
        true,
        |c| one(c.stats.threads_max as f64),
    ),
    (
        "container_ulimits_soft",
        "Soft ulimit values for the container root process. Unlimited if -1, except priority and nice",
        GAUGE,
        true,
        |c| {
            c.stats
                .open_files_soft
                .map(|v| vec![(vec![("ulimit", "max_open_files".to_string())], v as f64)])
                .unwrap_or_default()
        },
    ),
];

/// The text format of the machine's families (`None`: it could not be read, which
/// `machine_scrape_error` says) and of every cgroup's, read at `at_ms`.
pub(crate) fn render(machine: Option<&Machine>, cgroups: &[Cgroup], at_ms: i64) -> String {
    let mut out = String::new();
    for (name, help, kind, stamped, values) in FAMILIES {
        let mut samples: Vec<Sample> = Vec::new();
        for c in cgroups {
            let l = &c.labels;
            for (extra, value) in values(c) {
                let mut labels: Vec<(&str, &str)> = vec![
                    ("container", &l.container),
                    ("id", &l.id),
                    ("image", &l.image),
                    ("name", &l.name),
                    ("namespace", &l.namespace),
                    ("pod", &l.pod),
                ];
                labels.extend(extra.iter().map(|(k, v)| (*k, v.as_str())));
                labels.sort();
                let text: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", label_value(v)))
                    .collect();
                samples.push((
                    format!("{{{}}}", text.join(",")),
                    value,
                    stamped.then_some(at_ms),
                ));
            }
        }
        if !samples.is_empty() {
            write_family(&mut out, name, help, kind, &samples);
        }
    }
    write_family(
        &mut out,
        "container_scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
        GAUGE,
        &[(String::new(), 0.0, None)],
    );
    if let Some(m) = machine {
        let ids = format!(
            "boot_id=\"{}\",machine_id=\"{}\",system_uuid=\"{}\"",
            label_value(&m.ids.boot_id),
            label_value(&m.ids.machine_id),
            label_value(&m.ids.system_uuid),
        );
        for (name, help, values) in m.families() {
            let samples: Vec<Sample> = values
                .into_iter()
                .map(|(extra, value)| (format!("{{{ids}{extra}}}"), value, None))
                .collect();
            write_family(&mut out, name, help, GAUGE, &samples);
        }
    }
    let failed = f64::from(u8::from(machine.is_none()));
    write_family(
        &mut out,
        "machine_scrape_error",
        "1 if there was an error while getting machine metrics, 0 otherwise.",
        GAUGE,
        &[(String::new(), failed, None)],
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::stats::{Cpu, Memory, Spec};

    fn machine() -> Machine {
        Machine {
            ids: MachineIds {
                machine_id: "m".into(),
                system_uuid: String::new(),
                boot_id: "b".into(),
            },
            cores: 4,
            physical_cores: 2,
            sockets: 1,
            memory_bytes: 1 << 30,
            swap_bytes: 0,
        }
    }

    #[test]
    fn cgroups_and_the_machine_in_the_text_format() {
        let container = Cgroup {
            labels: Labels {
                id: "/kubepods/besteffort/pod1/c1".into(),
                name: "c1".into(),
                image: "quote\"d".into(),
                pod: "web".into(),
                namespace: "default".into(),
                container: "app".into(),
            },
            stats: Stats {
                cpu: Cpu {
                    usage_ns: 3_250_000_000,
                    ..Cpu::default()
                },
                memory: Memory {
                    working_set: 4096,
                    faults: (7, 70),
                    ..Memory::default()
                },
                io: vec![DeviceIo {
                    major: 8,
                    minor: 0,
                    device: "/dev/sda".into(),
                    bytes: vec![("Read".into(), 4096), ("Write".into(), 0)],
                    ops: vec![("Read".into(), 1)],
                }],
                spec: Spec {
                    cpu_shares: 2,
                    cpu_period: 100_000,
                    memory_limit: 9_223_372_036_854_771_712,
                    ..Spec::default()
                },
                open_files_soft: Some(1024),
                created: Some(1_796_551_200),
                ..Stats::default()
            },
            filesystems: vec![Filesystem {
                device: "/dev/sda1".into(),
                used: 8192,
                ..Filesystem::default()
            }],
            ..Cgroup::default()
        };
        let sandbox = Cgroup {
            labels: Labels {
                id: "/kubepods/besteffort/pod1/s1".into(),
                name: "s1".into(),
                pod: "web".into(),
                namespace: "default".into(),
                container: "POD".into(),
                ..Labels::default()
            },
            network: vec![Interface {
                name: "eth0".into(),
                rx_bytes: 1500,
                ..Interface::default()
            }],
            stats: Stats {
                spec: Spec {
                    cpu_quota: 50_000,
                    ..Spec::default()
                },
                ..Stats::default()
            },
            ..Cgroup::default()
        };
        let text = render(Some(&machine()), &[container, sandbox], 1_796_551_200_123);
        let (id, at) = ("/kubepods/besteffort/pod1/c1", 1_796_551_200_123_i64);
        let rest = format!(
            "id=\"{id}\",image=\"quote\\\"d\",name=\"c1\",namespace=\"default\",pod=\"web\""
        );
        let app = format!("container=\"app\",{rest}");
        let pod = "container=\"POD\",id=\"/kubepods/besteffort/pod1/s1\",image=\"\",name=\"s1\",namespace=\"default\",pod=\"web\"";
        let ids = "boot_id=\"b\",machine_id=\"m\",system_uuid=\"\"";
        for line in [
            "# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds."
                .to_string(),
            "# TYPE container_cpu_usage_seconds_total counter".to_string(),
            format!(
                "container_cpu_usage_seconds_total{{container=\"app\",cpu=\"total\",{rest}}} 3.25 {at}"
            ),
            format!("container_memory_working_set_bytes{{{app}}} 4096 {at}"),
            format!(
                "container_memory_failures_total{{container=\"app\",failure_type=\"pgfault\",{rest},scope=\"hierarchy\"}} 70 {at}"
            ),
            format!(
                "container_blkio_device_usage_total{{container=\"app\",device=\"/dev/sda\",id=\"{id}\",image=\"quote\\\"d\",major=\"8\",minor=\"0\",name=\"c1\",namespace=\"default\",operation=\"Read\",pod=\"web\"}} 4096 {at}"
            ),
            format!(
                "container_fs_reads_bytes_total{{container=\"app\",device=\"/dev/sda\",{rest}}} 4096 {at}"
            ),
            format!(
                "container_fs_usage_bytes{{container=\"app\",device=\"/dev/sda1\",{rest}}} 8192 {at}"
            ),
            format!("container_spec_memory_limit_bytes{{{app}}} 0"),
            format!("container_spec_cpu_shares{{{app}}} 2"),
            format!("container_start_time_seconds{{{app}}} 1796551200"),
            format!("container_ulimits_soft{{{app},ulimit=\"max_open_files\"}} 1024 {at}"),
            format!(
                "container_network_receive_bytes_total{{container=\"POD\",id=\"/kubepods/besteffort/pod1/s1\",image=\"\",interface=\"eth0\",name=\"s1\",namespace=\"default\",pod=\"web\"}} 1500 {at}"
            ),
            format!("container_spec_cpu_quota{{{pod}}} 50000"),
            format!("container_cpu_cfs_periods_total{{{pod}}} 0 {at}"),
            format!("machine_cpu_cores{{{ids}}} 4"),
            format!("machine_nvm_capacity{{{ids},mode=\"memory_mode\"}} 0"),
            "container_scrape_error 0".to_string(),
            "machine_scrape_error 0".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        assert!(
            !text.contains(&format!("container_network_receive_bytes_total{{{app}")),
            "{text}"
        );
        assert!(
            !text.contains(&format!("container_cpu_cfs_periods_total{{{app}")),
            "{text}"
        );
        assert!(
            !text.contains(&format!("container_ulimits_soft{{{pod}")),
            "{text}"
        );
        let failed = render(None, &[], 0);
        assert!(failed.contains("\nmachine_scrape_error 1\n"), "{failed}");
        assert!(!failed.contains("machine_cpu_cores"), "{failed}");
        assert!(!failed.contains("# TYPE container_memory"), "{failed}");
    }

    #[test]
    fn cgroups_are_labelled_from_the_runtimes_pods_and_containers() {
        let watched = Watched {
            pods: HashMap::from([(
                "1a2b-3c4d".to_string(),
                ("web".to_string(), "default".to_string()),
            )]),
            containers: HashMap::from([(
                "0123abcd".to_string(),
                (
                    Labels {
                        name: "0123abcd".into(),
                        container: "app".into(),
                        ..Labels::default()
                    },
                    false,
                ),
            )]),
            ..Watched::default()
        };
        let (labels, container) = watched.labels("pod1a2b-3c4d");
        assert_eq!(
            (labels.pod.as_str(), labels.namespace.as_str(), container),
            ("web", "default", None)
        );
        let (labels, container) = watched.labels("kubepods-besteffort-pod1a2b_3c4d.slice");
        assert_eq!((labels.pod.as_str(), container), ("web", None));
        let (labels, container) = watched.labels("cri-containerd-0123abcd.scope");
        assert_eq!((labels.container.as_str(), container), ("app", Some(false)));
        assert_eq!(watched.labels("burstable"), (Labels::default(), None));
    }

    #[test]
    fn cgroup_names_give_container_ids_and_pod_uids() {
        assert_eq!(container_id("0123abcd"), "0123abcd");
        assert_eq!(container_id("cri-containerd-0123abcd.scope"), "0123abcd");
        assert_eq!(pod_uid("pod1a2b-3c"), Some("1a2b-3c".to_string()));
        assert_eq!(
            pod_uid("kubepods-burstable-pod1a2b_3c.slice"),
            Some("1a2b-3c".to_string())
        );
        assert_eq!(pod_uid("kubepods"), None);
        assert_eq!(pod_uid("burstable"), None);
    }

    #[test]
    fn a_path_is_on_the_deepest_mount_holding_it() {
        let info = "\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
30 22 0:40 / /var/lib/containerd rw,relatime - xfs /dev/sdb rw
31 22 0:41 / /var/lib/containerd2 rw,relatime - xfs /dev/sdc rw
";
        let mounts = mount_entries(info);
        assert_eq!(
            mount_source(&mounts, "/var/lib/containerd/snapshots"),
            "/dev/sdb"
        );
        assert_eq!(mount_source(&mounts, "/var/lib/containerd"), "/dev/sdb");
        assert_eq!(mount_source(&mounts, "/var/lib/other"), "/dev/sda1");
        assert_eq!(mount_source(&[], "/x"), "");
    }

    #[test]
    fn this_machine_is_detected() {
        let m = Machine::detect().expect("sysfs");
        assert!(m.cores >= m.physical_cores && m.physical_cores >= m.sockets && m.sockets >= 1);
        assert!(m.memory_bytes > 0);
    }
}

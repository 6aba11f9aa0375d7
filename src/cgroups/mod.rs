//! Pod and QoS cgroups (cgroups-rs): `kubepods`, `kubepods/burstable`, `kubepods/besteffort`
//! under --cgroup-root, a `pod<uid>` cgroup per pod with limits from its containers, the
//! chosen driver's name for it handed to the runtime as the sandbox's cgroup parent, and node
//! allocatable arithmetic.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cgroups_rs::cgroup_builder::CgroupBuilder;
use cgroups_rs::{Cgroup, hierarchies};
use k8s_openapi::api::core::v1::Pod;

use crate::pod::{
    container_quantity, overhead, parse_quantity, pod_level, qos_class, requests, spec,
};

pub mod pressure;
pub mod stats;
mod usage;

/// Why a cgroup could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cgroup {path}: {message}")]
pub struct Error {
    pub path: String,
    pub message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How cgroups are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// Paths: `/kubepods/burstable/pod<uid>`.
    Cgroupfs,
    /// systemd slices: `kubepods-burstable-pod<uid>.slice`.
    Systemd,
}

pub use crate::types::Allocatable;

/// Allocatable = capacity - kube-reserved - system-reserved - the hard eviction threshold of
/// the resource (memory.available for memory, nodefs.available for ephemeral storage).
pub fn allocatable(
    capacity: &Allocatable,
    reserved: &[&std::collections::BTreeMap<String, String>],
    eviction_hard: &std::collections::BTreeMap<String, String>,
) -> Allocatable {
    let reserved_of = |name: &str| -> f64 {
        reserved
            .iter()
            .filter_map(|m| m.get(name))
            .filter_map(|q| parse_quantity(q))
            .sum()
    };
    // A threshold left out keeps upstream's default.
    let threshold = |signal: &str, default: &str, of: f64| -> f64 {
        let q = eviction_hard.get(signal).map_or(default, String::as_str);
        match q.strip_suffix('%') {
            Some(p) => p.trim().parse::<f64>().map_or(0.0, |p| of * p / 100.0),
            None => parse_quantity(q).unwrap_or(0.0),
        }
    };
    let memory = capacity.memory;
    let storage = capacity.ephemeral_storage;
    Allocatable {
        cpu: (capacity.cpu - reserved_of("cpu")).max(0.0),
        memory: (memory - reserved_of("memory") - threshold("memory.available", "100Mi", memory))
            .max(0.0),
        ephemeral_storage: (storage
            - reserved_of("ephemeral-storage")
            - threshold("nodefs.available", "10%", storage))
        .max(0.0),
        pods: capacity.pods,
    }
}

/// Limits for a pod cgroup, as upstream's ResourceConfigForPod (the pod's own resources, where
/// it sets them, in place of its containers').
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodLimits {
    pub cpu_shares: u64,
    /// Only when every container limits cpu and quotas are enforced.
    pub cpu_quota: Option<i64>,
    /// Only when every container limits memory.
    pub memory: Option<i64>,
}

/// How cpu limits become CFS quotas (cpuCFSQuota, cpuCFSQuotaPeriod).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cfs {
    /// Whether limits are enforced by a quota at all.
    pub enforce: bool,
    /// The period quotas are in, in microseconds.
    pub period: i64,
}

impl Default for Cfs {
    /// Upstream's defaults: enforced, in periods of 100 ms.
    fn default() -> Cfs {
        Cfs {
            enforce: true,
            period: 100_000,
        }
    }
}

impl Cfs {
    /// The CFS quota of `cores` of cpu in the period, at least upstream's 1 ms.
    pub fn quota(&self, cores: f64) -> i64 {
        ((cores * self.period as f64).round() as i64).max(1000)
    }
}

/// CPU shares for `cores` of cpu: 1024 per core, from whole millicores rounded down as upstream
/// computes them (25m is 25 shares), at least 2.
pub fn shares(cores: f64) -> u64 {
    let milli = (cores * 1000.0).round().max(0.0) as u64;
    (milli * 1024 / 1000).clamp(2, MAX_SHARES)
}

/// The largest cpu.shares the kernel takes (cgroup v1).
pub const MAX_SHARES: u64 = 262_144;

/// The limits of the pod's cgroup, its cpu quota as `cfs` makes them.
pub fn pod_limits(pod: &Pod, cfs: Cfs) -> PodLimits {
    let limit =
        |c: &k8s_openapi::api::core::v1::Container, key: &str| container_quantity(c, true, key);
    let s = spec(pod);
    // The pod's own limit where it sets one; else the containers', when every one has one.
    let all = |key: &str| -> Option<f64> {
        if let Some(own) = pod_level(pod, true, key) {
            return Some(own + overhead(pod, key));
        }
        s.containers
            .iter()
            .map(|c| limit(c, key))
            .sum::<Option<f64>>()
            .map(|sum| {
                s.init_containers
                    .iter()
                    .flatten()
                    .filter_map(|c| limit(c, key))
                    .fold(sum, f64::max)
                    + overhead(pod, key)
            })
    };
    let cpu_request = requests(pod).cpu;
    PodLimits {
        cpu_shares: if qos_class(pod) == "BestEffort" {
            2
        } else {
            shares(cpu_request)
        },
        cpu_quota: all("cpu")
            .filter(|_| cfs.enforce)
            .map(|cores| cfs.quota(cores)),
        memory: all("memory").map(|b| b as i64),
    }
}

/// The QoS tier a pod's cgroup sits in: none (Guaranteed sits under kubepods directly).
fn qos_dir(pod: &Pod) -> Option<&'static str> {
    match qos_class(pod) {
        "Burstable" => Some("burstable"),
        "BestEffort" => Some("besteffort"),
        _ => None,
    }
}

/// Settings of the cgroup manager.
#[derive(Clone, Debug)]
pub struct Config {
    /// --cgroup-root, e.g. `/`.
    pub root: String,
    /// --cgroups-per-qos.
    pub per_qos: bool,
    /// --enforce-node-allocatable=pods: kubepods is limited to allocatable cpu and memory.
    pub enforce_allocatable: bool,
    pub driver: Driver,
    /// --pod-max-pids: the most processes one pod may have.
    pub pod_pids_limit: Option<i64>,
    /// --cpu-cfs-quota and --cpu-cfs-quota-period.
    pub cfs: Cfs,
    /// --qos-reserved memory (behind the QOSReserved feature gate).
    pub memory_reserve: Option<MemoryReserve>,
}

/// How much of the memory requested by the pods of higher QoS classes the lower classes must
/// leave them (upstream's QOSReserved): the burstable tier is limited to allocatable less that
/// share of the Guaranteed pods' requests, the besteffort tier to that less the share of the
/// Burstable pods' requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryReserve {
    /// The share, 0 to 100.
    pub percent: i64,
    /// The node's allocatable memory in bytes.
    pub allocatable: i64,
}

impl MemoryReserve {
    /// The burstable and besteffort tiers' memory limits, for the memory the Guaranteed and
    /// the Burstable pods request.
    pub fn limits(&self, guaranteed: i64, burstable: i64) -> (i64, i64) {
        let burstable_limit = self.allocatable - guaranteed * self.percent / 100;
        (
            burstable_limit,
            burstable_limit - burstable * self.percent / 100,
        )
    }
}

/// Creates and removes the node's pod cgroups.
#[derive(Clone, Debug)]
pub struct Manager {
    config: Config,
    /// The cgroup mounts, read once: finding them parses /proc/self/mountinfo, which was a
    /// quarter of the idle agent's CPU when done on every pod sync and housekeeping pass.
    /// Upstream also detects the cgroup subsystems once, at start. On the unified (v2)
    /// hierarchy cpu shares become cpu.weight.
    hierarchy: Hierarchy,
    /// Where the memory and pids controllers live (for usage), found at start with the rest.
    memory: Option<usage::Mount>,
    pids: Option<usage::Mount>,
    /// The limits last written to each pod cgroup (by path). A sync finding the cgroup there with
    /// the same limits writes nothing: every pod sync used to rewrite them, and a write of
    /// cpu.cfs_quota_us takes a kernel-wide lock that runc's container starts wait on.
    applied: Arc<Mutex<HashMap<String, PodLimits>>>,
}

/// The node's cgroup hierarchy, as found at start.
#[derive(Clone, Debug)]
enum Hierarchy {
    V1(hierarchies::V1),
    V2(hierarchies::V2),
}

fn cgroup_error(path: &str) -> impl Fn(cgroups_rs::error::Error) -> Error + '_ {
    move |e| Error {
        path: path.to_string(),
        message: e.to_string(),
    }
}

impl Manager {
    pub fn new(config: Config) -> Self {
        let hierarchy = if hierarchies::is_cgroup2_unified_mode() {
            Hierarchy::V2(hierarchies::V2::new())
        } else {
            Hierarchy::V1(hierarchies::V1::new())
        };
        let mounts = usage::host_mounts();
        Manager {
            config,
            hierarchy,
            memory: usage::mount_of(&mounts, "memory"),
            pids: usage::mount_of(&mounts, "pids"),
            applied: Arc::default(),
        }
    }

    /// The hierarchy found at start, in the form cgroups-rs takes.
    fn hierarchy(&self) -> Box<dyn cgroups_rs::Hierarchy> {
        match &self.hierarchy {
            Hierarchy::V1(h) => Box::new(h.clone()),
            Hierarchy::V2(h) => Box::new(h.clone()),
        }
    }

    /// The cpu.shares value (v1), or its cpu.weight equivalent on v2.
    fn cpu(&self, shares: u64) -> u64 {
        match self.hierarchy {
            Hierarchy::V2(_) => shares_to_weight(shares),
            Hierarchy::V1(_) => shares,
        }
    }

    /// A path below the cgroup root, without a leading slash (relative to each hierarchy).
    fn relative(&self, parts: &[&str]) -> String {
        let root = self.config.root.trim_matches('/');
        let mut path = PathBuf::from(root);
        for p in parts {
            path.push(p);
        }
        path.to_string_lossy().trim_start_matches('/').to_string()
    }

    /// Limits the existing cgroup `path` to a reserve (kube-reserved or system-reserved: cpu
    /// as shares, memory, pid; cpu alone when `compressible_only`), as upstream enforces a
    /// reserve on its cgroup.
    pub fn enforce_reserve(
        &self,
        path: &str,
        reserve: &std::collections::BTreeMap<String, String>,
        compressible_only: bool,
    ) -> Result<()> {
        let relative = path.trim_start_matches('/');
        let error = |message: String| Error {
            path: path.to_string(),
            message,
        };
        if !Cgroup::load(self.hierarchy(), relative).exists() {
            return Err(error("the cgroup does not exist".into()));
        }
        let quantity = |name: &str| {
            reserve
                .get(name)
                .filter(|_| name == "cpu" || !compressible_only)
                .and_then(|q| parse_quantity(q))
        };
        let mut builder = CgroupBuilder::new(relative);
        if let Some(cpu) = quantity("cpu") {
            builder = builder.cpu().shares(self.cpu(shares(cpu))).done();
        }
        if let Some(memory) = quantity("memory") {
            builder = builder.memory().memory_hard_limit(memory as i64).done();
        }
        if let Some(pids) = quantity("pid") {
            builder = builder
                .pid()
                .maximum_number_of_processes(cgroups_rs::MaxValue::Value(pids as i64))
                .done();
        }
        builder
            .build(self.hierarchy())
            .map(|_| ())
            .map_err(cgroup_error(path))
    }

    /// The cgroup the pods live under (kubepods, or the cgroup root without QoS tiers).
    pub fn pods_cgroup(&self) -> String {
        let parts: &[&str] = if self.config.per_qos {
            &["kubepods"]
        } else {
            &[]
        };
        format!("/{}", self.relative(parts))
    }

    /// Creates kubepods and its QoS tiers; kubepods gets the allocatable cpu and memory.
    pub fn setup_node(&self, allocatable: &Allocatable) -> Result<()> {
        if !self.config.per_qos {
            return Ok(());
        }
        let kubepods = self.relative(&["kubepods"]);
        let (cpu, memory) = if self.config.enforce_allocatable {
            (shares(allocatable.cpu), allocatable.memory as i64)
        } else {
            // Unenforced: the cpu weight of a cgroup with no shares set, and no memory limit.
            (1024, -1)
        };
        CgroupBuilder::new(&kubepods)
            .cpu()
            .shares(self.cpu(cpu))
            .done()
            .memory()
            .memory_hard_limit(memory)
            .done()
            .build(self.hierarchy())
            .map_err(cgroup_error(&kubepods))?;
        for tier in ["burstable", "besteffort"] {
            let path = self.relative(&["kubepods", tier]);
            CgroupBuilder::new(&path)
                .cpu()
                .shares(self.cpu(2))
                .done()
                .build(self.hierarchy())
                .map_err(cgroup_error(&path))?;
        }
        Ok(())
    }

    /// The cgroup path of the pod, relative to each hierarchy's root.
    fn pod_path(&self, pod: &Pod) -> Option<String> {
        if !self.config.per_qos {
            return None;
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let name = format!("pod{uid}");
        Some(match qos_dir(pod) {
            Some(tier) => self.relative(&["kubepods", tier, &name]),
            None => self.relative(&["kubepods", &name]),
        })
    }

    /// The sandbox's cgroup parent in the driver's naming.
    pub fn pod_parent(&self, pod: &Pod) -> String {
        match (self.pod_path(pod), self.config.driver) {
            (None, _) => format!("/{}", self.config.root.trim_matches('/')),
            (Some(path), Driver::Cgroupfs) => format!("/{path}"),
            (Some(_), Driver::Systemd) => {
                let uid = pod
                    .metadata
                    .uid
                    .as_deref()
                    .unwrap_or_default()
                    .replace('-', "_");
                match qos_dir(pod) {
                    Some(tier) => format!("kubepods-{tier}-pod{uid}.slice"),
                    None => format!("kubepods-pod{uid}.slice"),
                }
            }
        }
    }

    /// Creates the pod's cgroup with its limits, or writes them again when they changed or the
    /// cgroup went missing.
    pub fn ensure_pod(&self, pod: &Pod) -> Result<()> {
        self.ensure_pod_limits(pod, pod_limits(pod, self.config.cfs))
    }

    /// Before the pod's containers are resized: its cgroup's cpu quota and memory limit become
    /// the larger of the old and the new ones (none, when the old ones are not known since a
    /// restart), so that neither a container's new limit (above the old) nor the pod's new
    /// limit (below a container's old) is refused; `ensure_pod` after the resize sets the new
    /// ones.
    pub fn widen_pod(&self, pod: &Pod) -> Result<()> {
        let Some(path) = self.pod_path(pod) else {
            return Ok(());
        };
        let new = pod_limits(pod, self.config.cfs);
        let old = self.applied().get(&path).copied().unwrap_or(PodLimits {
            cpu_quota: None,
            memory: None,
            ..new
        });
        let larger = |a: Option<i64>, b: Option<i64>| Some(a?.max(b?));
        self.ensure_pod_limits(
            pod,
            PodLimits {
                cpu_shares: new.cpu_shares,
                cpu_quota: larger(old.cpu_quota, new.cpu_quota),
                memory: larger(old.memory, new.memory),
            },
        )
    }

    fn ensure_pod_limits(&self, pod: &Pod, limits: PodLimits) -> Result<()> {
        let Some(path) = self.pod_path(pod) else {
            return Ok(());
        };
        let exists = Cgroup::load(self.hierarchy(), path.as_str()).exists();
        if exists && self.applied().get(&path) == Some(&limits) {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let mut builder = CgroupBuilder::new(&path)
            .cpu()
            .shares(self.cpu(limits.cpu_shares))
            .period(self.config.cfs.period.unsigned_abs())
            .quota(limits.cpu_quota.unwrap_or(-1))
            .done();
        if let Some(memory) = limits.memory {
            builder = builder.memory().memory_hard_limit(memory).done();
        }
        if let Some(pids) = self.config.pod_pids_limit {
            builder = builder
                .pid()
                .maximum_number_of_processes(cgroups_rs::MaxValue::Value(pids))
                .done();
        }
        builder
            .build(self.hierarchy())
            .map_err(cgroup_error(&path))?;
        let operation = if exists { "update" } else { "create" };
        crate::metrics::get().cgroup_operation(operation, started.elapsed());
        self.applied().insert(path, limits);
        Ok(())
    }

    fn applied(&self) -> std::sync::MutexGuard<'_, HashMap<String, PodLimits>> {
        self.applied.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Removes the pod's cgroup (after its containers are gone; runc removes only theirs).
    pub fn remove_pod(&self, pod_uid: &str) -> Result<()> {
        if !self.config.per_qos {
            return Ok(());
        }
        let name = format!("pod{pod_uid}");
        for parts in [
            vec!["kubepods", "burstable", name.as_str()],
            vec!["kubepods", "besteffort", name.as_str()],
            vec!["kubepods", name.as_str()],
        ] {
            let path = self.relative(&parts);
            self.applied().remove(&path);
            let cg = Cgroup::load(self.hierarchy(), &path);
            if cg.exists() {
                let started = std::time::Instant::now();
                remove_tree(&path).map_err(|e| Error {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
                crate::metrics::get().cgroup_operation("destroy", started.elapsed());
            }
        }
        Ok(())
    }

    /// Sets the burstable tier's cpu shares to the sum of its pods' requests.
    pub fn update_qos(&self, pods: &[&Pod]) -> Result<()> {
        if !self.config.per_qos {
            return Ok(());
        }
        let burstable: f64 = pods
            .iter()
            .filter(|p| qos_dir(p) == Some("burstable"))
            .map(|p| requests(p).cpu)
            .sum();
        let path = self.relative(&["kubepods", "burstable"]);
        CgroupBuilder::new(&path)
            .cpu()
            .shares(self.cpu(shares(burstable)))
            .done()
            .build(self.hierarchy())
            .map_err(cgroup_error(&path))?;
        if let Some(reserve) = self.config.memory_reserve {
            let requested = |class: &str| -> i64 {
                pods.iter()
                    .filter(|p| qos_class(p) == class)
                    .map(|p| requests(p).memory as i64)
                    .sum()
            };
            let (burstable, besteffort) =
                reserve.limits(requested("Guaranteed"), requested("Burstable"));
            self.limit_tier("burstable", burstable)?;
            self.limit_tier("besteffort", besteffort)?;
        }
        Ok(())
    }

    /// Sets a QoS tier's memory limit; a tier that already uses more is held where it is, so
    /// that it cannot grow (upstream's retry of its memory reserve).
    fn limit_tier(&self, tier: &str, limit: i64) -> Result<()> {
        let path = self.relative(&["kubepods", tier]);
        let set = |limit: i64| {
            CgroupBuilder::new(&path)
                .memory()
                .memory_hard_limit(limit.max(0))
                .done()
                .build(self.hierarchy())
                .map(|_| ())
                .map_err(cgroup_error(&path))
        };
        if set(limit).is_ok() {
            return Ok(());
        }
        let usage = self
            .memory
            .as_ref()
            .and_then(|m| usage::usage(&m.point.join(&path), m.v2))
            .map_or(limit, |u| u as i64);
        set(limit.max(usage))
    }

    /// The memory limit last given to the pod's cgroup (`Some(None)`: none); `None` when not
    /// known (the agent has not set the pod's limits since it started).
    pub fn pod_memory_limit(&self, pod: &Pod) -> Option<Option<i64>> {
        let path = self.pod_path(pod)?;
        self.applied().get(&path).map(|l| l.memory)
    }

    /// The memory the pod's cgroup uses (bytes, page cache included), when it can be read.
    pub fn pod_memory_usage(&self, pod: &Pod) -> Option<u64> {
        let mount = self.memory.as_ref()?;
        usage::usage(&mount.point.join(self.pod_path(pod)?), mount.v2)
    }

    /// The pod cgroup's memory working set (bytes), when its cgroup can be read.
    pub fn pod_memory_working_set(&self, pod: &Pod) -> Option<u64> {
        let mount = self.memory.as_ref()?;
        usage::working_set(&mount.point.join(self.pod_path(pod)?), mount.v2)
    }

    /// The number of processes in the pod's cgroup.
    pub fn pod_pids(&self, pod: &Pod) -> Option<u64> {
        usage::pids(&self.pids.as_ref()?.point.join(self.pod_path(pod)?))
    }

    /// A kernel notification, as an eventfd, of the node's memory working set crossing
    /// `working_set` bytes, and whether it was past them already once armed; `None` where the
    /// kernel has none (the memory controller on the unified hierarchy, which only notifies
    /// about limits).
    pub fn node_memory_threshold(
        &self,
        working_set: u64,
    ) -> Option<std::io::Result<(std::os::fd::OwnedFd, bool)>> {
        let mount = self.memory.as_ref().filter(|m| !m.v2)?;
        Some(usage::arm_threshold(&mount.point, working_set))
    }

    /// The node's memory working set: the root memory cgroup's (v1), or what /proc/meminfo
    /// says is not available (a v2 root cgroup has no usage file).
    pub fn node_memory_working_set(&self) -> Option<u64> {
        if let Some(mount) = self.memory.as_ref().filter(|m| !m.v2)
            && let Some(ws) = usage::working_set(&mount.point, false)
        {
            return Some(ws);
        }
        usage::meminfo_used(&std::fs::read_to_string("/proc/meminfo").ok()?)
    }
}

pub use usage::Usage;

/// What each cgroup of `paths` used (CPU time, memory), read where the memory and cpu
/// accounting controllers live (`None` in `paths`: this process's own cgroups, from
/// /proc/self/cgroup); `None` for one that cannot be read. The mounts are read once for all.
pub fn usages(paths: &[Option<&str>]) -> Vec<Option<Usage>> {
    let mounts = usage::host_mounts();
    paths
        .iter()
        .map(|path| match path {
            Some(path) => usage::of(&mounts, path),
            None => own_usage(&mounts),
        })
        .collect()
}

/// What this process's own cgroups used: its memory cgroup's and its cpu accounting cgroup's
/// (on the unified hierarchy they are one).
fn own_usage(mounts: &[usage::Mount]) -> Option<Usage> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path_of = |controller: &str| {
        text.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let listed = controllers.split(',').any(|c| c == controller);
            (listed || controllers.is_empty()).then(|| path.to_string())
        })
    };
    usage::of_paths(mounts, &path_of("memory")?, &path_of("cpuacct")?)
}

/// Moves this process into the cgroup `path` of every hierarchy, made where missing, as
/// --kubelet-cgroups asks. On the unified hierarchy, where the memory controller is enabled for
/// it, the cgroup's memory.min becomes `floor`, so the kernel reclaims the agent's memory last;
/// cgroup v1 has no floor to set.
pub fn enter(path: &str, floor: Option<u64>) -> std::io::Result<()> {
    for mount in usage::host_mounts() {
        join(
            &mount.point,
            path,
            mount.v2.then_some(floor).flatten(),
            std::process::id(),
        )
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", mount.point.display())))?;
    }
    Ok(())
}

/// [`enter`] in the hierarchy mounted at `point`: each missing level is made, a new cpuset
/// level gets its parent's CPUs and memory nodes (v1 takes no process in a cpuset without
/// them), then `floor` goes to memory.min and `pid` into the cgroup.
fn join(point: &Path, path: &str, floor: Option<u64>, pid: u32) -> std::io::Result<()> {
    let mut dir = point.to_path_buf();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        let parent = dir.clone();
        dir.push(part);
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let own = dir.join(file);
            let empty = std::fs::read_to_string(&own).is_ok_and(|v| v.trim().is_empty());
            if empty {
                std::fs::write(&own, std::fs::read_to_string(parent.join(file))?.trim())?;
            }
        }
    }
    if let Some(floor) = floor {
        let min = dir.join("memory.min");
        if min.exists() {
            std::fs::write(min, floor.to_string())?;
        } else {
            tracing::warn!(cgroup = %dir.display(), "the memory controller is not enabled for the agent's cgroup: no memory floor");
        }
    }
    std::fs::write(dir.join("cgroup.procs"), pid.to_string())
}

/// Removes `path` (relative to each hierarchy) with any empty child cgroups, deepest first, in
/// every hierarchy. A cgroup that still has processes stays and is reported.
pub fn remove_tree(path: &str) -> std::io::Result<()> {
    for mount in usage::host_mounts() {
        let dir = mount.point.join(path);
        if dir.is_dir() {
            remove_dirs(&dir)?;
        }
    }
    Ok(())
}

fn remove_dirs(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_dirs(&entry.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// cpu.shares (2..262144) as cgroup v2's cpu.weight (1..10000), by upstream's formula.
pub fn shares_to_weight(shares: u64) -> u64 {
    let shares = shares.clamp(2, 262_144);
    1 + ((shares - 2) * 9999) / 262_142
}

/// Whether the host runs the unified (v2) cgroup hierarchy alone.
pub fn unified() -> bool {
    hierarchies::is_cgroup2_unified_mode()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_reserve_keeps_a_share_of_the_higher_classes_requests_from_the_lower() {
        let half = MemoryReserve {
            percent: 50,
            allocatable: 1000,
        };
        assert_eq!(half.limits(200, 100), (900, 850));
        let all = MemoryReserve {
            percent: 100,
            ..half
        };
        assert_eq!(all.limits(200, 100), (800, 700));
        assert_eq!(all.limits(0, 0), (1000, 1000));
    }

    #[test]
    fn cpu_limits_become_quotas_in_the_period_unless_quotas_are_off() {
        use serde_json::json;
        let g = pod("q", &[json!({"limits": {"cpu": "500m", "memory": "1Gi"}})]);
        assert_eq!(pod_limits(&g, Cfs::default()).cpu_quota, Some(50_000));
        let short = Cfs {
            enforce: true,
            period: 20_000,
        };
        assert_eq!(pod_limits(&g, short).cpu_quota, Some(10_000));
        // Never under upstream's 1 ms.
        assert_eq!(short.quota(0.01), 1000);
        let off = Cfs {
            enforce: false,
            ..Cfs::default()
        };
        assert_eq!(pod_limits(&g, off).cpu_quota, None);
    }

    #[test]
    fn the_agent_joins_its_cgroup_with_its_parents_cpuset_and_a_memory_floor() {
        let point = tempfile::tempdir().expect("tempdir");
        let root = point.path();
        std::fs::write(root.join("cpuset.cpus"), "0-1\n").unwrap();
        std::fs::write(root.join("cpuset.mems"), "0\n").unwrap();
        // A kernel gives a new cgroup its files; here the levels are made with them, empty.
        for level in ["system", "system/agent"] {
            std::fs::create_dir(root.join(level)).unwrap();
            for file in ["cpuset.cpus", "cpuset.mems", "memory.min"] {
                std::fs::write(root.join(level).join(file), "").unwrap();
            }
        }
        join(root, "/system/agent", Some(64 << 20), 4242).unwrap();
        let read = |f: &str| std::fs::read_to_string(root.join("system/agent").join(f)).unwrap();
        assert_eq!(read("cpuset.cpus"), "0-1");
        assert_eq!(read("cpuset.mems"), "0");
        assert_eq!(read("memory.min"), (64u64 << 20).to_string());
        assert_eq!(read("cgroup.procs"), "4242");

        // A hierarchy without those files (another v1 controller): the levels are made, the
        // process moved, nothing else written.
        let other = tempfile::tempdir().expect("tempdir");
        join(other.path(), "/a/b", None, 7).unwrap();
        assert_eq!(
            std::fs::read_to_string(other.path().join("a/b/cgroup.procs")).unwrap(),
            "7"
        );
        assert!(!other.path().join("a/b/memory.min").exists());
    }

    fn pod(uid: &str, resources: &[serde_json::Value]) -> Pod {
        let containers: Vec<_> = resources
            .iter()
            .enumerate()
            .map(
                |(i, r)| serde_json::json!({"name": format!("c{i}"), "image": "i", "resources": r}),
            )
            .collect();
        let mut p: Pod = serde_json::from_value(serde_json::json!({"metadata": {"name": "p", "uid": uid}, "spec": {"containers": containers}})).unwrap();
        crate::pod::apply_defaults(&mut p);
        p
    }

    #[test]
    fn pod_limits_follow_the_containers() {
        use serde_json::json;
        let g = pod(
            "u",
            &[
                json!({"limits": {"cpu": "500m", "memory": "64Mi"}}),
                json!({"limits": {"cpu": "1", "memory": "32Mi"}}),
            ],
        );
        assert_eq!(
            pod_limits(&g, Cfs::default()),
            PodLimits {
                cpu_shares: 1536,
                cpu_quota: Some(150_000),
                memory: Some(96 * 1024 * 1024)
            }
        );
        let b = pod(
            "u",
            &[
                json!({"requests": {"cpu": "250m"}, "limits": {"memory": "64Mi"}}),
                json!({}),
            ],
        );
        assert_eq!(
            pod_limits(&b, Cfs::default()),
            PodLimits {
                cpu_shares: 256,
                cpu_quota: None,
                memory: None
            }
        );
        let be = pod("u", &[json!({})]);
        assert_eq!(
            pod_limits(&be, Cfs::default()),
            PodLimits {
                cpu_shares: 2,
                cpu_quota: None,
                memory: None
            }
        );
    }

    #[test]
    fn a_pods_own_limits_bound_its_cgroup() {
        use serde_json::json;
        let mut p = pod(
            "u",
            &[
                json!({"limits": {"cpu": "100m", "memory": "16Mi"}}),
                json!({}),
            ],
        );
        p.spec.as_mut().unwrap().resources = serde_json::from_value(
            json!({"requests": {"cpu": "250m"}, "limits": {"cpu": "500m", "memory": "64Mi"}}),
        )
        .unwrap();
        assert_eq!(
            pod_limits(&p, Cfs::default()),
            PodLimits {
                cpu_shares: 256,
                cpu_quota: Some(50_000),
                memory: Some(64 * 1024 * 1024)
            }
        );
    }

    #[test]
    fn pod_cgroups_are_named_per_driver_and_qos() {
        use serde_json::json;
        let cfg = |root: &str, driver| {
            Manager::new(Config {
                root: root.into(),
                per_qos: true,
                enforce_allocatable: true,
                driver,
                pod_pids_limit: None,
                cfs: Cfs::default(),
                memory_reserve: None,
            })
        };
        let b = pod("ab-cd", &[json!({"requests": {"cpu": "1"}})]);
        let g = pod("ab-cd", &[json!({"limits": {"cpu": "1", "memory": "1Gi"}})]);
        let be = pod("ab-cd", &[json!({})]);
        assert_eq!(
            cfg("/", Driver::Cgroupfs).pod_parent(&b),
            "/kubepods/burstable/podab-cd"
        );
        assert_eq!(
            cfg("/test/x", Driver::Cgroupfs).pod_parent(&g),
            "/test/x/kubepods/podab-cd"
        );
        assert_eq!(
            cfg("/", Driver::Cgroupfs).pod_parent(&be),
            "/kubepods/besteffort/podab-cd"
        );
        assert_eq!(
            cfg("/", Driver::Systemd).pod_parent(&b),
            "kubepods-burstable-podab_cd.slice"
        );
        let flat = Manager::new(Config {
            root: "/r".into(),
            per_qos: false,
            enforce_allocatable: true,
            driver: Driver::Cgroupfs,
            pod_pids_limit: None,
            cfs: Cfs::default(),
            memory_reserve: None,
        });
        assert_eq!(flat.pod_parent(&b), "/r");
    }

    #[test]
    fn cpu_shares_round_down_from_millicores_as_upstream() {
        assert_eq!(shares(0.025), 25);
        assert_eq!(shares(0.15), 153);
        assert_eq!(shares(1.0), 1024);
        assert_eq!(shares(0.0), 2);
        assert_eq!(shares(1000.0), MAX_SHARES);
    }

    #[test]
    fn cpu_shares_map_onto_v2_weights_as_upstream() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(0), 1);
    }

    #[test]
    fn allocatable_subtracts_reservations_and_eviction() {
        let gib = 1024.0 * 1024.0 * 1024.0;
        let kube: std::collections::BTreeMap<String, String> = [
            ("cpu".into(), "500m".into()),
            ("memory".into(), "1Gi".into()),
        ]
        .into();
        let system: std::collections::BTreeMap<String, String> =
            [("memory".into(), "512Mi".into())].into();
        let capacity = |cpu, memory| Allocatable {
            cpu,
            memory,
            ephemeral_storage: 100.0 * gib,
            pods: 110,
        };
        let a = allocatable(
            &capacity(4.0, 8.0 * gib),
            &[&kube, &system],
            &Default::default(),
        );
        assert_eq!(a.cpu, 3.5);
        assert_eq!(a.memory, 8.0 * gib - 1.5 * gib - 100.0 * 1024.0 * 1024.0);
        assert_eq!(a.ephemeral_storage, 90.0 * gib);
        let pct: std::collections::BTreeMap<String, String> = [
            ("memory.available".into(), "10%".into()),
            ("nodefs.available".into(), "1Gi".into()),
        ]
        .into();
        let a = allocatable(&capacity(1.0, 10.0 * gib), &[], &pct);
        assert_eq!(a.memory, 9.0 * gib);
        assert_eq!(a.ephemeral_storage, 99.0 * gib);
    }

    #[test]
    fn requests_count_the_largest_init_container() {
        use serde_json::json;
        let mut p = pod(
            "u",
            &[json!({"requests": {"cpu": "100m", "memory": "10Mi"}})],
        );
        p.spec.as_mut().unwrap().init_containers = Some(vec![serde_json::from_value(
            json!({"name": "i", "image": "i", "resources": {"requests": {"cpu": "2", "memory": "1Mi"}}}),
        )
        .unwrap()]);
        assert_eq!(
            (requests(&p).cpu, requests(&p).memory),
            (2.0, 10.0 * 1024.0 * 1024.0)
        );
    }
}

//! `/stats/summary` in the upstream Summary API shape: the node's CPU, memory, network and
//! filesystems from /proc and statvfs, each pod's containers from the runtime's container stats,
//! and each pod's network, volumes and ephemeral storage (`network.rs`, `storage.rs`); and the
//! metrics of `/metrics/resource` (`resource.rs`) and `/metrics/cadvisor` (`cadvisor.rs`).

mod cadvisor;
mod network;
pub mod resource;
mod storage;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::{Value, json};

use crate::cgroups::pressure::{self, Pressure, Pressures, Psi};
use crate::runtime::{
    ContainerState, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID, RuntimeClient, cri,
};
use crate::status;

/// What the summary is made from.
#[derive(Clone)]
pub struct Source {
    pub runtime: RuntimeClient,
    pub node_name: String,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub statuses: status::Reader,
    /// The cgroups reported as system containers (kubelet, runtime, misc, pods), by name;
    /// `None`: the agent's own.
    pub system_containers: Vec<(String, Option<String>)>,
}

impl Source {
    /// What each container's logs use on the filesystem, by (uid, namespace, pod, container),
    /// for upstream's `kubelet_container_log_filesystem_used_bytes`: the containers of these
    /// pods that have a log directory.
    pub async fn log_usage(&self, pods: Vec<status::Entry>) -> Vec<([String; 4], u64)> {
        let (root_dir, logs_dir) = (self.root_dir.clone(), self.pod_logs_dir.clone());
        let walk = move || storage::log_usage(&root_dir, &logs_dir, &pods);
        tokio::task::spawn_blocking(walk).await.unwrap_or_default()
    }

    /// The cgroup the pods live in: the `pods` system container's.
    fn pods_cgroup(&self) -> Option<&str> {
        self.system_containers
            .iter()
            .find(|(name, _)| name == "pods")
            .and_then(|(_, path)| path.as_deref())
    }
}

/// Each system container's CPU time (ns) at the last scrape, for a usage rate.
static LAST_SYSTEM_CPU: Mutex<Option<std::collections::HashMap<String, (Instant, u64)>>> =
    Mutex::new(None);

/// A system container as upstream's summary reports it: its name, CPU and memory.
fn system_container(name: &str, u: crate::cgroups::Usage, time: &str, now: Instant) -> Value {
    let nano_cores = {
        let mut last = LAST_SYSTEM_CPU.lock().unwrap_or_else(|e| e.into_inner());
        let last = last.get_or_insert_with(Default::default);
        let rate = last.get(name).and_then(|(at, ns)| {
            let secs = now.duration_since(*at).as_secs_f64();
            (secs > 0.0).then(|| (u.cpu_ns.saturating_sub(*ns) as f64 / secs) as u64)
        });
        last.insert(name.to_string(), (now, u.cpu_ns));
        rate.unwrap_or(0)
    };
    let mut stats = json!({
        "name": name,
        "startTime": START.get_or_init(|| crate::types::now().to_string()),
        "cpu": {
            "time": time,
            "usageNanoCores": nano_cores,
            "usageCoreNanoSeconds": u.cpu_ns,
        },
        "memory": {
            "time": time,
            "usageBytes": u.memory,
            "workingSetBytes": u.working_set,
            "rssBytes": u.rss,
            "pageFaults": u.page_faults,
            "majorPageFaults": u.major_page_faults,
        },
        "swap": {"time": time, "swapUsageBytes": u.swap},
    });
    if let Some(limit) = u.limit {
        stats["memory"]["availableBytes"] = json!(limit.saturating_sub(u.working_set));
    }
    stats
}

/// When the agent first reported its system containers: their start time (the cgroups' own
/// creation time is not kept by the kernel).
static START: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The node's CPU time (ns) at the last scrape, for a usage rate.
static LAST_CPU: Mutex<Option<(Instant, u64)>> = Mutex::new(None);

/// The node's busy CPU time in nanoseconds, from /proc/stat (USER_HZ is 100 on Linux).
pub fn node_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: everything but idle and iowait.
    let busy: u64 = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|i| fields.get(*i))
        .sum();
    Some(busy * 10_000_000)
}

fn meminfo() -> BTreeMap<String, u64> {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let kb: u64 = v.split_whitespace().next()?.parse().ok()?;
            Some((k.to_string(), kb * 1024))
        })
        .collect()
}

/// The Summary API's view of the filesystem holding `path`.
fn fs_stats(path: &str, time: &str) -> Value {
    let Some(fs) = crate::host::fs_stats(path) else {
        return json!({ "time": time });
    };
    json!({
        "time": time,
        "availableBytes": fs.available,
        "capacityBytes": fs.capacity,
        "usedBytes": fs.capacity.saturating_sub(fs.free),
        "inodesFree": fs.inodes_free,
        "inodes": fs.inodes,
        "inodesUsed": fs.inodes.saturating_sub(fs.inodes_free),
    })
}

fn value(v: &Option<cri::UInt64Value>) -> u64 {
    v.as_ref().map_or(0, |v| v.value)
}

fn container_entry(
    s: &cri::ContainerStats,
    time: &str,
    created: Option<i64>,
    pressure: Option<&Pressure>,
    swap_off: bool,
) -> Value {
    let name = s
        .attributes
        .as_ref()
        .and_then(|a| a.metadata.as_ref())
        .map(|m| m.name.clone())
        .unwrap_or_default();
    let cpu = s.cpu.unwrap_or_default();
    let mem = s.memory.unwrap_or_default();
    let layer = s.writable_layer.clone().unwrap_or_default();
    let mut entry = json!({
        "name": name,
        "cpu": {
            "time": time,
            "usageNanoCores": value(&cpu.usage_nano_cores),
            "usageCoreNanoSeconds": value(&cpu.usage_core_nano_seconds),
        },
        "memory": {
            "time": time,
            "availableBytes": value(&mem.available_bytes),
            "usageBytes": value(&mem.usage_bytes),
            "workingSetBytes": value(&mem.working_set_bytes),
            "rssBytes": value(&mem.rss_bytes),
            "pageFaults": value(&mem.page_faults),
            "majorPageFaults": value(&mem.major_page_faults),
        },
        "rootfs": {
            "time": time,
            "usedBytes": value(&layer.used_bytes),
            "inodesUsed": value(&layer.inodes_used),
        },
    });
    // Swap as the runtime reports it; on a node without swap, none is used or to be had.
    if let Some(swap) = &s.swap {
        entry["swap"] = json!({"time": time, "swapUsageBytes": value(&swap.swap_usage_bytes)});
        if let Some(available) = &swap.swap_available_bytes {
            entry["swap"]["swapAvailableBytes"] = json!(available.value);
        }
    } else if swap_off {
        entry["swap"] = json!({"time": time, "swapUsageBytes": 0, "swapAvailableBytes": 0});
    }
    if let Some(pressure) = pressure {
        add_pressure(&mut entry, pressure, time);
    }
    // A container starts when it is created, as upstream's CRI stats say.
    if let Some(ns) = created.filter(|ns| *ns > 0) {
        let at = k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(ns));
        if let Ok(at) = at {
            entry["startTime"] = json!(at.to_string());
        }
    }
    entry
}

/// Sums one field of every container's stats.
fn sum(containers: &[Value], group: &str, field: &str) -> u64 {
    containers
        .iter()
        .filter_map(|c| c[group][field].as_u64())
        .sum()
}

/// One pod's stats: its containers' sums, its network (`None` on the host network, and then
/// left out as upstream does), volumes and ephemeral storage.
fn pod_stats(
    source: &Source,
    uid: &str,
    pod_ref: Value,
    mut containers: Vec<Value>,
    network: Option<Value>,
    time: &str,
) -> Value {
    let entry = source.statuses.get(&crate::types::PodUid(uid.to_string()));
    let start = entry
        .as_ref()
        .and_then(|e| e.pod.status.as_ref()?.start_time.clone())
        .map(|t| t.0.to_string());
    let files = storage::PodFiles {
        pod: entry.as_ref().map(|e| e.pod.as_ref()),
        uid,
        name: pod_ref["name"].as_str().unwrap_or_default(),
        namespace: pod_ref["namespace"].as_str().unwrap_or_default(),
        root_dir: &source.root_dir,
        pod_logs_dir: &source.pod_logs_dir,
    };
    let (volumes, ephemeral) = storage::pod_stats(&files, &mut containers, time);
    let mut stats = pod_usage(pod_ref, containers, time);
    stats["startTime"] = json!(start);
    stats["volume"] = volumes;
    stats["ephemeral-storage"] = ephemeral;
    if let Some(network) = network {
        stats["network"] = network;
    }
    stats
}

/// A pod's reference, its containers, and their CPU and memory summed.
fn pod_usage(pod_ref: Value, containers: Vec<Value>, time: &str) -> Value {
    let mut stats = json!({
        "podRef": pod_ref,
        "cpu": {
            "time": time,
            "usageNanoCores": sum(&containers, "cpu", "usageNanoCores"),
            "usageCoreNanoSeconds": sum(&containers, "cpu", "usageCoreNanoSeconds"),
        },
        "memory": {
            "time": time,
            "usageBytes": sum(&containers, "memory", "usageBytes"),
            "workingSetBytes": sum(&containers, "memory", "workingSetBytes"),
            "rssBytes": sum(&containers, "memory", "rssBytes"),
            "pageFaults": sum(&containers, "memory", "pageFaults"),
            "majorPageFaults": sum(&containers, "memory", "majorPageFaults"),
        },
    });
    // What is left below the limit, where every container has one (so the pod has one too).
    let available: Option<Vec<u64>> = containers
        .iter()
        .map(|c| c["memory"]["availableBytes"].as_u64().filter(|b| *b > 0))
        .collect();
    if let Some(available) = available.filter(|a| !a.is_empty()) {
        stats["memory"]["availableBytes"] = json!(available.iter().sum::<u64>());
    }
    // Swap where it is known for a container, summed; what is left, where each has a limit.
    if containers.iter().any(|c| c.get("swap").is_some()) {
        stats["swap"] = json!({
            "time": time,
            "swapUsageBytes": sum(&containers, "swap", "swapUsageBytes"),
        });
        let available: Option<u64> = containers
            .iter()
            .map(|c| c["swap"]["swapAvailableBytes"].as_u64().filter(|b| *b > 0))
            .sum();
        if let Some(available) = available {
            stats["swap"]["swapAvailableBytes"] = json!(available);
        }
    }
    stats["containers"] = Value::Array(containers);
    stats
}

/// Whether the node has no swap at all, by its swap stats.
fn swap_off(swap: &Value) -> bool {
    swap["swapUsageBytes"] == 0 && swap["swapAvailableBytes"] == 0
}

/// The node's CPU (its usage rate since the last reading), memory and swap, from /proc.
fn node_usage(time: &str) -> (Value, Value, Value) {
    let cpu_ns = node_cpu_ns().unwrap_or(0);
    let now = Instant::now();
    let nano_cores = {
        let mut last = LAST_CPU.lock().unwrap_or_else(|e| e.into_inner());
        let rate = last.and_then(|(at, ns)| {
            let secs = now.duration_since(at).as_secs_f64();
            (secs > 0.0).then(|| (cpu_ns.saturating_sub(ns) as f64 / secs) as u64)
        });
        *last = Some((now, cpu_ns));
        rate.unwrap_or(0)
    };
    let mem = meminfo();
    let total = mem.get("MemTotal").copied().unwrap_or(0);
    let available = mem.get("MemAvailable").copied().unwrap_or(0);
    let free = mem.get("MemFree").copied().unwrap_or(0);
    let cpu = json!({
        "time": time,
        "usageNanoCores": nano_cores,
        "usageCoreNanoSeconds": cpu_ns,
    });
    let memory = json!({
        "time": time,
        "availableBytes": available,
        "usageBytes": total.saturating_sub(free),
        "workingSetBytes": total.saturating_sub(available),
    });
    let swap_free = mem.get("SwapFree").copied().unwrap_or(0);
    let swap = json!({
        "time": time,
        "swapAvailableBytes": swap_free,
        "swapUsageBytes": mem.get("SwapTotal").copied().unwrap_or(0).saturating_sub(swap_free),
    });
    (cpu, memory, swap)
}

/// `/metrics/cadvisor`: the machine's facts (read once), and every watched cgroup's figures,
/// labelled from the runtime's sandboxes and containers. What cannot be read is left out and
/// logged: without the runtime's lists, the cgroups are still served, by `id` alone.
pub async fn cadvisor_metrics(source: &Source) -> String {
    static MACHINE: std::sync::OnceLock<cadvisor::Machine> = std::sync::OnceLock::new();
    let machine = match MACHINE.get() {
        Some(m) => Some(m),
        None => match cadvisor::Machine::detect() {
            Ok(m) => Some(MACHINE.get_or_init(|| m)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the machine's CPUs for /metrics/cadvisor");
                None
            }
        },
    };
    let (sandboxes, containers, layers) = tokio::join!(
        source.runtime.list_sandboxes(None),
        source.runtime.list_containers(None),
        source.runtime.container_stats(),
    );
    let or_none = |what: &str, e: crate::runtime::Error| {
        tracing::warn!(error = %crate::types::error_chain(&e), "cannot list the runtime's {what} for /metrics/cadvisor");
    };
    let sandboxes = sandboxes.unwrap_or_else(|e| {
        or_none("sandboxes", e);
        Vec::new()
    });
    let containers = containers.unwrap_or_else(|e| {
        or_none("containers", e);
        Vec::new()
    });
    let layers = layers.unwrap_or_else(|e| {
        or_none("container stats", e);
        Vec::new()
    });
    let mut watched = cadvisor::Watched::default();
    for s in &sandboxes {
        watched
            .pods
            .insert(s.uid.to_string(), (s.name.clone(), s.namespace.clone()));
        let labels = cadvisor::Labels {
            name: s.id.clone(),
            pod: s.name.clone(),
            namespace: s.namespace.clone(),
            container: "POD".into(),
            ..Default::default()
        };
        watched.containers.insert(s.id.clone(), (labels, true));
    }
    let by_id: std::collections::HashMap<&str, &crate::runtime::Sandbox> =
        sandboxes.iter().map(|s| (s.id.as_str(), s)).collect();
    for c in &containers {
        let pod = by_id.get(c.sandbox_id.as_str());
        let labels = cadvisor::Labels {
            name: c.id.clone(),
            image: if c.user_image.is_empty() {
                c.image.clone()
            } else {
                c.user_image.clone()
            },
            pod: pod.map(|p| p.name.clone()).unwrap_or_default(),
            namespace: pod.map(|p| p.namespace.clone()).unwrap_or_default(),
            container: c.name.clone(),
            ..Default::default()
        };
        watched.containers.insert(c.id.clone(), (labels, false));
    }
    for l in layers {
        let (Some(attrs), Some(layer)) = (l.attributes, l.writable_layer) else {
            continue;
        };
        let mountpoint = layer.fs_id.map(|f| f.mountpoint).unwrap_or_default();
        watched
            .layers
            .insert(attrs.id, (mountpoint, value(&layer.used_bytes)));
    }
    watched.roots = source
        .system_containers
        .iter()
        .filter(|(name, _)| name != "pods")
        .filter_map(|(_, path)| path.clone())
        .collect();
    watched.pods_root = source.pods_cgroup().map(str::to_string);
    let at_ms = crate::types::now().as_millisecond();
    let cgroups = tokio::task::spawn_blocking(move || watched.read())
        .await
        .unwrap_or_default();
    cadvisor::render(machine, &cgroups, at_ms)
}

/// Only the CPU and memory of the node, its pods and their running containers (with their
/// start times), in the summary's shape: what `/metrics/resource` serves, without the disk
/// walks and network reads of the whole summary (upstream's GetCPUAndMemoryStats).
pub async fn cpu_and_memory(source: &Source) -> crate::runtime::Result<Value> {
    let time = crate::types::now().to_string();
    let (cpu, memory, swap) = node_usage(&time);
    let pods: Vec<Value> = running_containers(source, &time, None, swap_off(&swap))
        .await?
        .into_values()
        .map(|(pod_ref, containers)| pod_usage(pod_ref, containers, &time))
        .collect();
    Ok(json!({
        "node": { "nodeName": source.node_name, "cpu": cpu, "memory": memory, "swap": swap },
        "pods": pods,
    }))
}

/// The node's start (its boot), its RSS and page faults (the root cgroup's), and its process
/// limits, as upstream reports them.
fn node_extras(node: &mut Value, time: &str) {
    if let Some(boot) = crate::host::boot_time() {
        node["startTime"] = json!(boot.to_string());
    }
    if let Some(Some(root)) = crate::cgroups::usages(&[Some("/")]).into_iter().next() {
        node["memory"]["rssBytes"] = json!(root.rss);
        node["memory"]["pageFaults"] = json!(root.page_faults);
        node["memory"]["majorPageFaults"] = json!(root.major_page_faults);
    }
    if let Some(pids) = crate::host::pids() {
        node["rlimit"] = json!({"time": time, "maxpid": pids.max, "curproc": pids.running});
    }
}

/// PSI as upstream's summary shows it.
fn psi(p: &Psi) -> Value {
    let stall = |s: &pressure::Stall| json!({"total": s.total, "avg10": s.avg10, "avg60": s.avg60, "avg300": s.avg300});
    json!({"full": stall(&p.full), "some": stall(&p.some)})
}

/// Adds pressure to a node's, pod's or container's stats: under cpu and memory, and as io.
fn add_pressure(stats: &mut Value, p: &Pressure, time: &str) {
    if let Some(cpu) = &p.cpu
        && stats.get("cpu").is_some()
    {
        stats["cpu"]["psi"] = psi(cpu);
    }
    if let Some(memory) = &p.memory
        && stats.get("memory").is_some()
    {
        stats["memory"]["psi"] = psi(memory);
    }
    if let Some(io) = &p.io {
        stats["io"] = json!({"time": time, "psi": psi(io)});
    }
}

/// The pressure of each system container named by a cgroup path, or (`None`) the agent's own.
fn system_pressures(paths: &[Option<&str>]) -> Vec<Option<Pressure>> {
    let named: Vec<&str> = paths.iter().flatten().copied().collect();
    let mut found = pressure::of(&named).into_iter();
    paths
        .iter()
        .map(|p| match p {
            Some(_) => found.next().flatten(),
            None => pressure::own(),
        })
        .collect()
}

/// Each pod's running containers' stats with the pod's reference, by pod UID. Exited containers
/// are left out, as upstream leaves them out: a restarted container would show twice, once
/// with nothing used. Their start (creation) times and states come from the runtime's container
/// list; without it every container is kept, with no start time.
async fn running_containers(
    source: &Source,
    time: &str,
    pressures: Option<&Pressures>,
    swap_off: bool,
) -> crate::runtime::Result<BTreeMap<String, (Value, Vec<Value>)>> {
    let stats = source.runtime.container_stats().await?;
    let listed = match source.runtime.list_containers(None).await {
        Ok(list) => Some(
            list.into_iter()
                .map(|c| (c.id, (c.created_at, c.state)))
                .collect::<std::collections::HashMap<_, _>>(),
        ),
        Err(e) => {
            tracing::warn!(error = %crate::types::error_chain(&e), "cannot list the containers for their start times");
            None
        }
    };
    let mut pods: BTreeMap<String, (Value, Vec<Value>)> = BTreeMap::new();
    for s in &stats {
        let Some(attrs) = &s.attributes else { continue };
        let known = listed.as_ref().map(|l| l.get(&attrs.id));
        if known.is_some_and(|c| c.is_none_or(|(_, state)| *state != ContainerState::Running)) {
            continue;
        }
        let label = |k: &str| attrs.labels.get(k).cloned().unwrap_or_default();
        let uid = label(LABEL_POD_UID);
        if uid.is_empty() {
            continue;
        }
        let entry = pods.entry(uid.clone()).or_insert_with(|| {
            let pod_ref = json!({
                "name": label(LABEL_POD_NAME),
                "namespace": label(LABEL_POD_NAMESPACE),
                "uid": uid,
            });
            (pod_ref, Vec::new())
        });
        let created = known.flatten().map(|(at, _)| *at);
        let pressure = pressures.and_then(|p| p.containers.get(&attrs.id));
        entry
            .1
            .push(container_entry(s, time, created, pressure, swap_off));
    }
    Ok(pods)
}

/// The summary, or the runtime's error.
pub async fn summary(source: &Source) -> crate::runtime::Result<Value> {
    let time = crate::types::now().to_string();
    let (cpu, memory, swap) = node_usage(&time);
    let pods = all_pod_stats(source, &time, swap_off(&swap)).await?;
    let image_fs = match source.runtime.image_fs().await {
        Ok(Some((mount, used))) => {
            let mut fs = fs_stats(&mount, &time);
            fs["usedBytes"] = json!(used);
            fs
        }
        _ => json!({ "time": time }),
    };
    let mut summary = json!({
        "node": {
            "nodeName": source.node_name,
            "cpu": cpu,
            "memory": memory,
            "swap": swap,
            "fs": fs_stats(&source.root_dir.to_string_lossy(), &time),
            // One filesystem holds the images and the containers' layers, as the runtime
            // reports no other: upstream then shows it as both.
            "runtime": { "imageFs": image_fs, "containerFs": image_fs },
        },
        "pods": pods,
    });
    if let Some(network) = network::node(&time) {
        summary["node"]["network"] = network;
    }
    node_extras(&mut summary["node"], &time);
    add_pressure(&mut summary["node"], &pressure::node(), &time);
    // Each container's writable layer lives on that filesystem: its capacity and inodes.
    for pod in summary["pods"].as_array_mut().into_iter().flatten() {
        for c in pod["containers"].as_array_mut().into_iter().flatten() {
            for key in ["availableBytes", "capacityBytes", "inodes", "inodesFree"] {
                if let Some(v) = image_fs.get(key) {
                    c["rootfs"][key] = v.clone();
                }
            }
        }
    }
    summary["node"]["systemContainers"] = system_containers(source, &time);
    Ok(summary)
}

/// Every pod's stats: its running containers', its network, volumes, ephemeral storage,
/// pressure and process count.
async fn all_pod_stats(
    source: &Source,
    time: &str,
    swap_off: bool,
) -> crate::runtime::Result<Vec<Value>> {
    // Pressure is read off the async workers: one walk of the pods' cgroups.
    let pods_cgroup = source.pods_cgroup().map(str::to_string);
    let pressures = tokio::task::spawn_blocking(move || {
        pods_cgroup
            .map(|root| pressure::pods(&root))
            .unwrap_or_default()
    })
    .await
    .unwrap_or_default();
    let pods = running_containers(source, time, Some(&pressures), swap_off).await?;
    // The newest ready sandbox of each pod, for its network.
    let mut sandboxes = std::collections::HashMap::new();
    for sb in source.runtime.list_sandboxes(None).await? {
        if sb.state == crate::runtime::SandboxState::Ready && pods.contains_key(&sb.uid.0) {
            sandboxes.entry(sb.uid.0).or_insert(sb.id);
        }
    }
    let mut networks = network::pods(&source.runtime, &sandboxes, time).await;
    // Volumes and logs are counted by walking the disk: off the async workers.
    let (job_source, job_time) = (source.clone(), time.to_string());
    Ok(tokio::task::spawn_blocking(move || {
        pods.into_iter()
            .map(|(uid, (pod_ref, containers))| {
                let network = networks.remove(&uid);
                let mut stats =
                    pod_stats(&job_source, &uid, pod_ref, containers, network, &job_time);
                if let Some(pressure) = pressures.pods.get(&uid) {
                    add_pressure(&mut stats, pressure, &job_time);
                }
                if let Some(count) = pressures.processes.get(&uid) {
                    stats["process_stats"] = json!({ "process_count": count });
                }
                stats
            })
            .collect::<Vec<Value>>()
    })
    .await
    .unwrap_or_else(|e| {
        tracing::error!(error = %e, "cannot compute the pods' stats for /stats/summary");
        Vec::new()
    }))
}

/// The system containers' stats (kubelet, runtime, misc, pods), each from its cgroups.
fn system_containers(source: &Source, time: &str) -> Value {
    let now = Instant::now();
    let paths: Vec<Option<&str>> = source
        .system_containers
        .iter()
        .map(|(_, path)| path.as_deref())
        .collect();
    source
        .system_containers
        .iter()
        .zip(crate::cgroups::usages(&paths))
        .zip(system_pressures(&paths))
        .filter_map(|(((name, _), usage), pressure)| {
            let mut stats = system_container(name, usage?, time, now);
            if let Some(pressure) = pressure {
                add_pressure(&mut stats, &pressure, time);
            }
            Some(stats)
        })
        .collect()
}

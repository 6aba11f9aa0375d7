//! The eviction manager: every monitoring interval (10 s), and at once when the kernel reports
//! memory pressure (see `alarm`), it observes the node's signals
//! (memory.available, nodefs.available, nodefs.inodesFree, imagefs.available, pid.available),
//! compares them with the hard thresholds (--eviction-hard), keeps the pressure conditions
//! (MemoryPressure, DiskPressure, PIDPressure) and, on a breach, asks the sync loop to evict one
//! pod, ranked the upstream way. Critical pods (priority of a system-*-critical class) are never
//! evicted.
//!
//! Unlike upstream, static pods are not all critical here: in standalone mode every pod is
//! static, and a node that could never evict would leave its protection to the kernel's OOM
//! killer. A static pod is critical when its priority says so, as control-plane manifests do.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::pod::{is_critical, priority, qos_class, requests};
use crate::runtime::RuntimeClient;
use crate::types::PodUid;
use crate::{cgroups, status};

mod alarm;

/// What the eviction manager watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    MemoryAvailable,
    NodefsAvailable,
    NodefsInodesFree,
    ImagefsAvailable,
    ImagefsInodesFree,
    PidAvailable,
}

impl Signal {
    const ALL: [Signal; 6] = [
        Signal::MemoryAvailable,
        Signal::NodefsAvailable,
        Signal::NodefsInodesFree,
        Signal::ImagefsAvailable,
        Signal::ImagefsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodefsAvailable => "nodefs.available",
            Signal::NodefsInodesFree => "nodefs.inodesFree",
            Signal::ImagefsAvailable => "imagefs.available",
            Signal::ImagefsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    pub fn parse(name: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The resource named in eviction messages.
    fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory",
            Signal::PidAvailable => "pids",
            Signal::NodefsInodesFree | Signal::ImagefsInodesFree => "inodes",
            _ => "ephemeral-storage",
        }
    }
}

/// A hard threshold: the signal must stay at or above `min` (bytes, inodes or pids, or a share
/// of the capacity).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub min: Amount,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    Quantity(f64),
    Percent(f64),
}

impl Amount {
    fn of(self, capacity: f64) -> f64 {
        match self {
            Amount::Quantity(q) => q,
            Amount::Percent(p) => capacity * p / 100.0,
        }
    }
}

/// Upstream's default hard thresholds, used when --eviction-hard is not given.
pub const DEFAULTS: [(&str, &str); 4] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("imagefs.available", "15%"),
    ("nodefs.inodesFree", "5%"),
];

/// Reads `signal -> quantity or percent`; every problem is reported.
pub fn thresholds(map: &BTreeMap<String, String>) -> Result<Vec<Threshold>, Vec<String>> {
    let defaults: BTreeMap<String, String> = DEFAULTS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let map = if map.is_empty() { &defaults } else { map };
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for (name, value) in map {
        let Some(signal) = Signal::parse(name) else {
            problems.push(format!(
                "{name:?} is not an eviction signal (one of {})",
                Signal::ALL.map(Signal::name).join(", ")
            ));
            continue;
        };
        let min = match value.strip_suffix('%') {
            Some(p) => p
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=100.0).contains(p))
                .map(Amount::Percent),
            None => crate::pod::parse_quantity(value).map(Amount::Quantity),
        };
        match min {
            Some(min) => out.push(Threshold { signal, min }),
            None => problems.push(format!(
                "{name}<{value}: not a quantity or a percentage from 0% to 100%"
            )),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// The node conditions the thresholds drive; admission refuses BestEffort pods under memory
/// pressure and every non-critical pod under disk pressure, as upstream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

impl Pressure {
    /// Why `pod` may not be admitted now, as upstream words it.
    pub fn refuses(&self, pod: &Pod) -> Option<String> {
        if is_critical(pod) {
            return None;
        }
        if self.disk {
            return Some("The node had condition: [DiskPressure]. ".into());
        }
        if self.memory && qos_class(pod) == "BestEffort" {
            return Some("The node had condition: [MemoryPressure]. ".into());
        }
        None
    }
}

/// When each condition was last breached; a condition holds until the transition period has
/// passed since then.
#[derive(Default)]
struct Breaches {
    memory: Option<Instant>,
    disk: Option<Instant>,
    pid: Option<Instant>,
}

impl Breaches {
    fn observe(&mut self, breached: Pressure, now: Instant, transition: Duration) -> Pressure {
        let hold = |last: &mut Option<Instant>, now_breached: bool| {
            if now_breached {
                *last = Some(now);
            }
            last.is_some_and(|t| now.duration_since(t) < transition)
        };
        Pressure {
            memory: hold(&mut self.memory, breached.memory),
            disk: hold(&mut self.disk, breached.disk),
            pid: hold(&mut self.pid, breached.pid),
        }
    }
}

/// A request to the sync loop: stop this pod for good and report it Failed / Evicted.
#[derive(Clone, Debug)]
pub struct Eviction {
    pub uid: PodUid,
    pub message: String,
}

/// One signal's reading.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observed {
    pub available: f64,
    pub capacity: f64,
}

/// A pod that could be evicted, with what it uses of the resource under pressure.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub pod: Arc<Pod>,
    pub usage: f64,
    pub request: f64,
}

/// Upstream's ranking: pods using more than they requested first, then lower priority, then
/// the largest use above the request. For pids there are no requests: priority, then use.
pub fn rank(signal: Signal, mut pods: Vec<Candidate>) -> Vec<Candidate> {
    let exceeds = |c: &Candidate| signal != Signal::PidAvailable && c.usage > c.request;
    pods.sort_by(|a, b| {
        exceeds(b)
            .cmp(&exceeds(a))
            .then(priority(&a.pod).cmp(&priority(&b.pod)))
            .then((b.usage - b.request).total_cmp(&(a.usage - a.request)))
    });
    pods
}

fn quantity(bytes: f64) -> String {
    const MI: f64 = 1024.0 * 1024.0;
    if bytes >= MI {
        format!("{}Mi", (bytes / MI).round() as i64)
    } else {
        format!("{}", bytes.round() as i64)
    }
}

/// Where the manager looks.
pub struct Config {
    pub thresholds: Vec<Threshold>,
    /// The filesystem of the root dir is nodefs.
    pub root_dir: PathBuf,
    /// The node's memory capacity in bytes.
    pub memory: f64,
    pub interval: Duration,
    /// How long a condition stays after the last breach (evictionPressureTransitionPeriod),
    /// so it does not flap.
    pub transition: Duration,
    /// Whether the kernel's memory notifications wake the manager (kernelMemcgNotification).
    pub notifications: bool,
}

/// The eviction manager's task.
pub struct Manager {
    pub config: Config,
    pub runtime: RuntimeClient,
    pub cgroups: cgroups::Manager,
    pub statuses: status::Reader,
}

fn fs_signal(path: &str, inodes: bool) -> Option<Observed> {
    let s = crate::host::fs_stats(path)?;
    Some(if inodes {
        Observed {
            available: s.inodes_free as f64,
            capacity: s.inodes as f64,
        }
    } else {
        Observed {
            available: s.available as f64,
            capacity: s.capacity as f64,
        }
    })
}

fn pid_signal() -> Option<Observed> {
    let pids = crate::host::pids()?;
    Some(Observed {
        available: pids.max as f64 - pids.running as f64,
        capacity: pids.max as f64,
    })
}

impl Manager {
    async fn observe(&self) -> BTreeMap<Signal, Observed> {
        let mut out = BTreeMap::new();
        let root = self.config.root_dir.display().to_string();
        if let Some(used) = self.cgroups.node_memory_working_set() {
            out.insert(
                Signal::MemoryAvailable,
                Observed {
                    available: self.config.memory - used as f64,
                    capacity: self.config.memory,
                },
            );
        }
        for (signal, inodes) in [
            (Signal::NodefsAvailable, false),
            (Signal::NodefsInodesFree, true),
        ] {
            if let Some(o) = fs_signal(&root, inodes) {
                out.insert(signal, o);
            }
        }
        if let Ok(Some((mount, _))) = self.runtime.image_fs().await {
            for (signal, inodes) in [
                (Signal::ImagefsAvailable, false),
                (Signal::ImagefsInodesFree, true),
            ] {
                if let Some(o) = fs_signal(&mount, inodes) {
                    out.insert(signal, o);
                }
            }
        }
        if let Some(o) = pid_signal() {
            out.insert(Signal::PidAvailable, o);
        }
        out
    }

    /// What each running, non-critical pod uses of the resource behind `signal`.
    async fn candidates(&self, signal: Signal) -> Vec<Candidate> {
        let pods: Vec<Arc<Pod>> = self
            .statuses
            .list()
            .into_iter()
            .filter(|e| {
                let phase = e.pod.status.as_ref().and_then(|s| s.phase.as_deref());
                matches!(phase, Some("Running" | "Pending")) && !is_critical(&e.pod)
            })
            .map(|e| e.pod)
            .collect();
        let disk = if matches!(signal, Signal::MemoryAvailable | Signal::PidAvailable) {
            BTreeMap::new()
        } else {
            self.disk_usage().await
        };
        pods.into_iter()
            .map(|pod| {
                let (usage, request) = match signal {
                    Signal::MemoryAvailable => (
                        self.cgroups.pod_memory_working_set(&pod).unwrap_or(0) as f64,
                        requests(&pod).memory,
                    ),
                    Signal::PidAvailable => (self.cgroups.pod_pids(&pod).unwrap_or(0) as f64, 0.0),
                    _ => (
                        disk.get(&PodUid::of(&pod)).copied().unwrap_or(0.0),
                        crate::pod::requests(&pod).ephemeral_storage,
                    ),
                };
                Candidate {
                    pod,
                    usage,
                    request,
                }
            })
            .collect()
    }

    /// Bytes of the containers' writable layers, per pod.
    async fn disk_usage(&self) -> BTreeMap<PodUid, f64> {
        let mut out = BTreeMap::new();
        let Ok(stats) = self.runtime.container_stats().await else {
            return out;
        };
        for s in stats {
            let uid = s
                .attributes
                .as_ref()
                .and_then(|a| a.labels.get(crate::runtime::LABEL_POD_UID))
                .cloned();
            let used = s
                .writable_layer
                .as_ref()
                .and_then(|w| w.used_bytes.as_ref())
                .map_or(0, |u| u.value);
            if let Some(uid) = uid {
                *out.entry(PodUid(uid)).or_default() += used as f64;
            }
        }
        out
    }

    /// The node's working set at which memory.available meets its highest threshold.
    fn memory_alarm(&self) -> Option<u64> {
        let min = self
            .config
            .thresholds
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable)
            .map(|t| t.min.of(self.config.memory))
            .reduce(f64::max)?;
        Some((self.config.memory - min).max(0.0) as u64)
    }

    /// One pass: the thresholds breached now, and at most one pod to evict.
    async fn synchronize(&self) -> (Pressure, Option<Eviction>) {
        let observed = self.observe().await;
        let mut pressure = Pressure::default();
        let mut breached = Vec::new();
        for t in &self.config.thresholds {
            let Some(o) = observed.get(&t.signal) else {
                continue;
            };
            let min = t.min.of(o.capacity);
            if o.available < min {
                match t.signal {
                    Signal::MemoryAvailable => pressure.memory = true,
                    Signal::PidAvailable => pressure.pid = true,
                    _ => pressure.disk = true,
                }
                breached.push((t.signal, min, *o));
            }
        }
        for (signal, min, observed) in breached {
            let ranked = rank(signal, self.candidates(signal).await);
            let Some(victim) = ranked.into_iter().next() else {
                continue;
            };
            let message = format!(
                "The node was low on resource: {}. Threshold quantity: {}, available: {}. The pod was using {}, request is {}. ({} is the capacity {} less the {} in use{})",
                signal.resource(),
                quantity(min),
                quantity(observed.available),
                quantity(victim.usage),
                quantity(victim.request),
                signal.name(),
                quantity(observed.capacity),
                quantity(observed.capacity - observed.available),
                if signal == Signal::MemoryAvailable {
                    ": the working set, without the page cache the kernel can reclaim"
                } else {
                    ""
                },
            );
            crate::metrics::get().eviction(signal.name());
            return (
                pressure,
                Some(Eviction {
                    uid: PodUid::of(&victim.pod),
                    message,
                }),
            );
        }
        (pressure, None)
    }

    /// Runs until `cancel`: starts once the sync loop has its pods (`ready`), then every
    /// interval publishes the conditions and sends at most one eviction.
    pub async fn run(
        self,
        mut ready: watch::Receiver<bool>,
        pressure: watch::Sender<Pressure>,
        evictions: mpsc::Sender<Eviction>,
        cancel: CancellationToken,
    ) {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ready.wait_for(|r| *r) => {}
        }
        let mut tick = tokio::time::interval(self.config.interval);
        let mut last_breach = Breaches::default();
        let mut alarms = alarm::Alarms::new(self.config.notifications);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
                why = alarms.fired() => tracing::debug!(why, "memory alarm"),
            }
            let (breached, eviction) = self.synchronize().await;
            alarms.arm(&self.cgroups, self.memory_alarm());
            let now = last_breach.observe(breached, Instant::now(), self.config.transition);
            let before = *pressure.borrow();
            if now != before {
                tracing::warn!(
                    memory = now.memory,
                    disk = now.disk,
                    pid = now.pid,
                    "node pressure conditions changed"
                );
                pressure.send_replace(now);
            }
            if let Some(e) = eviction
                && evictions.send(e).await.is_err()
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, priority: Option<i32>, class: Option<&str>) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "uid": name},
                "spec": {"priority": priority, "priorityClassName": class,
                         "containers": [{"name": "c"}]}
            }))
            .unwrap(),
        )
    }

    fn names(ranked: &[Candidate]) -> Vec<&str> {
        ranked
            .iter()
            .map(|c| c.pod.metadata.name.as_deref().unwrap_or_default())
            .collect()
    }

    #[test]
    fn pods_over_their_requests_go_first_then_low_priority_then_big_users() {
        let c = |name, prio, usage, request| Candidate {
            pod: pod(name, prio, None),
            usage,
            request,
        };
        let ranked = rank(
            Signal::MemoryAvailable,
            vec![
                c("within", Some(0), 50.0, 100.0),
                c("over-small", Some(0), 20.0, 10.0),
                c("over-big", Some(0), 500.0, 0.0),
                c("over-important", Some(1000), 900.0, 0.0),
            ],
        );
        assert_eq!(
            names(&ranked),
            ["over-big", "over-small", "over-important", "within"]
        );
        let pids = rank(
            Signal::PidAvailable,
            vec![c("few", Some(0), 3.0, 0.0), c("many", Some(0), 30.0, 0.0)],
        );
        assert_eq!(names(&pids), ["many", "few"]);
    }

    #[test]
    fn thresholds_read_quantities_and_percentages_and_default_upstream() {
        let t = thresholds(&BTreeMap::new()).unwrap();
        assert_eq!(t.len(), 4);
        let map: BTreeMap<String, String> = [
            ("memory.available".to_string(), "200Mi".to_string()),
            ("pid.available".to_string(), "10%".to_string()),
        ]
        .into();
        let t = thresholds(&map).unwrap();
        assert_eq!(
            t,
            vec![
                Threshold {
                    signal: Signal::MemoryAvailable,
                    min: Amount::Quantity(200.0 * 1024.0 * 1024.0)
                },
                Threshold {
                    signal: Signal::PidAvailable,
                    min: Amount::Percent(10.0)
                },
            ]
        );
        let bad: BTreeMap<String, String> = [
            ("memory.free".to_string(), "1".to_string()),
            ("nodefs.available".to_string(), "120%".to_string()),
        ]
        .into();
        assert_eq!(thresholds(&bad).unwrap_err().len(), 2);
    }

    #[test]
    fn a_condition_holds_for_the_transition_period_after_its_last_breach() {
        let mut b = Breaches::default();
        let t0 = Instant::now();
        let period = Duration::from_secs(300);
        let memory = Pressure {
            memory: true,
            ..Default::default()
        };
        assert_eq!(b.observe(memory, t0, period), memory);
        let later = t0 + Duration::from_secs(200);
        assert_eq!(b.observe(Pressure::default(), later, period), memory);
        let after = t0 + Duration::from_secs(301);
        assert_eq!(
            b.observe(Pressure::default(), after, period),
            Pressure::default()
        );
    }

    #[test]
    fn pressure_refuses_best_effort_on_memory_and_all_but_critical_on_disk() {
        let be = pod("be", None, None);
        let critical = pod("cp", Some(2_000_001_000), Some("system-node-critical"));
        let memory = Pressure {
            memory: true,
            ..Default::default()
        };
        assert!(memory.refuses(&be).is_some());
        assert!(memory.refuses(&critical).is_none());
        let disk = Pressure {
            disk: true,
            ..Default::default()
        };
        assert!(disk.refuses(&be).unwrap().contains("DiskPressure"));
        assert!(Pressure::default().refuses(&be).is_none());
    }
}

//! The CPU manager (`--cpu-manager-policy`): with the static policy, each container of a
//! Guaranteed pod that asks for a whole number of CPUs gets CPUs of its own, taken from the
//! shared pool that every other container runs in. Assignments are made at admission, kept in
//! upstream's state file `cpu_manager_state` in the root dir, and carried to the containers as
//! their cpuset: at creation, then by a reconcile loop that follows the shared pool as it
//! shrinks and grows (every `--cpu-manager-reconcile-period`, and at once after a change).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::cpuset::CpuSet;
use super::numa::NumaMask;
use super::topology::{HintProvider, Hints};
use crate::runtime::{ContainerState, RuntimeClient, cri};
use crate::types::Refusal;

/// The state file's name in the root dir, as upstream names it.
pub const STATE_FILE: &str = "cpu_manager_state";

/// The alignment boundary full-pcpus-only guarantees, as the metrics name it.
const PHYSICAL_CPU_BOUNDARY: &str = "physical_cpu";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the machine's CPU topology under /sys/devices/system/cpu")]
    Topology(#[source] std::io::Error),
    #[error("{0}")]
    Invalid(String),
    #[error(
        "could not restore state from checkpoint {path}: {why}; drain this node and delete the CPU manager checkpoint file before restarting nodelet"
    )]
    State { path: PathBuf, why: String },
    #[error("cannot write the CPU manager's state file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The CPU manager's settings, as the config reads them.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// `static`, or `none` (`false`).
    pub static_policy: bool,
    /// reservedSystemCPUs (--reserved-cpus): the CPUs kept for the system, when given.
    pub reserved_cpus: Option<CpuSet>,
    /// The kube-reserved and system-reserved cpu together, in cores: the reserved CPUs' count
    /// when no list is given (rounded up).
    pub reserved_cores: f64,
    /// cpuManagerPolicyOptions' full-pcpus-only: exclusive CPUs come in whole physical cores.
    pub full_pcpus_only: bool,
    pub reconcile_period: Duration,
}

/// One logical CPU of the machine and where it sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpu {
    pub id: u32,
    pub core: u32,
    pub socket: u32,
    /// Its NUMA node.
    pub node: u32,
}

/// The machine's CPUs (sysfs, or a fixture in tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub cpus: Vec<Cpu>,
}

impl Topology {
    /// The online CPUs with their core and socket, from sysfs.
    pub fn discover(sys: &Path) -> std::io::Result<Topology> {
        let online = std::fs::read_to_string(sys.join("online"))?;
        let online = CpuSet::parse(&online)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let mut cpus = Vec::new();
        for id in online.iter() {
            let read = |file: &str| -> u32 {
                std::fs::read_to_string(sys.join(format!("cpu{id}/topology/{file}")))
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0)
            };
            cpus.push(Cpu {
                id,
                core: read("core_id"),
                socket: read("physical_package_id"),
                node: numa_node(&sys.join(format!("cpu{id}"))),
            });
        }
        Ok(Topology { cpus })
    }

    /// The NUMA node of a CPU (0 for one the machine does not list).
    fn node_of(&self, id: u32) -> u32 {
        self.cpus.iter().find(|c| c.id == id).map_or(0, |c| c.node)
    }

    /// The NUMA nodes that have CPUs, lowest first.
    fn nodes(&self) -> Vec<u32> {
        let nodes: std::collections::BTreeSet<u32> = self.cpus.iter().map(|c| c.node).collect();
        nodes.into_iter().collect()
    }

    fn all(&self) -> CpuSet {
        self.cpus.iter().map(|c| c.id).collect()
    }

    /// The logical CPUs of a physical core.
    fn cpus_per_core(&self) -> usize {
        let mut cores: HashMap<(u32, u32), usize> = HashMap::new();
        for c in &self.cpus {
            *cores.entry((c.socket, c.core)).or_default() += 1;
        }
        cores.values().copied().max().unwrap_or(1)
    }

    /// `count` CPUs of `available`, packed as upstream's takeByTopology packs them: whole free
    /// sockets first, then whole free cores, then single CPUs from the cores with the fewest
    /// free ones (so cores stay whole), lowest ids first.
    fn take(&self, available: &CpuSet, count: usize) -> Option<CpuSet> {
        if count > available.len() {
            return None;
        }
        let mut taken = CpuSet::default();
        let group = |key: fn(&Cpu) -> (u32, u32)| {
            let mut groups: BTreeMap<(u32, u32), Vec<u32>> = BTreeMap::new();
            for c in &self.cpus {
                groups.entry(key(c)).or_default().push(c.id);
            }
            groups
        };
        for key in [|c: &Cpu| (c.socket, 0), |c: &Cpu| (c.socket, c.core)] {
            for cpus in group(key).into_values() {
                let free = |taken: &CpuSet| {
                    cpus.iter()
                        .all(|id| available.contains(*id) && !taken.contains(*id))
                };
                if count - taken.len() >= cpus.len() && free(&taken) {
                    taken = taken.union(&cpus.iter().copied().collect());
                }
            }
        }
        let mut cores: Vec<Vec<u32>> = group(|c| (c.socket, c.core))
            .into_values()
            .map(|cpus| {
                cpus.into_iter()
                    .filter(|id| available.contains(*id) && !taken.contains(*id))
                    .collect::<Vec<_>>()
            })
            .filter(|free| !free.is_empty())
            .collect();
        cores.sort_by_key(|free| (free.len(), free.first().copied()));
        let rest: Vec<u32> = cores.into_iter().flatten().collect();
        let wanted = count - taken.len();
        Some(taken.union(&rest.into_iter().take(wanted).collect()))
    }
}

/// A CPU's NUMA node: the `nodeN` link in its sysfs dir (0 on a kernel without NUMA).
fn numa_node(dir: &Path) -> u32 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .find_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
        .unwrap_or(0)
}

/// The state file in upstream's v2 format.
#[derive(Debug, Default, Deserialize, Serialize)]
struct Checkpoint {
    #[serde(rename = "policyName")]
    policy_name: String,
    #[serde(rename = "defaultCpuSet")]
    default_cpu_set: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    entries: BTreeMap<String, BTreeMap<String, String>>,
    checksum: u64,
}

impl Checkpoint {
    /// Upstream's checksum: FNV-1a (32 bits) over the Go dump of the checkpoint with a zero
    /// checksum, under the struct name older kubelets expect.
    fn checksum(&self) -> u64 {
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|(pod, containers)| {
                let inner: Vec<String> =
                    containers.iter().map(|(c, s)| format!("{c}:{s}")).collect();
                format!("{pod}:map[{}]", inner.join(" "))
            })
            .collect();
        let dump = format!(
            "(*state.CPUManagerCheckpoint){{PolicyName:(string){} DefaultCPUSet:(string){} Entries:(map[string]map[string]string)map[{}] Checksum:(checksum.Checksum)0}}",
            self.policy_name,
            self.default_cpu_set,
            entries.join(" ")
        );
        let mut hash: u32 = 0x811c_9dc5;
        for b in dump.bytes() {
            hash ^= u32::from(b);
            hash = hash.wrapping_mul(0x0100_0193);
        }
        u64::from(hash)
    }
}

/// What the CPUs are given to.
#[derive(Debug, Default)]
struct State {
    /// The shared pool: every CPU no container holds for itself (the reserved ones included).
    default: CpuSet,
    /// pod UID -> container name -> its exclusive CPUs.
    entries: BTreeMap<String, BTreeMap<String, CpuSet>>,
}

/// The static policy's fixed facts.
#[derive(Debug)]
struct Static {
    topology: Topology,
    reserved: CpuSet,
    full_pcpus_only: bool,
}

/// The CPU manager; cheap to share.
#[derive(Debug)]
pub struct CpuManager {
    policy: Option<Static>,
    state: Mutex<State>,
    path: PathBuf,
    changed: Notify,
    reconcile_period: Duration,
}

/// The whole CPUs a container asks for exclusively: a Guaranteed pod's container with an
/// integer cpu request (equal to its limit), else none.
fn exclusive_cpus(guaranteed: bool, c: &Container) -> usize {
    let request = crate::pod::container_quantity(c, false, "cpu").unwrap_or(0.0);
    if !guaranteed || request < 1.0 || (request - request.round()).abs() > 1e-9 {
        return 0;
    }
    request.round() as usize
}

impl CpuManager {
    /// Starts the manager: the reserved CPUs, and the state file read (checked against the
    /// policy and the machine) or begun.
    pub fn start(
        settings: &Settings,
        root_dir: &Path,
        topology: Topology,
    ) -> Result<Arc<CpuManager>, Error> {
        let path = root_dir.join(STATE_FILE);
        let all = topology.all();
        if settings.full_pcpus_only && !settings.static_policy {
            return Err(Error::Invalid(
                "the none CPU manager policy takes no options (full-pcpus-only is the static policy's)".into(),
            ));
        }
        let policy = if settings.static_policy {
            let reserved = match &settings.reserved_cpus {
                Some(list) => list.clone(),
                None => {
                    let count = (settings.reserved_cores - 1e-9).ceil().max(0.0) as usize;
                    topology.take(&all, count).ok_or_else(|| {
                        Error::Invalid(format!(
                            "cannot reserve {count} CPUs of the machine's {}",
                            all.len()
                        ))
                    })?
                }
            };
            if reserved.is_empty() {
                return Err(Error::Invalid("the static CPU manager policy requires systemreserved.cpu + kubereserved.cpu or --reserved-cpus to reserve at least one CPU".into()));
            }
            if !reserved.is_subset(&all) {
                return Err(Error::Invalid(format!(
                    "--reserved-cpus {reserved} are not all among the machine's online CPUs {all}"
                )));
            }
            if settings.full_pcpus_only && !reserved.len().is_multiple_of(topology.cpus_per_core())
            {
                return Err(Error::Invalid(format!(
                    "the full-pcpus-only option wants whole physical cores reserved ({} CPUs each), not {} CPUs",
                    topology.cpus_per_core(),
                    reserved.len()
                )));
            }
            Some(Static {
                topology,
                reserved,
                full_pcpus_only: settings.full_pcpus_only,
            })
        } else {
            None
        };
        let manager = CpuManager {
            state: Mutex::new(State::default()),
            path,
            changed: Notify::new(),
            reconcile_period: settings.reconcile_period,
            policy,
        };
        let state = manager.restore(&all)?;
        *manager.lock() = state;
        manager.save()?;
        if manager.policy.is_some() {
            let metrics = crate::metrics::get();
            metrics.declare_alignment("container", PHYSICAL_CPU_BOUNDARY, true);
            metrics.declare_alignment("container", "uncore_cache", false);
            manager.publish();
        }
        Ok(Arc::new(manager))
    }

    fn policy_name(&self) -> &'static str {
        if self.policy.is_some() {
            "static"
        } else {
            "none"
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state the file holds, checked as upstream's validateState checks it.
    fn restore(&self, all: &CpuSet) -> Result<State, Error> {
        let fail = |why: String| Error::State {
            path: self.path.clone(),
            why,
        };
        let fresh = || State {
            default: if self.policy.is_some() {
                all.clone()
            } else {
                CpuSet::default()
            },
            entries: BTreeMap::new(),
        };
        let text = match std::fs::read(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(fresh()),
            Err(e) => return Err(fail(e.to_string())),
        };
        let checkpoint: Checkpoint = serde_json::from_slice(&text)
            .map_err(|e| fail(format!("not a CPU manager checkpoint: {e}")))?;
        if checkpoint.checksum != checkpoint.checksum() {
            return Err(fail(
                "checkpoint is corrupted (its checksum does not match)".into(),
            ));
        }
        if checkpoint.policy_name != self.policy_name() {
            return Err(fail(format!(
                "configured policy {:?} differs from state checkpoint policy {:?}",
                self.policy_name(),
                checkpoint.policy_name
            )));
        }
        let parse = |text: &str| CpuSet::parse(text).map_err(&fail);
        let mut state = State {
            default: parse(&checkpoint.default_cpu_set)?,
            entries: BTreeMap::new(),
        };
        for (pod, containers) in &checkpoint.entries {
            for (name, cpus) in containers {
                state
                    .entries
                    .entry(pod.clone())
                    .or_default()
                    .insert(name.clone(), parse(cpus)?);
            }
        }
        let Some(policy) = &self.policy else {
            return Ok(state);
        };
        if state.default.is_empty() && state.entries.is_empty() {
            return Ok(fresh());
        }
        if !policy.reserved.is_subset(&state.default) {
            return Err(fail(format!(
                "not all reserved cpus: {:?} are present in defaultCpuSet: {:?}",
                policy.reserved.to_string(),
                state.default.to_string()
            )));
        }
        let held = state
            .entries
            .values()
            .flat_map(|c| c.values())
            .fold(state.default.clone(), |acc, s| acc.union(s));
        if &held != all {
            return Err(fail(format!(
                "current set of available CPUs {:?} doesn't match with CPUs in state {:?}",
                all.to_string(),
                held.to_string()
            )));
        }
        Ok(state)
    }

    /// Writes the state file (tmp and rename, so a crash leaves the old or the new one).
    fn save(&self) -> Result<(), Error> {
        let mut checkpoint = {
            let state = self.lock();
            Checkpoint {
                policy_name: self.policy_name().into(),
                default_cpu_set: state.default.to_string(),
                entries: state
                    .entries
                    .iter()
                    .map(|(pod, c)| {
                        let c = c.iter().map(|(n, s)| (n.clone(), s.to_string())).collect();
                        (pod.clone(), c)
                    })
                    .collect(),
                checksum: 0,
            }
        };
        checkpoint.checksum = checkpoint.checksum();
        crate::types::replace_json(&self.path, &checkpoint).map_err(|source| Error::Write {
            path: self.path.clone(),
            source,
        })
    }

    /// Saves the state, shows its pools in the metrics and wakes the reconcile loop; a failed
    /// write is logged (the assignments in memory still hold).
    fn changed(&self) {
        if let Err(e) = self.save() {
            tracing::warn!(error = %crate::types::error_chain(&e), "the CPU manager's state is not saved");
        }
        self.publish();
        self.changed.notify_one();
    }

    /// The static policy's pools as its metrics show them: the shared CPUs (but the reserved
    /// ones), and the exclusive ones by NUMA node.
    fn publish(&self) {
        let Some(policy) = &self.policy else {
            return;
        };
        let t = &policy.topology;
        let state = self.lock();
        let shared = state.default.difference(&policy.reserved).len();
        let exclusive = (state.entries.values().flat_map(|c| c.values()))
            .fold(CpuSet::default(), |acc, s| acc.union(s));
        drop(state);
        let mut by_node: BTreeMap<u32, usize> = t.nodes().into_iter().map(|n| (n, 0)).collect();
        for id in exclusive.iter() {
            *by_node.entry(t.node_of(id)).or_default() += 1;
        }
        crate::metrics::get().cpu_pools(shared, &by_node);
    }

    /// The CPUs the pod's containers before `name` leave for it to reuse: those of its regular
    /// init containers (which have ended by then) not taken on by a later container.
    fn reusable(&self, state: &State, pod: &Pod, name: &str) -> CpuSet {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let Some(mine) = state.entries.get(uid) else {
            return CpuSet::default();
        };
        let spec = crate::pod::spec(pod);
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| (c, !crate::pod::is_sidecar(c)))
            .chain(spec.containers.iter().map(|c| (c, false)))
            .take_while(|(c, _)| c.name != name);
        let mut reusable = CpuSet::default();
        for (c, regular_init) in containers {
            if let Some(cpus) = mine.get(&c.name) {
                reusable = if regular_init {
                    reusable.union(cpus)
                } else {
                    reusable.difference(cpus)
                };
            }
        }
        reusable
    }

    /// The NUMA nodes of a set of CPUs, one entry per CPU.
    fn nodes_of(topology: &Topology, cpus: &CpuSet) -> Vec<Vec<u32>> {
        cpus.iter().map(|id| vec![topology.node_of(id)]).collect()
    }

    fn hints_for(&self, policy: &Static, kept: &CpuSet, free: &CpuSet, count: usize) -> Hints {
        let t = &policy.topology;
        let hints = super::topology::unit_hints(
            &t.nodes(),
            &Self::nodes_of(t, &t.all()),
            &Self::nodes_of(t, kept),
            &Self::nodes_of(t, free),
            count,
        );
        Hints::from([("cpu".to_string(), Some(hints))])
    }
}

impl HintProvider for CpuManager {
    /// Upstream's GetTopologyHints: the NUMA nodes with enough free CPUs for the container's
    /// exclusive ones, or where it holds them already.
    fn hints(&self, _: &[u32], pod: &Pod, c: &Container) -> Hints {
        let Some(policy) = &self.policy else {
            return Hints::new();
        };
        let count = exclusive_cpus(crate::pod::qos_class(pod) == "Guaranteed", c);
        if count == 0 {
            return Hints::new();
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let state = self.lock();
        if let Some(mine) = state.entries.get(uid).and_then(|p| p.get(&c.name)) {
            if mine.len() != count {
                return Hints::from([("cpu".to_string(), Some(Vec::new()))]);
            }
            return self.hints_for(policy, &CpuSet::default(), mine, count);
        }
        let available = state.default.difference(&policy.reserved);
        let reusable = self.reusable(&state, pod, &c.name);
        self.hints_for(policy, &reusable, &available, count)
    }

    /// The pod scope's hints: the NUMA nodes with enough free CPUs for all of the pod's
    /// exclusive ones (its app containers together, or its largest init container).
    fn pod_hints(&self, _: &[u32], pod: &Pod) -> Hints {
        let Some(policy) = &self.policy else {
            return Hints::new();
        };
        let guaranteed = crate::pod::qos_class(pod) == "Guaranteed";
        let count = super::pod_total(pod, |c| exclusive_cpus(guaranteed, c) as u64) as usize;
        if count == 0 {
            return Hints::new();
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let state = self.lock();
        if let Some(mine) = state.entries.get(uid) {
            let held = mine.values().fold(CpuSet::default(), |acc, s| acc.union(s));
            if held.len() != count {
                return Hints::from([("cpu".to_string(), Some(Vec::new()))]);
            }
            return self.hints_for(policy, &CpuSet::default(), &held, count);
        }
        let available = state.default.difference(&policy.reserved);
        self.hints_for(policy, &CpuSet::default(), &available, count)
    }

    /// Upstream's Allocate: a Guaranteed container with whole CPUs gets them (counted as a
    /// pinning request, and as an alignment on physical cores under full-pcpus-only).
    fn allocate(
        &self,
        pod: &Pod,
        c: &Container,
        affinity: Option<NumaMask>,
    ) -> Result<(), Refusal> {
        let Some(policy) = &self.policy else {
            return Ok(());
        };
        let count = exclusive_cpus(crate::pod::qos_class(pod) == "Guaranteed", c);
        if count == 0 {
            return Ok(());
        }
        let result = self.take(policy, pod, c, count, affinity);
        let metrics = crate::metrics::get();
        metrics.cpu_pinning(result.is_err());
        if policy.full_pcpus_only {
            metrics.alignment("container", PHYSICAL_CPU_BOUNDARY, result.is_ok());
        }
        result
    }

    fn release(&self, uid: &str) {
        CpuManager::release(self, uid);
    }

    fn holds(&self, uid: &str) -> bool {
        self.lock().entries.contains_key(uid)
    }
}

impl CpuManager {
    /// Takes `count` exclusive CPUs for a container out of the shared pool (after what earlier
    /// init containers leave it), from `affinity`'s nodes first; nothing if it holds them.
    fn take(
        &self,
        policy: &Static,
        pod: &Pod,
        c: &Container,
        count: usize,
        affinity: Option<NumaMask>,
    ) -> Result<(), Refusal> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut state = self.lock();
        if state
            .entries
            .get(&uid)
            .is_some_and(|p| p.contains_key(&c.name))
        {
            return Ok(());
        }
        if policy.full_pcpus_only && !count.is_multiple_of(policy.topology.cpus_per_core()) {
            return Err((
                "SMTAlignmentError".into(),
                format!(
                    "SMT Alignment Error: requested {count} cpus not multiple cpus per core = {}",
                    policy.topology.cpus_per_core()
                ),
            ));
        }
        let available = state
            .default
            .difference(&policy.reserved)
            .union(&self.reusable(&state, pod, &c.name));
        let t = &policy.topology;
        let aligned: CpuSet = match affinity {
            Some(mask) => available
                .iter()
                .filter(|id| mask.contains(t.node_of(*id)))
                .collect(),
            None => CpuSet::default(),
        };
        let first = t.take(&aligned, count.min(aligned.len()));
        let taken = first.and_then(|first| {
            let rest = t.take(&available.difference(&first), count - first.len())?;
            Some(first.union(&rest))
        });
        let Some(taken) = taken else {
            return Err((
                "UnexpectedAdmissionError".into(),
                format!(
                    "Allocate failed due to not enough cpus available to satisfy request: requested={count}, available={}, which is unexpected",
                    available.len()
                ),
            ));
        };
        state.default = state.default.difference(&taken);
        state
            .entries
            .entry(uid)
            .or_default()
            .insert(c.name.clone(), taken);
        drop(state);
        self.changed();
        Ok(())
    }

    /// Gives a pod's exclusive CPUs back to the shared pool (its containers are gone).
    pub fn release(&self, uid: &str) {
        let mut state = self.lock();
        if !state.entries.contains_key(uid) {
            return;
        }
        restore_pod(&mut state, uid, None);
        drop(state);
        self.changed();
    }

    /// Upstream's removeStaleState: the assignments of pods not in `keep` are released.
    pub fn retain(&self, keep: &HashSet<String>) {
        let stale: Vec<String> = self
            .lock()
            .entries
            .keys()
            .filter(|uid| !keep.contains(*uid))
            .cloned()
            .collect();
        for uid in stale {
            tracing::info!(pod_uid = %uid, "releasing the CPUs of a pod no longer on the node");
            self.release(&uid);
        }
    }

    /// The cpuset a container runs on: its own CPUs, or the shared pool; `None` under the none
    /// policy (the runtime's default: every CPU).
    pub fn cpuset(&self, uid: &str, container: &str) -> Option<String> {
        self.policy.as_ref()?;
        let state = self.lock();
        let set = state
            .entries
            .get(uid)
            .and_then(|p| p.get(container))
            .unwrap_or(&state.default);
        Some(set.to_string())
    }

    /// The CPUs a container holds for itself (none: it runs in the shared pool), for the
    /// pod-resources API.
    pub fn exclusive(&self, uid: &str, container: &str) -> Vec<i64> {
        let state = self.lock();
        let set = state.entries.get(uid).and_then(|p| p.get(container));
        set.into_iter()
            .flat_map(|s| s.iter())
            .map(i64::from)
            .collect()
    }

    /// The CPUs the policy may hand out: every CPU but the reserved ones under the static
    /// policy, none under the none policy (upstream's GetAllocatableCPUs).
    pub fn allocatable(&self) -> Vec<i64> {
        self.policy.as_ref().map_or_else(Vec::new, |p| {
            let all = p.topology.all();
            all.difference(&p.reserved).iter().map(i64::from).collect()
        })
    }

    /// The reconcile loop, until `cancel`: every running container of the node's pods gets its
    /// cpuset (UpdateContainerResources with the cpuset alone, as upstream), when it differs
    /// from what it was last given.
    pub async fn run(self: Arc<Self>, runtime: RuntimeClient, cancel: CancellationToken) {
        if self.policy.is_none() {
            return;
        }
        let mut applied: HashMap<String, String> = HashMap::new();
        let mut tick = tokio::time::interval(self.reconcile_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
                _ = self.changed.notified() => {}
            }
            self.reconcile(&runtime, &mut applied).await;
        }
    }

    async fn reconcile(&self, runtime: &RuntimeClient, applied: &mut HashMap<String, String>) {
        let (Ok(sandboxes), Ok(containers)) =
            tokio::join!(runtime.list_sandboxes(None), runtime.list_containers(None))
        else {
            tracing::debug!("the CPU manager's reconcile cannot list the runtime's containers");
            return;
        };
        let pods: HashMap<&str, &str> = sandboxes
            .iter()
            .filter(|s| s.has_pod_labels)
            .map(|s| (s.id.as_str(), s.uid.0.as_str()))
            .collect();
        let running: HashSet<&str> = containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
            .map(|c| c.id.as_str())
            .collect();
        applied.retain(|id, _| running.contains(id.as_str()));
        for c in containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
        {
            let Some(uid) = pods.get(c.sandbox_id.as_str()) else {
                continue;
            };
            let Some(cpus) = self.cpuset(uid, &c.name) else {
                continue;
            };
            if applied.get(&c.id) == Some(&cpus) {
                continue;
            }
            let resources = cri::LinuxContainerResources {
                cpuset_cpus: cpus.clone(),
                ..Default::default()
            };
            match runtime.update_container_resources(&c.id, resources).await {
                Ok(()) => {
                    tracing::debug!(container = %c.name, pod_uid = %uid, cpus, "cpuset updated");
                    applied.insert(c.id.clone(), cpus);
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    tracing::warn!(container = %c.name, pod_uid = %uid, error = %crate::types::error_chain(&e), "cannot update the container's cpuset")
                }
            }
        }
    }
}

/// Puts a pod's assignments back to `before` (none: all released), returning CPUs to the pool.
fn restore_pod(state: &mut State, uid: &str, before: Option<BTreeMap<String, CpuSet>>) {
    let now = state.entries.remove(uid).unwrap_or_default();
    let freed = now.values().fold(CpuSet::default(), |acc, s| acc.union(s));
    let kept = before
        .iter()
        .flat_map(|b| b.values())
        .fold(CpuSet::default(), |acc, s| acc.union(s));
    state.default = state.default.union(&freed).difference(&kept);
    if let Some(before) = before {
        state.entries.insert(uid.to_string(), before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology(cores: u32, threads: u32) -> Topology {
        let cpus = (0..cores * threads)
            .map(|id| Cpu {
                id,
                core: id % cores,
                socket: 0,
                node: 0,
            })
            .collect();
        Topology { cpus }
    }

    fn settings(reserved: &str) -> Settings {
        Settings {
            static_policy: true,
            reserved_cpus: Some(CpuSet::parse(reserved).unwrap()),
            reserved_cores: 0.0,
            full_pcpus_only: false,
            reconcile_period: Duration::from_secs(10),
        }
    }

    fn pod(uid: &str, init_cpu: Option<&str>, cpu: &str) -> Pod {
        let resources = |cpu: &str| serde_json::json!({"requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"cpu": cpu, "memory": "64Mi"}});
        let init: Vec<_> = init_cpu
            .map(|c| serde_json::json!({"name": "init", "resources": resources(c)}))
            .into_iter()
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "uid": uid},
            "spec": {"initContainers": init, "containers": [{"name": "app", "resources": resources(cpu)}]}
        }))
        .unwrap()
    }

    /// Admission as the topology manager's none policy makes it.
    fn admit(m: &CpuManager, pod: &Pod) -> Result<(), Refusal> {
        use super::super::topology::{Policy, Scope, TopologyManager};
        let manager = TopologyManager::new(Policy::None, Scope::Container, vec![0]).unwrap();
        manager.admit(pod, &[m as &dyn HintProvider])
    }

    #[test]
    fn the_checksum_is_upstreams() {
        // Golden values written by upstream's CPUManagerCheckpointV2.MarshalCheckpoint.
        let mut cp = Checkpoint {
            policy_name: "static".into(),
            default_cpu_set: "0".into(),
            entries: [
                ("a-uid", [("x", "2-3")].as_slice()),
                ("uid-1", [("app", "1"), ("init", "1")].as_slice()),
            ]
            .into_iter()
            .map(|(p, c)| {
                let c = c
                    .iter()
                    .map(|(n, s)| (n.to_string(), s.to_string()))
                    .collect();
                (p.to_string(), c)
            })
            .collect(),
            checksum: 0,
        };
        assert_eq!(cp.checksum(), 2441498313);
        cp.entries.clear();
        cp.policy_name = "none".into();
        cp.default_cpu_set = String::new();
        assert_eq!(cp.checksum(), 1353318690);
        cp.checksum = cp.checksum();
        assert_eq!(
            serde_json::to_string(&cp).unwrap(),
            r#"{"policyName":"none","defaultCpuSet":"","checksum":1353318690}"#
        );
    }

    #[test]
    fn cpus_are_taken_in_whole_cores_first() {
        // Four cores with two threads each: CPU n and n+4 are siblings.
        let t = topology(4, 2);
        let all = t.all();
        assert_eq!(t.take(&all, 2).unwrap().to_string(), "0,4");
        assert_eq!(t.take(&all, 3).unwrap().to_string(), "0-1,4");
        let without_0 = all.difference(&CpuSet::parse("0").unwrap());
        // A lone free thread goes before a whole core is broken up.
        assert_eq!(t.take(&without_0, 1).unwrap().to_string(), "4");
        assert_eq!(t.take(&all, 8).unwrap(), all);
        assert!(t.take(&all, 9).is_none());
    }

    #[test]
    fn guaranteed_integer_containers_get_cpus_of_their_own_and_give_them_back() {
        let dir = tempfile::tempdir().unwrap();
        let m = CpuManager::start(&settings("0"), dir.path(), topology(4, 1)).unwrap();
        admit(&m, &pod("a", Some("2"), "1")).unwrap();
        // The init container's CPUs are reused by the app container.
        assert_eq!(m.cpuset("a", "init").unwrap(), "1-2");
        assert_eq!(m.cpuset("a", "app").unwrap(), "1");
        assert_eq!(m.cpuset("other", "c").unwrap(), "0,3");
        let fractional = pod("f", None, "1500m");
        admit(&m, &fractional).unwrap();
        assert_eq!(m.cpuset("f", "app").unwrap(), "0,3");
        let refused = admit(&m, &pod("b", None, "2")).unwrap_err();
        assert_eq!(refused.0, "UnexpectedAdmissionError");
        assert!(
            refused.1.contains("requested=2, available=1"),
            "{}",
            refused.1
        );
        assert_eq!(m.cpuset("b", "app").unwrap(), "0,3");
        // The state survives a restart, and is checked against the policy.
        let again = CpuManager::start(&settings("0"), dir.path(), topology(4, 1)).unwrap();
        assert_eq!(again.cpuset("a", "app").unwrap(), "1");
        let mut none = settings("0");
        none.static_policy = false;
        none.reserved_cpus = None;
        let err = CpuManager::start(&none, dir.path(), topology(4, 1)).unwrap_err();
        assert!(
            err.to_string().contains(
                r#"configured policy "none" differs from state checkpoint policy "static""#
            ),
            "{err}"
        );
        m.release("a");
        assert_eq!(m.cpuset("other", "c").unwrap(), "0-3");
        admit(&m, &pod("b", None, "2")).unwrap();
        m.retain(&HashSet::new());
        assert_eq!(m.cpuset("b", "app").unwrap(), "0-3");
    }

    #[test]
    fn a_state_file_that_does_not_fit_the_machine_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let m = CpuManager::start(&settings("0"), dir.path(), topology(4, 1)).unwrap();
        admit(&m, &pod("a", None, "1")).unwrap();
        let err = CpuManager::start(&settings("0"), dir.path(), topology(2, 1)).unwrap_err();
        assert!(
            err.to_string().contains("doesn't match with CPUs in state"),
            "{err}"
        );
        std::fs::write(
            dir.path().join(STATE_FILE),
            r#"{"policyName":"static","defaultCpuSet":"0-3","checksum":1}"#,
        )
        .unwrap();
        let err = CpuManager::start(&settings("0"), dir.path(), topology(4, 1)).unwrap_err();
        assert!(err.to_string().contains("corrupted"), "{err}");
    }

    #[test]
    fn full_pcpus_only_wants_whole_cores_and_the_static_policy_a_reserve() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = settings("0,4");
        s.full_pcpus_only = true;
        let m = CpuManager::start(&s, dir.path(), topology(4, 2)).unwrap();
        let refused = admit(&m, &pod("a", None, "1")).unwrap_err();
        assert_eq!(refused.0, "SMTAlignmentError");
        admit(&m, &pod("b", None, "2")).unwrap();
        assert_eq!(m.cpuset("b", "app").unwrap(), "1,5");
        let mut unreserved = settings("");
        unreserved.reserved_cpus = None;
        let other = tempfile::tempdir().unwrap();
        assert!(CpuManager::start(&unreserved, other.path(), topology(4, 1)).is_err());
        unreserved.reserved_cores = 0.5;
        let m = CpuManager::start(&unreserved, other.path(), topology(4, 1)).unwrap();
        admit(&m, &pod("c", None, "3")).unwrap();
        assert_eq!(m.cpuset("c", "app").unwrap(), "1-3");
    }

    #[test]
    fn hints_name_the_numa_nodes_with_room_and_cpus_follow_the_affinity() {
        use super::super::topology::Hint;
        // Two NUMA nodes of two CPUs each; CPU 0 is reserved.
        let mut t = topology(4, 1);
        for c in &mut t.cpus {
            c.node = c.id / 2;
        }
        let dir = tempfile::tempdir().unwrap();
        let m = CpuManager::start(&settings("0"), dir.path(), t).unwrap();
        let p = pod("a", None, "2");
        let c = &crate::pod::spec(&p).containers[0];
        let hint = |nodes: &[u32], preferred| Hint {
            affinity: Some(NumaMask::of(nodes.iter().copied())),
            preferred,
        };
        assert_eq!(
            m.hints(&[0, 1], &p, c)["cpu"],
            Some(vec![hint(&[1], true), hint(&[0, 1], false)])
        );
        m.allocate(&p, c, Some(NumaMask::of([1]))).unwrap();
        assert_eq!(m.cpuset("a", "app").unwrap(), "2-3");
        // Held CPUs give their own hints back; a one-CPU pod fits only across what is left.
        assert_eq!(
            m.hints(&[0, 1], &p, c)["cpu"],
            Some(vec![hint(&[1], true), hint(&[0, 1], false)])
        );
        let q = pod("b", None, "1");
        let qc = &crate::pod::spec(&q).containers[0];
        assert_eq!(
            m.hints(&[0, 1], &q, qc)["cpu"],
            Some(vec![hint(&[0], true), hint(&[0, 1], false)])
        );
        m.allocate(&q, qc, Some(NumaMask::of([1]))).unwrap();
        assert_eq!(m.cpuset("b", "app").unwrap(), "1");
    }
}

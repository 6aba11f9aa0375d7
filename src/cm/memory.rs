//! The memory manager (`--memory-manager-policy`, `--reserved-memory`): with the Static policy,
//! each container of a Guaranteed pod has its memory and huge pages requests reserved on NUMA
//! nodes (the topology manager's affinity, else the fewest nodes that hold them), and runs with
//! those nodes as its cpuset.mems. The reservations are kept in upstream's state file
//! `memory_manager_state` in the root dir, checked against the machine and the reserves at start.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::{Deserialize, Serialize};

use super::numa::{Machine, NumaMask, hugepage_resource};
use super::topology::{Hint, HintProvider, Hints};
use crate::types::Refusal;

/// The state file's name in the root dir, as upstream names it.
pub const STATE_FILE: &str = "memory_manager_state";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
    #[error(
        "could not restore state from checkpoint: {why}, please drain this node and delete the memory manager checkpoint file {path:?} before restarting nodelet"
    )]
    State { path: PathBuf, why: String },
    #[error("cannot write the memory manager's state file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The memory manager's settings, as the config reads them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    /// `Static`, or `None` (`false`).
    pub static_policy: bool,
    /// reservedMemory (--reserved-memory): NUMA node -> memory type -> bytes kept for the system.
    pub reserved: BTreeMap<u32, BTreeMap<String, u64>>,
    /// What node allocatable keeps back of each memory type (kube-reserved, system-reserved and
    /// the hard eviction threshold), which the reservations must add up to.
    pub node_reservation: BTreeMap<String, u64>,
}

/// One memory type on one NUMA node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
struct Table {
    total: u64,
    #[serde(rename = "systemReserved")]
    system_reserved: u64,
    allocatable: u64,
    reserved: u64,
    free: u64,
}

/// One NUMA node's memory, and the group of nodes its reservations span (`cells`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
struct NodeState {
    #[serde(rename = "numberOfAssignments")]
    assignments: i64,
    #[serde(rename = "memoryMap")]
    memory: BTreeMap<String, Table>,
    cells: Vec<u32>,
}

/// Memory of one type a container holds on some NUMA nodes.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct Block {
    #[serde(rename = "numaAffinity")]
    pub numa_affinity: Vec<u32>,
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
}

type Machines = BTreeMap<u32, NodeState>;
/// pod UID -> container name -> its blocks.
type Entries = BTreeMap<String, BTreeMap<String, Vec<Block>>>;

/// The state file in upstream's (v1) format.
#[derive(Debug, Default, Deserialize, Serialize)]
struct Checkpoint {
    #[serde(rename = "policyName")]
    policy_name: String,
    #[serde(rename = "machineState", default)]
    machine_state: Machines,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    entries: Entries,
    checksum: u64,
}

impl Checkpoint {
    /// Upstream's checksum: FNV-1a (32 bits) over the Go dump of the checkpoint with a zero
    /// checksum, under the struct name given.
    fn checksum(&self, name: &str) -> u64 {
        let list = |l: &[u32]| l.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
        let nodes: Vec<String> = self
            .machine_state
            .iter()
            .map(|(id, n)| {
                let tables: Vec<String> = n
                    .memory
                    .iter()
                    .map(|(kind, t)| {
                        format!(
                            "{kind}:<*>{{TotalMemSize:(uint64){} SystemReserved:(uint64){} Allocatable:(uint64){} Reserved:(uint64){} Free:(uint64){}}}",
                            t.total, t.system_reserved, t.allocatable, t.reserved, t.free
                        )
                    })
                    .collect();
                format!(
                    "{id}:<*>{{NumberOfAssignments:(int){} MemoryMap:(map[v1.ResourceName]*state.MemoryTable)map[{}] Cells:([]int)[{}]}}",
                    n.assignments,
                    tables.join(" "),
                    list(&n.cells)
                )
            })
            .collect();
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|(pod, containers)| {
                let containers: Vec<String> = containers
                    .iter()
                    .map(|(name, blocks)| {
                        let blocks: Vec<String> = blocks
                            .iter()
                            .map(|b| {
                                format!(
                                    "{{NUMAAffinity:([]int)[{}] Type:(v1.ResourceName){} Size:(uint64){}}}",
                                    list(&b.numa_affinity),
                                    b.kind,
                                    b.size
                                )
                            })
                            .collect();
                        format!("{name}:[{}]", blocks.join(" "))
                    })
                    .collect();
                format!("{pod}:map[{}]", containers.join(" "))
            })
            .collect();
        let dump = format!(
            "(*state.{name}){{PolicyName:(string){} MachineState:(state.NUMANodeMap)map[{}] Entries:(state.ContainerMemoryAssignments)map[{}] Checksum:(checksum.Checksum)0}}",
            self.policy_name,
            nodes.join(" "),
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

/// Upstream hashes its v1 checkpoint under the older struct name, and accepts either name.
const WRITTEN_NAME: &str = "MemoryManagerCheckpoint";
const V1_NAME: &str = "MemoryManagerCheckpointV1";

#[derive(Debug, Default)]
struct State {
    machine: Machines,
    entries: Entries,
}

/// The Static policy's fixed facts: the machine state with no reservations.
#[derive(Debug)]
struct Static {
    empty: Machines,
}

/// The memory manager; cheap to share.
#[derive(Debug)]
pub struct MemoryManager {
    policy: Option<Static>,
    state: Mutex<State>,
    path: PathBuf,
}

/// A Guaranteed container's memory and huge pages requests in bytes (none for others).
fn container_requests(pod: &Pod, c: &Container) -> BTreeMap<String, u64> {
    if crate::pod::qos_class(pod) != "Guaranteed" {
        return BTreeMap::new();
    }
    let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
    requests
        .into_iter()
        .flatten()
        .filter(|(name, _)| *name == "memory" || name.starts_with("hugepages-"))
        .filter_map(|(name, q)| {
            let bytes = crate::pod::parse_quantity(&q.0)?;
            Some((name.clone(), bytes.max(0.0).round() as u64))
        })
        .collect()
}

/// The whole pod's requests, for the pod scope, per type as upstream sums them.
fn pod_requests(pod: &Pod) -> BTreeMap<String, u64> {
    super::pod_totals(pod, |c| container_requests(pod, c))
}

fn is_regular_init(pod: &Pod, name: &str) -> bool {
    crate::pod::spec(pod)
        .init_containers
        .iter()
        .flatten()
        .any(|c| c.name == name && !crate::pod::is_sidecar(c))
}

fn unexpected(why: &str) -> Refusal {
    (
        "UnexpectedAdmissionError".into(),
        format!("Allocate failed due to [memorymanager] {why}, which is unexpected"),
    )
}

impl MemoryManager {
    /// Starts the manager: the reserves checked against the machine and node allocatable, and
    /// the state file read (checked against the policy, the machine and the reserves) or begun.
    pub fn start(
        settings: &Settings,
        root_dir: &Path,
        machine: &Machine,
    ) -> Result<MemoryManager, Error> {
        let policy = if settings.static_policy {
            check_reserves(settings, machine)?;
            Some(Static {
                empty: empty_machine(machine, &settings.reserved),
            })
        } else {
            None
        };
        let manager = MemoryManager {
            policy,
            state: Mutex::new(State::default()),
            path: root_dir.join(STATE_FILE),
        };
        let state = manager.restore()?;
        *manager.lock() = state;
        manager.save()?;
        Ok(manager)
    }

    fn policy_name(&self) -> &'static str {
        if self.policy.is_some() {
            "Static"
        } else {
            "None"
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state the file holds, checked as upstream's validateState checks it.
    fn restore(&self) -> Result<State, Error> {
        let fail = |why: String| Error::State {
            path: self.path.clone(),
            why,
        };
        let fresh = || State {
            machine: self
                .policy
                .as_ref()
                .map(|p| p.empty.clone())
                .unwrap_or_default(),
            entries: Entries::new(),
        };
        let text = match std::fs::read(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(fresh()),
            Err(e) => return Err(fail(e.to_string())),
        };
        let checkpoint: Checkpoint = serde_json::from_slice(&text)
            .map_err(|e| fail(format!("not a memory manager checkpoint: {e}")))?;
        let sum = checkpoint.checksum;
        if sum != 0
            && sum != checkpoint.checksum(WRITTEN_NAME)
            && sum != checkpoint.checksum(V1_NAME)
        {
            return Err(fail(
                "checkpoint is corrupted (its checksum does not match)".into(),
            ));
        }
        if checkpoint.policy_name != self.policy_name() {
            return Err(fail(format!(
                "[memorymanager] configured policy {:?} differs from state checkpoint policy {:?}",
                self.policy_name(),
                checkpoint.policy_name
            )));
        }
        let Some(policy) = &self.policy else {
            return Ok(State {
                machine: checkpoint.machine_state,
                entries: checkpoint.entries,
            });
        };
        if checkpoint.machine_state.is_empty() {
            if !checkpoint.entries.is_empty() {
                return Err(fail(
                    "[memorymanager] machine state can not be empty when it has memory assignments"
                        .into(),
                ));
            }
            return Ok(fresh());
        }
        let expected = machine_after(&policy.empty, &checkpoint.entries).map_err(fail)?;
        if !same_machine(&checkpoint.machine_state, &expected) {
            return Err(fail(
                "[memorymanager] the expected machine state is different from the real one".into(),
            ));
        }
        Ok(State {
            machine: checkpoint.machine_state,
            entries: checkpoint.entries,
        })
    }

    /// Writes the state file (tmp and rename, so a crash leaves the old or the new one).
    fn save(&self) -> Result<(), Error> {
        let mut checkpoint = {
            let state = self.lock();
            Checkpoint {
                policy_name: self.policy_name().into(),
                machine_state: state.machine.clone(),
                entries: state.entries.clone(),
                checksum: 0,
            }
        };
        checkpoint.checksum = checkpoint.checksum(WRITTEN_NAME);
        crate::types::replace_json(&self.path, &checkpoint).map_err(|source| Error::Write {
            path: self.path.clone(),
            source,
        })
    }

    fn save_or_warn(&self) {
        if let Err(e) = self.save() {
            tracing::warn!(error = %crate::types::error_chain(&e), "the memory manager's state is not saved");
        }
    }

    /// The NUMA nodes a container's memory is pinned to, as cpuset.mems (`None`: not pinned).
    pub fn mems(&self, uid: &str, container: &str) -> Option<String> {
        let nodes: super::cpuset::CpuSet = self
            .container_memory(uid, container)
            .iter()
            .flat_map(|b| b.numa_affinity.iter().copied())
            .collect();
        (!nodes.is_empty()).then(|| nodes.to_string())
    }

    /// The memory blocks a container holds, for the pod-resources API.
    pub fn container_memory(&self, uid: &str, container: &str) -> Vec<Block> {
        let state = self.lock();
        let blocks = state.entries.get(uid).and_then(|p| p.get(container));
        blocks.cloned().unwrap_or_default()
    }

    /// Each NUMA node's allocatable memory of each type (upstream's GetAllocatableMemory).
    pub fn allocatable(&self) -> Vec<Block> {
        let Some(policy) = &self.policy else {
            return Vec::new();
        };
        let mut blocks = Vec::new();
        for (id, node) in &policy.empty {
            for (kind, t) in node.memory.iter().filter(|(_, t)| t.allocatable > 0) {
                blocks.push(Block {
                    numa_affinity: vec![*id],
                    kind: kind.clone(),
                    size: t.allocatable,
                });
            }
        }
        blocks
    }

    /// Upstream's removeStaleState: the reservations of pods not in `keep` are released.
    pub fn retain(&self, keep: &HashSet<String>) {
        let stale: Vec<String> = self
            .lock()
            .entries
            .keys()
            .filter(|uid| !keep.contains(*uid))
            .cloned()
            .collect();
        for uid in stale {
            tracing::info!(pod_uid = %uid, "releasing the memory of a pod no longer on the node");
            HintProvider::release(self, &uid);
        }
    }

    /// Reserves a container's `requested` memory on the NUMA nodes of its placement (less what
    /// earlier init containers leave it); nothing if it holds its memory already.
    fn pin(
        &self,
        pod: &Pod,
        container: &Container,
        requested: &BTreeMap<String, u64>,
        affinity: Option<NumaMask>,
    ) -> Result<(), Refusal> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut state = self.lock();
        if state
            .entries
            .get(&uid)
            .is_some_and(|p| p.contains_key(&container.name))
        {
            return Ok(());
        }
        let mask = placement(&state, &uid, pod, requested, affinity)?;
        let nodes = mask.nodes();
        let mut blocks = Vec::new();
        for (kind, size) in requested {
            let reusable = reusable(&state, &uid, pod, mask, kind);
            reserve(
                &mut state.machine,
                &nodes,
                kind,
                size.saturating_sub(reusable),
            );
            blocks.push(Block {
                numa_affinity: nodes.clone(),
                kind: kind.clone(),
                size: *size,
            });
        }
        shrink_init_blocks(&mut state, &uid, pod, &container.name, &blocks);
        tracing::debug!(pod = %crate::types::full_name(pod), container = %container.name, numa = %mask, "memory reserved");
        state
            .entries
            .entry(uid)
            .or_default()
            .insert(container.name.clone(), blocks);
        drop(state);
        self.save_or_warn();
        Ok(())
    }
}

impl HintProvider for MemoryManager {
    fn hints(&self, _: &[u32], pod: &Pod, container: &Container) -> Hints {
        if self.policy.is_none() {
            return Hints::new();
        }
        let requested = container_requests(pod, container);
        if requested.is_empty() {
            return Hints::new();
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let state = self.lock();
        if let Some(blocks) = state.entries.get(uid).and_then(|p| p.get(&container.name)) {
            return regenerate(blocks, &requested);
        }
        calculate_hints(&state, uid, pod, &requested)
            .into_iter()
            .map(|(k, v)| (k, Some(v)))
            .collect()
    }

    fn pod_hints(&self, _: &[u32], pod: &Pod) -> Hints {
        if self.policy.is_none() {
            return Hints::new();
        }
        let requested = pod_requests(pod);
        if requested.is_empty() {
            return Hints::new();
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let state = self.lock();
        if let Some(containers) = state.entries.get(uid) {
            let masks: BTreeMap<&str, BTreeSet<NumaMask>> =
                containers
                    .values()
                    .flatten()
                    .fold(BTreeMap::new(), |mut acc, b| {
                        let mask = NumaMask::of(b.numa_affinity.iter().copied());
                        acc.entry(b.kind.as_str()).or_default().insert(mask);
                        acc
                    });
            return requested
                .keys()
                .map(|kind| {
                    let mask = masks.get(kind.as_str()).filter(|m| m.len() == 1);
                    let hints = mask.and_then(|m| m.first()).map(|m| {
                        vec![Hint {
                            affinity: Some(*m),
                            preferred: true,
                        }]
                    });
                    (kind.clone(), hints)
                })
                .collect();
        }
        calculate_hints(&state, uid, pod, &requested)
            .into_iter()
            .map(|(k, v)| (k, Some(v)))
            .collect()
    }

    fn allocate(
        &self,
        pod: &Pod,
        container: &Container,
        affinity: Option<NumaMask>,
    ) -> Result<(), Refusal> {
        if self.policy.is_none() {
            return Ok(());
        }
        let requested = container_requests(pod, container);
        if requested.is_empty() {
            return Ok(());
        }
        let result = self.pin(pod, container, &requested, affinity);
        crate::metrics::get().memory_pinning(result.is_err());
        result
    }

    fn holds(&self, uid: &str) -> bool {
        self.lock().entries.contains_key(uid)
    }

    fn release(&self, uid: &str) {
        let mut state = self.lock();
        let Some(containers) = state.entries.remove(uid) else {
            return;
        };
        for b in containers.values().flatten() {
            unreserve(&mut state.machine, b);
        }
        drop(state);
        self.save_or_warn();
    }
}

/// Where a container's memory goes (upstream's Allocate): the topology manager's affinity, or
/// the best of the container's own hints, widened when it cannot hold the request, and never
/// breaking the rule that a node holds single-node or grouped reservations.
fn placement(
    state: &State,
    uid: &str,
    pod: &Pod,
    requested: &BTreeMap<String, u64>,
    affinity: Option<NumaMask>,
) -> Result<NumaMask, Refusal> {
    let best_of = |hints: Vec<Hint>| {
        hints.into_iter().reduce(|best, h| {
            let narrower = match (h.affinity, best.affinity) {
                (Some(a), Some(b)) => a.is_narrower_than(b),
                _ => false,
            };
            if (h.preferred && !best.preferred) || (h.preferred == best.preferred && narrower) {
                h
            } else {
                best
            }
        })
    };
    let memory_hints = |state: &State| {
        calculate_hints(state, uid, pod, requested)
            .remove("memory")
            .unwrap_or_default()
    };
    let no_room =
        "failed to get the default NUMA affinity, no NUMA nodes with enough memory is available";
    let mut mask = match affinity {
        Some(mask) => mask,
        None => best_of(memory_hints(state))
            .and_then(|h| h.affinity)
            .ok_or_else(|| unexpected(no_room))?,
    };
    if !satisfies(&state.machine, mask, requested) {
        let wider = memory_hints(state)
            .into_iter()
            .filter(|h| h.affinity.is_some_and(|a| mask.is_subset_of(a)));
        mask = best_of(wider.collect())
            .and_then(|h| h.affinity)
            .ok_or_else(|| {
                unexpected("failed to find NUMA nodes to extend the current topology hint")
            })?;
    }
    if violates_groups(&state.machine, mask) {
        return Err(unexpected("preferred hint violates NUMA node allocation"));
    }
    Ok(mask)
}

/// Upstream's validateReservedMemory: every reservation names a node of the machine, and per
/// memory type they add up to what node allocatable keeps back.
fn check_reserves(settings: &Settings, machine: &Machine) -> Result<(), Error> {
    let ids = machine.ids();
    let mut totals: BTreeMap<&str, u64> = BTreeMap::new();
    for (node, limits) in &settings.reserved {
        if !ids.contains(node) {
            return Err(Error::Invalid(format!(
                "the reserved memory configuration references a NUMA node {node} that does not exist on this machine"
            )));
        }
        for (kind, size) in limits {
            let total = totals.entry(kind).or_default();
            *total = total.saturating_add(*size);
        }
    }
    let kinds: BTreeSet<&str> = totals
        .keys()
        .copied()
        .chain(settings.node_reservation.keys().map(String::as_str))
        .filter(|k| *k == "memory" || k.starts_with("hugepages-"))
        .collect();
    for kind in kinds {
        let reserved = totals.get(kind).copied().unwrap_or(0);
        let allocatable = settings.node_reservation.get(kind).copied().unwrap_or(0);
        if reserved != allocatable {
            return Err(Error::Invalid(format!(
                "the total amount {reserved} bytes of type {kind:?} reserved by --reserved-memory is not equal to the {allocatable} bytes node allocatable keeps back (kube-reserved, system-reserved and the hard eviction threshold)"
            )));
        }
    }
    Ok(())
}

/// The machine state with nothing reserved (upstream's getDefaultMachineState).
fn empty_machine(machine: &Machine, reserved: &BTreeMap<u32, BTreeMap<String, u64>>) -> Machines {
    let kept = |node: u32, kind: &str| {
        reserved
            .get(&node)
            .and_then(|r| r.get(kind))
            .copied()
            .unwrap_or(0)
    };
    machine
        .nodes
        .iter()
        .map(|n| {
            let mut memory = BTreeMap::new();
            let mut in_hugepages = 0;
            for (size, pages) in &n.hugepages {
                let kind = hugepage_resource(*size);
                let total = size.saturating_mul(*pages);
                in_hugepages = total.saturating_add(in_hugepages);
                let allocatable = total.saturating_sub(kept(n.id, &kind));
                memory.insert(kind.clone(), table(total, kept(n.id, &kind), allocatable));
            }
            let system = kept(n.id, "memory");
            let allocatable = n.memory.saturating_sub(system).saturating_sub(in_hugepages);
            memory.insert("memory".into(), table(n.memory, system, allocatable));
            let state = NodeState {
                assignments: 0,
                memory,
                cells: vec![n.id],
            };
            (n.id, state)
        })
        .collect()
}

fn table(total: u64, system_reserved: u64, allocatable: u64) -> Table {
    Table {
        total,
        system_reserved,
        allocatable,
        reserved: 0,
        free: allocatable,
    }
}

/// The machine state `empty` becomes once the checkpoint's assignments are reserved in it;
/// an error when an assignment names a NUMA node or memory kind the machine does not have.
fn machine_after(empty: &Machines, entries: &Entries) -> Result<Machines, String> {
    let mut expected = empty.clone();
    for (pod, containers) in entries {
        for (container, blocks) in containers {
            for b in blocks {
                if b.numa_affinity.iter().any(|n| !expected.contains_key(n)) {
                    return Err(format!(
                        "[memorymanager] (pod: {pod}, container: {container}) the memory assignment uses the NUMA that does not exist"
                    ));
                }
                if b.numa_affinity.iter().any(|n| {
                    expected
                        .get(n)
                        .is_none_or(|s| !s.memory.contains_key(&b.kind))
                }) {
                    return Err(format!(
                        "[memorymanager] (pod: {pod}, container: {container}) the memory assignment uses memory resource that does not exist"
                    ));
                }
                reserve(&mut expected, &b.numa_affinity, &b.kind, b.size);
            }
        }
    }
    Ok(expected)
}

/// Reserves `size` bytes of `kind` over `nodes`, each node's free memory in turn, and marks the
/// nodes as one group (upstream's updateMachineState).
fn reserve(machine: &mut Machines, nodes: &[u32], kind: &str, mut size: u64) {
    for id in nodes {
        let Some(node) = machine.get_mut(id) else {
            continue;
        };
        node.assignments += 1;
        node.cells = nodes.to_vec();
        let Some(t) = node.memory.get_mut(kind) else {
            continue;
        };
        let taken = t.free.min(size);
        t.free -= taken;
        t.reserved += taken;
        size -= taken;
    }
}

/// Gives a block's memory back (upstream's releaseMemory).
fn unreserve(machine: &mut Machines, b: &Block) {
    let mut size = b.size;
    for id in &b.numa_affinity {
        let Some(node) = machine.get_mut(id) else {
            continue;
        };
        node.assignments -= 1;
        if node.assignments <= 0 {
            node.assignments = 0;
            node.cells = vec![*id];
        }
        let Some(t) = node.memory.get_mut(&b.kind) else {
            continue;
        };
        let given = t.reserved.min(size);
        t.reserved -= given;
        t.free += given;
        size -= given;
    }
}

/// What the pod's regular init containers hold of `kind` on exactly `mask`: memory a later
/// container reuses, as they have ended by the time it starts.
fn reusable(state: &State, uid: &str, pod: &Pod, mask: NumaMask, kind: &str) -> u64 {
    let Some(containers) = state.entries.get(uid) else {
        return 0;
    };
    containers
        .iter()
        .filter(|(name, _)| is_regular_init(pod, name))
        .flat_map(|(_, blocks)| blocks)
        .filter(|b| b.kind == kind && NumaMask::of(b.numa_affinity.iter().copied()) == mask)
        .map(|b| b.size)
        .fold(0, u64::saturating_add)
}

/// Upstream's updateInitContainersMemoryBlocks: the memory a container reuses is taken off the
/// blocks of the regular init containers before it, so that the pod's blocks add up to what it
/// holds.
fn shrink_init_blocks(state: &mut State, uid: &str, pod: &Pod, name: &str, blocks: &[Block]) {
    let Some(containers) = state.entries.get_mut(uid) else {
        return;
    };
    let inits: Vec<&Container> = crate::pod::spec(pod)
        .init_containers
        .iter()
        .flatten()
        .take_while(|c| c.name != name)
        .filter(|c| !crate::pod::is_sidecar(c))
        .collect();
    for block in blocks {
        let mask = NumaMask::of(block.numa_affinity.iter().copied());
        let mut left = block.size;
        for init in &inits {
            let Some(theirs) = containers.get_mut(&init.name) else {
                continue;
            };
            for b in theirs.iter_mut().filter(|b| {
                b.kind == block.kind && NumaMask::of(b.numa_affinity.iter().copied()) == mask
            }) {
                let taken = b.size.min(left);
                b.size -= taken;
                left -= taken;
            }
        }
    }
}

/// Upstream's calculateHints: every mask of nodes with enough allocatable memory of each
/// requested type, that respects the groups already made, and with enough free (or reusable)
/// memory; preferred when it has as few nodes as could ever hold the request.
fn calculate_hints(
    state: &State,
    uid: &str,
    pod: &Pod,
    requested: &BTreeMap<String, u64>,
) -> BTreeMap<String, Vec<Hint>> {
    let ids: Vec<u32> = state.machine.keys().copied().collect();
    let mut min_size = ids.len() as u32;
    let mut masks = Vec::new();
    for mask in NumaMask::all_of(&ids) {
        let nodes = mask.nodes();
        let sum = |kind: &str, f: fn(&Table) -> u64| -> u64 {
            nodes
                .iter()
                .filter_map(|n| state.machine.get(n)?.memory.get(kind))
                .map(f)
                .fold(0, u64::saturating_add)
        };
        if requested
            .iter()
            .any(|(kind, size)| sum(kind, |t| t.allocatable) < *size)
        {
            continue;
        }
        min_size = min_size.min(mask.count());
        let cells = |n: &u32| state.machine.get(n).map_or(0, |s| s.cells.len());
        if nodes.len() == 1 && cells(&nodes[0]) > 1 {
            continue;
        }
        let grouped_elsewhere = nodes.len() > 1
            && nodes.iter().any(|n| {
                state.machine.get(n).is_some_and(|s| {
                    s.assignments > 0 && (s.cells.len() == 1 || !same_group(&s.cells, &nodes))
                })
            });
        if grouped_elsewhere {
            continue;
        }
        if requested.iter().any(|(kind, size)| {
            sum(kind, |t| t.free).saturating_add(reusable(state, uid, pod, mask, kind)) < *size
        }) {
            continue;
        }
        masks.push(mask);
    }
    requested
        .keys()
        .map(|kind| {
            let hints = masks
                .iter()
                .map(|m| Hint {
                    affinity: Some(*m),
                    preferred: m.count() == min_size,
                })
                .collect();
            (kind.clone(), hints)
        })
        .collect()
}

/// The hints of a container that holds its memory already: where it holds it, when that still
/// matches its requests (else no preference).
fn regenerate(blocks: &[Block], requested: &BTreeMap<String, u64>) -> Hints {
    let matches = blocks.len() == requested.len()
        && blocks
            .iter()
            .all(|b| requested.get(&b.kind) == Some(&b.size));
    if !matches {
        return Hints::new();
    }
    blocks
        .iter()
        .map(|b| {
            let hint = Hint {
                affinity: Some(NumaMask::of(b.numa_affinity.iter().copied())),
                preferred: true,
            };
            (b.kind.clone(), Some(vec![hint]))
        })
        .collect()
}

fn same_group(a: &[u32], b: &[u32]) -> bool {
    let a: BTreeSet<u32> = a.iter().copied().collect();
    let b: BTreeSet<u32> = b.iter().copied().collect();
    a == b
}

fn satisfies(machine: &Machines, mask: NumaMask, requested: &BTreeMap<String, u64>) -> bool {
    requested.iter().all(|(kind, size)| {
        let free: u64 = mask
            .nodes()
            .iter()
            .filter_map(|n| machine.get(n)?.memory.get(kind))
            .map(|t| t.free)
            .fold(0, u64::saturating_add);
        free >= *size
    })
}

/// Upstream's isAffinityViolatingNUMAAllocations: a node holds single-node reservations or
/// reservations of one group of nodes, never both.
fn violates_groups(machine: &Machines, mask: NumaMask) -> bool {
    let nodes = mask.nodes();
    nodes.len() > 1
        && nodes.iter().any(|n| {
            machine.get(n).is_some_and(|s| {
                s.assignments > 0 && (s.cells.len() == 1 || !same_group(&s.cells, &nodes))
            })
        })
}

/// Upstream's areMachineStatesEqual: the same nodes, sizes, reserves and groups, and per group
/// the same free and reserved memory.
fn same_machine(a: &Machines, b: &Machines) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().all(|(id, x)| {
        let Some(y) = b.get(id) else {
            return false;
        };
        let group_sum = |m: &Machines, kind: &str, f: fn(&Table) -> u64| -> u64 {
            x.cells
                .iter()
                .filter_map(|n| m.get(n)?.memory.get(kind))
                .map(f)
                .fold(0, u64::saturating_add)
        };
        x.assignments == y.assignments
            && same_group(&x.cells, &y.cells)
            && x.memory.len() == y.memory.len()
            && x.memory.iter().all(|(kind, t)| {
                y.memory.get(kind).is_some_and(|u| {
                    t.total == u.total
                        && t.system_reserved == u.system_reserved
                        && t.allocatable == u.allocatable
                        && group_sum(a, kind, |t| t.free) == group_sum(b, kind, |t| t.free)
                        && group_sum(a, kind, |t| t.reserved) == group_sum(b, kind, |t| t.reserved)
                })
            })
    })
}

/// Parses `--reserved-memory` entries (`0:memory=1Gi,hugepages-2Mi=64Mi`, several joined by
/// `;`) into node -> type -> bytes, as upstream's flag and its reservedMemory field read them.
pub fn parse_reserved(entries: &[String]) -> Result<BTreeMap<u32, BTreeMap<String, u64>>, String> {
    let mut out: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
    for entry in entries.iter().flat_map(|e| e.split(';')) {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let (node, limits) = entry.split_once(':').ok_or_else(|| {
            format!("{entry:?} is not of the form <NUMA node>:<type>=<quantity>,...")
        })?;
        let node: u32 = node
            .trim()
            .parse()
            .map_err(|_| format!("{entry:?}: {node:?} is not a NUMA node number"))?;
        for limit in limits.split(',').map(str::trim).filter(|l| !l.is_empty()) {
            let (kind, quantity) = limit.split_once('=').ok_or_else(|| {
                format!("{entry:?}: {limit:?} is not of the form <type>=<quantity>")
            })?;
            let kind = kind.trim();
            if kind != "memory" && !kind.starts_with("hugepages-") {
                return Err(format!(
                    "{entry:?}: {kind:?} is not memory or a hugepages-<size> type"
                ));
            }
            let bytes = crate::pod::parse_quantity(quantity.trim())
                .filter(|b| *b >= 0.0 && b.is_finite())
                .ok_or_else(|| format!("{entry:?}: {quantity:?} is not a quantity"))?;
            let e = out
                .entry(node)
                .or_default()
                .entry(kind.to_string())
                .or_default();
            *e = e.saturating_add(bytes.round() as u64);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::cpuset::CpuSet;
    use crate::cm::numa::Node;

    const MI: u64 = 1 << 20;

    fn machine(nodes: u32, memory: u64) -> Machine {
        Machine {
            nodes: (0..nodes)
                .map(|id| Node {
                    id,
                    cpus: CpuSet::default(),
                    memory,
                    hugepages: BTreeMap::new(),
                })
                .collect(),
        }
    }

    fn settings(nodes: u32) -> Settings {
        Settings {
            static_policy: true,
            reserved: (0..nodes)
                .map(|n| (n, BTreeMap::from([("memory".to_string(), 100 * MI)])))
                .collect(),
            node_reservation: BTreeMap::from([("memory".to_string(), u64::from(nodes) * 100 * MI)]),
        }
    }

    fn pod(uid: &str, init: Option<&str>, apps: &[&str]) -> Pod {
        let c = |name: String, memory: &str| serde_json::json!({"name": name, "resources": {"requests": {"cpu": "1", "memory": memory}, "limits": {"cpu": "1", "memory": memory}}});
        let init: Vec<_> = init.map(|m| c("init".into(), m)).into_iter().collect();
        let apps: Vec<_> = apps
            .iter()
            .enumerate()
            .map(|(i, m)| c(format!("app{i}"), m))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": uid, "uid": uid},
            "spec": {"initContainers": init, "containers": apps}
        }))
        .unwrap()
    }

    fn admit(m: &MemoryManager, p: &Pod, affinity: Option<NumaMask>) -> Result<(), Refusal> {
        let spec = crate::pod::spec(p);
        for c in spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
        {
            m.allocate(p, c, affinity)?;
        }
        Ok(())
    }

    #[test]
    fn the_checksum_is_upstreams() {
        // Golden values written by upstream's MemoryManagerCheckpointV1.MarshalCheckpoint.
        let node = |assignments, cells: Vec<u32>, memory: Vec<(&str, [u64; 5])>| NodeState {
            assignments,
            cells,
            memory: memory
                .into_iter()
                .map(
                    |(k, [total, system_reserved, allocatable, reserved, free])| {
                        let t = Table {
                            total,
                            system_reserved,
                            allocatable,
                            reserved,
                            free,
                        };
                        (k.to_string(), t)
                    },
                )
                .collect(),
        };
        let mut cp = Checkpoint {
            policy_name: "Static".into(),
            machine_state: BTreeMap::from([
                (
                    0,
                    node(
                        2,
                        vec![0],
                        vec![
                            ("memory", [1000, 100, 900, 300, 600]),
                            ("hugepages-2Mi", [0; 5]),
                        ],
                    ),
                ),
                (
                    1,
                    node(0, vec![1], vec![("memory", [2000, 0, 2000, 0, 2000])]),
                ),
            ]),
            entries: BTreeMap::from([(
                "uid-1".to_string(),
                BTreeMap::from([
                    (
                        "app".to_string(),
                        vec![Block {
                            numa_affinity: vec![0],
                            kind: "memory".into(),
                            size: 300,
                        }],
                    ),
                    ("b".to_string(), Vec::new()),
                ]),
            )]),
            checksum: 0,
        };
        assert_eq!(cp.checksum(WRITTEN_NAME), 2076735922);
        cp = Checkpoint {
            policy_name: "None".into(),
            ..Default::default()
        };
        assert_eq!(cp.checksum(WRITTEN_NAME), 4236770233);
        cp.checksum = cp.checksum(WRITTEN_NAME);
        assert_eq!(
            serde_json::to_string(&cp).unwrap(),
            r#"{"policyName":"None","machineState":{},"checksum":4236770233}"#
        );
    }

    #[test]
    fn guaranteed_containers_get_the_fewest_nodes_that_hold_their_memory() {
        let dir = tempfile::tempdir().unwrap();
        let m = MemoryManager::start(&settings(2), dir.path(), &machine(2, 1100 * MI)).unwrap();
        // 1000Mi allocatable per node: 600Mi fits on node 0 alone.
        let a = pod("a", None, &["600Mi"]);
        let c = &crate::pod::spec(&a).containers[0];
        let hints = m.hints(&[0, 1], &a, c);
        let memory = hints["memory"].clone().unwrap();
        assert_eq!(
            memory,
            [
                Hint {
                    affinity: Some(NumaMask::of([0])),
                    preferred: true
                },
                Hint {
                    affinity: Some(NumaMask::of([1])),
                    preferred: true
                },
                Hint {
                    affinity: Some(NumaMask::of([0, 1])),
                    preferred: false
                },
            ]
        );
        admit(&m, &a, None).unwrap();
        assert_eq!(m.mems("a", "app0").as_deref(), Some("0"));
        // 600Mi more goes to node 1, the one with room.
        let b = pod("b", None, &["600Mi"]);
        admit(&m, &b, None).unwrap();
        assert_eq!(m.mems("b", "app0").as_deref(), Some("1"));
        // 500Mi fits on no node, and nodes that hold single-node memory make no group.
        let big = pod("big", None, &["500Mi"]);
        let hints = m.hints(&[0, 1], &big, &crate::pod::spec(&big).containers[0]);
        assert_eq!(hints["memory"], Some(Vec::new()));
        let refused = admit(&m, &big, None).unwrap_err();
        assert_eq!(refused.0, "UnexpectedAdmissionError");
        // Burstable pods are not pinned.
        let mut burstable = pod("burst", None, &["64Mi"]);
        if let Some(spec) = burstable.spec.as_mut() {
            spec.containers[0].resources = None;
        }
        admit(&m, &burstable, None).unwrap();
        assert_eq!(m.mems("burst", "app0"), None);
        // The state survives a restart, and is checked against the machine and the reserves.
        m.release("b");
        let again = MemoryManager::start(&settings(2), dir.path(), &machine(2, 1100 * MI)).unwrap();
        assert_eq!(again.mems("a", "app0").as_deref(), Some("0"));
        let err =
            MemoryManager::start(&settings(2), dir.path(), &machine(2, 1200 * MI)).unwrap_err();
        assert!(
            err.to_string()
                .contains("the expected machine state is different"),
            "{err}"
        );
        let none = Settings::default();
        let err = MemoryManager::start(&none, dir.path(), &machine(2, 1100 * MI)).unwrap_err();
        assert!(
            err.to_string().contains(
                r#"configured policy "None" differs from state checkpoint policy "Static""#
            ),
            "{err}"
        );
    }

    #[test]
    fn a_request_wider_than_a_node_spans_a_group_of_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let m = MemoryManager::start(&settings(4), dir.path(), &machine(4, 1100 * MI)).unwrap();
        let wide = pod("wide", None, &["1500Mi"]);
        admit(&m, &wide, None).unwrap();
        assert_eq!(m.mems("wide", "app0").as_deref(), Some("0-1"));
        // Nodes 0 and 1 now form a group: a single-node request goes to node 2, and a second
        // wide one to nodes 2 and 3 only once it fits the group's rule.
        let small = pod("small", None, &["100Mi"]);
        admit(&m, &small, None).unwrap();
        assert_eq!(m.mems("small", "app0").as_deref(), Some("2"));
        let refused = admit(
            &m,
            &pod("across", None, &["1500Mi"]),
            Some(NumaMask::of([1, 2])),
        );
        assert!(refused.is_err());
        // The topology manager's affinity is extended when it cannot hold the request.
        let extended = pod("ext", None, &["400Mi"]);
        admit(&m, &extended, Some(NumaMask::of([0]))).unwrap();
        assert_eq!(m.mems("ext", "app0").as_deref(), Some("0-1"));
        let err = MemoryManager::start(&settings(4), dir.path(), &machine(4, 1100 * MI));
        assert!(err.is_ok(), "{err:?}");
    }

    #[test]
    fn init_container_memory_is_reused_by_the_app_containers() {
        let dir = tempfile::tempdir().unwrap();
        let m = MemoryManager::start(&settings(1), dir.path(), &machine(1, 1100 * MI)).unwrap();
        let p = pod("p", Some("600Mi"), &["400Mi", "300Mi"]);
        admit(&m, &p, None).unwrap();
        let free = m.lock().machine[&0].memory["memory"].free;
        // The pod holds max(600, 400 + 300) = 700Mi.
        assert_eq!(free, 300 * MI);
        let sizes: Vec<u64> = ["init", "app0", "app1"]
            .iter()
            .map(|c| m.container_memory("p", c)[0].size / MI)
            .collect();
        assert_eq!(sizes, [0, 400, 300]);
        m.retain(&HashSet::new());
        assert_eq!(m.lock().machine[&0].memory["memory"].free, 1000 * MI);
        assert!(MemoryManager::start(&settings(1), dir.path(), &machine(1, 1100 * MI)).is_ok());
    }

    #[test]
    fn reserves_must_name_real_nodes_and_add_up_to_node_allocatable() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = settings(1);
        s.node_reservation.insert("memory".into(), 200 * MI);
        let err = MemoryManager::start(&s, dir.path(), &machine(1, MI << 10)).unwrap_err();
        assert!(err.to_string().contains("is not equal to the"), "{err}");
        let s = settings(2);
        let err = MemoryManager::start(&s, dir.path(), &machine(1, MI << 10)).unwrap_err();
        assert!(
            err.to_string().contains("NUMA node 1 that does not exist"),
            "{err}"
        );
        let parsed =
            parse_reserved(&["0:memory=1Gi,hugepages-2Mi=4Mi;1:memory=10Mi".into()]).unwrap();
        assert_eq!(parsed[&0]["memory"], 1 << 30);
        assert_eq!(parsed[&0]["hugepages-2Mi"], 4 * MI);
        assert_eq!(parsed[&1]["memory"], 10 * MI);
        assert!(parse_reserved(&["0:cpu=1".into()]).is_err());
        assert!(parse_reserved(&["memory=1Gi".into()]).is_err());
    }
}

//! The topology manager (`--topology-manager-policy`, `--topology-manager-scope`): at
//! admission it asks each hint provider (the CPU, memory and device managers) on which NUMA
//! nodes a container (or, in the pod scope, the whole pod) could have what it asks for, merges
//! their hints as upstream does, admits or refuses the pod by its policy, and has each provider
//! allocate along the merged affinity.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::numa::NumaMask;
use crate::types::Refusal;

/// One way a resource could be placed: on these NUMA nodes (`None`: anywhere), and whether the
/// provider prefers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hint {
    pub affinity: Option<NumaMask>,
    pub preferred: bool,
}

/// A provider's hints per resource name: `None` has no preference; an empty list has no
/// placement that could work. No entry at all has no preference for anything.
pub type Hints = BTreeMap<String, Option<Vec<Hint>>>;

/// What the topology manager asks of the managers that place resources.
pub trait HintProvider {
    /// Where the container's resources could be placed (`nodes`: the machine's NUMA nodes).
    fn hints(&self, nodes: &[u32], pod: &Pod, container: &Container) -> Hints;
    /// Where the whole pod's resources could be placed, for the pod scope.
    fn pod_hints(&self, nodes: &[u32], pod: &Pod) -> Hints;
    /// Allocates the container's resources, on `affinity`'s nodes where it is given.
    fn allocate(
        &self,
        pod: &Pod,
        container: &Container,
        affinity: Option<NumaMask>,
    ) -> Result<(), Refusal>;
    /// Gives back everything the pod holds (its admission failed, or it is gone).
    fn release(&self, uid: &str);
    /// Whether the pod holds anything already (it was admitted before a restart).
    fn holds(&self, uid: &str) -> bool;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    None,
    BestEffort,
    Restricted,
    SingleNumaNode,
}

impl Policy {
    pub fn parse(text: &str) -> Result<Policy, String> {
        match text {
            "none" | "" => Ok(Policy::None),
            "best-effort" => Ok(Policy::BestEffort),
            "restricted" => Ok(Policy::Restricted),
            "single-numa-node" => Ok(Policy::SingleNumaNode),
            other => Err(format!(
                "unknown policy: {other:?} (none, best-effort, restricted or single-numa-node)"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::BestEffort => "best-effort",
            Policy::Restricted => "restricted",
            Policy::SingleNumaNode => "single-numa-node",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Container,
    Pod,
}

impl Scope {
    pub fn parse(text: &str) -> Result<Scope, String> {
        match text {
            "container" | "" => Ok(Scope::Container),
            "pod" => Ok(Scope::Pod),
            other => Err(format!("unknown scope: {other:?} (container or pod)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scope::Container => "container",
            Scope::Pod => "pod",
        }
    }
}

/// Upstream's refusal when no placement satisfies the policy.
pub const AFFINITY_ERROR: &str = "TopologyAffinityError";
const AFFINITY_MESSAGE: &str = "Resources cannot be allocated with Topology locality";

/// The alignment boundary the topology manager guarantees, as its metrics name it.
const NUMA_BOUNDARY: &str = "numa_node";

/// Upstream refuses to manage topology on machines with more NUMA nodes than this: the hint
/// combinations grow as two to their number.
const MAX_NUMA_NODES: usize = 8;

/// The topology manager.
#[derive(Debug)]
pub struct TopologyManager {
    policy: Policy,
    scope: Scope,
    nodes: Vec<u32>,
}

impl TopologyManager {
    /// A manager for a machine with these NUMA nodes.
    pub fn new(policy: Policy, scope: Scope, nodes: Vec<u32>) -> Result<TopologyManager, String> {
        if policy != Policy::None && nodes.len() > MAX_NUMA_NODES {
            return Err(format!(
                "the topology manager is unsupported on machines with more than {MAX_NUMA_NODES} NUMA nodes (this one has {})",
                nodes.len()
            ));
        }
        if policy != Policy::None {
            for scope in [Scope::Container, Scope::Pod] {
                crate::metrics::get().declare_alignment(scope.name(), NUMA_BOUNDARY, true);
            }
        }
        Ok(TopologyManager {
            policy,
            scope,
            nodes,
        })
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Upstream's admit handler: each container in turn (init containers first), or the pod
    /// at once in the pod scope, is given the providers' merged affinity and its resources
    /// allocated along it. A refused new pod holds nothing afterwards; a refused pod that held
    /// resources before (its containers may still run) keeps them until its containers are gone.
    /// Each admission is counted and timed, and a refusal counted as an error unless the policy
    /// is none, as upstream counts them.
    pub fn admit(&self, pod: &Pod, providers: &[&dyn HintProvider]) -> Result<(), Refusal> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let held_before = providers.iter().any(|p| p.holds(uid));
        let start = std::time::Instant::now();
        let result = self.admit_containers(pod, providers);
        let error = result.is_err() && self.policy != Policy::None;
        crate::metrics::get().topology_admission(start.elapsed(), error);
        if result.is_err() && !held_before {
            for p in providers {
                p.release(uid);
            }
        }
        result
    }

    /// Counts an alignment on a NUMA node, made or refused, where the policy guarantees one.
    fn aligned(&self, scope: Scope, aligned: bool) {
        if self.policy == Policy::SingleNumaNode {
            crate::metrics::get().alignment(scope.name(), NUMA_BOUNDARY, aligned);
        }
    }

    fn admit_containers(&self, pod: &Pod, providers: &[&dyn HintProvider]) -> Result<(), Refusal> {
        let containers = crate::pod::all_containers(crate::pod::spec(pod));
        let refused = |scope| -> Refusal {
            self.aligned(scope, false);
            (AFFINITY_ERROR.into(), AFFINITY_MESSAGE.into())
        };
        let pod_affinity = match (self.policy, self.scope) {
            (Policy::None, _) | (_, Scope::Container) => None,
            (_, Scope::Pod) => {
                let hints: Vec<Hints> = providers
                    .iter()
                    .map(|p| p.pod_hints(&self.nodes, pod))
                    .collect();
                let (best, admit) = merge(self.policy, &self.nodes, &hints);
                tracing::debug!(pod = %crate::types::full_name(pod), ?best, admit, "pod topology hint");
                if !admit {
                    return Err(refused(Scope::Pod));
                }
                Some(best.affinity)
            }
        };
        for c in containers {
            let affinity = match (self.policy, pod_affinity) {
                (Policy::None, _) => None,
                (_, Some(affinity)) => affinity,
                (_, None) => {
                    let hints: Vec<Hints> = providers
                        .iter()
                        .map(|p| p.hints(&self.nodes, pod, c))
                        .collect();
                    let (best, admit) = merge(self.policy, &self.nodes, &hints);
                    tracing::debug!(pod = %crate::types::full_name(pod), container = %c.name, ?best, admit, "container topology hint");
                    if !admit {
                        return Err(refused(Scope::Container));
                    }
                    best.affinity
                }
            };
            for p in providers {
                p.allocate(pod, c, affinity)?;
            }
            if self.scope == Scope::Container {
                self.aligned(Scope::Container, true);
            }
        }
        if self.scope == Scope::Pod {
            self.aligned(Scope::Pod, true);
        }
        Ok(())
    }
}

/// Upstream's merge of the providers' hints under a policy: every combination of one hint per
/// provider and resource is merged (their affinities intersected; preferred when all are and
/// all agree), and the best merged hint is kept. Returns the hint and whether the policy admits.
pub fn merge(policy: Policy, nodes: &[u32], providers: &[Hints]) -> (Hint, bool) {
    let default = NumaMask::of(nodes.iter().copied());
    if policy == Policy::None {
        return (
            Hint {
                affinity: None,
                preferred: true,
            },
            true,
        );
    }
    let mut lists = filter(providers);
    if policy == Policy::SingleNumaNode {
        for list in &mut lists {
            list.retain(|h| h.preferred && h.affinity.is_none_or(|m| m.count() == 1));
        }
    }
    let best_non_preferred = lists
        .iter()
        .filter_map(|list| {
            list.iter()
                .filter_map(|h| h.affinity)
                .reduce(|a, b| if b.is_narrower_than(a) { b } else { a })
        })
        .map(NumaMask::count)
        .max()
        .unwrap_or(0);
    let mut best: Option<(NumaMask, bool)> = None;
    let mut chosen = vec![0usize; lists.len()];
    let combinations = if lists.iter().any(Vec::is_empty) {
        0
    } else {
        lists.iter().map(Vec::len).product::<usize>()
    };
    for _ in 0..combinations {
        let merged = merge_one(default, lists.iter().zip(&chosen).map(|(l, i)| l[*i]));
        best = compare(best, merged, best_non_preferred);
        for (i, list) in lists.iter().enumerate().rev() {
            chosen[i] += 1;
            if chosen[i] < list.len() {
                break;
            }
            chosen[i] = 0;
        }
    }
    let (affinity, preferred) = best.unwrap_or((default, false));
    let affinity = match policy {
        Policy::SingleNumaNode if affinity == default => None,
        _ => Some(affinity),
    };
    let admit = match policy {
        Policy::None | Policy::BestEffort => true,
        Policy::Restricted | Policy::SingleNumaNode => preferred,
    };
    (
        Hint {
            affinity,
            preferred,
        },
        admit,
    )
}

/// One list of hints per provider and resource, as upstream's filterProvidersHints makes them.
fn filter(providers: &[Hints]) -> Vec<Vec<Hint>> {
    let any = |preferred| {
        vec![Hint {
            affinity: None,
            preferred,
        }]
    };
    let mut lists = Vec::new();
    for hints in providers {
        if hints.is_empty() {
            lists.push(any(true));
        }
        for list in hints.values() {
            lists.push(match list {
                None => any(true),
                Some(list) if list.is_empty() => any(false),
                Some(list) => list.clone(),
            });
        }
    }
    lists
}

fn merge_one(default: NumaMask, hints: impl Iterator<Item = Hint>) -> (NumaMask, bool) {
    let mut preferred = true;
    let mut first = None;
    let mut merged = default;
    for h in hints {
        if let Some(m) = h.affinity {
            if *first.get_or_insert(m) != m {
                preferred = false;
            }
            merged = merged.and(m);
        }
        preferred &= h.preferred;
    }
    (merged, preferred)
}

/// Upstream's HintMerger.compare: preferred beats not; among preferred, the narrower; among
/// the others, the one closest to the widest of the providers' narrowest hints.
fn compare(
    current: Option<(NumaMask, bool)>,
    candidate: (NumaMask, bool),
    best_non_preferred: u32,
) -> Option<(NumaMask, bool)> {
    if candidate.0.count() == 0 {
        return current;
    }
    let Some(current) = current else {
        return Some(candidate);
    };
    let narrowest = |a: (NumaMask, bool), b: (NumaMask, bool)| {
        if b.0 != a.0 && b.0.is_narrower_than(a.0) {
            b
        } else {
            a
        }
    };
    let (c, k) = (current.0.count(), candidate.0.count());
    Some(match (current.1, candidate.1) {
        (false, true) => candidate,
        (true, false) => current,
        (true, true) => narrowest(current, candidate),
        (false, false) if c > best_non_preferred => narrowest(current, candidate),
        (false, false) if c == best_non_preferred => {
            if k == best_non_preferred {
                narrowest(current, candidate)
            } else {
                current
            }
        }
        (false, false) if k > best_non_preferred => current,
        (false, false) if k == best_non_preferred => candidate,
        (false, false) if k > c => candidate,
        (false, false) if k < c => current,
        (false, false) => narrowest(current, candidate),
    })
}

/// Hints for `request` units of a resource placed on whole NUMA nodes, as the CPU and device
/// managers make them: a mask is possible when the free units on its nodes (`free`: each
/// unit's nodes) are enough and it holds every unit the container already keeps (`kept`), and
/// preferred when it is as small as the smallest mask whose units (`all`) could ever be enough.
pub fn unit_hints(
    nodes: &[u32],
    all: &[Vec<u32>],
    kept: &[Vec<u32>],
    free: &[Vec<u32>],
    request: usize,
) -> Vec<Hint> {
    let masks = NumaMask::all_of(nodes);
    let min_size = masks
        .iter()
        .filter(|m| all.iter().filter(|u| m.any_of(u)).count() >= request)
        .map(|m| m.count())
        .min()
        .unwrap_or(nodes.len() as u32);
    masks
        .into_iter()
        .filter(|m| {
            let kept_inside = kept.iter().all(|u| u.is_empty() || m.any_of(u));
            let matching = kept.len() + free.iter().filter(|u| m.any_of(u)).count();
            kept_inside && matching >= request
        })
        .map(|m| Hint {
            affinity: Some(m),
            preferred: m.count() == min_size,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(nodes: &[u32], preferred: bool) -> Hint {
        Hint {
            affinity: Some(NumaMask::of(nodes.iter().copied())),
            preferred,
        }
    }

    fn provider(resource: &str, hints: Option<Vec<Hint>>) -> Hints {
        BTreeMap::from([(resource.to_string(), hints)])
    }

    #[test]
    fn two_providers_on_two_nodes_agree_on_the_node_both_prefer() {
        let nodes = [0, 1];
        let cpu = provider(
            "cpu",
            Some(vec![
                hint(&[0], true),
                hint(&[1], true),
                hint(&[0, 1], false),
            ]),
        );
        let memory = provider("memory", Some(vec![hint(&[1], true), hint(&[0, 1], false)]));
        for policy in [
            Policy::BestEffort,
            Policy::Restricted,
            Policy::SingleNumaNode,
        ] {
            let (best, admit) = merge(policy, &nodes, &[cpu.clone(), memory.clone()]);
            assert_eq!(best, hint(&[1], true), "{policy:?}");
            assert!(admit);
        }
    }

    #[test]
    fn a_pod_that_fits_only_across_nodes_is_refused_by_the_strict_policies() {
        let nodes = [0, 1];
        let cpu = provider("cpu", Some(vec![hint(&[0, 1], true)]));
        let devices = provider("example.com/gpu", Some(vec![hint(&[0], true)]));
        let (best, admit) = merge(Policy::BestEffort, &nodes, &[cpu.clone(), devices.clone()]);
        assert_eq!(best, hint(&[0], false));
        assert!(admit);
        let (best, admit) = merge(Policy::Restricted, &nodes, &[cpu.clone(), devices.clone()]);
        assert!(!best.preferred && !admit);
        // Only single-node hints count: the CPUs' two-node hint is dropped.
        let (best, admit) = merge(Policy::SingleNumaNode, &nodes, &[cpu, devices]);
        assert_eq!(best.affinity, None);
        assert!(!admit);
    }

    #[test]
    fn no_preference_admits_anywhere_and_no_placement_refuses() {
        let nodes = [0, 1, 2, 3];
        let none: Hints = BTreeMap::new();
        let (best, admit) = merge(Policy::Restricted, &nodes, std::slice::from_ref(&none));
        assert_eq!(best, hint(&[0, 1, 2, 3], true));
        assert!(admit);
        let (best, admit) = merge(Policy::SingleNumaNode, &nodes, std::slice::from_ref(&none));
        assert_eq!(
            best,
            Hint {
                affinity: None,
                preferred: true
            }
        );
        assert!(admit);
        let impossible = provider("memory", Some(Vec::new()));
        let (best, admit) = merge(Policy::Restricted, &nodes, &[none, impossible.clone()]);
        assert!(!best.preferred && !admit);
        let (_, admit) = merge(Policy::BestEffort, &nodes, &[impossible]);
        assert!(admit);
    }

    #[test]
    fn four_nodes_prefer_the_narrowest_common_placement() {
        let nodes = [0, 1, 2, 3];
        // The CPUs fit on node 2 or 3 alone, or any pair; the devices sit on 2 and 3.
        let mut cpu_hints = vec![hint(&[2], true), hint(&[3], true)];
        cpu_hints.extend(
            NumaMask::all_of(&nodes)
                .into_iter()
                .filter(|m| m.count() >= 2)
                .map(|m| Hint {
                    affinity: Some(m),
                    preferred: false,
                }),
        );
        let cpu = provider("cpu", Some(cpu_hints));
        let devices = provider(
            "example.com/nic",
            Some(vec![hint(&[3], true), hint(&[2, 3], false)]),
        );
        let (best, admit) = merge(
            Policy::SingleNumaNode,
            &nodes,
            &[cpu.clone(), devices.clone()],
        );
        assert_eq!(best, hint(&[3], true));
        assert!(admit);
        // Two devices are only found on nodes 2 and 3 together: no preferred hint is left.
        let two = provider("example.com/nic", Some(vec![hint(&[2, 3], true)]));
        let (best, admit) = merge(Policy::BestEffort, &nodes, &[cpu.clone(), two.clone()]);
        assert_eq!(best, hint(&[2, 3], false));
        assert!(admit);
        let (_, admit) = merge(Policy::Restricted, &nodes, &[cpu, two]);
        assert!(!admit);
    }

    #[test]
    fn unit_hints_prefer_the_fewest_nodes_that_could_ever_hold_the_request() {
        // Two CPUs per node on two nodes; node 0 has one CPU free, node 1 two.
        let all = vec![vec![0], vec![0], vec![1], vec![1]];
        let free = vec![vec![0], vec![1], vec![1]];
        let hints = unit_hints(&[0, 1], &all, &[], &free, 2);
        assert_eq!(hints, [hint(&[1], true), hint(&[0, 1], false)]);
        let hints = unit_hints(&[0, 1], &all, &[], &free, 3);
        assert_eq!(hints, [hint(&[0, 1], true)]);
        assert!(unit_hints(&[0, 1], &all, &[], &free, 4).is_empty());
        // What the container keeps already must stay inside the mask.
        let hints = unit_hints(&[0, 1], &all, &[vec![0]], &free[1..], 2);
        assert_eq!(hints, [hint(&[0, 1], false)]);
    }

    struct Recorder(std::sync::Mutex<Vec<String>>, Hints);

    impl HintProvider for Recorder {
        fn hints(&self, _: &[u32], _: &Pod, _: &Container) -> Hints {
            self.1.clone()
        }
        fn pod_hints(&self, _: &[u32], _: &Pod) -> Hints {
            self.1.clone()
        }
        fn allocate(&self, _: &Pod, c: &Container, a: Option<NumaMask>) -> Result<(), Refusal> {
            let a = a.map_or("any".to_string(), |m| m.to_string());
            self.0.lock().unwrap().push(format!("{}@{a}", c.name));
            Ok(())
        }
        fn release(&self, uid: &str) {
            self.0.lock().unwrap().push(format!("release {uid}"));
        }
        fn holds(&self, _: &str) -> bool {
            false
        }
    }

    #[test]
    fn each_container_is_allocated_along_its_hint_and_a_refusal_releases_the_pod() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"initContainers": [{"name": "i"}], "containers": [{"name": "a"}]}
        }))
        .unwrap();
        let on_1 = provider("cpu", Some(vec![hint(&[1], true), hint(&[0, 1], false)]));
        let r = Recorder(Default::default(), on_1);
        for scope in [Scope::Container, Scope::Pod] {
            let m = TopologyManager::new(Policy::SingleNumaNode, scope, vec![0, 1]).unwrap();
            m.admit(&pod, &[&r]).unwrap();
        }
        assert_eq!(*r.0.lock().unwrap(), ["i@1", "a@1", "i@1", "a@1"]);
        let wide = provider("cpu", Some(vec![hint(&[0, 1], true)]));
        let r = Recorder(Default::default(), wide);
        let m = TopologyManager::new(Policy::SingleNumaNode, Scope::Container, vec![0, 1]).unwrap();
        let refused = m.admit(&pod, &[&r]).unwrap_err();
        assert_eq!(refused.0, AFFINITY_ERROR);
        assert_eq!(*r.0.lock().unwrap(), ["release u"]);
        assert!(TopologyManager::new(Policy::Restricted, Scope::Pod, (0..9).collect()).is_err());
    }
}

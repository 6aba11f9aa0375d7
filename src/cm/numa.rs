//! The machine's NUMA nodes (their CPUs, memory and huge pages, from sysfs or a fixture) and
//! the NUMA affinity masks the topology manager and its hint providers speak in.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use super::cpuset::CpuSet;

/// The most NUMA nodes a mask holds (upstream's bitmask is 64 bits too).
pub const MAX_NODES: u32 = 64;

/// A set of NUMA node ids.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NumaMask(u64);

impl NumaMask {
    /// The mask of these nodes; ids of 64 and up cannot be held and are left out.
    pub fn of(nodes: impl IntoIterator<Item = u32>) -> NumaMask {
        NumaMask(
            nodes
                .into_iter()
                .filter(|n| *n < MAX_NODES)
                .fold(0, |acc, n| acc | (1 << n)),
        )
    }

    pub fn count(self) -> u32 {
        self.0.count_ones()
    }

    pub fn contains(self, node: u32) -> bool {
        node < MAX_NODES && self.0 & (1 << node) != 0
    }

    pub fn any_of(self, nodes: &[u32]) -> bool {
        nodes.iter().any(|n| self.contains(*n))
    }

    pub fn and(self, other: NumaMask) -> NumaMask {
        NumaMask(self.0 & other.0)
    }

    pub fn is_subset_of(self, other: NumaMask) -> bool {
        self.0 & !other.0 == 0
    }

    /// The node ids, lowest first.
    pub fn nodes(self) -> Vec<u32> {
        (0..MAX_NODES).filter(|n| self.contains(*n)).collect()
    }

    /// Upstream's IsNarrowerThan: fewer nodes, or as many with lower ones.
    pub fn is_narrower_than(self, other: NumaMask) -> bool {
        match self.count().cmp(&other.count()) {
            std::cmp::Ordering::Equal => self.0 < other.0,
            order => order.is_lt(),
        }
    }

    /// Every non-empty mask of `nodes`, by size and then in the order upstream's
    /// IterateBitMasks gives them.
    pub fn all_of(nodes: &[u32]) -> Vec<NumaMask> {
        fn subsets(nodes: &[u32], size: usize, accum: &mut Vec<u32>, out: &mut Vec<NumaMask>) {
            if accum.len() == size {
                out.push(NumaMask::of(accum.iter().copied()));
                return;
            }
            for (i, n) in nodes.iter().enumerate() {
                accum.push(*n);
                subsets(&nodes[i + 1..], size, accum, out);
                accum.pop();
            }
        }
        let mut out = Vec::new();
        for size in 1..=nodes.len() {
            subsets(nodes, size, &mut Vec::new(), &mut out);
        }
        out
    }
}

impl fmt::Display for NumaMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = self.nodes().iter().map(u32::to_string).collect();
        write!(f, "{}", nodes.join(","))
    }
}

/// One NUMA node of the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: u32,
    pub cpus: CpuSet,
    /// Its memory in bytes (MemTotal).
    pub memory: u64,
    /// Huge page size in bytes -> pages of that size on the node.
    pub hugepages: BTreeMap<u64, u64>,
}

/// The machine's NUMA nodes, lowest id first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Machine {
    pub nodes: Vec<Node>,
}

impl Machine {
    /// The NUMA nodes under `sys` (`/sys/devices/system/node`). A kernel without NUMA support
    /// has no such dir: the machine is then one node 0 with every online CPU and all memory.
    pub fn discover(sys: &Path, online_cpus: &CpuSet) -> std::io::Result<Machine> {
        let entries = match std::fs::read_dir(sys) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Machine {
                    nodes: vec![Node {
                        id: 0,
                        cpus: online_cpus.clone(),
                        memory: meminfo_total(&std::fs::read_to_string("/proc/meminfo")?),
                        hugepages: BTreeMap::new(),
                    }],
                });
            }
            Err(e) => return Err(e),
        };
        let mut nodes = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_prefix("node"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let dir = entry.path();
            let cpus = CpuSet::parse(&std::fs::read_to_string(dir.join("cpulist"))?)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            let memory = meminfo_total(&std::fs::read_to_string(dir.join("meminfo"))?);
            nodes.push(Node {
                id,
                cpus,
                memory,
                hugepages: hugepages(&dir.join("hugepages")),
            });
        }
        nodes.sort_by_key(|n| n.id);
        Ok(Machine { nodes })
    }

    pub fn ids(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// The node a CPU belongs to (0 when no node lists it).
    pub fn node_of(&self, cpu: u32) -> u32 {
        self.nodes
            .iter()
            .find(|n| n.cpus.contains(cpu))
            .map_or(0, |n| n.id)
    }
}

/// The MemTotal of a meminfo file (`/proc/meminfo`, or a node's `Node 0 MemTotal: ... kB`), in
/// bytes.
fn meminfo_total(text: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("MemTotal:")?;
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0)
        * 1024
}

/// A node's huge pages: `hugepages-<size>kB/nr_hugepages` under `dir`.
fn hugepages(dir: &Path) -> BTreeMap<u64, u64> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let kb: u64 = name
                .to_str()?
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            let pages = std::fs::read_to_string(e.path().join("nr_hugepages")).ok()?;
            Some((kb * 1024, pages.trim().parse().ok()?))
        })
        .collect()
}

/// The resource name of huge pages of this size in bytes (`hugepages-2Mi`), as upstream's
/// HugePageResourceName writes a quantity.
pub fn hugepage_resource(size: u64) -> String {
    let units = [("Gi", 1u64 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
    let text = units
        .iter()
        .find(|(_, unit)| size >= *unit && size.is_multiple_of(*unit))
        .map_or_else(
            || size.to_string(),
            |(name, unit)| format!("{}{name}", size / unit),
        );
    format!("hugepages-{text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_come_in_upstreams_order_and_narrowness() {
        let masks: Vec<String> = NumaMask::all_of(&[0, 1, 2])
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(masks, ["0", "1", "2", "0,1", "0,2", "1,2", "0,1,2"]);
        let (a, b) = (NumaMask::of([0, 1]), NumaMask::of([1, 2]));
        assert!(a.is_narrower_than(b));
        assert!(NumaMask::of([3]).is_narrower_than(a));
        assert!(NumaMask::of([1]).is_subset_of(a));
        assert_eq!(a.and(b), NumaMask::of([1]));
    }

    #[test]
    fn nodes_are_read_from_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        for (id, cpus, kb) in [(0, "0-1", 1000), (1, "2-3", 2000)] {
            let node = dir.path().join(format!("node{id}"));
            std::fs::create_dir_all(node.join("hugepages/hugepages-2048kB")).unwrap();
            std::fs::write(node.join("cpulist"), format!("{cpus}\n")).unwrap();
            std::fs::write(
                node.join("meminfo"),
                format!("Node {id} MemTotal:       {kb} kB\nNode {id} MemFree: 1 kB\n"),
            )
            .unwrap();
            std::fs::write(node.join("hugepages/hugepages-2048kB/nr_hugepages"), "3\n").unwrap();
        }
        std::fs::write(dir.path().join("online"), "0-1\n").unwrap();
        let m = Machine::discover(dir.path(), &CpuSet::default()).unwrap();
        assert_eq!(m.ids(), [0, 1]);
        assert_eq!(m.nodes[1].memory, 2000 * 1024);
        assert_eq!(m.nodes[0].hugepages, BTreeMap::from([(2 << 20, 3)]));
        assert_eq!(m.node_of(3), 1);
        assert_eq!(hugepage_resource(2 << 20), "hugepages-2Mi");
        assert_eq!(hugepage_resource(1 << 30), "hugepages-1Gi");
    }
}

//! The resource managers (CPU, memory, devices, topology) as configured, and the reserves
//! node allocatable keeps back.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, Result};

use crate::config::Config;

/// The CPU, memory, device and topology managers as configured, their state files read or
/// begun in the root dir. `reservation` is what node allocatable keeps back of each memory
/// type, which --reserved-memory must add up to.
pub(super) fn resource_managers(
    config: &Config,
    reservation: BTreeMap<String, u64>,
    health: crate::cm::HealthUpdates,
) -> anyhow::Result<Arc<crate::cm::Resources>> {
    use crate::cm::{cpu, memory, numa, topology};
    let reserved_cores = [&config.kube_reserved, &config.system_reserved]
        .iter()
        .filter_map(|m| m.get("cpu"))
        .filter_map(|q| crate::pod::parse_quantity(q))
        .sum();
    let settings = cpu::Settings {
        static_policy: config.cpu_manager_static,
        reserved_cpus: config.reserved_cpus.clone(),
        reserved_cores,
        full_pcpus_only: config.cpu_manager_full_pcpus_only,
        reconcile_period: config.cpu_manager_reconcile_period,
    };
    // Under the none policies nothing is placed, so a machine whose topology cannot be read
    // only matters to the others.
    let placing = settings.static_policy
        || config.memory_manager_static
        || config.topology_manager_policy != topology::Policy::None;
    let cpus = match cpu::Topology::discover(Path::new("/sys/devices/system/cpu")) {
        Ok(t) => t,
        Err(_) if !placing => cpu::Topology { cpus: Vec::new() },
        Err(e) => {
            return Err(cpu::Error::Topology(e)).context("the CPU manager (--cpu-manager-policy)");
        }
    };
    let online: crate::cm::cpuset::CpuSet = cpus.cpus.iter().map(|c| c.id).collect();
    let machine = match numa::Machine::discover(Path::new("/sys/devices/system/node"), &online) {
        Ok(m) => m,
        Err(_) if !placing => numa::Machine::default(),
        Err(e) => {
            return Err(e)
                .context("cannot read the machine's NUMA nodes under /sys/devices/system/node");
        }
    };
    let cpu_manager = cpu::CpuManager::start(&settings, &config.root_dir, cpus)
        .context("the CPU manager (--cpu-manager-policy)")?;
    if settings.static_policy {
        tracing::info!(shared = %cpu_manager.cpuset("", "").unwrap_or_default(), "CPU manager: static policy");
    }
    let memory_settings = memory::Settings {
        static_policy: config.memory_manager_static,
        reserved: config.reserved_memory.clone(),
        node_reservation: reservation,
    };
    let memory_manager = memory::MemoryManager::start(&memory_settings, &config.root_dir, &machine)
        .context("the memory manager (--memory-manager-policy)")?;
    let topology_manager = topology::TopologyManager::new(
        config.topology_manager_policy,
        config.topology_manager_scope,
        machine.ids(),
    )
    .map_err(|e| anyhow::anyhow!("the topology manager (--topology-manager-policy): {e}"))?;
    if placing {
        tracing::info!(
            numa_nodes = %machine.ids().iter().map(u32::to_string).collect::<Vec<_>>().join(","),
            memory_manager = if config.memory_manager_static { "Static" } else { "None" },
            topology_manager = config.topology_manager_policy.name(),
            scope = config.topology_manager_scope.name(),
            "resource managers"
        );
    }
    Ok(Arc::new(crate::cm::Resources {
        cpus: cpu_manager,
        memory: Arc::new(memory_manager),
        devices: crate::cm::devices::DeviceManager::start(&config.root_dir, health.clone()),
        dra: crate::cm::dra::DraManager::start(&config.root_dir, health),
        topology: topology_manager,
        health_status: config.feature("ResourceHealthStatus"),
    }))
}

/// What node allocatable keeps back of each memory type: memory by kube-reserved,
/// system-reserved and the hard eviction threshold, huge pages by the reserves.
pub(super) fn memory_reservation(
    config: &Config,
    capacity: &crate::types::Allocatable,
    allocatable: &crate::types::Allocatable,
) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::from([(
        "memory".to_string(),
        (capacity.memory - allocatable.memory).max(0.0).round() as u64,
    )]);
    for reserve in [&config.kube_reserved, &config.system_reserved] {
        for (name, q) in reserve.iter().filter(|(n, _)| n.starts_with("hugepages-")) {
            let bytes = crate::pod::parse_quantity(q).unwrap_or(0.0).max(0.0);
            *out.entry(name.clone()).or_default() += bytes.round() as u64;
        }
    }
    out
}

/// Limits the cgroups of the node's daemons and of the host's to their reserves, where
/// enforceNodeAllocatable asks for it.
pub(super) fn enforce_reserves(config: &Config, cgroups: &crate::cgroups::Manager) -> Result<()> {
    for (enforced, cgroup, reserve, field) in [
        (
            config.enforce_node_allocatable.kube_reserved,
            &config.kube_reserved_cgroup,
            &config.kube_reserved,
            "kubeReservedCgroup (--kube-reserved-cgroup)",
        ),
        (
            config.enforce_node_allocatable.system_reserved,
            &config.system_reserved_cgroup,
            &config.system_reserved,
            "systemReservedCgroup (--system-reserved-cgroup)",
        ),
    ] {
        let compressible_only = match enforced {
            crate::config::ReserveEnforcement::Off => continue,
            crate::config::ReserveEnforcement::All => false,
            crate::config::ReserveEnforcement::Compressible => true,
        };
        if let Some(cgroup) = cgroup {
            cgroups
                .enforce_reserve(cgroup, reserve, compressible_only)
                .with_context(|| format!("cannot enforce the reserve on {field}"))?;
        }
    }
    Ok(())
}

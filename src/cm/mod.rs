//! The container manager's parts beyond the cgroups: the CPU, memory and device managers, the
//! topology manager that aligns them on the machine's NUMA nodes at admission, and dynamic
//! resource allocation (DRA).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus, ResourceHealth, ResourceStatus};

use crate::types::Refusal;

pub mod cpu;
pub mod cpuset;
pub mod devices;
pub mod dra;
pub mod memory;
pub mod numa;
pub mod topology;

/// A pod's total of one resource as upstream sums it: its app containers and sidecars together,
/// or a regular init container with the sidecars started before it, whichever is more.
pub fn pod_total(pod: &Pod, of: impl Fn(&Container) -> u64) -> u64 {
    let spec = crate::pod::spec(pod);
    let (mut sidecars, mut peak) = (0u64, 0u64);
    for c in spec.init_containers.iter().flatten() {
        if crate::pod::is_sidecar(c) {
            sidecars = sidecars.saturating_add(of(c));
        } else {
            peak = peak.max(sidecars.saturating_add(of(c)));
        }
    }
    let apps = (spec.containers.iter()).fold(sidecars, |acc, c| acc.saturating_add(of(c)));
    peak.max(apps)
}

/// A pod's total of each resource `of` gives per container, as [`pod_total`] sums one.
pub fn pod_totals(
    pod: &Pod,
    of: impl Fn(&Container) -> BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    let names: BTreeSet<String> = crate::pod::all_containers(crate::pod::spec(pod))
        .flat_map(|c| of(c).into_keys())
        .collect();
    names
        .into_iter()
        .map(|name| {
            let total = pod_total(pod, |c| of(c).get(&name).copied().unwrap_or(0));
            (name, total)
        })
        .collect()
}

/// Where the device and DRA managers tell of the pods whose devices' health changed, so that
/// their statuses show it.
pub type HealthUpdates = tokio::sync::mpsc::UnboundedSender<crate::types::PodUid>;

/// The managers that hand out CPUs, memory and devices to pods.
#[derive(Debug)]
pub struct Resources {
    pub cpus: Arc<cpu::CpuManager>,
    pub memory: Arc<memory::MemoryManager>,
    pub devices: Arc<devices::DeviceManager>,
    pub dra: Arc<dra::DraManager>,
    pub topology: topology::TopologyManager,
    /// Whether container statuses show their devices' health (the ResourceHealthStatus gate).
    pub health_status: bool,
}

impl Resources {
    /// Admission of a pod's resources: its devices by count, then each container's CPUs,
    /// memory and devices along the topology manager's affinity. A refused pod holds nothing.
    pub fn admit(&self, pod: &Pod) -> Result<(), Refusal> {
        self.devices.admit(pod)?;
        let providers: [&dyn topology::HintProvider; 3] =
            [&*self.cpus, &*self.memory, &*self.devices];
        self.topology.admit(pod, &providers)
    }

    /// Sets each app container's `allocatedResourcesStatus` in `status`, as upstream: the
    /// health of the devices its device plugins gave it (by resource) and of those its DRA
    /// claims give it (by `claim:<name>[/<request>]`).
    pub fn health_status(&self, pod: &Pod, status: &mut PodStatus) {
        if !self.health_status {
            return;
        }
        let uid = crate::types::PodUid::of(pod);
        let spec = crate::pod::spec(pod);
        for cs in status.container_statuses.iter_mut().flatten() {
            let mut all = Vec::new();
            for (resource, devices) in self.devices.health(&uid.0, &cs.name) {
                let health = devices.into_iter().map(|(id, healthy)| ResourceHealth {
                    resource_id: id,
                    health: Some(if healthy { "Healthy" } else { "Unhealthy" }.into()),
                    message: None,
                });
                all.push(ResourceStatus {
                    name: resource,
                    resources: Some(health.collect()),
                });
            }
            if let Some(c) = spec.containers.iter().find(|c| c.name == cs.name) {
                all.extend(self.dra.health(pod, c));
            }
            cs.allocated_resources_status = (!all.is_empty()).then_some(all);
        }
    }

    /// Gives back what a pod holds (its containers are gone).
    pub fn release(&self, uid: &str) {
        self.cpus.release(uid);
        topology::HintProvider::release(&*self.memory, uid);
        self.devices.release(uid);
    }

    /// What pods not in `keep` (by UID) hold is given back.
    pub fn retain(&self, keep: &HashSet<String>) {
        self.cpus.retain(keep);
        self.memory.retain(keep);
        self.devices.retain(keep);
        self.dra.hold(keep);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_pods_total_counts_the_sidecars_started_before_each_init_container() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [
                    {"name": "side", "restartPolicy": "Always", "image": "2"},
                    {"name": "init", "image": "3"},
                ],
                "containers": [{"name": "app", "image": "1"}],
            }
        }))
        .unwrap();
        let of = |c: &k8s_openapi::api::core::v1::Container| {
            c.image.as_deref().and_then(|i| i.parse().ok()).unwrap_or(0)
        };
        assert_eq!(super::pod_total(&pod, of), 5);
    }
}

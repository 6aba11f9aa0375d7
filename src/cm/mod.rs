//! The container manager's parts beyond the cgroups: the CPU, memory and device managers, and
//! the topology manager that aligns them on the machine's NUMA nodes at admission.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::types::Refusal;

pub mod cpu;
pub mod cpuset;
pub mod devices;
pub mod memory;
pub mod numa;
pub mod topology;

/// The managers that hand out CPUs, memory and devices to pods.
#[derive(Debug)]
pub struct Resources {
    pub cpus: Arc<cpu::CpuManager>,
    pub memory: Arc<memory::MemoryManager>,
    pub devices: Arc<devices::DeviceManager>,
    pub topology: topology::TopologyManager,
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
    }
}

//! The kubelet's pod-resources API (v1) on `<root-dir>/pod-resources/kubelet.sock`: the CPUs,
//! NUMA-pinned memory and devices each container holds for itself, and those the node can hand
//! out, for monitoring agents and device tools. Root and the socket's group only, as the admin
//! socket.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::cm::Resources;
use crate::cm::memory::Block;
use crate::status;
use crate::types::PodUid;

/// The generated messages, server and client.
pub mod proto {
    tonic::include_proto!("v1");
}

use proto::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};

/// The socket of the agent using `root_dir`, where upstream's kubelet has it.
pub fn socket_path(root_dir: &Path) -> PathBuf {
    root_dir.join("pod-resources").join("kubelet.sock")
}

/// What the API reads.
#[derive(Clone)]
pub struct Handles {
    pub statuses: status::Reader,
    pub resources: Arc<Resources>,
}

/// Devices in the API's form.
fn devices(resource: String, ids: Vec<String>, numa: Vec<i64>) -> proto::ContainerDevices {
    let topology = (!numa.is_empty()).then(|| proto::TopologyInfo {
        nodes: numa.into_iter().map(|id| proto::NumaNode { id }).collect(),
    });
    proto::ContainerDevices {
        resource_name: resource,
        device_ids: ids,
        topology,
    }
}

/// A claim a container uses, in the API's form.
fn dynamic_resource(claim: crate::cm::dra::ContainerClaim) -> proto::DynamicResource {
    let devices = claim
        .devices
        .into_iter()
        .map(|(driver, d)| proto::ClaimResource {
            cdi_devices: (d.cdi_ids.into_iter())
                .map(|name| proto::CdiDevice { name })
                .collect(),
            driver_name: driver,
            pool_name: d.pool,
            device_name: d.device,
            share_id: d.share_id,
        });
    proto::DynamicResource {
        claim_name: claim.name,
        claim_namespace: claim.namespace,
        claim_resources: devices.collect(),
    }
}

/// Memory in the API's form.
fn memory(block: Block) -> proto::ContainerMemory {
    let nodes = block.numa_affinity.into_iter();
    proto::ContainerMemory {
        memory_type: block.kind,
        size: block.size,
        topology: Some(proto::TopologyInfo {
            nodes: nodes.map(|id| proto::NumaNode { id: id.into() }).collect(),
        }),
    }
}

impl Handles {
    /// A pod's containers (and sidecars) with the CPUs each holds for itself.
    fn resources(&self, pod: &Pod) -> proto::PodResources {
        let uid = PodUid::of(pod);
        let spec = crate::pod::spec(pod);
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| crate::pod::is_sidecar(c))
            .chain(&spec.containers)
            .map(|c| proto::ContainerResources {
                name: c.name.clone(),
                cpu_ids: self.resources.cpus.exclusive(&uid.0, &c.name),
                memory: (self.resources.memory.container_memory(&uid.0, &c.name))
                    .into_iter()
                    .map(memory)
                    .collect(),
                devices: self
                    .resources
                    .devices
                    .container_devices(&uid.0, &c.name)
                    .into_iter()
                    .map(|(resource, ids, numa)| devices(resource, ids, numa))
                    .collect(),
                dynamic_resources: (self.resources.dra.container_claims(pod, c))
                    .into_iter()
                    .map(dynamic_resource)
                    .collect(),
            })
            .collect();
        proto::PodResources {
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: crate::types::namespace(pod).to_string(),
            containers,
        }
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Handles {
    async fn list(
        &self,
        _: Request<proto::ListPodResourcesRequest>,
    ) -> Result<Response<proto::ListPodResourcesResponse>, Status> {
        let pod_resources = self
            .statuses
            .list()
            .iter()
            .map(|e| self.resources(&e.pod))
            .collect();
        Ok(Response::new(proto::ListPodResourcesResponse {
            pod_resources,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<proto::AllocatableResourcesRequest>,
    ) -> Result<Response<proto::AllocatableResourcesResponse>, Status> {
        let allocatable = self.resources.devices.allocatable_devices().into_iter();
        let devices = allocatable.flat_map(|(resource, list)| {
            list.into_iter()
                .map(move |(id, numa)| devices(resource.clone(), vec![id], numa))
        });
        Ok(Response::new(proto::AllocatableResourcesResponse {
            cpu_ids: self.resources.cpus.allocatable(),
            devices: devices.collect(),
            memory: (self.resources.memory.allocatable())
                .into_iter()
                .map(memory)
                .collect(),
        }))
    }

    async fn get(
        &self,
        request: Request<proto::GetPodResourcesRequest>,
    ) -> Result<Response<proto::GetPodResourcesResponse>, Status> {
        let r = request.into_inner();
        let namespace = if r.pod_namespace.is_empty() {
            "default"
        } else {
            r.pod_namespace.as_str()
        };
        let Some(entry) = self.statuses.by_name(namespace, &r.pod_name) else {
            return Err(Status::not_found(format!(
                "pod {} in namespace {namespace} not found",
                r.pod_name
            )));
        };
        Ok(Response::new(proto::GetPodResourcesResponse {
            pod_resources: Some(self.resources(&entry.pod)),
        }))
    }
}

/// Serves the API on `listener` until `cancel`, then removes the socket file.
pub async fn serve(
    listener: UnixListener,
    path: PathBuf,
    handles: Handles,
    cancel: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let incoming =
        super::admin::admitted_connections(listener, path.clone(), "the pod-resources socket");
    let served = tonic::transport::Server::builder()
        .add_service(PodResourcesListerServer::new(handles))
        .serve_with_incoming_shutdown(incoming, cancel.cancelled())
        .await;
    let _ = std::fs::remove_file(&path);
    served
}

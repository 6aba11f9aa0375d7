//! What a sync makes ready in the pod before its sandbox and containers: its volumes, and the
//! new resources of containers resized in place.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::core::v1::ResourceFieldSelector;

use super::{Error, Syncer, actions, convert, resources};
use crate::events::Target;
use crate::pod::spec;
use crate::runtime::PodRuntime;
use crate::types::{PodUid, full_name};
use crate::volumes;

impl Syncer {
    /// Sets up the pod's volumes; a failure is a FailedMount warning, worded as upstream's
    /// (which tools and tests match on).
    pub(super) fn mount_volumes(
        &self,
        pod: &Pod,
        objects: &crate::objects::View,
    ) -> Result<HashMap<String, volumes::Mounted>, Error> {
        let node = &self.ctx.node;
        let resource_field =
            |r: &ResourceFieldSelector| resources::selector_value(pod, None, r, node);
        let inputs = volumes::Inputs {
            objects,
            resource_field: &resource_field,
        };
        let mounted = self.volumes.setup(pod, &inputs).inspect_err(|e| {
            let message = match e {
                volumes::Error::Volume { volume, message } => {
                    format!("MountVolume.SetUp failed for volume {volume:?} : {message}")
                }
                other => crate::types::error_chain(other),
            };
            self.events
                .warning(Target::pod(pod), "FailedMount", message)
        })?;
        Ok(mounted)
    }

    /// Resizes the containers the plan resizes in place, after widening the pod's cgroup; `rt`
    /// then shows their new resources (the status this sync records shows them in place).
    pub(super) async fn resize_all(
        &self,
        pod: &Pod,
        resizes: &[actions::Resize],
        rt: &mut PodRuntime,
    ) -> Result<(), Error> {
        if resizes.is_empty() {
            return Ok(());
        }
        self.cgroups.widen_pod(pod)?;
        for r in resizes {
            let digest = self.resize(pod, r).await?;
            if let Some(c) = rt.containers.iter_mut().find(|c| c.id == r.id) {
                c.resources = digest;
            }
        }
        Ok(())
    }

    /// Resizes a container in place; returns its new resources digest.
    async fn resize(&self, pod: &Pod, r: &actions::Resize) -> Result<String, Error> {
        let Some(want) = crate::pod::all_containers(spec(pod)).find(|c| c.name == r.name) else {
            return Ok(String::new());
        };
        let resources = convert::linux_resources(pod, want, self.ctx.node.memory, self.ctx.cfs);
        self.runtime
            .update_container_resources(&r.id, resources)
            .await?;
        let digest = convert::resources_digest(pod, want).encode();
        tracing::info!(pod = %full_name(pod), container = %r.name, resources = %digest, "resized container in place");
        self.book(&PodUid::of(pod), |book| {
            book.resized.insert(r.id.clone(), digest.clone())
        });
        Ok(digest)
    }
}

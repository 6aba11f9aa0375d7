//! What a sync makes ready in the pod before its sandbox and containers: its volumes, its
//! dynamic resources (DRA), and the new resources of containers resized in place.

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

    /// Has the drivers of the pod's resource claims prepare them (before its sandbox is made);
    /// a failure is a FailedPrepareDynamicResources warning, worded as upstream's.
    pub(super) async fn prepare_resources(&self, pod: &Pod) -> Result<(), Error> {
        self.resources.dra.prepare(pod).await.map_err(|e| {
            self.events.warning(
                Target::pod(pod),
                "FailedPrepareDynamicResources",
                format!(
                    "Failed to prepare dynamic resources: prepare dynamic resources: {}",
                    crate::types::error_chain(&e)
                ),
            );
            Error::Prepare(e)
        })
    }

    /// Resizes the containers the plan resizes in place, after widening the pod's cgroup, then
    /// gives the pod's cgroup its limits (made, for a new pod); `rt` then shows the containers'
    /// new resources (the status this sync records shows them in place). A memory limit that
    /// would fall below what the pod or the container uses now is not set: the resize fails,
    /// and the status says why (PodResizeInProgress, Error), as upstream.
    pub(super) async fn resize_all(
        &self,
        pod: &Pod,
        resizes: &[actions::Resize],
        rt: &mut PodRuntime,
    ) -> Result<(), Error> {
        let uid = PodUid::of(pod);
        let outcome = self.check_memory_decreases(pod, resizes, rt).await;
        let error = outcome.as_ref().err().map(|e| crate::types::error_chain(e));
        self.book(&uid, |book| book.resize_error.clone_from(&error));
        outcome?;
        if !resizes.is_empty() {
            self.cgroups.widen_pod(pod)?;
        }
        for r in resizes {
            let digest = self.resize(pod, r).await?;
            if let Some(c) = rt.containers.iter_mut().find(|c| c.id == r.id) {
                c.resources = digest;
            }
        }
        self.cgroups.ensure_pod(pod)?;
        Ok(())
    }

    /// Upstream's check before memory limits decrease: the pod's new limit above what its
    /// cgroup uses, and each resized container's above what it uses.
    async fn check_memory_decreases(
        &self,
        pod: &Pod,
        resizes: &[actions::Resize],
        rt: &PodRuntime,
    ) -> Result<(), Error> {
        let mut problems = Vec::new();
        let pod_limit = crate::cgroups::pod_limits(pod, self.ctx.cfs).memory;
        let applied = self.cgroups.pod_memory_limit(pod);
        if let (Some(limit), Some(applied)) = (pod_limit, applied)
            && applied.is_none_or(|old| limit < old)
            && let Some(usage) = self.cgroups.pod_memory_usage(pod)
            && usage >= limit.unsigned_abs()
        {
            problems.push(format!(
                "attempting to set pod memory limit ({limit}) below current usage ({usage})"
            ));
        }
        let mut decreasing = Vec::new();
        for r in resizes {
            let Some(want) = crate::pod::all_containers(spec(pod)).find(|c| c.name == r.name)
            else {
                continue;
            };
            let limit =
                convert::linux_resources(pod, want, 0.0, self.ctx.cfs).memory_limit_in_bytes;
            let old = rt
                .containers
                .iter()
                .find(|c| c.id == r.id)
                .and_then(|c| convert::ResourcesDigest::decode(&c.resources))
                .and_then(|d| d.memory.parse::<i64>().ok())
                .unwrap_or(0);
            if limit > 0 && (old == 0 || limit < old) {
                decreasing.push((r, limit));
            }
        }
        if !decreasing.is_empty() {
            let stats = self.runtime.container_stats().await?;
            for (r, limit) in decreasing {
                let usage = stats
                    .iter()
                    .find(|s| s.attributes.as_ref().is_some_and(|a| a.id == r.id))
                    .and_then(|s| s.memory.as_ref()?.usage_bytes.as_ref())
                    .map(|u| u.value);
                if let Some(usage) = usage.filter(|u| *u >= limit.unsigned_abs()) {
                    problems.push(format!(
                        "attempting to set container {:?} memory limit ({limit}) below current usage ({usage})",
                        r.name
                    ));
                }
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(Error::Resize(format!(
            "cannot decrease memory limits: {}",
            problems.join(", ")
        )))
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

//! The pod's sandbox: its config (DNS, user namespace, runtime handler), created when the plan
//! asks for one, and the network files its containers get.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;

use super::{Error, Syncer, actions, convert, network};
use crate::events::Target;
use crate::pod::spec;
use crate::runtime::{PodRuntime, cri};
use crate::types::{PodUid, full_name};
use crate::volumes;

/// The sandbox a sync starts containers in.
pub(super) struct Sandbox {
    pub id: String,
    pub config: cri::PodSandboxConfig,
}

/// The runtime handler of the pod's RuntimeClass (none without one), or upstream's message when
/// the class is missing.
pub(super) fn runtime_handler(pod: &Pod, objects: &crate::objects::View) -> Result<String, String> {
    use crate::objects::{HANDLER_KEY, Kind, View};
    let Some(class) = spec(pod)
        .runtime_class_name
        .as_deref()
        .filter(|c| !c.is_empty())
    else {
        return Ok(String::new());
    };
    let found = objects
        .get(Kind::RuntimeClass, class)
        .ok_or_else(|| View::not_found(Kind::RuntimeClass, class))?;
    Ok(found
        .data
        .get(HANDLER_KEY)
        .map(|h| String::from_utf8_lossy(h).into_owned())
        .unwrap_or_default())
}

impl Syncer {
    /// The pod's sandbox: the one the plan keeps, or a new one when it asks for one (with the
    /// warnings and events of a sandbox start); `None` when it has neither (a pod that ended).
    pub(super) async fn ensure_sandbox(
        &self,
        pod: &Pod,
        plan: &actions::Plan,
        rt: &PodRuntime,
        objects: &crate::objects::View,
    ) -> Result<Option<Sandbox>, Error> {
        let host_dns = network::host_dns(self.ctx.resolv_conf.as_deref());
        let (dns, dns_warnings) = network::dns_config(pod, &host_dns, &self.ctx.cluster_dns);
        let attempt = plan
            .create_sandbox
            .or_else(|| rt.latest_sandbox().map(|s| s.attempt))
            .unwrap_or(0);
        let userns = self
            .user_namespace(pod, objects)
            .map_err(|why| self.sandbox_failed(pod, why))?;
        let config = convert::sandbox_config(
            pod,
            attempt,
            &self.ctx,
            dns,
            self.cgroups.pod_parent(pod),
            userns.as_ref(),
        );
        let id = match (&plan.create_sandbox, &plan.sandbox_id) {
            (Some(_), _) => {
                for warning in &dns_warnings {
                    self.events
                        .warning(Target::pod(pod), "DNSConfigForming", warning.clone());
                }
                self.create_sandbox(pod, attempt, &config, objects).await?
            }
            (None, Some(id)) => id.clone(),
            (None, None) => return Ok(None),
        };
        Ok(Some(Sandbox { id, config }))
    }

    /// Has the runtime create the pod's sandbox (in a sandbox start slot).
    async fn create_sandbox(
        &self,
        pod: &Pod,
        attempt: u32,
        config: &cri::PodSandboxConfig,
        objects: &crate::objects::View,
    ) -> Result<String, Error> {
        if super::resources::wants_hugepages(pod) {
            tracing::warn!(pod = %full_name(pod), "hugepages are not provided by nodelet; the request is ignored");
        }
        let log_dir = convert::pod_log_dir(&self.ctx, pod);
        std::fs::create_dir_all(&log_dir).map_err(|source| Error::Io {
            path: log_dir.clone(),
            source,
        })?;
        if attempt > 0 {
            self.events.normal(
                Target::pod(pod),
                "SandboxChanged",
                "Pod sandbox changed, it will be killed and re-created.".into(),
            );
        }
        let handler = network::fqdn_too_long(pod, &self.ctx.cluster_dns.domain)
            .map_or_else(|| runtime_handler(pod, objects), Err)
            .map_err(|why| self.sandbox_failed(pod, why))?;
        let uid = PodUid::of(pod);
        let step = self.diagnoses.begin(&uid, "a sandbox start slot".into());
        let slot = self.sandbox_starts.acquire().await;
        drop(step);
        let _step = self.diagnoses.begin(
            &uid,
            "the runtime to create the pod sandbox (its network included)".into(),
        );
        let started = std::time::Instant::now();
        let own_userns = spec(pod).host_users == Some(false);
        let id = self
            .runtime
            .run_pod_sandbox(config.clone(), handler.clone())
            .await;
        crate::metrics::get().sandbox_run(&handler, started.elapsed(), own_userns, id.is_err());
        drop(slot);
        let id = id.inspect_err(|e| {
            self.events.warning(
                Target::pod(pod),
                "FailedCreatePodSandBox",
                format!("Failed to create pod sandbox: {e}"),
            )
        })?;
        tracing::info!(pod = %full_name(pod), sandbox = %id, attempt, "started pod sandbox");
        Ok(id)
    }

    /// A sandbox the pod cannot have: a FailedCreatePodSandBox warning, and the error.
    fn sandbox_failed(&self, pod: &Pod, why: String) -> Error {
        self.events.warning(
            Target::pod(pod),
            "FailedCreatePodSandBox",
            format!("Failed to create pod sandbox: {why}"),
        );
        Error::Sandbox(why)
    }

    /// The pod's own user namespace when it asks for one (`hostUsers: false`): its runtime
    /// handler must support them, as the runtime's status says, and its IDs are the range it
    /// was given (upstream's messages).
    fn user_namespace(
        &self,
        pod: &Pod,
        objects: &crate::objects::View,
    ) -> Result<Option<cri::UserNamespace>, String> {
        if spec(pod).host_users != Some(false) {
            return Ok(None);
        }
        let handler = runtime_handler(pod, objects)?;
        if !self.ctx.userns_handlers.contains(&handler) {
            return Err(if handler.is_empty() {
                "can't set `spec.hostUsers: false`, runtime does not support user namespaces".into()
            } else {
                format!(
                    "can't set `spec.hostUsers: false`, RuntimeClass handler {handler:?} does not support user namespaces"
                )
            });
        }
        self.userns
            .range_of(&PodUid::of(pod))
            .map(|range| Some(range.namespace()))
            .map_err(|e| format!("create user namespace: {e}"))
    }

    /// Can the pod's runtime handler make recursive read-only mounts? Only asked (and its
    /// RuntimeClass looked up in `objects`) when a mount of the pod wants one.
    pub(super) fn rro_supported(
        &self,
        pod: &Pod,
        objects: impl FnOnce() -> crate::objects::View,
    ) -> bool {
        let wanted = crate::pod::all_containers(spec(pod))
            .flat_map(|c| c.volume_mounts.iter().flatten())
            .any(|m| {
                m.recursive_read_only
                    .as_deref()
                    .is_some_and(|r| r != "Disabled")
            });
        wanted && runtime_handler(pod, &objects()).is_ok_and(|h| self.ctx.rro_handlers.contains(&h))
    }

    pub(super) async fn pod_ip(&self, sandbox_id: &str) -> Result<String, Error> {
        let ips = self.runtime.sandbox_ips(sandbox_id).await?;
        Ok(ips.into_iter().next().unwrap_or_default())
    }

    /// Writes the pod's managed hosts file (`<root-dir>/pods/<uid>/etc-hosts`) and returns its path.
    pub(super) fn write_etc_hosts(&self, pod: &Pod, pod_ip: &str) -> Result<PathBuf, Error> {
        let path = volumes::pod_dir(&self.ctx.root_dir, &PodUid::of(pod).0).join("etc-hosts");
        let node_hosts = if spec(pod).host_network.unwrap_or(false) {
            std::fs::read_to_string("/etc/hosts").unwrap_or_default()
        } else {
            String::new()
        };
        let ips: Vec<String> = (!pod_ip.is_empty())
            .then(|| pod_ip.to_string())
            .into_iter()
            .collect();
        let content = network::etc_hosts(pod, &ips, &self.ctx.cluster_dns.domain, &node_hosts);
        std::fs::write(&path, content).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }
}

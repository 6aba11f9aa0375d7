//! What one sync of one pod does: read the pod's runtime state, plan (actions.rs), then carry the
//! plan out through the CRI, preparing volumes, images and log paths on the way.

pub mod actions;
mod backoff;
pub mod convert;
pub mod status;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::task::JoinSet;

use crate::pod::{grace_period_seconds, spec};
use crate::pod_workers::PodSyncer;
use crate::runtime::{self, ANNOTATION_NODE_NAME, ContainerState, PodRuntime, RuntimeClient, cri};
use crate::types::{PodUid, full_name};
use crate::volumes;
use crate::{images, probe};
pub use convert::Context;

/// Why a sync step failed; each message names the pod part involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    #[error(transparent)]
    Volume(#[from] volumes::Error),
    #[error("container {container:?}: {reason}: {source}")]
    Image {
        container: String,
        reason: &'static str,
        #[source]
        source: images::Error,
    },
    #[error("container {container:?}: CreateContainerConfigError: {message}")]
    Config { container: String, message: String },
    #[error("cannot prepare {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The container waiting reason this failure shows as, as upstream.
    fn waiting_reason(&self) -> String {
        match self {
            Error::Image { reason, .. } => (*reason).into(),
            Error::Config { .. } => "CreateContainerConfigError".into(),
            Error::Runtime(e) if e.call() == "StartContainer" => "RunContainerError".into(),
            _ => "CreateContainerError".into(),
        }
    }
}

/// First delay of a crashing container's restarts; it doubles up to the max (upstream values).
const RESTART_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Syncs pods against one runtime and records their status.
pub struct Syncer {
    runtime: RuntimeClient,
    ctx: Context,
    status: crate::status::Writer,
    statuses: crate::status::Reader,
    /// Per pod, per container: why the last start failed (cleared by a successful start).
    waiting: std::sync::Mutex<HashMap<PodUid, HashMap<String, status::Waiting>>>,
    backoff: std::sync::Mutex<backoff::Backoff>,
    probes: Arc<probe::Manager>,
}

fn display_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        src = s.source();
    }
    out
}

impl Syncer {
    pub fn new(
        runtime: RuntimeClient,
        ctx: Context,
        status: crate::status::Writer,
        probes: Arc<probe::Manager>,
    ) -> Self {
        Syncer {
            probes,
            runtime,
            ctx,
            statuses: status.reader(),
            status,
            waiting: Default::default(),
            backoff: std::sync::Mutex::new(backoff::Backoff::new(
                RESTART_BACKOFF_INITIAL,
                RESTART_BACKOFF_MAX,
            )),
        }
    }

    /// For a restart of a container that exited: how long it must still wait (CrashLoopBackOff),
    /// or `None` after recording the restart in the backoff.
    fn restart_backoff(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
        start: &actions::Start,
    ) -> Option<Duration> {
        let previous = rt
            .latest_container(&start.name)
            .filter(|c| c.state == ContainerState::Exited)?;
        let key = format!("{}_{}_{}", PodUid::of(pod), start.name, previous.hash);
        let finished = UNIX_EPOCH + Duration::from_nanos(previous.finished_at.max(0) as u64);
        let mut backoff = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
        let remaining = backoff.remaining(&key, finished, SystemTime::now());
        if remaining.is_none() {
            backoff.next(&key, finished);
        }
        remaining
    }

    fn record_waiting(&self, uid: &PodUid, container: &str, failure: Option<status::Waiting>) {
        let mut all = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let pod = all.entry(uid.clone()).or_default();
        match failure {
            Some(w) => {
                pod.insert(container.into(), w);
            }
            None => {
                pod.remove(container);
            }
        }
    }

    /// Reads the pod's runtime state and records its status.
    /// Running containers whose liveness or startup probe failed, with the kill reason.
    fn unhealthy(&self, pod: &Pod, rt: &PodRuntime) -> HashMap<String, actions::Unhealthy> {
        let results = self.probes.results();
        rt.containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
            .filter_map(|c| {
                let kind = results.unhealthy(&c.id)?;
                let want = spec(pod).containers.iter().find(|w| w.name == c.name);
                let probe = want.and_then(|w| match kind {
                    probe::Kind::Startup => w.startup_probe.as_ref(),
                    _ => w.liveness_probe.as_ref(),
                });
                let which = if kind == probe::Kind::Startup {
                    "startup"
                } else {
                    "liveness"
                };
                Some((
                    c.id.clone(),
                    actions::Unhealthy {
                        reason: format!(
                            "Container {} failed {which} probe, will be restarted",
                            c.name
                        ),
                        grace: probe.and_then(|p| p.termination_grace_period_seconds),
                    },
                ))
            })
            .collect()
    }

    async fn update_status(&self, pod: &Pod) -> Result<(), Error> {
        let uid = PodUid::of(pod);
        let rt = self.runtime.pod_runtime(&uid).await?;
        let pod_ips = match rt.latest_sandbox() {
            Some(sb) if sb.state == runtime::SandboxState::Ready => {
                match self.runtime.pod_sandbox_status(&sb.id).await {
                    Ok(st) => st
                        .network
                        .map(|n| {
                            std::iter::once(n.ip)
                                .chain(n.additional_ips.into_iter().map(|ip| ip.ip))
                                .filter(|ip| !ip.is_empty())
                                .collect()
                        })
                        .unwrap_or_default(),
                    Err(e) if e.is_not_found() => Vec::new(),
                    Err(e) => return Err(e.into()),
                }
            }
            _ => Vec::new(),
        };
        let waiting = self
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&uid)
            .cloned()
            .unwrap_or_default();
        let host_network = spec(pod).host_network.unwrap_or(false);
        let probe_host = match pod_ips.first() {
            Some(ip) if !host_network => ip.clone(),
            _ => self.ctx.host_ip.clone(),
        };
        self.probes.sync_pod(pod, &rt, &probe_host);
        let results = self.probes.results();
        let probes: HashMap<String, status::ProbeState> = rt
            .containers
            .iter()
            .filter_map(|c| {
                let want = crate::pod::all_containers(spec(pod)).find(|w| w.name == c.name)?;
                let (ready, started) = results.state(&c.id, want);
                Some((c.id.clone(), status::ProbeState { ready, started }))
            })
            .collect();
        let old = self.statuses.get(&uid);
        let status = status::generate(&status::Input {
            pod,
            rt: &rt,
            pod_ips,
            host_ip: &self.ctx.host_ip,
            waiting: &waiting,
            probes: &probes,
            old: old.as_ref().and_then(|e| e.pod.status.as_ref()),
            now: crate::types::now(),
            runtime_name: &self.ctx.runtime_name,
        });
        if self.status.set(pod, status) {
            tracing::debug!(pod = %full_name(pod), "pod status changed");
        }
        Ok(())
    }

    async fn sync(&self, pod: &Pod) -> Result<Option<Duration>, Error> {
        let uid = PodUid::of(pod);
        let rt = self.runtime.pod_runtime(&uid).await?;
        let plan = actions::plan(pod, &rt, &self.unhealthy(pod, &rt));
        tracing::debug!(pod = %full_name(pod), ?plan, "sync plan");
        if plan.kill_pod {
            self.kill_all(pod, &rt).await?;
        }
        let volume_paths = volumes::setup(pod, &self.ctx.root_dir)?;
        let host_dns = convert::host_dns(self.ctx.resolv_conf.as_deref());
        let dns = convert::dns_config(pod, &host_dns);
        let attempt = plan
            .create_sandbox
            .or_else(|| rt.latest_sandbox().map(|s| s.attempt))
            .unwrap_or(0);
        let sandbox_config = convert::sandbox_config(pod, attempt, &self.ctx, dns);
        let sandbox_id = match (&plan.create_sandbox, &plan.sandbox_id) {
            (Some(_), _) => {
                if matches!(
                    spec(pod).dns_policy.as_deref(),
                    Some("ClusterFirst") | Some("ClusterFirstWithHostNet")
                ) {
                    tracing::warn!(pod = %full_name(pod), "no cluster DNS is configured; dnsPolicy ClusterFirst falls back to the host's resolver (dnsPolicy Default)");
                }
                let log_dir = convert::pod_log_dir(&self.ctx, pod);
                std::fs::create_dir_all(&log_dir).map_err(|source| Error::Io {
                    path: log_dir.clone(),
                    source,
                })?;
                let id = self.runtime.run_pod_sandbox(sandbox_config.clone()).await?;
                tracing::info!(pod = %full_name(pod), sandbox = %id, attempt, "started pod sandbox");
                id
            }
            (None, Some(id)) => id.clone(),
            (None, None) => return self.update_status(pod).await.map(|()| None),
        };
        for k in &plan.kill {
            tracing::info!(pod = %full_name(pod), container = %k.name, reason = %k.reason, "killing container");
            self.stop_container(&k.id, k.grace.unwrap_or_else(|| grace_period_seconds(pod)))
                .await?;
        }
        let pod_ip = if plan.start.is_empty() {
            String::new()
        } else {
            self.pod_ip(&sandbox_id).await?
        };
        let mut first_error = None;
        let mut again: Option<Duration> = None;
        for start in &plan.start {
            if let Some(wait) = self.restart_backoff(pod, &rt, start) {
                let message = format!(
                    "back-off {}s restarting failed container={} pod={}",
                    wait.as_secs().max(1),
                    start.name,
                    full_name(pod)
                );
                tracing::debug!(pod = %full_name(pod), container = %start.name, "{message}");
                let reason = "CrashLoopBackOff".to_string();
                self.record_waiting(&uid, &start.name, Some(status::Waiting { reason, message }));
                again = Some(again.map_or(wait, |a| a.min(wait)));
                continue;
            }
            let result = self
                .start_container(
                    pod,
                    start,
                    &sandbox_id,
                    &sandbox_config,
                    &volume_paths,
                    &pod_ip,
                )
                .await;
            match result {
                Ok(()) => self.record_waiting(&uid, &start.name, None),
                Err(e) => {
                    let message = display_chain(&e);
                    tracing::warn!(pod = %full_name(pod), container = %start.name, error = %message, "cannot start container");
                    let reason = e.waiting_reason();
                    self.record_waiting(
                        &uid,
                        &start.name,
                        Some(status::Waiting { reason, message }),
                    );
                    first_error.get_or_insert(e);
                }
            }
        }
        for id in &plan.remove_containers {
            self.remove_container(pod, &rt, id).await?;
        }
        for id in &plan.remove_sandboxes {
            ignore_not_found(self.runtime.remove_pod_sandbox(id).await)?;
        }
        self.update_status(pod).await?;
        first_error.map_or(Ok(again), Err)
    }

    async fn pod_ip(&self, sandbox_id: &str) -> Result<String, Error> {
        let status = self.runtime.pod_sandbox_status(sandbox_id).await?;
        Ok(status.network.map(|n| n.ip).unwrap_or_default())
    }

    async fn start_container(
        &self,
        pod: &Pod,
        start: &actions::Start,
        sandbox_id: &str,
        sandbox_config: &cri::PodSandboxConfig,
        volume_paths: &HashMap<String, PathBuf>,
        pod_ip: &str,
    ) -> Result<(), Error> {
        let s = spec(pod);
        let Some(container) = crate::pod::all_containers(s).find(|c| c.name == start.name) else {
            return Ok(());
        };
        let image = container.image.as_deref().unwrap_or_default();
        let policy = container
            .image_pull_policy
            .as_deref()
            .unwrap_or("IfNotPresent");
        let image_ref = images::ensure(&self.runtime, image, policy, sandbox_config)
            .await
            .map_err(|source| Error::Image {
                container: start.name.clone(),
                reason: source.reason(),
                source,
            })?;
        let config = convert::container_config(&convert::ContainerInput {
            pod,
            container,
            init: start.init,
            restart_count: start.restart_count,
            image_ref: &image_ref,
            volumes: volume_paths,
            pod_ip,
        })
        .map_err(|message| Error::Config {
            container: start.name.clone(),
            message,
        })?;
        let log_dir = convert::pod_log_dir(&self.ctx, pod).join(&start.name);
        std::fs::create_dir_all(&log_dir).map_err(|source| Error::Io {
            path: log_dir.clone(),
            source,
        })?;
        let log_file = convert::pod_log_dir(&self.ctx, pod).join(&config.log_path);
        let id = self
            .runtime
            .create_container(sandbox_id, config, sandbox_config.clone())
            .await?;
        self.link_log(pod, &start.name, &id, &log_file);
        self.runtime.start_container(&id).await?;
        tracing::info!(pod = %full_name(pod), container = %start.name, id = %id, restart_count = start.restart_count, "started container");
        Ok(())
    }

    /// The `/var/log/containers` style symlink; a failure only costs log shippers, so it is logged.
    fn link_log(&self, pod: &Pod, container: &str, id: &str, target: &std::path::Path) {
        let link = convert::container_log_link(&self.ctx, pod, container, id);
        let made = std::fs::create_dir_all(&self.ctx.container_logs_dir)
            .and_then(|()| match std::fs::remove_file(&link) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            })
            .and_then(|()| std::os::unix::fs::symlink(target, &link));
        if let Err(e) = made {
            tracing::warn!(link = %link.display(), error = %e, "cannot create container log symlink");
        }
    }

    async fn stop_container(&self, id: &str, grace: i64) -> Result<(), Error> {
        ignore_not_found(self.runtime.stop_container(id, grace).await)?;
        Ok(())
    }

    async fn remove_container(&self, pod: &Pod, rt: &PodRuntime, id: &str) -> Result<(), Error> {
        ignore_not_found(self.runtime.remove_container(id).await)?;
        if let Some(c) = rt.containers.iter().find(|c| c.id == id) {
            let link = convert::container_log_link(&self.ctx, pod, &c.name, id);
            let _ = std::fs::remove_file(link);
        }
        Ok(())
    }

    /// Stops every running container of the pod in parallel (each gets the grace period:
    /// SIGTERM, then SIGKILL at the deadline), then its sandboxes, then removes them all.
    async fn kill_all(&self, pod: &Pod, rt: &PodRuntime) -> Result<(), Error> {
        let mut stops = JoinSet::new();
        for c in rt
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running || c.state == ContainerState::Created)
        {
            let grace = if pod.spec.is_some() {
                grace_period_seconds(pod)
            } else {
                c.grace_seconds.unwrap_or(30)
            };
            let runtime = self.runtime.clone();
            let id = c.id.clone();
            stops.spawn(async move { ignore_not_found(runtime.stop_container(&id, grace).await) });
        }
        while let Some(joined) = stops.join_next().await {
            if let Ok(result) = joined {
                result?;
            }
        }
        for sb in &rt.sandboxes {
            ignore_not_found(self.runtime.stop_pod_sandbox(&sb.id).await)?;
        }
        for c in &rt.containers {
            self.remove_container(pod, rt, &c.id).await?;
        }
        for sb in &rt.sandboxes {
            ignore_not_found(self.runtime.remove_pod_sandbox(&sb.id).await)?;
        }
        Ok(())
    }

    async fn terminate(&self, pod: &Pod) -> Result<(), Error> {
        let uid = PodUid::of(pod);
        let rt = self.runtime.pod_runtime(&uid).await?;
        self.kill_all(pod, &rt).await?;
        volumes::teardown(&self.ctx.root_dir, &uid.0)?;
        let log_dir = convert::pod_log_dir(&self.ctx, pod);
        match std::fs::remove_dir_all(&log_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::Io {
                    path: log_dir,
                    source: e,
                });
            }
            _ => {}
        }
        self.status.remove(&uid);
        self.probes.remove_pod(&uid);
        self.backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget_pod(&uid.0);
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uid);
        tracing::info!(pod = %full_name(pod), %uid, "pod terminated and cleaned up");
        Ok(())
    }
}

fn ignore_not_found(r: runtime::Result<()>) -> runtime::Result<()> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

impl PodSyncer for Syncer {
    async fn sync_pod(&self, pod: Arc<Pod>) -> Result<Option<Duration>, String> {
        self.sync(&pod).await.map_err(|e| display_chain(&e))
    }

    async fn terminate_pod(&self, pod: Arc<Pod>) -> Result<(), String> {
        self.terminate(&pod).await.map_err(|e| display_chain(&e))
    }

    async fn runtime_pods(&self) -> Result<Vec<Arc<Pod>>, String> {
        let sandboxes = self
            .runtime
            .list_sandboxes(None)
            .await
            .map_err(|e| display_chain(&e))?;
        let mut seen = std::collections::HashSet::new();
        Ok(sandboxes
            .into_iter()
            .filter(|sb| {
                sb.annotations
                    .get(ANNOTATION_NODE_NAME)
                    .is_none_or(|n| *n == self.ctx.node_name)
            })
            .filter(|sb| seen.insert(sb.uid.clone()))
            .map(|sb| {
                Arc::new(Pod {
                    metadata: ObjectMeta {
                        name: Some(sb.name),
                        namespace: Some(sb.namespace),
                        uid: Some(sb.uid.0),
                        annotations: Some(sb.annotations.into_iter().collect()),
                        ..Default::default()
                    },
                    spec: None,
                    status: None,
                })
            })
            .collect())
    }
}

//! The one composition root: builds the components from the configuration, wires their
//! channels, runs them until shutdown, and stops every task it started. Run-once mode
//! (`run_once.rs`) builds the same core and feeds it one snapshot per source. The core's
//! parts are built in core.rs (the resource managers in resources.rs), the node's servers in
//! servers.rs, and its periodic upkeep in upkeep.rs.

mod core;
mod resources;
mod servers;
mod upkeep;

pub(crate) use core::Core;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::eviction::Pressure;
use crate::host::detect_node_ip;
use crate::sources::SourceSnapshot;
use crate::sources::{file, http};
use crate::status;
use crate::sync_loop;
use crate::types::Source;

/// How long nodelet waits for the runtime at start.
const RUNTIME_WAIT: Duration = Duration::from_secs(30);
/// How often the eviction manager looks at the node (upstream: 10 s).
const EVICTION_INTERVAL: Duration = Duration::from_secs(10);
/// How long the agent waits for its tasks after a shutdown request.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// How long a node shutdown waits, past its stages' time, for the sync loop to answer.
const NODE_SHUTDOWN_MARGIN: Duration = Duration::from_secs(10);
/// How long a node shutdown waits for the pods' final statuses to reach the API server.
const STATUS_FLUSH_WAIT: Duration = Duration::from_secs(10);

/// A started agent: read handles on its state, and its tasks.
pub struct Agent {
    /// Every pod's latest status.
    pub status: status::Reader,
    tracker: TaskTracker,
    cancel: CancellationToken,
    node_shutdown: NodeShutdown,
}

/// What a graceful node shutdown needs.
struct NodeShutdown {
    stages: Vec<crate::config::ShutdownStage>,
    sync_loop: mpsc::Sender<sync_loop::Shutdown>,
    /// Tells the node status (in a cluster) that the node is shutting down.
    shutting_down: tokio::sync::watch::Sender<bool>,
    /// The status generation the API server has in full (in a cluster).
    synced: Option<tokio::sync::watch::Receiver<u64>>,
    root_dir: PathBuf,
}

impl Agent {
    /// Serves until the cancel token (pods keep running, as upstream), or until
    /// `node_shutdown`, which stops every pod first; then waits for the agent's tasks to stop.
    pub async fn serve(self, node_shutdown: CancellationToken) {
        tokio::select! {
            _ = self.cancel.cancelled() => tracing::info!("shutting down; pods keep running"),
            _ = node_shutdown.cancelled() => self.shut_down_node().await,
        }
        stop_tasks(&self.tracker).await;
    }

    /// Graceful node shutdown (upstream's, without logind): the node reports NotReady, new pods
    /// are refused, the running ones stop stage by stage (lowest priority first, each within
    /// its stage's time), every pod's final status is recorded and, in a cluster, sent; then
    /// the agent stops.
    async fn shut_down_node(&self) {
        let n = &self.node_shutdown;
        let budget = crate::shutdown::budget(&n.stages);
        tracing::info!(
            budget_seconds = budget.as_secs(),
            "node shutdown: the node is shutting down"
        );
        let started = crate::shutdown::Record {
            start_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                crate::types::now(),
            )),
            end_time: None,
        };
        started.store(&n.root_dir);
        n.shutting_down.send_replace(true);
        let (done, stopped) = tokio::sync::oneshot::channel();
        let request = sync_loop::Shutdown {
            stages: n.stages.clone(),
            done,
        };
        let wait = budget + NODE_SHUTDOWN_MARGIN;
        if n.sync_loop.send(request).await.is_err()
            || !matches!(tokio::time::timeout(wait, stopped).await, Ok(Ok(())))
        {
            tracing::warn!("node shutdown: the pods did not all stop in time");
        }
        if let Some(mut synced) = n.synced.clone() {
            let wanted = self.status.generation();
            let flushed =
                tokio::time::timeout(STATUS_FLUSH_WAIT, synced.wait_for(|g| *g >= wanted));
            if !matches!(flushed.await, Ok(Ok(_))) {
                tracing::warn!(
                    "node shutdown: not every pod's final status reached the API server"
                );
            }
        }
        for entry in self.status.list() {
            let status = entry.pod.status.as_ref();
            tracing::info!(
                pod = %crate::types::full_name(&entry.pod),
                phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Unknown"),
                reason = status.and_then(|s| s.reason.as_deref()).unwrap_or(""),
                "node shutdown: final pod status"
            );
        }
        crate::shutdown::Record {
            end_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                crate::types::now(),
            )),
            ..started
        }
        .store(&n.root_dir);
        self.cancel.cancel();
    }
}

/// Closes the tracker and waits (a bounded time) for its tasks to end.
pub(crate) async fn stop_tasks(tracker: &TaskTracker) {
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_WAIT, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            "some tasks did not stop within {}s",
            SHUTDOWN_WAIT.as_secs()
        );
    }
}

/// Runs the agent until `cancel` is triggered; pods keep running after it returns, as upstream.
/// `node_shutdown` triggers a graceful node shutdown first (see [`Agent::shut_down_node`]).
pub async fn run(
    config: Config,
    cancel: CancellationToken,
    node_shutdown: CancellationToken,
) -> Result<()> {
    if let Some(agent) = start(config, cancel).await? {
        agent.serve(node_shutdown).await;
    }
    Ok(())
}

/// `default`, unless a hidden test-only flag (`flag`) set `wanted` shorter.
fn test_period(flag: &str, wanted: Option<Duration>, default: Duration) -> Duration {
    match wanted {
        Some(d) => {
            tracing::warn!(period = ?d, "test-only period in use (--{flag})");
            d
        }
        None => default,
    }
}

/// Connects to the runtime and starts every component; `None` when cancelled meanwhile.
pub async fn start(config: Config, cancel: CancellationToken) -> Result<Option<Agent>> {
    raise_open_files_limit();
    let Some(mut core) = Core::connect(&config, &cancel).await? else {
        return Ok(None);
    };
    let mut pressure_rx = None;
    if let Some((manager, pressure)) = core.eviction.take() {
        pressure_rx = Some(pressure.subscribe());
        let (evictions, ready) = core.sync_loop.eviction_handles();
        core.tracker
            .spawn(manager.run(ready, pressure, evictions, cancel.clone()));
    }
    let api = match &config.kubeconfig {
        Some(kubeconfig) => {
            let cluster = cluster_config(&config, &core, kubeconfig);
            let clients = crate::cluster::connect(&cluster)
                .await
                .context("cannot join the cluster (--kubeconfig)")?;
            let claims = crate::cluster::resources::ResourceApi::new(
                clients.main.clone(),
                &config.node_name,
            );
            core.resources.dra.set_api(std::sync::Arc::new(claims));
            Some((cluster, clients))
        }
        None => None,
    };
    servers::serve_sockets(&config, &core, &cancel).await?;
    let reviewer = api
        .as_ref()
        .map(|(_, clients)| servers::reviewer(&config, clients));
    servers::serve_http(&config, &core, reviewer, &cancel).await?;
    upkeep::spawn(&config, &core, &cancel);
    if let Some(record) = crate::shutdown::Record::load(&config.root_dir) {
        record.show();
    }
    let (shutting_down, shutting_down_rx) = tokio::sync::watch::channel(false);
    let mut synced = None;
    let (snapshots_tx, snapshots_rx) = mpsc::channel::<SourceSnapshot>(16);
    if let Some((cluster, clients)) = api {
        let handles = crate::cluster::Handles {
            signals: crate::cluster::node::Signals {
                pleg: core.pleg_health.clone(),
                pressure: pressure_rx
                    .unwrap_or_else(|| tokio::sync::watch::channel(Pressure::default()).1),
                runtime: core.runtime_state.clone(),
                shutting_down: shutting_down_rx,
            },
            statuses: core.status.clone(),
            desired: core.sync_loop.desired(),
            snapshots: snapshots_tx.clone(),
            recorder: core.recorder.clone(),
            services: core.services.clone(),
        };
        synced = Some(crate::cluster::start(
            cluster,
            clients,
            handles,
            &core.tracker,
            &cancel,
        ));
    }
    spawn_sources(&config, &core.tracker, snapshots_tx, &cancel);
    let node_shutdown = NodeShutdown {
        stages: config.shutdown_stages(),
        sync_loop: core.sync_loop.shutdown_handle(),
        shutting_down,
        synced,
        root_dir: config.root_dir.clone(),
    };
    let (status, tracker) = core.run(snapshots_rx, cancel.clone());
    Ok(Some(Agent {
        status,
        tracker,
        cancel,
        node_shutdown,
    }))
}

/// The pod sources configured: the manifest directory, the manifest URL, the API server.
fn sources(config: &Config) -> Vec<Source> {
    [
        (Source::File, config.static_pod_path.is_some()),
        (Source::Http, config.static_pod_url.is_some()),
        (Source::Api, config.kubeconfig.is_some()),
    ]
    .into_iter()
    .filter_map(|(source, configured)| configured.then_some(source))
    .collect()
}

/// Starts the static pod sources that are configured: the manifest directory and the
/// manifest URL, each sending its snapshots on `snapshots`.
fn spawn_sources(
    config: &Config,
    tracker: &TaskTracker,
    snapshots: mpsc::Sender<SourceSnapshot>,
    cancel: &CancellationToken,
) {
    if let Some(path) = &config.static_pod_path {
        tracing::info!(path = %path.display(), "watching static pod manifests");
        tracker.spawn(file::run(
            file_config(config, path),
            snapshots.clone(),
            cancel.clone(),
        ));
    }
    if let Some(url) = &config.static_pod_url {
        let shown = crate::types::redacted_url(url);
        tracing::info!(url = %shown, "polling the manifest URL");
        if url.starts_with("http://") {
            tracing::warn!(url = %shown, "the manifest URL is plain http://: anyone on the path can read its pods and Secrets and change what this node runs; use https://");
        }
        tracker.spawn(http::run(
            http_config(config, url),
            snapshots.clone(),
            cancel.clone(),
        ));
    }
}

/// Runs a server on `tracker`; one that stops on an error says so, naming itself as `what`.
fn spawn_server<E: std::error::Error + 'static>(
    tracker: &TaskTracker,
    what: &'static str,
    served: impl Future<Output = Result<(), E>> + Send + 'static,
) {
    tracker.spawn(async move {
        if let Err(e) = served.await {
            tracing::error!(error = %crate::types::error_chain(&e), "{what} stopped");
        }
    });
}

/// Raises the open-file limit to its hard limit, as Go programs (the kubelet among them) do at
/// start: every connection to a server of the node, every log followed and every container's
/// stream holds a descriptor.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0
        && limit.rlim_cur < limit.rlim_max
    {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: `limit` is a valid rlimit; a refusal leaves the limit as it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "cannot raise the open-file limit");
        }
    }
}

fn cluster_config(
    config: &Config,
    core: &Core,
    kubeconfig: &std::path::Path,
) -> crate::cluster::Config {
    crate::cluster::Config {
        kubeconfig: kubeconfig.to_path_buf(),
        qps: config.kube_api_qps,
        burst: config.kube_api_burst,
        event_qps: config.event_record_qps,
        event_burst: config.event_burst,
        node: crate::cluster::node::Config {
            name: config.node_name.clone(),
            labels: config.node_labels.clone(),
            taints: config.register_with_taints.clone(),
            register: config.register_node,
            update_frequency: config.node_status_update_frequency,
            report_frequency: config.node_status_report_frequency,
            port: if config.enable_server { config.port } else { 0 },
            internal_ip: config
                .node_ip
                .or_else(detect_node_ip)
                .map(|ip| ip.to_string()),
            hostname: config.node_name.clone(),
            capacity: core.capacity,
            allocatable: core.allocatable,
            info: crate::cluster::node::system_info(
                &core.runtime_version.0,
                &core.runtime_version.1,
            ),
            runtime_handlers: crate::cluster::node::runtime_handlers(&core.runtime_handlers),
            devices: Some(core.resources.devices.clone()),
            declared_features: ["InPlacePodLevelResourcesVerticalScaling"]
                .into_iter()
                .filter(|f| config.feature(f))
                .map(String::from)
                .collect(),
        },
        lease_duration_seconds: config.node_lease_duration_seconds,
        static_sources: sources(config)
            .into_iter()
            .filter(|s| *s != Source::Api)
            .collect(),
    }
}

/// In a cluster (not in run-once mode, which ignores it), static pods may not refer to API
/// objects, as upstream; standalone, they use the objects beside their manifests.
fn api_references(config: &Config) -> crate::sources::ApiReferences {
    if config.kubeconfig.is_some() && !config.run_once {
        crate::sources::ApiReferences::Refused
    } else {
        crate::sources::ApiReferences::Local
    }
}

pub(crate) fn file_config(config: &Config, path: &std::path::Path) -> file::Config {
    file::Config {
        path: path.to_path_buf(),
        node_name: config.node_name.clone(),
        check_frequency: config.file_check_frequency,
        api_references: api_references(config),
    }
}

pub(crate) fn http_config(config: &Config, url: &str) -> http::Config {
    http::Config {
        url: url.to_string(),
        headers: config.static_pod_url_header.clone(),
        check_frequency: config.http_check_frequency,
        node_name: config.node_name.clone(),
        api_references: api_references(config),
    }
}

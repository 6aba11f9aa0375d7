//! The one composition root: builds the components from the configuration, wires their
//! channels, runs them until shutdown, and stops every task it started. Run-once mode
//! (`run_once.rs`) builds the same core and feeds it one snapshot per source.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, detect_node_ip};
use crate::eviction::{self, Pressure};
use crate::pod_sync::{self, Syncer};
use crate::runtime::{RuntimeClient, wait_for_runtime};
use crate::sources::SourceSnapshot;
use crate::sources::{file, http};
use crate::sync_loop::{self, SyncLoop};
use crate::types::Source;
use crate::{pleg, probe, server, status};

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

/// The parts both modes share: the runtime client, the pod syncer, the sync loop fed by the
/// PLEG and the probes, and the status store.
pub(crate) struct Core {
    /// The cgroups /stats/summary reports as system containers, by name (`None`: the agent's
    /// own).
    system_containers: Vec<(String, Option<String>)>,
    /// The eviction manager and the conditions it publishes; run by the agent, not run-once.
    eviction: Option<(eviction::Manager, tokio::sync::watch::Sender<Pressure>)>,
    pub syncer: Arc<Syncer>,
    pub status: status::Reader,
    pub recorder: crate::events::Recorder,
    /// What each pod waits on, for `nodelet describe`.
    diagnoses: crate::status::Diagnoses,
    /// What ended pods left, for `nodelet get cleanups`.
    cleanups: crate::status::Cleanups,
    pub tracker: TaskTracker,
    sync_loop: SyncLoop<Syncer>,
    pleg_health: pleg::Health,
    /// The runtime's own readiness (its Status conditions).
    runtime_state: crate::runtime_state::RuntimeState,
    events: mpsc::Receiver<pleg::Event>,
    probes: mpsc::UnboundedReceiver<probe::Update>,
    runtime: crate::runtime::RuntimeClient,
    /// What the node has, and what it gives to pods.
    capacity: crate::types::Allocatable,
    allocatable: crate::types::Allocatable,
    /// The CPU, memory, device and topology managers; the device manager is served to
    /// device plugins, and all are read by the pod-resources API.
    resources: Arc<crate::cm::Resources>,
    /// The runtime's name and version, as it reports them.
    runtime_version: (String, String),
    /// The runtime handlers and their features, as the runtime's status names them.
    runtime_handlers: Vec<crate::runtime::cri::RuntimeHandler>,
    /// The Services for the containers' service links, filled in cluster mode.
    services: crate::service_links::Store,
    /// The cgroup driver in use (see [`cgroup_driver`]), which /configz shows.
    cgroup_driver: crate::types::CgroupDriver,
}

impl Core {
    /// Connects to the runtime (waiting for it) and builds the core; `None` when cancelled.
    pub async fn connect(config: &Config, cancel: &CancellationToken) -> Result<Option<Core>> {
        if config.fail_cgroup_v1 && !crate::cgroups::unified() {
            anyhow::bail!(
                "the host's cgroups are v1 and failCgroupV1 (--fail-cgroupv1) is true: move the host to cgroup v2, or set it to false"
            );
        }
        let kernel = crate::host::kernel_defaults_differences();
        if config.protect_kernel_defaults && !kernel.is_empty() {
            anyhow::bail!(
                "protectKernelDefaults (--protect-kernel-defaults) is true and the kernel's settings differ from what the kubelet expects: {}; set them (sysctl -w), or set it to false",
                kernel.join("; ")
            );
        }
        if !kernel.is_empty() {
            tracing::info!(differences = %kernel.join("; "), "kernel settings differ from what the kubelet expects; nodelet leaves them as they are (--protect-kernel-defaults refuses such a host)");
        }
        crate::volumes::prepare_root(&config.root_dir).context("--root-dir")?;
        if let Err(e) = crate::volumes::share_root(&config.root_dir) {
            tracing::warn!(root_dir = %config.root_dir.display(), error = %e, "cannot make the root dir a shared mount; volumes with mountPropagation HostToContainer or Bidirectional will not propagate");
        }
        let credential_providers = match (
            &config.image_credential_provider_config,
            &config.image_credential_provider_bin_dir,
        ) {
            (Some(file), Some(bin_dir)) => Some(Arc::new(
                crate::images::Providers::load(file, bin_dir)
                    .context("--image-credential-provider-config")?,
            )),
            _ => None,
        };
        let runtime = RuntimeClient::new(
            &config.container_runtime_endpoint,
            &config.image_service_endpoint,
            config.runtime_request_timeout,
        );
        let endpoint = config.container_runtime_endpoint.display().to_string();
        let version = tokio::select! {
            v = wait_for_runtime(&runtime, &config.container_runtime_endpoint, RUNTIME_WAIT) => v
                .with_context(|| format!("container runtime at unix://{endpoint} did not answer within {}s; is it running?", RUNTIME_WAIT.as_secs()))?,
            _ = cancel.cancelled() => return Ok(None),
        };
        tracing::info!(
            runtime = %version.runtime_name,
            version = %version.runtime_version,
            api = %version.runtime_api_version,
            endpoint = %endpoint,
            "connected to the container runtime"
        );
        if config.fail_swap_on && crate::cgroups::swap_enabled() {
            anyhow::bail!(
                "swap is on; the kubelet's rules need it off (swapoff -a), or start with --fail-swap-on=false"
            );
        }
        let driver = cgroup_driver(&runtime, config.cgroup_driver).await?;
        let thresholds = eviction::thresholds(&config.eviction_hard).map_err(|problems| {
            anyhow::anyhow!("evictionHard (--eviction-hard): {}", problems.join("; "))
        })?;
        let node = pod_sync::resources::NodeResources::detect(&config.root_dir);
        let capacity = crate::types::Allocatable {
            cpu: node.cpu,
            memory: node.memory,
            ephemeral_storage: node.ephemeral_storage,
            pods: config.max_pods,
        };
        // --reserved-cpus takes the place of the cpu in kube-reserved and system-reserved, as
        // upstream: allocatable counts its CPUs as reserved.
        let (kube_reserved, system_reserved) = match &config.reserved_cpus {
            Some(cpus) => {
                let mut kube = config.kube_reserved.clone();
                kube.remove("cpu");
                let mut system = config.system_reserved.clone();
                system.insert("cpu".into(), cpus.len().to_string());
                (kube, system)
            }
            None => (config.kube_reserved.clone(), config.system_reserved.clone()),
        };
        let allocatable = crate::cgroups::allocatable(
            &capacity,
            &[&kube_reserved, &system_reserved],
            &config.eviction_hard,
        );
        let cfs = crate::cgroups::Cfs {
            enforce: config.cpu_cfs_quota,
            period: config.cpu_cfs_quota_period.as_micros() as i64,
        };
        let cgroups = crate::cgroups::Manager::new(crate::cgroups::Config {
            root: config.cgroup_root.clone(),
            per_qos: config.cgroups_per_qos,
            enforce_allocatable: config.enforce_pods_allocatable,
            driver: match driver {
                crate::config::CgroupDriver::Cgroupfs => crate::cgroups::Driver::Cgroupfs,
                crate::config::CgroupDriver::Systemd => crate::cgroups::Driver::Systemd,
            },
            pod_pids_limit: config.pod_pids_limit,
            cfs,
            memory_reserve: config
                .qos_reserved_memory
                .filter(|_| config.feature("QOSReserved"))
                .map(|percent| crate::cgroups::MemoryReserve {
                    percent,
                    allocatable: allocatable.memory as i64,
                }),
        });
        enforce_reserves(config, &cgroups)?;
        let pods_cgroup = cgroups.pods_cgroup();
        cgroups
            .setup_node(&allocatable)
            .context("cannot set up the pod cgroups (--cgroup-root, --cgroups-per-qos)")?;
        tracing::info!(
            cpu = allocatable.cpu,
            memory = allocatable.memory,
            pods = allocatable.pods,
            "node allocatable"
        );
        let tracker = TaskTracker::new();
        let host_ip = config
            .node_ip
            .or_else(detect_node_ip)
            .map(|ip| ip.to_string())
            .unwrap_or_default();
        let test_backoff = config.testing.backoff;
        if let Some(initial) = test_backoff {
            tracing::warn!(?initial, "test-only backoff in use (--testing-backoff)");
        }
        let runtime_handlers = runtime.handlers().await.unwrap_or_else(|e| {
            tracing::warn!(error = %crate::types::error_chain(&e), "cannot read the runtime handlers' features; recursive read-only mounts and user namespaces are taken as unsupported");
            Vec::new()
        });
        let supporting = |wants: fn(&crate::runtime::cri::RuntimeHandlerFeatures) -> bool| {
            runtime_handlers
                .iter()
                .filter(|h| h.features.as_ref().is_some_and(wants))
                .map(|h| h.name.clone())
                .collect::<Vec<_>>()
        };
        let handlers = (
            supporting(|f| f.recursive_read_only_mounts),
            supporting(|f| f.user_namespaces),
        );
        let (rro_handlers, userns_handlers) = handlers;
        let userns = pod_sync::userns::Manager::new(
            &config.root_dir,
            config.user_namespace_ids_per_pod,
            config.max_pods,
        )
        .map_err(|e| anyhow::anyhow!("user namespaces (userNamespaces.idsPerPod): {e}"))?;
        let ctx = pod_sync::Context {
            rro_handlers,
            userns_handlers,
            node_name: config.node_name.clone(),
            root_dir: config.root_dir.clone(),
            pod_logs_dir: config.pod_logs_dir.clone(),
            container_logs_dir: config.container_logs_dir.clone(),
            resolv_conf: config.resolv_conf.clone(),
            host_ip,
            runtime_name: version.runtime_name.clone(),
            node,
            cfs,
            restart_backoff_initial: test_backoff.unwrap_or(pod_sync::RESTART_BACKOFF_INITIAL),
            cluster_dns: pod_sync::network::ClusterDns {
                servers: config.cluster_dns.iter().map(|ip| ip.to_string()).collect(),
                domain: config.cluster_domain.clone(),
            },
        };
        let (status_writer, status) = status::store();
        let (probe_tx, probes) = mpsc::unbounded_channel();
        let recorder = crate::events::Recorder::with_journal(&config.root_dir, &config.node_name);
        let diagnoses = crate::status::Diagnoses::default();
        let cleanups = crate::status::Cleanups::default();
        let running = match runtime.list_containers(None).await {
            Ok(containers) => containers
                .into_iter()
                .filter(|c| c.state == crate::runtime::ContainerState::Running)
                .map(|c| c.id)
                .collect(),
            Err(e) => {
                tracing::warn!(error = %crate::types::error_chain(&e), "cannot list the running containers; their probe results start anew");
                std::collections::HashSet::new()
            }
        };
        let probe_manager = Arc::new(probe::Manager::new(
            runtime.clone(),
            probe::Results::restore(&config.root_dir, &running),
            probe_tx,
            (recorder.clone(), diagnoses.clone()),
            tracker.clone(),
            cancel.clone(),
        ));
        let services = match config.kubeconfig {
            Some(_) => crate::service_links::Store::unlisted(),
            None => crate::service_links::Store::standalone(),
        };
        let (objects_writer, objects) =
            crate::objects::store(config.static_pod_url_local_secrets, services.clone());
        let puller = crate::images::Puller::new(
            runtime.clone(),
            crate::images::Config {
                root_dir: config.root_dir.clone(),
                serialize: config.serialize_image_pulls,
                max_parallel: config.max_parallel_image_pulls,
                qps: config.registry_pull_qps,
                burst: config.registry_burst,
                backoff_initial: test_backoff.unwrap_or(crate::images::PULL_BACKOFF_INITIAL),
                credential_providers,
                progress_deadline: config.image_pull_progress_deadline,
            },
            recorder.clone(),
        );
        let reservation = memory_reservation(config, &capacity, &allocatable);
        let resources = resource_managers(config, reservation)?;
        tracker.spawn(resources.cpus.clone().run(runtime.clone(), cancel.clone()));
        let cache = crate::runtime::PodCache::default();
        let syncer = Arc::new(Syncer::new(
            runtime.clone(),
            ctx,
            pod_sync::Parts {
                cache: cache.clone(),
                status: status_writer,
                probes: probe_manager,
                cgroups: cgroups.clone(),
                objects,
                images: puller,
                events: recorder.clone(),
                diagnoses: diagnoses.clone(),
                cleanups: cleanups.clone(),
                userns,
                resources: resources.clone(),
            },
        ));
        let (pressure, pressure_rx) = tokio::sync::watch::channel(Pressure::default());
        let loop_config = sync_loop::Config {
            resync: config.sync_frequency,
            allocatable: Some(allocatable),
            pressure: Some(pressure_rx),
            resources: Some(resources.clone()),
            allowed_unsafe_sysctls: config.allowed_unsafe_sysctls.clone(),
            ..Default::default()
        };
        let sync_loop = SyncLoop::new(
            loop_config,
            syncer.clone(),
            objects_writer,
            tracker.clone(),
            cancel.clone(),
        );
        let (events_tx, events) = mpsc::channel(1024);
        let pleg = pleg::Pleg::new(runtime.clone(), cache, config.feature("EventedPLEG"));
        let pleg_health = pleg.health();
        tracker.spawn(pleg.run(events_tx, cancel.clone()));
        let (runtime_state, check) = crate::runtime_state::watch(runtime.clone(), cancel.clone());
        tracker.spawn(check);
        let eviction = eviction::Manager {
            config: eviction::Config {
                thresholds,
                root_dir: config.root_dir.clone(),
                memory: node.memory,
                interval: test_period(
                    "testing-eviction-period",
                    config.testing.eviction_period,
                    EVICTION_INTERVAL,
                ),
                transition: config.eviction_pressure_transition_period,
                notifications: config.kernel_memcg_notification,
            },
            runtime: runtime.clone(),
            cgroups: cgroups.clone(),
            statuses: status.clone(),
        };
        let system_containers = system_containers(config, pods_cgroup);
        Ok(Some(Core {
            system_containers,
            eviction: Some((eviction, pressure)),
            syncer,
            status,
            recorder,
            diagnoses,
            cleanups,
            tracker,
            sync_loop,
            pleg_health,
            runtime_state,
            events,
            probes,
            runtime,
            capacity,
            resources,
            allocatable,
            runtime_version: (version.runtime_name, version.runtime_version),
            runtime_handlers,
            services,
            cgroup_driver: driver,
        }))
    }

    /// Starts the sync loop on the snapshots arriving on `snapshots`.
    pub fn run(
        self,
        snapshots: mpsc::Receiver<SourceSnapshot>,
        cancel: CancellationToken,
    ) -> (status::Reader, TaskTracker) {
        self.tracker.spawn(
            self.sync_loop
                .run(snapshots, self.events, self.probes, cancel),
        );
        (self.status, self.tracker)
    }
}

/// /configz: the configuration, with the cgroup driver in use (as upstream shows the runtime's).
fn configz(config: &Config, driver: crate::types::CgroupDriver) -> serde_json::Value {
    let mut out = config.kubelet_configuration();
    out["cgroupDriver"] = driver.as_str().into();
    out
}

/// The cgroup driver pods get; no setting is needed. A runtime that reports its driver over the
/// CRI (RuntimeConfig) decides, as upstream; else the driver its own configuration names (older
/// runtimes); else `--cgroup-driver`, unless it names systemd on a host that systemd did not boot,
/// where only cgroupfs works. Each choice that overrides the setting is said in one line. nodelet
/// drives cgroupfs only: a runtime that uses systemd's is a one-line error naming the fix.
async fn cgroup_driver(
    runtime: &RuntimeClient,
    ours: crate::types::CgroupDriver,
) -> Result<crate::types::CgroupDriver> {
    use crate::types::CgroupDriver::{Cgroupfs, Systemd};
    let theirs = match runtime.reported_cgroup_driver().await {
        Ok(Some(theirs)) => Some((theirs, "reports over CRI")),
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "cannot ask the runtime for its cgroup driver");
            None
        }
    };
    let theirs = match theirs {
        Some(t) => Some(t),
        None => match runtime.runtime_config().await {
            Ok(Some(rc)) => crate::runtime::configured_cgroup_driver(&rc)
                .map(|t| (t, "names in its configuration")),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the runtime's configuration for its cgroup driver");
                None
            }
        },
    };
    let (driver, source) = match theirs {
        Some((theirs, how)) => {
            if theirs != ours {
                tracing::info!(runtime = %theirs, setting = %ours, "using the cgroup driver the runtime {how}, not --cgroup-driver");
            }
            (theirs, "the container runtime uses it")
        }
        None if ours == Systemd && !Path::new("/run/systemd/system").exists() => {
            tracing::warn!(
                "--cgroup-driver=systemd, but systemd did not boot this host; using cgroupfs"
            );
            (Cgroupfs, "")
        }
        None => (
            ours,
            "--cgroup-driver names it and the runtime does not say its own",
        ),
    };
    if driver == Systemd {
        anyhow::bail!(
            "the systemd cgroup driver is needed ({source}), which nodelet does not drive yet: \
             set SystemdCgroup = false for runc in the runtime's configuration"
        );
    }
    Ok(driver)
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
            Some((cluster, clients))
        }
        None => None,
    };
    let socket = server::admin::socket_path(&config.root_dir);
    let listener = server::admin::bind(&socket).await?;
    let handles = server::admin::Handles {
        node_name: config.node_name.clone(),
        statuses: core.status.clone(),
        events: core.recorder.clone(),
        diagnoses: core.diagnoses.clone(),
        cleanups: core.cleanups.clone(),
        runtime: core.runtime.clone(),
        debugger: core.sync_loop.debugger(),
    };
    let served = server::admin::serve(listener, socket, handles, cancel.clone());
    spawn_server(&core.tracker, "admin socket server", served);
    let socket = server::pod_resources::socket_path(&config.root_dir);
    let listener = server::admin::bind(&socket).await?;
    let handles = server::pod_resources::Handles {
        statuses: core.status.clone(),
        resources: core.resources.clone(),
    };
    let served = server::pod_resources::serve(listener, socket, handles, cancel.clone());
    spawn_server(&core.tracker, "pod-resources socket server", served);
    let socket = core
        .resources
        .devices
        .dir()
        .join(crate::cm::devices::SOCKET);
    let listener = server::admin::bind(&socket).await?;
    let what = "the device plugin registration socket";
    let incoming = server::admin::admitted_connections(listener, socket, what);
    let served = crate::cm::devices::plugin::serve(
        core.resources.devices.clone(),
        incoming,
        core.tracker.clone(),
        cancel.clone(),
    );
    spawn_server(
        &core.tracker,
        "device plugin registration socket server",
        served,
    );
    let checks = server::healthz::Checks {
        sync_loop: core.sync_loop.heartbeat(),
        pleg: core.pleg_health.clone(),
    };

    if config.healthz_port != 0 {
        let addr = SocketAddr::new(config.healthz_bind_address, config.healthz_port);
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!("cannot listen on {addr} for healthz (--healthz-port, --healthz-bind-address)")
        })?;
        tracing::info!(%addr, "serving healthz");
        let served = server::healthz::serve(listener, checks.clone(), cancel.clone());
        spawn_server(&core.tracker, "healthz server", served);
    }

    if config.enable_server && config.port != 0 {
        let (cert, key) = match (&config.tls_cert_file, &config.tls_private_key_file) {
            (Some(cert), Some(key)) => (cert.clone(), key.clone()),
            _ => server::secure::self_signed(&config.root_dir, &config.node_name)?,
        };
        let tls = server::secure::tls_config(&server::secure::TlsFiles {
            cert,
            key,
            client_ca: config.client_ca_file.clone(),
        })?;
        let addr = SocketAddr::new(config.address, config.port);
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!("cannot listen on {addr} for the authenticated API (--port, --address)")
        })?;
        tracing::info!(%addr, anonymous = config.anonymous_auth, "serving the authenticated API over TLS");
        if config.anonymous_auth && !config.address.is_loopback() {
            let who = match config.authorization_mode {
                crate::config::AuthorizationMode::AlwaysAllow => {
                    "and --authorization-mode=AlwaysAllow lets anyone who reaches it exec into any container, read every log and stop pods"
                }
                crate::config::AuthorizationMode::Webhook => {
                    "and anyone who reaches it acts as system:anonymous, with what the API server's authorization grants that user"
                }
            };
            tracing::warn!(%addr, "--anonymous-auth=true on a port open beyond this host: requests without credentials are served, {who}");
        }
        let read_only = server::read_only::router(
            core.status.clone(),
            checks.clone(),
            stats_source(&config, &core),
        );
        let handles = server::secure::Handles {
            runtime: core.runtime.clone(),
            statuses: core.status.clone(),
            log_dir: PathBuf::from("/var/log"),
            configz: configz(&config, core.cgroup_driver),
        };
        let reviewer = api.as_ref().map(|(_, clients)| {
            let ttls = crate::cluster::review::Ttls {
                authenticated: config.authentication_token_webhook_cache_ttl,
                allowed: config.authorization_webhook_cache_authorized_ttl,
                denied: config.authorization_webhook_cache_unauthorized_ttl,
            };
            Arc::new(crate::cluster::review::Reviewer::new(
                clients.reviews.clone(),
                ttls,
            )) as Arc<dyn server::auth::Reviewer>
        });
        let auth = server::auth::Auth {
            anonymous: config.anonymous_auth,
            node: config.node_name.clone(),
            token_webhook: config.authentication_token_webhook,
            authorization_webhook: config.authorization_mode
                == crate::config::AuthorizationMode::Webhook,
            reviewer,
        };
        let router = server::secure::router(read_only, handles, auth);
        core.tracker
            .spawn(server::secure::serve(listener, tls, router, cancel.clone()));
    }

    if config.read_only_port != 0 {
        let addr = SocketAddr::new(config.address, config.read_only_port);
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!("cannot listen on {addr} for the read-only API (--read-only-port, --address)")
        })?;
        tracing::info!(%addr, "serving the read-only API");
        let stats = stats_source(&config, &core);
        let served =
            server::read_only::serve(listener, core.status.clone(), checks, stats, cancel.clone());
        spawn_server(&core.tracker, "read-only server", served);
    }

    let gc = crate::images::gc::ImageGc::new(
        core.runtime.clone(),
        crate::images::gc::Policy {
            high_percent: config.image_gc_high_threshold_percent,
            low_percent: config.image_gc_low_threshold_percent,
            min_age: config.image_minimum_gc_age,
        },
    );
    core.tracker.spawn(crate::images::gc::run(
        gc,
        test_period(
            "testing-image-gc-period",
            config.testing.image_gc_period,
            Duration::from_secs(300),
        ),
        cancel.clone(),
    ));
    match config.container_log_max_size {
        Some(max_size) => {
            let rotation = crate::log_rotation::Config {
                policy: crate::log_rotation::Policy {
                    max_size,
                    max_files: config.container_log_max_files as usize,
                },
                interval: test_period(
                    "testing-log-rotation-period",
                    config.testing.log_rotation_period,
                    config.container_log_monitor_interval,
                ),
                node_name: config.node_name.clone(),
            };
            core.tracker.spawn(crate::log_rotation::run(
                core.runtime.clone(),
                rotation,
                cancel.clone(),
            ));
        }
        None => tracing::info!("container log rotation is off (--container-log-max-size < 0)"),
    }

    core.tracker.spawn(crate::oom::run(
        core.recorder.clone(),
        config.node_name.clone(),
        cancel.clone(),
    ));

    #[cfg(target_env = "gnu")]
    core.tracker.spawn(return_freed_memory(cancel.clone()));

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
    if let Some(path) = &config.static_pod_path {
        tracing::info!(path = %path.display(), "watching static pod manifests");
        core.tracker.spawn(file::run(
            file_config(&config, path),
            snapshots_tx.clone(),
            cancel.clone(),
        ));
    }
    if let Some(url) = &config.static_pod_url {
        let shown = crate::types::redacted_url(url);
        tracing::info!(url = %shown, "polling the manifest URL");
        if url.starts_with("http://") {
            tracing::warn!(url = %shown, "the manifest URL is plain http://: anyone on the path can read its pods and Secrets and change what this node runs; use https://");
        }
        core.tracker.spawn(http::run(
            http_config(&config, url),
            snapshots_tx.clone(),
            cancel.clone(),
        ));
    }
    drop(snapshots_tx);
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

/// Runs a server on `tracker`; one that stops on an error says so, naming itself as `what`.
fn spawn_server<E: std::fmt::Display>(
    tracker: &TaskTracker,
    what: &'static str,
    served: impl Future<Output = Result<(), E>> + Send + 'static,
) {
    tracker.spawn(async move {
        if let Err(e) = served.await {
            tracing::error!(error = %e, "{what} stopped");
        }
    });
}

/// How often memory that the allocator holds free is handed back to the system.
#[cfg(target_env = "gnu")]
const TRIM_PERIOD: Duration = Duration::from_secs(30);

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

/// glibc's malloc keeps the memory freed inside its per-thread arenas, so after a burst of pods
/// came and went the agent stayed at its peak. `malloc_trim` hands the free pages of every
/// arena back, cheaply at this heap size.
#[cfg(target_env = "gnu")]
async fn return_freed_memory(cancel: CancellationToken) {
    let mut ticker = tokio::time::interval(TRIM_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        // SAFETY: malloc_trim only releases free memory; it has no preconditions.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

fn cluster_config(
    config: &Config,
    core: &Core,
    kubeconfig: &std::path::Path,
) -> crate::cluster::Config {
    let static_sources = [
        config.static_pod_path.as_ref().map(|_| Source::File),
        config.static_pod_url.as_ref().map(|_| Source::Http),
    ];
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
        },
        lease_duration_seconds: config.node_lease_duration_seconds,
        static_sources: static_sources.into_iter().flatten().collect(),
    }
}

/// The CPU, memory, device and topology managers as configured, their state files read or
/// begun in the root dir. `reservation` is what node allocatable keeps back of each memory
/// type, which --reserved-memory must add up to.
fn resource_managers(
    config: &Config,
    reservation: BTreeMap<String, u64>,
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
        devices: crate::cm::devices::DeviceManager::start(&config.root_dir),
        topology: topology_manager,
    }))
}

/// What node allocatable keeps back of each memory type: memory by kube-reserved,
/// system-reserved and the hard eviction threshold, huge pages by the reserves.
fn memory_reservation(
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
fn enforce_reserves(config: &Config, cgroups: &crate::cgroups::Manager) -> Result<()> {
    for (enforced, cgroup, reserve, field) in [
        (
            config.enforce_kube_reserved,
            &config.kube_reserved_cgroup,
            &config.kube_reserved,
            "kubeReservedCgroup (--kube-reserved-cgroup)",
        ),
        (
            config.enforce_system_reserved,
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

/// The cgroups /stats/summary reports as system containers, by name: the agent's (its own
/// cgroups, `None`, where no kubeletCgroups is given), the runtime's and the host's where they
/// are named, and the pods'.
fn system_containers(config: &Config, pods_cgroup: String) -> Vec<(String, Option<String>)> {
    let mut out = vec![("kubelet".to_string(), config.kubelet_cgroups.clone())];
    for (name, path) in [
        ("runtime", config.runtime_cgroups.clone()),
        ("misc", config.system_cgroups.clone()),
        ("pods", Some(pods_cgroup)),
    ] {
        if path.is_some() {
            out.push((name.to_string(), path));
        }
    }
    out
}

fn stats_source(config: &Config, core: &Core) -> server::stats::Source {
    server::stats::Source {
        runtime: core.runtime.clone(),
        node_name: config.node_name.clone(),
        root_dir: config.root_dir.clone(),
        pod_logs_dir: config.pod_logs_dir.clone(),
        statuses: core.status.clone(),
        system_containers: core.system_containers.clone(),
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

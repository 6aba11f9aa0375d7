//! The core both modes share, built from the configuration: host checks first, then the
//! runtime connection, the node's allocatable and cgroups, and the components a pod's sync
//! drives.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::resources::{enforce_reserves, memory_reservation, resource_managers};
use super::{EVICTION_INTERVAL, RUNTIME_WAIT, test_period};
use crate::config::Config;
use crate::eviction::{self, Pressure};
use crate::host::{NodeResources, detect_node_ip};
use crate::pod_sync::{self, Syncer};
use crate::runtime::{RuntimeClient, wait_for_runtime};
use crate::sources::SourceSnapshot;
use crate::sync_loop::{self, SyncLoop};
use crate::{pleg, probe, status};

/// The parts both modes share: the runtime client, the pod syncer, the sync loop fed by the
/// PLEG and the probes, and the status store.
pub(crate) struct Core {
    /// The cgroups /stats/summary reports as system containers, by name (`None`: the agent's
    /// own).
    pub(super) system_containers: Vec<(String, Option<String>)>,
    /// The eviction manager and the conditions it publishes; run by the agent, not run-once.
    pub(super) eviction: Option<(eviction::Manager, tokio::sync::watch::Sender<Pressure>)>,
    pub syncer: Arc<Syncer>,
    pub status: status::Reader,
    pub recorder: crate::events::Recorder,
    /// What each pod waits on, for `nodelet describe`.
    pub(super) diagnoses: crate::status::Diagnoses,
    /// What ended pods left, for `nodelet get cleanups`.
    pub(super) cleanups: crate::status::Cleanups,
    pub tracker: TaskTracker,
    pub(super) sync_loop: SyncLoop<Syncer>,
    pub(super) pleg_health: pleg::Health,
    /// The runtime's own readiness (its Status conditions).
    pub(super) runtime_state: crate::runtime_state::RuntimeState,
    pub(super) events: mpsc::Receiver<pleg::Event>,
    pub(super) probes: mpsc::UnboundedReceiver<probe::Update>,
    /// The pods whose devices' health changed (see [`crate::cm::HealthUpdates`]).
    pub(super) health: mpsc::UnboundedReceiver<crate::types::PodUid>,
    pub(super) runtime: crate::runtime::RuntimeClient,
    /// What the node has, and what it gives to pods.
    pub(super) capacity: crate::types::Allocatable,
    pub(super) allocatable: crate::types::Allocatable,
    /// The CPU, memory, device and topology managers; the device manager is served to
    /// device plugins, and all are read by the pod-resources API.
    pub(super) resources: Arc<crate::cm::Resources>,
    /// The runtime's name and version, as it reports them.
    pub(super) runtime_version: (String, String),
    /// The runtime handlers and their features, as the runtime's status names them.
    pub(super) runtime_handlers: Vec<crate::runtime::cri::RuntimeHandler>,
    /// The Services for the containers' service links, filled in cluster mode.
    pub(super) services: crate::service_links::Store,
    /// The cgroup driver in use (see [`cgroup_driver`]), which /configz shows.
    pub(super) cgroup_driver: crate::types::CgroupDriver,
    /// Which credentials each image was pulled with, pruned by image GC.
    pub(super) pull_records: Option<Arc<crate::images::PullRecords>>,
}

impl Core {
    /// Connects to the runtime (waiting for it) and builds the core; `None` when cancelled.
    /// (The composition root's wiring: each part in the order the next ones need them, so it
    /// runs past 80 lines.)
    pub async fn connect(config: &Config, cancel: &CancellationToken) -> Result<Option<Core>> {
        preflight(config)?;
        let credential_providers = credential_providers(config)?;
        let Some((runtime, version)) = connect_runtime(config, cancel).await? else {
            return Ok(None);
        };
        let host = Host::discover(config, &runtime).await?;
        let tracker = TaskTracker::new();
        let runtime_handlers = runtime_handlers(&runtime).await;
        let ctx = pod_context(
            config,
            &runtime_handlers,
            &version.runtime_name,
            host.node,
            host.cfs,
        );
        let userns = user_namespaces(config)?;
        let (status_writer, status) = status::store();
        let (probe_tx, probes) = mpsc::unbounded_channel();
        let recorder = crate::events::Recorder::with_journal(&config.root_dir, &config.node_name);
        let diagnoses = crate::status::Diagnoses::default();
        let cleanups = crate::status::Cleanups::default();
        let probe_manager = Arc::new(probe::Manager::new(
            runtime.clone(),
            restored_probe_results(config, &runtime).await,
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
        let pull_records = pull_records(config, &runtime).await?;
        let puller = image_puller(
            config,
            &runtime,
            (credential_providers, pull_records.clone()),
            &recorder,
        );
        let reservation = memory_reservation(config, &host.capacity, &host.allocatable);
        let (health_tx, health) = mpsc::unbounded_channel();
        let resources = resource_managers(config, reservation, health_tx)?;
        tracker.spawn(resources.cpus.clone().run(runtime.clone(), cancel.clone()));
        let cache = crate::runtime::PodCache::default();
        let parts = pod_sync::Parts {
            cache: cache.clone(),
            status: status_writer,
            probes: probe_manager,
            cgroups: host.cgroups.clone(),
            objects,
            images: puller,
            events: recorder.clone(),
            diagnoses: diagnoses.clone(),
            cleanups: cleanups.clone(),
            userns,
            resources: resources.clone(),
        };
        let syncer = Arc::new(Syncer::new(runtime.clone(), ctx, parts));
        let wiring = (tracker.clone(), cancel.clone());
        let loop_parts = (host.allocatable, &resources, objects_writer);
        let (sync_loop, pressure) = sync_loop(config, &syncer, loop_parts, &status, wiring);
        let (events_tx, events) = mpsc::channel(1024);
        let pleg = pleg::Pleg::new(runtime.clone(), cache, config.feature("EventedPLEG"));
        let pleg_health = pleg.health();
        tracker.spawn(pleg.run(events_tx, cancel.clone()));
        let (runtime_state, check) = crate::runtime_state::watch(runtime.clone(), cancel.clone());
        tracker.spawn(check);
        let eviction = eviction_manager(
            config,
            host.thresholds,
            host.node.memory,
            &runtime,
            &host.cgroups,
            &status,
        );
        Ok(Some(Core {
            system_containers: system_containers(config, host.cgroups.pods_cgroup()),
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
            health,
            runtime,
            capacity: host.capacity,
            resources,
            allocatable: host.allocatable,
            runtime_version: (version.runtime_name, version.runtime_version),
            runtime_handlers,
            services,
            cgroup_driver: host.driver,
            pull_records,
        }))
    }

    /// Starts the sync loop on the snapshots arriving on `snapshots`.
    pub fn run(
        self,
        snapshots: mpsc::Receiver<SourceSnapshot>,
        cancel: CancellationToken,
    ) -> (status::Reader, TaskTracker) {
        self.tracker.spawn(self.sync_loop.run(
            snapshots,
            (self.events, self.probes, self.health),
            cancel,
        ));
        (self.status, self.tracker)
    }
}

/// What the agent found of its host once the runtime answered, and the pods' cgroups it made
/// from that.
struct Host {
    driver: crate::types::CgroupDriver,
    thresholds: Vec<eviction::Threshold>,
    node: NodeResources,
    capacity: crate::types::Allocatable,
    allocatable: crate::types::Allocatable,
    cfs: crate::cgroups::Cfs,
    cgroups: crate::cgroups::Manager,
}

impl Host {
    /// Swap checked, the cgroup driver agreed with the runtime, the eviction thresholds read,
    /// the node's resources and allocatable found and the pods' cgroups made; the node's facts
    /// go to the metrics.
    async fn discover(config: &Config, runtime: &RuntimeClient) -> Result<Host> {
        if config.fail_swap_on && crate::host::swap_enabled() {
            anyhow::bail!(
                "swap is on; the kubelet's rules need it off (swapoff -a), or start with --fail-swap-on=false"
            );
        }
        let driver = cgroup_driver(runtime, config.cgroup_driver).await?;
        let thresholds = eviction::thresholds(&config.eviction_hard).map_err(|problems| {
            anyhow::anyhow!("evictionHard (--eviction-hard): {}", problems.join("; "))
        })?;
        let node = NodeResources::detect(&config.root_dir);
        let (capacity, allocatable) = node_allocatable(config, &node);
        let cfs = crate::cgroups::Cfs {
            enforce: config.cpu_cfs_quota,
            period: config.cpu_cfs_quota_period.as_micros() as i64,
        };
        let cgroups = cgroup_manager(config, driver, &allocatable, cfs)?;
        crate::metrics::get().set_node(
            &config.node_name,
            if crate::cgroups::unified() { 2 } else { 1 },
            crate::config::KUBELET_VERSION,
        );
        crate::metrics::get().set_features(&config.features());
        Ok(Host {
            driver,
            thresholds,
            node,
            capacity,
            allocatable,
            cfs,
            cgroups,
        })
    }
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
            tracing::warn!(error = %crate::types::error_chain(&e), "cannot ask the runtime for its cgroup driver");
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
                tracing::warn!(error = %crate::types::error_chain(&e), "cannot read the runtime's configuration for its cgroup driver");
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

/// The host checks made before anything else: cgroup v1 where it is refused, the kernel's
/// settings, and the root dir (made, and a shared mount).
fn preflight(config: &Config) -> Result<()> {
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
    Ok(())
}

/// The image credential providers, when both their config and their bin dir are given.
fn credential_providers(config: &Config) -> Result<Option<Arc<crate::images::Providers>>> {
    let (Some(file), Some(bin_dir)) = (
        &config.image_credential_provider_config,
        &config.image_credential_provider_bin_dir,
    ) else {
        return Ok(None);
    };
    let providers = crate::images::Providers::load(file, bin_dir)
        .context("--image-credential-provider-config")?;
    Ok(Some(Arc::new(providers)))
}

/// The runtime client, once the runtime answers (waiting for it), with its version; `None`
/// when cancelled meanwhile.
async fn connect_runtime(
    config: &Config,
    cancel: &CancellationToken,
) -> Result<Option<(RuntimeClient, crate::runtime::cri::VersionResponse)>> {
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
    Ok(Some((runtime, version)))
}

/// The node's capacity, and what of it pods may have (less the reserves and the hard eviction
/// threshold). --reserved-cpus takes the place of the cpu in kube-reserved and
/// system-reserved, as upstream: allocatable counts its CPUs as reserved.
fn node_allocatable(
    config: &Config,
    node: &NodeResources,
) -> (crate::types::Allocatable, crate::types::Allocatable) {
    let capacity = crate::types::Allocatable {
        cpu: node.cpu,
        memory: node.memory,
        ephemeral_storage: node.ephemeral_storage,
        pods: config.max_pods,
    };
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
    (capacity, allocatable)
}

/// The cgroup manager, with the node's pod cgroups set up and the reserves enforced.
fn cgroup_manager(
    config: &Config,
    driver: crate::types::CgroupDriver,
    allocatable: &crate::types::Allocatable,
    cfs: crate::cgroups::Cfs,
) -> Result<crate::cgroups::Manager> {
    let cgroups = crate::cgroups::Manager::new(crate::cgroups::Config {
        root: config.cgroup_root.clone(),
        per_qos: config.cgroups_per_qos,
        enforce_allocatable: config.enforce_node_allocatable.pods,
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
    cgroups
        .setup_node(allocatable)
        .context("cannot set up the pod cgroups (--cgroup-root, --cgroups-per-qos)")?;
    tracing::info!(
        cpu = allocatable.cpu,
        memory = allocatable.memory,
        pods = allocatable.pods,
        "node allocatable"
    );
    Ok(cgroups)
}

/// What every pod sync needs to know of the node and the runtime.
fn pod_context(
    config: &Config,
    runtime_handlers: &[crate::runtime::cri::RuntimeHandler],
    runtime_name: &str,
    node: NodeResources,
    cfs: crate::cgroups::Cfs,
) -> pod_sync::Context {
    let supporting = |wants: fn(&crate::runtime::cri::RuntimeHandlerFeatures) -> bool| {
        runtime_handlers
            .iter()
            .filter(|h| h.features.as_ref().is_some_and(wants))
            .map(|h| h.name.clone())
            .collect::<Vec<_>>()
    };
    let host_ip = config
        .node_ip
        .or_else(detect_node_ip)
        .map(|ip| ip.to_string())
        .unwrap_or_default();
    pod_sync::Context {
        rro_handlers: supporting(|f| f.recursive_read_only_mounts),
        userns_handlers: supporting(|f| f.user_namespaces),
        node_name: config.node_name.clone(),
        root_dir: config.root_dir.clone(),
        pod_logs_dir: config.pod_logs_dir.clone(),
        container_logs_dir: config.container_logs_dir.clone(),
        resolv_conf: config.resolv_conf.clone(),
        host_ip,
        runtime_name: runtime_name.to_string(),
        node,
        cfs,
        restart_backoff_initial: test_backoff(config).unwrap_or(pod_sync::RESTART_BACKOFF_INITIAL),
        cluster_dns: pod_sync::network::ClusterDns {
            servers: config.cluster_dns.iter().map(|ip| ip.to_string()).collect(),
            domain: config.cluster_domain.clone(),
        },
    }
}

/// The hidden test-only backoff (`--testing-backoff`), said when in use.
fn test_backoff(config: &Config) -> Option<Duration> {
    let initial = config.testing_backoff?;
    tracing::warn!(?initial, "test-only backoff in use (--testing-backoff)");
    Some(initial)
}

/// The ID ranges of `hostUsers: false` pods, as recorded in the root dir.
fn user_namespaces(config: &Config) -> Result<pod_sync::userns::Manager> {
    pod_sync::userns::Manager::new(
        &config.root_dir,
        config.user_namespace_ids_per_pod,
        config.max_pods,
    )
    .map_err(|e| anyhow::anyhow!("user namespaces (userNamespaces.idsPerPod): {e}"))
}

/// The runtime handlers and their features; none when the runtime cannot say.
async fn runtime_handlers(runtime: &RuntimeClient) -> Vec<crate::runtime::cri::RuntimeHandler> {
    runtime.handlers().await.unwrap_or_else(|e| {
        tracing::warn!(error = %crate::types::error_chain(&e), "cannot read the runtime handlers' features; recursive read-only mounts and user namespaces are taken as unsupported");
        Vec::new()
    })
}

/// The probe results checkpointed before a restart, for the containers still running.
async fn restored_probe_results(config: &Config, runtime: &RuntimeClient) -> probe::Results {
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
    probe::Results::restore(&config.root_dir, &running)
}

/// The records of which credentials each image was pulled with, when
/// KubeletEnsureSecretPulledImages is on; the intents of pulls a stop cut short are settled
/// first.
async fn pull_records(
    config: &Config,
    runtime: &RuntimeClient,
) -> Result<Option<Arc<crate::images::PullRecords>>> {
    if !config.feature("KubeletEnsureSecretPulledImages") {
        return Ok(None);
    }
    let records = crate::images::PullRecords::open(
        &config.root_dir,
        (
            config.image_pull_credentials_verification_policy,
            config.preloaded_images_verification_allowlist.clone(),
        ),
        config.max_pods as usize,
        config.max_parallel_image_pulls.unwrap_or(0) as usize,
    )
    .with_context(|| {
        format!(
            "cannot keep image pull records in {}",
            config.root_dir.join("image_manager").display()
        )
    })?;
    match runtime.list_images().await {
        Ok(images) => records.recover(&images),
        Err(e) => {
            tracing::warn!(error = %crate::types::error_chain(&e), "cannot list the runtime's images; pulls a stop cut short stay unsettled")
        }
    }
    Ok(Some(Arc::new(records)))
}

/// The image puller, with its pull pool, rate limits, credential providers and pull records.
fn image_puller(
    config: &Config,
    runtime: &RuntimeClient,
    (credential_providers, pull_records): (
        Option<Arc<crate::images::Providers>>,
        Option<Arc<crate::images::PullRecords>>,
    ),
    recorder: &crate::events::Recorder,
) -> crate::images::Puller {
    crate::images::Puller::new(
        runtime.clone(),
        crate::images::Config {
            root_dir: config.root_dir.clone(),
            serialize: config.serialize_image_pulls,
            max_parallel: config.max_parallel_image_pulls,
            qps: config.registry_pull_qps,
            burst: config.registry_burst,
            backoff_initial: config
                .testing_backoff
                .unwrap_or(crate::images::PULL_BACKOFF_INITIAL),
            credential_providers,
            progress_deadline: config.image_pull_progress_deadline,
            pull_records,
        },
        recorder.clone(),
    )
}

/// The sync loop over `syncer`, admitting pods against `allocatable` and the resource
/// managers, with the sender of the node's pressure, which its admission reads.
fn sync_loop(
    config: &Config,
    syncer: &Arc<Syncer>,
    (allocatable, resources, objects): (
        crate::types::Allocatable,
        &Arc<crate::cm::Resources>,
        crate::objects::Writer,
    ),
    statuses: &status::Reader,
    (tracker, cancel): (TaskTracker, CancellationToken),
) -> (SyncLoop<Syncer>, tokio::sync::watch::Sender<Pressure>) {
    let (pressure, pressure_rx) = tokio::sync::watch::channel(Pressure::default());
    let loop_config = sync_loop::Config {
        resync: config.sync_frequency,
        allocatable: Some(allocatable),
        pressure: Some(pressure_rx),
        resources: Some(resources.clone()),
        sources: super::sources(config),
        allowed_unsafe_sysctls: config.allowed_unsafe_sysctls.clone(),
        statuses: Some(statuses.clone()),
        ..Default::default()
    };
    let sync_loop = SyncLoop::new(loop_config, syncer.clone(), objects, tracker, cancel);
    (sync_loop, pressure)
}

/// The eviction manager, watching the node against the hard thresholds.
fn eviction_manager(
    config: &Config,
    thresholds: Vec<eviction::Threshold>,
    memory: f64,
    runtime: &RuntimeClient,
    cgroups: &crate::cgroups::Manager,
    statuses: &status::Reader,
) -> eviction::Manager {
    let interval = test_period(
        "testing-eviction-period",
        config.testing_eviction_period,
        EVICTION_INTERVAL,
    );
    eviction::Manager {
        config: eviction::Config {
            thresholds,
            root_dir: config.root_dir.clone(),
            memory,
            interval,
            transition: config.eviction_pressure_transition_period,
            notifications: config.kernel_memcg_notification,
        },
        runtime: runtime.clone(),
        cgroups: cgroups.clone(),
        statuses: statuses.clone(),
    }
}

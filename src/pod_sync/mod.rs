//! What one sync of one pod does: read the pod's runtime state, plan (actions.rs), then carry the
//! plan out through the CRI, preparing volumes, images and log paths on the way.

pub mod actions;
pub mod convert;
mod hooks;
pub mod network;
pub mod resources;
pub mod status;
mod terminate;
pub mod userns;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::events::Target;
use crate::pod::{grace_period_seconds, spec};
use crate::pod_workers::PodSyncer;
use crate::runtime::{self, ContainerState, PodCache, PodRuntime, RuntimeClient, cri};
use crate::types::{PodUid, full_name, is_path_part};
use crate::volumes;
use crate::{images, probe};
pub use convert::Context;
use terminate::Leftover;

/// The runtime handler of the pod's RuntimeClass (none without one), or upstream's message when
/// the class is missing.
fn runtime_handler(pod: &Pod, objects: &crate::objects::View) -> Result<String, String> {
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

/// Why a sync step failed; each message names the pod part involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    #[error(transparent)]
    Volume(#[from] volumes::Error),
    #[error(transparent)]
    Cgroup(#[from] crate::cgroups::Error),
    #[error("container {container:?}: {reason}: {source}")]
    Image {
        container: String,
        reason: &'static str,
        #[source]
        source: images::Error,
    },
    #[error("container {container:?}: CreateContainerConfigError: {message}")]
    Config { container: String, message: String },
    #[error("container {container:?}: cannot have its devices")]
    Devices {
        container: String,
        #[source]
        source: crate::cm::devices::Error,
    },
    #[error("container {container:?}: PostStartHook failed: {message}")]
    PostStart { container: String, message: String },
    #[error("cannot create the pod sandbox: {0}")]
    Sandbox(String),
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
            Error::Config { .. } | Error::Devices { .. } => "CreateContainerConfigError".into(),
            Error::PostStart { .. } => "PostStartHookError".into(),
            Error::Runtime(e) if e.call() == "StartContainer" => "RunContainerError".into(),
            _ => "CreateContainerError".into(),
        }
    }
}

/// How soon a pod whose pull just failed is synced again, to show ImagePullBackOff.
const IMAGE_RETRY_CHECK: Duration = Duration::from_secs(1);

/// How long a postStart hook may run (upstream has no bound; a hung hook must not hang the pod).
const POST_START_TIMEOUT: Duration = Duration::from_secs(120);

/// How long past its expected time a runtime call about a pod may go unanswered before the pod
/// is reported stale: a hung call holds up only its own pod, which says so.
const STALE_AFTER: Duration = Duration::from_secs(10);

/// Awaits `call`, a runtime call about `target` described as `what`. One still unanswered
/// [`STALE_AFTER`] past its `expected` time gets a RuntimeStalled warning (the pod's status is
/// stale until it answers) and is what the pod waits on in its diagnosis, and its answer a
/// RuntimeAnswered event.
async fn watched<T>(
    (events, diagnoses): (&crate::events::Recorder, &crate::status::Diagnoses),
    target: &Target,
    what: &str,
    expected: Duration,
    call: impl Future<Output = T>,
) -> T {
    let began = std::time::Instant::now();
    tokio::pin!(call);
    let patience = expected + STALE_AFTER;
    tokio::select! {
        done = &mut call => return done,
        _ = tokio::time::sleep(patience) => {}
    }
    let _step = diagnoses.begin(
        &PodUid(target.uid.clone()),
        format!("the container runtime to answer {what}"),
    );
    tracing::warn!(pod = %target.name, namespace = %target.namespace, call = what, "the container runtime does not answer; only this pod waits");
    events.warning(
        target.clone(),
        "RuntimeStalled",
        format!(
            "The container runtime has not answered {what} for {}s; this pod's status is stale until it does",
            patience.as_secs()
        ),
    );
    let done = call.await;
    events.normal(
        target.clone(),
        "RuntimeAnswered",
        format!(
            "The container runtime answered {what} after {:.1}s",
            began.elapsed().as_secs_f64()
        ),
    );
    done
}

/// First delay of a crashing container's restarts; it doubles up to the max (upstream values).
pub const RESTART_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The images a container to start needs, in the runtime.
#[derive(Default)]
struct Pulled {
    /// Its own (none when the spec has no such container).
    image: Option<images::Image>,
    /// Its image volumes' image IDs by volume name.
    volumes: HashMap<String, String>,
}

/// What a sync has made ready before it starts containers.
struct Prepared<'a> {
    sandbox_id: &'a str,
    sandbox_config: &'a cri::PodSandboxConfig,
    volumes: &'a HashMap<String, volumes::Mounted>,
    objects: &'a crate::objects::View,
    pod_ip: &'a str,
}

/// Syncs pods against one runtime and records their status.
pub struct Syncer {
    runtime: RuntimeClient,
    cache: PodCache,
    ctx: Context,
    status: crate::status::Writer,
    statuses: crate::status::Reader,
    /// Per pod, per container: why the last start failed (cleared by a successful start).
    waiting: std::sync::Mutex<HashMap<PodUid, HashMap<String, status::Waiting>>>,
    backoff: std::sync::Mutex<crate::backoff::Backoff>,
    probes: Arc<probe::Manager>,
    cgroups: crate::cgroups::Manager,
    objects: crate::objects::Reader,
    images: images::Puller,
    events: crate::events::Recorder,
    /// What each pod's sync waits on, and its last error (`nodelet describe`).
    diagnoses: crate::status::Diagnoses,
    /// Pods whose termination left something on the node (`nodelet get cleanups`).
    cleanups: crate::status::Cleanups,
    /// When each termination under way began (its first attempt).
    terminations: std::sync::Mutex<HashMap<PodUid, tokio::time::Instant>>,
    /// What ended pods left, to be removed again.
    leftovers: std::sync::Mutex<HashMap<PodUid, Leftover>>,
    /// Pods whose containers have all run once (the pod-start metric counts each once).
    started: std::sync::Mutex<std::collections::HashSet<PodUid>>,
    /// Slots for sandbox starts, and for container starts, running in the runtime at once.
    sandbox_starts: tokio::sync::Semaphore,
    container_starts: tokio::sync::Semaphore,
    /// Sandboxes of the runtime left alone because their pod's identity is no safe path part
    /// (each is reported once).
    refused: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Containers resized in place since they were created: their resources digest now.
    resized: std::sync::Mutex<HashMap<String, String>>,
    /// The ID ranges of `hostUsers: false` pods.
    userns: userns::Manager,
    resources: Arc<crate::cm::Resources>,
}

/// Sandbox starts, and container starts, the runtime is asked for at once, per CPU. Its start
/// path (runc, the shim, CNI plugins) is CPU-bound: past a few starts per CPU, more at once only
/// add contention (on two CPUs, 110 pods started all at once took a fifth longer and a quarter
/// more CPU than 4 to 16 at a time). Containers have slots of their own so that a pod whose
/// sandbox is up does not wait behind every other pod's sandbox. Waits that are not the
/// runtime's work (image pulls, postStart hooks) hold no slot.
const STARTS_PER_CPU: usize = 4;

/// How long a sync waits for a relist that shows its pod as it is (two relist periods) before
/// it lists the pod itself: past that, the PLEG is late, and the pod's sync does not wait on it.
const RELIST_WAIT: Duration = Duration::from_secs(2);

fn start_slots() -> usize {
    STARTS_PER_CPU * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The components a [`Syncer`] drives besides the runtime.
pub struct Parts {
    /// The PLEG's latest reading of the runtime.
    pub cache: PodCache,
    pub status: crate::status::Writer,
    pub probes: Arc<probe::Manager>,
    pub cgroups: crate::cgroups::Manager,
    pub objects: crate::objects::Reader,
    pub images: images::Puller,
    pub events: crate::events::Recorder,
    pub diagnoses: crate::status::Diagnoses,
    pub cleanups: crate::status::Cleanups,
    pub userns: userns::Manager,
    /// Which CPUs, memory nodes and devices each container gets.
    pub resources: Arc<crate::cm::Resources>,
}

impl Syncer {
    pub fn new(runtime: RuntimeClient, ctx: Context, parts: Parts) -> Self {
        let backoff =
            crate::backoff::Backoff::new(ctx.restart_backoff_initial, RESTART_BACKOFF_MAX);
        Syncer {
            cache: parts.cache,
            objects: parts.objects,
            images: parts.images,
            started: Default::default(),
            sandbox_starts: tokio::sync::Semaphore::new(start_slots()),
            container_starts: tokio::sync::Semaphore::new(start_slots()),
            cgroups: parts.cgroups,
            probes: parts.probes,
            events: parts.events,
            diagnoses: parts.diagnoses,
            cleanups: parts.cleanups,
            terminations: Default::default(),
            leftovers: Default::default(),
            runtime,
            ctx,
            statuses: parts.status.reader(),
            status: parts.status,
            waiting: Default::default(),
            backoff: std::sync::Mutex::new(backoff),
            refused: Default::default(),
            resized: Default::default(),
            userns: parts.userns,
            resources: parts.resources,
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
        let key = format!("{}_{}_{}", PodUid::of(pod), start.name, previous.digest);
        let finished = UNIX_EPOCH + Duration::from_nanos(previous.finished_at.max(0) as u64);
        let mut backoff = self.backoff.lock().unwrap_or_else(|e| e.into_inner());
        // After a nodelet restart the delay goes on from the restart count, not from zero.
        let started = UNIX_EPOCH + Duration::from_nanos(previous.started_at.max(0) as u64);
        backoff.resume(&key, previous.attempt, started, finished);
        let remaining = backoff.remaining(&key, finished, SystemTime::now());
        if remaining.is_none() {
            backoff.next(&key, finished);
        }
        remaining
    }

    /// Stops one of the pod's containers gracefully (its preStop hook, stop signal and grace
    /// period), recording the Killing event with `why`.
    fn stop(
        &self,
        pod: &Pod,
        id: &str,
        name: &str,
        host: &str,
        grace: hooks::Grace,
        why: String,
    ) -> impl Future<Output = runtime::Result<()>> + Send + 'static {
        let target = Target::container(pod, name);
        self.events.normal(target.clone(), "Killing", why);
        let want = crate::pod::all_containers(spec(pod))
            .find(|w| w.name == name)
            .cloned();
        let (events, expected) = (self.events.clone(), grace.period);
        let diagnoses = self.diagnoses.clone();
        let step = format!(
            "the stop of container {name} (grace {}s)",
            grace.period.as_secs()
        );
        let what = format!("the stop of container {name} ({id})");
        let stop = hooks::stop_container(
            self.runtime.clone(),
            id.to_string(),
            want,
            host.to_string(),
            grace,
            (self.events.clone(), target.clone()),
        );
        async move {
            let _step = diagnoses.begin(&PodUid(target.uid.clone()), step);
            watched((&events, &diagnoses), &target, &what, expected, stop).await
        }
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
    fn rro_supported(&self, pod: &Pod, objects: impl FnOnce() -> crate::objects::View) -> bool {
        let wanted = crate::pod::all_containers(spec(pod))
            .flat_map(|c| c.volume_mounts.iter().flatten())
            .any(|m| {
                m.recursive_read_only
                    .as_deref()
                    .is_some_and(|r| r != "Disabled")
            });
        wanted && runtime_handler(pod, &objects()).is_ok_and(|h| self.ctx.rro_handlers.contains(&h))
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

    /// What the probes say about the pod's running containers: which failed (with the kill
    /// reason) and which have not passed their startup probe yet.
    fn probe_view(&self, pod: &Pod, rt: &PodRuntime) -> actions::ProbeView {
        let results = self.probes.results();
        let mut view = actions::ProbeView::default();
        for c in rt
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
        {
            let Some(want) = crate::pod::all_containers(spec(pod)).find(|w| w.name == c.name)
            else {
                continue;
            };
            if !results.state(&c.id, want).1 {
                view.unstarted.insert(c.id.clone());
            }
            let Some(kind) = results.unhealthy(&c.id) else {
                continue;
            };
            let (which, probe) = match kind {
                probe::Kind::Startup => ("startup", want.startup_probe.as_ref()),
                _ => ("liveness", want.liveness_probe.as_ref()),
            };
            view.unhealthy.insert(
                c.id.clone(),
                actions::Unhealthy {
                    reason: format!(
                        "Container {} failed {which} probe, will be restarted",
                        c.name
                    ),
                    grace: probe.and_then(|p| p.termination_grace_period_seconds),
                },
            );
        }
        view
    }

    /// An exited container's termination message: its terminationMessagePath file (at most
    /// 4 KiB), or with FallbackToLogsOnError and a failure, the tail of its log.
    fn termination_message(&self, pod: &Pod, c: &runtime::Container) -> Option<String> {
        if c.state != ContainerState::Exited {
            return None;
        }
        if let Some(file) = &c.termination_message_file
            && let Ok(bytes) = read_bounded(std::path::Path::new(file), false)
            && !bytes.is_empty()
        {
            return Some(String::from_utf8_lossy(&bytes).into_owned());
        }
        if c.termination_message_policy != "FallbackToLogsOnError" || c.exit_code == 0 {
            return None;
        }
        let log = convert::pod_log_dir(&self.ctx, pod)
            .join(convert::container_log_path(&c.name, c.attempt));
        let bytes = read_bounded(&log, true).ok()?;
        Some(log_tail(&String::from_utf8_lossy(&bytes)))
    }

    /// Records the pod's status from a reading of its runtime state and the failures of its
    /// latest starts.
    async fn update_status(&self, pod: &Pod, rt: &PodRuntime) -> Result<(), Error> {
        let uid = PodUid::of(pod);
        let mut rt = rt.clone();
        for c in rt.containers.iter_mut() {
            if let Some(message) = self.termination_message(pod, c) {
                c.message = message;
            }
        }
        let pod_ips = match rt.latest_sandbox() {
            Some(sb) if sb.state == runtime::SandboxState::Ready => {
                let ips = self.runtime.sandbox_ips(&sb.id);
                let what = "the status of its sandbox";
                let reporting = (&self.events, &self.diagnoses);
                match watched(reporting, &Target::pod(pod), what, Duration::ZERO, ips).await {
                    Ok(ips) => ips,
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
            rro_supported: self.rro_supported(pod, || self.objects.view(pod)),
        });
        let was_started = old
            .as_ref()
            .is_some_and(|e| all_started(e.pod.status.as_ref()));
        if !was_started && all_started(Some(&status)) {
            let seen = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::pod::ANNOTATION_CONFIG_SEEN))
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
            if let Some(seen) = seen {
                let took = crate::types::now()
                    .duration_since(seen)
                    .as_secs_f64()
                    .max(0.0);
                crate::metrics::get().pod_started(Duration::from_secs_f64(took));
            }
        }
        if self.status.set(pod, status) {
            tracing::debug!(pod = %full_name(pod), "pod status changed");
        }
        Ok(())
    }

    /// Records the status of a pod whose containers are all stopped, in a terminal phase.
    async fn record_final_status(&self, pod: &Pod, rt: &PodRuntime) -> Result<(), Error> {
        self.update_status(pod, rt).await?;
        let Some(entry) = self.statuses.get(&PodUid::of(pod)) else {
            return Ok(());
        };
        let mut status = entry.pod.status.clone().unwrap_or_default();
        // A container that never ran (or is gone) ends as upstream ends it: unknown, 137.
        let containers = status
            .container_statuses
            .iter_mut()
            .flatten()
            .chain(status.init_container_statuses.iter_mut().flatten());
        for c in containers {
            if c.state.as_ref().is_some_and(|s| s.terminated.is_some()) {
                continue;
            }
            c.ready = false;
            c.started = Some(false);
            c.state = Some(k8s_openapi::api::core::v1::ContainerState {
                terminated: Some(k8s_openapi::api::core::v1::ContainerStateTerminated {
                    reason: Some("ContainerStatusUnknown".into()),
                    message: Some(
                        "The container could not be located when the pod was terminated".into(),
                    ),
                    exit_code: 137,
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        let all_succeeded = status.container_statuses.iter().flatten().all(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        });
        if !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            status.phase = Some(if all_succeeded { "Succeeded" } else { "Failed" }.into());
        }
        self.status.set(pod, status);
        Ok(())
    }

    /// The pod's runtime state: the PLEG's latest reading when it is current, else listed.
    async fn read(&self, pod: &Pod) -> runtime::Result<PodRuntime> {
        self.details(self.cache.get(&PodUid::of(pod)), pod).await
    }

    /// The pod's runtime state from `listed` (the PLEG's reading) with the containers'
    /// status details, or listed now.
    async fn details(&self, listed: Option<PodRuntime>, pod: &Pod) -> runtime::Result<PodRuntime> {
        let uid = PodUid::of(pod);
        let read = async {
            match listed {
                Some(listed) => self.runtime.with_details(listed).await,
                None => self.runtime.pod_runtime(&uid).await,
            }
        };
        let what = "the reading of its containers";
        let reporting = (&self.events, &self.diagnoses);
        watched(reporting, &Target::pod(pod), what, Duration::ZERO, read).await
    }

    async fn sync(&self, pod: &Pod) -> Result<Option<Duration>, Error> {
        let uid = PodUid::of(pod);
        // A sync right after one that changed the pod waits for the next relist rather than
        // listing the runtime itself (as upstream): during a burst of starts, the pods' own
        // listings were a third of the agent's runtime calls. The wait delays only what the
        // sync reads (the status of what the last one started), never a start of its own.
        let listed = self.cache.newer(&uid, RELIST_WAIT).await;
        let mut rt = self.details(listed, pod).await?;
        {
            let resized = self.resized.lock().unwrap_or_else(|e| e.into_inner());
            for c in &mut rt.containers {
                if let Some(digest) = resized.get(&c.id) {
                    c.resources.clone_from(digest);
                }
            }
        }
        let plan = actions::plan(pod, &rt, &self.probe_view(pod, &rt));
        tracing::debug!(pod = %full_name(pod), ?plan, "sync plan");
        // A sync that changes the pod records its status from the reading it started from
        // before (a new pod shows as Pending at once, even while its images are pulled) and
        // after its changes (their failures); the status of the changes themselves follows
        // from the next relist, whose events wake the pod's worker again (as upstream).
        let changing = (!plan.is_empty()).then(|| self.cache.changing(&uid));
        if changing.is_some() {
            self.update_status(pod, &rt).await?;
        }
        if plan.kill_pod {
            self.kill_all(pod, &rt, false).await?;
        }
        if let Some(id) = &plan.stop_sandbox {
            tracing::info!(pod = %full_name(pod), "pod finished; stopping its sandbox");
            ignore_not_found(self.runtime.stop_pod_sandbox(id).await)?;
        }
        let objects = self.objects.view(pod);
        let node = &self.ctx.node;
        let resource_field = |r: &k8s_openapi::api::core::v1::ResourceFieldSelector| {
            resources::selector_value(pod, None, r, node)
        };
        let inputs = volumes::Inputs {
            objects: &objects,
            resource_field: &resource_field,
        };
        let volumes = volumes::setup(pod, &self.ctx.root_dir, &inputs).inspect_err(|e| {
            // Worded as upstream's, which tools and tests match on.
            let message = match e {
                volumes::Error::Volume { volume, message } => {
                    format!("MountVolume.SetUp failed for volume {volume:?} : {message}")
                }
                other => crate::types::error_chain(other),
            };
            self.events
                .warning(Target::pod(pod), "FailedMount", message)
        })?;
        if !plan.resize.is_empty() {
            self.cgroups.widen_pod(pod)?;
            for r in &plan.resize {
                let digest = self.resize(pod, r).await?;
                // The status this sync records shows the new resources in place.
                if let Some(c) = rt.containers.iter_mut().find(|c| c.id == r.id) {
                    c.resources = digest;
                }
            }
        }
        self.cgroups.ensure_pod(pod)?;
        let host_dns = network::host_dns(self.ctx.resolv_conf.as_deref());
        let (dns, dns_warnings) = network::dns_config(pod, &host_dns, &self.ctx.cluster_dns);
        let attempt = plan
            .create_sandbox
            .or_else(|| rt.latest_sandbox().map(|s| s.attempt))
            .unwrap_or(0);
        let userns = self.user_namespace(pod, &objects).map_err(|why| {
            self.events.warning(
                Target::pod(pod),
                "FailedCreatePodSandBox",
                format!("Failed to create pod sandbox: {why}"),
            );
            Error::Sandbox(why)
        })?;
        let sandbox_config = convert::sandbox_config(
            pod,
            attempt,
            &self.ctx,
            dns,
            self.cgroups.pod_parent(pod),
            userns.as_ref(),
        );
        let sandbox_id = match (&plan.create_sandbox, &plan.sandbox_id) {
            (Some(_), _) => {
                for warning in &dns_warnings {
                    self.events
                        .warning(Target::pod(pod), "DNSConfigForming", warning.clone());
                }
                if resources::wants_hugepages(pod) {
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
                    .map_or_else(|| runtime_handler(pod, &objects), Err)
                    .inspect_err(|why| {
                        self.events.warning(
                            Target::pod(pod),
                            "FailedCreatePodSandBox",
                            format!("Failed to create pod sandbox: {why}"),
                        )
                    });
                let handler = handler.map_err(Error::Sandbox)?;
                let uid = PodUid::of(pod);
                let step = self.diagnoses.begin(&uid, "a sandbox start slot".into());
                let slot = self.sandbox_starts.acquire().await;
                drop(step);
                let _step = self.diagnoses.begin(
                    &uid,
                    "the runtime to create the pod sandbox (its network included)".into(),
                );
                let id = self
                    .runtime
                    .run_pod_sandbox(sandbox_config.clone(), handler)
                    .await;
                drop(slot);
                let id = id.inspect_err(|e| {
                    self.events.warning(
                        Target::pod(pod),
                        "FailedCreatePodSandBox",
                        format!("Failed to create pod sandbox: {e}"),
                    )
                })?;
                tracing::info!(pod = %full_name(pod), sandbox = %id, attempt, "started pod sandbox");
                id
            }
            (None, Some(id)) => id.clone(),
            (None, None) => return self.update_status(pod, &rt).await.map(|()| None),
        };
        if !plan.kill.is_empty() {
            let host = self.hook_host(pod, &rt).await;
            for k in &plan.kill {
                let grace = k.grace.unwrap_or_else(|| grace_period_seconds(pod)).max(0) as u64;
                let why = format!("Stopping container {} ({})", k.name, k.reason);
                self.stop(
                    pod,
                    &k.id,
                    &k.name,
                    &host,
                    Duration::from_secs(grace).into(),
                    why,
                )
                .await?;
            }
        }
        let pod_ip = if plan.start.is_empty() {
            String::new()
        } else {
            self.pod_ip(&sandbox_id).await?
        };
        let mut first_error = None;
        let mut again: Option<Duration> = None;
        let mut starts = Vec::new();
        for start in &plan.start {
            if let Some(wait) = self.restart_backoff(pod, &rt, start) {
                let message = format!(
                    "back-off {}s restarting failed container={} pod={}",
                    wait.as_secs().max(1),
                    start.name,
                    full_name(pod)
                );
                self.events.warning(
                    Target::container(pod, &start.name),
                    "BackOff",
                    format!(
                        "Back-off restarting failed container {} in pod {}",
                        start.name,
                        full_name(pod)
                    ),
                );
                let reason = "CrashLoopBackOff".to_string();
                self.record_waiting(&uid, &start.name, Some(status::Waiting { reason, message }));
                again = Some(again.map_or(wait, |a| a.min(wait)));
                continue;
            }
            starts.push(start);
        }
        let prepared = Prepared {
            sandbox_id: &sandbox_id,
            sandbox_config: &sandbox_config,
            volumes: &volumes,
            objects: &objects,
            pod_ip: &pod_ip,
        };
        // The images of every container this sync starts are pulled at once; the containers
        // then start in their order.
        let pulls = starts
            .iter()
            .map(|start| self.pull_images(pod, start, &prepared));
        let pulled = futures_util::future::join_all(pulls).await;
        for (start, pulled) in starts.into_iter().zip(pulled) {
            let result = match pulled {
                Ok(pulled) => self.start_container(pod, start, &prepared, pulled).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => self.record_waiting(&uid, &start.name, None),
                Err(e) => {
                    let message = crate::types::error_chain(&e);
                    let reason = e.waiting_reason();
                    // A failed pull is retried when its backoff ends; the sync after the
                    // failure (a second later) shows ImagePullBackOff until then.
                    let retry = match &e {
                        Error::Image {
                            source: images::Error::BackOff { remaining, .. },
                            ..
                        } => Some(*remaining),
                        Error::Image {
                            source: images::Error::Pull { .. },
                            ..
                        } => Some(IMAGE_RETRY_CHECK),
                        _ => None,
                    };
                    if !matches!(e, Error::Image { .. }) {
                        self.events.warning(
                            Target::container(pod, &start.name),
                            "Failed",
                            format!("Error: {message}"),
                        );
                    }
                    self.record_waiting(
                        &uid,
                        &start.name,
                        Some(status::Waiting { reason, message }),
                    );
                    match retry {
                        Some(wait) => again = Some(again.map_or(wait, |a| a.min(wait))),
                        None => {
                            first_error.get_or_insert(e);
                        }
                    }
                }
            }
        }
        for id in &plan.remove_containers {
            self.remove_container(pod, &rt, id).await?;
        }
        for id in &plan.remove_sandboxes {
            ignore_not_found(self.runtime.remove_pod_sandbox(id).await)?;
        }
        self.update_status(pod, &rt).await?;
        first_error.map_or(Ok(again), Err)
    }

    async fn pod_ip(&self, sandbox_id: &str) -> Result<String, Error> {
        let ips = self.runtime.sandbox_ips(sandbox_id).await?;
        Ok(ips.into_iter().next().unwrap_or_default())
    }

    /// Mounts the container's subPaths (`subPath`, or `subPathExpr` expanded) where nothing in
    /// a container can redirect them, by volumeMount index.
    fn mount_sub_paths(
        &self,
        input: &convert::ContainerInput<'_>,
    ) -> Result<HashMap<usize, PathBuf>, Error> {
        let container = input.container;
        let config_error = |message| Error::Config {
            container: container.name.clone(),
            message,
        };
        let pod_dir = volumes::pod_dir(&self.ctx.root_dir, &PodUid::of(input.pod).0);
        let mounts: Vec<_> = container.volume_mounts.iter().flatten().collect();
        let mut mounted = HashMap::new();
        for (i, sub) in convert::sub_paths(input).map_err(config_error)? {
            let name = &mounts[i].name;
            // (an image volume's subPath is refused by the container config)
            let Some(volume) = input.volumes.get(name).filter(|v| v.image.is_none()) else {
                continue;
            };
            let target = volumes::subpath::target(&pod_dir, name, &container.name, i);
            let path = volumes::subpath::mount(&volume.path, &sub, &target)
                .map_err(|e| config_error(format!("volumeMount {name}: subPath {sub:?}: {e}")))?;
            mounted.insert(i, path);
        }
        Ok(mounted)
    }

    /// Makes sure the runtime has the images the container to start needs: its own and those
    /// of its image volumes (by volume name).
    async fn pull_images(
        &self,
        pod: &Pod,
        start: &actions::Start,
        prepared: &Prepared<'_>,
    ) -> Result<Pulled, Error> {
        let s = spec(pod);
        let Some(container) = crate::pod::find_container(s, &start.name) else {
            return Ok(Pulled::default());
        };
        let image = container.image.as_deref().unwrap_or_default();
        let policy = container
            .image_pull_policy
            .as_deref()
            .unwrap_or("IfNotPresent");
        let secrets = images::pull_secret_keyrings(pod, prepared.objects);
        let request = images::Request {
            pod: &PodUid::of(pod),
            target: &Target::container(pod, &start.name),
            image,
            policy,
            sandbox: prepared.sandbox_config,
            secrets: &secrets,
            diagnoses: &self.diagnoses,
        };
        let pull = async |request: &images::Request<'_>| {
            self.images
                .ensure(request)
                .await
                .map_err(|source| Error::Image {
                    container: start.name.clone(),
                    reason: source.reason(),
                    source,
                })
        };
        let mut pulled = Pulled {
            image: Some(pull(&request).await?),
            volumes: HashMap::new(),
        };
        for m in container.volume_mounts.iter().flatten() {
            let Some(source) = s
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == m.name)
                .and_then(|v| v.image.as_ref())
            else {
                continue;
            };
            let request = images::Request {
                image: source.reference.as_deref().unwrap_or_default(),
                policy: source.pull_policy.as_deref().unwrap_or("IfNotPresent"),
                ..request
            };
            let image = pull(&request).await?;
            pulled.volumes.insert(m.name.clone(), image.id);
        }
        Ok(pulled)
    }

    async fn start_container(
        &self,
        pod: &Pod,
        start: &actions::Start,
        prepared: &Prepared<'_>,
        pulled: Pulled,
    ) -> Result<(), Error> {
        let Prepared {
            sandbox_id,
            sandbox_config,
            volumes,
            objects,
            pod_ip,
        } = *prepared;
        let Some(container) = crate::pod::find_container(spec(pod), &start.name) else {
            return Ok(());
        };
        let container = &container;
        let Pulled {
            image: Some(image_info),
            volumes: image_volumes,
        } = pulled
        else {
            return Ok(());
        };
        verify_non_root(pod, container, &image_info).map_err(|message| Error::Config {
            container: start.name.clone(),
            message,
        })?;
        let etc_hosts = self.write_etc_hosts(pod, pod_ip)?;
        let termination_log = volumes::pod_dir(&self.ctx.root_dir, &PodUid::of(pod).0)
            .join("containers")
            .join(&start.name)
            .join(format!("{}.termination-log", start.restart_count));
        create_world_writable(&termination_log).map_err(|source| Error::Io {
            path: termination_log.clone(),
            source,
        })?;
        let no_sub_paths = HashMap::new();
        let mut input = convert::ContainerInput {
            pod,
            container,
            init: start.init,
            restart_count: start.restart_count,
            image_ref: &image_info.id,
            volumes,
            objects,
            pod_ip,
            host_ip: &self.ctx.host_ip,
            node: &self.ctx.node,
            cfs: self.ctx.cfs,
            termination_log: Some(&termination_log),
            etc_hosts: Some(&etc_hosts),
            sub_paths: &no_sub_paths,
            pid_target: start.pid_target.as_deref(),
            rro_supported: self.rro_supported(pod, || self.objects.view(pod)),
            userns: sandbox_config
                .linux
                .as_ref()
                .and_then(|l| l.security_context.as_ref())
                .and_then(|s| s.namespace_options.as_ref())
                .and_then(|n| n.userns_options.as_ref()),
            image_volumes: &image_volumes,
        };
        let sub_paths = self.mount_sub_paths(&input)?;
        input.sub_paths = &sub_paths;
        let mut config = convert::container_config(&input).map_err(|message| Error::Config {
            container: start.name.clone(),
            message,
        })?;
        if let Some(resources) = config.linux.as_mut().and_then(|l| l.resources.as_mut()) {
            let uid = PodUid::of(pod);
            if let Some(cpus) = self.resources.cpus.cpuset(&uid.0, &start.name) {
                resources.cpuset_cpus = cpus;
            }
            if let Some(mems) = self.resources.memory.mems(&uid.0, &start.name) {
                resources.cpuset_mems = mems;
            }
        }
        let devices = self.resources.devices.container_start(pod, container).await;
        let devices = devices.map_err(|source| Error::Devices {
            container: start.name.clone(),
            source,
        })?;
        if let Some(devices) = devices {
            convert::with_devices(&mut config, devices);
        }
        let log_dir = convert::pod_log_dir(&self.ctx, pod).join(&start.name);
        std::fs::create_dir_all(&log_dir).map_err(|source| Error::Io {
            path: log_dir.clone(),
            source,
        })?;
        let log_file = convert::pod_log_dir(&self.ctx, pod).join(&config.log_path);
        let stop_signal = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.stop_signal.as_deref())
            .and_then(crate::pod::cri_signal);
        let uid = PodUid::of(pod);
        let step = self.diagnoses.begin(&uid, "a container start slot".into());
        let slot = self.container_starts.acquire().await;
        drop(step);
        let step = format!("the runtime to create and start container {}", start.name);
        let step = self.diagnoses.begin(&uid, step);
        let id = self
            .runtime
            .create_container(sandbox_id, config, sandbox_config.clone(), stop_signal)
            .await?;
        let target = Target::container(pod, &start.name);
        self.events.normal(
            target.clone(),
            "Created",
            format!("Created container: {}", start.name),
        );
        self.link_log(pod, &start.name, &id, &log_file);
        self.runtime.start_container(&id).await?;
        drop((slot, step));
        tracing::debug!(pod = %full_name(pod), container = %start.name, id = %id, restart_count = start.restart_count, "started container");
        self.events.normal(
            target,
            "Started",
            format!("Started container {}", start.name),
        );
        crate::metrics::get().container_started(start.init);
        if let Some(handler) = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.post_start.as_ref())
        {
            let host = if pod_ip.is_empty() {
                self.ctx.host_ip.as_str()
            } else {
                pod_ip
            };
            let hook = hooks::run(
                &self.runtime,
                handler,
                container,
                &id,
                host,
                POST_START_TIMEOUT,
            );
            let step = format!("the postStart hook of container {}", start.name);
            let step = self.diagnoses.begin(&uid, step);
            let ran = hook.await;
            drop(step);
            if let Err(why) = ran {
                self.events.warning(
                    Target::container(pod, &start.name),
                    "FailedPostStartHook",
                    format!("PostStartHook failed: {why}"),
                );
                let grace = Duration::from_secs(grace_period_seconds(pod).max(0) as u64);
                let stop = format!(
                    "Stopping container {}: its postStart hook failed",
                    start.name
                );
                self.stop(pod, &id, &start.name, host, grace.into(), stop)
                    .await?;
                return Err(Error::PostStart {
                    container: start.name.clone(),
                    message: why,
                });
            }
        }
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

    /// Resizes a container in place; returns its new resources digest.
    async fn resize(&self, pod: &Pod, r: &actions::Resize) -> Result<String, Error> {
        let Some(want) = crate::pod::all_containers(spec(pod)).find(|c| c.name == r.name) else {
            return Ok(String::new());
        };
        let resources = convert::linux_resources(pod, want, self.ctx.node.memory, self.ctx.cfs);
        self.runtime
            .update_container_resources(&r.id, resources)
            .await?;
        let digest = convert::resources_digest(want).encode();
        tracing::info!(pod = %full_name(pod), container = %r.name, resources = %digest, "resized container in place");
        self.resized
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(r.id.clone(), digest.clone());
        Ok(digest)
    }

    async fn remove_container(&self, pod: &Pod, rt: &PodRuntime, id: &str) -> Result<(), Error> {
        ignore_not_found(self.runtime.remove_container(id).await)?;
        self.resized
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        // Its logs go with it, as upstream: the log file, its rotated files and its
        // /var/log/containers link; only under names that stay inside the log directories.
        let named = |c: &&crate::runtime::Container| {
            c.id == id && is_path_part(&c.name) && is_path_part(&c.id)
        };
        if let Some(c) = rt.containers.iter().find(named) {
            let link = convert::container_log_link(&self.ctx, pod, &c.name, id);
            let _ = std::fs::remove_file(link);
            let log = convert::pod_log_dir(&self.ctx, pod)
                .join(convert::container_log_path(&c.name, c.attempt));
            crate::log_rotation::remove_logs(&log);
        }
        Ok(())
    }

    /// Writes the pod's managed hosts file (`<root-dir>/pods/<uid>/etc-hosts`) and returns its path.
    fn write_etc_hosts(&self, pod: &Pod, pod_ip: &str) -> Result<PathBuf, Error> {
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

    /// Where the pod's httpGet and tcpSocket hooks connect: its IP, or the node's on the host
    /// network or when the sandbox is gone.
    async fn hook_host(&self, pod: &Pod, rt: &PodRuntime) -> String {
        if !spec(pod).host_network.unwrap_or(false)
            && let Some(sb) = rt.latest_sandbox()
            && let Ok(ip) = self.pod_ip(&sb.id).await
            && !ip.is_empty()
        {
            return ip;
        }
        self.ctx.host_ip.clone()
    }
}

/// Whether the sandbox's pod UID, name and namespace can name the pod's directories; a
/// sandbox whose cannot is reported (once, remembered in `refused`) and left alone.
fn safe_identity(
    refused: &std::sync::Mutex<std::collections::HashSet<String>>,
    sb: &crate::runtime::Sandbox,
) -> bool {
    if [&sb.uid.0, &sb.name, &sb.namespace]
        .into_iter()
        .all(|p| is_path_part(p))
    {
        return true;
    }
    let mut refused = refused.lock().unwrap_or_else(|e| e.into_inner());
    if refused.insert(sb.id.clone()) {
        tracing::warn!(sandbox = %sb.id, uid = ?sb.uid.0, name = ?sb.name, namespace = ?sb.namespace, "the runtime reports a pod sandbox whose UID, name or namespace cannot be a path; it is left alone");
    }
    false
}

fn all_started(status: Option<&k8s_openapi::api::core::v1::PodStatus>) -> bool {
    status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            !cs.is_empty()
                && cs
                    .iter()
                    .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}

/// The status of a pod the node refused or stopped for good, from its last one (what is known
/// of its containers stays): Failed with `reason` and `message`, as upstream. A pod stopped by
/// node shutdown that had succeeded stays Succeeded. Stops the node decided on by itself
/// (eviction, node shutdown) carry upstream's DisruptionTarget condition.
fn failure(
    last: Option<k8s_openapi::api::core::v1::PodStatus>,
    reason: &str,
    message: &str,
) -> k8s_openapi::api::core::v1::PodStatus {
    let mut status = last.unwrap_or_default();
    let succeeded = status.phase.as_deref() == Some("Succeeded");
    if !(succeeded && reason == crate::shutdown::REASON) {
        status.phase = Some("Failed".into());
    }
    status.reason = Some(reason.into());
    status.message = Some(message.into());
    if matches!(reason, "Evicted" | crate::shutdown::REASON) {
        let conditions = status.conditions.get_or_insert_default();
        conditions.retain(|c| c.type_ != "DisruptionTarget");
        conditions.push(k8s_openapi::api::core::v1::PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some(message.into()),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                crate::types::now(),
            )),
            ..Default::default()
        });
    }
    status
}

/// With runAsNonRoot, refuses a container whose effective user is root or cannot be told.
fn verify_non_root(
    pod: &Pod,
    c: &k8s_openapi::api::core::v1::Container,
    image: &images::Image,
) -> Result<(), String> {
    let pod_sc = spec(pod).security_context.as_ref();
    let sc = c.security_context.as_ref();
    let non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or(pod_sc.and_then(|s| s.run_as_non_root))
        .unwrap_or(false);
    if !non_root {
        return Ok(());
    }
    let uid = sc
        .and_then(|s| s.run_as_user)
        .or(pod_sc.and_then(|s| s.run_as_user))
        .or(image.uid);
    match uid {
        Some(0) => Err("container has runAsNonRoot and its user is root (uid 0)".into()),
        Some(_) => Ok(()),
        None if !image.username.is_empty() => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({}), cannot verify user is non-root",
            image.username
        )),
        None => Err("container has runAsNonRoot and image will run as root".into()),
    }
}

/// Largest termination message read from a container's file (upstream: 4 KiB).
const MAX_TERMINATION_MESSAGE: u64 = 4096;

/// At most 4 KiB of a file: its start, or with `tail` its end (a log's last lines).
fn read_bounded(path: &std::path::Path, tail: bool) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    if tail {
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(
            len.saturating_sub(MAX_TERMINATION_MESSAGE * 4),
        ))?;
    }
    let mut bytes = Vec::new();
    f.take(MAX_TERMINATION_MESSAGE * if tail { 4 } else { 1 })
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The last 80 lines (at most 2 KiB) of a CRI-format log, without the time/stream/tag prefixes.
fn log_tail(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(""))
        .collect();
    let tail = lines[lines.len().saturating_sub(80)..].join("\n");
    let mut start = tail.len().saturating_sub(2048);
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    tail[start..].to_string()
}

/// An empty file any container user may write (its termination message).
fn create_world_writable(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, b"")?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
}

fn ignore_not_found(r: runtime::Result<()>) -> runtime::Result<()> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

impl PodSyncer for Syncer {
    async fn sync_pod(&self, pod: Arc<Pod>) -> Result<Option<Duration>, String> {
        let synced = self.sync(&pod).await;
        let error = synced.as_ref().err().map(|e| crate::types::error_chain(e));
        self.diagnoses.synced(&PodUid::of(&pod), error.as_deref());
        match synced {
            Ok(again) => Ok(again),
            Err(e) => {
                // The pod still gets a status (Pending, ContainerCreating) when it can be read.
                let uid = PodUid::of(&pod);
                if self.statuses.get(&uid).is_none()
                    && let Ok(rt) = self.runtime.pod_runtime(&uid).await
                {
                    let _ = self.update_status(&pod, &rt).await;
                }
                Err(crate::types::error_chain(&e))
            }
        }
    }

    async fn terminate_pod(&self, pod: Arc<Pod>) -> Result<(), String> {
        self.terminate(&pod).await.map_err(|e| {
            let why = crate::types::error_chain(&e);
            self.events.warning(
                Target::pod(&pod),
                "FailedKillPod",
                format!("error killing pod: {why}"),
            );
            why
        })
    }

    async fn reject_pod(&self, pod: Arc<Pod>, reason: &str, message: &str) {
        self.events
            .warning(Target::pod(&pod), reason, message.to_string());
        let uid = PodUid::of(&pod);
        let last = self
            .statuses
            .get(&uid)
            .or_else(|| self.statuses.final_entry(&uid))
            .and_then(|e| e.pod.status.clone());
        self.status.set(&pod, failure(last, reason, message));
    }

    async fn forget_pod(&self, pod: Arc<Pod>) {
        self.status.terminated(&PodUid::of(&pod));
    }

    async fn housekeep(&self, desired: Vec<Arc<Pod>>) {
        let pods: Vec<&Pod> = desired.iter().map(|p| p.as_ref()).collect();
        if let Err(e) = self.cgroups.update_qos(&pods) {
            tracing::warn!(error = %e, "cannot update the QoS cgroups");
        }
        self.userns.release_orphans();
        self.retry_leftovers(&desired);
    }

    async fn runtime_pods(&self) -> Result<Vec<Arc<Pod>>, String> {
        let sandboxes = self
            .runtime
            .list_sandboxes(None)
            .await
            .map_err(|e| crate::types::error_chain(&e))?;
        let mut seen = std::collections::HashSet::new();
        Ok(sandboxes
            .into_iter()
            // Only sandboxes made by a kubelet-like agent (pod labels), and not by another node
            // agent sharing the runtime; anything else on the runtime is never touched.
            .filter(|sb| sb.owned_by(&self.ctx.node_name))
            .filter(|sb| safe_identity(&self.refused, sb))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn reasons(events: &crate::events::Recorder) -> Vec<String> {
        events.list(None).into_iter().map(|e| e.reason).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_runtime_call_that_hangs_marks_its_pod_stale_until_it_answers() {
        let events = crate::events::Recorder::default();
        let pod = Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let target = Target::pod(&pod);
        let diagnoses = crate::status::Diagnoses::default();
        let reporting = (&events, &diagnoses);
        let quick = watched(reporting, &target, "a quick call", Duration::ZERO, async {
            1
        });
        assert_eq!(quick.await, 1);
        assert!(reasons(&events).is_empty(), "an answered call says nothing");

        let expected = Duration::from_secs(5);
        let slow = tokio::time::sleep(expected + STALE_AFTER - Duration::from_millis(1));
        watched(reporting, &target, "a slow call", expected, slow).await;
        assert!(
            reasons(&events).is_empty(),
            "a call within its time is not stale"
        );

        let hung = tokio::time::sleep(Duration::from_secs(60));
        let began = tokio::time::Instant::now();
        let look = async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            diagnoses.get(&PodUid(String::new()))
        };
        let ((), seen) = tokio::join!(
            watched(reporting, &target, "a hung call", Duration::ZERO, hung),
            look
        );
        assert_eq!(
            seen.waiting_on[0].what,
            "the container runtime to answer a hung call"
        );
        assert!(diagnoses.get(&PodUid(String::new())).waiting_on.is_empty());
        assert_eq!(
            began.elapsed(),
            Duration::from_secs(60),
            "the call's answer is awaited"
        );
        assert_eq!(reasons(&events), ["RuntimeStalled", "RuntimeAnswered"]);
        let stalled = &events.list(None)[0];
        assert!(
            stalled.message.contains("a hung call"),
            "{}",
            stalled.message
        );
        assert_eq!(stalled.target.name, "p");
    }
}

//! What one sync of one pod does, in steps of a file each: read the pod's runtime state
//! (read.rs), plan (actions.rs), prepare its volumes and resizes (prepare.rs), ensure its
//! sandbox (sandbox.rs), kill what the plan kills (kill.rs), start containers (start.rs, pulling
//! their images in pull.rs), collect garbage (gc.rs) and record the status (record.rs). A pod's
//! end is terminate.rs; the CRI configs are built in convert.rs.

pub mod actions;
pub mod convert;
mod gc;
mod hooks;
mod kill;
pub mod network;
mod prepare;
mod pull;
mod read;
mod record;
pub mod resources;
mod sandbox;
mod start;
pub mod status;
mod terminate;
pub mod userns;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::events::Target;
use crate::pod_workers::{PodSyncer, RuntimePod};
use crate::runtime::{self, PodCache, RuntimeClient};
use crate::types::{PodUid, full_name, is_path_part};
use crate::volumes;
use crate::{images, probe};
pub use convert::Context;
use kill::GraceFrom;
use record::failure;
use start::Prepared;
use terminate::Leftover;

/// Why a sync step failed; each message names the pod part involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] runtime::Error),
    #[error(transparent)]
    Volume(#[from] volumes::Error),
    #[error(transparent)]
    Cgroup(#[from] crate::cgroups::Error),
    #[error("container {container:?}: {reason}")]
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
    #[error("prepare dynamic resources")]
    Prepare(#[source] crate::cm::dra::Error),
    #[error("unprepare dynamic resources")]
    Unprepare(#[source] crate::cm::dra::Error),
    #[error("{0}")]
    Resize(String),
    #[error("cannot prepare {}", .path.display())]
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
    // Boxed, not pinned in place: a pinned copy would double the call's state in this future.
    let mut call = Box::pin(call);
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

/// Syncs pods against one runtime and records their status.
pub struct Syncer {
    runtime: RuntimeClient,
    cache: PodCache,
    ctx: Context,
    status: crate::status::Writer,
    statuses: crate::status::Reader,
    /// What the syncer keeps of each pod between its syncs.
    books: std::sync::Mutex<HashMap<PodUid, Book>>,
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
    /// What ended pods left, to be removed again (kept past the pods' books).
    leftovers: std::sync::Mutex<HashMap<PodUid, Leftover>>,
    /// Slots for sandbox starts, and for container starts, running in the runtime at once.
    sandbox_starts: tokio::sync::Semaphore,
    container_starts: tokio::sync::Semaphore,
    /// Sandboxes of the runtime left alone because their pod's identity is no safe path part
    /// (each is reported once).
    refused: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The ID ranges of `hostUsers: false` pods.
    userns: userns::Manager,
    resources: Arc<crate::cm::Resources>,
    /// The pods' volumes on the host.
    volumes: Arc<crate::volumes::Manager>,
    /// The restart counts a terminated pod's containers reached, by container name: a pod
    /// back with the same UID soon after (a static pod's manifest deleted and written again)
    /// counts on from them, as upstream's does from the dead containers it still has.
    carried: std::sync::Mutex<HashMap<PodUid, HashMap<String, u32>>>,
}

/// What the syncer keeps of one pod between its syncs; forgetting the pod is dropping its book.
#[derive(Default)]
struct Book {
    /// Per container: why its last start failed (cleared by a successful start).
    waiting: HashMap<String, status::Waiting>,
    /// When the termination under way began (its first attempt).
    terminating_since: Option<tokio::time::Instant>,
    /// Containers resized in place since they were created, by ID: their resources digest now.
    resized: HashMap<String, String>,
    /// Why the last in-place resize could not be made (cleared once one is).
    resize_error: Option<String>,
}

/// Sandbox starts, and container starts, the runtime is asked for at once, per CPU. Its start
/// path (runc, the shim, CNI plugins) is CPU-bound: past a few starts per CPU, more at once only
/// add contention (on two CPUs, 110 pods started all at once took a fifth longer and a quarter
/// more CPU than 4 to 16 at a time). Containers have slots of their own so that a pod whose
/// sandbox is up does not wait behind every other pod's sandbox. Waits that are not the
/// runtime's work (image pulls, postStart hooks) hold no slot.
const STARTS_PER_CPU: usize = 4;

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
            sandbox_starts: tokio::sync::Semaphore::new(start_slots()),
            container_starts: tokio::sync::Semaphore::new(start_slots()),
            cgroups: parts.cgroups,
            probes: parts.probes,
            events: parts.events,
            diagnoses: parts.diagnoses,
            cleanups: parts.cleanups,
            leftovers: Default::default(),
            runtime,
            statuses: parts.status.reader(),
            status: parts.status,
            books: Default::default(),
            backoff: std::sync::Mutex::new(backoff),
            refused: Default::default(),
            userns: parts.userns,
            resources: parts.resources,
            volumes: Arc::new(crate::volumes::Manager::new(&ctx.root_dir)),
            carried: Default::default(),
            ctx,
        }
    }

    /// The restart counts the pod's containers reached before it last terminated, if it did.
    fn carried_counts(&self, uid: &PodUid) -> Option<HashMap<String, u32>> {
        let carried = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        carried.get(uid).cloned()
    }

    /// Works on the pod's book, opening one for a pod that has none.
    fn book<R>(&self, uid: &PodUid, f: impl FnOnce(&mut Book) -> R) -> R {
        let mut books = self.books.lock().unwrap_or_else(|e| e.into_inner());
        f(books.entry(uid.clone()).or_default())
    }

    /// One sync of the pod: read its state, plan, then carry the plan out step by step (each
    /// step in a file of its own), and record the status.
    async fn sync(&self, pod: &Pod) -> Result<Option<Duration>, Error> {
        let mut rt = self.current(pod).await?;
        let mut plan = actions::plan(pod, &rt, &self.probe_view(pod, &rt));
        if let Some(carried) = self.carried_counts(&PodUid::of(pod)) {
            for start in &mut plan.start {
                let from = carried.get(&start.name).copied().unwrap_or(0);
                start.restart_count = start.restart_count.max(from);
            }
        }
        tracing::debug!(pod = %full_name(pod), ?plan, "sync plan");
        // A sync that changes the pod records its status from the reading it started from
        // before (a new pod shows as Pending at once, even while its images are pulled) and
        // after its changes (their failures); the status of the changes themselves follows
        // from the next relist, whose events wake the pod's worker again (as upstream).
        let changing = (!plan.is_empty()).then(|| self.cache.changing(&PodUid::of(pod)));
        if changing.is_some() {
            self.update_status(pod, &rt).await?;
        }
        if plan.kill_pod {
            self.kill_all(pod, &rt, false, GraceFrom::Spec).await?;
        }
        if let Some(id) = &plan.stop_sandbox {
            tracing::info!(pod = %full_name(pod), "pod finished; stopping its sandbox");
            ignore_not_found(self.runtime.stop_pod_sandbox(id).await)?;
        }
        let objects = self.objects.view(pod);
        let volumes = self.mount_volumes(pod, &objects)?;
        self.resize_all(pod, &plan.resize, &mut rt).await?;
        if plan.create_sandbox.is_some() {
            self.prepare_resources(pod).await?;
        }
        let Some(sandbox) = self.ensure_sandbox(pod, &plan, &rt, &objects).await? else {
            return self.update_status(pod, &rt).await.map(|()| None);
        };
        self.kill(pod, &rt, &plan.kill).await?;
        let pod_ip = if plan.start.is_empty() {
            String::new()
        } else {
            self.pod_ip(&sandbox.id).await?
        };
        let prepared = Prepared {
            sandbox_id: &sandbox.id,
            sandbox_config: &sandbox.config,
            volumes: &volumes,
            objects: &objects,
            pod_ip: &pod_ip,
        };
        let started = self.start_all(pod, &rt, &plan.start, &prepared).await;
        self.collect_garbage(pod, &rt, &plan).await?;
        self.update_status(pod, &rt).await?;
        started
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

fn ignore_not_found(r: runtime::Result<()>) -> runtime::Result<()> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

impl PodSyncer for Syncer {
    async fn sync_pod(&self, pod: Arc<Pod>) -> Result<Option<Duration>, String> {
        self.status.runs_again(&PodUid::of(&pod));
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
        self.terminate_reported(&pod, GraceFrom::Spec).await
    }

    async fn terminate_runtime_pod(&self, pod: Arc<RuntimePod>) -> Result<(), String> {
        // Its events, logs and directories are named by what the runtime knows of it.
        let known = Pod {
            metadata: ObjectMeta {
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                uid: Some(pod.uid.0.clone()),
                annotations: Some(pod.annotations.clone()),
                ..Default::default()
            },
            spec: None,
            status: None,
        };
        self.terminate_reported(&known, GraceFrom::Containers).await
    }

    async fn reject_pod(&self, pod: Arc<Pod>, reason: &str, message: &str) {
        self.events
            .warning(Target::pod(&pod), reason, message.to_string());
        let uid = PodUid::of(&pod);
        let last = (self.statuses.get(&uid))
            .and_then(|e| e.pod.status.clone())
            .or_else(|| self.statuses.final_status(&uid));
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
        let wanted: HashSet<PodUid> = desired.iter().map(|p| PodUid::of(p)).collect();
        (self.carried.lock().unwrap_or_else(|e| e.into_inner()))
            .retain(|uid, _| wanted.contains(uid));
        self.retry_leftovers(&desired);
        self.status.prune();
    }

    async fn clean_orphans(&self, mut keep: HashSet<PodUid>) {
        // What ended pods left is retried on its own schedule.
        keep.extend(
            (self.leftovers.lock().unwrap_or_else(|e| e.into_inner()))
                .keys()
                .cloned(),
        );
        let (root_dir, logs_dir) = (self.ctx.root_dir.clone(), self.ctx.pod_logs_dir.clone());
        let find = move || terminate::Orphans::find(&root_dir, &logs_dir, &keep);
        let Ok(orphans) = tokio::task::spawn_blocking(find).await else {
            return;
        };
        let mut swept = (0, 0);
        if !orphans.is_empty() {
            // Only a pod with no sandbox at all is an orphan: one the runtime holds for another
            // node name (a changed hostname) may still have containers using its volumes.
            let sandboxes = match self.runtime.list_sandboxes(None).await {
                Ok(sandboxes) => sandboxes,
                Err(e) => {
                    tracing::warn!(error = %crate::types::error_chain(&e), "cannot list the runtime's pods; orphaned pod directories stay until the next housekeeping");
                    return;
                }
            };
            let held = sandboxes.into_iter().map(|sb| sb.uid).collect();
            let volumes = self.volumes.clone();
            let remove = move || orphans.except(&held).remove(&volumes);
            swept = tokio::task::spawn_blocking(remove)
                .await
                .unwrap_or_default();
        }
        crate::metrics::get().orphan_pod_dirs(swept.0, swept.1);
    }

    async fn runtime_pods(&self) -> Result<Vec<RuntimePod>, String> {
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
            .map(|sb| RuntimePod {
                uid: sb.uid,
                name: sb.name,
                namespace: sb.namespace,
                annotations: sb.annotations.into_iter().collect(),
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

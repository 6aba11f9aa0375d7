//! The sync loop: the one task that owns the desired state. It merges source snapshots through
//! the mux, hands work to pod workers, resyncs pods periodically and does housekeeping.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{EphemeralContainer, Pod};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::{exceeds, host_has_apparmor, needs_apparmor, os_refusal, sysctl_refusal};
use crate::eviction::{Eviction, Pressure};
use crate::objects;
use crate::pleg::{Event, EventKind};
use crate::pod::{ANNOTATION_CONFIG_SOURCE, Requests, requests, resize};
use crate::pod_workers::{PodSyncer, PodWorkers, RuntimePod, Work};
use crate::probe;
use crate::sources::{Mux, SourceSnapshot};
use crate::types::{Allocatable, PodOperation, PodUid, Refusal, Source, full_name};

/// The grace period of a hard eviction (upstream's immediate eviction).
const EVICTION_GRACE_SECONDS: i64 = 1;

/// Timing of the loop.
#[derive(Clone)]
pub struct Config {
    /// How often pods whose resync time has come are synced (upstream: 1 s).
    pub tick: Duration,
    /// How often pods no longer desired are collected (upstream: 2 s).
    pub housekeeping: Duration,
    /// Time between resyncs of a pod; a jitter of up to half of it is added (upstream: 1 m).
    pub resync: Duration,
    /// What pods may use; `None` admits everything.
    pub allocatable: Option<Allocatable>,
    /// The node's pressure conditions (from the eviction manager); new pods are refused under
    /// memory or disk pressure as upstream.
    pub pressure: Option<watch::Receiver<Pressure>>,
    /// The CPU, memory and device managers, which admission gives pods their share of.
    pub resources: Option<Arc<crate::cm::Resources>>,
    /// The sources configured: the directories of pods none of them wants are removed only
    /// once each has delivered its pods.
    pub sources: Vec<Source>,
    /// allowedUnsafeSysctls: the unsafe sysctls pods may ask for.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// The pods' statuses, for the pod counts: a pod that has run to its end is no longer
    /// active. Without them no pod counts as finished.
    pub statuses: Option<crate::status::Reader>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            tick: Duration::from_secs(1),
            housekeeping: Duration::from_secs(2),
            resync: Duration::from_secs(60),
            allocatable: None,
            pressure: None,
            resources: None,
            sources: Vec::new(),
            allowed_unsafe_sysctls: Vec::new(),
            statuses: None,
        }
    }
}

/// The pods the sources want, and which sources have delivered their first snapshot.
#[derive(Clone, Debug, Default)]
pub struct Desired {
    pub pods: Vec<Arc<Pod>>,
    pub ready: Vec<Source>,
    /// Full names of pods still being terminated: their mirror pods stay until they are gone.
    pub terminating: Vec<String>,
}

/// What an admitted pod holds of the node (upstream's allocation).
struct Admitted {
    requests: Requests,
    /// Its containers' resources; a resize changes them once it fits.
    allocation: resize::Allocation,
    /// Why the spec's newer resources wait, while they do.
    pending: Option<String>,
}

/// The loop's state.
pub struct SyncLoop<S> {
    config: Config,
    mux: Mux,
    /// The ConfigMaps and Secrets the sources offer; pods read them through readers.
    objects: objects::Writer,
    workers: PodWorkers<S>,
    syncer: Arc<S>,
    next_resync: HashMap<PodUid, Instant>,
    /// Full names of pods being terminated: a new pod with the same name (an edited static pod)
    /// starts only once the old one is gone, so both never hold the same ports or files.
    terminating_names: HashMap<String, PodUid>,
    heartbeat: watch::Sender<Instant>,
    done: mpsc::UnboundedReceiver<PodUid>,
    /// The pods admitted to run, with what they were admitted (or last resized) with.
    admitted: HashMap<PodUid, Admitted>,
    /// When each admitted pod was admitted: its activeDeadlineSeconds count from there.
    started: HashMap<PodUid, Instant>,
    /// Pods admission refused (or the eviction manager evicted); they stay refused until they
    /// leave their source.
    rejected: HashSet<PodUid>,
    /// Pods being stopped to fail (evicted, or past their active deadline), with the reason
    /// and message their status will carry.
    evicted: HashMap<PodUid, (Arc<Pod>, &'static str, String)>,
    evictions: (mpsc::Sender<Eviction>, mpsc::Receiver<Eviction>),
    debugs: (mpsc::Sender<Debug>, mpsc::Receiver<Debug>),
    shutdowns: (mpsc::Sender<Shutdown>, mpsc::Receiver<Shutdown>),
    /// The graceful node shutdown under way: new pods are refused.
    shutdown: Option<Stopping>,
    /// Ephemeral containers added to static pods (`nodelet debug`), by pod; they go with the pod.
    ephemeral: HashMap<PodUid, Vec<EphemeralContainer>>,
    /// Becomes true once the sources' first pods are handled (the eviction manager waits).
    ready: watch::Sender<bool>,
    /// The desired pods after every snapshot (the mirror pod manager reads them).
    desired: watch::Sender<Desired>,
    tracker: TaskTracker,
}

impl<S: PodSyncer> SyncLoop<S> {
    /// A loop driving `syncer`; its workers are spawned on `tracker` and stop on `cancel`.
    pub fn new(
        config: Config,
        syncer: Arc<S>,
        objects: objects::Writer,
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let (done_tx, done) = mpsc::unbounded_channel();
        SyncLoop {
            config,
            mux: Mux::default(),
            objects,
            workers: PodWorkers::new(syncer.clone(), done_tx, tracker.clone(), cancel),
            admitted: HashMap::new(),
            started: HashMap::new(),
            rejected: Default::default(),
            evicted: HashMap::new(),
            evictions: mpsc::channel(4),
            debugs: mpsc::channel(4),
            shutdowns: mpsc::channel(1),
            shutdown: None,
            ephemeral: HashMap::new(),
            ready: watch::channel(false).0,
            desired: watch::channel(Desired::default()).0,
            tracker,
            syncer,
            next_resync: HashMap::new(),
            terminating_names: HashMap::new(),
            heartbeat: watch::channel(Instant::now()).0,
            done,
        }
    }

    /// Where `nodelet debug` sends its ephemeral containers.
    pub fn debugger(&self) -> mpsc::Sender<Debug> {
        self.debugs.0.clone()
    }

    /// Adds an ephemeral container to a static pod, as the API server's `ephemeralcontainers`
    /// subresource does for API pods (whose own must go through it), and syncs the pod.
    fn debug(&mut self, d: Debug) {
        let Debug {
            namespace,
            pod: name,
            container,
            reply,
        } = d;
        let found = self
            .mux
            .desired()
            .find(|p| {
                crate::types::namespace(p) == namespace
                    && p.metadata.name.as_deref() == Some(name.as_str())
            })
            .cloned();
        let result = match found {
            None => Err(format!("pod {namespace}/{name} not found")),
            Some(pod) => {
                let uid = PodUid::of(&pod);
                let mine = self.ephemeral.get(&uid).map(Vec::as_slice).unwrap_or(&[]);
                match debug_refusal(&pod, mine, &container) {
                    Some(why) => Err(why),
                    None => {
                        tracing::info!(pod = %full_name(&pod), container = %container.name, "ephemeral container added");
                        self.ephemeral.entry(uid).or_default().push(container);
                        self.dispatch(&[pod], false);
                        Ok(())
                    }
                }
            }
        };
        let _ = reply.send(result);
    }

    /// The pod with the ephemeral containers `nodelet debug` added to it.
    fn with_ephemeral(&self, pod: Arc<Pod>) -> Arc<Pod> {
        let Some(added) = self.ephemeral.get(&PodUid::of(&pod)) else {
            return pod;
        };
        let mut out = (*pod).clone();
        if let Some(spec) = out.spec.as_mut() {
            spec.ephemeral_containers
                .get_or_insert_default()
                .extend(added.iter().cloned());
        }
        Arc::new(out)
    }

    /// Where a graceful node shutdown is asked for.
    pub fn shutdown_handle(&self) -> mpsc::Sender<Shutdown> {
        self.shutdowns.0.clone()
    }

    /// Begins a graceful node shutdown: from now on no pod is admitted, and the running ones
    /// stop stage by stage (lowest priority first).
    fn begin_shutdown(&mut self, request: Shutdown) {
        if self.shutdown.is_some() {
            return;
        }
        let running: Vec<Arc<Pod>> = self
            .mux
            .desired()
            .filter(|p| {
                let uid = PodUid::of(p);
                self.admitted.contains_key(&uid) && !self.rejected.contains(&uid)
            })
            .cloned()
            .collect();
        let budget = crate::shutdown::budget(&request.stages);
        let stages = crate::shutdown::plan(&request.stages, running);
        tracing::info!(
            stages = stages.len(),
            pods = stages.iter().map(|s| s.pods.len()).sum::<usize>(),
            "node shutdown: stopping pods, lowest priority first"
        );
        self.shutdown = Some(Stopping {
            progress: crate::shutdown::Progress::new(stages, budget, Instant::now().into()),
            statuses: Vec::new(),
            done: Some(request.done),
        });
        self.advance_shutdown();
    }

    /// Moves the node shutdown on (see [`crate::shutdown::Progress::advance`]): stops the next
    /// stage's pods, records the final status of those still stopping when their stage's time
    /// is up, and once the shutdown ends, answers when every final status is recorded.
    fn advance_shutdown(&mut self) {
        let Some(mut stopping) = self.shutdown.take() else {
            return;
        };
        let step = stopping
            .progress
            .advance(Instant::now().into(), |pod, grace| {
                let message = crate::shutdown::MESSAGE.to_string();
                self.fail(
                    PodUid::of(pod),
                    crate::shutdown::REASON,
                    message,
                    Some(grace),
                )
            });
        for pod in step.overdue {
            let syncer = self.syncer.clone();
            stopping.statuses.push(self.tracker.spawn(async move {
                let (reason, message) = (crate::shutdown::REASON, crate::shutdown::MESSAGE);
                syncer.reject_pod(pod, reason, message).await
            }));
        }
        if step.finished
            && let Some(done) = stopping.done.take()
        {
            let statuses = std::mem::take(&mut stopping.statuses);
            let left = stopping.progress.still_stopping();
            self.tracker.spawn(async move {
                for status in statuses {
                    let _ = status.await;
                }
                tracing::info!(still_stopping = left, "node shutdown: the pods are stopped");
                let _ = done.send(());
            });
        }
        self.shutdown = Some(stopping);
    }

    /// What the eviction manager needs: where to send evictions, and when to start.
    pub fn eviction_handles(&self) -> (mpsc::Sender<Eviction>, watch::Receiver<bool>) {
        (self.evictions.0.clone(), self.ready.subscribe())
    }

    /// A handle that sees the desired pods after every snapshot.
    pub fn desired(&self) -> watch::Receiver<Desired> {
        self.desired.subscribe()
    }

    /// A handle that sees the time of the loop's last iteration, for health checks.
    pub fn heartbeat(&self) -> watch::Receiver<Instant> {
        self.heartbeat.subscribe()
    }

    fn schedule_resync(&mut self, uid: PodUid) {
        let base = self.config.resync;
        let jitter = base.mul_f64(crate::backoff::random_unit() * 0.5);
        self.next_resync.insert(uid, Instant::now() + base + jitter);
    }

    /// Upstream's admission: a pod that does not fit what is left of allocatable (by requests)
    /// or beyond --max-pods does not run, nor any new pod while the node shuts down.
    /// `Some((reason, message))` when refused.
    fn admit(&mut self, pod: &Pod) -> Option<Refusal> {
        let uid = PodUid::of(pod);
        if self.admitted.contains_key(&uid) {
            return None;
        }
        if self.shutdown.is_some() {
            let message = crate::shutdown::REFUSED_MESSAGE.to_string();
            return Some((crate::shutdown::REFUSED_REASON.into(), message));
        }
        let refusal = self.admission_refusal(pod)?;
        Some((refusal.0, format!("Pod was rejected: {}", refusal.1)))
    }

    /// Upstream's admit handlers' refusals (`None`: admitted, and the pod's share recorded).
    fn admission_refusal(&mut self, pod: &Pod) -> Option<Refusal> {
        let uid = PodUid::of(pod);
        if let Some((reason, message)) = os_refusal(pod) {
            return Some((reason.into(), message));
        }
        if needs_apparmor(pod) && !host_has_apparmor() {
            return Some((
                "AppArmor".into(),
                "Cannot enforce AppArmor: AppArmor is not enabled on the host".into(),
            ));
        }
        if let Some((reason, message)) = sysctl_refusal(pod, &self.config.allowed_unsafe_sysctls) {
            return Some((reason.into(), message));
        }
        let wanted = requests(pod);
        if let Some(message) = self
            .config
            .pressure
            .as_ref()
            .and_then(|p| p.borrow().refuses(pod))
        {
            return Some(("Evicted".into(), message));
        }
        if let Some(a) = self.config.allocatable {
            let used = |f: fn(&Requests) -> f64| {
                self.admitted.values().map(|p| f(&p.requests)).sum::<f64>()
            };
            let count = self.admitted.len() as f64;
            let refusal = [
                exceeds("OutOfpods", "pods", 1.0, count, f64::from(a.pods), false),
                exceeds("OutOfcpu", "cpu", wanted.cpu, used(|r| r.cpu), a.cpu, true),
                exceeds(
                    "OutOfmemory",
                    "memory",
                    wanted.memory,
                    used(|r| r.memory),
                    a.memory,
                    false,
                ),
                exceeds(
                    "OutOfephemeral-storage",
                    "ephemeral-storage",
                    wanted.ephemeral_storage,
                    used(|r| r.ephemeral_storage),
                    a.ephemeral_storage,
                    false,
                ),
            ];
            if let Some((reason, message)) = refusal.into_iter().flatten().next() {
                return Some((reason.into(), message));
            }
        }
        if let Some(Err(refusal)) = self.config.resources.as_ref().map(|r| r.admit(pod)) {
            return Some(refusal);
        }
        self.started.insert(uid.clone(), Instant::now());
        self.admitted.insert(
            uid,
            Admitted {
                requests: wanted,
                allocation: resize::allocation(pod),
                pending: None,
            },
        );
        None
    }

    /// Tells the mirror pod manager what the sources want and which pods still terminate.
    fn publish_desired(&self) {
        self.desired.send_replace(Desired {
            pods: self.mux.desired().cloned().collect(),
            ready: [Source::File, Source::Http, Source::Api]
                .into_iter()
                .filter(|s| self.mux.is_ready(*s))
                .collect(),
            terminating: self.terminating_names.keys().cloned().collect(),
        });
    }

    /// Upstream's resize admission: an admitted pod whose spec asks for other resources gets
    /// them once they fit beside the other pods' allocations. Until then it runs with the ones
    /// it has, and says why (PodResizePending, Deferred). Returns the pod to sync.
    fn allocate(&mut self, pod: &Arc<Pod>) -> Arc<Pod> {
        let uid = PodUid::of(pod);
        let Some(mine) = self.admitted.get(&uid) else {
            return pod.clone();
        };
        if resize::matches(pod, &mine.allocation) {
            if let Some(p) = self.admitted.get_mut(&uid) {
                p.pending = None;
            }
            return pod.clone();
        }
        let wanted = requests(pod);
        let refusal = self.config.allocatable.and_then(|a| {
            let used = |f: fn(&Requests) -> f64| {
                self.admitted
                    .iter()
                    .filter(|(u, _)| **u != uid)
                    .map(|(_, p)| f(&p.requests))
                    .sum::<f64>()
            };
            [
                exceeds("", "cpu", wanted.cpu, used(|r| r.cpu), a.cpu, true),
                exceeds(
                    "",
                    "memory",
                    wanted.memory,
                    used(|r| r.memory),
                    a.memory,
                    false,
                ),
            ]
            .into_iter()
            .flatten()
            .next()
        });
        let Some(mine) = self.admitted.get_mut(&uid) else {
            return pod.clone();
        };
        match refusal {
            None => {
                tracing::info!(pod = %full_name(pod), "resize admitted");
                mine.requests = wanted;
                mine.allocation = resize::allocation(pod);
                mine.pending = None;
                pod.clone()
            }
            Some((_, message)) => {
                if mine.pending.as_deref() != Some(message.as_str()) {
                    tracing::warn!(pod = %full_name(pod), "resize deferred: {message}");
                }
                let held = Arc::new(resize::with_allocation(pod, &mine.allocation, &message));
                mine.pending = Some(message);
                held
            }
        }
    }

    fn dispatch(&mut self, pods: &[Arc<Pod>], terminate: bool) {
        for pod in pods {
            let uid = PodUid::of(pod);
            let name = full_name(pod);
            if !terminate && self.rejected.contains(&uid) {
                continue;
            }
            // A pod being deleted that has no worker (it arrived deleted, after a restart, or
            // its worker finished) is terminated, once: whatever it left on the node goes, with
            // its grace period, before its API object may be deleted.
            if !terminate
                && !self.workers.contains(&uid)
                && pod.metadata.deletion_timestamp.is_some()
            {
                if self.rejected.insert(uid.clone()) {
                    self.admitted.remove(&uid);
                    self.next_resync.remove(&uid);
                    if self.workers.update(Work::Terminate(pod.clone())) {
                        self.terminating_names.insert(name, uid);
                    }
                }
                continue;
            }
            // A pod the API already records as finished (it ran here before a restart, or
            // elsewhere) never starts again; it stays as it is until it leaves its source.
            if !terminate && !self.workers.contains(&uid) && is_finished(pod) {
                self.rejected.insert(uid);
                continue;
            }
            if !terminate
                && !self.workers.contains(&uid)
                && let Some((reason, message)) = self.admit(pod)
            {
                self.rejected.insert(uid);
                let syncer = self.syncer.clone();
                let pod = pod.clone();
                self.tracker
                    .spawn(async move { syncer.reject_pod(pod, &reason, &message).await });
                continue;
            }
            if terminate {
                self.admitted.remove(&uid);
                self.ephemeral.remove(&uid);
                if self.rejected.remove(&uid) {
                    let syncer = self.syncer.clone();
                    let pod = pod.clone();
                    self.tracker
                        .spawn(async move { syncer.forget_pod(pod).await });
                    continue;
                }
                self.next_resync.remove(&uid);
                if self.workers.update(Work::Terminate(pod.clone())) {
                    self.terminating_names.insert(name, uid);
                }
            } else if self
                .terminating_names
                .get(&name)
                .is_some_and(|old| *old != uid)
            {
                tracing::debug!(pod = %name, "waiting for the previous pod of this name to terminate");
            } else {
                let allocated = self.allocate(pod);
                let allocated = self.with_ephemeral(allocated);
                if self.workers.update(Work::Sync(allocated)) {
                    self.schedule_resync(uid);
                } else {
                    tracing::debug!(pod = %full_name(pod), "pod is still terminating; it starts again once that is done");
                }
            }
        }
    }

    /// Objects first, so pods arriving with their ConfigMaps in one file find them. A changed
    /// object never restarts a pod: the pods that use it are synced, which refreshes their
    /// volumes and starts containers that were waiting for it.
    fn handle_snapshot(&mut self, mut snapshot: SourceSnapshot) {
        let objects = std::mem::take(&mut snapshot.objects);
        objects::admit_overhead(&mut snapshot.pods, &objects);
        let changed = self.objects.replace(snapshot.source, objects);
        for update in self.mux.merge(snapshot) {
            let pods = || update.pods.iter().map(|p| full_name(p)).collect::<Vec<_>>();
            // Only the API's copy of the status changed (mostly our own status writes coming
            // back): the pods keep running as they are, as upstream's reconcile leaves them.
            if update.op == PodOperation::Reconcile {
                tracing::debug!(source = %update.source, pods = ?pods(), "pod status changed in the source");
                // Pods with readiness gates are synced: others set the gates' conditions.
                let gated: Vec<Arc<Pod>> = update
                    .pods
                    .iter()
                    .filter(|p| {
                        p.spec
                            .as_ref()
                            .and_then(|s| s.readiness_gates.as_ref())
                            .is_some_and(|g| !g.is_empty())
                    })
                    .cloned()
                    .collect();
                self.dispatch(&gated, false);
                continue;
            }
            tracing::info!(op = ?update.op, source = %update.source, pods = ?pods(), "pod update");
            let terminate = matches!(update.op, PodOperation::Remove | PodOperation::Delete);
            self.dispatch(&update.pods, terminate);
        }
        // The pods are admitted before any pressure is observed.
        self.ready.send_replace(true);
        self.publish_desired();
        if changed.is_empty() {
            return;
        }
        tracing::info!(objects = ?changed.iter().map(|(k, ns, n)| format!("{k} {ns}/{n}")).collect::<Vec<_>>(), "objects changed");
        let users: Vec<PodUid> = self
            .mux
            .desired()
            .filter(|p| {
                objects::references(p)
                    .iter()
                    .any(|key| changed.contains(key))
            })
            .map(|p| PodUid::of(p))
            .collect();
        for uid in users {
            self.handle_event(&uid, EventKind::Changed);
        }
    }

    fn resync_due(&mut self) {
        let now = Instant::now();
        self.enforce_active_deadlines(now);
        let due: Vec<Arc<Pod>> = self
            .mux
            .desired()
            .filter(|p| {
                self.next_resync
                    .get(&PodUid::of(p))
                    .is_none_or(|t| *t <= now)
            })
            .cloned()
            .collect();
        self.dispatch(&due, false);
    }

    /// Terminates pods the runtime holds for this node that no source wants, once their source
    /// is ready (so a slow source never gets its pods killed, and never blocks another source);
    /// gives back what pods no longer on the node held of the CPUs, memory and devices; and,
    /// once every source is ready, removes what pods the node no longer has left on disk. The
    /// sweep is awaited: no pod is dispatched while it decides what is an orphan.
    async fn housekeeping(&mut self) {
        // Deferred resizes are tried again: other pods may have left or shrunk.
        let deferred: Vec<Arc<Pod>> = self
            .mux
            .desired()
            .filter(|p| {
                self.admitted
                    .get(&PodUid::of(p))
                    .is_some_and(|a| a.pending.is_some())
            })
            .cloned()
            .collect();
        self.dispatch(&deferred, false);
        let admitted: Vec<Arc<Pod>> = self
            .mux
            .desired()
            .filter(|p| self.admitted.contains_key(&PodUid::of(p)))
            .cloned()
            .collect();
        self.syncer.housekeep(admitted).await;
        let running = match self.syncer.runtime_pods().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "housekeeping cannot list the runtime's pods");
                self.record_pod_counts();
                return;
            }
        };
        let desired: HashSet<PodUid> = self.mux.desired().map(|p| PodUid::of(p)).collect();
        // A pod neither admitted nor left in the runtime has no CPUs or devices to keep (an
        // ending pod's are given back once its containers are stopped).
        let held: HashSet<PodUid> = running
            .iter()
            .map(|p| p.uid.clone())
            .chain(self.admitted.keys().cloned())
            .collect();
        if let Some(resources) = &self.config.resources {
            resources.retain(&held.iter().map(|uid| uid.0.clone()).collect());
        }
        // Directories are only known to be orphans once every source has said what it wants.
        if self.config.sources.iter().all(|s| self.mux.is_ready(*s)) {
            let workers = self.workers.census().map(|(uid, ..)| uid.clone());
            let keep = held.iter().cloned().chain(desired.iter().cloned());
            self.syncer
                .clean_orphans(keep.chain(workers).collect())
                .await;
        }
        for pod in running {
            if desired.contains(&pod.uid) || self.workers.contains(&pod.uid) {
                continue;
            }
            let source = pod
                .annotations
                .get(ANNOTATION_CONFIG_SOURCE)
                .and_then(|s| Source::parse(s));
            if source.is_some_and(|s| !self.mux.is_ready(s)) {
                continue;
            }
            tracing::info!(pod = %pod.full_name(), uid = %pod.uid, "terminating pod that no source wants");
            crate::metrics::get().orphaned_runtime_pod();
            self.terminate_runtime_pod(pod);
        }
        self.record_pod_counts();
    }

    /// The pod counts upstream takes at housekeeping: the pods the sources want; those of them
    /// admitted, or still being terminated, that have not run to their end (active); and the
    /// pod workers by lifecycle (a worker whose pod ran to its end counts as terminated), by
    /// whether a source still wants their pod (desired), no longer does (orphan) or never did
    /// (runtime_only), and by whether it is static.
    fn record_pod_counts(&self) {
        let is_static = |p: &Pod| crate::pod::source(p) != Some(Source::Api);
        let split = |pods: Vec<&Arc<Pod>>| {
            let statics = pods.iter().filter(|p| is_static(p)).count();
            (pods.len() - statics, statics)
        };
        let desired: Vec<&Arc<Pod>> = self.mux.desired().collect();
        let desired_uids: HashSet<PodUid> = desired.iter().map(|p| PodUid::of(p)).collect();
        let active = desired
            .iter()
            .copied()
            .filter(|p| {
                let uid = PodUid::of(p);
                (self.admitted.contains_key(&uid) || self.workers.is_terminating(&uid))
                    && !self.finished(&uid)
            })
            .collect();
        let ephemeral_containers = desired
            .iter()
            .filter_map(|p| p.spec.as_ref()?.ephemeral_containers.as_ref())
            .map(Vec::len)
            .sum();
        let resizing = |uid: &PodUid| {
            self.last_status(uid).is_some_and(|p| {
                let conditions = p.status.as_ref().and_then(|st| st.conditions.as_ref());
                conditions
                    .into_iter()
                    .flatten()
                    .any(|c| c.type_ == "PodResizeInProgress" && c.status == "True")
            })
        };
        let in_progress_resizes = desired_uids.iter().filter(|uid| resizing(uid)).count();
        crate::metrics::get().set_pod_counts(&crate::metrics::PodCounts {
            desired: split(desired),
            active: split(active),
            working: self.working_pods(&desired_uids),
            ephemeral_containers,
            in_progress_resizes,
        });
    }

    /// The pod workers by upstream's (lifecycle, config, static) labels, every combination
    /// present.
    fn working_pods(
        &self,
        desired: &HashSet<PodUid>,
    ) -> std::collections::BTreeMap<(&'static str, &'static str, &'static str), usize> {
        let mut working = std::collections::BTreeMap::new();
        for lifecycle in ["sync", "terminating", "terminated"] {
            for (config, statics) in [
                ("desired", "true"),
                ("desired", ""),
                ("orphan", "true"),
                ("orphan", ""),
                ("runtime_only", "unknown"),
            ] {
                working.insert((lifecycle, config, statics), 0);
            }
        }
        for (uid, terminating, statics) in self.workers.census() {
            let lifecycle = if terminating {
                "terminating"
            } else if self.finished(uid) {
                "terminated"
            } else {
                "sync"
            };
            let key = match statics {
                None => (lifecycle, "runtime_only", "unknown"),
                Some(s) => (
                    lifecycle,
                    if desired.contains(uid) {
                        "desired"
                    } else {
                        "orphan"
                    },
                    if s { "true" } else { "" },
                ),
            };
            *working.entry(key).or_default() += 1;
        }
        working
    }

    /// The pod as its last status has it, when the loop is given the statuses.
    fn last_status(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        Some(self.config.statuses.as_ref()?.get(uid)?.pod)
    }

    /// Whether the pod has run to its end (Succeeded or Failed).
    fn finished(&self, uid: &PodUid) -> bool {
        self.last_status(uid).is_some_and(|p| {
            let phase = p.status.as_ref().and_then(|st| st.phase.as_deref());
            matches!(phase, Some("Succeeded" | "Failed"))
        })
    }

    /// Hands a pod only the runtime has to a worker to terminate; whatever the loop knew of
    /// its UID goes.
    fn terminate_runtime_pod(&mut self, pod: RuntimePod) {
        let uid = pod.uid.clone();
        self.admitted.remove(&uid);
        self.ephemeral.remove(&uid);
        self.rejected.remove(&uid);
        self.next_resync.remove(&uid);
        let name = pod.full_name();
        if self.workers.update(Work::TerminateRuntime(Arc::new(pod))) {
            self.terminating_names.insert(name, uid);
        }
    }

    /// Stops an evicted pod (with upstream's 1 s grace for hard evictions) and keeps it from
    /// running again; once it is down its status becomes Failed / Evicted.
    fn evict(&mut self, eviction: Eviction) {
        let grace = Some(EVICTION_GRACE_SECONDS);
        self.fail(eviction.uid, "Evicted", eviction.message, grace);
    }

    /// Fails the admitted pods that have been active longer than their activeDeadlineSeconds
    /// (which an update may shorten), with their own grace period, as upstream.
    fn enforce_active_deadlines(&mut self, now: Instant) {
        self.started
            .retain(|uid, _| self.admitted.contains_key(uid));
        let expired: Vec<PodUid> = self
            .mux
            .desired()
            .filter_map(|p| {
                let uid = PodUid::of(p);
                let deadline = crate::pod::spec(p).active_deadline_seconds?;
                let started = self.started.get(&uid)?;
                let limit = Duration::from_secs(u64::try_from(deadline).unwrap_or(0));
                (now.duration_since(*started) >= limit).then_some(uid)
            })
            .collect();
        for uid in expired {
            let message = "Pod was active on the node longer than the specified deadline";
            self.fail(uid, "DeadlineExceeded", message.into(), None);
        }
    }

    /// Stops a pod (with `grace` in place of its own grace period, if given) and keeps it from
    /// running again; once it is down its status becomes Failed with `reason` and `message`.
    /// False when the pod is not running here (gone, or already refused or failed).
    fn fail(
        &mut self,
        uid: PodUid,
        reason: &'static str,
        message: String,
        grace: Option<i64>,
    ) -> bool {
        let Some(pod) = self.mux.desired().find(|p| PodUid::of(p) == uid).cloned() else {
            return false;
        };
        if !self.rejected.insert(uid.clone()) {
            return false;
        }
        tracing::warn!(pod = %full_name(&pod), reason, "stopping pod: {message}");
        self.admitted.remove(&uid);
        self.next_resync.remove(&uid);
        let mut doomed = (*pod).clone();
        if let (Some(spec), Some(grace)) = (doomed.spec.as_mut(), grace) {
            spec.termination_grace_period_seconds = Some(grace);
        }
        // The pod leaves the node for good, as a deleted one does: its termination records the
        // final status of its stopped containers.
        doomed.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(crate::types::now()),
        );
        self.evicted.insert(uid, (pod, reason, message));
        self.workers.update(Work::Terminate(Arc::new(doomed)));
        true
    }

    /// A lifecycle event or a probe result wakes the pod's worker at once instead of at its
    /// next resync.
    fn handle_event(&mut self, uid: &PodUid, kind: EventKind) {
        if kind == EventKind::Removed || self.workers.is_terminating(uid) {
            return;
        }
        let pod = self.mux.desired().find(|p| PodUid::of(p) == *uid).cloned();
        if let Some(pod) = pod {
            self.dispatch(&[pod], false);
        }
    }

    /// Runs until `cancel`.
    pub async fn run(
        mut self,
        mut snapshots: mpsc::Receiver<SourceSnapshot>,
        wakes: Wakes,
        cancel: CancellationToken,
    ) {
        let (mut events, mut probes, mut health) = wakes;
        let mut tick = tokio::time::interval(self.config.tick);
        let mut housekeeping = tokio::time::interval(self.config.housekeeping);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let shutdown_deadline = self
                .shutdown
                .as_ref()
                .and_then(|s| s.progress.deadline())
                .map(Instant::from_std);
            tokio::select! {
                _ = cancel.cancelled() => return,
                // With no (more) sources the loop still reaps workers, resyncs and keeps house.
                Some(snapshot) = snapshots.recv() => self.handle_snapshot(snapshot),
                Some(uid) = self.done.recv() => {
                    self.workers.forget(&uid);
                    // A deleted pod whose termination finished stays done until it leaves.
                    if self
                        .mux
                        .desired()
                        .any(|p| PodUid::of(p) == uid && p.metadata.deletion_timestamp.is_some())
                    {
                        self.rejected.insert(uid.clone());
                    }
                    if let Some((pod, reason, message)) = self.evicted.remove(&uid) {
                        let syncer = self.syncer.clone();
                        let recorded = self.tracker.spawn(async move {
                            syncer.reject_pod(pod, reason, &message).await
                        });
                        if let Some(stopping) = self.shutdown.as_mut()
                            && stopping.progress.down(&uid)
                        {
                            stopping.statuses.push(recorded);
                            self.advance_shutdown();
                        }
                    }
                    self.terminating_names.retain(|_, old| *old != uid);
                    // A pod re-added with the same UID while it was terminating restarts now
                    // (upstream's count: the common case for static pods).
                    if let Some(again) = self.mux.desired().find(|p| PodUid::of(p) == uid) {
                        let statics = crate::pod::source(again) != Some(Source::Api);
                        crate::metrics::get().pod_restarted(statics);
                    }
                    // Pods that waited for this one (same UID re-added, or same name) start now.
                    let again: Vec<Arc<Pod>> = self
                        .mux
                        .desired()
                        .filter(|p| !self.workers.contains(&PodUid::of(p)))
                        .cloned()
                        .collect();
                    self.dispatch(&again, false);
                    self.publish_desired();
                }
                Some(event) = events.recv() => self.handle_event(&event.uid, event.kind),
                Some(eviction) = self.evictions.1.recv() => self.evict(eviction),
                Some(debug) = self.debugs.1.recv() => self.debug(debug),
                Some(request) = self.shutdowns.1.recv() => self.begin_shutdown(request),
                _ = tokio::time::sleep_until(shutdown_deadline.unwrap_or_else(Instant::now)),
                    if shutdown_deadline.is_some() => {
                    tracing::warn!("node shutdown: time is up with pods still stopping");
                    self.advance_shutdown();
                }
                Some(update) = probes.recv() => {
                    tracing::debug!(?update, "probe result changed");
                    self.handle_event(&update.uid, EventKind::Changed);
                }
                Some(uid) = health.recv() => {
                    tracing::debug!(pod = %uid.0, "the health of the pod's devices changed");
                    self.handle_event(&uid, EventKind::Changed);
                }
                _ = tick.tick() => self.resync_due(),
                _ = housekeeping.tick() => self.housekeeping().await,
            }
            self.heartbeat.send_replace(Instant::now());
        }
    }
}

/// What wakes a pod's worker besides its sources: the PLEG's lifecycle events, probe results
/// that changed, and the pods whose devices' health changed.
pub type Wakes = (
    mpsc::Receiver<Event>,
    mpsc::UnboundedReceiver<probe::Update>,
    mpsc::UnboundedReceiver<PodUid>,
);

/// A request for a graceful node shutdown.
pub struct Shutdown {
    /// The stages, as configured (see [`crate::config::Config::shutdown_stages`]).
    pub stages: Vec<crate::config::ShutdownStage>,
    /// Answered once every stage has ended and every stopped pod's final status is recorded.
    pub done: tokio::sync::oneshot::Sender<()>,
}

/// A graceful node shutdown under way.
struct Stopping {
    progress: crate::shutdown::Progress,
    /// The tasks recording the stopped pods' final statuses.
    statuses: Vec<tokio::task::JoinHandle<()>>,
    done: Option<tokio::sync::oneshot::Sender<()>>,
}

/// A request to add an ephemeral container to a static pod (`nodelet debug`).
pub struct Debug {
    pub namespace: String,
    pub pod: String,
    pub container: EphemeralContainer,
    /// The refusal, naming what is wrong, or `Ok` once the pod is syncing with the container.
    pub reply: tokio::sync::oneshot::Sender<Result<(), String>>,
}

/// Why an ephemeral container cannot be added to the pod (`added`: those added before), as the
/// API server's validation would say.
fn debug_refusal(
    pod: &Pod,
    added: &[EphemeralContainer],
    c: &EphemeralContainer,
) -> Option<String> {
    let full = full_name(pod);
    let from_api = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_CONFIG_SOURCE))
        .is_some_and(|s| s == "api");
    if from_api {
        return Some(format!(
            "pod {full} comes from the API server: add its ephemeral containers there (kubectl debug)"
        ));
    }
    if c.name.is_empty() || !crate::pod::is_dns1123_label(&c.name) {
        return Some(format!(
            "ephemeral container name {:?} must be a DNS-1123 label",
            c.name
        ));
    }
    if c.image.as_deref().unwrap_or_default().is_empty() {
        return Some("ephemeral container needs an image".into());
    }
    let s = crate::pod::spec(pod);
    let names: Vec<&str> = crate::pod::all_containers(s)
        .map(|c| c.name.as_str())
        .chain(
            s.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| c.name.as_str()),
        )
        .chain(added.iter().map(|c| c.name.as_str()))
        .collect();
    if names.contains(&c.name.as_str()) {
        return Some(format!(
            "pod {full} already has a container named {:?}",
            c.name
        ));
    }
    if let Some(target) = c.target_container_name.as_deref()
        && !crate::pod::all_containers(s).any(|t| t.name == target)
    {
        return Some(format!("pod {full} has no container {target:?} to target"));
    }
    None
}

/// Is the pod's phase (as its source gives it) Succeeded or Failed?
fn is_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A syncer that records what it is asked; terminations wait while `kills` is closed.
    struct Fake {
        calls: Mutex<Vec<String>>,
        kills: watch::Sender<bool>,
        runtime: Mutex<Vec<RuntimePod>>,
    }

    fn name_uid(pod: &Pod) -> String {
        let name = pod.metadata.name.as_deref().unwrap_or("");
        format!("{name} {}", PodUid::of(pod).0)
    }

    impl Fake {
        fn record(&self, call: String) {
            self.calls.lock().unwrap().push(call);
        }

        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl PodSyncer for Fake {
        async fn sync_pod(&self, pod: Arc<Pod>) -> Result<Option<Duration>, String> {
            self.record(format!("sync {}", name_uid(&pod)));
            Ok(None)
        }
        async fn terminate_pod(&self, pod: Arc<Pod>) -> Result<(), String> {
            self.record(format!("kill {}", name_uid(&pod)));
            let mut open = self.kills.subscribe();
            let _ = open.wait_for(|open| *open).await;
            Ok(())
        }
        async fn reject_pod(&self, pod: Arc<Pod>, reason: &str, message: &str) {
            let name = pod.metadata.name.clone().unwrap_or_default();
            self.record(format!("reject {name} {reason}: {message}"));
        }
        async fn forget_pod(&self, _pod: Arc<Pod>) {}
        async fn housekeep(&self, _desired: Vec<Arc<Pod>>) {}
        async fn runtime_pods(&self) -> Result<Vec<RuntimePod>, String> {
            Ok(self.runtime.lock().unwrap().clone())
        }
        async fn clean_orphans(&self, keep: HashSet<PodUid>) {
            let mut kept: Vec<String> = keep.into_iter().map(|uid| uid.0).collect();
            kept.sort();
            self.record(format!("clean orphans but {}", kept.join(",")));
        }
        async fn terminate_runtime_pod(&self, pod: Arc<RuntimePod>) -> Result<(), String> {
            self.record(format!("kill {} {}", pod.name, pod.uid));
            Ok(())
        }
    }

    /// A running loop over a fake syncer, and its inputs.
    struct Bed {
        fake: Arc<Fake>,
        snapshots: mpsc::Sender<SourceSnapshot>,
        evictions: mpsc::Sender<Eviction>,
        cancel: CancellationToken,
    }

    impl Bed {
        fn start(config: Config) -> Bed {
            let fake = Arc::new(Fake {
                calls: Mutex::default(),
                kills: watch::channel(true).0,
                runtime: Mutex::default(),
            });
            let (objects, _) = objects::store(false, crate::service_links::Store::standalone());
            let cancel = CancellationToken::new();
            let sync_loop = SyncLoop::new(
                config,
                fake.clone(),
                objects,
                TaskTracker::new(),
                cancel.clone(),
            );
            let (evictions, _) = sync_loop.eviction_handles();
            let (snapshots, rx) = mpsc::channel(8);
            let (_, events) = mpsc::channel(1);
            let (_, probes) = mpsc::unbounded_channel();
            let (_, health) = mpsc::unbounded_channel();
            tokio::spawn(sync_loop.run(rx, (events, probes, health), cancel.clone()));
            Bed {
                fake,
                snapshots,
                evictions,
                cancel,
            }
        }

        async fn send(&self, source: Source, pods: Vec<Pod>) {
            let snapshot = SourceSnapshot {
                source,
                pods: pods.into_iter().map(Arc::new).collect(),
                objects: Vec::new(),
            };
            self.snapshots.send(snapshot).await.unwrap();
        }

        /// Waits (in paused time) until a call starting with `prefix` was made; its index.
        async fn until(&self, prefix: &str) -> usize {
            for _ in 0..1000 {
                if let Some(i) = self.fake.calls().iter().position(|c| c.starts_with(prefix)) {
                    return i;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("no call {prefix:?} in {:?}", self.fake.calls());
        }

        /// Lets `secs` of paused time pass with the loop running.
        async fn idle(&self, secs: u64) {
            tokio::time::sleep(Duration::from_secs(secs)).await;
        }

        fn made(&self, prefix: &str) -> bool {
            self.fake.calls().iter().any(|c| c.starts_with(prefix))
        }
    }

    impl Drop for Bed {
        fn drop(&mut self) {
            self.cancel.cancel();
        }
    }

    /// A pod of `source` asking for `cpu` cores, created at `created` (seconds).
    fn pod(name: &str, uid: &str, source: Source, cpu: &str, created: i64) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "namespace": "default",
                "uid": uid,
                "creationTimestamp": k8s_openapi::jiff::Timestamp::from_second(created).unwrap().to_string(),
                "annotations": {ANNOTATION_CONFIG_SOURCE: source.as_str()},
            },
            "spec": {"containers": [{
                "name": "c",
                "image": "i",
                "resources": {"requests": {"cpu": cpu}},
            }]},
        }))
        .unwrap()
    }

    fn one_cpu() -> Config {
        Config {
            allocatable: Some(Allocatable {
                cpu: 1.0,
                memory: 1e9,
                ephemeral_storage: 1e12,
                pods: 110,
            }),
            ..Config::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_edited_pod_starts_only_after_the_old_one_is_gone() {
        let bed = Bed::start(Config::default());
        bed.send(Source::File, vec![pod("web", "u1", Source::File, "0", 1)])
            .await;
        bed.until("sync web u1").await;
        bed.fake.kills.send_replace(false);
        bed.send(Source::File, vec![pod("web", "u2", Source::File, "0", 2)])
            .await;
        let killed = bed.until("kill web u1").await;
        bed.idle(30).await;
        assert!(!bed.made("sync web u2"), "{:?}", bed.fake.calls());
        bed.fake.kills.send_replace(true);
        assert!(bed.until("sync web u2").await > killed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_pod_stays_refused() {
        let bed = Bed::start(one_cpu());
        let big = pod("big", "u1", Source::File, "2", 1);
        bed.send(Source::File, vec![big.clone()]).await;
        bed.until("reject big OutOfcpu: Pod was rejected: Node didn't have enough resource: cpu, requested: 2000, used: 0, capacity: 1000").await;
        let mut edited = big;
        edited.metadata.labels = Some([("edited".to_string(), "yes".to_string())].into());
        bed.send(Source::File, vec![edited]).await;
        bed.idle(120).await;
        assert!(!bed.made("sync big"), "{:?}", bed.fake.calls());
        let rejections = bed
            .fake
            .calls()
            .iter()
            .filter(|c| c.starts_with("reject big"))
            .count();
        assert_eq!(rejections, 1, "{:?}", bed.fake.calls());
    }

    #[tokio::test(start_paused = true)]
    async fn housekeeping_never_kills_pods_of_a_source_that_is_not_ready() {
        let bed = Bed::start(Config::default());
        let in_runtime = |name: &str, uid: &str, source: Source| RuntimePod {
            uid: PodUid(uid.into()),
            name: name.into(),
            namespace: "default".into(),
            annotations: [(ANNOTATION_CONFIG_SOURCE.to_string(), source.to_string())].into(),
        };
        *bed.fake.runtime.lock().unwrap() = vec![
            in_runtime("from-api", "u9", Source::Api),
            in_runtime("from-file", "u8", Source::File),
        ];
        bed.send(Source::File, Vec::new()).await;
        bed.until("kill from-file u8").await;
        bed.idle(30).await;
        assert!(!bed.made("kill from-api"), "{:?}", bed.fake.calls());
    }

    #[tokio::test(start_paused = true)]
    async fn orphaned_directories_are_cleaned_once_every_source_is_ready() {
        let bed = Bed::start(Config {
            sources: vec![Source::File, Source::Api],
            ..Config::default()
        });
        *bed.fake.runtime.lock().unwrap() = vec![RuntimePod {
            uid: PodUid("u9".into()),
            name: "ending".into(),
            namespace: "default".into(),
            annotations: [(ANNOTATION_CONFIG_SOURCE.to_string(), "api".to_string())].into(),
        }];
        bed.send(Source::File, vec![pod("web", "u1", Source::File, "0", 1)])
            .await;
        bed.until("sync web u1").await;
        bed.idle(10).await;
        assert!(!bed.made("clean orphans"), "{:?}", bed.fake.calls());
        bed.send(Source::Api, Vec::new()).await;
        // The desired pod and the pod the runtime still has are kept, from the first sweep on.
        let first = bed.until("clean orphans").await;
        assert_eq!(bed.fake.calls()[first], "clean orphans but u1,u9");
    }

    #[tokio::test(start_paused = true)]
    async fn an_evicted_pod_ends_failed_with_the_eviction_message() {
        let bed = Bed::start(Config::default());
        bed.send(
            Source::File,
            vec![pod("victim", "u1", Source::File, "0", 1)],
        )
        .await;
        bed.until("sync victim u1").await;
        let eviction = Eviction {
            uid: PodUid("u1".into()),
            message: "The node was low on resource: memory.".into(),
        };
        bed.evictions.send(eviction).await.unwrap();
        let killed = bed.until("kill victim u1").await;
        let failed = bed
            .until("reject victim Evicted: The node was low on resource: memory.")
            .await;
        assert!(failed > killed);
        bed.idle(120).await;
        let syncs = bed
            .fake
            .calls()
            .iter()
            .filter(|c| c.starts_with("sync victim"))
            .count();
        assert_eq!(syncs, 1, "never started again: {:?}", bed.fake.calls());
    }

    #[tokio::test(start_paused = true)]
    async fn pods_are_admitted_oldest_first() {
        let bed = Bed::start(one_cpu());
        bed.send(
            Source::File,
            vec![
                pod("young", "u2", Source::File, "1", 200),
                pod("old", "u1", Source::File, "1", 100),
            ],
        )
        .await;
        bed.until("sync old u1").await;
        bed.until("reject young OutOfcpu").await;
    }
}

//! Pod workers: one task per pod UID that syncs the pod, then terminates it when asked.
//! The latest update wins; a kill is never lost (syncs that arrive after it are ignored); a
//! terminated worker reports back and is gone, so a terminated pod never restarts under it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::types::{PodUid, full_name};

/// What one sync or termination of one pod does. Implemented by `pod_sync` against the runtime.
pub trait PodSyncer: Send + Sync + 'static {
    /// Brings the runtime to the pod's spec. `Ok(Some(d))` asks for another sync after `d`
    /// (a container waits out its restart backoff).
    fn sync_pod(
        &self,
        pod: Arc<Pod>,
    ) -> impl Future<Output = Result<Option<Duration>, String>> + Send;
    /// Stops the pod gracefully and removes everything it had on the node.
    fn terminate_pod(&self, pod: Arc<Pod>) -> impl Future<Output = Result<(), String>> + Send;
    /// Records that admission refused the pod (it ends Failed with `reason`).
    fn reject_pod(
        &self,
        pod: Arc<Pod>,
        reason: &str,
        message: &str,
    ) -> impl Future<Output = ()> + Send;
    /// Forgets what is known of a pod that never ran and is gone (a rejected pod).
    fn forget_pod(&self, pod: Arc<Pod>) -> impl Future<Output = ()> + Send;
    /// Periodic node-level upkeep for the desired pods (QoS cgroup shares).
    fn housekeep(&self, desired: Vec<Arc<Pod>>) -> impl Future<Output = ()> + Send;
    /// The pods this node has in the runtime, for housekeeping.
    fn runtime_pods(&self) -> impl Future<Output = Result<Vec<RuntimePod>, String>> + Send;
    /// Removes the directories and log directories of pods the node no longer has (none of
    /// `keep`), as upstream's cleanupOrphanedPodDirs and its log directory eviction do.
    fn clean_orphans(&self, keep: HashSet<PodUid>) -> impl Future<Output = ()> + Send;
    /// Stops a pod only the runtime has, with its containers' own grace periods, and removes
    /// everything it had on the node (upstream's SyncTerminatingRuntimePod).
    fn terminate_runtime_pod(
        &self,
        pod: Arc<RuntimePod>,
    ) -> impl Future<Output = Result<(), String>> + Send;
}

/// A pod the runtime holds for this node, as its sandbox describes it: no spec, only what
/// names it. One that no source wants is terminated as it is.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimePod {
    pub uid: PodUid,
    pub name: String,
    pub namespace: String,
    /// Its sandbox's annotations (its config source among them).
    pub annotations: BTreeMap<String, String>,
}

impl RuntimePod {
    /// `namespace/name`, as pods are named in logs.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The work a worker is asked to do next.
#[derive(Clone, Debug)]
pub enum Work {
    Sync(Arc<Pod>),
    Terminate(Arc<Pod>),
    /// The termination of a pod only the runtime has.
    TerminateRuntime(Arc<RuntimePod>),
}

impl Work {
    fn uid(&self) -> PodUid {
        match self {
            Work::Sync(p) | Work::Terminate(p) => PodUid::of(p),
            Work::TerminateRuntime(p) => p.uid.clone(),
        }
    }

    fn terminates(&self) -> bool {
        !matches!(self, Work::Sync(_))
    }
}

struct Worker {
    tx: watch::Sender<Work>,
    terminating: bool,
}

/// Retry delays after a failed sync or termination: 1 s doubling to 1 min. A new update wakes
/// the worker at once.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// All pod workers, owned by the sync loop.
pub struct PodWorkers<S> {
    syncer: Arc<S>,
    workers: HashMap<PodUid, Worker>,
    done: mpsc::UnboundedSender<PodUid>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl<S: PodSyncer> PodWorkers<S> {
    /// Workers that report finished terminations on `done`.
    pub fn new(
        syncer: Arc<S>,
        done: mpsc::UnboundedSender<PodUid>,
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        PodWorkers {
            syncer,
            workers: HashMap::new(),
            done,
            tracker,
            cancel,
        }
    }

    /// Hands work to the pod's worker, starting one if needed. Returns false when the work was
    /// dropped because the pod is already terminating.
    pub fn update(&mut self, work: Work) -> bool {
        let uid = work.uid();
        let terminate = work.terminates();
        if let Some(w) = self.workers.get_mut(&uid) {
            if w.terminating {
                return false;
            }
            w.terminating = terminate;
            w.tx.send_replace(work);
            return true;
        }
        if let Work::Sync(pod) = &work {
            let containers = pod.spec.as_ref().map_or(0, |s| s.containers.len());
            crate::metrics::get().pod_worker_started(containers, crate::pod::since_seen(pod));
        }
        let (tx, rx) = watch::channel(work);
        self.workers.insert(
            uid.clone(),
            Worker {
                tx,
                terminating: terminate,
            },
        );
        let syncer = self.syncer.clone();
        let done = self.done.clone();
        let cancel = self.cancel.clone();
        self.tracker
            .spawn(run_worker(syncer, rx, uid, done, cancel));
        true
    }

    /// Is there a worker for this pod (syncing or terminating)?
    pub fn contains(&self, uid: &PodUid) -> bool {
        self.workers.contains_key(uid)
    }

    /// Each worker's pod, whether it is being terminated, and whether it is a static pod
    /// (`None`: a pod only the runtime has).
    pub fn census(&self) -> impl Iterator<Item = (&PodUid, bool, Option<bool>)> {
        self.workers.iter().map(|(uid, w)| {
            let statics = match &*w.tx.borrow() {
                Work::Sync(p) | Work::Terminate(p) => {
                    Some(crate::pod::source(p) != Some(crate::types::Source::Api))
                }
                Work::TerminateRuntime(_) => None,
            };
            (uid, w.terminating, statics)
        })
    }

    /// Is this pod's worker terminating it?
    pub fn is_terminating(&self, uid: &PodUid) -> bool {
        self.workers.get(uid).is_some_and(|w| w.terminating)
    }

    /// Forgets a worker that reported its pod terminated.
    pub fn forget(&mut self, uid: &PodUid) {
        self.workers.remove(uid);
    }
}

/// A pod's worker: runs the pod's latest work, then waits for more. It lives as long as the
/// pod, so the large sync and termination futures are boxed while they run rather than kept
/// inline in every idle worker.
async fn run_worker<S: PodSyncer>(
    syncer: Arc<S>,
    mut rx: watch::Receiver<Work>,
    uid: PodUid,
    done: mpsc::UnboundedSender<PodUid>,
    cancel: CancellationToken,
) {
    let mut retry = RETRY_FIRST;
    loop {
        let work = rx.borrow_and_update().clone();
        let started = std::time::Instant::now();
        let (result, name, terminating) = match work {
            Work::Sync(pod) => match sync_unless_terminated(&*syncer, &pod, &rx).await {
                Some(result) => (result, full_name(&pod), false),
                None => {
                    tracing::debug!(pod = %full_name(&pod), %uid, "sync given up for the pod's termination");
                    continue;
                }
            },
            Work::Terminate(pod) => (
                Box::pin(syncer.terminate_pod(pod.clone()))
                    .await
                    .map(|()| None),
                full_name(&pod),
                true,
            ),
            Work::TerminateRuntime(pod) => (
                Box::pin(syncer.terminate_runtime_pod(pod.clone()))
                    .await
                    .map(|()| None),
                pod.full_name(),
                true,
            ),
        };
        let operation = if terminating { "terminate" } else { "sync" };
        crate::metrics::get().pod_worker(operation, started.elapsed());
        let wait = match result {
            Ok(_) if terminating => {
                let _ = done.send(uid);
                return;
            }
            Ok(again) => {
                retry = RETRY_FIRST;
                again
            }
            Err(e) => {
                let what = if terminating {
                    "terminating"
                } else {
                    "syncing"
                };
                tracing::warn!(pod = %name, %uid, error = %e, retry_in = ?retry, "{what} pod failed; will retry");
                let wait = retry;
                retry = (retry * 2).min(RETRY_MAX);
                Some(wait)
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            alive = woken(&mut rx, wait) => if !alive { return },
        }
    }
}

/// Syncs the pod, unless a termination is asked for meanwhile (None): that ends the sync where
/// it is (an image pull, a hook, a wait), and the termination reads the runtime afresh and
/// stops what the sync had begun. The watch is a copy, so updates seen here still wake the
/// worker afterwards.
async fn sync_unless_terminated<S: PodSyncer>(
    syncer: &S,
    pod: &Arc<Pod>,
    rx: &watch::Receiver<Work>,
) -> Option<Result<Option<Duration>, String>> {
    let mut watch = rx.clone();
    let terminated = async move {
        while watch.changed().await.is_ok() {
            if watch.borrow().terminates() {
                return;
            }
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        result = Box::pin(syncer.sync_pod(pod.clone())) => Some(result),
        () = terminated => None,
    }
}

/// Waits for new work, or for `wait` to pass when the last run asked for another; false once
/// the work's sender is gone.
async fn woken(rx: &mut watch::Receiver<Work>, wait: Option<Duration>) -> bool {
    match wait {
        Some(d) => {
            tokio::select! {
                r = rx.changed() => r.is_ok(),
                _ = tokio::time::sleep(d) => true,
            }
        }
        None => rx.changed().await.is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder {
        calls: Mutex<Vec<String>>,
        fail_syncs: Mutex<u32>,
    }

    impl PodSyncer for Recorder {
        async fn sync_pod(&self, pod: Arc<Pod>) -> Result<Option<Duration>, String> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("sync {}", pod.metadata.name.clone().unwrap()));
            if pod.metadata.name.as_deref() == Some("hangs") {
                std::future::pending::<()>().await;
            }
            let mut fails = self.fail_syncs.lock().unwrap();
            if *fails > 0 {
                *fails -= 1;
                return Err("boom".into());
            }
            Ok(None)
        }
        async fn terminate_pod(&self, pod: Arc<Pod>) -> Result<(), String> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("kill {}", pod.metadata.name.clone().unwrap()));
            Ok(())
        }
        async fn reject_pod(&self, _pod: Arc<Pod>, _reason: &str, _message: &str) {}
        async fn forget_pod(&self, _pod: Arc<Pod>) {}
        async fn housekeep(&self, _desired: Vec<Arc<Pod>>) {}
        async fn runtime_pods(&self) -> Result<Vec<RuntimePod>, String> {
            Ok(Vec::new())
        }
        async fn clean_orphans(&self, _keep: HashSet<PodUid>) {}
        async fn terminate_runtime_pod(&self, pod: Arc<RuntimePod>) -> Result<(), String> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("kill runtime {}", pod.name));
            Ok(())
        }
    }

    fn pod(name: &str) -> Arc<Pod> {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some("u1".into());
        Arc::new(p)
    }

    async fn until(recorder: &Recorder, n: usize) -> Vec<String> {
        for _ in 0..10_000 {
            let calls = recorder.calls.lock().unwrap().clone();
            if calls.len() >= n {
                return calls;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("never saw {n} calls: {:?}", recorder.calls.lock().unwrap());
    }

    /// Workers over a recorder, and where they report finished terminations.
    fn workers() -> (
        Arc<Recorder>,
        PodWorkers<Recorder>,
        mpsc::UnboundedReceiver<PodUid>,
    ) {
        let rec = Arc::new(Recorder::default());
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let workers = PodWorkers::new(
            rec.clone(),
            done_tx,
            TaskTracker::new(),
            CancellationToken::new(),
        );
        (rec, workers, done_rx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_kill_is_never_lost_and_later_syncs_are_ignored() {
        let (rec, mut workers, mut done_rx) = workers();
        assert!(workers.update(Work::Sync(pod("v1"))));
        until(&rec, 1).await;
        assert!(workers.update(Work::Terminate(pod("v1"))));
        assert!(!workers.update(Work::Sync(pod("v2"))));
        assert!(workers.is_terminating(&PodUid("u1".into())));
        assert_eq!(done_rx.recv().await, Some(PodUid("u1".into())));
        assert_eq!(until(&rec, 2).await, ["sync v1", "kill v1"]);
        workers.forget(&PodUid("u1".into()));
        assert!(!workers.contains(&PodUid("u1".into())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_termination_ends_a_sync_that_hangs() {
        let (rec, mut workers, mut done_rx) = workers();
        assert!(workers.update(Work::Sync(pod("hangs"))));
        until(&rec, 1).await;
        assert!(workers.update(Work::Terminate(pod("hangs"))));
        assert_eq!(done_rx.recv().await, Some(PodUid("u1".into())));
        assert_eq!(until(&rec, 2).await, ["sync hangs", "kill hangs"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_sync_is_retried() {
        let (rec, mut workers, _done_rx) = workers();
        *rec.fail_syncs.lock().unwrap() = 2;
        workers.update(Work::Sync(pod("v1")));
        assert_eq!(until(&rec, 3).await, ["sync v1", "sync v1", "sync v1"]);
    }
}

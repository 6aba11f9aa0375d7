//! The versioned pod status store: one [`Writer`] (the pod sync), cheap cloneable [`Reader`]s
//! (servers, run-once, the cluster status push). Each pod is kept with its latest status.
//! Beside it, [`Diagnoses`]: what the node is doing about each pod, for `nodelet describe`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;

use crate::types::PodUid;

/// A pod with its status and the status's version (bumped on every change).
#[derive(Clone, Debug)]
pub struct Entry {
    pub version: u64,
    pub pod: Arc<Pod>,
}

#[derive(Default)]
struct State {
    pods: HashMap<PodUid, Entry>,
    /// Pods whose termination finished (nothing of them is left on the node): when, and their
    /// final status (only that: every pod that finished in the last [`TERMINATED_KEPT`] stays
    /// in memory); kept so the cluster status manager can send that status and delete their
    /// API objects, and a late refusal can start from it.
    terminated: HashMap<PodUid, (std::time::Instant, Option<PodStatus>)>,
    generation: u64,
}

/// How long a finished termination is remembered.
const TERMINATED_KEPT: std::time::Duration = std::time::Duration::from_secs(600);

impl State {
    /// Forgets the finished terminations older than [`TERMINATED_KEPT`] at `now`.
    fn expire(&mut self, now: std::time::Instant) {
        (self.terminated).retain(|_, (at, _)| now.duration_since(*at) < TERMINATED_KEPT);
    }
}

/// Writes statuses; there is one.
pub struct Writer {
    state: Arc<RwLock<State>>,
    changed: watch::Sender<u64>,
}

/// Counts each container whose status turned terminated between `old` and `new`, as
/// upstream's status manager counts them.
fn count_terminations(old: Option<&PodStatus>, new: &PodStatus) {
    use k8s_openapi::api::core::v1::ContainerStatus;
    fn groups(s: &PodStatus) -> [(&'static str, &[ContainerStatus]); 3] {
        [
            ("init_container", s.init_container_statuses.as_deref()),
            ("container", s.container_statuses.as_deref()),
            (
                "ephemeral_container",
                s.ephemeral_container_statuses.as_deref(),
            ),
        ]
        .map(|(kind, list)| (kind, list.unwrap_or_default()))
    }
    fn terminated(c: &ContainerStatus) -> Option<(i32, &str)> {
        let t = c.state.as_ref()?.terminated.as_ref()?;
        Some((t.exit_code, t.reason.as_deref().unwrap_or_default()))
    }
    let before = old.map(groups);
    for (i, (kind, statuses)) in groups(new).into_iter().enumerate() {
        for c in statuses {
            let Some((code, reason)) = terminated(c) else {
                continue;
            };
            let was = before
                .as_ref()
                .and_then(|b| b[i].1.iter().find(|o| o.name == c.name));
            if was.and_then(terminated).is_none() {
                crate::metrics::get().container_terminated(kind, code, reason);
            }
        }
    }
}

/// Reads statuses; clone freely.
#[derive(Clone)]
pub struct Reader {
    state: Arc<RwLock<State>>,
    changed: watch::Receiver<u64>,
}

/// A new, empty store.
pub fn store() -> (Writer, Reader) {
    let state = Arc::new(RwLock::new(State::default()));
    let (tx, rx) = watch::channel(0);
    (
        Writer {
            state: state.clone(),
            changed: tx,
        },
        Reader { state, changed: rx },
    )
}

impl Writer {
    /// Records `status` for `pod`; returns true when it differs from the stored one.
    pub fn set(&self, pod: &Pod, status: PodStatus) -> bool {
        let uid = PodUid::of(pod);
        let generation = {
            let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
            let old = state.pods.get(&uid);
            if old.is_some_and(|e| e.pod.status.as_ref() == Some(&status) && e.pod.spec == pod.spec)
            {
                return false;
            }
            count_terminations(old.and_then(|e| e.pod.status.as_ref()), &status);
            let version = old.map_or(1, |e| e.version + 1);
            let mut stored = pod.clone();
            stored.status = Some(status);
            state.pods.insert(
                uid,
                Entry {
                    version,
                    pod: Arc::new(stored),
                },
            );
            state.generation += 1;
            state.generation
        };
        self.changed.send_replace(generation);
        true
    }

    /// Forgets a pod whose termination finished: nothing of it is left on the node.
    pub fn terminated(&self, uid: &PodUid) {
        {
            let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
            let now = std::time::Instant::now();
            state.expire(now);
            let last = state.pods.get(uid).and_then(|e| e.pod.status.clone());
            state.terminated.insert(uid.clone(), (now, last));
        }
        self.remove(uid);
    }

    /// A pod whose termination finished runs again (a static pod put back unchanged keeps its
    /// UID): its next termination is one of its own, which forgets it again.
    pub fn runs_again(&self, uid: &PodUid) {
        let finished = (self.state.read().unwrap_or_else(|e| e.into_inner()))
            .terminated
            .contains_key(uid);
        if finished {
            let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
            state.terminated.remove(uid);
        }
    }

    /// Forgets the finished terminations older than [`TERMINATED_KEPT`] (also done at each
    /// termination, but a node that goes idle after many pods ended has none).
    pub fn prune(&self) {
        let now = std::time::Instant::now();
        (self.state.write().unwrap_or_else(|e| e.into_inner())).expire(now);
    }

    /// Forgets a pod that is gone.
    pub fn remove(&self, uid: &PodUid) {
        let generation = {
            let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
            if state.pods.remove(uid).is_none() {
                return;
            }
            state.generation += 1;
            state.generation
        };
        self.changed.send_replace(generation);
    }

    /// A reader of this store.
    pub fn reader(&self) -> Reader {
        Reader {
            state: self.state.clone(),
            changed: self.changed.subscribe(),
        }
    }
}

impl Reader {
    /// The pod's latest entry.
    pub fn get(&self, uid: &PodUid) -> Option<Entry> {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .get(uid)
            .cloned()
    }

    /// The status of the pod with this namespace and name.
    pub fn by_name(&self, namespace: &str, name: &str) -> Option<Entry> {
        self.list().into_iter().find(|e| {
            e.pod.metadata.namespace.as_deref() == Some(namespace)
                && e.pod.metadata.name.as_deref() == Some(name)
        })
    }

    /// Every pod's latest entry.
    pub fn list(&self) -> Vec<Entry> {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .pods
            .values()
            .cloned()
            .collect()
    }

    /// Did the pod's termination finish lately (nothing of it is left on the node)?
    pub fn was_terminated(&self, uid: &PodUid) -> bool {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .terminated
            .contains_key(uid)
    }

    /// The final status of a pod whose termination finished lately.
    pub fn final_status(&self, uid: &PodUid) -> Option<PodStatus> {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .terminated
            .get(uid)
            .and_then(|(_, last)| last.clone())
    }

    /// The store's generation: it grows with every change.
    pub fn generation(&self) -> u64 {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .generation
    }

    /// Waits until anything in the store changes.
    pub async fn changed(&mut self) {
        let _ = self.changed.changed().await;
    }
}

/// What the node is doing about each pod, for `nodelet describe` ("why is it not running"):
/// the steps its sync waits on now, the last sync error, and its probes' latest results.
/// Written by the pod sync and the probes, read by the admin API; cheap to clone.
#[derive(Clone, Default)]
pub struct Diagnoses {
    pods: Arc<std::sync::Mutex<HashMap<PodUid, Kept>>>,
}

#[derive(Default)]
struct Kept {
    steps: Vec<(u64, Step)>,
    next: u64,
    last_error: Option<Step>,
    probes: std::collections::BTreeMap<(String, String), Probe>,
}

/// One pod's diagnosis.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Diagnosis {
    /// What the pod's sync waits on now (several at once: its images are pulled together).
    pub waiting_on: Vec<Step>,
    /// The last sync's error; a sync that succeeds clears it.
    pub last_error: Option<Step>,
    /// Each probe's latest result, by container.
    pub probes: Vec<Probe>,
}

/// A step, or an error, and since when.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Step {
    pub what: String,
    pub since: Time,
    /// How far it got (an image pull's bytes), where that is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
}

/// A probe's latest attempt.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    pub container: String,
    /// Liveness, Readiness or Startup.
    pub probe: String,
    pub success: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How many attempts in a row had this outcome.
    pub times: u32,
    pub at: Time,
}

/// A step under way; it ends when dropped.
pub struct StepGuard {
    pods: Arc<std::sync::Mutex<HashMap<PodUid, Kept>>>,
    uid: PodUid,
    id: u64,
}

impl StepGuard {
    /// Says how far the step got.
    pub fn progress(&self, progress: String) {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let step = pods
            .get_mut(&self.uid)
            .and_then(|kept| kept.steps.iter_mut().find(|(id, _)| *id == self.id));
        if let Some((_, step)) = step {
            step.progress = Some(progress);
        }
    }
}

impl Drop for StepGuard {
    fn drop(&mut self) {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kept) = pods.get_mut(&self.uid) {
            kept.steps.retain(|(id, _)| *id != self.id);
        }
    }
}

impl Diagnoses {
    fn with<T>(&self, uid: &PodUid, f: impl FnOnce(&mut Kept) -> T) -> T {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        f(pods.entry(uid.clone()).or_default())
    }

    /// The pod's sync waits on `what` until the guard is dropped.
    pub fn begin(&self, uid: &PodUid, what: String) -> StepGuard {
        let id = self.with(uid, |kept| {
            kept.next += 1;
            let since = Time(crate::types::now());
            kept.steps.push((
                kept.next,
                Step {
                    what,
                    since,
                    progress: None,
                },
            ));
            kept.next
        });
        StepGuard {
            pods: self.pods.clone(),
            uid: uid.clone(),
            id,
        }
    }

    /// A sync of the pod ended: with its error, or well (which clears the last error).
    pub fn synced(&self, uid: &PodUid, error: Option<&str>) {
        self.with(uid, |kept| {
            kept.last_error = error.map(|what| Step {
                what: what.to_string(),
                since: Time(crate::types::now()),
                progress: None,
            });
        });
    }

    /// A probe's attempt: its outcome, and why it failed.
    pub fn probed(&self, uid: &PodUid, container: &str, probe: &str, failure: Option<&str>) {
        self.with(uid, |kept| {
            let key = (container.to_string(), probe.to_string());
            let success = failure.is_none();
            let times = match kept.probes.get(&key) {
                Some(last) if last.success == success => last.times.saturating_add(1),
                _ => 1,
            };
            kept.probes.insert(
                key,
                Probe {
                    container: container.to_string(),
                    probe: probe.to_string(),
                    success,
                    message: failure.map(str::to_string),
                    times,
                    at: Time(crate::types::now()),
                },
            );
        });
    }

    /// Forgets a pod that is gone.
    pub fn forget(&self, uid: &PodUid) {
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    /// The pod's diagnosis.
    pub fn get(&self, uid: &PodUid) -> Diagnosis {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let Some(kept) = pods.get(uid) else {
            return Diagnosis::default();
        };
        Diagnosis {
            waiting_on: kept.steps.iter().map(|(_, s)| s.clone()).collect(),
            last_error: kept.last_error.clone(),
            probes: kept.probes.values().cloned().collect(),
        }
    }
}

/// Pods whose termination finished but left something on the node that could not be removed
/// (a mount, a directory, a cgroup), with why; retried in the background, never holding up the
/// pod's status. Written by the pod sync, read by the admin API (`nodelet get cleanups`).
#[derive(Clone, Default)]
pub struct Cleanups {
    pods: Arc<std::sync::Mutex<std::collections::BTreeMap<PodUid, Cleanup>>>,
}

/// What one pod left.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cleanup {
    /// `namespace/name`.
    pub pod: String,
    pub uid: String,
    /// Each thing left, with why it could not be removed.
    pub left: Vec<String>,
    /// When it was first left.
    pub since: Time,
    pub attempts: u32,
}

impl Cleanups {
    /// The pod left `left` after another attempt; true on its first.
    pub fn left(&self, uid: &PodUid, pod: String, left: Vec<String>) -> bool {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        match pods.get_mut(uid) {
            Some(c) => {
                c.left = left;
                c.attempts = c.attempts.saturating_add(1);
                false
            }
            None => {
                pods.insert(
                    uid.clone(),
                    Cleanup {
                        pod,
                        uid: uid.0.clone(),
                        left,
                        since: Time(crate::types::now()),
                        attempts: 1,
                    },
                );
                true
            }
        }
    }

    /// Nothing of the pod is left (or it is no longer this node's to clean).
    pub fn done(&self, uid: &PodUid) -> bool {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        pods.remove(uid).is_some()
    }

    /// Every pod with something left, by UID.
    pub fn list(&self) -> Vec<Cleanup> {
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        pods.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diagnosis_shows_the_steps_under_way_the_last_error_and_the_probes() {
        let d = Diagnoses::default();
        let uid = PodUid("u".into());
        let pull = d.begin(&uid, "pulling image a".into());
        let start = d.begin(&uid, "starting container c".into());
        d.synced(&uid, Some("container \"c\": CreateContainerConfigError"));
        d.probed(&uid, "c", "Readiness", Some("HTTP 500"));
        d.probed(&uid, "c", "Readiness", Some("HTTP 503"));
        drop(pull);
        let now = d.get(&uid);
        let steps: Vec<&str> = now.waiting_on.iter().map(|s| s.what.as_str()).collect();
        assert_eq!(steps, ["starting container c"]);
        assert!(
            now.last_error
                .unwrap()
                .what
                .contains("CreateContainerConfigError")
        );
        assert_eq!(now.probes.len(), 1);
        assert_eq!(now.probes[0].times, 2);
        assert_eq!(now.probes[0].message.as_deref(), Some("HTTP 503"));
        drop(start);
        d.synced(&uid, None);
        d.probed(&uid, "c", "Readiness", None);
        let now = d.get(&uid);
        assert!(now.waiting_on.is_empty() && now.last_error.is_none());
        assert!(now.probes[0].success && now.probes[0].times == 1);
        d.forget(&uid);
        assert_eq!(d.get(&uid), Diagnosis::default());
    }

    fn pod(uid: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(format!("pod-{uid}"));
        p.metadata.namespace = Some("default".into());
        p
    }

    #[tokio::test]
    async fn versions_bump_only_on_change_and_readers_see_it() {
        let (writer, mut reader) = store();
        let status = PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        assert!(writer.set(&pod("a"), status.clone()));
        reader.changed().await;
        assert!(
            !writer.set(&pod("a"), status.clone()),
            "same status, no new version"
        );
        assert_eq!(reader.get(&PodUid("a".into())).unwrap().version, 1);
        let done = PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        };
        assert!(writer.set(&pod("a"), done));
        let entry = reader.by_name("default", "pod-a").unwrap();
        assert_eq!(entry.version, 2);
        assert_eq!(
            entry.pod.status.as_ref().unwrap().phase.as_deref(),
            Some("Succeeded")
        );
        writer.remove(&PodUid("a".into()));
        assert!(reader.list().is_empty());
    }
}

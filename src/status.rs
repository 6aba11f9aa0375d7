//! The versioned pod status store: one [`Writer`] (the pod sync), cheap cloneable [`Reader`]s
//! (servers, run-once, the cluster status push). Each pod is kept with its latest status.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
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
    /// last entry (the final status); kept for [`TERMINATED_KEPT`] so the cluster status
    /// manager can send that status and delete their API objects.
    terminated: HashMap<PodUid, (std::time::Instant, Option<Entry>)>,
    generation: u64,
}

/// How long a finished termination is remembered.
const TERMINATED_KEPT: std::time::Duration = std::time::Duration::from_secs(600);

/// Writes statuses; there is one.
pub struct Writer {
    state: Arc<RwLock<State>>,
    changed: watch::Sender<u64>,
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
            state
                .terminated
                .retain(|_, (at, _)| now.duration_since(*at) < TERMINATED_KEPT);
            let last = state.pods.get(uid).cloned();
            state.terminated.insert(uid.clone(), (now, last));
        }
        self.remove(uid);
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

    /// The last entry of a pod whose termination finished lately (its final status).
    pub fn final_entry(&self, uid: &PodUid) -> Option<Entry> {
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

#[cfg(test)]
mod tests {
    use super::*;

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

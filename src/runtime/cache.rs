//! The pod cache: the runtime's pods as the PLEG's latest relist read them, for syncs to start
//! from instead of listing the runtime again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::PodRuntime;
use crate::types::PodUid;

/// The pods' sandboxes and containers as the latest relist listed them (without status
/// details), so that a sync need not list the runtime again (upstream's pod cache). A pod's
/// reading stands until a sync changes the pod; then it is not served until a relist that
/// began after the change has ended. Every change the agent makes to a pod is made by a sync
/// (or its removal), one at a time per pod, so no sync starts from a reading older than its
/// pod's last change. What the runtime does by itself (a container exiting) shows at the next
/// relist, whose event wakes the pod's worker. Clone freely.
#[derive(Clone, Default)]
pub struct PodCache(Arc<Shared>);

#[derive(Default)]
struct Shared {
    cached: Mutex<Cached>,
    /// Told of every installed relist.
    installed: watch::Sender<()>,
    /// Woken when a sync waits for a relist (see [`PodCache::relist_wanted`]).
    wanted: tokio::sync::Notify,
}

#[derive(Default)]
struct Cached {
    /// When the latest relist began; `None` before the first ended.
    began: Option<Instant>,
    pods: HashMap<PodUid, PodRuntime>,
    /// The pods' last changes, those not older than `began`.
    changed: HashMap<PodUid, Change>,
}

/// When the agent's last change to a pod ended (a sync's changes, or its removal), and which.
struct Change {
    at: Instant,
    removed: bool,
}

/// Why the latest relist may not show a pod as it is.
enum Stale {
    /// No relist has ended since the agent started, or since a sync changed the pod.
    Pending,
    /// The pod was removed since: a pod with its UID now is a new one.
    Removed,
}

impl PodCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Cached> {
        self.0.cached.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pod's sandboxes and containers (newest first, without status details), or `None`
    /// when the latest relist may not show the pod as it is.
    pub fn get(&self, uid: &PodUid) -> Option<PodRuntime> {
        self.reading(uid).ok()
    }

    fn reading(&self, uid: &PodUid) -> Result<PodRuntime, Stale> {
        let cached = self.lock();
        cached.began.ok_or(Stale::Pending)?;
        // `changed` keeps only changes since the latest relist began.
        match cached.changed.get(uid) {
            Some(change) if change.removed => Err(Stale::Removed),
            Some(_) => Err(Stale::Pending),
            None => Ok(cached.pods.get(uid).cloned().unwrap_or_default()),
        }
    }

    /// The pod's reading as [`get`](Self::get) gives it, waiting for a relist that shows the
    /// pod as it is when a sync changed it since the latest (upstream's GetNewerThan), for at
    /// most `within`. A pod removed since (a new pod with the UID of one just removed, as a
    /// static pod put back) is not waited for: `None` at once.
    pub async fn newer(&self, uid: &PodUid, within: Duration) -> Option<PodRuntime> {
        let deadline = Instant::now() + within;
        let mut installed = self.0.installed.subscribe();
        loop {
            match self.reading(uid) {
                Ok(rt) => return Some(rt),
                Err(Stale::Removed) => return None,
                Err(Stale::Pending) => self.0.wanted.notify_one(),
            }
            tokio::time::timeout_at(deadline, installed.changed())
                .await
                .ok()?
                .ok()?;
        }
    }

    /// Marks the pod changed when the returned guard is dropped: hold it over a sync's calls
    /// that change the pod in the runtime, so the mark is as late as the last of them.
    pub fn changing(&self, uid: &PodUid) -> Changing {
        Changing {
            cache: self.clone(),
            uid: uid.clone(),
            removing: false,
        }
    }

    /// Marks the pod removed when the returned guard is dropped, as [`changing`](Self::changing).
    pub fn removing(&self, uid: &PodUid) -> Changing {
        Changing {
            cache: self.clone(),
            uid: uid.clone(),
            removing: true,
        }
    }

    /// Completes when a sync waits for a relist that shows its pod as it is: a PLEG that
    /// relists rarely (between container events) relists then.
    pub async fn relist_wanted(&self) {
        self.0.wanted.notified().await
    }

    /// Installs a relist's reading; `began` is when its first listing was asked.
    pub fn install(&self, began: Instant, pods: HashMap<PodUid, PodRuntime>) {
        let mut cached = self.lock();
        cached.changed.retain(|_, change| change.at >= began);
        cached.began = Some(began);
        cached.pods = pods;
        drop(cached);
        self.0.installed.send_replace(());
    }
}

/// Marks a pod changed (or removed) in the [`PodCache`] when dropped.
pub struct Changing {
    cache: PodCache,
    uid: PodUid,
    removing: bool,
}

impl Drop for Changing {
    fn drop(&mut self) {
        // Timed under the lock, so no change is older than an installed relist's beginning.
        let mut cached = self.cache.lock();
        let change = Change {
            at: Instant::now(),
            removed: self.removing,
        };
        cached.changed.insert(self.uid.clone(), change);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Sandbox;
    use std::time::Duration;

    fn pods(uid: &PodUid, sandbox: &str) -> HashMap<PodUid, PodRuntime> {
        let sb = Sandbox {
            id: sandbox.into(),
            uid: uid.clone(),
            name: "p".into(),
            namespace: "default".into(),
            attempt: 0,
            state: crate::runtime::SandboxState::Ready,
            created_at: 0,
            annotations: HashMap::new(),
            has_pod_labels: true,
        };
        let rt = PodRuntime {
            sandboxes: vec![sb],
            containers: Vec::new(),
        };
        [(uid.clone(), rt)].into()
    }

    fn sandbox(cache: &PodCache, uid: &PodUid) -> Option<Option<String>> {
        cache
            .get(uid)
            .map(|rt| rt.latest_sandbox().map(|s| s.id.clone()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_pods_reading_is_served_until_a_sync_changes_it_and_again_after_a_later_relist() {
        let cache = PodCache::default();
        let (a, b) = (PodUid("a".into()), PodUid("b".into()));
        assert_eq!(sandbox(&cache, &a), None, "nothing before the first relist");
        let tick = Duration::from_millis(10);
        cache.install(Instant::now(), pods(&a, "s1"));
        assert_eq!(sandbox(&cache, &a), Some(Some("s1".into())));
        assert_eq!(sandbox(&cache, &b), Some(None), "a pod the runtime lacks");

        tokio::time::advance(tick).await;
        let relist_began = Instant::now();
        tokio::time::advance(tick).await;
        drop(cache.changing(&a));
        assert_eq!(sandbox(&cache, &a), None, "changed since the relist");
        assert_eq!(sandbox(&cache, &b), Some(None), "other pods are unaffected");
        cache.install(relist_began, pods(&a, "s2"));
        assert_eq!(
            sandbox(&cache, &a),
            None,
            "a relist that began before the change"
        );

        tokio::time::advance(tick).await;
        cache.install(Instant::now(), pods(&a, "s3"));
        assert_eq!(sandbox(&cache, &a), Some(Some("s3".into())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_pod_waits_for_a_relist_that_began_after_the_change() {
        let cache = PodCache::default();
        let a = PodUid("a".into());
        let wait = Duration::from_secs(2);
        assert!(cache.newer(&a, wait).await.is_none(), "no relist at all");

        cache.install(Instant::now(), pods(&a, "s1"));
        tokio::time::advance(Duration::from_millis(10)).await;
        drop(cache.changing(&a));
        assert!(
            cache.newer(&a, wait).await.is_none(),
            "no relist after the change"
        );

        let waiting = tokio::spawn({
            let (cache, a) = (cache.clone(), a.clone());
            async move {
                cache
                    .newer(&a, wait)
                    .await
                    .map(|rt| rt.latest_sandbox().map(|s| s.id.clone()))
            }
        });
        tokio::time::advance(Duration::from_millis(500)).await;
        cache.install(Instant::now(), pods(&a, "s2"));
        assert_eq!(waiting.await.ok(), Some(Some(Some("s2".into()))));

        // A pod put back with the UID of one just removed is a new pod: it does not wait.
        let started = Instant::now();
        drop(cache.removing(&a));
        assert!(cache.newer(&a, wait).await.is_none());
        assert_eq!(Instant::now(), started, "no wait for a removed pod");
    }
}

//! A pod's end: its containers stopped (kill.rs) within the grace period, the
//! termination reported within the grace period and a slack even when the runtime does not
//! confirm the stop, its final status, and what it left on the node removed, in the background
//! when it cannot be at once.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::kill::GraceFrom;
use super::record::failure;
use super::{Error, Syncer, convert};
use crate::events::Target;
use crate::pod::grace_period_seconds;
use crate::types::PodUid;
use crate::volumes;

impl Syncer {
    /// Terminates the pod (see [`Self::terminate`]); a failure is a FailedKillPod warning.
    pub(super) async fn terminate_reported(
        &self,
        pod: &Pod,
        grace: GraceFrom,
    ) -> Result<(), String> {
        self.terminate(pod, grace).await.map_err(|e| {
            let why = crate::types::error_chain(&e);
            self.events.warning(
                Target::pod(pod),
                "FailedKillPod",
                format!("error killing pod: {why}"),
            );
            why
        })
    }

    /// Stops the pod's containers and sandboxes, records its end, and removes what it had on
    /// the node.
    async fn terminate(&self, pod: &Pod, grace_from: GraceFrom) -> Result<(), Error> {
        let uid = PodUid::of(pod);
        let _removing = self.cache.removing(&uid);
        let began = self.book(&uid, |book| {
            *book
                .terminating_since
                .get_or_insert_with(tokio::time::Instant::now)
        });
        // A pod only the runtime has is stopped with its containers' own grace periods (the
        // default for one that has none): the longest of them, as last seen, bounds its stop.
        let grace = match grace_from {
            GraceFrom::Spec => grace_period_seconds(pod),
            GraceFrom::Containers => self
                .cache
                .get(&uid)
                .and_then(|rt| {
                    rt.containers
                        .iter()
                        .map(|c| c.grace_seconds.unwrap_or(grace_period_seconds(pod)))
                        .max()
                })
                .unwrap_or_else(|| grace_period_seconds(pod)),
        };
        let grace = Duration::from_secs(grace.max(0) as u64);
        let stop = async {
            let rt = self.read(pod).await?;
            self.kill_all(pod, &rt, false, grace_from).await
        };
        tokio::pin!(stop);
        // Past its grace period and the slack, the pod is reported as ended although the
        // runtime has not confirmed its stop (a hung call, a stop that keeps failing); the stop
        // goes on, and only then is the pod gone from the node's view.
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(began + grace + TERMINATION_SLACK) => {
                self.report_unconfirmed_stop(pod, began.elapsed());
                stop.await?;
            }
            stopped = &mut stop => stopped?,
        }
        self.resources
            .dra
            .unprepare(&uid.0)
            .await
            .map_err(Error::Unprepare)?;
        // A pod deleted through the API ends with a final status from its stopped containers
        // (Succeeded when every one exited 0, else Failed), as upstream's, which the API
        // server gets before the pod's deletion completes.
        if !self.statuses.was_terminated(&uid) {
            if pod.metadata.deletion_timestamp.is_some() {
                let rt = self.runtime.pod_runtime(&uid).await?;
                self.record_final_status(pod, &rt).await?;
            }
            self.status.terminated(&uid);
            self.forget(&uid);
            let target = Target::pod(pod);
            crate::metrics::get().forget_probes(&target.namespace, &target.name, &target.uid);
        }
        // The termination is over (its book, with when it began, goes).
        self.books
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uid);
        // What is left to remove: the listing tells all that needs (names, attempts, states).
        let rt = self.runtime.pod_listing(&uid).await?;
        let mut counts: HashMap<String, u32> = HashMap::new();
        for c in &rt.containers {
            let next = counts.entry(c.name.clone()).or_default();
            *next = (*next).max(c.attempt + 1);
        }
        if !counts.is_empty() {
            (self.carried.lock().unwrap_or_else(|e| e.into_inner())).insert(uid.clone(), counts);
        }
        self.kill_all(pod, &rt, true, grace_from).await?;
        self.userns.release(&uid);
        let leftover = Leftover {
            pod: Target::pod(pod),
            log_dir: convert::pod_log_dir(&self.ctx, pod),
            wait: LEFTOVER_RETRY_FIRST,
            next: tokio::time::Instant::now() + LEFTOVER_RETRY_FIRST,
        };
        self.clean_up(&uid, leftover);
        Ok(())
    }

    /// Reports a pod whose stop the runtime has not confirmed past its grace period and the
    /// slack: its status ends (Failed, from what is known of its containers) and a warning
    /// says why. Said once per termination.
    pub(super) fn report_unconfirmed_stop(&self, pod: &Pod, waited: Duration) {
        let last = self
            .statuses
            .get(&PodUid::of(pod))
            .and_then(|e| e.pod.status.clone());
        if last
            .as_ref()
            .is_some_and(|s| s.reason.as_deref() == Some(UNCONFIRMED_STOP))
        {
            return;
        }
        let message = format!(
            "The container runtime has not confirmed the stop of the pod's containers {}s after its termination began; the pod is reported ended and its stop goes on",
            waited.as_secs()
        );
        self.events
            .warning(Target::pod(pod), UNCONFIRMED_STOP, message.clone());
        let mut status = failure(last, UNCONFIRMED_STOP, &message);
        for c in status.container_statuses.iter_mut().flatten() {
            c.ready = false;
        }
        self.status.set(pod, status);
    }

    /// Forgets what the syncer keeps of a pod that ended.
    pub(super) fn forget(&self, uid: &PodUid) {
        self.diagnoses.forget(uid);
        self.resources.release(&uid.0);
        self.probes.remove_pod(uid);
        self.backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget_pod(&uid.0);
        self.images.forget_pod(uid);
        self.books
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    /// Removes what an ended pod left on the node (its volumes and directory, cgroup and log
    /// directory). What cannot be removed goes on the cleanup list with why (a CleanupPending
    /// warning the first time) and is tried again by housekeeping; it holds nothing up.
    pub(super) fn clean_up(&self, uid: &PodUid, leftover: Leftover) {
        let mut left = Vec::new();
        if let Err(e) = self.volumes.teardown(&uid.0) {
            left.push(format!("volumes: {}", crate::types::error_chain(&e)));
        }
        if let Err(e) = self.cgroups.remove_pod(&uid.0) {
            left.push(format!("cgroup: {}", crate::types::error_chain(&e)));
        }
        match std::fs::remove_dir_all(&leftover.log_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => left.push(format!(
                "logs: cannot remove {}: {e}",
                leftover.log_dir.display()
            )),
            _ => {}
        }
        let mut leftovers = self.leftovers.lock().unwrap_or_else(|e| e.into_inner());
        let pod = format!("{}/{}", leftover.pod.namespace, leftover.pod.name);
        if left.is_empty() {
            leftovers.remove(uid);
            if self.cleanups.done(uid) {
                tracing::info!(%pod, %uid, "what the pod left is cleaned up");
            } else {
                tracing::info!(%pod, %uid, "pod terminated and cleaned up");
            }
            return;
        }
        let why = left.join("; ");
        if self.cleanups.left(uid, pod.clone(), left) {
            tracing::warn!(%pod, %uid, left = %why, "pod terminated; what it left is cleaned up in the background");
            self.events.warning(
                leftover.pod.clone(),
                "CleanupPending",
                format!("The pod ended; what it left is removed in the background: {why}"),
            );
        }
        leftovers.insert(uid.clone(), leftover);
    }

    /// Removes again what ended pods left, once their time has come; a pod that runs again (the
    /// same UID) has its directories back in use and is nothing to clean.
    pub(super) fn retry_leftovers(&self, desired: &[Arc<Pod>]) {
        let now = tokio::time::Instant::now();
        let due: Vec<(PodUid, Leftover)> = {
            let mut leftovers = self.leftovers.lock().unwrap_or_else(|e| e.into_inner());
            let running: std::collections::HashSet<PodUid> =
                desired.iter().map(|p| PodUid::of(p)).collect();
            leftovers.retain(|uid, _| {
                let again = running.contains(uid);
                if again {
                    self.cleanups.done(uid);
                }
                !again
            });
            let due: Vec<PodUid> = leftovers
                .iter()
                .filter(|(_, l)| l.next <= now)
                .map(|(uid, _)| uid.clone())
                .collect();
            due.into_iter()
                .filter_map(|uid| leftovers.remove(&uid).map(|l| (uid, l)))
                .collect()
        };
        for (uid, mut leftover) in due {
            leftover.wait = (leftover.wait * 2).min(LEFTOVER_RETRY_MAX);
            leftover.next = now + leftover.wait;
            self.clean_up(&uid, leftover);
        }
    }
}

/// What pods the node no longer has left: their directories under the root dir (by UID) and
/// their `<namespace>_<name>_<uid>` log directories.
pub(super) struct Orphans {
    pods: Vec<String>,
    logs: Vec<(PathBuf, String)>,
}

impl Orphans {
    /// The pod and log directories of pods not in `keep`. Neither a namespace nor a pod name
    /// holds `_`, so a log directory's UID is what follows the second one.
    pub(super) fn find(root_dir: &Path, pod_logs_dir: &Path, keep: &HashSet<PodUid>) -> Orphans {
        let names = |dir: &Path| -> Vec<String> {
            let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
            let dirs = entries.filter(|e| e.file_type().is_ok_and(|t| t.is_dir()));
            dirs.filter_map(|e| e.file_name().into_string().ok())
                .collect()
        };
        let orphan =
            |uid: &str| crate::types::is_path_part(uid) && !keep.contains(&PodUid(uid.to_string()));
        let pods = names(&root_dir.join("pods"))
            .into_iter()
            .filter(|uid| orphan(uid))
            .collect();
        let logs = (names(pod_logs_dir).into_iter())
            .filter_map(|name| {
                let uid = match name.split('_').collect::<Vec<_>>()[..] {
                    [_, _, uid] if orphan(uid) => uid.to_string(),
                    _ => return None,
                };
                Some((pod_logs_dir.join(name), uid))
            })
            .collect();
        Orphans { pods, logs }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.pods.is_empty() && self.logs.is_empty()
    }

    /// Leaves out the pods of these UIDs (the runtime still has them).
    pub(super) fn except(mut self, held: &HashSet<PodUid>) -> Orphans {
        let held = |uid: &String| held.contains(&PodUid(uid.clone()));
        self.pods.retain(|uid| !held(uid));
        self.logs.retain(|(_, uid)| !held(uid));
        self
    }

    /// Removes the directories, each pod's volumes unmounted first. Returns how many pod
    /// directories there were and how many could not be removed.
    pub(super) fn remove(self, volumes: &volumes::Manager) -> (usize, usize) {
        let mut failed = 0;
        for uid in &self.pods {
            match volumes.teardown(uid) {
                Ok(()) => {
                    tracing::info!(%uid, "removed the directory of a pod the node no longer has")
                }
                Err(e) => {
                    failed += 1;
                    tracing::warn!(%uid, error = %crate::types::error_chain(&e), "cannot remove the directory of a pod the node no longer has");
                }
            }
        }
        for (dir, _) in &self.logs {
            match std::fs::remove_dir_all(dir) {
                Ok(()) => {
                    tracing::info!(dir = %dir.display(), "removed the logs of a pod the node no longer has")
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot remove the logs of a pod the node no longer has")
                }
            }
        }
        (self.pods.len(), failed)
    }
}

/// What an ended pod left, tried again with a doubling wait.
pub(super) struct Leftover {
    pod: Target,
    log_dir: PathBuf,
    wait: Duration,
    next: tokio::time::Instant,
}

/// How long past its grace period a termination may take before the pod is reported ended
/// even though the runtime has not confirmed its stop.
const TERMINATION_SLACK: Duration = Duration::from_secs(10);
/// The status reason of such a pod.
const UNCONFIRMED_STOP: &str = "StopUnconfirmed";
/// The waits between attempts to remove what an ended pod left.
const LEFTOVER_RETRY_FIRST: Duration = Duration::from_secs(2);
const LEFTOVER_RETRY_MAX: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphans_are_the_pod_and_log_directories_of_no_kept_pod() {
        let dir = tempfile::tempdir().unwrap();
        let (root, logs) = (dir.path().join("root"), dir.path().join("logs"));
        for d in [
            "root/pods/kept",
            "root/pods/gone",
            "root/pods/held",
            "logs/ns_web_kept",
            "logs/ns_web_gone/c",
            "logs/notes",
            "logs/a_b_c_gone",
            "elsewhere",
        ] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("pods/link")).unwrap();
        let keep = HashSet::from([PodUid("kept".into())]);
        let orphans = Orphans::find(&root, &logs, &keep);
        let mut pods = orphans.pods.clone();
        pods.sort();
        assert_eq!(pods, ["gone", "held"]);
        assert_eq!(
            orphans.logs,
            [(logs.join("ns_web_gone"), "gone".to_string())]
        );
        let held = HashSet::from([PodUid("held".into())]);
        let volumes = volumes::Manager::new(&root);
        assert_eq!(orphans.except(&held).remove(&volumes), (1, 0));
        assert!(!root.join("pods/gone").exists() && !logs.join("ns_web_gone").exists());
        for d in [
            "root/pods/kept",
            "root/pods/held",
            "root/pods/link",
            "logs/ns_web_kept",
        ] {
            assert!(dir.path().join(d).exists(), "{d} is kept");
        }
        for d in ["logs/notes", "logs/a_b_c_gone", "elsewhere"] {
            assert!(dir.path().join(d).exists(), "{d} is no pod's");
        }
    }
}

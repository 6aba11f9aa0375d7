//! A pod's end: its containers stopped in upstream's order within the grace period, the
//! termination reported within the grace period and a slack even when the runtime does not
//! confirm the stop, its final status, and what it left on the node removed, in the background
//! when it cannot be at once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{Error, Syncer, actions, convert, failure, hooks, ignore_not_found, watched};
use crate::events::Target;
use crate::pod::{grace_period_seconds, spec};
use crate::runtime::{self, ContainerState, PodRuntime};
use crate::types::{PodUid, full_name};
use crate::volumes;

impl Syncer {
    /// Stops every running container of the pod: app containers in parallel, then sidecars in
    /// reverse order, all within one grace period (preStop hooks first, then SIGTERM, then
    /// SIGKILL at the deadline); then stops its sandboxes and removes them all.
    pub(super) async fn kill_all(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
        remove: bool,
    ) -> Result<(), Error> {
        let live: Vec<&runtime::Container> = rt
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running || c.state == ContainerState::Created)
            .collect();
        let grace_of = |c: &runtime::Container| {
            Duration::from_secs(
                if pod.spec.is_some() {
                    grace_period_seconds(pod)
                } else {
                    c.grace_seconds.unwrap_or(30)
                }
                .max(0) as u64,
            )
        };
        let host = self.hook_host(pod, rt).await;
        // Upstream's termination order: every container's preStop hook runs at once; the app
        // containers then get their stop signal, each sidecar only once the app containers and
        // the sidecars after it have stopped (reverse order), within its own grace period.
        let s = spec(pod);
        let sidecars: Vec<&str> = s
            .init_containers
            .iter()
            .flatten()
            .filter(|c| actions::is_sidecar(c))
            .map(|c| c.name.as_str())
            .collect();
        let stopped: HashMap<&str, CancellationToken> = live
            .iter()
            .map(|c| (c.name.as_str(), CancellationToken::new()))
            .collect();
        let apps: Vec<CancellationToken> = live
            .iter()
            .filter(|c| !sidecars.contains(&c.name.as_str()))
            .filter_map(|c| stopped.get(c.name.as_str()).cloned())
            .collect();
        let mut stops = JoinSet::new();
        for c in &live {
            let name = c.name.as_str();
            let turn = sidecars.iter().position(|s| *s == name).map(|i| {
                let mut before: Vec<CancellationToken> = apps.clone();
                before.extend(
                    sidecars[i + 1..]
                        .iter()
                        .filter_map(|later| stopped.get(later).cloned()),
                );
                Box::pin(async move {
                    for t in before {
                        t.cancelled().await;
                    }
                }) as hooks::Turn
            });
            let done = stopped.get(name).cloned().unwrap_or_default();
            let stop = self.stop(
                pod,
                &c.id,
                name,
                &host,
                hooks::Grace {
                    period: grace_of(c),
                    turn,
                },
                format!("Stopping container {name}"),
            );
            stops.spawn(async move {
                let result = stop.await;
                done.cancel();
                result
            });
        }
        // Every stop runs to its end; the first failure is reported after all of them.
        let mut first_error: Option<Error> = None;
        while let Some(joined) = stops.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(e.into());
                }
                Err(e) => {
                    first_error.get_or_insert(Error::Io {
                        path: PathBuf::from(full_name(pod)),
                        source: std::io::Error::other(e.to_string()),
                    });
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        for sb in &rt.sandboxes {
            let stop = self.runtime.stop_pod_sandbox(&sb.id);
            let what = format!("the stop of its sandbox {}", sb.id);
            let target = Target::pod(pod);
            let reporting = (&self.events, &self.diagnoses);
            let stopped = watched(reporting, &target, &what, Duration::ZERO, stop).await;
            ignore_not_found(stopped)?;
        }
        // A pod being replaced keeps its dead containers (their last state and logs) for the
        // garbage collection of later syncs; a terminated pod leaves nothing behind.
        if !remove {
            return Ok(());
        }
        for c in &rt.containers {
            self.remove_container(pod, rt, &c.id).await?;
        }
        for sb in &rt.sandboxes {
            ignore_not_found(self.runtime.remove_pod_sandbox(&sb.id).await)?;
        }
        Ok(())
    }

    pub(super) async fn terminate(&self, pod: &Pod) -> Result<(), Error> {
        let uid = PodUid::of(pod);
        let _removing = self.cache.removing(&uid);
        let began = *self
            .terminations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(uid.clone())
            .or_insert_with(tokio::time::Instant::now);
        let grace = Duration::from_secs(grace_period_seconds(pod).max(0) as u64);
        let stop = async {
            let rt = self.read(pod).await?;
            if !rt.containers.is_empty() {
                self.kill_all(pod, &rt, false).await?;
            }
            Ok::<(), Error>(())
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
        }
        self.terminations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uid);
        let rt = self.runtime.pod_runtime(&uid).await?;
        self.kill_all(pod, &rt, true).await?;
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
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        self.backoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget_pod(&uid.0);
        self.images.forget_pod(uid);
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    /// Removes what an ended pod left on the node (its volumes and directory, cgroup and log
    /// directory). What cannot be removed goes on the cleanup list with why (a CleanupPending
    /// warning the first time) and is tried again by housekeeping; it holds nothing up.
    pub(super) fn clean_up(&self, uid: &PodUid, leftover: Leftover) {
        let mut left = Vec::new();
        if let Err(e) = volumes::teardown(&self.ctx.root_dir, &uid.0) {
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

//! Upstream's pod startup latency tracker, for the pods of the API server (static pods are
//! not tracked): from a pod's creation to the watch showing all its containers started, as
//! `kubelet_pod_start_total_duration_seconds`, and without the time spent pulling its images
//! and running its init containers, as `kubelet_pod_start_sli_duration_seconds` (SIG
//! Scalability's pod startup SLI) and, for the first pod on the pod network, as
//! `kubelet_first_network_pod_start_sli_duration_seconds`.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;

use crate::pod::spec;

/// The process-wide tracker.
pub fn get() -> &'static Tracker {
    static TRACKER: OnceLock<Tracker> = OnceLock::new();
    TRACKER.get_or_init(|| Tracker {
        state: Mutex::new(State::default()),
    })
}

pub struct Tracker {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The pods being tracked, by UID.
    pods: HashMap<String, Tracked>,
    /// Pods seen unschedulable: never tracked again.
    excluded: HashSet<String>,
    first_network_pod_seen: bool,
}

#[derive(Default)]
struct Tracked {
    /// The pod's image pulls, from start to end.
    pulls: Vec<(Instant, Instant)>,
    /// A status pushed to the API server showed every container started.
    running_pushed: bool,
    /// The watch showed every container started before the push that said so had returned:
    /// the startup as measured then.
    seen_started: Option<Startup>,
    recorded: bool,
}

/// A pod's startup as the watch showed it.
struct Startup {
    /// Seconds from the pod's creation.
    total: f64,
    /// Seconds its init containers ran.
    init: f64,
    stateful: bool,
    host_network: bool,
}

impl Startup {
    fn of(pod: &Pod) -> Option<Startup> {
        let created = pod.metadata.creation_timestamp.as_ref()?;
        let total = (crate::types::now().as_nanosecond() - created.0.as_nanosecond()) as f64 / 1e9;
        // Upstream's stateful pod: one with a volume other than the ephemeral kinds.
        let stateful = !spec(pod).volumes.iter().flatten().all(|v| {
            v.secret.is_some()
                || v.config_map.is_some()
                || v.downward_api.is_some()
                || v.empty_dir.is_some()
                || v.projected.is_some()
        });
        Some(Startup {
            total,
            init: init_seconds(pod),
            stateful,
            host_network: spec(pod).host_network == Some(true),
        })
    }
}

impl State {
    /// Records the startup of the tracked pod of this UID.
    fn record(&mut self, uid: &str, startup: Startup) {
        let Some(tracked) = self.pods.get_mut(uid) else {
            return;
        };
        tracked.recorded = true;
        let pulling = pulling_seconds(&mut std::mem::take(&mut tracked.pulls));
        let sli = startup.total - pulling - startup.init;
        let first_network =
            !startup.stateful && !startup.host_network && !self.first_network_pod_seen;
        self.first_network_pod_seen |= first_network;
        tracing::info!(%uid, total = startup.total, sli, pulling, init = startup.init, stateful = startup.stateful, "observed the pod's startup");
        let sli = (!startup.stateful).then_some(sli);
        crate::metrics::get().pod_start_observed(startup.total, sli, first_network);
    }
}

impl Tracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The watch of the node's pods delivered this API pod (not a mirror pod), as the API
    /// server has it. A pod first seen before it started is tracked; once a pushed status said
    /// its containers all started and the watch shows it so, its startup is recorded.
    pub fn observed_on_watch(&self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return;
        };
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref());
        let mut state = self.lock();
        if matches!(phase, Some("Succeeded" | "Failed")) {
            state.pods.remove(uid);
            return;
        }
        let unschedulable = (status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten())
        .any(|c| c.type_ == "PodScheduled" && c.status == "False");
        let Some(tracked) = state.pods.get_mut(uid) else {
            if state.excluded.contains(uid) || status.is_some_and(|s| s.start_time.is_some()) {
                return;
            }
            if unschedulable {
                state.excluded.insert(uid.to_string());
            } else {
                state.pods.insert(uid.to_string(), Tracked::default());
            }
            return;
        };
        if unschedulable {
            state.pods.remove(uid);
            state.excluded.insert(uid.to_string());
            return;
        }
        if tracked.recorded || tracked.seen_started.is_some() || !all_started(pod) {
            return;
        }
        let Some(startup) = Startup::of(pod) else {
            return;
        };
        if tracked.running_pushed {
            state.record(uid, startup);
        } else {
            tracked.seen_started = Some(startup);
        }
    }

    /// A status of the pod of this UID was pushed to the API server.
    pub fn status_pushed(&self, uid: &str, pod: &Pod) {
        let mut state = self.lock();
        let Some(tracked) = state.pods.get_mut(uid) else {
            return;
        };
        if tracked.recorded || !all_started(pod) {
            return;
        }
        tracked.running_pushed = true;
        if let Some(startup) = tracked.seen_started.take() {
            state.record(uid, startup);
        }
    }

    /// A pull of an image for the pod of this UID, begun at `started`, ended now.
    pub fn pulled(&self, uid: &str, started: Instant) {
        if let Some(tracked) = self.lock().pods.get_mut(uid) {
            tracked.pulls.push((started, Instant::now()));
        }
    }

    /// The pod left the API server.
    pub fn forget(&self, uid: &str) {
        let mut state = self.lock();
        state.pods.remove(uid);
        state.excluded.remove(uid);
    }
}

/// Whether every container of the status is running (upstream's rule, but for a status with
/// no containers yet, which nodelet does not count as started).
fn all_started(pod: &Pod) -> bool {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    statuses.is_some_and(|all| {
        !all.is_empty()
            && all.iter().all(|c| {
                (c.state.as_ref().and_then(|s| s.running.as_ref()))
                    .is_some_and(|r| r.started_at.is_some())
            })
    })
}

/// The time the pulls took together, overlaps counted once.
fn pulling_seconds(pulls: &mut [(Instant, Instant)]) -> f64 {
    pulls.sort();
    let mut total = 0.0;
    let mut covered: Option<Instant> = None;
    for &(start, end) in pulls.iter() {
        let from = covered.map_or(start, |c| c.max(start));
        if end > from {
            total += (end - from).as_secs_f64();
        }
        covered = Some(covered.map_or(end, |c| c.max(end)));
    }
    total
}

/// How long the pod's init containers (not its sidecars) ran, from their statuses.
fn init_seconds(pod: &Pod) -> f64 {
    let sidecars: HashSet<&str> = (spec(pod).init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref());
    (statuses.into_iter().flatten())
        .filter(|c| !sidecars.contains(c.name.as_str()))
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .filter_map(|t| {
            let (start, end) = (t.started_at.as_ref()?, t.finished_at.as_ref()?);
            Some((end.0.as_nanosecond() - start.0.as_nanosecond()).max(0) as f64 / 1e9)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_pulls_count_once() {
        let t = Instant::now();
        let s = std::time::Duration::from_secs;
        let mut pulls = vec![
            (t + s(2), t + s(5)),
            (t, t + s(3)),
            (t + s(10), t + s(11)),
            (t + s(3), t + s(4)),
        ];
        assert_eq!(pulling_seconds(&mut pulls), 6.0);
        assert_eq!(pulling_seconds(&mut []), 0.0);
    }

    fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn init_containers_count_from_start_to_finish_and_sidecars_not_at_all() {
        let p = pod(r#"
metadata: {name: p, uid: u}
spec:
  initContainers: [{name: setup, image: i}, {name: side, image: i, restartPolicy: Always}]
  containers: [{name: c, image: i}]
status:
  initContainerStatuses:
  - name: setup
    image: i
    imageID: i
    ready: false
    restartCount: 0
    state: {terminated: {exitCode: 0, startedAt: "2026-01-01T00:00:01Z", finishedAt: "2026-01-01T00:00:04Z"}}
  - name: side
    image: i
    imageID: i
    ready: true
    restartCount: 0
    state: {terminated: {exitCode: 0, startedAt: "2026-01-01T00:00:01Z", finishedAt: "2026-01-01T00:01:00Z"}}
  containerStatuses:
  - name: c
    image: i
    imageID: i
    ready: true
    restartCount: 0
    state: {running: {startedAt: "2026-01-01T00:00:05Z"}}
"#);
        assert_eq!(init_seconds(&p), 3.0);
        assert!(all_started(&p));
        let waiting = pod(
            "metadata: {name: p}\nstatus: {containerStatuses: [{name: c, image: i, imageID: i, ready: false, restartCount: 0, state: {waiting: {}}}]}\n",
        );
        assert!(!all_started(&waiting));
        assert!(!all_started(&pod("metadata: {name: p}\nstatus: {}\n")));
    }
}

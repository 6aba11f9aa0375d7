//! Liveness, readiness and startup probes: one worker per probed running container, results
//! kept per container ID and reported on change only. The startup probe gates the others.
//!
//! Readiness and startup results are also kept in a checkpoint file in the root dir, so a
//! restarted agent reports the running containers it finds as Ready and Started as they were,
//! not as new, until their probes say otherwise.

mod check;

pub use check::{Target, attempt, exec_outcome};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Container as SpecContainer, Pod, Probe};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::events::{self, Recorder};
use crate::pod::spec;
use crate::runtime::{ContainerState, PodRuntime, RuntimeClient};
use crate::types::PodUid;

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Liveness,
    Readiness,
    Startup,
}

impl Kind {
    fn of(self, c: &SpecContainer) -> Option<&Probe> {
        match self {
            Kind::Liveness => c.liveness_probe.as_ref(),
            Kind::Readiness => c.readiness_probe.as_ref(),
            Kind::Startup => c.startup_probe.as_ref(),
        }
    }

    /// The `probe_type` label upstream's probe metrics use.
    fn metric_name(self) -> &'static str {
        match self {
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
            Kind::Startup => "Startup",
        }
    }
}

/// A probe result that changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update {
    pub uid: PodUid,
    pub container: String,
    pub kind: Kind,
    pub success: bool,
}

/// Probe results by container ID; a missing result means "not known yet".
#[derive(Clone, Default)]
pub struct Results {
    by_container: Arc<Mutex<HashMap<(String, Kind), bool>>>,
    /// Where readiness and startup results are kept across restarts.
    checkpoint: Option<Arc<PathBuf>>,
}

/// The checkpoint's content: the readiness and startup results of each container by ID.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Checkpoint {
    containers: BTreeMap<String, Kept>,
}

#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Kept {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ready: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    started: Option<bool>,
}

/// The checkpoint file's name in the root dir.
pub const CHECKPOINT_FILE: &str = "probe_results_state";

impl Results {
    /// Results kept in the checkpoint under `root_dir`, starting with those it holds for the
    /// containers in `running` (a restarted agent's containers).
    pub fn restore(root_dir: &Path, running: &HashSet<String>) -> Results {
        let path = root_dir.join(CHECKPOINT_FILE);
        let kept = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<Checkpoint>(&bytes).unwrap_or_else(|e| {
                tracing::warn!(file = %path.display(), error = %e, "the probe results checkpoint is not readable; containers start as not ready until probed");
                Checkpoint::default()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Checkpoint::default(),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot read the probe results checkpoint; containers start as not ready until probed");
                Checkpoint::default()
            }
        };
        let mut by_container = HashMap::new();
        for (id, kept) in kept.containers {
            if !running.contains(&id) {
                continue;
            }
            for (kind, result) in [(Kind::Readiness, kept.ready), (Kind::Startup, kept.started)] {
                if let Some(result) = result {
                    by_container.insert((id.clone(), kind), result);
                }
            }
        }
        Results {
            by_container: Arc::new(Mutex::new(by_container)),
            checkpoint: Some(Arc::new(path)),
        }
    }

    pub fn get(&self, container_id: &str, kind: Kind) -> Option<bool> {
        self.lock().get(&(container_id.to_string(), kind)).copied()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, Kind), bool>> {
        self.by_container.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a result; true when it changed.
    fn set(&self, container_id: &str, kind: Kind, success: bool) -> bool {
        let mut results = self.lock();
        let changed = results.insert((container_id.to_string(), kind), success) != Some(success);
        if changed && kind != Kind::Liveness {
            self.save(&results);
        }
        changed
    }

    fn forget(&self, container_id: &str) {
        let mut results = self.lock();
        let before = results.len();
        results.retain(|(id, _), _| id != container_id);
        if results.len() != before {
            self.save(&results);
        }
    }

    /// Writes the readiness and startup results to the checkpoint, under the results' lock so
    /// that the last change is the last written.
    fn save(&self, results: &HashMap<(String, Kind), bool>) {
        let Some(path) = &self.checkpoint else { return };
        let mut kept = Checkpoint::default();
        for ((id, kind), result) in results {
            let entry = kept.containers.entry(id.clone()).or_default();
            match kind {
                Kind::Readiness => entry.ready = Some(*result),
                Kind::Startup => entry.started = Some(*result),
                Kind::Liveness => {}
            }
        }
        kept.containers
            .retain(|_, k| k.ready.is_some() || k.started.is_some());
        let written = crate::types::replace_json(path, &kept);
        if let Err(e) = written {
            tracing::warn!(file = %path.display(), error = %e, "cannot write the probe results checkpoint; a restart will report the containers as not ready until probed");
        }
    }

    /// Has the container failed its liveness or startup probe (it must be restarted)?
    pub fn unhealthy(&self, container_id: &str) -> Option<Kind> {
        [Kind::Liveness, Kind::Startup]
            .into_iter()
            .find(|k| self.get(container_id, *k) == Some(false))
    }

    /// (ready, started) of a running container, per its spec's probes: without a startup probe
    /// it is started; without a readiness probe it is ready once started.
    pub fn state(&self, container_id: &str, spec: &SpecContainer) -> (bool, bool) {
        let started =
            spec.startup_probe.is_none() || self.get(container_id, Kind::Startup) == Some(true);
        let ready = started
            && (spec.readiness_probe.is_none()
                || self.get(container_id, Kind::Readiness) == Some(true));
        (ready, started)
    }
}

/// Owns the probe workers.
pub struct Manager {
    runtime: RuntimeClient,
    results: Results,
    workers: Mutex<HashMap<(String, Kind), (PodUid, CancellationToken)>>,
    updates: mpsc::UnboundedSender<Update>,
    events: Recorder,
    /// Each probe's latest attempt shows in its pod's diagnosis (`nodelet describe`).
    diagnoses: crate::status::Diagnoses,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl Manager {
    pub fn new(
        runtime: RuntimeClient,
        results: Results,
        updates: mpsc::UnboundedSender<Update>,
        (events, diagnoses): (Recorder, crate::status::Diagnoses),
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        Manager {
            runtime,
            events,
            diagnoses,
            results,
            workers: Mutex::new(HashMap::new()),
            updates,
            tracker,
            cancel,
        }
    }

    pub fn results(&self) -> &Results {
        &self.results
    }

    fn workers(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, Kind), (PodUid, CancellationToken)>> {
        self.workers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a worker for each probe of each running container of the pod that has none, and
    /// stops the workers of the pod's containers that no longer run.
    pub fn sync_pod(&self, pod: &Pod, rt: &PodRuntime, pod_ip: &str) {
        let uid = PodUid::of(pod);
        let s = spec(pod);
        let running: HashMap<&str, &crate::runtime::Container> = rt
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
            .map(|c| (c.id.as_str(), c))
            .collect();
        let mut workers = self.workers();
        workers.retain(|(id, _), (owner, token)| {
            let keep = *owner != uid || running.contains_key(id.as_str());
            if !keep {
                token.cancel();
                self.results.forget(id);
            }
            keep
        });
        for c in running.values() {
            // The container's startup worker wakes its other workers when it succeeds.
            let started = Arc::new(tokio::sync::Notify::new());
            // App containers and sidecars are probed; run-to-completion init containers are not.
            let Some(want) = s
                .containers
                .iter()
                .chain(
                    s.init_containers
                        .iter()
                        .flatten()
                        .filter(|i| crate::pod::is_sidecar(i)),
                )
                .find(|w| w.name == c.name)
            else {
                continue;
            };
            for kind in [Kind::Startup, Kind::Liveness, Kind::Readiness] {
                let Some(probe) = kind.of(want) else { continue };
                let key = (c.id.clone(), kind);
                if workers.contains_key(&key) {
                    continue;
                }
                // Not ready until probed, unless the checkpoint says how it was before a restart.
                if kind == Kind::Readiness && self.results.get(&c.id, kind).is_none() {
                    self.results.set(&c.id, kind, false);
                }
                let token = self.cancel.child_token();
                workers.insert(key, (uid.clone(), token.clone()));
                let worker = Worker {
                    runtime: self.runtime.clone(),
                    results: self.results.clone(),
                    updates: self.updates.clone(),
                    uid: uid.clone(),
                    target: events::Target::container(pod, &want.name),
                    events: self.events.clone(),
                    diagnoses: self.diagnoses.clone(),
                    container: want.clone(),
                    container_id: c.id.clone(),
                    started_at: UNIX_EPOCH + Duration::from_nanos(c.started_at.max(0) as u64),
                    pod_ip: pod_ip.to_string(),
                    kind,
                    probe: probe.clone(),
                    started: started.clone(),
                };
                self.tracker.spawn(worker.run(token));
            }
        }
    }

    /// Stops every worker of the pod and forgets its results.
    pub fn remove_pod(&self, uid: &PodUid) {
        self.workers().retain(|(id, _), (owner, token)| {
            let keep = owner != uid;
            if !keep {
                token.cancel();
                self.results.forget(id);
            }
            keep
        });
    }
}

struct Worker {
    runtime: RuntimeClient,
    results: Results,
    updates: mpsc::UnboundedSender<Update>,
    uid: PodUid,
    target: events::Target,
    events: Recorder,
    diagnoses: crate::status::Diagnoses,
    container: SpecContainer,
    container_id: String,
    started_at: SystemTime,
    pod_ip: String,
    kind: Kind,
    probe: Probe,
    /// Notified when the container's startup probe succeeds.
    started: Arc<tokio::sync::Notify>,
}

impl Worker {
    async fn run(self, cancel: CancellationToken) {
        let delay =
            Duration::from_secs(self.probe.initial_delay_seconds.unwrap_or(0).max(0) as u64);
        let since_start = SystemTime::now()
            .duration_since(self.started_at)
            .unwrap_or_default();
        let period = Duration::from_secs(self.probe.period_seconds.unwrap_or(10).max(1) as u64);
        let success_threshold = self.probe.success_threshold.unwrap_or(1).max(1) as u32;
        let failure_threshold = self.probe.failure_threshold.unwrap_or(3).max(1) as u32;
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(delay.saturating_sub(since_start)) => {}
        }
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut successes, mut failures) = (0u32, 0u32);
        let ports = self.container.ports.clone().unwrap_or_default();
        // Gated by the startup probe, a worker probes at once when it succeeds, as upstream
        // (a readiness probe with a long period does not hold readiness back for a period).
        let mut gated = false;
        loop {
            // A container found started (the checkpoint's result) needs no startup probe.
            if self.kind == Kind::Startup
                && self.results.get(&self.container_id, Kind::Startup) == Some(true)
            {
                return;
            }
            let started = self.started.notified();
            tokio::pin!(started);
            started.as_mut().enable();
            if !gated || self.results.get(&self.container_id, Kind::Startup) != Some(true) {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = ticker.tick() => {}
                    _ = started, if gated => {}
                }
            }
            gated = self.kind != Kind::Startup
                && self.container.startup_probe.is_some()
                && self.results.get(&self.container_id, Kind::Startup) != Some(true);
            if gated {
                continue;
            }
            let Some(ok) = self.attempt(&ports, &cancel).await else {
                return;
            };
            if ok {
                successes += 1;
                failures = 0;
            } else {
                failures += 1;
                successes = 0;
            }
            let result = if successes >= success_threshold {
                Some(true)
            } else if failures >= failure_threshold {
                Some(false)
            } else {
                None
            };
            if let Some(success) = result
                && self.report(success)
            {
                return;
            }
        }
    }

    /// One probe of the container, with its metrics, diagnosis and events: whether it
    /// succeeded; `None` when the worker was cancelled.
    async fn attempt(
        &self,
        ports: &[k8s_openapi::api::core::v1::ContainerPort],
        cancel: &CancellationToken,
    ) -> Option<bool> {
        let target = check::Target {
            container_id: &self.container_id,
            pod_ip: &self.pod_ip,
            ports,
        };
        let began = std::time::Instant::now();
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return None,
            // Boxed: the worker lives as long as its container, the check's state only while
            // it runs.
            r = Box::pin(check::attempt(&self.probe, &target, &self.runtime)) => r,
        };
        // A check that ended as the worker was stopped records nothing: its pod may be
        // forgotten already, and would come back in the metrics and diagnoses.
        if cancel.is_cancelled() {
            return None;
        }
        crate::metrics::get().probe(&crate::metrics::ProbeRun {
            probe_type: self.kind.metric_name(),
            success: outcome.is_ok(),
            container: &self.container.name,
            pod: &self.target.name,
            namespace: &self.target.namespace,
            pod_uid: &self.uid.0,
            took: began.elapsed(),
        });
        self.diagnoses.probed(
            &self.uid,
            &self.container.name,
            self.kind.metric_name(),
            outcome.as_ref().err().map(String::as_str),
        );
        let (reason, message) = match &outcome {
            Ok(None) => return Some(true),
            Ok(Some(warning)) => ("ProbeWarning", format!("probe warning: {warning}")),
            Err(why) => ("Unhealthy", format!("probe failed: {why}")),
        };
        let message = format!("{} {message}", self.kind.metric_name());
        self.events.warning(self.target.clone(), reason, message);
        Some(outcome.is_ok())
    }

    /// Records a result that passed its threshold and tells the pod's sync about a change;
    /// true when the worker is done: a started container's startup probe, or a failed
    /// liveness or startup probe (the container's successor gets a new worker).
    fn report(&self, success: bool) -> bool {
        if !self.results.set(&self.container_id, self.kind, success) {
            return false;
        }
        if self.kind == Kind::Startup && success {
            self.started.notify_waiters();
        }
        let _ = self.updates.send(Update {
            uid: self.uid.clone(),
            container: self.container.name.clone(),
            kind: self.kind,
            success,
        });
        (self.kind == Kind::Startup && success) || (self.kind != Kind::Readiness && !success)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_decide_ready_and_started() {
        let results = Results::default();
        let plain = SpecContainer::default();
        assert_eq!(results.state("c1", &plain), (true, true));
        let probed = SpecContainer {
            readiness_probe: Some(Probe::default()),
            startup_probe: Some(Probe::default()),
            ..Default::default()
        };
        assert_eq!(results.state("c1", &probed), (false, false));
        results.set("c1", Kind::Readiness, true);
        assert_eq!(
            results.state("c1", &probed),
            (false, false),
            "not ready before started"
        );
        results.set("c1", Kind::Startup, true);
        assert_eq!(results.state("c1", &probed), (true, true));
        assert_eq!(results.unhealthy("c1"), None);
        assert!(results.set("c1", Kind::Liveness, false));
        assert!(
            !results.set("c1", Kind::Liveness, false),
            "no change, no update"
        );
        assert_eq!(results.unhealthy("c1"), Some(Kind::Liveness));
        results.forget("c1");
        assert_eq!(results.get("c1", Kind::Readiness), None);
    }

    #[test]
    fn readiness_and_startup_outlive_a_restart_for_running_containers() {
        let dir = tempfile::tempdir().expect("a temporary dir");
        let running: HashSet<String> = ["c1".to_string(), "c2".to_string()].into();
        let results = Results::restore(dir.path(), &running);
        assert_eq!(
            results.get("c1", Kind::Readiness),
            None,
            "no checkpoint yet"
        );
        results.set("c1", Kind::Readiness, true);
        results.set("c1", Kind::Startup, true);
        results.set("c1", Kind::Liveness, true);
        results.set("c2", Kind::Readiness, false);
        results.set("c3", Kind::Readiness, true);

        let restarted = Results::restore(dir.path(), &running);
        assert_eq!(restarted.get("c1", Kind::Readiness), Some(true));
        assert_eq!(restarted.get("c1", Kind::Startup), Some(true));
        assert_eq!(
            restarted.get("c1", Kind::Liveness),
            None,
            "liveness starts anew"
        );
        assert_eq!(restarted.get("c2", Kind::Readiness), Some(false));
        assert_eq!(
            restarted.get("c3", Kind::Readiness),
            None,
            "c3 no longer runs"
        );

        restarted.forget("c1");
        let again = Results::restore(dir.path(), &running);
        assert_eq!(again.get("c1", Kind::Readiness), None);
        assert_eq!(again.get("c2", Kind::Readiness), Some(false));

        std::fs::write(dir.path().join(CHECKPOINT_FILE), "{").expect("written");
        let unreadable = Results::restore(dir.path(), &running);
        assert_eq!(unreadable.get("c2", Kind::Readiness), None);
    }
}

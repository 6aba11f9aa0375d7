//! Graceful node shutdown: which pods stop in which stage and with how much grace, and the
//! record of the last shutdown (its start and end, kept in the root dir for the metrics).

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use crate::config::ShutdownStage;
use crate::types::PodUid;

/// A pod's status reason and message once node shutdown stopped it (upstream's).
pub const REASON: &str = "Terminated";
pub const MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// Why a pod is refused while the node shuts down (upstream's).
pub const REFUSED_REASON: &str = "NodeShutdown";
pub const REFUSED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";

/// The pods one stage stops, each with its grace period in seconds, and how long the stage
/// waits for them before the next one begins.
#[derive(Debug)]
pub struct Stage {
    pub seconds: i64,
    pub pods: Vec<(Arc<Pod>, i64)>,
}

/// The whole time a shutdown of `stages` may take: the sum of their times.
pub fn budget(stages: &[ShutdownStage]) -> Duration {
    let seconds: i64 = stages.iter().map(|s| s.seconds.max(0)).sum();
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// Puts each pod in the stage of its priority: the last stage whose priority is at or below
/// the pod's (the first stage for pods below every stage). A pod's grace is the stage's time,
/// or its own grace period where that is shorter. Stages come lowest priority first; the empty
/// ones are left out, so no time is spent waiting on them.
pub fn plan(stages: &[ShutdownStage], pods: Vec<Arc<Pod>>) -> Vec<Stage> {
    let mut out: Vec<Stage> = stages
        .iter()
        .map(|s| Stage {
            seconds: s.seconds,
            pods: Vec::new(),
        })
        .collect();
    for pod in pods {
        let priority = crate::pod::priority(&pod);
        let index = stages
            .iter()
            .rposition(|s| s.priority <= priority)
            .unwrap_or(0);
        let Some(stage) = out.get_mut(index) else {
            continue;
        };
        let grace = crate::pod::grace_period_seconds(&pod).clamp(0, stage.seconds);
        stage.pods.push((pod, grace));
    }
    out.retain(|s| !s.pods.is_empty());
    out
}

/// A node shutdown under way: which stage runs, until when, and which stopped pods are not
/// down yet. Pure bookkeeping; the sync loop stops the pods and records their statuses.
#[derive(Debug)]
pub struct Progress {
    /// The stages still to come.
    stages: VecDeque<Stage>,
    /// The current stage's pods not down yet.
    current: HashSet<PodUid>,
    /// Every stopped pod not down yet.
    waiting: HashMap<PodUid, Arc<Pod>>,
    /// When the current stage's time is up.
    deadline: Instant,
    /// When the whole budget is spent.
    end: Instant,
    finished: bool,
}

/// What [`Progress::advance`] asks of its caller.
#[derive(Debug, Default)]
pub struct Advance {
    /// Pods whose stage's time is up while they are still stopping: their final status is
    /// recorded now.
    pub overdue: Vec<Arc<Pod>>,
    /// The shutdown just ended: every pod is down, or the budget is spent.
    pub finished: bool,
}

impl Progress {
    /// A shutdown of `stages` (see [`plan`]) with `budget` in all, beginning at `now`; nothing
    /// is stopped until [`Progress::advance`].
    pub fn new(stages: Vec<Stage>, budget: Duration, now: Instant) -> Progress {
        Progress {
            stages: stages.into(),
            current: HashSet::new(),
            waiting: HashMap::new(),
            deadline: now,
            end: now + budget,
            finished: false,
        }
    }

    /// A stopped pod is down; false when it was not one of the shutdown's.
    pub fn down(&mut self, uid: &PodUid) -> bool {
        self.current.remove(uid);
        self.waiting.remove(uid).is_some()
    }

    /// Moves on at `now`: once the current stage's pods are down or its time is up, the next
    /// stage with pods begins (`stop` stops a pod with the grace given, false when it is not
    /// running); after the last stage the shutdown ends when every pod is down or the budget
    /// is spent.
    pub fn advance(
        &mut self,
        now: Instant,
        mut stop: impl FnMut(&Arc<Pod>, i64) -> bool,
    ) -> Advance {
        let mut out = Advance::default();
        if self.current.is_empty() || now >= self.deadline {
            for uid in std::mem::take(&mut self.current) {
                out.overdue.extend(self.waiting.get(&uid).cloned());
            }
            while let Some(stage) = self.stages.pop_front() {
                for (pod, grace) in stage.pods {
                    if stop(&pod, grace) {
                        let uid = PodUid::of(&pod);
                        self.current.insert(uid.clone());
                        self.waiting.insert(uid, pod);
                    }
                }
                if !self.current.is_empty() {
                    let seconds = u64::try_from(stage.seconds).unwrap_or(0);
                    self.deadline = now + Duration::from_secs(seconds);
                    break;
                }
            }
        }
        if !self.finished
            && self.current.is_empty()
            && self.stages.is_empty()
            && (self.waiting.is_empty() || now >= self.end)
        {
            self.finished = true;
            out.finished = true;
        }
        out
    }

    /// When the shutdown must move on even if no pod goes down: the end of the current stage,
    /// else, after the last stage, the end of the budget while pods are still stopping.
    pub fn deadline(&self) -> Option<Instant> {
        if !self.current.is_empty() {
            Some(self.deadline)
        } else if !self.finished && !self.waiting.is_empty() {
            Some(self.end)
        } else {
            None
        }
    }

    /// Pods stopped and not down yet.
    pub fn still_stopping(&self) -> usize {
        self.waiting.len()
    }
}

/// The last node shutdown, as upstream keeps it (`graceful_node_shutdown_state`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub start_time: Option<Time>,
    pub end_time: Option<Time>,
}

fn record_path(root_dir: &Path) -> PathBuf {
    root_dir.join("graceful_node_shutdown_state")
}

impl Record {
    /// The record in `root_dir`, if there is a readable one.
    pub fn load(root_dir: &Path) -> Option<Record> {
        let text = std::fs::read(record_path(root_dir)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Writes the record (whole, through a temporary file) and shows it in the metrics.
    pub fn store(&self, root_dir: &Path) {
        self.show();
        let path = record_path(root_dir);
        let written = crate::types::replace_json(&path, self);
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "cannot record the node shutdown");
        }
    }

    /// Sets the graceful shutdown metrics from the record.
    pub fn show(&self) {
        let seconds = |t: &Option<Time>| {
            t.as_ref()
                .map_or(0.0, |t| t.0.as_millisecond() as f64 / 1000.0)
        };
        crate::metrics::get().graceful_shutdown(seconds(&self.start_time), seconds(&self.end_time));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, priority: Option<i32>, grace: Option<i64>) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "uid": name},
                "spec": {
                    "containers": [],
                    "priority": priority,
                    "terminationGracePeriodSeconds": grace,
                },
            }))
            .unwrap(),
        )
    }

    fn names(stage: &Stage) -> Vec<(&str, i64)> {
        stage
            .pods
            .iter()
            .map(|(p, g)| (p.metadata.name.as_deref().unwrap(), *g))
            .collect()
    }

    #[test]
    fn pods_stop_by_priority_with_the_shorter_grace() {
        let stages = [
            ShutdownStage {
                priority: 0,
                seconds: 20,
            },
            ShutdownStage {
                priority: 1000,
                seconds: 5,
            },
            ShutdownStage {
                priority: 5000,
                seconds: 7,
            },
            ShutdownStage {
                priority: 2_000_000_000,
                seconds: 10,
            },
        ];
        let pods = vec![
            pod("low", Some(-5), None),
            pod("plain", None, Some(3)),
            pod("mid", Some(1000), Some(60)),
            pod("between", Some(4999), None),
            pod("top", Some(2_000_001_000), Some(0)),
        ];
        let plan = plan(&stages, pods);
        assert_eq!(plan.len(), 3, "the empty stage is left out: {plan:?}");
        assert_eq!(names(&plan[0]), [("low", 20), ("plain", 3)]);
        assert_eq!(plan[0].seconds, 20);
        assert_eq!(names(&plan[1]), [("mid", 5), ("between", 5)]);
        assert_eq!(names(&plan[2]), [("top", 0)]);
        assert_eq!(plan[2].seconds, 10);
    }

    #[test]
    fn stages_run_one_after_another_and_the_budget_bounds_the_end() {
        let stages = [
            ShutdownStage {
                priority: 0,
                seconds: 10,
            },
            ShutdownStage {
                priority: 100,
                seconds: 5,
            },
        ];
        let pods = vec![
            pod("a", None, None),
            pod("b", None, None),
            pod("c", Some(100), None),
        ];
        let t0 = Instant::now();
        let mut progress = Progress::new(plan(&stages, pods), Duration::from_secs(15), t0);
        let mut stopped = Vec::new();
        let mut stop = |p: &Arc<Pod>, grace: i64| {
            stopped.push((p.metadata.name.clone().unwrap(), grace));
            true
        };
        let step = progress.advance(t0, &mut stop);
        assert!(!step.finished && step.overdue.is_empty());
        assert_eq!(progress.deadline(), Some(t0 + Duration::from_secs(10)));
        assert!(progress.down(&PodUid("a".into())));
        let step = progress.advance(t0 + Duration::from_secs(1), &mut stop);
        assert!(step.overdue.is_empty(), "b is still within its stage");
        // b outlives its stage: c's stage begins, and b's status is due now.
        let t10 = t0 + Duration::from_secs(10);
        let step = progress.advance(t10, &mut stop);
        let overdue: Vec<_> = step
            .overdue
            .iter()
            .map(|p| p.metadata.name.clone())
            .collect();
        assert_eq!(overdue, [Some("b".to_string())]);
        assert_eq!(progress.deadline(), Some(t10 + Duration::from_secs(5)));
        assert!(progress.down(&PodUid("c".into())));
        let step = progress.advance(t10 + Duration::from_secs(1), &mut stop);
        assert!(!step.finished, "b may still go down within the budget");
        assert_eq!(progress.deadline(), Some(t0 + Duration::from_secs(15)));
        let step = progress.advance(t0 + Duration::from_secs(15), &mut stop);
        assert!(step.finished && step.overdue.is_empty());
        assert_eq!(progress.still_stopping(), 1);
        assert_eq!(progress.deadline(), None);
        assert_eq!(
            stopped,
            [("a".into(), 10), ("b".into(), 10), ("c".into(), 5)]
        );
    }

    #[test]
    fn a_record_round_trips_through_the_root_dir() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Record::load(dir.path()), None);
        let record = Record {
            start_time: Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
            )),
            end_time: None,
        };
        record.store(dir.path());
        assert_eq!(Record::load(dir.path()), Some(record));
    }
}

//! The pod lifecycle event generator: relists the runtime, keeps what it read as the pod cache
//! syncs start from, diffs sandbox and container states into events that wake pod workers, and
//! reports itself unhealthy when relists stop. Where the runtime streams container events
//! (GetContainerEvents, the EventedPLEG gate), events and syncs waiting for a fresh reading start
//! a relist (at most one per [`EVENT_RELIST_GAP`]), and the periodic relist is a safety net every
//! 300 s (unhealthy after 10 min); otherwise, and while the stream is broken, it relists every
//! second (unhealthy after 3 min), as upstream.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::runtime::{ContainerState, PodCache, PodRuntime, RuntimeClient, SandboxState};
use crate::types::PodUid;

/// Relist period (upstream: 1 s).
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);
/// A PLEG whose last relist is older than this is unhealthy (upstream: 3 min).
pub const UNHEALTHY_AFTER: Duration = Duration::from_secs(180);
/// Relist period while the runtime streams container events (upstream: 300 s).
pub const EVENTED_RELIST_PERIOD: Duration = Duration::from_secs(300);
/// A PLEG with container events whose last relist is older than this is unhealthy (upstream:
/// 10 min).
pub const EVENTED_UNHEALTHY_AFTER: Duration = Duration::from_secs(600);
/// The shortest time between two relists that events start. Events come in bursts (each pod's
/// sandbox and containers, many pods at once): a relist for each one read every sandbox and
/// container of the node hundreds of times during a burst of 110 pods, doubling the agent's CPU
/// time; one relist per gap reads all the events of the gap at once.
const EVENT_RELIST_GAP: Duration = Duration::from_millis(200);
/// Delays between attempts to open the event stream: 1 s doubling to 30 s.
const STREAM_RETRY_FIRST: Duration = Duration::from_secs(1);
const STREAM_RETRY_MAX: Duration = Duration::from_secs(30);
/// How long an event stream must have been open before the relists slow down: the runtime
/// subscribes the stream when the call reaches it, and a relist every second until then covers
/// what happens before.
const STREAM_SETTLE: Duration = Duration::from_secs(1);

/// What happened to a sandbox or container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Started,
    Died,
    Removed,
    Changed,
}

/// One lifecycle event of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub uid: PodUid,
    pub kind: EventKind,
    /// The sandbox or container the event is about.
    pub id: String,
}

/// The state of one sandbox or container, as far as events care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Running,
    Exited,
    Created,
    Unknown,
}

/// Everything the runtime holds, by sandbox or container ID.
pub type Snapshot = HashMap<String, (PodUid, State)>;

/// The states of every sandbox and container of `pods`.
fn snapshot(pods: &HashMap<PodUid, PodRuntime>) -> Snapshot {
    let mut now = Snapshot::new();
    for (uid, rt) in pods {
        for sb in &rt.sandboxes {
            let state = match sb.state {
                SandboxState::Ready => State::Running,
                SandboxState::NotReady => State::Exited,
            };
            now.insert(sb.id.clone(), (uid.clone(), state));
        }
        for c in &rt.containers {
            let state = match c.state {
                ContainerState::Running => State::Running,
                ContainerState::Exited => State::Exited,
                ContainerState::Created => State::Created,
                ContainerState::Unknown => State::Unknown,
            };
            now.insert(c.id.clone(), (uid.clone(), state));
        }
    }
    now
}

/// The events that turn `old` into `new`, ordered by ID for stable output.
pub fn diff(old: &Snapshot, new: &Snapshot) -> Vec<Event> {
    let mut events = Vec::new();
    for (id, (uid, state)) in new {
        let kind = match (old.get(id).map(|(_, s)| *s), state) {
            (Some(before), now) if before == *now => continue,
            (None | Some(State::Created) | Some(State::Unknown), State::Running) => {
                EventKind::Started
            }
            (_, State::Exited) => EventKind::Died,
            _ => EventKind::Changed,
        };
        events.push(Event {
            uid: uid.clone(),
            kind,
            id: id.clone(),
        });
    }
    for (id, (uid, _)) in old {
        if !new.contains_key(id) {
            events.push(Event {
                uid: uid.clone(),
                kind: EventKind::Removed,
                id: id.clone(),
            });
        }
    }
    events.sort_by(|a, b| a.id.cmp(&b.id));
    events
}

/// Whether the PLEG relists in time; clone freely.
#[derive(Clone)]
pub struct Health(watch::Receiver<Relist>);

/// The outcome of the latest relists.
#[derive(Clone, Debug)]
pub struct Relist {
    /// When a relist last completed.
    pub succeeded: Instant,
    /// How long the PLEG may go without a relist and stay healthy.
    pub unhealthy_after: Duration,
    /// Why the latest relist failed, when it did (the runtime is not answering).
    pub error: Option<String>,
}

impl Health {
    /// `Err` with how long ago the last relist completed, and the threshold, when that is too
    /// long ago.
    pub fn check(&self) -> Result<(), (Duration, Duration)> {
        let relist = self.0.borrow();
        let age = relist.succeeded.elapsed();
        if age > relist.unhealthy_after {
            Err((age, relist.unhealthy_after))
        } else {
            Ok(())
        }
    }

    /// Why the runtime did not answer the latest relist, if it did not.
    pub fn runtime_error(&self) -> Option<String> {
        self.0.borrow().error.clone()
    }

    /// A health that just relisted, for tests of its readers.
    #[cfg(test)]
    pub(crate) fn healthy_for_tests() -> Health {
        Health(
            watch::channel(Relist {
                succeeded: Instant::now(),
                unhealthy_after: UNHEALTHY_AFTER,
                error: None,
            })
            .1,
        )
    }
}

/// Delays between relists while the runtime does not answer: 100 ms doubling to 5 s.
const FAILURE_BACKOFF_FIRST: Duration = Duration::from_millis(100);
const FAILURE_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The relisting task's state.
pub struct Pleg {
    runtime: RuntimeClient,
    cache: PodCache,
    last: Snapshot,
    relisted: watch::Sender<Relist>,
    /// Whether to follow the runtime's container events (the EventedPLEG gate).
    evented: bool,
}

impl Pleg {
    /// A PLEG relisting `runtime` into `cache`, woken by its container events when `evented`.
    pub fn new(runtime: RuntimeClient, cache: PodCache, evented: bool) -> Self {
        Pleg {
            runtime,
            cache,
            last: Snapshot::new(),
            relisted: watch::channel(Relist {
                succeeded: Instant::now(),
                unhealthy_after: UNHEALTHY_AFTER,
                error: None,
            })
            .0,
            evented,
        }
    }

    /// A health handle.
    pub fn health(&self) -> Health {
        Health(self.relisted.subscribe())
    }

    /// Every pod the runtime holds for a kubelet-like agent (the pod labels), by UID.
    async fn relist(&self) -> crate::runtime::Result<HashMap<PodUid, PodRuntime>> {
        let mut pods: HashMap<PodUid, PodRuntime> = HashMap::new();
        let mut owners: HashMap<String, PodUid> = HashMap::new();
        for sb in self.runtime.list_sandboxes(None).await? {
            if !sb.has_pod_labels {
                continue;
            }
            owners.insert(sb.id.clone(), sb.uid.clone());
            pods.entry(sb.uid.clone()).or_default().sandboxes.push(sb);
        }
        for c in self.runtime.list_containers(None).await? {
            if let Some(uid) = owners.get(&c.sandbox_id) {
                pods.entry(uid.clone()).or_default().containers.push(c);
            }
        }
        Ok(pods)
    }

    /// Relists and sends the events, until `cancel`.
    pub async fn run(self, events: mpsc::Sender<Event>, cancel: CancellationToken) {
        let nudge = Notify::new();
        let (streaming_tx, streaming) = watch::channel(false);
        let (runtime, evented) = (self.runtime.clone(), self.evented);
        let follow = async {
            if evented {
                follow_events(&runtime, &nudge, &streaming_tx, &cancel).await
            }
        };
        tokio::join!(self.relist_loop(events, &nudge, streaming, &cancel), follow);
    }

    /// Relists every period, and at once when `nudge`d or (while `streaming`) when a sync waits
    /// for a fresh reading, until `cancel`.
    async fn relist_loop(
        mut self,
        events: mpsc::Sender<Event>,
        nudge: &Notify,
        mut streaming: watch::Receiver<bool>,
        cancel: &CancellationToken,
    ) {
        let mut wait = Duration::ZERO;
        let mut failure_backoff = FAILURE_BACKOFF_FIRST;
        let mut last_relist: Option<Instant> = None;
        loop {
            let evented = *streaming.borrow_and_update();
            let by_event = tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => false,
                _ = nudge.notified() => true,
                _ = self.cache.relist_wanted(), if evented => true,
                _ = streaming.changed() => false,
            };
            if by_event && let Some(last) = last_relist {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep_until(last + EVENT_RELIST_GAP) => {}
                }
            }
            let evented = *streaming.borrow();
            let started = Instant::now();
            let pods = match self.relist().await {
                Ok(pods) => pods,
                Err(e) => {
                    if self.relisted.borrow().error.is_none() {
                        tracing::warn!(error = %crate::types::error_chain(&e), "the container runtime does not answer; retrying with backoff");
                    }
                    self.relisted
                        .send_modify(|r| r.error = Some(crate::types::error_chain(&e)));
                    wait = failure_backoff;
                    failure_backoff = (failure_backoff * 2).min(FAILURE_BACKOFF_MAX);
                    continue;
                }
            };
            if self.relisted.borrow().error.is_some() {
                tracing::info!("the container runtime answers again");
            }
            crate::metrics::get().pleg_relist(started.elapsed(), last_relist.map(|l| started - l));
            last_relist = Some(started);
            let (period, unhealthy_after) = if evented {
                (EVENTED_RELIST_PERIOD, EVENTED_UNHEALTHY_AFTER)
            } else {
                (RELIST_PERIOD, UNHEALTHY_AFTER)
            };
            self.relisted.send_replace(Relist {
                succeeded: Instant::now(),
                unhealthy_after,
                error: None,
            });
            failure_backoff = FAILURE_BACKOFF_FIRST;
            wait = period.saturating_sub(started.elapsed());
            let snapshot = snapshot(&pods);
            // The syncs these events wake start from this reading.
            self.cache.install(started, pods);
            for event in diff(&self.last, &snapshot) {
                tracing::trace!(?event, "pod lifecycle event");
                if events.send(event).await.is_err() {
                    return;
                }
            }
            self.last = snapshot;
        }
    }
}

/// Follows the runtime's container events, waking the relists with `nudge` and telling through
/// `streaming` whether the stream is open, until `cancel`. A runtime without the call leaves the
/// PLEG relisting every second; a broken stream is opened again with backoff.
async fn follow_events(
    runtime: &RuntimeClient,
    nudge: &Notify,
    streaming: &watch::Sender<bool>,
    cancel: &CancellationToken,
) {
    let mut retry = STREAM_RETRY_FIRST;
    loop {
        let open = runtime.container_events();
        tokio::pin!(open);
        let settled = tokio::time::sleep(STREAM_SETTLE);
        tokio::pin!(settled);
        let opened = loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                opened = &mut open => break opened,
                _ = &mut settled, if !*streaming.borrow() => {
                    tracing::debug!("following the runtime's container events; relisting every {}s", EVENTED_RELIST_PERIOD.as_secs());
                    streaming.send_replace(true);
                }
            }
        };
        let ended = match opened {
            Ok(mut stream) => {
                streaming.send_replace(true);
                crate::metrics::get().evented_pleg(true);
                retry = STREAM_RETRY_FIRST;
                loop {
                    let message = tokio::select! {
                        _ = cancel.cancelled() => return,
                        message = stream.message() => message,
                    };
                    match message {
                        Ok(Some(event)) => {
                            tracing::trace!(container = %event.container_id, kind = event.container_event_type, "container event");
                            crate::metrics::get().container_event(event.created_at);
                            nudge.notify_one();
                        }
                        Ok(None) => break "the runtime ended it".to_string(),
                        Err(e) => break e.to_string(),
                    }
                }
            }
            Err(e) if e.code() == Some(tonic::Code::Unimplemented) => {
                streaming.send_replace(false);
                tracing::info!("the runtime streams no container events; relisting every second");
                cancel.cancelled().await;
                return;
            }
            Err(e) => e.to_string(),
        };
        crate::metrics::get().evented_pleg(false);
        if streaming.send_replace(false) {
            tracing::warn!(error = %ended, "the runtime's container event stream broke; relisting every second until it is back");
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(retry) => {}
        }
        retry = (retry * 2).min(STREAM_RETRY_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(items: &[(&str, &str, State)]) -> Snapshot {
        items
            .iter()
            .map(|(id, uid, s)| (id.to_string(), (PodUid(uid.to_string()), *s)))
            .collect()
    }

    fn kinds(events: &[Event]) -> Vec<(&str, EventKind)> {
        events.iter().map(|e| (e.id.as_str(), e.kind)).collect()
    }

    #[test]
    fn diffs_become_lifecycle_events() {
        let old = snap(&[
            ("a", "p", State::Running),
            ("b", "p", State::Running),
            ("c", "p", State::Exited),
            ("d", "p", State::Created),
            ("e", "p", State::Running),
        ]);
        let new = snap(&[
            ("a", "p", State::Running),
            ("b", "p", State::Exited),
            ("d", "p", State::Running),
            ("e", "p", State::Unknown),
            ("f", "q", State::Running),
            ("g", "q", State::Exited),
        ]);
        assert_eq!(
            kinds(&diff(&old, &new)),
            [
                ("b", EventKind::Died),
                ("c", EventKind::Removed),
                ("d", EventKind::Started),
                ("e", EventKind::Changed),
                ("f", EventKind::Started),
                ("g", EventKind::Died),
            ]
        );
        assert!(diff(&new, &new).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn health_turns_bad_after_three_minutes_without_a_relist() {
        let fresh = || Relist {
            succeeded: Instant::now(),
            unhealthy_after: UNHEALTHY_AFTER,
            error: None,
        };
        let (tx, rx) = watch::channel(fresh());
        let health = Health(rx);
        assert!(health.check().is_ok());
        tokio::time::advance(UNHEALTHY_AFTER + Duration::from_secs(1)).await;
        assert!(health.check().is_err());
        tx.send_replace(fresh());
        assert!(health.check().is_ok());
        tx.send_modify(|r| r.error = Some("down".into()));
        assert_eq!(health.runtime_error().as_deref(), Some("down"));
    }
}

//! Kubernetes-style events about pods (Pulled, Created, Started, Killing, BackOff, Unhealthy,
//! Failed, ...): each is logged with an `event=` field and kept in a bounded in-memory store,
//! where a repeat of the same event bumps its count instead of taking a new slot, as upstream's
//! event correlator does. The agent's store is backed by a journal in the root dir, written
//! before anything is sent, so a restarted agent still shows what happened. The admin API and
//! CLI read them; in cluster mode they also go to the API server. Events lost on the way are
//! counted by reason (`nodelet_events_dropped_total`).

use std::collections::VecDeque;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Event as ApiEvent, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

/// How many events the store keeps; the oldest go first.
pub const CAPACITY: usize = 1000;

/// The journal's file name in the root dir: one core/v1 Event as JSON per line, each line the
/// event as last recorded (a repeat appends it again with its new count).
pub const JOURNAL_FILE: &str = "events.journal";
/// Past this size the journal is rewritten from the store.
const JOURNAL_MAX: u64 = 1 << 20;

/// Normal or Warning, as upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Normal,
    Warning,
}

impl Type {
    pub fn as_str(self) -> &'static str {
        match self {
            Type::Normal => "Normal",
            Type::Warning => "Warning",
        }
    }
}

/// The object an event is about: a pod, one of its containers, or the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `Pod` or `Node`.
    pub kind: &'static str,
    /// The pod's namespace; `default` for the node (where upstream records node events).
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `spec.containers{name}` (or initContainers) for a container's events.
    pub field_path: Option<String>,
}

impl Target {
    /// The pod itself.
    pub fn pod(pod: &Pod) -> Target {
        Target {
            kind: "Pod",
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            field_path: None,
        }
    }

    /// One of the pod's containers, found in its spec to name the right list.
    pub fn container(pod: &Pod, container: &str) -> Target {
        let is_init = pod.spec.as_ref().is_some_and(|s| {
            s.init_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
        });
        let list = if is_init {
            "initContainers"
        } else {
            "containers"
        };
        Target {
            field_path: Some(format!("spec.{list}{{{container}}}")),
            ..Target::pod(pod)
        }
    }

    /// The node `name` (its UID is its name, as upstream refers to it).
    pub fn node(name: &str) -> Target {
        Target {
            kind: "Node",
            namespace: "default".into(),
            name: name.into(),
            uid: name.into(),
            field_path: None,
        }
    }

    fn full_name(&self) -> String {
        match self.kind {
            "Node" => format!("node/{}", self.name),
            _ => format!("{}/{}", self.namespace, self.name),
        }
    }
}

/// One event, possibly seen several times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub target: Target,
    pub kind: Type,
    pub reason: String,
    pub message: String,
    pub count: u32,
    pub first: Timestamp,
    pub last: Timestamp,
    /// The count the API server has (with a sink; see [`Recorder::sent`]). Events read back
    /// from the journal count as sent: their agent had them sent, or lost them.
    pub sent: u32,
}

impl Event {
    /// Whether `other` is this event (the same API object), as [`Event::key`] tells, without
    /// spelling the key out.
    fn same(&self, other: &Event) -> bool {
        self.first == other.first
            && self.target.name == other.target.name
            && self.target.namespace == other.target.namespace
    }

    /// The event's namespace and name as an API object (stable over its repeats).
    pub fn key(&self) -> (String, String) {
        (
            self.target.namespace.clone(),
            format!(
                "{}.{:x}",
                self.target.name,
                self.first.as_nanosecond() as u64
            ),
        )
    }

    /// The event an API object (a journal line) describes; `None` for one nodelet would not
    /// have written.
    fn from_api(e: &ApiEvent) -> Option<Event> {
        let o = &e.involved_object;
        let kind = match o.kind.as_deref()? {
            "Pod" => "Pod",
            "Node" => "Node",
            _ => return None,
        };
        Some(Event {
            target: Target {
                kind,
                namespace: e.metadata.namespace.clone()?,
                name: o.name.clone()?,
                uid: o.uid.clone().unwrap_or_default(),
                field_path: o.field_path.clone(),
            },
            kind: match e.type_.as_deref() {
                Some("Warning") => Type::Warning,
                _ => Type::Normal,
            },
            reason: e.reason.clone().unwrap_or_default(),
            message: e.message.clone().unwrap_or_default(),
            count: u32::try_from(e.count.unwrap_or(1)).unwrap_or(1).max(1),
            // The name holds the first sighting to the nanosecond (the timestamps only to the
            // second): it names the same API object as before.
            first: e
                .metadata
                .name
                .as_deref()
                .and_then(|n| n.rsplit('.').next())
                .and_then(|hex| u64::from_str_radix(hex, 16).ok())
                .and_then(|nanos| Timestamp::from_nanosecond(i128::from(nanos)).ok())
                .or(e.first_timestamp.as_ref().map(|t| t.0))?,
            last: e.last_timestamp.as_ref()?.0,
            sent: u32::try_from(e.count.unwrap_or(1)).unwrap_or(1).max(1),
        })
    }

    /// The event as a core/v1 Event from `node`'s kubelet, as `kubectl get events -o yaml` shows it.
    pub fn to_api(&self, node: &str) -> ApiEvent {
        let t = &self.target;
        ApiEvent {
            metadata: ObjectMeta {
                name: Some(self.key().1),
                namespace: Some(t.namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some(t.kind.into()),
                namespace: (t.kind == "Pod").then(|| t.namespace.clone()),
                name: Some(t.name.clone()),
                uid: Some(t.uid.clone()),
                field_path: t.field_path.clone(),
                ..Default::default()
            },
            reason: Some(self.reason.clone()),
            message: Some(self.message.clone()),
            type_: Some(self.kind.as_str().into()),
            count: Some(self.count as i32),
            first_timestamp: Some(Time(self.first)),
            last_timestamp: Some(Time(self.last)),
            source: Some(EventSource {
                component: Some("kubelet".into()),
                host: Some(node.into()),
            }),
            reporting_component: Some("kubelet".into()),
            reporting_instance: Some(node.into()),
            ..Default::default()
        }
    }
}

/// Records events and lists them; cheap to clone, shared by every part that records.
#[derive(Clone)]
pub struct Recorder {
    store: Arc<Mutex<VecDeque<Event>>>,
    capacity: usize,
    /// Bumped on every event recorded (the API sink waits on it).
    recorded: Arc<tokio::sync::watch::Sender<u64>>,
    journal: Option<Arc<Mutex<Journal>>>,
    /// Whether an API sink takes the events (then one pushed out of the store unsent is lost).
    sink: Arc<AtomicBool>,
}

/// The store's file: appended to, and rewritten from the store when it grows too big.
struct Journal {
    path: PathBuf,
    /// The node the events are from (their source host).
    node: String,
    file: Option<std::fs::File>,
    size: u64,
    /// Whether a failure to write was said (once; later ones are only counted).
    failed: bool,
}

impl Journal {
    fn line(&self, e: &Event) -> Vec<u8> {
        let mut line = serde_json::to_vec(&e.to_api(&self.node)).unwrap_or_default();
        line.push(b'\n');
        line
    }

    /// Appends the event; past [`JOURNAL_MAX`], rewrites the journal from `store` instead.
    fn write(&mut self, e: &Event, store: &VecDeque<Event>) {
        let written = if self.size > JOURNAL_MAX || self.file.is_none() {
            self.rewrite(store)
        } else {
            let line = self.line(e);
            let appended = self.file.as_mut().map(|f| f.write_all(&line));
            self.size += line.len() as u64;
            appended.unwrap_or(Ok(()))
        };
        if let Err(error) = written {
            self.file = None;
            crate::metrics::get().event_dropped("journal");
            if !std::mem::replace(&mut self.failed, true) {
                tracing::warn!(file = %self.path.display(), %error, "cannot write the event journal; events stay in memory only");
            }
        }
    }

    /// Writes the whole store anew (through a temporary file) and appends from there.
    fn rewrite(&mut self, store: &VecDeque<Event>) -> std::io::Result<()> {
        let tmp = self.path.with_extension("tmp");
        let text: Vec<u8> = store.iter().flat_map(|e| self.line(e)).collect();
        std::fs::write(&tmp, &text)?;
        std::fs::rename(&tmp, &self.path)?;
        self.file = Some(std::fs::OpenOptions::new().append(true).open(&self.path)?);
        self.size = text.len() as u64;
        Ok(())
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::with_capacity(CAPACITY)
    }
}

impl Recorder {
    /// A recorder keeping at most `capacity` events.
    pub fn with_capacity(capacity: usize) -> Recorder {
        Recorder {
            store: Arc::new(Mutex::new(VecDeque::new())),
            capacity: capacity.max(1),
            recorded: Arc::new(tokio::sync::watch::channel(0).0),
            journal: None,
            sink: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A recorder backed by the journal in `root_dir`, starting with the events it holds (of
    /// `node`; the newest [`CAPACITY`]). An unreadable line is skipped; a journal that cannot
    /// be written leaves the events in memory, and each one not written is counted as dropped.
    pub fn with_journal(root_dir: &Path, node: &str) -> Recorder {
        let mut recorder = Recorder::default();
        let path = root_dir.join(JOURNAL_FILE);
        let mut store: VecDeque<Event> = VecDeque::new();
        if let Ok(text) = std::fs::read_to_string(&path) {
            for line in text.lines() {
                let Some(e) = serde_json::from_str::<ApiEvent>(line)
                    .ok()
                    .and_then(|e| Event::from_api(&e))
                else {
                    continue;
                };
                store.retain(|old| !old.same(&e));
                store.push_back(e);
            }
        }
        while store.len() > recorder.capacity {
            store.pop_front();
        }
        let mut journal = Journal {
            path,
            node: node.to_string(),
            file: None,
            size: 0,
            failed: false,
        };
        if let Err(error) = journal.rewrite(&store) {
            journal.failed = true;
            tracing::warn!(file = %journal.path.display(), %error, "cannot write the event journal; events stay in memory only");
        }
        recorder.store = Arc::new(Mutex::new(store));
        recorder.journal = Some(Arc::new(Mutex::new(journal)));
        recorder
    }

    /// An API sink takes the events from now on; it says what it sent with [`Recorder::sent`].
    pub fn attach_sink(&self) {
        self.sink.store(true, Ordering::Relaxed);
    }

    /// The API server has `event` up to `count` (or refused it for good).
    pub fn sent(&self, event: &Event, count: u32) {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = store.iter_mut().find(|e| e.same(event)) {
            e.sent = e.sent.max(count);
        }
    }

    /// Sees a new value whenever an event is recorded.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.recorded.subscribe()
    }

    /// A Normal event.
    pub fn normal(&self, target: Target, reason: &str, message: String) {
        self.record(target, Type::Normal, reason, message);
    }

    /// A Warning event.
    pub fn warning(&self, target: Target, reason: &str, message: String) {
        self.record(target, Type::Warning, reason, message);
    }

    fn record(&self, target: Target, kind: Type, reason: &str, message: String) {
        let about = target.full_name();
        let container = target.field_path.as_deref().unwrap_or("");
        let shown = crate::types::printable(&message);
        match (kind, target.kind) {
            (Type::Normal, "Node") => tracing::info!(%about, event = reason, "{shown}"),
            (Type::Warning, "Node") => tracing::warn!(%about, event = reason, "{shown}"),
            (Type::Normal, _) => {
                tracing::info!(pod = %about, object = container, event = reason, "{shown}")
            }
            (Type::Warning, _) => {
                tracing::warn!(pod = %about, object = container, event = reason, "{shown}")
            }
        }
        let now = crate::types::now();
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let seen = store.iter().rposition(|e| {
            e.target == target && e.kind == kind && e.reason == reason && e.message == message
        });
        let event = match seen.and_then(|i| store.remove(i)) {
            Some(mut e) => {
                e.count = e.count.saturating_add(1);
                e.last = now;
                e
            }
            None => Event {
                target,
                kind,
                reason: reason.into(),
                message,
                count: 1,
                first: now,
                last: now,
                sent: 0,
            },
        };
        store.push_back(event);
        while store.len() > self.capacity {
            let Some(gone) = store.pop_front() else { break };
            if gone.sent < gone.count && self.sink.load(Ordering::Relaxed) {
                crate::metrics::get().event_dropped("store_full");
            }
        }
        if let (Some(journal), Some(event)) = (&self.journal, store.back()) {
            journal
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write(event, &store);
        }
        drop(store);
        self.recorded.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Every stored event, oldest (by last sighting) first; only a pod's with `Some((ns, name))`.
    pub fn list(&self, pod: Option<(&str, &str)>) -> Vec<Event> {
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        store
            .iter()
            .filter(|e| {
                pod.is_none_or(|(ns, n)| {
                    e.target.kind == "Pod" && e.target.namespace == ns && e.target.name == n
                })
            })
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": "u1"},
            "spec": {"initContainers": [{"name": "init"}], "containers": [{"name": "app"}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_repeated_event_counts_up_instead_of_taking_a_new_slot() {
        let r = Recorder::default();
        let p = pod("web");
        r.warning(Target::container(&p, "app"), "BackOff", "Back-off".into());
        r.normal(Target::pod(&p), "Scheduled", "x".into());
        r.warning(Target::container(&p, "app"), "BackOff", "Back-off".into());
        let events = r.list(None);
        assert_eq!(events.len(), 2);
        assert_eq!(events[1].reason, "BackOff");
        assert_eq!(events[1].count, 2);
        assert_eq!(
            events[1].target.field_path.as_deref(),
            Some("spec.containers{app}")
        );
    }

    #[test]
    fn the_store_keeps_the_newest_events_up_to_its_capacity() {
        let r = Recorder::with_capacity(3);
        let p = pod("web");
        for i in 0..5 {
            r.normal(Target::pod(&p), "Started", format!("{i}"));
        }
        let messages: Vec<_> = r.list(None).into_iter().map(|e| e.message).collect();
        assert_eq!(messages, ["2", "3", "4"]);
    }

    #[test]
    fn the_journal_brings_the_events_back_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let r = Recorder::with_journal(dir.path(), "n1");
        let p = pod("web");
        r.warning(Target::container(&p, "app"), "BackOff", "Back-off".into());
        r.warning(Target::container(&p, "app"), "BackOff", "Back-off".into());
        r.normal(Target::node("n1"), "Starting", "Starting kubelet.".into());
        let again = Recorder::with_journal(dir.path(), "n1");
        let seen = |r: &Recorder| {
            r.list(None)
                .into_iter()
                .map(|e| (e.key(), e.reason, e.count))
                .collect::<Vec<_>>()
        };
        assert_eq!(seen(&again), seen(&r));
        assert_eq!(again.list(None)[0].count, 2);
        std::fs::write(dir.path().join(JOURNAL_FILE), "not json\n{}\n").unwrap();
        assert!(
            Recorder::with_journal(dir.path(), "n1")
                .list(None)
                .is_empty()
        );
    }

    #[test]
    fn an_event_pushed_out_before_the_sink_sent_it_is_counted_as_dropped() {
        let dropped = || {
            crate::metrics::get()
                .render()
                .lines()
                .find(|l| l.starts_with("nodelet_events_dropped_total{reason=\"store_full\"}"))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let r = Recorder::with_capacity(1);
        r.attach_sink();
        let p = pod("web");
        r.normal(Target::pod(&p), "Created", "one".into());
        let first = r.list(None)[0].clone();
        r.sent(&first, 1);
        let before = dropped();
        r.normal(Target::pod(&p), "Created", "two".into());
        r.normal(Target::pod(&p), "Created", "three".into());
        assert_eq!(dropped() - before, 1.0, "only the unsent event counts");
    }

    #[test]
    fn events_filter_by_pod_and_name_init_containers_by_their_list() {
        let r = Recorder::default();
        r.normal(
            Target::container(&pod("a"), "init"),
            "Created",
            "one".into(),
        );
        r.normal(Target::pod(&pod("b")), "Created", "two".into());
        let a = r.list(Some(("default", "a")));
        assert_eq!(a.len(), 1);
        assert_eq!(
            a[0].target.field_path.as_deref(),
            Some("spec.initContainers{init}")
        );
        let api = a[0].to_api("node1");
        assert_eq!(api.involved_object.kind.as_deref(), Some("Pod"));
        assert_eq!(api.count, Some(1));
    }
}

//! Kubernetes-style events about pods (Pulled, Created, Started, Killing, BackOff, Unhealthy,
//! Failed, ...): each is logged with an `event=` field and kept in a bounded in-memory store,
//! where a repeat of the same event bumps its count instead of taking a new slot, as upstream's
//! event correlator does. The admin API and CLI read them; in cluster mode they also go to the
//! API server.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Event as ApiEvent, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

/// How many events the store keeps; the oldest go first.
pub const CAPACITY: usize = 1000;

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
}

impl Event {
    /// The event as a core/v1 Event from `node`'s kubelet, as `kubectl get events -o yaml` shows it.
    pub fn to_api(&self, node: &str) -> ApiEvent {
        let t = &self.target;
        ApiEvent {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.{:x}",
                    t.name,
                    self.first.as_nanosecond() as u64
                )),
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
            },
        };
        store.push_back(event);
        while store.len() > self.capacity {
            store.pop_front();
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

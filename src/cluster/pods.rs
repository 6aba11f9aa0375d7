//! The API server as a pod source: a watch of the pods bound to this node (list, then watch with
//! bookmarks; a relist when the watch is too old), fed to the mux as source `api` with the
//! ConfigMaps, Secrets and tokens those pods use. Mirror pods are not run; they stay in the
//! shared store for the mirror and status managers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::objects::Referenced;

use crate::pod::{ANNOTATION_CONFIG_MIRROR, ANNOTATION_CONFIG_SEEN, ANNOTATION_CONFIG_SOURCE};
use crate::sources::SourceSnapshot;
use crate::types::Source;

/// The pods bound to this node as the API server has them, mirror pods included; and a counter
/// bumped whenever the store changed.
#[derive(Clone)]
pub struct Bound {
    pub store: Store<Pod>,
    pub changed: watch::Receiver<u64>,
}

/// Is this pod a mirror pod (the API's view of a static pod)?
pub fn is_mirror(pod: &Pod) -> bool {
    crate::pod::annotation(pod, ANNOTATION_CONFIG_MIRROR).is_some()
}

/// The events that arrive together are handled as one snapshot: a burst of pods bound at once
/// is one merge.
const BATCH: usize = 256;

/// A watch of the pods bound to `node`: returns the shared store and the task that feeds it and
/// sends a snapshot of the pods to run, with the API data they refer to, whenever either
/// changes (the first one once the initial list is complete, which makes the source ready).
pub fn watch(
    client: kube::Client,
    node: &str,
    snapshots: mpsc::Sender<SourceSnapshot>,
    tracker: TaskTracker,
    cancel: CancellationToken,
) -> (Bound, impl Future<Output = ()> + Send + 'static) {
    let (store, writer) = reflector::store::<Pod>();
    let (changed_tx, changed) = watch::channel(0u64);
    let api: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let node = node.to_string();
    let reader = store.clone();
    let task = async move {
        let mut stream = watcher(api, config)
            .backoff(super::watch_backoff::watch_backoff())
            .modify(|pod| {
                if !is_mirror(pod) {
                    crate::pod_startup::get().observed_on_watch(pod);
                }
                slim(pod);
            })
            .reflect(writer)
            .ready_chunks(BATCH)
            .boxed();
        let mut referenced = Referenced::new(client, tracker, cancel.clone());
        let objects_changed = referenced.changed();
        let mut made = Made::new();
        let mut listed = false;
        let mut renew: Option<Instant> = None;
        loop {
            let far = Instant::now() + Duration::from_secs(3600);
            tokio::select! {
                _ = cancel.cancelled() => return,
                batch = stream.next() => match batch {
                    Some(batch) => {
                        let pods_changed = handle(batch, &node, &mut listed);
                        if pods_changed {
                            changed_tx.send_modify(|n| *n += 1);
                        } else {
                            continue;
                        }
                    }
                    None => return,
                },
                _ = objects_changed.notified() => {}
                _ = tokio::time::sleep_until(renew.unwrap_or(far)) => {}
            }
            if !listed {
                continue;
            }
            let pods = to_run(&reader, &mut made);
            referenced.follow(&pods);
            renew = referenced.issue_tokens(&pods).await;
            let snapshot = SourceSnapshot {
                source: Source::Api,
                pods,
                objects: referenced.objects(),
            };
            if snapshots.send(snapshot).await.is_err() {
                return;
            }
        }
    };
    (Bound { store, changed }, task)
}

/// Drops what nothing on the node reads from the API's copy of a pod, often most of it:
/// managedFields, and the status but for the phase (a finished pod is never started again), the
/// conditions of its readiness gates and the names of its resource claims (set by others). The
/// status the node reports is its own, kept by the status store.
fn slim(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    let gates: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .map(|g| g.condition_type.as_str())
        .collect();
    pod.status = pod.status.take().map(|s| PodStatus {
        phase: s.phase,
        conditions: s
            .conditions
            .map(|c| {
                c.into_iter()
                    .filter(|c| gates.contains(&c.type_.as_str()))
                    .collect::<Vec<_>>()
            })
            .filter(|c| !c.is_empty()),
        resource_claim_statuses: s.resource_claim_statuses,
        extended_resource_claim_status: s.extended_resource_claim_status,
        ..PodStatus::default()
    });
}

/// Logs the watch's errors; true when the pods changed (or the first list completed).
fn handle(
    batch: Vec<Result<watcher::Event<Pod>, watcher::Error>>,
    node: &str,
    listed: &mut bool,
) -> bool {
    let mut changed = false;
    for event in batch {
        match event {
            Ok(watcher::Event::InitDone) => {
                *listed = true;
                changed = true;
            }
            Ok(watcher::Event::Apply(_)) => changed = true,
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(uid) = pod.metadata.uid.as_deref() {
                    crate::pod_startup::get().forget(uid);
                }
                changed = true;
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Err(e) => {
                tracing::warn!(node = %node, error = %crate::types::error_chain(&e), "the watch of this node's pods failed; retrying")
            }
        }
    }
    changed
}

/// What the source made of each pod of the store, by UID: the store's object it was made from
/// and the pod to run, reused while the store holds the same object.
type Made = HashMap<String, (Arc<Pod>, Arc<Pod>)>;

/// The pods of the store that this node runs (not the mirror pods), with the source's local
/// annotations: `config.source: api` and the time each was first seen.
fn to_run(store: &Store<Pod>, made: &mut Made) -> Vec<Arc<Pod>> {
    let now = crate::types::now().to_string();
    let mut next = Made::with_capacity(made.len());
    let pods = (store.state().into_iter())
        .filter(|p| !is_mirror(p))
        .map(|from| {
            let uid = from.metadata.uid.clone().unwrap_or_default();
            let pod = match made.remove(&uid) {
                Some((before, pod)) if Arc::ptr_eq(&before, &from) => pod,
                before => {
                    let first = before
                        .and_then(|(_, pod)| {
                            crate::pod::annotation(&pod, ANNOTATION_CONFIG_SEEN).map(str::to_string)
                        })
                        .unwrap_or_else(|| now.clone());
                    let mut pod = (*from).clone();
                    let annotations = pod
                        .metadata
                        .annotations
                        .get_or_insert_with(Default::default);
                    annotations
                        .insert(ANNOTATION_CONFIG_SOURCE.into(), Source::Api.as_str().into());
                    annotations.insert(ANNOTATION_CONFIG_SEEN.into(), first);
                    Arc::new(pod)
                }
            };
            next.insert(uid, (from, pod.clone()));
            pod
        })
        .collect();
    *made = next;
    pods
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_copy_keeps_only_the_phase_and_the_readiness_gates_conditions() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "managedFields": [{"manager": "m"}]},
            "spec": {"containers": [], "readinessGates": [{"conditionType": "example.com/lb"}]},
            "status": {
                "phase": "Running", "podIP": "10.0.0.2",
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "example.com/lb", "status": "False"}
                ],
                "containerStatuses": [{"name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": 0}]
            }
        }))
        .unwrap();
        slim(&mut pod);
        assert!(pod.metadata.managed_fields.is_none());
        assert_eq!(
            serde_json::to_value(&pod.status).unwrap(),
            serde_json::json!({"phase": "Running", "conditions": [{"type": "example.com/lb", "status": "False"}]})
        );
    }
}

//! The status manager: pushes each pod's status to the API server when it changed (an API pod's
//! own status, a static pod's to its mirror pod), and deletes an API pod that is being deleted
//! once nothing of it is left on the node.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, Patch, PatchParams};
use tokio_util::sync::CancellationToken;

use super::pods::{Bound, is_mirror};
use crate::pod::{ANNOTATION_CONFIG_HASH, ANNOTATION_CONFIG_MIRROR, annotation, source};
use crate::status;
use crate::types::{PodUid, Source};

/// How often every status is looked at even without a change (upstream: 10 s).
const RESYNC: Duration = Duration::from_secs(10);

/// The API pod a status goes to: its namespace, name and UID.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    namespace: String,
    name: String,
    uid: String,
}

/// Where the status of `pod` goes: the pod itself for an API pod, its mirror pod (when there is
/// one) for a static pod.
fn target(pod: &Pod, bound: &Bound) -> Option<Target> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    match source(pod) {
        Some(Source::Api) => Some(Target {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            namespace,
            name,
        }),
        Some(Source::File | Source::Http) => {
            let hash = annotation(pod, ANNOTATION_CONFIG_HASH)?;
            let mirror = bound.store.find(|m| {
                is_mirror(m)
                    && m.metadata.namespace.as_deref() == Some(namespace.as_str())
                    && m.metadata.name.as_deref() == Some(name.as_str())
                    && annotation(m, ANNOTATION_CONFIG_MIRROR) == Some(hash)
                    && m.metadata.deletion_timestamp.is_none()
            })?;
            Some(Target {
                uid: mirror.metadata.uid.clone().unwrap_or_default(),
                namespace,
                name,
            })
        }
        None => None,
    }
}

/// Runs until `cancel`. After each pass in which every status was either pushed or has no API
/// object to go to, `synced` gets the store generation that pass read.
pub async fn run(
    client: kube::Client,
    mut statuses: status::Reader,
    mut bound: Bound,
    synced: tokio::sync::watch::Sender<u64>,
    cancel: CancellationToken,
) {
    // The status version last pushed to each target (by the target's UID).
    let mut pushed: HashMap<String, u64> = HashMap::new();
    // Since when each target has had a status not pushed yet, for the status sync duration.
    let mut pending: HashMap<String, std::time::Instant> = HashMap::new();
    loop {
        let generation = statuses.generation();
        let entries = statuses.list();
        let mut live = std::collections::HashSet::new();
        let mut failed = false;
        for entry in &entries {
            let Some(target) = target(&entry.pod, &bound) else {
                continue;
            };
            live.insert(target.uid.clone());
            if pushed.get(&target.uid) == Some(&entry.version) {
                continue;
            }
            let since = *pending
                .entry(target.uid.clone())
                .or_insert_with(std::time::Instant::now);
            match push(&client, &target, entry.pod.status.as_ref()).await {
                Pushed::Yes => {
                    crate::metrics::get().pod_status_synced(since.elapsed());
                    crate::pod_startup::get().status_pushed(&target.uid, &entry.pod);
                    pending.remove(&target.uid);
                    pushed.insert(target.uid, entry.version);
                }
                Pushed::Gone => {}
                Pushed::Failed => failed = true,
            }
        }
        pushed.retain(|uid, _| live.contains(uid));
        pending.retain(|uid, _| live.contains(uid));
        if !failed {
            synced.send_replace(generation);
        }
        delete_finished(&client, &statuses, &bound).await;
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = statuses.changed() => {}
            Ok(()) = bound.changed.changed() => {}
            _ = tokio::time::sleep(RESYNC) => {}
        }
    }
}

/// What became of a status push.
#[derive(PartialEq)]
enum Pushed {
    Yes,
    /// The target is gone or replaced: there is nothing to push to.
    Gone,
    Failed,
}

/// Patches the target's status.
async fn push(client: &kube::Client, target: &Target, status: Option<&PodStatus>) -> Pushed {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &target.namespace);
    let pod = format!("{}/{}", target.namespace, target.name);
    // The UID makes the patch fail on a pod of the same name that is not the one meant.
    let patch = serde_json::json!({
        "metadata": {"uid": target.uid},
        "status": with_clears(status),
    });
    match pods
        .patch_status(
            &target.name,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
    {
        Ok(_) => {
            tracing::debug!(%pod, "pushed the pod status");
            Pushed::Yes
        }
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
            tracing::debug!(%pod, reason = %e.message, "the pod's API object is gone or replaced; its status is not pushed");
            Pushed::Gone
        }
        Err(e) => {
            tracing::warn!(%pod, error = %crate::types::error_chain(&e), "cannot push the pod status");
            Pushed::Failed
        }
    }
}

/// Pod conditions the node sets only while they hold (upstream's resize conditions).
const TRANSIENT_CONDITIONS: [&str; 2] = ["PodResizePending", "PodResizeInProgress"];

/// The status as a strategic merge patch: conditions merge by type, so the fields a condition
/// no longer has, and the pod's reason and message once they are gone, are cleared explicitly.
fn with_clears(status: Option<&PodStatus>) -> serde_json::Value {
    let mut status = serde_json::to_value(status).unwrap_or_default();
    let clear = |object: &mut serde_json::Map<String, serde_json::Value>, keys: &[&str]| {
        for key in keys {
            object
                .entry(key.to_string())
                .or_insert(serde_json::Value::Null);
        }
    };
    if let Some(object) = status.as_object_mut() {
        clear(object, &["reason", "message"]);
        // The API merges these lists by IP: a pod that came back with another IP (a new
        // sandbox) replaces them, or the old IP would stay beside the new one.
        for ips in ["podIPs", "hostIPs"] {
            if let Some(list) = object
                .get_mut(ips)
                .and_then(serde_json::Value::as_array_mut)
            {
                list.push(serde_json::json!({"$patch": "replace"}));
            }
        }
        if let Some(conditions) = object
            .get_mut("conditions")
            .and_then(serde_json::Value::as_array_mut)
        {
            for c in conditions
                .iter_mut()
                .filter_map(serde_json::Value::as_object_mut)
            {
                clear(c, &["reason", "message"]);
            }
            // The node's conditions that exist only while true are deleted once they are gone.
            for kind in TRANSIENT_CONDITIONS {
                if !conditions.iter().any(|c| c["type"] == *kind) {
                    conditions.push(serde_json::json!({"type": kind, "$patch": "delete"}));
                }
            }
        }
    }
    status
}

/// API pods being deleted whose termination on the node finished (nothing of them is left)
/// are deleted for good, with grace 0 and their UID as precondition, as upstream.
async fn delete_finished(client: &kube::Client, statuses: &status::Reader, bound: &Bound) {
    let finished = bound.store.state_filter(|p| {
        p.metadata.deletion_timestamp.is_some()
            && !is_mirror(p)
            && statuses.was_terminated(&PodUid(p.metadata.uid.clone().unwrap_or_default()))
    });
    for pod in finished {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = PodUid(pod.metadata.uid.clone().unwrap_or_default());
        // Its final status first (the phase its containers ended in), as upstream.
        if let Some(last) = statuses.final_status(&uid) {
            let target = Target {
                namespace: namespace.clone(),
                name: name.clone(),
                uid: uid.0.clone(),
            };
            if push(client, &target, Some(&last)).await != Pushed::Yes {
                continue;
            }
        }
        super::delete_pod_now(
            client,
            (&namespace, &name, &uid.0),
            "the pod whose termination finished on the node",
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_a_condition_lost_are_cleared_in_the_patch() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.9"}], "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady", "message": "m"}
            ]}
        }))
        .unwrap();
        let patch = with_clears(pod.status.as_ref());
        assert_eq!(patch["conditions"][0]["reason"], serde_json::Value::Null);
        assert!(
            patch["conditions"][0]
                .as_object()
                .unwrap()
                .contains_key("message")
        );
        assert_eq!(patch["conditions"][1]["reason"], "ContainersNotReady");
        assert!(patch.as_object().unwrap().contains_key("message"));
        assert_eq!(patch["phase"], "Running");
        assert_eq!(
            patch["podIPs"],
            serde_json::json!([{"ip": "10.0.0.9"}, {"$patch": "replace"}]),
            "the pod's IPs replace the API's copy"
        );
        assert_eq!(
            patch["conditions"][2],
            serde_json::json!({"type": "PodResizePending", "$patch": "delete"}),
            "a resize condition no longer true leaves the API's copy"
        );
    }
}

//! Mirror pods: the API server's read-only view of each static pod, owned by the Node. A mirror
//! is created for every static pod, replaced when the static pod changes or the mirror is
//! deleted, and removed with its static pod once the static sources have been read.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::pods::{Bound, is_mirror};
use crate::pod::{ANNOTATION_CONFIG_HASH, ANNOTATION_CONFIG_MIRROR, annotation, source};
use crate::sync_loop::Desired;
use crate::types::{Source, full_name};

/// How often the mirrors are checked even without a change.
const RESYNC: Duration = Duration::from_secs(10);

fn is_static(pod: &Pod) -> bool {
    matches!(source(pod), Some(Source::File | Source::Http))
}

/// The mirror pod of `pod`, owned by the node `node` (UID `node_uid`).
pub fn mirror_of(pod: &Pod, node: &str, node_uid: &str) -> Pod {
    let mut annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let hash = annotations
        .get(ANNOTATION_CONFIG_HASH)
        .cloned()
        .unwrap_or_default();
    annotations.insert(ANNOTATION_CONFIG_MIRROR.into(), hash);
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            labels: pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.to_string(),
                uid: node_uid.to_string(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: pod.spec.clone(),
        status: None,
    }
}

/// What to do about one static pod's mirror.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Create,
    /// Delete this mirror (by UID): it is of an older version of the static pod, or deleted.
    Replace(String),
    Keep,
}

fn step(pod: &Pod, existing: Option<&Pod>) -> Step {
    match existing {
        None => Step::Create,
        Some(m)
            if m.metadata.deletion_timestamp.is_some()
                || annotation(m, ANNOTATION_CONFIG_MIRROR)
                    != annotation(pod, ANNOTATION_CONFIG_HASH) =>
        {
            Step::Replace(m.metadata.uid.clone().unwrap_or_default())
        }
        Some(_) => Step::Keep,
    }
}

/// Runs until `cancel`. `static_sources` are the static sources configured: orphaned mirrors
/// are deleted only once each of them has been read.
pub async fn run(
    client: kube::Client,
    node: String,
    static_sources: Vec<Source>,
    mut node_uid: watch::Receiver<Option<String>>,
    mut desired: watch::Receiver<Desired>,
    mut bound: Bound,
    cancel: CancellationToken,
) {
    // Static pods whose mirror the API server refused, with the refusal, so it is said once.
    let mut refused: HashMap<String, String> = HashMap::new();
    loop {
        let uid = node_uid.borrow_and_update().clone();
        if let Some(uid) = uid {
            let wanted = desired.borrow_and_update().clone();
            let read = static_sources.iter().all(|s| wanted.ready.contains(s));
            reconcile(&client, (&node, &uid), &wanted, read, &bound, &mut refused).await;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            Ok(()) = node_uid.changed() => {}
            Ok(()) = desired.changed() => {}
            Ok(()) = bound.changed.changed() => {}
            _ = tokio::time::sleep(RESYNC) => {}
        }
    }
}

/// Mirrors follow the static pods; a pod of a name still being terminated (a static pod removed,
/// or replaced by a new version) keeps the mirror it has until it is gone, as upstream.
async fn reconcile(
    client: &kube::Client,
    (node, node_uid): (&str, &str),
    wanted: &Desired,
    statics_read: bool,
    bound: &Bound,
    refused: &mut HashMap<String, String>,
) {
    let mirrors: HashMap<String, Arc<Pod>> = bound
        .store
        .state()
        .into_iter()
        .filter(|p| is_mirror(p))
        .map(|p| (full_name(&p), p))
        .collect();
    crate::metrics::get().set_mirror_pods(mirrors.len());
    let statics: Vec<&Arc<Pod>> = wanted.pods.iter().filter(|p| is_static(p)).collect();
    let terminating = |name: &str| wanted.terminating.iter().any(|t| t == name);
    for pod in &statics {
        let name = full_name(pod);
        if terminating(&name) {
            continue;
        }
        let existing = mirrors.get(&name).map(|p| p.as_ref());
        match step(pod, existing) {
            Step::Keep => {}
            Step::Replace(uid) => delete(client, pod, &uid).await,
            Step::Create => {
                let mirror = mirror_of(pod, node, node_uid);
                let namespace = pod.metadata.namespace.clone().unwrap_or_default();
                let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
                match pods.create(&PostParams::default(), &mirror).await {
                    Ok(_) => {
                        refused.remove(&name);
                        tracing::info!(pod = %name, "created the mirror pod");
                    }
                    // Ours, not yet in the store; or a pod of that name that is not a mirror.
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        let why = "a pod of this name exists that is not its mirror".to_string();
                        if !mirrors.contains_key(&name) && refused.get(&name) != Some(&why) {
                            tracing::warn!(pod = %name, "the static pod runs without a mirror pod: {why}");
                            refused.insert(name, why);
                        }
                    }
                    Err(kube::Error::Api(e)) => {
                        if refused.get(&name) != Some(&e.message) {
                            tracing::warn!(pod = %name, reason = %e.message, "the API server refused the mirror pod; the static pod runs without one");
                            refused.insert(name, e.message);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(pod = %name, error = %crate::types::error_chain(&e), "cannot create the mirror pod")
                    }
                }
            }
        }
    }
    // Mirrors of static pods that are gone, once every static source has been read.
    if !statics_read {
        return;
    }
    for (name, mirror) in &mirrors {
        if statics.iter().any(|p| full_name(p) == *name) || terminating(name) {
            continue;
        }
        let uid = mirror.metadata.uid.clone().unwrap_or_default();
        delete(client, mirror, &uid).await;
    }
}

/// Deletes the mirror pod of `pod`'s name with this UID, at once.
async fn delete(client: &kube::Client, pod: &Pod, uid: &str) {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    super::delete_pod_now(client, (namespace, name, uid), "the mirror pod").await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::ANNOTATION_CONFIG_SOURCE;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn static_pod(hash: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-n1", "namespace": "default", "uid": hash,
                "annotations": {ANNOTATION_CONFIG_HASH: hash, ANNOTATION_CONFIG_SOURCE: "file"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_mirror_carries_the_static_pods_hash_and_is_owned_by_the_node() {
        let m = mirror_of(&static_pod("h1"), "n1", "node-uid");
        assert_eq!(annotation(&m, ANNOTATION_CONFIG_MIRROR), Some("h1"));
        assert!(m.metadata.uid.is_none());
        let owner = &m.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Node", "node-uid")
        );
        assert_eq!(owner.controller, Some(true));
    }

    #[test]
    fn a_mirror_of_an_older_version_or_being_deleted_is_replaced() {
        let pod = static_pod("h2");
        assert_eq!(step(&pod, None), Step::Create);
        let mut current = mirror_of(&pod, "n1", "u");
        current.metadata.uid = Some("m1".into());
        assert_eq!(step(&pod, Some(&current)), Step::Keep);
        let mut old = mirror_of(&static_pod("h1"), "n1", "u");
        old.metadata.uid = Some("m0".into());
        assert_eq!(step(&pod, Some(&old)), Step::Replace("m0".into()));
        current.metadata.deletion_timestamp = Some(Time(crate::types::now()));
        assert_eq!(step(&pod, Some(&current)), Step::Replace("m1".into()));
    }
}

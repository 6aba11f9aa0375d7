//! The PodConfig mux: per-source state, merged into ordered [`PodUpdate`]s
//! (REMOVE, ADD, UPDATE, DELETE, RECONCILE), as upstream's PodStorage does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::SourceSnapshot;
use crate::pod::{ANNOTATION_CONFIG_MIRROR, ANNOTATION_CONFIG_SEEN, ANNOTATION_CONFIG_SOURCE};
use crate::types::{PodOperation, PodUid, PodUpdate, Source, full_name};

/// Pod state per source. A source is ready once it delivered its first snapshot; sources never
/// wait for each other.
#[derive(Default)]
pub struct Mux {
    sources: HashMap<Source, BTreeMap<PodUid, Arc<Pod>>>,
}

/// The agent's own annotations: they say where and when a pod was seen, not what it is.
const LOCAL_ANNOTATIONS: [&str; 3] = [
    ANNOTATION_CONFIG_SEEN,
    ANNOTATION_CONFIG_SOURCE,
    ANNOTATION_CONFIG_MIRROR,
];

/// Whether two versions of a pod are the same pod to run, as upstream compares pods: the same
/// spec, labels, annotations (but the agent's local ones) and deletion; not its status, nor the
/// metadata the API server bumps on every write (resourceVersion, managedFields).
fn same_config(a: &Pod, b: &Pod) -> bool {
    fn own(p: &Pod) -> impl Iterator<Item = (&String, &String)> {
        (p.metadata.annotations.iter().flatten())
            .filter(|(k, _)| !LOCAL_ANNOTATIONS.contains(&k.as_str()))
    }
    let (m, n) = (&a.metadata, &b.metadata);
    m.name == n.name
        && m.namespace == n.namespace
        && m.uid == n.uid
        && m.labels == n.labels
        && m.deletion_timestamp == n.deletion_timestamp
        && m.deletion_grace_period_seconds == n.deletion_grace_period_seconds
        && a.spec == b.spec
        && own(a).eq(own(b))
}

impl Mux {
    /// Has this source delivered a snapshot yet?
    pub fn is_ready(&self, source: Source) -> bool {
        self.sources.contains_key(&source)
    }

    /// Every desired pod of every source.
    pub fn desired(&self) -> impl Iterator<Item = &Arc<Pod>> {
        self.sources.values().flat_map(|pods| pods.values())
    }

    /// Replaces a source's state with its new snapshot and says what changed, in upstream order.
    /// Duplicate namespace/name pairs within the snapshot keep the first and are reported.
    pub fn merge(&mut self, snapshot: SourceSnapshot) -> Vec<PodUpdate> {
        let source = snapshot.source;
        let old = self.sources.remove(&source).unwrap_or_default();
        let mut new = BTreeMap::new();
        let mut names = HashSet::new();
        let (mut adds, mut updates, mut deletes, mut reconciles) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for pod in snapshot.pods {
            let name = full_name(&pod);
            if !names.insert(name.clone()) {
                tracing::warn!(pod = %name, %source, "duplicate pod name in one source; keeping the first one");
                continue;
            }
            let uid = PodUid::of(&pod);
            if new.contains_key(&uid) {
                tracing::warn!(pod = %name, %uid, %source, "two pods share one UID; keeping the first");
                continue;
            }
            let kept = match old.get(&uid) {
                None => {
                    adds.push(pod.clone());
                    pod
                }
                Some(prev) if Arc::ptr_eq(prev, &pod) => pod,
                Some(prev) => {
                    if pod.metadata.deletion_timestamp.is_some()
                        && prev.metadata.deletion_timestamp.is_none()
                    {
                        deletes.push(pod.clone());
                        pod
                    } else if !same_config(prev, &pod) {
                        let pod = Arc::new(keep_seen(prev, pod));
                        updates.push(pod.clone());
                        pod
                    } else if prev.status != pod.status {
                        let pod = Arc::new(keep_seen(prev, pod));
                        reconciles.push(pod.clone());
                        pod
                    } else {
                        prev.clone()
                    }
                }
            };
            new.insert(uid, kept);
        }
        // New pods are admitted oldest first, as upstream's HandlePodAdditions sorts them.
        adds.sort_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let removes: Vec<Arc<Pod>> = old
            .iter()
            .filter(|(uid, _)| !new.contains_key(*uid))
            .map(|(_, pod)| pod.clone())
            .collect();
        self.sources.insert(source, new);
        [
            (PodOperation::Remove, removes),
            (PodOperation::Add, adds),
            (PodOperation::Update, updates),
            (PodOperation::Delete, deletes),
            (PodOperation::Reconcile, reconciles),
        ]
        .into_iter()
        .filter(|(_, pods)| !pods.is_empty())
        .map(|(op, pods)| PodUpdate { op, source, pods })
        .collect()
    }
}

/// The new pod, but with the first-seen time of the one it replaces.
fn keep_seen(prev: &Pod, pod: Arc<Pod>) -> Pod {
    let mut pod = Arc::unwrap_or_clone(pod);
    let seen = prev
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_CONFIG_SEEN))
        .cloned();
    if let Some(seen) = seen {
        pod.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(ANNOTATION_CONFIG_SEEN.into(), seen);
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(name: &str, uid: &str, image: &str) -> Pod {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid,
                          "annotations": {ANNOTATION_CONFIG_SEEN: "t0", ANNOTATION_CONFIG_SOURCE: "file"}},
            "spec": {"containers": [{"name": "c", "image": image}]}
        }))
        .unwrap();
        p.metadata.namespace = Some("default".into());
        p
    }

    fn set(mux: &mut Mux, pods: Vec<Pod>) -> Vec<(PodOperation, Vec<String>)> {
        mux.merge(SourceSnapshot {
            objects: Vec::new(),
            source: Source::File,
            pods: pods.into_iter().map(Arc::new).collect(),
        })
        .into_iter()
        .map(|u| {
            (
                u.op,
                u.pods
                    .iter()
                    .map(|p| p.metadata.uid.clone().unwrap())
                    .collect(),
            )
        })
        .collect()
    }

    #[test]
    fn first_snapshot_adds_and_makes_the_source_ready() {
        let mut mux = Mux::default();
        assert!(!mux.is_ready(Source::File));
        assert_eq!(set(&mut mux, vec![]), vec![]);
        assert!(mux.is_ready(Source::File));
        assert!(!mux.is_ready(Source::Http));
        let ops = set(&mut mux, vec![pod("a", "1", "i"), pod("b", "2", "i")]);
        assert_eq!(ops, vec![(PodOperation::Add, vec!["1".into(), "2".into()])]);
    }

    #[test]
    fn an_unchanged_snapshot_is_silent_even_with_a_new_seen_time() {
        let mut mux = Mux::default();
        set(&mut mux, vec![pod("a", "1", "i")]);
        let mut again = pod("a", "1", "i");
        again
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION_CONFIG_SEEN.into(), "t1".into());
        assert_eq!(set(&mut mux, vec![again]), vec![]);
    }

    #[test]
    fn changes_come_out_in_upstream_order() {
        let mut mux = Mux::default();
        set(
            &mut mux,
            vec![
                pod("a", "1", "i"),
                pod("b", "2", "i"),
                pod("c", "3", "i"),
                pod("d", "4", "i"),
            ],
        );
        let mut deleted = pod("c", "3", "i");
        deleted.metadata.deletion_timestamp = Some(Time(Default::default()));
        let mut status_only = pod("d", "4", "i");
        status_only.status = Some(Default::default());
        let ops = set(
            &mut mux,
            vec![pod("b", "2", "j"), deleted, status_only, pod("e", "5", "i")],
        );
        assert_eq!(
            ops,
            vec![
                (PodOperation::Remove, vec!["1".into()]),
                (PodOperation::Add, vec!["5".into()]),
                (PodOperation::Update, vec!["2".into()]),
                (PodOperation::Delete, vec!["3".into()]),
                (PodOperation::Reconcile, vec!["4".into()]),
            ]
        );
    }

    #[test]
    fn an_updated_pod_keeps_its_first_seen_time() {
        let mut mux = Mux::default();
        set(&mut mux, vec![pod("a", "1", "i")]);
        let mut changed = pod("a", "1", "j");
        changed
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION_CONFIG_SEEN.into(), "t9".into());
        set(&mut mux, vec![changed]);
        let kept = mux.desired().next().unwrap();
        assert_eq!(
            kept.metadata.annotations.as_ref().unwrap()[ANNOTATION_CONFIG_SEEN],
            "t0"
        );
    }

    #[test]
    fn a_new_resource_version_alone_is_no_update() {
        let mut mux = Mux::default();
        set(&mut mux, vec![pod("a", "1", "i")]);
        let mut written = pod("a", "1", "i");
        written.metadata.resource_version = Some("42".into());
        written.status = Some(Default::default());
        assert_eq!(
            set(&mut mux, vec![written]),
            vec![(PodOperation::Reconcile, vec!["1".into()])]
        );
    }

    #[test]
    fn duplicate_names_keep_the_first() {
        let mut mux = Mux::default();
        let ops = set(&mut mux, vec![pod("a", "1", "i"), pod("a", "2", "i")]);
        assert_eq!(ops, vec![(PodOperation::Add, vec!["1".into()])]);
    }

    #[test]
    fn duplicate_uids_keep_the_first() {
        let mut mux = Mux::default();
        let ops = set(&mut mux, vec![pod("a", "1", "i"), pod("b", "1", "i")]);
        assert_eq!(ops, vec![(PodOperation::Add, vec!["1".into()])]);
        assert_eq!(mux.desired().count(), 1);
    }

    #[test]
    fn sources_do_not_touch_each_other() {
        let mut mux = Mux::default();
        set(&mut mux, vec![pod("a", "1", "i")]);
        let ops = mux.merge(SourceSnapshot {
            objects: Vec::new(),
            source: Source::Http,
            pods: vec![],
        });
        assert!(ops.is_empty());
        assert_eq!(mux.desired().count(), 1);
    }
}

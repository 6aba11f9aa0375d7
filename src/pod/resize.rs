//! In-place resize, the pure part: a pod's allocation (the resources it and its containers
//! were admitted with, or last resized to) and the pod the node runs while a resize waits for
//! room.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};

/// Set on the pod the node syncs while its spec's resources wait for room (the message says
/// why); the status shows it as the PodResizePending condition. Never sent anywhere.
pub const ANNOTATION_RESIZE_PENDING: &str = "nodelet.io/resize-pending";

/// What a pod was admitted with, or last resized to: its own resources (`spec.resources`) and
/// each container's (init containers too), by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allocation {
    pub pod: Option<ResourceRequirements>,
    pub containers: BTreeMap<String, ResourceRequirements>,
}

/// The pod's and its containers' resources as its spec has them.
pub fn allocation(pod: &Pod) -> Allocation {
    let s = super::spec(pod);
    Allocation {
        pod: s.resources.clone(),
        containers: super::all_containers(s)
            .map(|c| (c.name.clone(), c.resources.clone().unwrap_or_default()))
            .collect(),
    }
}

/// Do the pod and its containers ask for exactly the resources of `allocated`? (Without
/// building the pod's own allocation: this is asked at every sync.)
pub fn matches(pod: &Pod, allocated: &Allocation) -> bool {
    let s = super::spec(pod);
    if s.resources != allocated.pod {
        return false;
    }
    let mut count = 0;
    let all_equal = super::all_containers(s).all(|c| {
        count += 1;
        let default = ResourceRequirements::default();
        allocated.containers.get(&c.name) == Some(c.resources.as_ref().unwrap_or(&default))
    });
    all_equal && count == allocated.containers.len()
}

/// The pod as the node runs it while a resize waits: it and its containers keep the resources
/// of `allocated`, and it carries why.
pub fn with_allocation(pod: &Pod, allocated: &Allocation, pending: &str) -> Pod {
    let mut out = pod.clone();
    if let Some(spec) = out.spec.as_mut() {
        spec.resources.clone_from(&allocated.pod);
        let containers = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten());
        for c in containers {
            if let Some(r) = allocated.containers.get(&c.name) {
                c.resources = Some(r.clone());
            }
        }
    }
    out.metadata
        .annotations
        .get_or_insert_default()
        .insert(ANNOTATION_RESIZE_PENDING.into(), pending.into());
    out
}

/// Why the pod's resize waits, when it does.
pub fn pending(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_RESIZE_PENDING)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_resize_runs_the_allocated_resources_and_says_why() {
        let pod = |cpu: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"initContainers": [{"name": "i"}],
                         "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}
            }))
            .unwrap()
        };
        let before = allocation(&pod("100m"));
        assert_eq!(before.containers.len(), 2);
        let after = pod("5");
        assert!(matches(&pod("100m"), &before));
        assert!(!matches(&after, &before));
        let held = with_allocation(&after, &before, "no room");
        assert_eq!(allocation(&held), before);
        assert_eq!(pending(&held), Some("no room"));
        assert_eq!(pending(&after), None);
    }

    #[test]
    fn the_pods_own_resources_are_allocated_and_held_too() {
        let pod = |memory: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"resources": {"limits": {"memory": memory}},
                         "containers": [{"name": "c"}]}
            }))
            .unwrap()
        };
        let before = allocation(&pod("64Mi"));
        assert!(matches(&pod("64Mi"), &before));
        let after = pod("128Mi");
        assert!(!matches(&after, &before));
        let held = with_allocation(&after, &before, "no room");
        assert_eq!(allocation(&held), before);
        assert!(matches(&held, &before));
    }
}

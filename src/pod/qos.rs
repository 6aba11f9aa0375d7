//! The pod's QoS class by the upstream rules: Guaranteed when every container limits cpu and
//! memory with requests equal to limits, BestEffort when nothing is requested or limited,
//! Burstable otherwise; a pod that sets its own resources (`spec.resources`, upstream's
//! PodLevelResources) is judged by those alone. And what a pod asks of the node.

use k8s_openapi::api::core::v1::Pod;

use super::{all_containers, container_quantity, spec};

/// The resources a pod may set for itself, as upstream's IsSupportedPodLevelResource.
pub fn pod_level_resource(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

/// The pod's own request (or `limits`) of `key` (cpu in cores, memory in bytes), where its
/// `spec.resources` sets one above zero.
pub fn pod_level(pod: &Pod, limits: bool, key: &str) -> Option<f64> {
    let r = spec(pod).resources.as_ref()?;
    let map = if limits { &r.limits } else { &r.requests };
    map.as_ref()?
        .get(key)
        .and_then(|q| super::parse_quantity(&q.0))
        .filter(|v| *v > 0.0)
}

/// Guaranteed, Burstable or BestEffort.
pub fn qos_class(pod: &Pod) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    if spec(pod).resources.is_some() {
        let pair = |key: &str| (pod_level(pod, false, key), pod_level(pod, true, key));
        let any = ["cpu", "memory"].iter().any(|k| pair(k) != (None, None));
        let guaranteed = ["cpu", "memory"]
            .iter()
            .all(|k| matches!(pair(k), (Some(r), Some(l)) if r == l));
        return match (any, guaranteed) {
            (false, _) => "BestEffort",
            (true, true) => "Guaranteed",
            (true, false) => "Burstable",
        };
    }
    for c in all_containers(spec(pod)) {
        let get = |limits: bool, key: &str| container_quantity(c, limits, key).filter(|v| *v > 0.0);
        for key in ["cpu", "memory"] {
            let (request, limit) = (get(false, key), get(true, key));
            any |= request.is_some() || limit.is_some();
            match (request.or(limit), limit) {
                (Some(r), Some(l)) if r == l => {}
                _ => guaranteed = false,
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// The pod overhead (`spec.overhead`, from its RuntimeClass) of one resource, in its units.
pub fn overhead(pod: &Pod, key: &str) -> f64 {
    spec(pod)
        .overhead
        .as_ref()
        .and_then(|o| o.get(key))
        .and_then(|q| super::parse_quantity(&q.0))
        .unwrap_or(0.0)
}

/// What a pod asks of the node, as upstream's admission counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Requests {
    /// Cores.
    pub cpu: f64,
    /// Bytes.
    pub memory: f64,
    /// Bytes.
    pub ephemeral_storage: f64,
}

/// A pod's requests: cpu and memory its own (`spec.resources`) where it sets them, else the
/// larger of its app containers' sum and its largest init container, plus the pod overhead;
/// ephemeral storage the app containers' sum.
pub fn requests(pod: &Pod) -> Requests {
    let containers = container_requests(pod);
    let own =
        |key: &str, summed: f64| pod_level(pod, false, key).unwrap_or(summed) + overhead(pod, key);
    Requests {
        cpu: own("cpu", containers.cpu),
        memory: own("memory", containers.memory),
        ephemeral_storage: containers.ephemeral_storage,
    }
}

/// What the pod's containers ask for together (upstream's AggregateContainerRequests), without
/// the overhead.
pub fn container_requests(pod: &Pod) -> Requests {
    let request = |c: &k8s_openapi::api::core::v1::Container, key: &str| {
        container_quantity(c, false, key).unwrap_or(0.0)
    };
    let s = spec(pod);
    let sum = |key: &str| s.containers.iter().map(|c| request(c, key)).sum::<f64>();
    let init_max = |key: &str| {
        s.init_containers
            .iter()
            .flatten()
            .map(|c| request(c, key))
            .fold(0.0, f64::max)
    };
    Requests {
        cpu: sum("cpu").max(init_max("cpu")),
        memory: sum("memory").max(init_max("memory")),
        ephemeral_storage: sum("ephemeral-storage"),
    }
}

/// Lowest priority that makes a pod critical (upstream's SystemCriticalPriority).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The pod's priority: its spec's, else the one its system priority class stands for (a static
/// pod has no API server to resolve the class), else 0.
pub fn priority(pod: &Pod) -> i32 {
    let s = spec(pod);
    s.priority
        .unwrap_or(match s.priority_class_name.as_deref() {
            Some("system-node-critical") => SYSTEM_CRITICAL_PRIORITY + 1000,
            Some("system-cluster-critical") => SYSTEM_CRITICAL_PRIORITY,
            _ => 0,
        })
}

/// Whether the pod is critical: a priority at or above system-critical, or one of the two
/// system priority classes. Critical pods are never evicted nor refused under pressure.
pub fn is_critical(pod: &Pod) -> bool {
    let s = spec(pod);
    s.priority.is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
        || matches!(
            s.priority_class_name.as_deref(),
            Some("system-node-critical" | "system-cluster-critical")
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(resources: &[serde_json::Value]) -> Pod {
        let containers: Vec<_> = resources
            .iter()
            .enumerate()
            .map(
                |(i, r)| serde_json::json!({"name": format!("c{i}"), "image": "i", "resources": r}),
            )
            .collect();
        serde_json::from_value(serde_json::json!({"spec": {"containers": containers}})).unwrap()
    }

    #[test]
    fn qos_classes_follow_upstream() {
        use serde_json::json;
        assert_eq!(qos_class(&pod(&[json!({})])), "BestEffort");
        assert_eq!(
            qos_class(&pod(&[json!({"limits": {"cpu": "1", "memory": "1Gi"}})])),
            "Guaranteed"
        );
        assert_eq!(
            qos_class(&pod(&[
                json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}})
            ])),
            "Guaranteed"
        );
        assert_eq!(
            qos_class(&pod(&[
                json!({"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "1Gi"}})
            ])),
            "Burstable"
        );
        assert_eq!(
            qos_class(&pod(&[json!({"limits": {"cpu": "1"}})])),
            "Burstable"
        );
        assert_eq!(
            qos_class(&pod(&[
                json!({"limits": {"cpu": "1", "memory": "1Gi"}}),
                json!({})
            ])),
            "Burstable"
        );
    }

    #[test]
    fn a_pods_own_resources_decide_its_class_and_requests() {
        use serde_json::json;
        let with = |own: serde_json::Value, containers: &[serde_json::Value]| {
            let mut p = pod(containers);
            p.spec.as_mut().unwrap().resources = serde_json::from_value(own).unwrap();
            crate::pod::apply_defaults(&mut p);
            p
        };
        let limits = json!({"limits": {"cpu": "1", "memory": "1Gi"}});
        // Limits alone default the requests to them: Guaranteed, though the containers set nothing.
        let g = with(limits.clone(), &[json!({})]);
        assert_eq!(qos_class(&g), "Guaranteed");
        assert_eq!(requests(&g).cpu, 1.0);
        assert_eq!(requests(&g).memory, 1024.0 * 1024.0 * 1024.0);
        let b = with(
            json!({"requests": {"memory": "64Mi"}}),
            &[json!({"requests": {"cpu": "300m"}})],
        );
        assert_eq!(qos_class(&b), "Burstable");
        // Requests the pod does not set itself are its containers'.
        assert_eq!(
            (requests(&b).cpu, requests(&b).memory),
            (0.3, 64.0 * 1024.0 * 1024.0)
        );
        // A pod-level limit with no request takes the containers' requests where they have them.
        let d = with(
            json!({"limits": {"cpu": "2"}}),
            &[json!({"requests": {"cpu": "500m"}})],
        );
        assert_eq!(pod_level(&d, false, "cpu"), Some(0.5));
        assert_eq!(qos_class(&d), "Burstable");
        let be = with(json!({}), &[limits]);
        assert_eq!(
            qos_class(&be),
            "BestEffort",
            "upstream judges such a pod by its own resources alone"
        );
    }
}

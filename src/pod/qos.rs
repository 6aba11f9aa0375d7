//! The pod's QoS class by the upstream rules: Guaranteed when every container limits cpu and
//! memory with requests equal to limits, BestEffort when nothing is requested or limited,
//! Burstable otherwise.

use k8s_openapi::api::core::v1::Pod;

use super::{all_containers, container_quantity, spec};

/// Guaranteed, Burstable or BestEffort.
pub fn qos_class(pod: &Pod) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
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

/// A pod's requests: cpu and memory the larger of its app containers' sum and its largest init
/// container, plus the pod overhead; ephemeral storage the app containers' sum.
pub fn requests(pod: &Pod) -> Requests {
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
        cpu: sum("cpu").max(init_max("cpu")) + overhead(pod, "cpu"),
        memory: sum("memory").max(init_max("memory")) + overhead(pod, "memory"),
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
}

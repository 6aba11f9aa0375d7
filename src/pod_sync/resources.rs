//! Resource arithmetic for containers: what unset limits default to (the node's capacity, which
//! `host` reads), oom_score_adj by QoS class, and the downward API's resourceFieldRef values. Pure.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::host::NodeResources;
use crate::pod::{
    ANNOTATION_CONFIG_SOURCE, container_quantity as quantity, parse_quantity, qos_class, spec,
};

/// Node-critical pods (static or mirror pods of priority class system-node-critical, as
/// kubeadm's control plane) get the Guaranteed score whatever their QoS, as upstream.
fn is_node_critical(pod: &Pod) -> bool {
    let static_pod = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_CONFIG_SOURCE))
        .is_some_and(|s| s != "api");
    static_pod && spec(pod).priority_class_name.as_deref() == Some("system-node-critical")
}

/// The container's oom_score_adj (upstream: -997 Guaranteed and node-critical, 1000 BestEffort,
/// Burstable 1000 - 1000 * memory request / node memory, kept within 3..=999).
pub fn oom_score_adj(pod: &Pod, c: &Container, node_memory: f64) -> i64 {
    if is_node_critical(pod) {
        return -997;
    }
    match qos_class(pod) {
        "Guaranteed" => -997,
        "BestEffort" => 1000,
        _ => {
            let request = quantity(c, false, "memory").unwrap_or(0.0) + pod_memory_share(pod);
            let score = if node_memory > 0.0 {
                1000 - (1000.0 * request / node_memory) as i64
            } else {
                1000
            };
            score.clamp(3, 999)
        }
    }
}

/// Each container's share of the memory the pod requests for itself beyond what its containers
/// request (upstream's remainingPodMemReqPerContainer); none without a pod-level request.
fn pod_memory_share(pod: &Pod) -> f64 {
    let s = crate::pod::spec(pod);
    let Some(own) = crate::pod::pod_level(pod, false, "memory") else {
        return 0.0;
    };
    let count = s.containers.len() + s.init_containers.as_ref().map_or(0, Vec::len);
    let remaining = own - crate::pod::container_requests(pod).memory;
    (remaining / count.max(1) as f64).trunc()
}

/// The value of `resourceFieldRef` `resource` (e.g. `limits.memory`) of container `c`, divided
/// by `divisor` and rounded up; unset limits are the node's capacity.
pub fn resource_field_value(
    c: &Container,
    resource: &str,
    divisor: Option<&str>,
    node: &NodeResources,
) -> Result<String, String> {
    let (kind, name) = resource
        .split_once('.')
        .ok_or_else(|| format!("resource {resource:?} is not like limits.memory"))?;
    let limits = match kind {
        "limits" => true,
        "requests" => false,
        _ => {
            return Err(format!(
                "resource {resource:?} must start with limits. or requests."
            ));
        }
    };
    let capacity = match name {
        "cpu" => node.cpu,
        "memory" => node.memory,
        "ephemeral-storage" => node.ephemeral_storage,
        _ => {
            return Err(format!(
                "resource {resource:?} is not cpu, memory or ephemeral-storage"
            ));
        }
    };
    let value = match quantity(c, limits, name) {
        Some(v) => v,
        None if limits => capacity,
        None => 0.0,
    };
    // A zero divisor is the API's unset value ("0" once serialized): 1, as upstream.
    let divisor = match divisor.filter(|d| !d.is_empty()) {
        Some(d) => match parse_quantity(d).filter(|d| d.is_finite() && *d >= 0.0) {
            Some(0.0) => 1.0,
            Some(d) => d,
            None => return Err(format!("invalid divisor {d:?}")),
        },
        None => 1.0,
    };
    // Rounded up like upstream; the epsilon absorbs float noise (0.1 cpu / 100m is exactly 1).
    Ok((((value / divisor) - 1e-9).ceil().max(0.0) as i64).to_string())
}

/// A resourceFieldRef's value: of the container it names, else of `own` (an env var's own
/// container; a downwardAPI volume must name one).
pub fn selector_value(
    pod: &Pod,
    own: Option<&Container>,
    r: &k8s_openapi::api::core::v1::ResourceFieldSelector,
    node: &NodeResources,
) -> Result<String, String> {
    let named = r.container_name.as_deref().filter(|n| !n.is_empty());
    let target = match named {
        Some(name) => crate::pod::all_containers(crate::pod::spec(pod))
            .find(|c| c.name == name)
            .ok_or_else(|| format!("resourceFieldRef names no container {name:?}"))?,
        None => own.ok_or("resourceFieldRef needs a containerName here")?,
    };
    let divisor = r.divisor.as_ref().map(|q| q.0.as_str());
    resource_field_value(target, &r.resource, divisor, node)
        .map_err(|why| format!("resourceFieldRef: {why}"))
}

/// The hugepage sizes the machine offers, in bytes (/sys/kernel/mm/hugepages), read once.
fn hugepage_sizes() -> &'static [u64] {
    static SIZES: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    SIZES.get_or_init(|| {
        let mut sizes: Vec<u64> = std::fs::read_dir("/sys/kernel/mm/hugepages")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let kb: u64 = name
                    .strip_prefix("hugepages-")?
                    .strip_suffix("kB")?
                    .parse()
                    .ok()?;
                Some(kb * 1024)
            })
            .collect();
        sizes.sort_unstable();
        sizes
    })
}

/// A hugepage size as the CRI names it (`2MB`, `1GB`).
fn page_size_name(bytes: u64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB"];
    let mut size = bytes;
    let mut unit = 0;
    while size >= 1024 && size.is_multiple_of(1024) && unit + 1 < units.len() {
        size /= 1024;
        unit += 1;
    }
    format!("{size}{}", units[unit])
}

/// The container's hugetlb limits, one per size the machine offers, as upstream sets them: its
/// `hugepages-<size>` limit, else 0 (no hugepages).
pub fn hugepage_limits(c: &Container) -> Vec<crate::runtime::cri::HugepageLimit> {
    hugepage_sizes()
        .iter()
        .map(|&bytes| {
            let resource = match bytes {
                b if b >= 1 << 30 && b.is_multiple_of(1 << 30) => {
                    format!("hugepages-{}Gi", b >> 30)
                }
                b => format!("hugepages-{}Mi", b >> 20),
            };
            crate::runtime::cri::HugepageLimit {
                page_size: page_size_name(bytes),
                limit: quantity(c, true, &resource).map_or(0, |l| l as u64),
            }
        })
        .collect()
}

/// Does any container ask for hugepages (which nodelet does not provide)?
pub fn wants_hugepages(pod: &Pod) -> bool {
    crate::pod::all_containers(spec(pod)).any(|c| {
        c.resources.as_ref().is_some_and(|r| {
            r.limits
                .iter()
                .chain(r.requests.iter())
                .flatten()
                .any(|(k, _)| k.starts_with("hugepages-"))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(source: &str, resources: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "annotations": {ANNOTATION_CONFIG_SOURCE: source}},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]}
        }))
        .unwrap()
    }

    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

    #[test]
    fn oom_scores_follow_qos_and_node_criticality() {
        let be = pod("api", serde_json::json!({}));
        assert_eq!(
            oom_score_adj(&be, &spec(&be).containers[0], 8.0 * GIB),
            1000
        );
        let g = pod(
            "api",
            serde_json::json!({"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1", "memory": "1Gi"}}),
        );
        assert_eq!(oom_score_adj(&g, &spec(&g).containers[0], 8.0 * GIB), -997);
        let b = pod("api", serde_json::json!({"requests": {"memory": "2Gi"}}));
        assert_eq!(oom_score_adj(&b, &spec(&b).containers[0], 8.0 * GIB), 750);
        let huge = pod("api", serde_json::json!({"requests": {"memory": "8Gi"}}));
        assert_eq!(
            oom_score_adj(&huge, &spec(&huge).containers[0], 8.0 * GIB),
            3
        );
        let tiny = pod("api", serde_json::json!({"requests": {"memory": "1"}}));
        assert_eq!(
            oom_score_adj(&tiny, &spec(&tiny).containers[0], 8.0 * GIB),
            999
        );
        let static_pod = pod("file", serde_json::json!({}));
        assert_eq!(
            oom_score_adj(&static_pod, &spec(&static_pod).containers[0], 8.0 * GIB),
            1000
        );
        let mut critical = pod("file", serde_json::json!({}));
        critical.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
        assert_eq!(
            oom_score_adj(&critical, &spec(&critical).containers[0], 8.0 * GIB),
            -997
        );
    }

    #[test]
    fn resource_fields_divide_round_up_and_default_to_the_node() {
        let node = NodeResources {
            cpu: 2.0,
            memory: 8.0 * GIB,
            ephemeral_storage: 100.0 * GIB,
        };
        let p = pod(
            "file",
            serde_json::json!({"limits": {"memory": "64Mi", "cpu": "250m"}, "requests": {"cpu": "100m"}}),
        );
        let c = &spec(&p).containers[0];
        assert_eq!(
            resource_field_value(c, "limits.memory", None, &node).unwrap(),
            (64 * 1024 * 1024).to_string()
        );
        assert_eq!(
            resource_field_value(c, "limits.memory", Some("1Mi"), &node).unwrap(),
            "64"
        );
        assert_eq!(
            resource_field_value(c, "limits.cpu", None, &node).unwrap(),
            "1"
        );
        assert_eq!(
            resource_field_value(c, "limits.cpu", Some("1m"), &node).unwrap(),
            "250"
        );
        assert_eq!(
            resource_field_value(c, "limits.cpu", Some("0"), &node).unwrap(),
            "1",
            "a zero divisor is the unset one"
        );
        assert!(resource_field_value(c, "limits.cpu", Some("-1"), &node).is_err());
        assert_eq!(
            resource_field_value(c, "requests.cpu", Some("1m"), &node).unwrap(),
            "100"
        );
        assert_eq!(
            resource_field_value(c, "requests.memory", None, &node).unwrap(),
            "0"
        );
        assert_eq!(
            resource_field_value(c, "limits.ephemeral-storage", Some("1Gi"), &node).unwrap(),
            "100"
        );
        let none = pod("file", serde_json::json!({}));
        assert_eq!(
            resource_field_value(&spec(&none).containers[0], "limits.cpu", None, &node).unwrap(),
            "2"
        );
        assert!(resource_field_value(c, "limits.gpu", None, &node).is_err());
    }
}

//! API defaulting, as the API server applies it on create (pkg/apis/core/v1/defaults.go).

use k8s_openapi::api::core::v1::{Container, EmptyDirVolumeSource, Pod, Probe};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::Value;

/// Does the image reference carry a tag or a digest? (`busybox` and `reg:5000/busybox` do not.)
pub fn image_has_tag_or_digest(image: &str) -> bool {
    if image.contains('@') {
        return true;
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    last.contains(':')
}

fn image_tag_is_latest(image: &str) -> bool {
    !image.contains('@')
        && image
            .rsplit('/')
            .next()
            .unwrap_or(image)
            .ends_with(":latest")
}

/// Fills in every field the API server would default.
pub fn apply_defaults(pod: &mut Pod) {
    if pod.metadata.namespace.as_deref().unwrap_or("").is_empty() {
        pod.metadata.namespace = Some("default".into());
    }
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".into());
    spec.enable_service_links.get_or_insert(true);
    spec.security_context.get_or_insert_with(Default::default);
    let host_network = spec.host_network.unwrap_or(false);
    for c in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
    {
        default_container(c, host_network);
    }
    for v in spec.volumes.iter_mut().flatten() {
        let has_source = serde_json::to_value(&*v)
            .ok()
            .and_then(|j| match j {
                Value::Object(m) => Some(m.keys().any(|k| k != "name")),
                _ => None,
            })
            .unwrap_or(true);
        if !has_source {
            v.empty_dir = Some(EmptyDirVolumeSource::default());
        }
        if let Some(hp) = v.host_path.as_mut() {
            hp.type_.get_or_insert_with(String::new);
        }
        if let Some(image) = v.image.as_mut()
            && image.pull_policy.is_none()
        {
            let reference = image.reference.as_deref().unwrap_or("");
            let always = !image_has_tag_or_digest(reference) || image_tag_is_latest(reference);
            image.pull_policy = Some(if always { "Always" } else { "IfNotPresent" }.into());
        }
    }
    default_pod_requests(pod);
}

/// A pod that limits its own resources requests them too (upstream's defaultPodRequests): cpu
/// and memory what its containers request together where any requests them, else its limit.
fn default_pod_requests(pod: &mut Pod) {
    let s = super::spec(pod);
    let limited = s
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .is_some_and(|l| !l.is_empty());
    if !limited {
        return;
    }
    let summed = super::qos::container_requests(pod);
    let requested = |key: &str| {
        super::all_containers(s).any(|c| super::container_quantity(c, false, key).is_some())
    };
    let from_containers: Vec<(&str, String)> = [
        ("cpu", format!("{}m", (summed.cpu * 1000.0).round() as u64)),
        (
            "memory",
            super::format_quantity(summed.memory.round() as u64, true),
        ),
    ]
    .into_iter()
    .filter(|(key, _)| requested(key))
    .collect();
    let Some(r) = pod.spec.as_mut().and_then(|s| s.resources.as_mut()) else {
        return;
    };
    let limits = r.limits.clone().unwrap_or_default();
    let requests = r.requests.get_or_insert_with(Default::default);
    for (key, quantity) in from_containers {
        requests
            .entry(key.to_string())
            .or_insert(Quantity(quantity));
    }
    for (key, limit) in limits {
        if super::pod_level_resource(&key) {
            requests.entry(key).or_insert(limit);
        }
    }
}

fn default_container(c: &mut Container, host_network: bool) {
    if c.image_pull_policy.is_none() {
        let image = c.image.as_deref().unwrap_or("");
        let always = !image_has_tag_or_digest(image) || image_tag_is_latest(image);
        c.image_pull_policy = Some(if always { "Always" } else { "IfNotPresent" }.into());
    }
    c.termination_message_path
        .get_or_insert_with(|| "/dev/termination-log".into());
    c.termination_message_policy
        .get_or_insert_with(|| "File".into());
    for p in c.ports.iter_mut().flatten() {
        p.protocol.get_or_insert_with(|| "TCP".into());
        if host_network && p.host_port.unwrap_or(0) == 0 {
            p.host_port = Some(p.container_port);
        }
    }
    if let Some(res) = c.resources.as_mut()
        && let Some(limits) = &res.limits
    {
        let requests = res.requests.get_or_insert_with(Default::default);
        for (name, qty) in limits {
            requests.entry(name.clone()).or_insert_with(|| qty.clone());
        }
    }
    for probe in [
        &mut c.liveness_probe,
        &mut c.readiness_probe,
        &mut c.startup_probe,
    ]
    .into_iter()
    .flatten()
    {
        default_probe(probe);
    }
}

fn default_probe(p: &mut Probe) {
    p.timeout_seconds.get_or_insert(1);
    p.period_seconds.get_or_insert(10);
    p.success_threshold.get_or_insert(1);
    p.failure_threshold.get_or_insert(3);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::decode_manifest;

    fn defaulted(yaml: &str) -> Pod {
        let mut pod = decode_manifest(yaml).unwrap().pods.remove(0);
        apply_defaults(&mut pod);
        pod
    }

    #[test]
    fn pods_get_the_api_defaults() {
        let pod = defaulted(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: a\n    image: busybox\n    ports: [{containerPort: 80}]\n    resources: {limits: {cpu: '1'}}\n    livenessProbe: {tcpSocket: {port: 80}}\n  - {name: b, image: 'busybox:1.36'}\n  - {name: c, image: 'busybox:latest'}\n  - {name: d, image: 'reg:5000/busybox@sha256:abc'}\n  volumes: [{name: v}]\n",
        );
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
        assert_eq!(spec.enable_service_links, Some(true));
        let policies: Vec<_> = spec
            .containers
            .iter()
            .map(|c| c.image_pull_policy.clone().unwrap())
            .collect();
        assert_eq!(
            policies,
            ["Always", "IfNotPresent", "Always", "IfNotPresent"]
        );
        let a = &spec.containers[0];
        assert_eq!(
            a.ports.as_ref().unwrap()[0].protocol.as_deref(),
            Some("TCP")
        );
        assert_eq!(a.ports.as_ref().unwrap()[0].host_port, None);
        assert_eq!(
            a.termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
        assert_eq!(
            a.resources.as_ref().unwrap().requests.as_ref().unwrap()["cpu"].0,
            "1"
        );
        let probe = a.liveness_probe.as_ref().unwrap();
        assert_eq!(
            (
                probe.timeout_seconds,
                probe.period_seconds,
                probe.success_threshold,
                probe.failure_threshold
            ),
            (Some(1), Some(10), Some(1), Some(3))
        );
        assert!(spec.volumes.unwrap()[0].empty_dir.is_some());
    }

    #[test]
    fn host_network_pods_get_host_ports() {
        let pod = defaulted(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  hostNetwork: true\n  containers:\n  - {name: a, image: i, ports: [{containerPort: 8080}]}\n",
        );
        let port = &pod.spec.unwrap().containers[0].ports.clone().unwrap()[0];
        assert_eq!(port.host_port, Some(8080));
    }

    #[test]
    fn image_references_are_read_like_upstream() {
        assert!(!image_has_tag_or_digest("busybox"));
        assert!(!image_has_tag_or_digest("localhost:5000/busybox"));
        assert!(image_has_tag_or_digest("localhost:5000/busybox:1"));
        assert!(image_has_tag_or_digest("busybox@sha256:00"));
    }
}

//! Pure pod logic: decoding manifests (pods and the ConfigMaps and Secrets beside them), API defaulting, validation, static-pod naming and UIDs,
//! and the container spec hash. Nothing here does I/O.

mod decode;
mod defaults;
mod hash;
mod qos;
mod quantity;
pub mod resize;
mod signal;
mod static_pod;
mod validate;
pub mod yaml;

pub use decode::{Decoded, decode_manifest};
pub use defaults::{apply_defaults, image_has_tag_or_digest};
pub use hash::changed as container_changed;
pub use hash::{container_digest, container_hash};
pub use qos::{
    Requests, SYSTEM_CRITICAL_PRIORITY, container_requests, is_critical, overhead, pod_level,
    pod_level_resource, priority, qos_class, requests,
};
pub use quantity::{container_quantity, format_quantity, parse_quantity};
pub use signal::{cri_signal, signal_number};
pub use static_pod::{
    ANNOTATION_CONFIG_HASH, ANNOTATION_CONFIG_MIRROR, ANNOTATION_CONFIG_SEEN,
    ANNOTATION_CONFIG_SOURCE, StaticOrigin, make_static, since_seen,
};
pub use validate::{
    api_object_reference, is_config_key, is_dns1123_label, is_dns1123_subdomain, is_qualified_name,
    is_valid_file_path, validate,
};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

/// The pod's spec, or an empty one (validation guarantees a spec for pods that reach the agent).
pub fn spec(pod: &Pod) -> &PodSpec {
    static EMPTY: std::sync::OnceLock<PodSpec> = std::sync::OnceLock::new();
    pod.spec
        .as_ref()
        .unwrap_or_else(|| EMPTY.get_or_init(PodSpec::default))
}

/// The pod's init containers then its app containers.
pub fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
}

/// The pod's ephemeral containers (`kubectl debug`) as containers: the API gives them the
/// same fields, and validation leaves out what they may not have (probes, ports, lifecycle).
pub fn ephemeral_containers(spec: &PodSpec) -> Vec<Container> {
    spec.ephemeral_containers
        .iter()
        .flatten()
        .filter_map(|e| serde_json::from_value(serde_json::to_value(e).ok()?).ok())
        .collect()
}

/// The container of the pod named `name`: init, app or ephemeral.
pub fn find_container(spec: &PodSpec, name: &str) -> Option<Container> {
    all_containers(spec)
        .find(|c| c.name == name)
        .cloned()
        .or_else(|| {
            ephemeral_containers(spec)
                .into_iter()
                .find(|c| c.name == name)
        })
}

/// The value of one of the pod's annotations.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The source a pod came from (its `kubernetes.io/config.source` annotation).
pub fn source(pod: &Pod) -> Option<crate::types::Source> {
    annotation(pod, ANNOTATION_CONFIG_SOURCE).and_then(crate::types::Source::parse)
}

/// Is this init container a sidecar (`restartPolicy: Always`)?
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The pod's termination grace period in seconds: the one its deletion asked for once it is
/// being deleted (a delete may shorten it), else its spec's (30 when unset, as the API
/// defaults it).
pub fn grace_period_seconds(pod: &Pod) -> i64 {
    let m = &pod.metadata;
    m.deletion_timestamp
        .as_ref()
        .and(m.deletion_grace_period_seconds)
        .or(spec(pod).termination_grace_period_seconds)
        .unwrap_or(30)
}

/// The downward API's value of a `metadata.*` fieldRef (name, namespace, uid, and one label or
/// annotation by key); `None` for other paths.
pub fn metadata_field(pod: &Pod, path: &str) -> Option<String> {
    let m = &pod.metadata;
    let keyed = |prefix: &str, map: &Option<std::collections::BTreeMap<String, String>>| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(
            map.as_ref()
                .and_then(|m| m.get(key))
                .cloned()
                .unwrap_or_default(),
        )
    };
    match path {
        "metadata.name" => Some(m.name.clone().unwrap_or_default()),
        "metadata.namespace" => Some(crate::types::namespace(pod).to_string()),
        "metadata.uid" => Some(m.uid.clone().unwrap_or_default()),
        _ => keyed("metadata.labels['", &m.labels)
            .or_else(|| keyed("metadata.annotations['", &m.annotations)),
    }
}

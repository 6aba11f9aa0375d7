//! Validation of a pod as an API create would do it, reporting every problem with its field path.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, HostPathVolumeSource, KeyToPath, Pod, PodSpec,
    ProjectedVolumeSource, Volume,
};
use serde_json::Value;

/// Is `s` a DNS-1123 subdomain (lower-case alphanumerics, '-' and '.', at most 253 characters)?
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// Is `s` a qualified name (an optional DNS-1123 subdomain prefix and `/`, then 1 to 63
/// alphanumerics, '-', '_' or '.', starting and ending alphanumeric), as label and taint keys are?
pub fn is_qualified_name(s: &str) -> bool {
    let name = match s.split_once('/') {
        Some((prefix, name)) if is_dns1123_subdomain(prefix) => name,
        Some(_) => return false,
        None => s,
    };
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The API objects a pod refers to, named as upstream's kubelet names them when it refuses a
/// static pod that refers to any (`static pods may not reference ...`), in upstream's order;
/// `None` when it refers to none. (Ephemeral containers cannot be part of a created pod.)
pub fn api_object_reference(pod: &Pod) -> Option<&'static str> {
    let spec = pod.spec.as_ref()?;
    if spec
        .service_account_name
        .as_deref()
        .is_some_and(|a| !a.is_empty())
    {
        return Some("serviceaccounts");
    }
    let containers = || {
        spec.init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
    };
    let from_env = |secret: bool| {
        containers().any(|c| {
            c.env.iter().flatten().any(|e| {
                e.value_from.as_ref().is_some_and(|f| {
                    if secret {
                        f.secret_key_ref.is_some()
                    } else {
                        f.config_map_key_ref.is_some()
                    }
                })
            }) || c.env_from.iter().flatten().any(|e| {
                if secret {
                    e.secret_ref.is_some()
                } else {
                    e.config_map_ref.is_some()
                }
            })
        })
    };
    let volumes = || spec.volumes.iter().flatten();
    let projections = || {
        volumes()
            .filter_map(|v| v.projected.as_ref())
            .flat_map(|p| p.sources.iter().flatten())
    };
    let secrets = spec.image_pull_secrets.iter().flatten().next().is_some()
        || from_env(true)
        || volumes().any(|v| v.secret.is_some() || v.azure_file.is_some())
        || projections().any(|p| p.secret.is_some());
    if secrets {
        return Some("secrets");
    }
    let config_maps = from_env(false)
        || volumes().any(|v| v.config_map.is_some())
        || projections().any(|p| p.config_map.is_some());
    if config_maps {
        return Some("configmaps");
    }
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        return Some("resourceclaims");
    }
    for v in volumes() {
        if v.csi.is_some() {
            return Some("csidrivers (via CSI volumes)");
        }
        if v.persistent_volume_claim.is_some() {
            return Some("persistentvolumeclaims");
        }
        if v.ephemeral.is_some() {
            return Some("persistentvolumeclaims (via ephemeral volumes)");
        }
    }
    for p in projections() {
        if p.service_account_token.is_some() {
            return Some("serviceaccounts (via projected volumes)");
        }
        if p.cluster_trust_bundle.is_some() {
            return Some("clustertrustbundles");
        }
    }
    None
}

/// Is `key` a valid ConfigMap or Secret key (`[-._a-zA-Z0-9]+`, not `.`, `..` or `..`-prefixed)?
pub fn is_config_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && key != "."
        && !key.starts_with("..")
}

/// Is `path` a relative path that stays inside the volume and does not collide with the
/// writer's own `..` entries?
pub fn is_valid_file_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with("..")
        && std::path::Path::new(path)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// Is `s` a DNS-1123 label (a subdomain of one part, at most 63 characters)?
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && is_dns1123_subdomain(s)
}

fn is_port_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.bytes().any(|b| b.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

/// The longest grace period accepted (a year): longer ones overflow timers.
pub const MAX_GRACE_SECONDS: i64 = 365 * 24 * 3600;

fn spec_grace_too_long(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .is_some_and(|g| g > MAX_GRACE_SECONDS)
}

/// The volume source kinds nodelet can materialise today.
const SUPPORTED_VOLUMES: &[&str] = &[
    "emptyDir",
    "hostPath",
    "configMap",
    "secret",
    "downwardAPI",
    "projected",
    "image",
];

/// Every problem of a decoded, defaulted pod, each as `field.path: what is wrong`. Empty means valid.
pub fn validate(pod: &Pod) -> Vec<String> {
    let mut p = Vec::new();
    check_metadata(&mut p, pod);
    let Some(spec) = &pod.spec else {
        p.push("spec: required".into());
        return p;
    };
    check_spec(&mut p, spec);
    let volumes = check_volumes(&mut p, spec);
    check_containers(&mut p, spec, &volumes);
    p
}

/// The pod's name, UID, namespace and grace period.
fn check_metadata(p: &mut Vec<String>, pod: &Pod) {
    match pod.metadata.name.as_deref() {
        None | Some("") => p.push("metadata.name: required".into()),
        Some(n) if !is_dns1123_subdomain(n) => p.push(format!(
            "metadata.name: {n:?} must be lower-case alphanumerics, '-' or '.' (DNS-1123 subdomain)"
        )),
        _ => {}
    }
    // The UID names the pod's directories and cgroup: nothing that could leave them.
    if let Some(uid) = pod.metadata.uid.as_deref().filter(|u| !u.is_empty())
        && (uid.len() > 64
            || !uid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
    {
        p.push(format!(
            "metadata.uid: {uid:?} must be at most 64 letters, digits, '-' or '_'"
        ));
    }
    if spec_grace_too_long(pod) {
        p.push(format!(
            "spec.terminationGracePeriodSeconds: at most {MAX_GRACE_SECONDS} seconds"
        ));
    }
    if let Some(ns) = pod.metadata.namespace.as_deref()
        && !is_dns1123_label(ns)
    {
        p.push(format!(
            "metadata.namespace: {ns:?} is not a DNS-1123 label"
        ));
    }
}

/// The pod-wide fields of the spec.
fn check_spec(p: &mut Vec<String>, spec: &PodSpec) {
    if spec.containers.is_empty() {
        p.push("spec.containers: at least one container is required".into());
    }
    check_one_of(
        p,
        "spec.restartPolicy",
        spec.restart_policy.as_deref(),
        &["Always", "OnFailure", "Never"],
    );
    check_one_of(
        p,
        "spec.dnsPolicy",
        spec.dns_policy.as_deref(),
        &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"],
    );
    if spec.termination_grace_period_seconds.unwrap_or(0) < 0 {
        p.push("spec.terminationGracePeriodSeconds: must not be negative".into());
    }
    if let Some(h) = spec.hostname.as_deref()
        && !is_dns1123_label(h)
    {
        p.push(format!("spec.hostname: {h:?} is not a DNS-1123 label"));
    }
    if spec.host_users == Some(false) {
        for (field, set) in [
            ("spec.hostNetwork", spec.host_network),
            ("spec.hostPID", spec.host_pid),
            ("spec.hostIPC", spec.host_ipc),
        ] {
            if set == Some(true) {
                p.push(format!("{field}: forbidden when `hostUsers` is false"));
            }
        }
    }
}

/// Each volume, with a unique name; the names declared.
fn check_volumes<'a>(p: &mut Vec<String>, spec: &'a PodSpec) -> HashSet<&'a str> {
    let mut volume_names = HashSet::new();
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let field = format!("spec.volumes[{i}]");
        if !is_dns1123_label(&v.name) {
            p.push(format!(
                "{field}.name: {:?} is not a DNS-1123 label",
                v.name
            ));
        }
        if !volume_names.insert(v.name.as_str()) {
            p.push(format!("{field}.name: duplicate volume {:?}", v.name));
        }
        check_volume(p, &field, v);
    }
    volume_names
}

/// Each init and app container, with a unique name.
fn check_containers(p: &mut Vec<String>, spec: &PodSpec, volume_names: &HashSet<&str>) {
    let mut container_names = HashSet::new();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c));
    let app = spec
        .containers
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("spec.containers[{i}]"), c));
    for (field, c) in init.chain(app) {
        if !is_dns1123_label(&c.name) {
            p.push(format!(
                "{field}.name: {:?} is not a DNS-1123 label",
                c.name
            ));
        }
        if !container_names.insert(c.name.as_str()) {
            p.push(format!(
                "{field}.name: duplicate container name {:?}",
                c.name
            ));
        }
        check_container(p, &field, c, volume_names);
        let os = spec.os.as_ref().map(|o| o.name.as_str());
        if c.lifecycle
            .as_ref()
            .is_some_and(|l| l.stop_signal.is_some())
            && os != Some("linux")
        {
            p.push(format!(
                "{field}.lifecycle.stopSignal: may be set only with spec.os.name: linux"
            ));
        }
    }
}

fn check_one_of(p: &mut Vec<String>, field: &str, value: Option<&str>, allowed: &[&str]) {
    if let Some(v) = value
        && !allowed.contains(&v)
    {
        p.push(format!(
            "{field}: {v:?} is not one of {}",
            allowed.join(", ")
        ));
    }
}

fn volume_kinds(v: &Volume) -> Vec<String> {
    match serde_json::to_value(v) {
        Ok(Value::Object(m)) => m.keys().filter(|k| *k != "name").cloned().collect(),
        _ => Vec::new(),
    }
}

fn check_volume(p: &mut Vec<String>, field: &str, v: &Volume) {
    let kinds = volume_kinds(v);
    match kinds.as_slice() {
        [] => p.push(format!("{field}: a volume source is required")),
        [kind] if !SUPPORTED_VOLUMES.contains(&kind.as_str()) => p.push(format!(
            "{field}.{kind}: volume type not supported by nodelet (supported: {})",
            SUPPORTED_VOLUMES.join(", ")
        )),
        [_] => {}
        many => p.push(format!(
            "{field}: exactly one volume source may be given, found {}",
            many.join(", ")
        )),
    }
    if let Some(limit) = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()) {
        check_quantity(
            p,
            &format!("{field}.emptyDir.sizeLimit"),
            "memory",
            &limit.0,
        );
    }
    if let Some(image) = &v.image {
        if image
            .reference
            .as_deref()
            .is_none_or(|r| r.trim().is_empty())
        {
            p.push(format!("{field}.image.reference: required"));
        }
        check_one_of(
            p,
            &format!("{field}.image.pullPolicy"),
            image.pull_policy.as_deref(),
            &["Always", "IfNotPresent", "Never"],
        );
    }
    if let Some(hp) = &v.host_path {
        check_host_path(p, &format!("{field}.hostPath"), hp);
    }
    if let Some(cm) = &v.config_map {
        let f = format!("{field}.configMap");
        check_object(p, &f, &cm.name, cm.items.as_deref(), cm.default_mode);
    }
    if let Some(s) = &v.secret {
        let f = format!("{field}.secret");
        let name = s.secret_name.as_deref().unwrap_or_default();
        check_object(p, &f, name, s.items.as_deref(), s.default_mode);
    }
    if let Some(d) = &v.downward_api {
        let f = format!("{field}.downwardAPI");
        check_mode(p, &format!("{f}.defaultMode"), d.default_mode);
        check_downward(p, &f, d.items.as_deref().unwrap_or_default());
    }
    if let Some(pr) = &v.projected {
        check_projected(p, &format!("{field}.projected"), pr);
    }
    if let Some(ed) = &v.empty_dir {
        check_one_of(
            p,
            &format!("{field}.emptyDir.medium"),
            ed.medium.as_deref(),
            &["", "Memory"],
        );
    }
}

/// A hostPath volume: an absolute path without '..', of a known type.
fn check_host_path(p: &mut Vec<String>, field: &str, hp: &HostPathVolumeSource) {
    if !hp.path.starts_with('/') {
        p.push(format!(
            "{field}.path: {:?} must be an absolute path",
            hp.path
        ));
    }
    if hp.path.split('/').any(|part| part == "..") {
        p.push(format!("{field}.path: must not contain '..'"));
    }
    check_one_of(
        p,
        &format!("{field}.type"),
        hp.type_.as_deref(),
        &[
            "",
            "DirectoryOrCreate",
            "Directory",
            "FileOrCreate",
            "File",
            "Socket",
            "CharDevice",
            "BlockDevice",
        ],
    );
}

/// A projected volume: configMap, secret and downwardAPI sources (tokens need a cluster).
fn check_projected(p: &mut Vec<String>, field: &str, pr: &ProjectedVolumeSource) {
    check_mode(p, &format!("{field}.defaultMode"), pr.default_mode);
    for (i, source) in pr.sources.iter().flatten().enumerate() {
        let sf = format!("{field}.sources[{i}]");
        if let Some(cm) = &source.config_map {
            check_object(
                p,
                &format!("{sf}.configMap"),
                &cm.name,
                cm.items.as_deref(),
                None,
            );
        } else if let Some(s) = &source.secret {
            check_object(
                p,
                &format!("{sf}.secret"),
                &s.name,
                s.items.as_deref(),
                None,
            );
        } else if let Some(d) = &source.downward_api {
            check_downward(
                p,
                &format!("{sf}.downwardAPI"),
                d.items.as_deref().unwrap_or_default(),
            );
        } else if source.service_account_token.is_some() {
            p.push(format!(
                "{sf}.serviceAccountToken: service account tokens come from an API server; they need cluster mode (--kubeconfig)"
            ));
        } else {
            p.push(format!(
                "{sf}: only configMap, secret and downwardAPI sources are supported"
            ));
        }
    }
}

fn check_key_ref(p: &mut Vec<String>, field: &str, name: &str, key: &str) {
    if !is_dns1123_subdomain(name) {
        p.push(format!("{field}.name: {name:?} is not a valid object name"));
    }
    if !is_config_key(key) {
        p.push(format!("{field}.key: {key:?} is not a valid key"));
    }
}

fn check_mode(p: &mut Vec<String>, field: &str, mode: Option<i32>) {
    if let Some(m) = mode
        && !(0..=0o777).contains(&m)
    {
        p.push(format!(
            "{field}: {m} is not a file mode between 0 and 0777 (511)"
        ));
    }
}

fn check_path(p: &mut Vec<String>, field: &str, path: &str) {
    if !is_valid_file_path(path) {
        p.push(format!(
            "{field}: {path:?} must be a relative path without '..' that does not start with '..'"
        ));
    }
}

/// A configMap or secret volume (or projection): its name, items and modes.
fn check_object(
    p: &mut Vec<String>,
    field: &str,
    name: &str,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
) {
    if !is_dns1123_subdomain(name) {
        p.push(format!("{field}: {name:?} is not a valid object name"));
    }
    check_mode(p, &format!("{field}.defaultMode"), default_mode);
    for (i, item) in items.unwrap_or_default().iter().enumerate() {
        let f = format!("{field}.items[{i}]");
        if !is_config_key(&item.key) {
            p.push(format!("{f}.key: {:?} is not a valid key", item.key));
        }
        check_path(p, &format!("{f}.path"), &item.path);
        check_mode(p, &format!("{f}.mode"), item.mode);
    }
}

fn check_downward(p: &mut Vec<String>, field: &str, items: &[DownwardAPIVolumeFile]) {
    for (i, item) in items.iter().enumerate() {
        let f = format!("{field}.items[{i}]");
        check_path(p, &format!("{f}.path"), &item.path);
        check_mode(p, &format!("{f}.mode"), item.mode);
        match (&item.field_ref, &item.resource_field_ref) {
            (Some(r), None) => {
                let path = r.field_path.as_str();
                let keyed = ["metadata.labels['", "metadata.annotations['"]
                    .iter()
                    .any(|pre| path.starts_with(pre) && path.ends_with("']"));
                let whole = [
                    "metadata.name",
                    "metadata.namespace",
                    "metadata.uid",
                    "metadata.labels",
                    "metadata.annotations",
                ];
                if !keyed && !whole.contains(&path) {
                    p.push(format!(
                        "{f}.fieldRef.fieldPath: {path:?} is not supported in a volume (supported: {}, metadata.labels['key'], metadata.annotations['key'])",
                        whole.join(", ")
                    ));
                }
            }
            (None, Some(r)) => {
                if r.container_name.as_deref().is_none_or(str::is_empty) {
                    p.push(format!(
                        "{f}.resourceFieldRef.containerName: required in a volume"
                    ));
                }
            }
            _ => p.push(format!(
                "{f}: exactly one of fieldRef or resourceFieldRef is required"
            )),
        }
    }
}

/// A resource quantity: a number, not negative, and (for the resources counted in bytes) no
/// fraction of a byte; a wrong one is refused, never read as "no limit".
fn check_quantity(p: &mut Vec<String>, field: &str, resource: &str, text: &str) {
    let bytes =
        matches!(resource, "memory" | "ephemeral-storage") || resource.starts_with("hugepages-");
    match crate::pod::parse_quantity(text) {
        None => p.push(format!("{field}: {text:?} is not a quantity")),
        Some(q) if !q.is_finite() => p.push(format!("{field}: {text:?} is out of range")),
        Some(q) if q < 0.0 => p.push(format!(
            "{field}: {text:?} must be greater than or equal to 0"
        )),
        Some(q) if bytes && q > 0.0 && q < 1.0 => {
            p.push(format!("{field}: {text:?} is less than one byte"))
        }
        Some(_) => {}
    }
}

fn check_container(p: &mut Vec<String>, field: &str, c: &Container, volumes: &HashSet<&str>) {
    check_resources(p, field, c);
    if c.image.as_deref().unwrap_or("").trim().is_empty() {
        p.push(format!("{field}.image: required"));
    }
    check_one_of(
        p,
        &format!("{field}.imagePullPolicy"),
        c.image_pull_policy.as_deref(),
        &["Always", "IfNotPresent", "Never"],
    );
    check_ports(p, field, c);
    if let Some(signal) = c.lifecycle.as_ref().and_then(|l| l.stop_signal.as_deref())
        && super::signal_number(signal).is_none()
    {
        p.push(format!(
            "{field}.lifecycle.stopSignal: {signal:?} is not a Linux signal name (e.g. SIGTERM, SIGUSR1, SIGRTMIN+1)"
        ));
    }
    check_env(p, field, c);
    check_mounts(p, field, c, volumes);
}

/// The container's resource limits and requests: each a valid quantity.
fn check_resources(p: &mut Vec<String>, field: &str, c: &Container) {
    let resources = c.resources.as_ref();
    for (kind, map) in [
        ("limits", resources.and_then(|r| r.limits.as_ref())),
        ("requests", resources.and_then(|r| r.requests.as_ref())),
    ] {
        for (resource, q) in map.into_iter().flatten() {
            check_quantity(
                p,
                &format!("{field}.resources.{kind}[{resource}]"),
                resource,
                &q.0,
            );
        }
    }
}

/// The container's ports: in range, with a known protocol and unique valid names.
fn check_ports(p: &mut Vec<String>, field: &str, c: &Container) {
    let mut port_names = HashSet::new();
    for (i, port) in c.ports.iter().flatten().enumerate() {
        let pf = format!("{field}.ports[{i}]");
        if !(1..=65535).contains(&port.container_port) {
            p.push(format!(
                "{pf}.containerPort: {} is not a port from 1 to 65535",
                port.container_port
            ));
        }
        if let Some(hp) = port.host_port
            && !(0..=65535).contains(&hp)
        {
            p.push(format!("{pf}.hostPort: {hp} is not a port from 0 to 65535"));
        }
        check_one_of(
            p,
            &format!("{pf}.protocol"),
            port.protocol.as_deref(),
            &["TCP", "UDP", "SCTP"],
        );
        if let Some(name) = port.name.as_deref() {
            if !is_port_name(name) {
                p.push(format!("{pf}.name: {name:?} is not a valid port name (at most 15 lower-case alphanumerics or '-')"));
            }
            if !port_names.insert(name) {
                p.push(format!("{pf}.name: duplicate port name {name:?}"));
            }
        }
    }
}

/// The container's environment: variable names, and the objects they and envFrom refer to.
fn check_env(p: &mut Vec<String>, field: &str, c: &Container) {
    for (i, env) in c.env.iter().flatten().enumerate() {
        if env.name.is_empty() || env.name.contains('=') {
            p.push(format!(
                "{field}.env[{i}].name: {:?} must be non-empty and contain no '='",
                env.name
            ));
        }
        if let Some(from) = &env.value_from {
            let ef = format!("{field}.env[{i}].valueFrom");
            if let Some(r) = &from.config_map_key_ref {
                check_key_ref(p, &format!("{ef}.configMapKeyRef"), &r.name, &r.key);
            }
            if let Some(r) = &from.secret_key_ref {
                check_key_ref(p, &format!("{ef}.secretKeyRef"), &r.name, &r.key);
            }
        }
    }
    for (i, from) in c.env_from.iter().flatten().enumerate() {
        let ef = format!("{field}.envFrom[{i}]");
        let name = match (&from.config_map_ref, &from.secret_ref) {
            (Some(r), None) => &r.name,
            (None, Some(r)) => &r.name,
            _ => {
                p.push(format!(
                    "{ef}: exactly one of configMapRef or secretRef is required"
                ));
                continue;
            }
        };
        if !is_dns1123_subdomain(name) {
            p.push(format!("{ef}: {name:?} is not a valid object name"));
        }
        if let Some(prefix) = from.prefix.as_deref()
            && prefix.bytes().any(|b| !b.is_ascii_graphic() || b == b'=')
        {
            p.push(format!(
                "{ef}.prefix: {prefix:?} may hold only printable characters other than '='"
            ));
        }
    }
}

/// The container's volume mounts: of a declared volume, at a unique path, with a valid
/// propagation and relative sub-paths.
fn check_mounts(p: &mut Vec<String>, field: &str, c: &Container, volumes: &HashSet<&str>) {
    let mut mount_paths = HashSet::new();
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        let mf = format!("{field}.volumeMounts[{i}]");
        if !volumes.contains(m.name.as_str()) {
            p.push(format!(
                "{mf}.name: no volume named {:?} in spec.volumes",
                m.name
            ));
        }
        if m.mount_path.is_empty() {
            p.push(format!("{mf}.mountPath: required"));
        } else if m.mount_path.contains(':') {
            p.push(format!("{mf}.mountPath: must not contain ':'"));
        }
        match m.mount_propagation.as_deref() {
            None | Some("None" | "HostToContainer") => {}
            Some("Bidirectional") => {
                let privileged = c
                    .security_context
                    .as_ref()
                    .and_then(|s| s.privileged)
                    .unwrap_or(false);
                if !privileged {
                    p.push(format!(
                        "{mf}.mountPropagation: Bidirectional mount propagation is available only to privileged containers"
                    ));
                }
            }
            Some(other) => p.push(format!(
                "{mf}.mountPropagation: {other:?} is not None, HostToContainer or Bidirectional"
            )),
        }
        if !mount_paths.insert(m.mount_path.as_str()) {
            p.push(format!(
                "{mf}.mountPath: {:?} is mounted twice",
                m.mount_path
            ));
        }
        for (field, sub) in [("subPath", &m.sub_path), ("subPathExpr", &m.sub_path_expr)] {
            if let Some(sub) = sub.as_deref()
                && (sub.starts_with('/') || sub.split('/').any(|part| part == ".."))
            {
                p.push(format!(
                    "{mf}.{field}: {sub:?} must be a relative path without '..'"
                ));
            }
        }
        if [&m.sub_path, &m.sub_path_expr]
            .iter()
            .all(|s| s.as_deref().is_some_and(|s| !s.is_empty()))
        {
            p.push(format!(
                "{mf}.subPathExpr: subPath and subPathExpr are mutually exclusive"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{apply_defaults, decode_manifest};

    fn problems(yaml: &str) -> Vec<String> {
        let mut pod = decode_manifest(yaml).unwrap().pods.remove(0);
        apply_defaults(&mut pod);
        validate(&pod)
    }

    #[test]
    fn a_good_pod_is_valid() {
        let p = problems(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: good}\nspec:\n  volumes: [{name: data, emptyDir: {}}, {name: etc, hostPath: {path: /etc, type: Directory}}]\n  containers:\n  - name: c\n    image: busybox\n    ports: [{name: http, containerPort: 80}]\n    volumeMounts: [{name: data, mountPath: /data, subPath: x}]\n",
        );
        assert!(p.is_empty(), "{p:?}");
    }

    #[test]
    fn every_problem_is_reported_with_its_field() {
        let p = problems(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: Bad_Name}\nspec:\n  restartPolicy: Sometimes\n  volumes: [{name: v, nfs: {server: s, path: /}}]\n  containers:\n  - {name: c, image: '', ports: [{containerPort: 70000}]}\n  - name: c\n    image: i\n    volumeMounts: [{name: missing, mountPath: /m, subPath: ../x}]\n",
        );
        let expect = [
            "metadata.name",
            "spec.restartPolicy",
            "spec.volumes[0].nfs",
            "spec.containers[0].image",
            "spec.containers[0].ports[0].containerPort",
            "spec.containers[1].name: duplicate",
            "spec.containers[1].volumeMounts[0].name",
            "spec.containers[1].volumeMounts[0].subPath",
        ];
        for e in expect {
            assert!(p.iter().any(|x| x.starts_with(e)), "missing {e} in {p:?}");
        }
        assert_eq!(p.len(), expect.len(), "{p:?}");
    }

    #[test]
    fn negative_and_sub_byte_quantities_are_refused_by_field() {
        let p = problems(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: q}\nspec:\n  volumes: [{name: v, emptyDir: {sizeLimit: 500m}}]\n  containers:\n  - name: c\n    image: i\n    resources: {limits: {memory: -1Gi, cpu: 1e400}, requests: {memory: 0.5, cpu: 100m, ephemeral-storage: 1x}}\n",
        );
        let expect = [
            "spec.volumes[0].emptyDir.sizeLimit",
            "spec.containers[0].resources.limits[cpu]",
            "spec.containers[0].resources.limits[memory]",
            "spec.containers[0].resources.requests[ephemeral-storage]",
            "spec.containers[0].resources.requests[memory]",
        ];
        for e in expect {
            assert!(p.iter().any(|x| x.starts_with(e)), "missing {e} in {p:?}");
        }
        assert_eq!(p.len(), expect.len(), "{p:?}");
    }

    #[test]
    fn config_data_references_are_checked() {
        assert!(problems(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: ok}\nspec:\n  volumes:\n  - {name: a, configMap: {name: cfg, items: [{key: k, path: d/k, mode: 0400}]}}\n  - {name: b, secret: {secretName: s, defaultMode: 0440}}\n  - {name: c, downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}}\n  - {name: d, projected: {sources: [{configMap: {name: cfg}}, {secret: {name: s}}]}}\n  containers:\n  - name: c\n    image: i\n    env: [{name: A, valueFrom: {configMapKeyRef: {name: cfg, key: k}}}]\n    envFrom: [{secretRef: {name: s}, prefix: S_}]\n"
        )
        .is_empty());
        let p = problems(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec:\n  volumes:\n  - {name: a, configMap: {name: Cfg, items: [{key: '..k', path: ../k, mode: 01000}]}}\n  - {name: c, downwardAPI: {items: [{path: x, fieldRef: {fieldPath: spec.nodeName}}, {path: y, resourceFieldRef: {resource: limits.cpu}}]}}\n  - {name: d, projected: {sources: [{serviceAccountToken: {path: t}}]}}\n  containers:\n  - name: c\n    image: i\n    env: [{name: A, valueFrom: {secretKeyRef: {name: s, key: 'a b'}}}]\n    envFrom: [{}]\n",
        );
        let expect = [
            "spec.volumes[0].configMap: \"Cfg\"",
            "spec.volumes[0].configMap.items[0].key",
            "spec.volumes[0].configMap.items[0].path",
            "spec.volumes[0].configMap.items[0].mode",
            "spec.volumes[1].downwardAPI.items[0].fieldRef",
            "spec.volumes[1].downwardAPI.items[1].resourceFieldRef.containerName",
            "spec.volumes[2].projected.sources[0].serviceAccountToken: service account tokens come from an API server",
            "spec.containers[0].env[0].valueFrom.secretKeyRef.key",
            "spec.containers[0].envFrom[0]: exactly one",
        ];
        for e in expect {
            assert!(p.iter().any(|x| x.starts_with(e)), "missing {e} in {p:?}");
        }
        assert_eq!(p.len(), expect.len(), "{p:?}");
    }

    #[test]
    fn stop_signals_must_be_signals_on_a_linux_pod() {
        let pod = |os: &str, signal: &str| {
            problems(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: s}}\nspec:\n{os}  containers:\n  - {{name: c, image: i, lifecycle: {{stopSignal: {signal}}}}}\n"
            ))
        };
        assert!(pod("  os: {name: linux}\n", "SIGUSR1").is_empty());
        let p = pod("  os: {name: linux}\n", "SIGNOPE");
        assert!(p[0].contains("not a Linux signal name"), "{p:?}");
        let p = pod("", "SIGUSR1");
        assert!(p[0].contains("spec.os.name: linux"), "{p:?}");
    }

    #[test]
    fn a_pod_in_its_own_user_namespace_shares_no_host_namespace() {
        let pod = |host: &str| {
            problems(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: u}}\nspec:\n  hostUsers: false\n{host}  containers: [{{name: c, image: i}}]\n"
            ))
        };
        assert!(pod("").is_empty());
        for field in ["hostNetwork", "hostPID", "hostIPC"] {
            let p = pod(&format!("  {field}: true\n"));
            assert_eq!(
                p,
                [format!("spec.{field}: forbidden when `hostUsers` is false")]
            );
        }
    }

    #[test]
    fn uids_that_could_name_other_paths_are_refused() {
        for uid in ["../../etc", "/etc", "a.b", "x y"] {
            let p = problems(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, uid: '{uid}'}}\nspec:\n  containers: [{{name: c, image: i}}]\n"
            ));
            assert!(
                p.iter().any(|x| x.starts_with("metadata.uid")),
                "{uid}: {p:?}"
            );
        }
        let ok = problems(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, uid: 3f2a-11_ab}\nspec:\n  containers: [{name: c, image: i}]\n",
        );
        assert!(ok.is_empty(), "{ok:?}");
    }

    #[test]
    fn a_pod_without_containers_or_name_is_invalid() {
        let p = problems("apiVersion: v1\nkind: Pod\nspec: {containers: []}\n");
        assert_eq!(p.len(), 2, "{p:?}");
    }
}

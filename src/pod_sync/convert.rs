//! PodSpec to CRI: the sandbox and container configs, with the kubelet's labels, annotations,
//! log paths, namespaces, DNS, port mappings, mounts and environment. Pure: subPaths come
//! mounted already (`volumes::subpath`).

use std::collections::HashMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, VolumeMount};

use crate::cgroups::Cfs;
use crate::objects::Kind;
use crate::pod::{
    container_digest, container_hash, container_quantity, grace_period_seconds, spec,
};
use crate::runtime::{
    ANNOTATION_CONTAINER_HASH, ANNOTATION_NODE_NAME, ANNOTATION_RESOURCES,
    ANNOTATION_RESTART_COUNT, ANNOTATION_TERMINATION_GRACE, ANNOTATION_TERMINATION_MESSAGE_PATH,
    ANNOTATION_TERMINATION_MESSAGE_POLICY, LABEL_CONTAINER_DIGEST, LABEL_CONTAINER_NAME,
    LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID, cri,
};

/// Node-level settings the conversion needs.
#[derive(Clone, Debug)]
pub struct Context {
    pub node_name: String,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub container_logs_dir: PathBuf,
    pub resolv_conf: Option<PathBuf>,
    /// The node's IP, reported as the pods' hostIP (and podIP on the host network).
    pub host_ip: String,
    /// The runtime's name, the scheme of container IDs in statuses.
    pub runtime_name: String,
    /// The node's capacity, for unset limits in the downward API and oom_score_adj.
    pub node: crate::host::NodeResources,
    /// How cpu limits become CFS quotas (cpuCFSQuota, cpuCFSQuotaPeriod).
    pub cfs: Cfs,
    /// First delay of the container restart backoff (10 s; shorter only in tests).
    pub restart_backoff_initial: std::time::Duration,
    pub cluster_dns: super::network::ClusterDns,
    /// The runtime handlers that support recursive read-only mounts (`""`: the default one),
    /// as the runtime's status says.
    pub rro_handlers: Vec<String>,
    /// The runtime handlers that support user namespaces, as the runtime's status says.
    pub userns_handlers: Vec<String>,
}

fn meta(pod: &Pod) -> (&str, &str, &str) {
    (
        pod.metadata.name.as_deref().unwrap_or_default(),
        crate::types::namespace(pod),
        pod.metadata.uid.as_deref().unwrap_or_default(),
    )
}

/// `<pod-logs-dir>/<namespace>_<name>_<uid>`.
pub fn pod_log_dir(ctx: &Context, pod: &Pod) -> PathBuf {
    let (name, namespace, uid) = meta(pod);
    ctx.pod_logs_dir.join(format!("{namespace}_{name}_{uid}"))
}

/// `<container>/<restartCount>.log`, relative to the pod log dir.
pub fn container_log_path(container: &str, restart_count: u32) -> String {
    format!("{container}/{restart_count}.log")
}

/// `<container-logs-dir>/<pod>_<namespace>_<container>-<containerID>.log`.
pub fn container_log_link(ctx: &Context, pod: &Pod, container: &str, id: &str) -> PathBuf {
    let (name, namespace, _) = meta(pod);
    ctx.container_logs_dir
        .join(format!("{name}_{namespace}_{container}-{id}.log"))
}

fn pod_labels(pod: &Pod) -> HashMap<String, String> {
    let (name, namespace, uid) = meta(pod);
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(LABEL_POD_NAME.into(), name.into());
    labels.insert(LABEL_POD_NAMESPACE.into(), namespace.into());
    labels.insert(LABEL_POD_UID.into(), uid.into());
    labels
}

/// The pod's namespaces; `userns`: its own user namespace (`hostUsers: false`), else the
/// node's (sent as no option, as before the field, so pods made either way compare equal).
fn namespace_options(pod: &Pod, userns: Option<&cri::UserNamespace>) -> cri::NamespaceOption {
    let s = spec(pod);
    let mode = |host: Option<bool>, otherwise: cri::NamespaceMode| {
        if host.unwrap_or(false) {
            cri::NamespaceMode::Node as i32
        } else {
            otherwise as i32
        }
    };
    let pid_default = if s.share_process_namespace.unwrap_or(false) {
        cri::NamespaceMode::Pod
    } else {
        cri::NamespaceMode::Container
    };
    cri::NamespaceOption {
        network: mode(s.host_network, cri::NamespaceMode::Pod),
        pid: mode(s.host_pid, pid_default),
        ipc: mode(s.host_ipc, cri::NamespaceMode::Pod),
        userns_options: userns.cloned(),
        ..Default::default()
    }
}

/// The sandbox config of the pod's `attempt`th sandbox.
pub fn sandbox_config(
    pod: &Pod,
    attempt: u32,
    ctx: &Context,
    dns: cri::DnsConfig,
    cgroup_parent: String,
    userns: Option<&cri::UserNamespace>,
) -> cri::PodSandboxConfig {
    let (name, namespace, uid) = meta(pod);
    let s = spec(pod);
    let hostname = super::network::sandbox_hostname(pod, &ctx.cluster_dns.domain);
    let mut annotations: HashMap<String, String> = pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.insert(ANNOTATION_NODE_NAME.into(), ctx.node_name.clone());
    let (resources, overhead) = sandbox_resources(pod, ctx.cfs);
    let sysctls = s
        .security_context
        .as_ref()
        .and_then(|sc| sc.sysctls.as_ref())
        .map(|list| {
            list.iter()
                .map(|x| (x.name.clone(), x.value.clone()))
                .collect()
        })
        .unwrap_or_default();
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: namespace.into(),
            attempt,
        }),
        hostname,
        log_directory: pod_log_dir(ctx, pod).to_string_lossy().into_owned(),
        dns_config: Some(dns),
        port_mappings: port_mappings(pod),
        labels: pod_labels(pod),
        annotations,
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent,
            sysctls,
            security_context: Some(sandbox_security(pod, userns)),
            resources: Some(resources),
            overhead: Some(overhead),
        }),
        windows: None,
    }
}

/// The host ports the pod's containers ask for.
fn port_mappings(pod: &Pod) -> Vec<cri::PortMapping> {
    spec(pod)
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.unwrap_or(0) > 0)
        .map(|p| cri::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => cri::Protocol::Udp as i32,
                Some("SCTP") => cri::Protocol::Sctp as i32,
                _ => cri::Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect()
}

/// The sandbox's security context: its namespaces, privileged when any container is, the
/// runtime's default seccomp profile, and the pod's user, group and supplemental groups.
fn sandbox_security(
    pod: &Pod,
    userns: Option<&cri::UserNamespace>,
) -> cri::LinuxSandboxSecurityContext {
    let s = spec(pod);
    let privileged = s
        .containers
        .iter()
        .chain(s.init_containers.iter().flatten())
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|sc| sc.privileged)
                .unwrap_or(false)
        });
    let pod_security = s.security_context.as_ref();
    cri::LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options(pod, userns)),
        privileged,
        // The sandbox always runs with the runtime's default profile, so that pods may use
        // least-privileged profiles (upstream, kubernetes#84623).
        seccomp: Some(cri::SecurityProfile {
            profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
            ..Default::default()
        }),
        run_as_user: pod_security
            .and_then(|sc| sc.run_as_user)
            .map(|value| cri::Int64Value { value }),
        run_as_group: pod_security
            .and_then(|sc| sc.run_as_group)
            .map(|value| cri::Int64Value { value }),
        supplemental_groups: supplemental_groups(pod),
        ..Default::default()
    }
}

/// Values the downward API may hand to a container's environment.
fn field_value(pod: &Pod, path: &str, pod_ip: &str, host_ip: &str) -> Option<String> {
    let s = spec(pod);
    // A pod on the host's network has the host's address, as its status says.
    let pod_ip = if s.host_network == Some(true) {
        host_ip
    } else {
        pod_ip
    };
    Some(match path {
        "spec.nodeName" => s.node_name.clone().unwrap_or_default(),
        "spec.serviceAccountName" => s.service_account_name.clone().unwrap_or_default(),
        "status.podIP" | "status.podIPs" => pod_ip.into(),
        "status.hostIP" | "status.hostIPs" => host_ip.into(),
        _ => return crate::pod::metadata_field(pod, path),
    })
}

/// Expands `$(VAR)` references to earlier variables; `$$` is a literal `$`; unknown references
/// stay as they are (the Kubernetes rules).
pub fn expand(text: &str, vars: &HashMap<String, String>) -> String {
    expand_by(text, |name| vars.get(name).cloned())
}

/// [`expand`] with `lookup` giving each referenced variable's value (`None`: left as written).
fn expand_by(text: &str, mut lookup: impl FnMut(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match lookup(name) {
                Some(v) => out.push_str(&v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A container's config for the runtime. `volumes` maps volume names to what is on the host;
/// `image_ref` is what the image service resolved the image to.
pub struct ContainerInput<'a> {
    pub pod: &'a Pod,
    pub container: &'a Container,
    pub init: bool,
    pub restart_count: u32,
    pub image_ref: &'a str,
    pub volumes: &'a HashMap<String, crate::volumes::Mounted>,
    /// The ConfigMaps and Secrets the pod may use.
    pub objects: &'a crate::objects::View,
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
    pub node: &'a crate::host::NodeResources,
    /// How cpu limits become CFS quotas on this node.
    pub cfs: Cfs,
    /// The host file mounted at the container's terminationMessagePath.
    pub termination_log: Option<&'a std::path::Path>,
    /// The managed hosts file mounted at /etc/hosts.
    pub etc_hosts: Option<&'a std::path::Path>,
    /// The host paths of the container's subPath mounts, by volumeMount index.
    pub sub_paths: &'a HashMap<usize, PathBuf>,
    /// The container whose process namespace this one joins.
    pub pid_target: Option<&'a str>,
    /// Can the pod's runtime handler make recursive read-only mounts?
    pub rro_supported: bool,
    /// The pod's own user namespace (`hostUsers: false`); every mount is ID-mapped into it.
    pub userns: Option<&'a cri::UserNamespace>,
    /// The image IDs of the image volumes the container mounts, by volume name.
    pub image_volumes: &'a HashMap<String, String>,
}

/// May `name` be an environment variable's name (printable ASCII without '=', as upstream
/// accepts since relaxed validation)?
fn is_env_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && b != b'=')
}

/// An env valueFrom's ConfigMap or Secret key; `None` when optional and missing.
fn object_key(
    objects: &crate::objects::View,
    kind: Kind,
    name: &str,
    key: &str,
    optional: Option<bool>,
) -> Result<Option<String>, String> {
    let optional = optional.unwrap_or(false);
    let Some(object) = objects.get(kind, name) else {
        return if optional {
            Ok(None)
        } else {
            Err(crate::objects::View::not_found(kind, name))
        };
    };
    match object.env_value(key) {
        Some(v) => Ok(Some(v)),
        None if optional => Ok(None),
        None => Err(objects.no_key(kind, name, key)),
    }
}

/// The container's environment in upstream order: envFrom sources first, then env (a later
/// name replaces an earlier one in place), then the service links that neither defines. Only
/// `value`s are expanded, against the variables defined before them and the service links.
fn environment(input: &ContainerInput<'_>) -> Result<Vec<(String, String)>, String> {
    let ContainerInput {
        pod, container: c, ..
    } = *input;
    let enable_links = spec(pod).enable_service_links.unwrap_or(true);
    // An API pod waits for the first list of Services, as upstream, so that it never starts
    // without KUBERNETES_SERVICE_HOST; a static pod does not depend on the API server.
    let links = match input.objects.service_links(enable_links) {
        Some(links) => links,
        None if crate::pod::source(pod) == Some(crate::types::Source::Api) => {
            return Err(
                "services have not yet been read at least once, cannot construct envvars".into(),
            );
        }
        None => Vec::new(),
    };
    let mut env = Env {
        list: Vec::new(),
        vars: links.iter().cloned().collect(),
    };
    env_from(input, &mut env)?;
    for e in c.env.iter().flatten() {
        if let Some(value) = env_value(input, e, &env.vars)? {
            env.set(e.name.clone(), value);
        }
    }
    let defined: std::collections::HashSet<String> =
        env.list.iter().map(|(n, _)| n.clone()).collect();
    env.list
        .extend(links.into_iter().filter(|(n, _)| !defined.contains(n)));
    Ok(env.list)
}

/// A container's environment as it is built: the variables in order, and every value a later
/// `$(VAR)` may refer to (the service links' too).
struct Env {
    list: Vec<(String, String)>,
    vars: HashMap<String, String>,
}

impl Env {
    /// Sets a variable; a later definition of a name replaces the earlier one in place.
    fn set(&mut self, name: String, value: String) {
        self.vars.insert(name.clone(), value.clone());
        match self.list.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.list.push((name, value)),
        }
    }
}

/// The variables of the container's `envFrom` ConfigMaps and Secrets; keys that are not valid
/// variable names are skipped with a warning, as upstream.
fn env_from(input: &ContainerInput<'_>, env: &mut Env) -> Result<(), String> {
    let (pod, c) = (input.pod, input.container);
    for from in c.env_from.iter().flatten() {
        let (kind, name, optional) = match (&from.config_map_ref, &from.secret_ref) {
            (Some(r), _) => (Kind::ConfigMap, &r.name, r.optional),
            (None, Some(r)) => (Kind::Secret, &r.name, r.optional),
            (None, None) => continue,
        };
        let Some(object) = input.objects.get(kind, name) else {
            if optional.unwrap_or(false) {
                continue;
            }
            return Err(crate::objects::View::not_found(kind, name));
        };
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let mut invalid = Vec::new();
        for (key, value) in object.env_pairs() {
            let var = format!("{prefix}{key}");
            if is_env_name(&var) {
                env.set(var, value);
            } else {
                invalid.push(var);
            }
        }
        if !invalid.is_empty() {
            tracing::warn!(pod = %crate::types::full_name(pod), container = %c.name,
                "InvalidEnvironmentVariableNames: keys {invalid:?} from the envFrom {} {} were skipped since they are not valid environment variable names",
                kind.lower(), object.full_name());
        }
    }
    Ok(())
}

/// One `env` entry's value, or None for an optional key that is missing.
fn env_value(
    input: &ContainerInput<'_>,
    e: &EnvVar,
    vars: &HashMap<String, String>,
) -> Result<Option<String>, String> {
    let from = e.value_from.as_ref();
    let value = if let Some(v) = &e.value {
        expand(v, vars)
    } else if let Some(field) = from.and_then(|f| f.field_ref.as_ref()) {
        field_value(input.pod, &field.field_path, input.pod_ip, input.host_ip).ok_or_else(|| {
            format!(
                "env {}: fieldRef {:?} is not supported",
                e.name, field.field_path
            )
        })?
    } else if let Some(r) = from.and_then(|f| f.resource_field_ref.as_ref()) {
        super::resources::selector_value(input.pod, Some(input.container), r, input.node)
            .map_err(|why| format!("env {}: {why}", e.name))?
    } else if let Some(r) = from.and_then(|f| f.config_map_key_ref.as_ref()) {
        return object_key(input.objects, Kind::ConfigMap, &r.name, &r.key, r.optional);
    } else if let Some(r) = from.and_then(|f| f.secret_key_ref.as_ref()) {
        return object_key(input.objects, Kind::Secret, &r.name, &r.key, r.optional);
    } else if from.is_some() {
        return Err(format!(
            "env {}: this valueFrom source is not supported",
            e.name
        ));
    } else {
        String::new()
    };
    Ok(Some(value))
}

/// The subPath of each volumeMount that has one, by index: `subPath` as written, or
/// `subPathExpr` expanded against the container's environment. As upstream, a referenced
/// variable that is unset or empty fails the container, and so does an expansion that is an
/// absolute path or climbs out of the volume with '..'.
pub fn sub_paths(input: &ContainerInput<'_>) -> Result<Vec<(usize, String)>, String> {
    let mut out = Vec::new();
    let mut vars: Option<HashMap<String, String>> = None;
    for (i, m) in input.container.volume_mounts.iter().flatten().enumerate() {
        if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            out.push((i, sub.to_string()));
            continue;
        }
        let Some(expr) = m.sub_path_expr.as_deref().filter(|s| !s.is_empty()) else {
            continue;
        };
        let vars = match &mut vars {
            Some(vars) => vars,
            None => vars.insert(environment(input)?.into_iter().collect()),
        };
        let mut missing = std::collections::BTreeSet::new();
        let sub = expand_by(expr, |name| {
            let value = vars.get(name).filter(|v| !v.is_empty());
            if value.is_none() {
                missing.insert(name.to_string());
            }
            Some(value.cloned().unwrap_or_default())
        });
        let problem = if !missing.is_empty() {
            Some(format!(
                "no value for {}",
                missing.into_iter().collect::<Vec<_>>().join(", ")
            ))
        } else if sub.starts_with('/') {
            Some(format!("expands to the absolute path {sub:?}"))
        } else if sub.split('/').any(|part| part == "..") {
            Some(format!("expands to {sub:?}, which contains '..'"))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(format!(
                "volumeMount {}: subPathExpr {expr:?}: {problem}",
                m.name
            ));
        }
        out.push((i, sub));
    }
    Ok(out)
}

/// Builds the CRI container config, or says which field cannot be honoured.
pub fn container_config(input: &ContainerInput<'_>) -> Result<cri::ContainerConfig, String> {
    let ContainerInput {
        pod, container: c, ..
    } = *input;
    let envs = environment(input)?;
    let vars: HashMap<String, String> = envs.iter().cloned().collect();
    let envs = envs
        .into_iter()
        .map(|(key, value)| cri::KeyValue { key, value })
        .collect();
    let mut mounts = mounts(input)?;
    let (labels, annotations) = labels_and_annotations(input);
    if let Some(userns) = input.userns {
        for m in &mut mounts {
            m.uid_mappings.clone_from(&userns.uids);
            m.gid_mappings.clone_from(&userns.gids);
        }
    }
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt: input.restart_count,
        }),
        image: Some(cri::ImageSpec {
            image: input.image_ref.to_string(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: c
            .command
            .iter()
            .flatten()
            .map(|s| expand(s, &vars))
            .collect(),
        args: c.args.iter().flatten().map(|s| expand(s, &vars)).collect(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs,
        mounts,
        labels,
        annotations,
        log_path: container_log_path(&c.name, input.restart_count),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(linux_config(pod, c, input)),
        ..Default::default()
    })
}

/// The container's mounts, in upstream's order: the volumes, then /etc/hosts, then the
/// termination log.
fn mounts(input: &ContainerInput<'_>) -> Result<Vec<cri::Mount>, String> {
    let c = input.container;
    let mut mounts = Vec::new();
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        mounts.push(volume_mount(input, i, m)?);
    }
    let own_hosts = c
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path == "/etc/hosts");
    if let Some(hosts) = input.etc_hosts.filter(|_| !own_hosts) {
        mounts.push(cri::Mount {
            container_path: "/etc/hosts".into(),
            host_path: hosts.to_string_lossy().into_owned(),
            ..Default::default()
        });
    }
    let message_path = c.termination_message_path.as_deref().unwrap_or_default();
    let user_mounted = c
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path == message_path);
    if let Some(host) = input
        .termination_log
        .filter(|_| !message_path.is_empty() && !user_mounted)
    {
        mounts.push(cri::Mount {
            container_path: message_path.to_string(),
            host_path: host.to_string_lossy().into_owned(),
            ..Default::default()
        });
    }
    Ok(mounts)
}

/// The mount for the container's `i`th volumeMount: its volume's directory (or the prepared
/// subPath), or an image volume's image.
fn volume_mount(
    input: &ContainerInput<'_>,
    i: usize,
    m: &VolumeMount,
) -> Result<cri::Mount, String> {
    let Some(volume) = input.volumes.get(&m.name) else {
        return Err(format!("volumeMount {}: volume is not set up", m.name));
    };
    let has_sub_path = [&m.sub_path, &m.sub_path_expr]
        .into_iter()
        .any(|s| s.as_deref().is_some_and(|s| !s.is_empty()));
    if let Some(reference) = &volume.image {
        if has_sub_path {
            return Err(format!(
                "volumeMount {}: a subPath of an image volume is not supported",
                m.name
            ));
        }
        let Some(id) = input.image_volumes.get(&m.name) else {
            return Err(format!("volumeMount {}: the image is not pulled", m.name));
        };
        return Ok(cri::Mount {
            container_path: m.mount_path.clone(),
            readonly: true,
            image: Some(cri::ImageSpec {
                image: id.clone(),
                user_specified_image: reference.clone(),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let host_path = match input.sub_paths.get(&i) {
        Some(path) => path.clone(),
        None if has_sub_path => {
            return Err(format!("volumeMount {}: subPath is not mounted", m.name));
        }
        None => volume.path.clone(),
    };
    let readonly = volume.read_only || m.read_only.unwrap_or(false);
    let recursive_read_only = recursive_read_only(m, readonly, input.rro_supported)?;
    let propagation = match m.mount_propagation.as_deref() {
        None | Some("None") => cri::MountPropagation::PropagationPrivate,
        Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
        Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional,
        Some(other) => return Err(format!("invalid MountPropagation mode: {other:?}")),
    };
    Ok(cri::Mount {
        container_path: m.mount_path.clone(),
        host_path: host_path.to_string_lossy().into_owned(),
        readonly,
        recursive_read_only,
        propagation: propagation as i32,
        ..Default::default()
    })
}

/// The container's CRI labels and annotations, with upstream's names: what names it, and what
/// the agent reads back from the runtime (hashes, restart count, termination message, grace
/// period, resources, ports, preStop handler).
fn labels_and_annotations(
    input: &ContainerInput<'_>,
) -> (HashMap<String, String>, HashMap<String, String>) {
    let ContainerInput {
        pod, container: c, ..
    } = *input;
    let mut labels = HashMap::new();
    let (name, namespace, uid) = meta(pod);
    labels.insert(LABEL_POD_NAME.to_string(), name.to_string());
    labels.insert(LABEL_POD_NAMESPACE.to_string(), namespace.to_string());
    labels.insert(LABEL_POD_UID.to_string(), uid.to_string());
    labels.insert(LABEL_CONTAINER_NAME.to_string(), c.name.clone());
    labels.insert(LABEL_CONTAINER_DIGEST.to_string(), container_digest(c));
    let mut annotations = HashMap::new();
    annotations.insert(ANNOTATION_CONTAINER_HASH.to_string(), container_hash(c));
    annotations.insert(
        ANNOTATION_RESTART_COUNT.to_string(),
        input.restart_count.to_string(),
    );
    annotations.insert(
        ANNOTATION_TERMINATION_MESSAGE_PATH.to_string(),
        c.termination_message_path.clone().unwrap_or_default(),
    );
    annotations.insert(
        ANNOTATION_TERMINATION_MESSAGE_POLICY.to_string(),
        c.termination_message_policy.clone().unwrap_or_default(),
    );
    annotations.insert(
        ANNOTATION_TERMINATION_GRACE.to_string(),
        grace_period_seconds(pod).to_string(),
    );
    annotations.insert(
        ANNOTATION_RESOURCES.to_string(),
        resources_digest(pod, c).encode(),
    );
    if let Some(ports) = c.ports.as_ref().filter(|p| !p.is_empty()) {
        annotations.insert(
            "io.kubernetes.container.ports".to_string(),
            ports_annotation(ports),
        );
    }
    if let Some(handler) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
        annotations.insert(
            "io.kubernetes.container.preStopHandler".to_string(),
            serde_json::to_string(handler).unwrap_or_default(),
        );
    }
    (labels, annotations)
}

/// Adds what the device plugins answered for a container to its CRI config, as upstream
/// orders it: their environment and mounts before the container's own, their device nodes and
/// CDI devices, and their annotations where the agent set none of that name.
pub fn with_devices(
    config: &mut cri::ContainerConfig,
    devices: crate::cm::devices::proto::ContainerAllocateResponse,
) {
    let mut envs: Vec<(String, String)> = devices.envs.into_iter().collect();
    envs.sort();
    let envs = envs
        .into_iter()
        .map(|(key, value)| cri::KeyValue { key, value });
    config.envs.splice(0..0, envs);
    let mounts = devices.mounts.into_iter().map(|m| cri::Mount {
        container_path: m.container_path,
        host_path: m.host_path,
        readonly: m.read_only,
        ..Default::default()
    });
    config.mounts.splice(0..0, mounts);
    config
        .devices
        .extend(devices.devices.into_iter().map(|d| cri::Device {
            container_path: d.container_path,
            host_path: d.host_path,
            permissions: d.permissions,
        }));
    config.cdi_devices.extend(
        devices
            .cdi_devices
            .into_iter()
            .map(|d| cri::CdiDevice { name: d.name }),
    );
    for (key, value) in devices.annotations {
        config.annotations.entry(key).or_insert(value);
    }
}

fn seccomp(profile: Option<&k8s_openapi::api::core::v1::SeccompProfile>) -> cri::SecurityProfile {
    use cri::security_profile::ProfileType;
    let (kind, localhost_ref) = match profile {
        Some(p) if p.type_ == "RuntimeDefault" => (ProfileType::RuntimeDefault, String::new()),
        Some(p) if p.type_ == "Localhost" => (
            ProfileType::Localhost,
            p.localhost_profile.clone().unwrap_or_default(),
        ),
        // Upstream's default without --seccomp-default.
        _ => (ProfileType::Unconfined, String::new()),
    };
    cri::SecurityProfile {
        profile_type: kind as i32,
        localhost_ref,
    }
}

/// Whether a mount is made recursively read-only, by upstream's rules: `Enabled` needs a read-only
/// mount and a runtime that can, `IfPossible` takes it where the runtime can.
pub fn recursive_read_only(
    m: &k8s_openapi::api::core::v1::VolumeMount,
    readonly: bool,
    supported: bool,
) -> Result<bool, String> {
    let mode = m.recursive_read_only.as_deref().unwrap_or("Disabled");
    if mode == "Disabled" {
        return Ok(false);
    }
    let refused = |why: &str| {
        Err(format!(
            "failed to resolve recursive read-only mode: volume {:?} requested recursive read-only mode, but {why}",
            m.name
        ))
    };
    if !readonly {
        return refused("it is not read-only");
    }
    if let Some(p) = m.mount_propagation.as_deref().filter(|p| *p != "None") {
        return refused(&format!("it is not compatible with propagation {p:?}"));
    }
    match mode {
        "IfPossible" => Ok(supported),
        "Enabled" if supported => Ok(true),
        "Enabled" => refused("it is not supported by the runtime"),
        other => Err(format!("unknown recursive read-only mode {other:?}")),
    }
}

/// The container's AppArmor profile: its own field, else the pod's, else its annotation; none
/// leaves the runtime's default. (Pods asking for one on a host without AppArmor are refused
/// at admission.)
fn apparmor(pod: &Pod, c: &Container) -> Option<cri::SecurityProfile> {
    use cri::security_profile::ProfileType;
    let field = c
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.as_ref())
        .or(spec(pod)
            .security_context
            .as_ref()
            .and_then(|s| s.app_armor_profile.as_ref()))
        .map(|p| {
            (
                p.type_.clone(),
                p.localhost_profile.clone().unwrap_or_default(),
            )
        });
    let annotation = || {
        let value = pod.metadata.annotations.as_ref()?.get(&format!(
            "container.apparmor.security.beta.kubernetes.io/{}",
            c.name
        ))?;
        Some(match value.as_str() {
            "runtime/default" => ("RuntimeDefault".into(), String::new()),
            "unconfined" => ("Unconfined".into(), String::new()),
            other => (
                "Localhost".into(),
                other.strip_prefix("localhost/").unwrap_or(other).into(),
            ),
        })
    };
    let (kind, name) = field.or_else(annotation)?;
    let profile_type = match kind.as_str() {
        "RuntimeDefault" => ProfileType::RuntimeDefault,
        "Localhost" => ProfileType::Localhost,
        _ => ProfileType::Unconfined,
    };
    Some(cri::SecurityProfile {
        profile_type: profile_type as i32,
        localhost_ref: if profile_type == ProfileType::Localhost {
            name
        } else {
            String::new()
        },
    })
}

/// The container's ports as upstream's annotation has them: Go's encoding of its ContainerPort
/// (fields in declaration order, empty ones left out).
fn ports_annotation(ports: &[k8s_openapi::api::core::v1::ContainerPort]) -> String {
    let text = |s: &str| serde_json::Value::from(s).to_string();
    let each: Vec<String> = ports
        .iter()
        .map(|p| {
            let mut fields = Vec::new();
            if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                fields.push(format!("\"name\":{}", text(name)));
            }
            if let Some(port) = p.host_port.filter(|p| *p != 0) {
                fields.push(format!("\"hostPort\":{port}"));
            }
            fields.push(format!("\"containerPort\":{}", p.container_port));
            if let Some(protocol) = p.protocol.as_deref().filter(|p| !p.is_empty()) {
                fields.push(format!("\"protocol\":{}", text(protocol)));
            }
            if let Some(ip) = p.host_ip.as_deref().filter(|ip| !ip.is_empty()) {
                fields.push(format!("\"hostIP\":{}", text(ip)));
            }
            format!("{{{}}}", fields.join(","))
        })
        .collect();
    format!("[{}]", each.join(","))
}

/// Cgroup limits from a cpu request and limit (cores) and a memory limit (bytes), as upstream's
/// calculateLinuxResources: shares from the request (from the limit when there is no request),
/// and where quotas are enforced a CFS quota from the limit in a period that is then always set.
fn limits_of(
    cpu_request: Option<f64>,
    cpu_limit: Option<f64>,
    memory: Option<f64>,
    cfs: Cfs,
) -> cri::LinuxContainerResources {
    let shares = match (cpu_request, cpu_limit) {
        (None, Some(limit)) if limit > 0.0 => limit,
        (request, _) => request.unwrap_or(0.0),
    };
    cri::LinuxContainerResources {
        cpu_shares: crate::cgroups::shares(shares) as i64,
        cpu_period: if cfs.enforce { cfs.period } else { 0 },
        cpu_quota: cpu_limit
            .filter(|cpu| *cpu > 0.0 && cfs.enforce)
            .map_or(0, |cores| cfs.quota(cores)),
        memory_limit_in_bytes: memory.map_or(0, |m| m as i64),
        ..Default::default()
    }
}

/// The container's cgroup limits, hugepage limits and OOM score.
pub fn linux_resources(
    pod: &Pod,
    c: &Container,
    node_memory: f64,
    cfs: Cfs,
) -> cri::LinuxContainerResources {
    let quantity = |limits: bool, key: &str| container_quantity(c, limits, key);
    // A container without a limit of its own takes the pod's, where the pod sets one.
    let limit = |key: &str| {
        quantity(true, key)
            .filter(|v| *v > 0.0)
            .or_else(|| crate::pod::pod_level(pod, true, key))
    };
    let mut resources = limits_of(quantity(false, "cpu"), limit("cpu"), limit("memory"), cfs);
    // No swap beyond the memory limit (upstream's NoSwap on cgroup v1; containerd derives
    // memory.swap.max = 0 from it on v2).
    resources.memory_swap_limit_in_bytes = resources.memory_limit_in_bytes;
    resources.hugepage_limits = super::resources::hugepage_limits(c);
    resources.oom_score_adj = super::resources::oom_score_adj(pod, c, node_memory);
    resources
}

/// The pod's own resources for its sandbox config, without the overhead, and the overhead
/// apart (upstream's calculateSandboxResources and convertOverheadToLinuxResources).
fn sandbox_resources(
    pod: &Pod,
    cfs: Cfs,
) -> (cri::LinuxContainerResources, cri::LinuxContainerResources) {
    let s = spec(pod);
    let overhead = |key: &str| crate::pod::overhead(pod, key);
    // The pod's own limits where it sets them, else those the containers set (upstream's
    // PodLimits), whatever the others do.
    let limit = |key: &str| -> Option<f64> {
        let sum: f64 = s
            .containers
            .iter()
            .filter_map(|c| container_quantity(c, true, key))
            .sum();
        let total = s
            .init_containers
            .iter()
            .flatten()
            .filter_map(|c| container_quantity(c, true, key))
            .fold(sum, f64::max);
        let own = crate::pod::pod_level(pod, true, key);
        own.or((total > 0.0).then_some(total))
    };
    let cpu_request = crate::pod::requests(pod).cpu - overhead("cpu");
    let has_request = crate::pod::all_containers(s)
        .any(|c| container_quantity(c, false, "cpu").is_some())
        || crate::pod::pod_level(pod, false, "cpu").is_some();
    let own = limits_of(
        has_request.then_some(cpu_request),
        limit("cpu"),
        limit("memory"),
        cfs,
    );
    let with_overhead = s.overhead.as_ref().map_or_else(Default::default, |_| {
        let cpu = overhead("cpu");
        limits_of(
            Some(cpu),
            Some(cpu),
            Some(overhead("memory")).filter(|m| *m > 0.0),
            cfs,
        )
    });
    (own, with_overhead)
}

/// The groups a pod's processes get besides their own, in upstream's order: fsGroup first.
fn supplemental_groups(pod: &Pod) -> Vec<i64> {
    let sc = spec(pod).security_context.as_ref();
    sc.and_then(|s| s.fs_group)
        .into_iter()
        .chain(
            sc.and_then(|s| s.supplemental_groups.clone())
                .unwrap_or_default(),
        )
        .collect()
}

/// What the container's cgroup limits come from, as a digest recorded on the container: its cpu
/// part, then its memory part. Equal digests mean equal limits, however the quantities were
/// written (`1` and `1000m`); the node's quota settings play no part. A limit the container
/// takes from its pod's own resources counts as its own.
pub fn resources_digest(pod: &Pod, c: &Container) -> ResourcesDigest {
    let r = linux_resources(pod, c, 0.0, Cfs::default());
    ResourcesDigest {
        cpu: format!("{}/{}", r.cpu_shares, r.cpu_quota),
        memory: r.memory_limit_in_bytes.to_string(),
    }
}

/// See [`resources_digest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourcesDigest {
    pub cpu: String,
    pub memory: String,
}

impl ResourcesDigest {
    /// The annotation's form.
    pub fn encode(&self) -> String {
        format!("cpu={};memory={}", self.cpu, self.memory)
    }

    /// From the annotation's form; `None` for anything else.
    pub fn decode(text: &str) -> Option<ResourcesDigest> {
        let (cpu, memory) = text.split_once(';')?;
        Some(ResourcesDigest {
            cpu: cpu.strip_prefix("cpu=")?.to_string(),
            memory: memory.strip_prefix("memory=")?.to_string(),
        })
    }
}

fn linux_config(pod: &Pod, c: &Container, input: &ContainerInput) -> cri::LinuxContainerConfig {
    let resources = linux_resources(pod, c, input.node.memory, input.cfs);
    let pod_sc = spec(pod).security_context.as_ref();
    let sc = c.security_context.as_ref();
    let run_as_user = sc
        .and_then(|s| s.run_as_user)
        .or(pod_sc.and_then(|s| s.run_as_user));
    let run_as_group = sc
        .and_then(|s| s.run_as_group)
        .or(pod_sc.and_then(|s| s.run_as_group));
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    cri::LinuxContainerConfig {
        resources: Some(resources),
        security_context: Some(cri::LinuxContainerSecurityContext {
            capabilities: caps.map(|c| cri::Capability {
                add_capabilities: c.add.clone().unwrap_or_default(),
                drop_capabilities: c.drop.clone().unwrap_or_default(),
                ..Default::default()
            }),
            privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
            namespace_options: Some(match input.pid_target {
                Some(target) => cri::NamespaceOption {
                    pid: cri::NamespaceMode::Target as i32,
                    target_id: target.to_string(),
                    ..namespace_options(pod, input.userns)
                },
                None => namespace_options(pod, input.userns),
            }),
            run_as_user: run_as_user.map(|value| cri::Int64Value { value }),
            run_as_group: run_as_group.map(|value| cri::Int64Value { value }),
            readonly_rootfs: sc
                .and_then(|s| s.read_only_root_filesystem)
                .unwrap_or(false),
            supplemental_groups: supplemental_groups(pod),
            seccomp: Some(seccomp(
                sc.and_then(|s| s.seccomp_profile.as_ref())
                    .or(pod_sc.and_then(|s| s.seccomp_profile.as_ref())),
            )),
            apparmor: apparmor(pod, c),
            // Its older form: runtimes from before the field (containerd 1.6) read only this.
            #[allow(deprecated)]
            apparmor_profile: apparmor(pod, c).map_or_else(String::new, |p| {
                use cri::security_profile::ProfileType;
                match ProfileType::try_from(p.profile_type) {
                    Ok(ProfileType::RuntimeDefault) => "runtime/default".into(),
                    Ok(ProfileType::Localhost) => format!("localhost/{}", p.localhost_ref),
                    _ => "unconfined".into(),
                }
            }),
            no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
            masked_paths: masked_paths(sc),
            readonly_paths: readonly_paths(sc),
            ..Default::default()
        }),
    }
}

/// procMount Default masks and write-protects these /proc paths, as upstream; Unmasked none.
pub const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
pub const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

fn unmasked(sc: Option<&k8s_openapi::api::core::v1::SecurityContext>) -> bool {
    sc.and_then(|s| s.proc_mount.as_deref()) == Some("Unmasked")
        || sc.and_then(|s| s.privileged) == Some(true)
}

fn masked_paths(sc: Option<&k8s_openapi::api::core::v1::SecurityContext>) -> Vec<String> {
    if unmasked(sc) {
        Vec::new()
    } else {
        MASKED_PATHS.iter().map(|p| p.to_string()).collect()
    }
}

fn readonly_paths(sc: Option<&k8s_openapi::api::core::v1::SecurityContext>) -> Vec<String> {
    if unmasked(sc) {
        Vec::new()
    } else {
        READONLY_PATHS.iter().map(|p| p.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{StaticOrigin, apply_defaults, decode_manifest, make_static};

    #[test]
    fn a_container_without_limits_takes_its_pods_own() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {
                "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}},
                "containers": [
                    {"name": "free"},
                    {"name": "own", "resources": {"limits": {"memory": "16Mi"}}}
                ]
            }
        }))
        .unwrap();
        let [free, own] = &spec(&pod).containers[..] else {
            panic!("two containers");
        };
        let r = linux_resources(&pod, free, 0.0, Cfs::default());
        assert_eq!((r.cpu_quota, r.memory_limit_in_bytes), (50_000, 64 << 20));
        let r = linux_resources(&pod, own, 0.0, Cfs::default());
        assert_eq!((r.cpu_quota, r.memory_limit_in_bytes), (50_000, 16 << 20));
        // The digest follows the pod's limits, so that a pod-level resize resizes the container.
        let mut bigger = pod.clone();
        bigger.spec.as_mut().unwrap().resources = serde_json::from_value(
            serde_json::json!({"limits": {"cpu": "500m", "memory": "96Mi"}}),
        )
        .unwrap();
        assert_ne!(
            resources_digest(&pod, free),
            resources_digest(&bigger, free)
        );
        assert_eq!(resources_digest(&pod, own), resources_digest(&bigger, own));
    }

    #[test]
    fn recursive_read_only_follows_upstream_rules() {
        let mount = |mode: &str| -> k8s_openapi::api::core::v1::VolumeMount {
            serde_json::from_value(serde_json::json!({
                "name": "v", "mountPath": "/m", "recursiveReadOnly": mode
            }))
            .unwrap()
        };
        assert_eq!(
            recursive_read_only(&mount("Disabled"), true, true),
            Ok(false)
        );
        assert_eq!(
            recursive_read_only(&mount("IfPossible"), true, false),
            Ok(false)
        );
        assert_eq!(
            recursive_read_only(&mount("IfPossible"), true, true),
            Ok(true)
        );
        assert_eq!(recursive_read_only(&mount("Enabled"), true, true), Ok(true));
        assert!(
            recursive_read_only(&mount("Enabled"), true, false)
                .is_err_and(|e| e.ends_with("it is not supported by the runtime"))
        );
        assert!(
            recursive_read_only(&mount("Enabled"), false, true)
                .is_err_and(|e| e.ends_with("it is not read-only"))
        );
    }

    fn ctx() -> Context {
        Context {
            rro_handlers: Vec::new(),
            userns_handlers: Vec::new(),
            node_name: "n1".into(),
            root_dir: "/r".into(),
            pod_logs_dir: "/logs".into(),
            container_logs_dir: "/clogs".into(),
            resolv_conf: None,
            host_ip: String::new(),
            runtime_name: "containerd".into(),
            cfs: Cfs::default(),
            node: crate::host::NodeResources {
                cpu: 2.0,
                memory: 8e9,
                ephemeral_storage: 1e11,
            },
            restart_backoff_initial: std::time::Duration::from_secs(10),
            cluster_dns: Default::default(),
        }
    }

    fn pod(yaml: &str) -> Pod {
        let mut p = decode_manifest(yaml).unwrap().pods.remove(0);
        apply_defaults(&mut p);
        make_static(&mut p, "n1", StaticOrigin::File("/m/p.yaml"), "t");
        p
    }

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, labels: {app: web}}\nspec:\n  hostPID: true\n  containers:\n  - name: c\n    image: busybox:1\n    command: [sh, -c, 'echo $(GREETING) $$HOME']\n    env: [{name: WHO, value: world}, {name: GREETING, value: hello-$(WHO)}, {name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]\n    ports: [{containerPort: 80, hostPort: 8080}]\n";

    #[test]
    fn sandbox_config_carries_the_kubelet_conventions() {
        let p = pod(POD);
        let uid = p.metadata.uid.clone().unwrap();
        let cfg = sandbox_config(
            &p,
            2,
            &ctx(),
            cri::DnsConfig::default(),
            "/kubepods/podx".into(),
            None,
        );
        let m = cfg.metadata.unwrap();
        assert_eq!(
            (
                m.name.as_str(),
                m.namespace.as_str(),
                m.uid.as_str(),
                m.attempt
            ),
            ("web-n1", "default", uid.as_str(), 2)
        );
        assert_eq!(cfg.labels[LABEL_POD_NAME], "web-n1");
        assert_eq!(cfg.labels[LABEL_POD_UID], uid);
        assert_eq!(cfg.labels["app"], "web");
        assert_eq!(cfg.annotations["kubernetes.io/config.source"], "file");
        assert_eq!(cfg.log_directory, format!("/logs/default_web-n1_{uid}"));
        assert_eq!(cfg.hostname, "web-n1");
        assert_eq!(cfg.port_mappings[0].host_port, 8080);
        let ns = cfg
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap();
        assert_eq!(ns.pid, cri::NamespaceMode::Node as i32);
        assert_eq!(ns.network, cri::NamespaceMode::Pod as i32);
    }

    #[test]
    fn container_config_expands_env_and_labels_everything() {
        let p = pod(POD);
        let c = &p.spec.as_ref().unwrap().containers[0];
        let (ctx, objects) = (ctx(), crate::objects::View::empty("default"));
        let cfg = container_config(&ContainerInput {
            restart_count: 3,
            image_ref: "sha256:abc",
            pod_ip: "10.0.0.2",
            host_ip: "192.0.2.1",
            termination_log: Some(std::path::Path::new("/r/pods/u/containers/c/abc")),
            ..bare(&p, &objects, &ctx)
        })
        .unwrap();
        assert_eq!(cfg.command[2], "echo hello-world $HOME");
        let env: HashMap<_, _> = cfg
            .envs
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect();
        assert_eq!(env["POD"], "web-n1");
        assert_eq!(cfg.log_path, "c/3.log");
        assert_eq!(cfg.mounts[0].container_path, "/dev/termination-log");
        assert_eq!(cfg.mounts[0].host_path, "/r/pods/u/containers/c/abc");
        assert_eq!(cfg.metadata.unwrap().attempt, 3);
        assert_eq!(cfg.labels[LABEL_CONTAINER_NAME], "c");
        assert_eq!(cfg.annotations[ANNOTATION_RESTART_COUNT], "3");
        assert_eq!(
            cfg.annotations[ANNOTATION_CONTAINER_HASH],
            container_hash(c)
        );
        assert_eq!(cfg.annotations[ANNOTATION_TERMINATION_GRACE], "30");
    }

    #[test]
    fn variable_expansion_follows_kubernetes_rules() {
        let vars: HashMap<String, String> = [("A".to_string(), "x".to_string())].into();
        assert_eq!(expand("$(A)-$(B)-$$(A)-$", &vars), "x-$(B)-$(A)-$");
    }

    /// The input for the pod's first container, with nothing mounted and no addresses.
    fn bare<'a>(
        p: &'a Pod,
        objects: &'a crate::objects::View,
        ctx: &'a Context,
    ) -> ContainerInput<'a> {
        static NO_VOLUMES: std::sync::LazyLock<HashMap<String, crate::volumes::Mounted>> =
            std::sync::LazyLock::new(HashMap::new);
        static NO_SUB_PATHS: std::sync::LazyLock<HashMap<usize, PathBuf>> =
            std::sync::LazyLock::new(HashMap::new);
        static NO_IMAGES: std::sync::LazyLock<HashMap<String, String>> =
            std::sync::LazyLock::new(HashMap::new);
        ContainerInput {
            pod: p,
            container: &p.spec.as_ref().unwrap().containers[0],
            init: false,
            restart_count: 0,
            image_ref: "i",
            volumes: &NO_VOLUMES,
            objects,
            pod_ip: "",
            host_ip: "",
            node: &ctx.node,
            cfs: ctx.cfs,
            termination_log: None,
            etc_hosts: None,
            sub_paths: &NO_SUB_PATHS,
            pid_target: None,
            rro_supported: false,
            userns: None,
            image_volumes: &NO_IMAGES,
        }
    }

    #[test]
    fn a_host_network_pod_sees_the_host_address_as_its_own() {
        let p = pod(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  hostNetwork: true\n  containers:\n  - name: c\n    image: i\n    env:\n    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}\n    - {name: HOST_IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}\n",
        );
        let (ctx, objects) = (ctx(), crate::objects::View::empty("default"));
        let env = environment(&ContainerInput {
            host_ip: "192.0.2.1",
            ..bare(&p, &objects, &ctx)
        })
        .unwrap();
        assert_eq!(
            env,
            [
                ("POD_IP".to_string(), "192.0.2.1".to_string()),
                ("HOST_IP".to_string(), "192.0.2.1".to_string())
            ]
        );
    }

    #[test]
    fn sub_path_exprs_expand_the_environment_and_refuse_what_upstream_refuses() {
        let sub_paths_of = |annotations: &str, expr: &str| {
            let p = pod(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, annotations: {{{annotations}}}}}\nspec:\n  containers:\n  - name: c\n    image: i\n    env:\n    - {{name: POD_NAME, value: foo}}\n    - {{name: A, valueFrom: {{fieldRef: {{fieldPath: \"metadata.annotations['sub']\"}}}}}}\n    volumeMounts:\n    - {{name: v, mountPath: /all}}\n    - {{name: v, mountPath: /plain, subPath: x/y}}\n    - {{name: v, mountPath: /expr, subPathExpr: '{expr}'}}\n"
            ));
            let (ctx, objects) = (ctx(), crate::objects::View::empty("default"));
            sub_paths(&bare(&p, &objects, &ctx))
        };
        assert_eq!(
            sub_paths_of("sub: mypath", "$(A)/$(POD_NAME)").unwrap(),
            [(1, "x/y".to_string()), (2, "mypath/foo".to_string())]
        );
        let unset = sub_paths_of("other: x", "$(A)/$(POD_NAME)").unwrap_err();
        assert!(unset.contains("no value for A"), "{unset}");
        let absolute = sub_paths_of("sub: /etc", "$(A)").unwrap_err();
        assert!(absolute.contains("absolute path"), "{absolute}");
        let climbing = sub_paths_of("sub: '..'", "x/$(A)").unwrap_err();
        assert!(climbing.contains("'..'"), "{climbing}");
    }

    #[test]
    fn env_from_objects_follows_upstream_order_and_errors() {
        let (writer, reader) =
            crate::objects::store(false, crate::service_links::Store::standalone());
        let cm = crate::objects::config_map(
            serde_yaml_ng::from_str("metadata: {name: cfg}\ndata: {MODE: fast, A: from-cm}\n")
                .unwrap(),
        )
        .unwrap();
        let secret = crate::objects::secret(
            serde_yaml_ng::from_str("metadata: {name: creds}\nstringData: {password: hunter2}\n")
                .unwrap(),
        )
        .unwrap();
        writer.replace(crate::types::Source::File, vec![cm, secret]);
        let p = pod(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n  - name: c\n    image: i\n    envFrom: [{configMapRef: {name: cfg}, prefix: CFG_}, {configMapRef: {name: cfg}}]\n    env:\n    - {name: A, value: 'own-$(CFG_MODE)'}\n    - {name: PW, valueFrom: {secretKeyRef: {name: creds, key: password}}}\n    - {name: OPT, valueFrom: {configMapKeyRef: {name: missing, key: k, optional: true}}}\n",
        );
        let view = reader.view(&p);
        let ctx = ctx();
        let input = bare(&p, &view, &ctx);
        let env = environment(&input).unwrap();
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["CFG_A", "CFG_MODE", "A", "MODE", "PW"]);
        let map: HashMap<_, _> = env.into_iter().collect();
        assert_eq!(map["A"], "own-fast", "env replaces envFrom and expands");
        assert_eq!(map["PW"], "hunter2");
        let missing = pod(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n  - name: c\n    image: i\n    env: [{name: X, valueFrom: {configMapKeyRef: {name: cfg, key: nope}}}]\n",
        );
        let input = ContainerInput {
            pod: &missing,
            container: &missing.spec.as_ref().unwrap().containers[0],
            ..input
        };
        assert_eq!(
            environment(&input).unwrap_err(),
            "couldn't find key nope in ConfigMap default/cfg"
        );
    }
}

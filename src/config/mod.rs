//! Agent settings: upstream kubelet flags and a KubeletConfiguration file, merged as
//! defaults < file < flags, then validated into a [`Config`] that reports every problem at once.

mod duration;
mod fields;
mod file;
mod flags;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::pod::is_dns1123_subdomain;
pub use duration::{format as format_duration, parse as parse_duration};
pub use fields::FIELDS;
use fields::{Raw, RawValue, by_name};

/// The longest period or timeout accepted: longer ones overflow timers.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

pub use crate::types::CgroupDriver;

/// Periods the test suite shortens with hidden `--testing-*` flags (none for a real node).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Testing {
    pub backoff: Option<Duration>,
    pub eviction_period: Option<Duration>,
    pub image_gc_period: Option<Duration>,
    pub log_rotation_period: Option<Duration>,
}

/// A stage of graceful node shutdown: the pods from this priority up to the next stage's get
/// `seconds` to stop (upstream's ShutdownGracePeriodByPodPriority).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShutdownStage {
    pub priority: i32,
    pub seconds: i64,
}

/// Parses a `shutdownGracePeriodByPodPriority` item as the file reader renders it:
/// `priority=seconds`.
fn shutdown_stage(s: &str) -> Result<ShutdownStage, String> {
    let (priority, seconds) = s.split_once('=').unwrap_or((s, ""));
    match (priority.parse::<i32>(), seconds.parse::<i64>()) {
        (Ok(priority), Ok(seconds)) if seconds >= 0 => Ok(ShutdownStage { priority, seconds }),
        _ => Err(format!(
            "{s:?}: expected a priority (a 32-bit integer) and shutdownGracePeriodSeconds of 0 or more"
        )),
    }
}

/// A taint of `--register-with-taints`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: Option<String>,
    /// NoSchedule, PreferNoSchedule or NoExecute.
    pub effect: String,
}

/// Parses `key=value:Effect` or `key:Effect`, as the kubelet's flag does.
fn taint(s: &str) -> Result<Taint, String> {
    let (kv, effect) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not key=value:Effect"))?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(format!(
            "{s:?}: effect {effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"
        ));
    }
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (kv, None),
    };
    if !crate::pod::is_qualified_name(key) {
        return Err(format!("{s:?}: key {key:?} is not a qualified name"));
    }
    Ok(Taint {
        key: key.to_string(),
        value,
        effect: effect.to_string(),
    })
}

/// Who decides what an authenticated request to `port` may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthorizationMode {
    AlwaysAllow,
    /// A SubjectAccessReview on the API server for each request (cached).
    Webhook,
}

/// The report format of run-once mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunOnceOutput {
    Text,
    Json,
}

/// The validated settings of the agent.
#[derive(Clone, Debug)]
pub struct Config {
    pub static_pod_path: Option<PathBuf>,
    pub static_pod_url: Option<String>,
    pub static_pod_url_header: BTreeMap<String, Vec<String>>,
    /// Whether pods from the manifest URL may use the manifest directory's Secrets.
    pub static_pod_url_local_secrets: bool,
    pub file_check_frequency: Duration,
    pub http_check_frequency: Duration,
    pub sync_frequency: Duration,
    /// Path of the runtime's unix socket.
    pub container_runtime_endpoint: PathBuf,
    /// Path of the image service's unix socket.
    pub image_service_endpoint: PathBuf,
    pub runtime_request_timeout: Duration,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub container_logs_dir: PathBuf,
    /// Host resolver file for dnsPolicy Default; `None` when disabled with an empty value.
    pub resolv_conf: Option<PathBuf>,
    /// The node's name: --hostname-override or the lower-cased hostname.
    pub node_name: String,
    pub node_ip: Option<IpAddr>,
    pub healthz_port: u16,
    pub healthz_bind_address: IpAddr,
    pub port: u16,
    /// Whether the authenticated API is served on `port` (enableServer).
    pub enable_server: bool,
    /// The serving certificate and key; `None`: a self-signed pair in `<root-dir>/pki`.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    /// The CA whose client certificates the authenticated API accepts.
    pub client_ca_file: Option<PathBuf>,
    pub anonymous_auth: bool,
    /// Bearer tokens on `port` are checked with TokenReview, the answers kept this long.
    pub authentication_token_webhook: bool,
    pub authentication_token_webhook_cache_ttl: Duration,
    pub authorization_mode: AuthorizationMode,
    /// How long SubjectAccessReview answers are kept: allowing, denying.
    pub authorization_webhook_cache_authorized_ttl: Duration,
    pub authorization_webhook_cache_unauthorized_ttl: Duration,
    pub read_only_port: u16,
    pub address: IpAddr,
    pub kubeconfig: Option<PathBuf>,
    /// Requests per second to the API server, and the burst above it.
    pub kube_api_qps: f64,
    pub kube_api_burst: u32,
    /// Events per second to the API server, and the burst above it.
    pub event_record_qps: f64,
    pub event_burst: u32,
    pub register_node: bool,
    /// `key=value:Effect` taints the node registers with, checked.
    pub register_with_taints: Vec<Taint>,
    pub node_status_update_frequency: Duration,
    pub node_status_report_frequency: Duration,
    pub node_lease_duration_seconds: u32,
    pub run_once: bool,
    pub run_once_timeout: Duration,
    pub run_once_output: RunOnceOutput,
    pub run_once_cleanup: bool,
    pub lock_file: Option<PathBuf>,
    pub exit_on_lock_contention: bool,
    pub cgroup_root: String,
    /// Whether cpu limits are enforced by CFS quotas (cpuCFSQuota), and in which period.
    pub cpu_cfs_quota: bool,
    pub cpu_cfs_quota_period: Duration,
    /// qosReserved's memory percentage, when the QOSReserved gate is on.
    pub qos_reserved_memory: Option<i64>,
    /// The CPU manager: the static policy (cpuManagerPolicy), its full-pcpus-only option,
    /// reservedSystemCPUs and the reconcile period.
    pub cpu_manager_static: bool,
    pub cpu_manager_full_pcpus_only: bool,
    pub reserved_cpus: Option<crate::cm::cpuset::CpuSet>,
    pub cpu_manager_reconcile_period: Duration,
    /// The memory manager: the Static policy (memoryManagerPolicy), and reservedMemory as NUMA
    /// node -> memory type -> bytes.
    pub memory_manager_static: bool,
    pub reserved_memory: BTreeMap<u32, BTreeMap<String, u64>>,
    /// The topology manager's policy and scope.
    pub topology_manager_policy: crate::cm::topology::Policy,
    pub topology_manager_scope: crate::cm::topology::Scope,
    /// The cgroup the agent moves itself into (kubeletCgroups); `None`: where it was started.
    pub kubelet_cgroups: Option<String>,
    /// The runtime's and the host's other processes' cgroups, for the summary's system
    /// containers (--runtime-cgroups, systemCgroups).
    pub runtime_cgroups: Option<String>,
    pub system_cgroups: Option<String>,
    pub cgroups_per_qos: bool,
    /// Whether the kubepods cgroup is limited to allocatable (enforceNodeAllocatable: pods).
    pub enforce_pods_allocatable: bool,
    /// How the kube and system reserves are enforced on their cgroups.
    pub enforce_kube_reserved: ReserveEnforcement,
    pub enforce_system_reserved: ReserveEnforcement,
    /// The cgroups of the node's daemons and of the host's (kubeReservedCgroup,
    /// systemReservedCgroup).
    pub kube_reserved_cgroup: Option<String>,
    pub system_reserved_cgroup: Option<String>,
    pub fail_swap_on: bool,
    /// Refuse a host without the unified cgroup hierarchy (upstream's default from 1.35 is true;
    /// nodelet speaks 1.34, whose default is false).
    pub fail_cgroup_v1: bool,
    /// Refuse to start when the kernel's settings differ from the kubelet's expectations.
    pub protect_kernel_defaults: bool,
    /// The agent's own oom_score_adj: the kernel's OOM killer takes it last (upstream's -999).
    pub oom_score_adj: i32,
    pub cgroup_driver: CgroupDriver,
    /// Graceful node shutdown's total time, and the part of it kept for critical pods.
    pub shutdown_grace_period: Duration,
    pub shutdown_grace_period_critical_pods: Duration,
    /// Graceful node shutdown's stages as given by priority (instead of the two above).
    pub shutdown_grace_period_by_pod_priority: Vec<ShutdownStage>,
    /// The hidden test-only periods.
    pub testing: Testing,
    pub max_pods: u32,
    /// `userNamespaces.idsPerPod`: host IDs each `hostUsers: false` pod gets.
    pub user_namespace_ids_per_pod: u32,
    /// `None`: no limit on a pod's processes.
    pub pod_pids_limit: Option<i64>,
    pub image_gc_high_threshold_percent: u8,
    pub image_gc_low_threshold_percent: u8,
    pub image_minimum_gc_age: Duration,
    pub serialize_image_pulls: bool,
    /// `None`: the puller's default bound on parallel pulls.
    pub max_parallel_image_pulls: Option<u32>,
    pub registry_pull_qps: f64,
    pub registry_burst: u32,
    /// Credential provider plugins: their config and the directory of their executables.
    pub image_credential_provider_config: Option<PathBuf>,
    pub image_credential_provider_bin_dir: Option<PathBuf>,
    /// How long a pull's downloads may stand still before it is cancelled; `None`: forever.
    pub image_pull_progress_deadline: Option<Duration>,
    pub kube_reserved: BTreeMap<String, String>,
    pub system_reserved: BTreeMap<String, String>,
    pub eviction_hard: BTreeMap<String, String>,
    /// How long a pressure condition outlives its last breach.
    pub eviction_pressure_transition_period: Duration,
    /// Whether the kernel's notifications wake the eviction manager between its polls.
    pub kernel_memcg_notification: bool,
    /// Bytes at which a container log is rotated; `None`: rotation is off (a negative size).
    pub container_log_max_size: Option<u64>,
    /// Most files per container log, the current one included (at least 2).
    pub container_log_max_files: u32,
    pub container_log_monitor_interval: Duration,
    pub node_labels: BTreeMap<String, String>,
    /// `featureGates` as given (the ones nodelet knows are in [`FEATURE_GATES`]).
    pub feature_gates: BTreeMap<String, bool>,
    pub verbosity: u8,
    /// --cluster-dns servers (IP addresses).
    pub cluster_dns: Vec<IpAddr>,
    pub cluster_domain: String,
    pub allowed_unsafe_sysctls: Vec<String>,
}

impl Config {
    /// Graceful node shutdown's stages, lowest priority first; empty when it is off. The two
    /// durations make two stages as upstream migrates them: every pod below critical gets the
    /// total less the critical part, then critical pods get that part.
    pub fn shutdown_stages(&self) -> Vec<ShutdownStage> {
        let mut stages = if self.shutdown_grace_period_by_pod_priority.is_empty() {
            let total = self.shutdown_grace_period.as_secs() as i64;
            let critical = self.shutdown_grace_period_critical_pods.as_secs() as i64;
            if total == 0 || critical > total {
                return Vec::new();
            }
            vec![
                ShutdownStage {
                    priority: 0,
                    seconds: total - critical,
                },
                ShutdownStage {
                    priority: crate::pod::SYSTEM_CRITICAL_PRIORITY,
                    seconds: critical,
                },
            ]
        } else {
            self.shutdown_grace_period_by_pod_priority.clone()
        };
        stages.sort_by_key(|s| s.priority);
        stages
    }

    /// The configuration in force as a KubeletConfiguration (what /configz shows), with
    /// upstream's field names and Go durations.
    pub fn kubelet_configuration(&self) -> serde_json::Value {
        let d = |d: Duration| format_duration(d);
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let mut config = serde_json::json!({
            "kind": "KubeletConfiguration",
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "staticPodPath": path(&self.static_pod_path),
            "staticPodURL": self.static_pod_url.as_deref().map(crate::types::redacted_url),
            // Header values are often credentials: only their names are shown.
            "staticPodURLHeader": self.static_pod_url_header.iter().map(|(k, v)| (k.clone(), vec!["xxxxx"; v.len()])).collect::<BTreeMap<_, _>>(),
            "staticPodURLLocalSecrets": self.static_pod_url_local_secrets,
            "fileCheckFrequency": d(self.file_check_frequency),
            "httpCheckFrequency": d(self.http_check_frequency),
            "syncFrequency": d(self.sync_frequency),
            "containerRuntimeEndpoint": format!("unix://{}", self.container_runtime_endpoint.display()),
            "imageServiceEndpoint": format!("unix://{}", self.image_service_endpoint.display()),
            "runtimeRequestTimeout": d(self.runtime_request_timeout),
            "podLogsDir": self.pod_logs_dir.display().to_string(),
            "resolvConf": path(&self.resolv_conf).unwrap_or_default(),
            "healthzPort": self.healthz_port,
            "healthzBindAddress": self.healthz_bind_address.to_string(),
            "port": self.port,
            "readOnlyPort": self.read_only_port,
            "address": self.address.to_string(),
            "enableServer": self.enable_server,
            "tlsCertFile": path(&self.tls_cert_file),
            "tlsPrivateKeyFile": path(&self.tls_private_key_file),
            "authentication": {
                "x509": {"clientCAFile": path(&self.client_ca_file)},
                "anonymous": {"enabled": self.anonymous_auth},
                "webhook": {
                    "enabled": self.authentication_token_webhook,
                    "cacheTTL": d(self.authentication_token_webhook_cache_ttl),
                },
            },
            "authorization": {
                "mode": match self.authorization_mode {
                    AuthorizationMode::AlwaysAllow => "AlwaysAllow",
                    AuthorizationMode::Webhook => "Webhook",
                },
                "webhook": {
                    "cacheAuthorizedTTL": d(self.authorization_webhook_cache_authorized_ttl),
                    "cacheUnauthorizedTTL": d(self.authorization_webhook_cache_unauthorized_ttl),
                },
            },
            // What the API client speaks, whichever was asked for (both are accepted).
            "contentType": "application/json",
            "kubeAPIQPS": int32(self.kube_api_qps),
            "kubeAPIBurst": self.kube_api_burst,
            "eventRecordQPS": int32(self.event_record_qps),
            "eventBurst": self.event_burst,
            "registerNode": self.register_node,
            "registerWithTaints": self.register_with_taints.iter().map(|t| serde_json::json!({
                "key": t.key, "value": t.value, "effect": t.effect,
            })).collect::<Vec<_>>(),
            "nodeStatusUpdateFrequency": d(self.node_status_update_frequency),
            "nodeStatusReportFrequency": d(self.node_status_report_frequency),
            "nodeLeaseDurationSeconds": self.node_lease_duration_seconds,
        });
        // In parts: one object of every field is past the json! macro's recursion limit.
        let cgroups = serde_json::json!({
            "kubeletCgroups": self.kubelet_cgroups.clone().unwrap_or_default(),
            "systemCgroups": self.system_cgroups.clone().unwrap_or_default(),
            "kubeReservedCgroup": self.kube_reserved_cgroup.clone().unwrap_or_default(),
            "systemReservedCgroup": self.system_reserved_cgroup.clone().unwrap_or_default(),
            "cpuCFSQuota": self.cpu_cfs_quota,
            "qosReserved": self.qos_reserved_memory.map(|p| serde_json::json!({"memory": format!("{p}%")})).unwrap_or_default(),
            "cpuCFSQuotaPeriod": d(self.cpu_cfs_quota_period),
            "cpuManagerPolicy": if self.cpu_manager_static { "static" } else { "none" },
            "cpuManagerPolicyOptions": if self.cpu_manager_full_pcpus_only { serde_json::json!({"full-pcpus-only": "true"}) } else { serde_json::json!({}) },
            "cpuManagerReconcilePeriod": d(self.cpu_manager_reconcile_period),
            "reservedSystemCPUs": self.reserved_cpus.as_ref().map(ToString::to_string).unwrap_or_default(),
            "memoryManagerPolicy": if self.memory_manager_static { "Static" } else { "None" },
            "reservedMemory": self.reserved_memory.iter().map(|(node, limits)| serde_json::json!({
                "numaNode": node,
                "limits": limits.iter().map(|(k, v)| (k.clone(), crate::pod::format_quantity(*v, true))).collect::<BTreeMap<_, _>>(),
            })).collect::<Vec<_>>(),
            "topologyManagerPolicy": self.topology_manager_policy.name(),
            "topologyManagerScope": self.topology_manager_scope.name(),
        });
        let more = serde_json::json!({
            "cgroupRoot": self.cgroup_root,
            "cgroupsPerQOS": self.cgroups_per_qos,
            "enforceNodeAllocatable": self.enforced(),
            "cgroupDriver": self.cgroup_driver.as_str(),
            "failSwapOn": self.fail_swap_on,
            "failCgroupV1": self.fail_cgroup_v1,
            "protectKernelDefaults": self.protect_kernel_defaults,
            "oomScoreAdj": self.oom_score_adj,
            "maxPods": self.max_pods,
            "userNamespaces": {"idsPerPod": self.user_namespace_ids_per_pod},
            "featureGates": self.feature_gates,
            "podPidsLimit": self.pod_pids_limit.unwrap_or(-1),
            "imageGCHighThresholdPercent": self.image_gc_high_threshold_percent,
            "imageGCLowThresholdPercent": self.image_gc_low_threshold_percent,
            "imageMinimumGCAge": d(self.image_minimum_gc_age),
            "serializeImagePulls": self.serialize_image_pulls,
            "maxParallelImagePulls": self.max_parallel_image_pulls,
            "registryPullQPS": int32(self.registry_pull_qps),
            "registryBurst": self.registry_burst,
            "kubeReserved": self.kube_reserved,
            "systemReserved": self.system_reserved,
            "evictionHard": self.eviction_hard,
            "evictionPressureTransitionPeriod": d(self.eviction_pressure_transition_period),
            "kernelMemcgNotification": self.kernel_memcg_notification,
            "clusterDNS": self.cluster_dns.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
            "clusterDomain": self.cluster_domain,
            "allowedUnsafeSysctls": self.allowed_unsafe_sysctls,
            "containerLogsDir": self.container_logs_dir.display().to_string(),
            "containerLogMaxSize": crate::pod::format_quantity(self.container_log_max_size.unwrap_or(0), true),
            "containerLogMaxFiles": self.container_log_max_files,
            "containerLogMonitorInterval": d(self.container_log_monitor_interval),
            "shutdownGracePeriod": d(self.shutdown_grace_period),
            "shutdownGracePeriodCriticalPods": d(self.shutdown_grace_period_critical_pods),
            "shutdownGracePeriodByPodPriority": self.shutdown_grace_period_by_pod_priority.iter().map(|s| serde_json::json!({
                "priority": s.priority, "shutdownGracePeriodSeconds": s.seconds,
            })).collect::<Vec<_>>(),
        });
        for part in [more, cgroups] {
            if let (Some(all), serde_json::Value::Object(part)) = (config.as_object_mut(), part) {
                all.extend(part);
            }
        }
        config
    }
}

/// A rate as upstream's KubeletConfiguration types it (int32): its clients read /configz.
fn int32(rate: f64) -> i32 {
    rate.round().clamp(f64::from(i32::MIN), f64::from(i32::MAX)) as i32
}

/// cpuManagerPolicyOptions: full-pcpus-only, the one option nodelet has (upstream's others
/// are refused by name).
fn cpu_manager_options(r: &mut Reader<'_>) -> bool {
    let mut full = false;
    for (option, value) in r.map("cpuManagerPolicyOptions") {
        let label = Reader::label("cpuManagerPolicyOptions");
        match (option.as_str(), value.trim()) {
            ("full-pcpus-only", "true" | "True") => full = true,
            ("full-pcpus-only", "false" | "False") => full = false,
            ("full-pcpus-only", other) => r.problems.push(format!(
                "{label}: full-pcpus-only: {other:?} is not true or false"
            )),
            (other, _) => r
                .problems
                .push(format!("{label}: unsupported cpumanager option: {other:?}")),
        }
    }
    full
}

/// reservedMemory (--reserved-memory): `<NUMA node>:<type>=<quantity>,...` entries.
fn reserved_memory(r: &mut Reader<'_>) -> BTreeMap<u32, BTreeMap<String, u64>> {
    let entries = r.list("reservedMemory");
    crate::cm::memory::parse_reserved(&entries).unwrap_or_else(|e| {
        let label = Reader::label("reservedMemory");
        r.problems.push(format!("{label}: {e}"));
        BTreeMap::new()
    })
}

/// qosReserved: only memory, as a percentage (upstream's ParseQOSReserved).
fn qos_reserved(r: &mut Reader<'_>) -> Option<i64> {
    let mut memory = None;
    for (resource, value) in r.map("qosReserved") {
        let label = Reader::label("qosReserved");
        if resource != "memory" {
            r.problems
                .push(format!("{label}: cannot reserve {resource:?} resource"));
            continue;
        }
        match value.strip_suffix('%').map(str::parse::<i64>) {
            Some(Ok(p)) if (0..=100).contains(&p) => memory = Some(p),
            Some(Ok(_)) => r
                .problems
                .push(format!("{label}: percentage must be between 0 and 100")),
            _ => r.problems.push(format!(
                "{label}: failed to parse percentage {value:?} for \"memory\" resource"
            )),
        }
    }
    memory
}

/// A field naming a cgroup (kubeletCgroups, systemCgroups, --runtime-cgroups): an absolute
/// name that stays inside each hierarchy.
fn cgroup_name(r: &mut Reader<'_>, field: &str) -> Option<String> {
    let name = r.text(field).filter(|n| !n.is_empty())?;
    if !name.starts_with('/') || name.split('/').any(|p| p == "..") {
        r.problems.push(format!(
            "{}: {name:?} is not an absolute cgroup name",
            Reader::label(field)
        ));
        return None;
    }
    Some(name)
}

/// How a reserve is enforced on its cgroup (enforceNodeAllocatable's `kube-reserved` and
/// `system-reserved`, or their `-compressible` forms: cpu only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReserveEnforcement {
    Off,
    All,
    Compressible,
}

/// enforceNodeAllocatable: `pods` (the default) limits kubepods; `kube-reserved` and
/// `system-reserved` (or their `-compressible` forms) limit the cgroups kubeReservedCgroup and
/// systemReservedCgroup name to the reserves; `none` or nothing limits nothing. Returns whether
/// pods are limited, and how the kube and the system reserves are.
fn enforce_node_allocatable(r: &mut Reader<'_>) -> (bool, ReserveEnforcement, ReserveEnforcement) {
    use ReserveEnforcement::{All, Compressible, Off};
    let given = r.raw.contains_key("enforceNodeAllocatable");
    let values = r.list("enforceNodeAllocatable");
    if !given {
        return (true, Off, Off);
    }
    let label = Reader::label("enforceNodeAllocatable");
    let (mut pods, mut kube, mut system) = (false, Off, Off);
    for v in values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()) {
        let (reserve, how) = match v {
            "pods" => {
                pods = true;
                continue;
            }
            "none" => continue,
            "kube-reserved" => (&mut kube, All),
            "kube-reserved-compressible" => (&mut kube, Compressible),
            "system-reserved" => (&mut system, All),
            "system-reserved-compressible" => (&mut system, Compressible),
            other => {
                r.problems.push(format!(
                    "{label}: {other:?} is not pods, kube-reserved, system-reserved, their -compressible forms or none"
                ));
                continue;
            }
        };
        if *reserve != Off && *reserve != how {
            let base = v.trim_end_matches("-compressible");
            r.problems.push(format!(
                "{label}: both {base:?} and \"{base}-compressible\" cannot be specified together"
            ));
        }
        *reserve = how;
    }
    for (how, field) in [
        (kube, "kubeReservedCgroup"),
        (system, "systemReservedCgroup"),
    ] {
        if how != Off && r.text(field).is_none_or(|t| t.is_empty()) {
            r.problems.push(format!(
                "{label}: enforcing the reserve needs {}",
                Reader::label(field)
            ));
        }
    }
    (pods, kube, system)
}

/// Why no configuration could be made: every problem found, each naming its field.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n  - {}", .problems.join("\n  - "))]
pub struct ConfigError {
    pub problems: Vec<String>,
}

/// The feature gates nodelet acts on, with its defaults. Others are accepted and warned about.
pub const FEATURE_GATES: &[(&str, bool)] = &[
    // Container events from the runtime wake the PLEG, which then relists every 300 s instead
    // of every second (upstream's gate is off by default; nodelet's is on where the runtime
    // streams events, and falls back to the 1 s relist where it does not).
    ("EventedPLEG", true),
    // A cpuCFSQuotaPeriod other than 100ms (upstream's alpha gate, off by default).
    ("CustomCPUCFSQuotaPeriod", false),
    // qosReserved acted on (upstream's alpha gate, off by default).
    ("QOSReserved", false),
];

/// Upstream's CFS quota period.
const DEFAULT_CFS_PERIOD: Duration = Duration::from_millis(100);

impl Config {
    /// enforceNodeAllocatable as in effect.
    fn enforced(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.enforce_pods_allocatable {
            out.push("pods".to_string());
        }
        for (how, name) in [
            (self.enforce_kube_reserved, "kube-reserved"),
            (self.enforce_system_reserved, "system-reserved"),
        ] {
            match how {
                ReserveEnforcement::Off => {}
                ReserveEnforcement::All => out.push(name.to_string()),
                ReserveEnforcement::Compressible => out.push(format!("{name}-compressible")),
            }
        }
        out
    }

    /// Whether the feature gate `name` (one of [`FEATURE_GATES`]) is on.
    pub fn feature(&self, name: &str) -> bool {
        self.feature_gates.get(name).copied().unwrap_or_else(|| {
            FEATURE_GATES
                .iter()
                .find(|(gate, _)| *gate == name)
                .is_some_and(|(_, on)| *on)
        })
    }
}

/// A loaded configuration plus what the user should be told about it.
#[derive(Debug)]
pub struct Loaded {
    pub config: Config,
    /// Config file fields accepted but not acted on.
    pub ignored_fields: Vec<String>,
}

/// What the command line asked for: a run, or help/version text to print.
/// The version nodelet reports as its kubelet version (`--version`, the Node's nodeInfo): the
/// Kubernetes API level it speaks, with its own version as build metadata.
pub const KUBELET_VERSION: &str = concat!("v1.34.0+nodelet-", env!("CARGO_PKG_VERSION"));

pub enum Invocation {
    Run(Box<Result<Loaded, ConfigError>>),
    Exit(clap::Error),
    /// `--version`: this line to print, and nothing to run.
    Version(String),
}

/// Parses the command line (and the --config file it names) into a validated configuration.
pub fn from_args<I, T>(args: I) -> Invocation
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = match flags::command().try_get_matches_from(args) {
        Ok(m) => m,
        Err(e) => return Invocation::Exit(e),
    };
    // As the kubelet prints it: tools such as kubeadm read the version from this line.
    if matches.get_flag("version") {
        return Invocation::Version(format!("Kubernetes {KUBELET_VERSION}"));
    }
    let mut problems = Vec::new();
    let flag_raw = flags::to_raw(&matches, &mut problems);
    Invocation::Run(Box::new(load(flag_raw, problems)))
}

fn load(flag_raw: Raw, mut problems: Vec<String>) -> Result<Loaded, ConfigError> {
    let mut raw = Raw::new();
    let mut ignored_fields = Vec::new();
    if let Some(RawValue::Scalar(path)) = flag_raw.get("config") {
        let knobs = file::read(std::path::Path::new(path));
        raw.extend(knobs.raw);
        problems.extend(knobs.errors);
        ignored_fields = knobs.ignored;
    }
    raw.extend(flag_raw);
    match validate(&raw) {
        Ok(config) if problems.is_empty() => Ok(Loaded {
            config,
            ignored_fields,
        }),
        Ok(_) => Err(ConfigError { problems }),
        Err(more) => {
            problems.extend(more);
            Err(ConfigError { problems })
        }
    }
}

/// Reads raw knobs into typed values, collecting every problem.
struct Reader<'a> {
    raw: &'a Raw,
    problems: Vec<String>,
}

impl Reader<'_> {
    fn label(name: &str) -> String {
        match by_name(name) {
            Some(f) if !f.flag.is_empty() => format!("{name} (--{})", f.flag),
            Some(_) => format!("{name} (config file)"),
            None => name.to_string(),
        }
    }

    fn text(&mut self, name: &str) -> Option<String> {
        match self.raw.get(name) {
            Some(RawValue::Scalar(s)) => Some(s.clone()),
            Some(RawValue::Map(_) | RawValue::List(_)) => {
                let label = Self::label(name);
                self.problems
                    .push(format!("{label}: expected a single value"));
                None
            }
            None => None,
        }
    }

    fn parsed<T>(
        &mut self,
        name: &str,
        default: T,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> T {
        match self.text(name) {
            None => default,
            Some(text) => match parse(&text) {
                Ok(v) => v,
                Err(msg) => {
                    let label = Self::label(name);
                    self.problems.push(format!("{label}: {msg}"));
                    default
                }
            },
        }
    }

    fn optional_duration(&mut self, name: &str) -> Option<Duration> {
        self.parsed(name, None, |s| match duration::parse(s)? {
            d if d.is_zero() => Err("must be greater than zero".into()),
            d => Ok(Some(d)),
        })
    }

    fn positive_duration(&mut self, name: &str, default: Duration) -> Duration {
        self.parsed(name, default, |s| match duration::parse(s)? {
            d if d.is_zero() => Err("must be greater than zero".into()),
            d if d > MAX_DURATION => Err("must be at most a year".into()),
            d => Ok(d),
        })
    }

    /// A graceful shutdown duration: zero (off), or at least a second, as upstream.
    fn shutdown_period(&mut self, name: &str) -> Duration {
        self.parsed(name, Duration::ZERO, |s| match duration::parse(s)? {
            d if !d.is_zero() && d < Duration::from_secs(1) => {
                Err("must be either zero or otherwise >= 1s".into())
            }
            d if d > MAX_DURATION => Err("must be at most a year".into()),
            d => Ok(d),
        })
    }

    fn positive_number(&mut self, name: &str, default: f64) -> f64 {
        self.parsed(name, default, |s| match s.trim().parse::<f64>() {
            Ok(n) if n > 0.0 && n.is_finite() => Ok(n),
            _ => Err(format!("{s:?} is not a positive number")),
        })
    }

    fn positive_count(&mut self, name: &str, default: u32) -> u32 {
        self.parsed(name, default, |s| match s.trim().parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{s:?} is not a positive number")),
        })
    }

    fn port(&mut self, name: &str, default: u16) -> u16 {
        self.parsed(name, default, |s| {
            s.trim()
                .parse::<u16>()
                .map_err(|_| format!("port {s:?} is not a number from 0 to 65535"))
        })
    }

    fn ip(&mut self, name: &str, default: Option<IpAddr>) -> Option<IpAddr> {
        self.parsed(name, default, |s| {
            s.trim()
                .parse::<IpAddr>()
                .map(Some)
                .map_err(|_| format!("{s:?} is not an IP address"))
        })
    }

    fn bool(&mut self, name: &str, default: bool) -> bool {
        self.parsed(name, default, |s| match s.trim() {
            "true" | "True" | "1" => Ok(true),
            "false" | "False" | "0" => Ok(false),
            other => Err(format!("{other:?} is not true or false")),
        })
    }

    fn path(&mut self, name: &str) -> Option<PathBuf> {
        self.text(name).filter(|s| !s.is_empty()).map(PathBuf::from)
    }

    fn endpoint(&mut self, name: &str, default: &str) -> PathBuf {
        let fallback = PathBuf::from(default.trim_start_matches("unix://"));
        self.parsed(name, fallback, |s| match s.split_once("://") {
            Some(("unix", path)) if path.starts_with('/') => Ok(PathBuf::from(path)),
            Some(("unix", path)) => Err(format!("unix endpoint {path:?} must be an absolute path")),
            Some((scheme, _)) => Err(format!(
                "endpoint scheme {scheme:?} is not supported; use unix:///path/to/socket"
            )),
            None => Err(format!("endpoint {s:?} has no scheme; use unix://{s}")),
        })
    }

    fn list(&mut self, name: &str) -> Vec<String> {
        match self.raw.get(name) {
            Some(RawValue::List(items)) => items.clone(),
            Some(RawValue::Scalar(s)) => vec![s.clone()],
            Some(RawValue::Map(_)) => {
                let label = Self::label(name);
                self.problems.push(format!("{label}: expected a list"));
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    fn map(&mut self, name: &str) -> BTreeMap<String, String> {
        match self.raw.get(name) {
            Some(RawValue::Map(m)) => m
                .iter()
                .map(|(k, v)| (k.clone(), v.last().cloned().unwrap_or_default()))
                .collect(),
            Some(RawValue::Scalar(_) | RawValue::List(_)) => {
                let label = Self::label(name);
                self.problems.push(format!("{label}: expected a map"));
                BTreeMap::new()
            }
            None => BTreeMap::new(),
        }
    }
}

/// A percentage from 0 to 100.
fn percent(s: &str) -> Result<u8, String> {
    match s.trim().parse::<u8>() {
        Ok(n) if n <= 100 => Ok(n),
        _ => Err(format!("{s:?} is not a percentage from 0 to 100")),
    }
}

/// containerLogMaxSize: a quantity of bytes, negative to turn rotation off (as upstream). Zero
/// is refused: every log, even an empty one, would be rotated on every check.
fn log_max_size(s: &str) -> Result<Option<u64>, String> {
    match crate::pod::parse_quantity(s) {
        Some(n) if n < 0.0 => Ok(None),
        Some(n) if n >= 1.0 && n < u64::MAX as f64 => Ok(Some(n as u64)),
        _ => Err(format!(
            "{s:?} is not a size of at least one byte (like 10Mi), or negative to turn rotation off"
        )),
    }
}

fn system_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Turns raw knobs into a [`Config`], applying the upstream defaults.
fn validate(raw: &Raw) -> Result<Config, Vec<String>> {
    let mut r = Reader {
        raw,
        problems: Vec::new(),
    };
    let runtime = r.endpoint(
        "containerRuntimeEndpoint",
        "unix:///run/containerd/containerd.sock",
    );
    let image = match r.raw.get("imageServiceEndpoint") {
        Some(RawValue::Scalar(s)) if !s.is_empty() => r.endpoint("imageServiceEndpoint", ""),
        _ => runtime.clone(),
    };
    let node_name = r
        .text("hostnameOverride")
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(system_hostname)
        .trim()
        .to_lowercase();
    if !is_dns1123_subdomain(&node_name) {
        r.problems.push(format!(
            "{}: node name {node_name:?} is not a valid DNS-1123 subdomain",
            Reader::label("hostnameOverride")
        ));
    }
    let cgroup_driver = r.parsed("cgroupDriver", CgroupDriver::Cgroupfs, |s| match s {
        "cgroupfs" => Ok(CgroupDriver::Cgroupfs),
        "systemd" => Ok(CgroupDriver::Systemd),
        other => Err(format!("{other:?} is not cgroupfs or systemd")),
    });
    let static_pod_url = r.text("staticPodURL").filter(|s| !s.is_empty());
    if let Some(url) = &static_pod_url
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        r.problems.push(format!(
            "{}: {url:?} is not an http:// or https:// URL",
            Reader::label("staticPodURL")
        ));
    }
    let static_pod_url_header = match raw.get("staticPodURLHeader") {
        Some(RawValue::Map(m)) => m.clone(),
        _ => BTreeMap::new(),
    };
    // Webhook authentication and authorization ask the API server: the defaults in a cluster.
    let in_cluster = r.path("kubeconfig").is_some();
    let enforcement = enforce_node_allocatable(&mut r);
    let config = Config {
        static_pod_path: r.path("staticPodPath"),
        static_pod_url,
        static_pod_url_header,
        static_pod_url_local_secrets: r.bool("staticPodURLLocalSecrets", false),
        file_check_frequency: r.positive_duration("fileCheckFrequency", Duration::from_secs(20)),
        http_check_frequency: r.positive_duration("httpCheckFrequency", Duration::from_secs(20)),
        sync_frequency: r.positive_duration("syncFrequency", Duration::from_secs(60)),
        container_runtime_endpoint: runtime,
        image_service_endpoint: image,
        runtime_request_timeout: r
            .positive_duration("runtimeRequestTimeout", Duration::from_secs(120)),
        root_dir: r
            .path("rootDir")
            .unwrap_or_else(|| PathBuf::from("/var/lib/kubelet")),
        pod_logs_dir: r
            .path("podLogsDir")
            .unwrap_or_else(|| PathBuf::from("/var/log/pods")),
        container_logs_dir: r
            .path("containerLogsDir")
            .unwrap_or_else(|| PathBuf::from("/var/log/containers")),
        resolv_conf: match raw.get("resolvConf") {
            None => Some(PathBuf::from("/etc/resolv.conf")),
            Some(_) => r.path("resolvConf"),
        },
        node_name,
        node_ip: r.ip("nodeIP", None),
        healthz_port: r.port("healthzPort", 10248),
        healthz_bind_address: r
            .ip("healthzBindAddress", None)
            .unwrap_or(IpAddr::from([127, 0, 0, 1])),
        port: r.port("port", 10250),
        enable_server: r.bool("enableServer", true),
        tls_cert_file: r.path("tlsCertFile"),
        tls_private_key_file: r.path("tlsPrivateKeyFile"),
        client_ca_file: r.path("authentication.x509.clientCAFile"),
        anonymous_auth: r.bool("authentication.anonymous.enabled", false),
        authentication_token_webhook: r.bool("authentication.webhook.enabled", in_cluster),
        authentication_token_webhook_cache_ttl: r
            .positive_duration("authentication.webhook.cacheTTL", Duration::from_secs(120)),
        authorization_mode: r.parsed(
            "authorization.mode",
            if in_cluster {
                AuthorizationMode::Webhook
            } else {
                AuthorizationMode::AlwaysAllow
            },
            |s| match s.trim() {
                "AlwaysAllow" => Ok(AuthorizationMode::AlwaysAllow),
                "Webhook" => Ok(AuthorizationMode::Webhook),
                other => Err(format!("{other:?} is not AlwaysAllow or Webhook")),
            },
        ),
        authorization_webhook_cache_authorized_ttl: r.positive_duration(
            "authorization.webhook.cacheAuthorizedTTL",
            Duration::from_secs(300),
        ),
        authorization_webhook_cache_unauthorized_ttl: r.positive_duration(
            "authorization.webhook.cacheUnauthorizedTTL",
            Duration::from_secs(30),
        ),
        read_only_port: r.port("readOnlyPort", 0),
        address: r.ip("address", None).unwrap_or(IpAddr::from([0, 0, 0, 0])),
        kubeconfig: r.path("kubeconfig"),
        kube_api_qps: r.positive_number("kubeAPIQPS", 50.0),
        kube_api_burst: r.positive_count("kubeAPIBurst", 100),
        event_record_qps: r.positive_number("eventRecordQPS", 50.0),
        event_burst: r.positive_count("eventBurst", 100),
        register_node: r.bool("registerNode", true),
        register_with_taints: {
            let mut taints = Vec::new();
            for s in r.list("registerWithTaints") {
                match taint(&s) {
                    Ok(t) => taints.push(t),
                    Err(msg) => r
                        .problems
                        .push(format!("{}: {msg}", Reader::label("registerWithTaints"))),
                }
            }
            taints
        },
        node_status_update_frequency: r
            .positive_duration("nodeStatusUpdateFrequency", Duration::from_secs(10)),
        node_status_report_frequency: r
            .positive_duration("nodeStatusReportFrequency", Duration::from_secs(300)),
        node_lease_duration_seconds: r.parsed("nodeLeaseDurationSeconds", 40, |s| {
            match s.trim().parse::<u32>() {
                Ok(n) if n > 0 && n <= 3600 => Ok(n),
                _ => Err(format!("{s:?} is not a number of seconds from 1 to 3600")),
            }
        }),
        run_once: r.bool("runOnce", false),
        run_once_timeout: r.positive_duration("runOnceTimeout", Duration::from_secs(600)),
        run_once_output: r.parsed("runOnceOutput", RunOnceOutput::Text, |s| match s {
            "text" => Ok(RunOnceOutput::Text),
            "json" => Ok(RunOnceOutput::Json),
            other => Err(format!("{other:?} is not text or json")),
        }),
        run_once_cleanup: r.bool("runOnceCleanup", false),
        lock_file: r.path("lockFile"),
        exit_on_lock_contention: r.bool("exitOnLockContention", false),
        cgroup_root: r.text("cgroupRoot").unwrap_or_else(|| "/".into()),
        kubelet_cgroups: cgroup_name(&mut r, "kubeletCgroups"),
        runtime_cgroups: cgroup_name(&mut r, "runtimeCgroups"),
        system_cgroups: cgroup_name(&mut r, "systemCgroups"),
        cpu_cfs_quota: r.bool("cpuCFSQuota", true),
        qos_reserved_memory: qos_reserved(&mut r),
        cpu_manager_static: r.parsed("cpuManagerPolicy", false, |s| match s {
            "none" | "" => Ok(false),
            "static" => Ok(true),
            other => Err(format!("unknown policy: {other:?} (none or static)")),
        }),
        cpu_manager_full_pcpus_only: cpu_manager_options(&mut r),
        reserved_cpus: r.parsed("reservedSystemCPUs", None, |s| {
            crate::cm::cpuset::CpuSet::parse(s).map(|set| (!set.is_empty()).then_some(set))
        }),
        cpu_manager_reconcile_period: r
            .positive_duration("cpuManagerReconcilePeriod", Duration::from_secs(10)),
        memory_manager_static: r.parsed("memoryManagerPolicy", false, |s| match s {
            "None" | "" => Ok(false),
            "Static" => Ok(true),
            other => Err(format!("unknown policy: {other:?} (None or Static)")),
        }),
        reserved_memory: reserved_memory(&mut r),
        topology_manager_policy: r.parsed(
            "topologyManagerPolicy",
            crate::cm::topology::Policy::None,
            crate::cm::topology::Policy::parse,
        ),
        topology_manager_scope: r.parsed(
            "topologyManagerScope",
            crate::cm::topology::Scope::Container,
            crate::cm::topology::Scope::parse,
        ),
        cpu_cfs_quota_period: r.parsed("cpuCFSQuotaPeriod", DEFAULT_CFS_PERIOD, duration::parse),
        cgroups_per_qos: r.bool("cgroupsPerQOS", true),
        enforce_pods_allocatable: enforcement.0,
        enforce_kube_reserved: enforcement.1,
        enforce_system_reserved: enforcement.2,
        kube_reserved_cgroup: cgroup_name(&mut r, "kubeReservedCgroup"),
        system_reserved_cgroup: cgroup_name(&mut r, "systemReservedCgroup"),
        fail_swap_on: r.bool("failSwapOn", true),
        fail_cgroup_v1: r.bool("failCgroupV1", false),
        protect_kernel_defaults: r.bool("protectKernelDefaults", false),
        oom_score_adj: r.parsed("oomScoreAdj", -999, |s| match s.trim().parse::<i32>() {
            Ok(n) if (-1000..=1000).contains(&n) => Ok(n),
            _ => Err(format!("{s:?} is not a number from -1000 to 1000")),
        }),
        shutdown_grace_period: r.shutdown_period("shutdownGracePeriod"),
        shutdown_grace_period_critical_pods: r.shutdown_period("shutdownGracePeriodCriticalPods"),
        shutdown_grace_period_by_pod_priority: {
            let mut stages = Vec::new();
            for s in r.list("shutdownGracePeriodByPodPriority") {
                match shutdown_stage(&s) {
                    Ok(stage) => stages.push(stage),
                    Err(msg) => r.problems.push(format!(
                        "{}: {msg}",
                        Reader::label("shutdownGracePeriodByPodPriority")
                    )),
                }
            }
            stages
        },
        cgroup_driver,
        testing: Testing {
            backoff: r.optional_duration("testingBackoff"),
            eviction_period: r.optional_duration("testingEvictionPeriod"),
            image_gc_period: r.optional_duration("testingImageGCPeriod"),
            log_rotation_period: r.optional_duration("testingLogRotationPeriod"),
        },
        user_namespace_ids_per_pod: {
            let ids = r.map("userNamespaces");
            match ids.get("idsPerPod").map(|v| v.trim().parse::<u64>()) {
                None => 65536,
                Some(Ok(n))
                    if n >= 65536 && n.is_multiple_of(65536) && n <= u64::from(u32::MAX) =>
                {
                    n as u32
                }
                Some(_) => {
                    r.problems.push(
                        "userNamespaces.idsPerPod (config file): must be a multiple of 65536, from 65536 to 4294967295"
                            .into(),
                    );
                    65536
                }
            }
        },
        max_pods: r.parsed("maxPods", 110, |s| match s.trim().parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{s:?} is not a positive number")),
        }),
        pod_pids_limit: r.parsed("podPidsLimit", None, |s| match s.trim().parse::<i64>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            Ok(-1) => Ok(None),
            _ => Err(format!("{s:?} is not a positive number or -1")),
        }),
        image_gc_high_threshold_percent: r.parsed("imageGCHighThresholdPercent", 85, percent),
        image_gc_low_threshold_percent: r.parsed("imageGCLowThresholdPercent", 80, percent),
        image_minimum_gc_age: r.parsed("imageMinimumGCAge", Duration::from_secs(120), |s| {
            match duration::parse(s)? {
                d if d > MAX_DURATION => Err("must be at most a year".into()),
                d => Ok(d),
            }
        }),
        serialize_image_pulls: r.bool("serializeImagePulls", false),
        max_parallel_image_pulls: r.parsed("maxParallelImagePulls", None, |s| {
            match s.trim().parse::<u32>() {
                Ok(n) if n > 0 => Ok(Some(n)),
                _ => Err(format!("{s:?} is not a positive number")),
            }
        }),
        registry_pull_qps: r.parsed("registryPullQPS", 5.0, |s| match s.trim().parse::<f64>() {
            Ok(n) if n >= 0.0 && n.is_finite() => Ok(n),
            _ => Err(format!("{s:?} is not a number of at least 0")),
        }),
        registry_burst: r.parsed("registryBurst", 10, |s| match s.trim().parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{s:?} is not a positive number")),
        }),
        image_credential_provider_config: r.path("imageCredentialProviderConfig"),
        image_credential_provider_bin_dir: r.path("imageCredentialProviderBinDir"),
        image_pull_progress_deadline: Some(r.parsed(
            "imagePullProgressDeadline",
            Duration::from_secs(60),
            duration::parse,
        ))
        .filter(|d| !d.is_zero()),
        kube_reserved: r.map("kubeReserved"),
        system_reserved: r.map("systemReserved"),
        eviction_hard: r.map("evictionHard"),
        eviction_pressure_transition_period: r.parsed(
            "evictionPressureTransitionPeriod",
            Duration::from_secs(300),
            duration::parse,
        ),
        kernel_memcg_notification: r.bool("kernelMemcgNotification", true),
        container_log_max_size: r.parsed("containerLogMaxSize", Some(10 << 20), log_max_size),
        container_log_max_files: r.parsed("containerLogMaxFiles", 5, |s| {
            match s.trim().parse::<u32>() {
                Ok(n) if n >= 2 => Ok(n),
                _ => Err(format!("{s:?} is not a number of at least 2")),
            }
        }),
        container_log_monitor_interval: r.parsed(
            "containerLogMonitorInterval",
            Duration::from_secs(10),
            |s| match duration::parse(s)? {
                d if d < Duration::from_secs(3) => Err("must be at least 3s".into()),
                d if d > MAX_DURATION => Err("must be at most a year".into()),
                d => Ok(d),
            },
        ),
        node_labels: r.map("nodeLabels"),
        feature_gates: {
            let mut gates = BTreeMap::new();
            for (gate, value) in r.map("featureGates") {
                match value.parse::<bool>() {
                    Ok(on) => {
                        gates.insert(gate, on);
                    }
                    Err(_) => r.problems.push(format!(
                        "featureGates (--feature-gates): {gate}={value}: expected true or false"
                    )),
                }
            }
            gates
        },
        cluster_dns: {
            let servers = r.list("clusterDNS");
            let mut ips = Vec::new();
            for s in servers {
                match s.parse::<IpAddr>() {
                    Ok(ip) => ips.push(ip),
                    Err(_) => r.problems.push(format!(
                        "{}: {s:?} is not an IP address",
                        Reader::label("clusterDNS")
                    )),
                }
            }
            ips
        },
        cluster_domain: r
            .text("clusterDomain")
            .unwrap_or_default()
            .trim_end_matches('.')
            .to_string(),
        allowed_unsafe_sysctls: r.list("allowedUnsafeSysctls"),
        verbosity: r.parsed("verbosity", 0, |s| match s.trim().parse::<u8>() {
            Ok(n) if n <= 10 => Ok(n),
            _ => Err(format!("{s:?} is not a level from 0 to 10")),
        }),
    };
    if config.run_once && config.static_pod_path.is_none() && config.static_pod_url.is_none() {
        r.problems.push(
            "runOnce (--run-once): needs --pod-manifest-path or --manifest-url to read pods from"
                .into(),
        );
    }
    if config.image_gc_low_threshold_percent >= config.image_gc_high_threshold_percent
        && config.image_gc_high_threshold_percent < 100
    {
        r.problems.push(format!(
            "imageGCLowThresholdPercent (--image-gc-low-threshold): {} must be below the high threshold {}",
            config.image_gc_low_threshold_percent, config.image_gc_high_threshold_percent
        ));
    }
    if config.shutdown_grace_period_critical_pods > config.shutdown_grace_period {
        r.problems.push(format!(
            "shutdownGracePeriodCriticalPods (--shutdown-grace-period-critical-pods): {} must be <= shutdownGracePeriod {}",
            format_duration(config.shutdown_grace_period_critical_pods),
            format_duration(config.shutdown_grace_period)
        ));
    }
    let by_period =
        config.shutdown_grace_period + config.shutdown_grace_period_critical_pods > Duration::ZERO;
    if by_period && !config.shutdown_grace_period_by_pod_priority.is_empty() {
        r.problems.push(
            "shutdownGracePeriodByPodPriority: cannot be given with shutdownGracePeriod or shutdownGracePeriodCriticalPods; give one or the other"
                .into(),
        );
    }
    if config.tls_cert_file.is_some() != config.tls_private_key_file.is_some() {
        r.problems.push(
            "tlsCertFile (--tls-cert-file) and tlsPrivateKeyFile (--tls-private-key-file): give both or neither"
                .into(),
        );
    }
    if let Some(RawValue::Scalar(t)) = raw.get("contentType")
        && !matches!(
            t.as_str(),
            "application/json" | "application/vnd.kubernetes.protobuf"
        )
    {
        r.problems.push(format!(
            "{}: {t:?} is not application/json or application/vnd.kubernetes.protobuf",
            Reader::label("contentType")
        ));
    }
    if config.kubeconfig.is_none() {
        if config.authentication_token_webhook {
            r.problems.push(
                "authentication.webhook.enabled (--authentication-token-webhook): needs --kubeconfig to reach the API server"
                    .into(),
            );
        }
        if config.authorization_mode == AuthorizationMode::Webhook {
            r.problems.push(
                "authorization.mode (--authorization-mode): Webhook needs --kubeconfig to reach the API server"
                    .into(),
            );
        }
    }
    if config.image_credential_provider_config.is_some()
        && config.image_credential_provider_bin_dir.is_none()
    {
        r.problems.push(
            "--image-credential-provider-config: needs --image-credential-provider-bin-dir, where the plugins are"
                .into(),
        );
    }
    let period = config.cpu_cfs_quota_period;
    if !config.feature("CustomCPUCFSQuotaPeriod") && period != DEFAULT_CFS_PERIOD {
        r.problems.push(format!(
            "cpuCFSQuotaPeriod (--cpu-cfs-quota-period): {} requires feature gate CustomCPUCFSQuotaPeriod",
            format_duration(period)
        ));
    } else if !(Duration::from_millis(1)..=Duration::from_secs(1)).contains(&period) {
        r.problems.push(format!(
            "cpuCFSQuotaPeriod (--cpu-cfs-quota-period): {} must be between 1ms and 1s, inclusive",
            format_duration(period)
        ));
    }
    if config.exit_on_lock_contention && config.lock_file.is_none() {
        r.problems
            .push("exitOnLockContention (--exit-on-lock-contention): needs --lock-file".into());
    }
    if r.problems.is_empty() {
        Ok(config)
    } else {
        Err(r.problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Loaded, ConfigError> {
        let argv = std::iter::once("nodelet").chain(args.iter().copied());
        match from_args(argv) {
            Invocation::Run(result) => *result,
            Invocation::Exit(e) => panic!("unexpected clap exit: {e}"),
            Invocation::Version(line) => panic!("unexpected version: {line}"),
        }
    }

    #[test]
    fn node_allocatable_is_enforced_on_pods_unless_told_otherwise() {
        let on = |args: &[&str]| run(args).map(|l| l.config.enforce_pods_allocatable);
        assert!(on(&["--hostname-override=n"]).unwrap());
        assert!(!on(&["--hostname-override=n", "--enforce-node-allocatable=none"]).unwrap());
        assert!(!on(&["--hostname-override=n", "--enforce-node-allocatable="]).unwrap());
        let err = on(&[
            "--hostname-override=n",
            "--enforce-node-allocatable=kube-reserved",
        ])
        .unwrap_err();
        assert!(
            err.problems[0].contains("needs kubeReservedCgroup (--kube-reserved-cgroup)"),
            "{err}"
        );
        let reserved = run(&[
            "--hostname-override=n",
            "--enforce-node-allocatable=pods,system-reserved",
            "--system-reserved-cgroup=/system.slice",
            "--kube-reserved-cgroup=/kube.slice",
        ])
        .unwrap()
        .config;
        assert_eq!(reserved.enforce_system_reserved, ReserveEnforcement::All);
        assert_eq!(reserved.enforce_kube_reserved, ReserveEnforcement::Off);
        assert_eq!(
            reserved.kube_reserved_cgroup.as_deref(),
            Some("/kube.slice")
        );
        assert_eq!(reserved.enforced(), ["pods", "system-reserved"]);
        let cpu_only = run(&[
            "--hostname-override=n",
            "--enforce-node-allocatable=kube-reserved-compressible",
            "--kube-reserved-cgroup=/kube.slice",
        ])
        .unwrap()
        .config;
        assert_eq!(
            cpu_only.enforce_kube_reserved,
            ReserveEnforcement::Compressible
        );
        assert_eq!(cpu_only.enforced(), ["kube-reserved-compressible"]);
        let err = on(&[
            "--hostname-override=n",
            "--enforce-node-allocatable=kube-reserved,kube-reserved-compressible",
            "--kube-reserved-cgroup=/kube.slice",
        ])
        .unwrap_err();
        assert!(
            err.problems[0].contains("cannot be specified together"),
            "{err}"
        );
    }

    #[test]
    fn memory_and_topology_managers_read_from_flags_and_the_file() {
        use crate::cm::topology::{Policy, Scope};
        let c = run(&[
            "--hostname-override=n",
            "--memory-manager-policy=Static",
            "--reserved-memory=0:memory=100Mi,hugepages-2Mi=2Mi",
            "--reserved-memory=1:memory=1Gi;2:memory=1Mi",
            "--topology-manager-policy=single-numa-node",
            "--topology-manager-scope=pod",
        ])
        .unwrap()
        .config;
        assert!(c.memory_manager_static);
        assert_eq!(c.reserved_memory[&0]["hugepages-2Mi"], 2 << 20);
        assert_eq!(c.reserved_memory[&1]["memory"], 1 << 30);
        assert_eq!(c.reserved_memory[&2]["memory"], 1 << 20);
        assert_eq!(c.topology_manager_policy, Policy::SingleNumaNode);
        assert_eq!(c.topology_manager_scope, Scope::Pod);
        let configz = c.kubelet_configuration();
        assert_eq!(configz["reservedMemory"][0]["limits"]["memory"], "100Mi");
        assert_eq!(configz["topologyManagerScope"], "pod");
        let err = run(&[
            "--memory-manager-policy=static",
            "--topology-manager-policy=strict",
            "--reserved-memory=0:cpu=1",
        ])
        .unwrap_err();
        assert_eq!(err.problems.len(), 3, "{:?}", err.problems);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(
            &file,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmemoryManagerPolicy: Static\nreservedMemory:\n- numaNode: 0\n  limits: {memory: 1100Mi}\ntopologyManagerPolicy: restricted\n",
        )
        .unwrap();
        let c = run(&["--config", file.to_str().unwrap()]).unwrap().config;
        assert_eq!(c.reserved_memory[&0]["memory"], 1100 << 20);
        assert_eq!(c.topology_manager_policy, Policy::Restricted);
        assert_eq!(c.topology_manager_scope, Scope::Container);
    }

    #[test]
    fn a_cfs_quota_period_other_than_100ms_needs_its_feature_gate_and_a_sane_range() {
        let period = |args: &[&str]| {
            let argv: Vec<&str> = ["--hostname-override=n"]
                .iter()
                .chain(args)
                .copied()
                .collect();
            run(&argv).map(|l| (l.config.cpu_cfs_quota, l.config.cpu_cfs_quota_period))
        };
        assert_eq!(period(&[]).unwrap(), (true, Duration::from_millis(100)));
        assert_eq!(
            period(&["--cpu-cfs-quota=false"]).unwrap(),
            (false, Duration::from_millis(100))
        );
        let err = period(&["--cpu-cfs-quota-period=50ms"]).unwrap_err();
        assert!(
            err.problems[0].contains("requires feature gate CustomCPUCFSQuotaPeriod"),
            "{err}"
        );
        let gate = "--feature-gates=CustomCPUCFSQuotaPeriod=true";
        assert_eq!(
            period(&[gate, "--cpu-cfs-quota-period=50ms"]).unwrap(),
            (true, Duration::from_millis(50))
        );
        let err = period(&[gate, "--cpu-cfs-quota-period=2s"]).unwrap_err();
        assert!(err.problems[0].contains("between 1ms and 1s"), "{err}");
    }

    #[test]
    fn qos_reserved_takes_a_memory_percentage_only() {
        let reserved = |value: &str| {
            run(&["--hostname-override=n", &format!("--qos-reserved={value}")])
                .map(|l| l.config.qos_reserved_memory)
        };
        assert_eq!(reserved("memory=50%").unwrap(), Some(50));
        let problem = |value: &str| reserved(value).unwrap_err().problems[0].clone();
        assert!(problem("cpu=50%").contains("cannot reserve \"cpu\""));
        assert!(problem("memory=50").contains("failed to parse percentage"));
        assert!(problem("memory=101%").contains("between 0 and 100"));
    }

    #[test]
    fn defaults_match_upstream() {
        let c = run(&["--hostname-override", "Node-A"]).unwrap().config;
        assert_eq!(c.node_name, "node-a");
        assert_eq!(c.file_check_frequency, Duration::from_secs(20));
        assert_eq!(c.sync_frequency, Duration::from_secs(60));
        assert_eq!(c.runtime_request_timeout, Duration::from_secs(120));
        assert_eq!(
            c.container_runtime_endpoint,
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(c.image_service_endpoint, c.container_runtime_endpoint);
        assert_eq!(c.healthz_port, 10248);
        assert_eq!(c.read_only_port, 0);
        assert_eq!(c.max_pods, 110);
        assert!(c.cgroups_per_qos);
        assert_eq!(c.pod_logs_dir, PathBuf::from("/var/log/pods"));
        assert_eq!(c.container_log_max_size, Some(10 * 1024 * 1024));
        assert_eq!(c.container_log_max_files, 5);
        assert_eq!(c.container_log_monitor_interval, Duration::from_secs(10));
        assert_eq!(c.oom_score_adj, -999);
    }

    #[test]
    fn feature_gates_and_user_namespace_ids_are_read_and_checked() {
        let c = run(&["--hostname-override", "n"]).unwrap().config;
        assert!(c.feature("EventedPLEG"), "on by default");
        assert_eq!(c.user_namespace_ids_per_pod, 65536);
        let c = run(&["--feature-gates=EventedPLEG=false,SomethingElse=true"])
            .unwrap()
            .config;
        assert!(!c.feature("EventedPLEG"));
        assert_eq!(c.feature_gates.get("SomethingElse"), Some(&true));
        let err = run(&["--feature-gates=EventedPLEG=maybe"]).err().unwrap();
        assert!(
            err.problems[0].contains("EventedPLEG=maybe: expected true or false"),
            "{:?}",
            err.problems
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        let write = |ids: &str| {
            std::fs::write(
                &file,
                format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nuserNamespaces: {{idsPerPod: {ids}}}\n"),
            )
            .unwrap();
            run(&["--config", file.to_str().unwrap()])
        };
        assert_eq!(
            write("131072").unwrap().config.user_namespace_ids_per_pod,
            131072
        );
        let err = write("1000").err().unwrap();
        assert!(
            err.problems[0].starts_with("userNamespaces.idsPerPod"),
            "{:?}",
            err.problems
        );
    }

    #[test]
    fn configz_shows_every_field_the_file_may_set() {
        fn keys(prefix: &str, v: &serde_json::Value, out: &mut Vec<String>) {
            if let serde_json::Value::Object(m) = v {
                for (k, v) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    keys(&key, v, out);
                    out.push(key);
                }
            }
        }
        let c = run(&["--hostname-override", "n"]).unwrap().config;
        let mut shown = Vec::new();
        keys("", &c.kubelet_configuration(), &mut shown);
        let missing: Vec<&str> = fields::FIELDS
            .iter()
            .filter(|f| f.in_file && !shown.iter().any(|k| k == f.name))
            .map(|f| f.name)
            .collect();
        assert!(missing.is_empty(), "/configz lacks {missing:?}");
        // Upstream's clients decode /configz into KubeletConfiguration, whose numbers (but
        // memoryThrottlingFactor, not shown) are integers: 50.0 fails to decode.
        let config = c.kubelet_configuration();
        let floats: Vec<&String> = shown
            .iter()
            .filter(|k| {
                let v = k.split('.').try_fold(&config, |v, part| v.get(part));
                v.is_some_and(|v| v.is_f64())
            })
            .collect();
        assert!(
            floats.is_empty(),
            "/configz has non-integer numbers at {floats:?}"
        );
    }

    #[test]
    fn container_log_rotation_knobs_are_checked() {
        let c = run(&[
            "--hostname-override=n1",
            "--container-log-max-size=1Ki",
            "--container-log-max-files=2",
        ])
        .unwrap()
        .config;
        assert_eq!(c.container_log_max_size, Some(1024));
        assert_eq!(c.container_log_max_files, 2);
        let off = run(&["--hostname-override=n1", "--container-log-max-size=-1"]).unwrap();
        assert_eq!(off.config.container_log_max_size, None);
        let err = run(&[
            "--hostname-override=n1",
            "--container-log-max-size=0",
            "--container-log-max-files=1",
            "--container-log-monitor-interval=1s",
        ])
        .unwrap_err();
        assert_eq!(err.problems.len(), 3, "{err}");
        assert!(err.problems[0].contains("containerLogMaxSize (--container-log-max-size)"));
    }

    #[test]
    fn the_version_reads_as_the_kubelets() {
        let Invocation::Version(text) = from_args(["nodelet", "--version"]) else {
            panic!("--version runs nothing");
        };
        assert!(
            text.starts_with("Kubernetes v1.") && text.contains("+nodelet-"),
            "{text}"
        );
    }

    #[test]
    fn flags_parse_like_the_kubelets() {
        let c = run(&[
            "--hostname-override=n1",
            "--runonce",
            "--pod-manifest-path=/m",
            "--cgroups-per-qos=false",
            "--manifest-url-header",
            "A:1",
            "--manifest-url-header=A:2",
            "--eviction-hard",
            "memory.available<200Mi,nodefs.available<5%",
            "--node-labels=a=b,c=d",
            "-v",
            "4",
        ])
        .unwrap()
        .config;
        assert!(c.run_once);
        assert!(!c.cgroups_per_qos);
        assert_eq!(c.static_pod_url_header["A"], vec!["1", "2"]);
        assert_eq!(c.eviction_hard["memory.available"], "200Mi");
        assert_eq!(c.node_labels["c"], "d");
        assert_eq!(c.verbosity, 4);
    }

    #[test]
    fn graceful_shutdown_makes_stages_by_priority() {
        let c = |args: &[&str]| {
            let mut all = vec!["--hostname-override=n1"];
            all.extend(args);
            run(&all)
        };
        let stage = |priority, seconds| ShutdownStage { priority, seconds };
        let off = c(&[]).unwrap().config;
        assert!(off.shutdown_stages().is_empty());
        let two = c(&[
            "--shutdown-grace-period=30s",
            "--shutdown-grace-period-critical-pods=10s",
        ])
        .unwrap()
        .config;
        assert_eq!(
            two.shutdown_stages(),
            [stage(0, 20), stage(2_000_000_000, 10)]
        );
        let err = c(&[
            "--shutdown-grace-period=5s",
            "--shutdown-grace-period-critical-pods=10s",
        ])
        .unwrap_err();
        assert!(
            err.problems[0].contains("must be <= shutdownGracePeriod 5s"),
            "{err}"
        );
        let err = c(&["--shutdown-grace-period=500ms"]).unwrap_err();
        assert!(err.problems[0].contains(">= 1s"), "{err}");
    }

    #[test]
    fn bad_flags_are_all_reported() {
        let err = run(&[
            "--hostname-override=n1",
            "--healthz-port=70000",
            "--sync-frequency=soon",
            "--container-runtime-endpoint=/run/x.sock",
        ])
        .unwrap_err();
        assert_eq!(err.problems.len(), 3, "{err}");
        assert!(err.problems[0].contains("containerRuntimeEndpoint"));
    }
}

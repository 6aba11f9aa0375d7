//! Agent settings: upstream kubelet flags and a KubeletConfiguration file, merged as
//! defaults < file < flags, then validated into a [`Config`] that reports every problem at once.

mod duration;
mod fields;
mod file;
mod flags;
mod read;
mod settings;

use std::ffi::OsString;
use std::time::Duration;

use crate::pod::is_dns1123_subdomain;
pub use duration::{format as format_duration, parse as parse_duration};
use fields::{Raw, RawValue};
use read::Reader;
pub use settings::{Config, FIELDS};

pub use crate::types::CgroupDriver;
use crate::types::PullVerification;

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

impl AuthorizationMode {
    fn parse(s: &str) -> Result<AuthorizationMode, String> {
        match s.trim() {
            "AlwaysAllow" => Ok(AuthorizationMode::AlwaysAllow),
            "Webhook" => Ok(AuthorizationMode::Webhook),
            other => Err(format!("{other:?} is not AlwaysAllow or Webhook")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            AuthorizationMode::AlwaysAllow => "AlwaysAllow",
            AuthorizationMode::Webhook => "Webhook",
        }
    }
}

/// The report format of run-once mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunOnceOutput {
    Text,
    Json,
}

impl RunOnceOutput {
    fn parse(s: &str) -> Result<RunOnceOutput, String> {
        match s {
            "text" => Ok(RunOnceOutput::Text),
            "json" => Ok(RunOnceOutput::Json),
            other => Err(format!("{other:?} is not text or json")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            RunOnceOutput::Text => "text",
            RunOnceOutput::Json => "json",
        }
    }
}

/// How a reserve is enforced on its cgroup (enforceNodeAllocatable's `kube-reserved` and
/// `system-reserved`, or their `-compressible` forms: cpu only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReserveEnforcement {
    Off,
    All,
    Compressible,
}

/// enforceNodeAllocatable: whether the kubepods cgroup is limited to allocatable, and how the
/// kube and system reserves are enforced on their cgroups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enforcement {
    pub pods: bool,
    pub kube_reserved: ReserveEnforcement,
    pub system_reserved: ReserveEnforcement,
}

impl Default for Enforcement {
    /// Upstream's default: `pods`.
    fn default() -> Enforcement {
        Enforcement {
            pods: true,
            kube_reserved: ReserveEnforcement::Off,
            system_reserved: ReserveEnforcement::Off,
        }
    }
}

impl Enforcement {
    /// The list as upstream's field spells it.
    fn names(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.pods {
            out.push("pods".to_string());
        }
        for (how, name) in [
            (self.kube_reserved, "kube-reserved"),
            (self.system_reserved, "system-reserved"),
        ] {
            match how {
                ReserveEnforcement::Off => {}
                ReserveEnforcement::All => out.push(name.to_string()),
                ReserveEnforcement::Compressible => out.push(format!("{name}-compressible")),
            }
        }
        out
    }
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

    /// The configuration in force as a KubeletConfiguration (what /configz shows): every field
    /// the file may set, with upstream's names and Go durations.
    pub fn kubelet_configuration(&self) -> serde_json::Value {
        let mut config = serde_json::json!({
            "kind": "KubeletConfiguration",
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
        });
        for (field, value) in FIELDS.iter().zip(self.shown()) {
            if !field.in_file {
                continue;
            }
            let mut parts: Vec<&str> = field.name.split('.').collect();
            let last = parts.pop().unwrap_or(field.name);
            let mut at = &mut config;
            for part in parts {
                at = &mut at[part];
            }
            at[last] = value;
        }
        config
    }
}

/// Why no configuration could be made: every problem found, each naming its field.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n  - {}", .problems.join("\n  - "))]
pub struct ConfigError {
    pub problems: Vec<String>,
}

/// The feature gates nodelet acts on, with its defaults and upstream's stage (as
/// `kubernetes_feature_enabled` labels it). Others are accepted and warned about.
pub const FEATURE_GATES: &[(&str, bool, &str)] = &[
    // Container events from the runtime wake the PLEG, which then relists every 300 s instead
    // of every second (upstream's gate is off by default; nodelet's is on where the runtime
    // streams events, and falls back to the 1 s relist where it does not).
    ("EventedPLEG", true, "ALPHA"),
    // A pod uses an image already on the node only if it could pull it itself.
    ("KubeletEnsureSecretPulledImages", true, "BETA"),
    // A cpuCFSQuotaPeriod other than 100ms (upstream's alpha gate, off by default).
    ("CustomCPUCFSQuotaPeriod", false, "ALPHA"),
    // qosReserved acted on (upstream's alpha gate, off by default).
    ("QOSReserved", false, "ALPHA"),
    // In-place resize of a pod's own resources (`spec.resources`), declared in the Node's
    // status so that the API server takes such resizes for its pods.
    ("InPlacePodLevelResourcesVerticalScaling", true, "BETA"),
    // Container statuses show the health of the devices their device plugins and DRA claims
    // gave them (`allocatedResourcesStatus`).
    ("ResourceHealthStatus", true, "BETA"),
];

/// Upstream's CFS quota period.
const DEFAULT_CFS_PERIOD: Duration = Duration::from_millis(100);

impl Config {
    /// Whether the feature gate `name` (one of [`FEATURE_GATES`]) is on.
    pub fn feature(&self, name: &str) -> bool {
        self.feature_gates.get(name).copied().unwrap_or_else(|| {
            FEATURE_GATES
                .iter()
                .find(|(gate, _, _)| *gate == name)
                .is_some_and(|(_, on, _)| *on)
        })
    }

    /// Each gate nodelet acts on: its name, its stage and whether it is on.
    pub fn features(&self) -> Vec<(&'static str, &'static str, bool)> {
        FEATURE_GATES
            .iter()
            .map(|(name, _, stage)| (*name, *stage, self.feature(name)))
            .collect()
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
    let mut config = Config::read(&mut r);
    resolve(&mut config, raw);
    check(&config, &mut r);
    if r.problems.is_empty() {
        Ok(config)
    } else {
        Err(r.problems)
    }
}

/// The defaults that depend on other knobs or on the host.
fn resolve(config: &mut Config, raw: &Raw) {
    if config.image_service_endpoint.as_os_str().is_empty() {
        config.image_service_endpoint = config.container_runtime_endpoint.clone();
    }
    if config.node_name.is_empty() {
        config.node_name = system_hostname().to_lowercase();
    }
    // Webhook authentication and authorization ask the API server: the defaults in a cluster.
    if config.kubeconfig.is_some() {
        if !raw.contains_key("authentication.webhook.enabled") {
            config.authentication_token_webhook = true;
        }
        if !raw.contains_key("authorization.mode") {
            config.authorization_mode = AuthorizationMode::Webhook;
        }
    }
}

/// The checks that take more than one knob: each is a rule broken, the knob it names and why.
/// Its body is the table of those rules, kept together rather than cut into functions.
fn check(c: &Config, r: &mut Reader<'_>) {
    let enforced = c.enforce_node_allocatable;
    let period = c.cpu_cfs_quota_period;
    let shutdown = c.shutdown_grace_period;
    let critical = c.shutdown_grace_period_critical_pods;
    let api_server = "to reach the API server";
    let allowlist = &c.preloaded_images_verification_allowlist;
    let bad_pattern = allowlist.iter().find_map(|p| {
        PullVerification::check_pattern(p)
            .err()
            .map(|why| format!("{p:?}: {why}"))
    });
    let rules = [
        (
            !is_dns1123_subdomain(&c.node_name),
            "hostnameOverride",
            format!("node name {:?} is not a valid DNS-1123 subdomain", c.node_name),
        ),
        (
            enforced.kube_reserved != ReserveEnforcement::Off && c.kube_reserved_cgroup.is_none(),
            "enforceNodeAllocatable",
            format!("enforcing the reserve needs {}", Reader::label("kubeReservedCgroup")),
        ),
        (
            enforced.system_reserved != ReserveEnforcement::Off
                && c.system_reserved_cgroup.is_none(),
            "enforceNodeAllocatable",
            format!("enforcing the reserve needs {}", Reader::label("systemReservedCgroup")),
        ),
        (
            c.run_once && c.static_pod_path.is_none() && c.static_pod_url.is_none(),
            "runOnce",
            "needs --pod-manifest-path or --manifest-url to read pods from".into(),
        ),
        (
            c.image_gc_low_threshold_percent >= c.image_gc_high_threshold_percent
                && c.image_gc_high_threshold_percent < 100,
            "imageGCLowThresholdPercent",
            format!(
                "{} must be below the high threshold {}",
                c.image_gc_low_threshold_percent, c.image_gc_high_threshold_percent
            ),
        ),
        (
            critical > shutdown,
            "shutdownGracePeriodCriticalPods",
            format!(
                "{} must be <= shutdownGracePeriod {}",
                format_duration(critical),
                format_duration(shutdown)
            ),
        ),
        (
            shutdown + critical > Duration::ZERO
                && !c.shutdown_grace_period_by_pod_priority.is_empty(),
            "shutdownGracePeriodByPodPriority",
            "cannot be given with shutdownGracePeriod or shutdownGracePeriodCriticalPods; give one or the other".into(),
        ),
        (
            c.tls_cert_file.is_some() != c.tls_private_key_file.is_some(),
            "tlsCertFile",
            format!("give both or neither with {}", Reader::label("tlsPrivateKeyFile")),
        ),
        (
            c.kubeconfig.is_none() && c.authentication_token_webhook,
            "authentication.webhook.enabled",
            format!("needs --kubeconfig {api_server}"),
        ),
        (
            c.kubeconfig.is_none() && c.authorization_mode == AuthorizationMode::Webhook,
            "authorization.mode",
            format!("Webhook needs --kubeconfig {api_server}"),
        ),
        (
            c.image_credential_provider_config.is_some()
                && c.image_credential_provider_bin_dir.is_none(),
            "imageCredentialProviderConfig",
            "needs --image-credential-provider-bin-dir, where the plugins are".into(),
        ),
        (
            !c.feature("CustomCPUCFSQuotaPeriod") && period != DEFAULT_CFS_PERIOD,
            "cpuCFSQuotaPeriod",
            format!(
                "{} requires feature gate CustomCPUCFSQuotaPeriod",
                format_duration(period)
            ),
        ),
        (
            !(Duration::from_millis(1)..=Duration::from_secs(1)).contains(&period),
            "cpuCFSQuotaPeriod",
            format!(
                "{} must be between 1ms and 1s, inclusive",
                format_duration(period)
            ),
        ),
        (
            c.exit_on_lock_contention && c.lock_file.is_none(),
            "exitOnLockContention",
            "needs --lock-file".into(),
        ),
        (
            !allowlist.is_empty()
                && c.image_pull_credentials_verification_policy
                    != PullVerification::NeverVerifyAllowlistedImages,
            "preloadedImagesVerificationAllowlist",
            "is only read with imagePullCredentialsVerificationPolicy NeverVerifyAllowlistedImages"
                .into(),
        ),
        (
            bad_pattern.is_some(),
            "preloadedImagesVerificationAllowlist",
            bad_pattern.unwrap_or_default(),
        ),
    ];
    for (broken, field, why) in rules {
        if broken {
            r.problem(field, why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::PathBuf;

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
        let on = |args: &[&str]| run(args).map(|l| l.config.enforce_node_allocatable.pods);
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
        assert_eq!(
            reserved.enforce_node_allocatable.system_reserved,
            ReserveEnforcement::All
        );
        assert_eq!(
            reserved.enforce_node_allocatable.kube_reserved,
            ReserveEnforcement::Off
        );
        assert_eq!(
            reserved.kube_reserved_cgroup.as_deref(),
            Some("/kube.slice")
        );
        assert_eq!(
            reserved.enforce_node_allocatable.names(),
            ["pods", "system-reserved"]
        );
        let cpu_only = run(&[
            "--hostname-override=n",
            "--enforce-node-allocatable=kube-reserved-compressible",
            "--kube-reserved-cgroup=/kube.slice",
        ])
        .unwrap()
        .config;
        assert_eq!(
            cpu_only.enforce_node_allocatable.kube_reserved,
            ReserveEnforcement::Compressible
        );
        assert_eq!(
            cpu_only.enforce_node_allocatable.names(),
            ["kube-reserved-compressible"]
        );
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
        let missing: Vec<&str> = FIELDS
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
        assert!(
            err.problems
                .iter()
                .any(|p| p.contains("containerRuntimeEndpoint (--container-runtime-endpoint)")),
            "{err}"
        );
    }

    #[test]
    fn help_texts_say_no_default_of_their_own() {
        // A plain default belongs in the table's `default`, which --help appends; the text
        // says `[default: ...]` only for one that depends on other knobs.
        let by_hand: Vec<&str> = FIELDS
            .iter()
            .filter(|f| f.help.contains("[default ") || f.help.contains("default]"))
            .map(|f| f.name)
            .collect();
        assert!(
            by_hand.is_empty(),
            "help texts with defaults by hand: {by_hand:?}"
        );
        let help = flags::command().render_long_help().to_string();
        assert!(help.contains("[default 20s]"), "{help}");
        assert!(help.contains("[default unix:///run/containerd/containerd.sock]"));
        assert!(help.contains("[default pods]"));
    }

    #[test]
    fn the_flags_page_says_the_declared_defaults() {
        let page = include_str!("../../docs/flags.md");
        let defaults: BTreeMap<&str, Option<String>> = FIELDS
            .iter()
            .zip(Config::defaults_shown())
            .filter(|(f, _)| !f.help.contains("[default:"))
            .map(|(f, d)| (f.flag, flags::default_text(&d)))
            .collect();
        let same = |a: &str, b: &str| match (parse_duration(a), parse_duration(b)) {
            (Ok(a), Ok(b)) => a == b,
            _ => a == b,
        };
        let mut checked = 0;
        for row in page.lines().filter(|l| l.starts_with("| `--")) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let names: Vec<&str> = cells[1].split(" / ").collect();
            let values: Vec<&str> = cells[2].split(" / ").collect();
            if names.len() != values.len() {
                continue;
            }
            for (name, value) in names.iter().zip(values) {
                let flag = name.trim_matches('`').trim_start_matches("--");
                let Some(Some(declared)) = defaults.get(flag) else {
                    continue;
                };
                // Only a cell that starts with a value; prose describes a default in words.
                let Some(said) = value.strip_prefix('`').and_then(|v| v.split('`').next()) else {
                    continue;
                };
                assert!(
                    same(said, declared),
                    "docs/flags.md says --{flag} defaults to {said}, the table to {declared}"
                );
                checked += 1;
            }
        }
        assert!(
            checked > 30,
            "only {checked} defaults found in docs/flags.md"
        );
    }
}

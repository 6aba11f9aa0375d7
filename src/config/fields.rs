//! What a knob is to the flag and file readers ([`Field`], declared in `settings.rs`), and the raw
//! text they read into: flags and the config file both read into [`Raw`], keyed by the field
//! name, so precedence is a map merge.

use std::collections::BTreeMap;

/// How a knob's raw text is shaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One value.
    Scalar,
    /// A boolean flag: `--flag`, `--flag=true`, `--flag=false`.
    Bool,
    /// `key=value,key=value` on the command line, a string map in the file.
    Map,
    /// `a,b` on the command line (repeatable), a string list in the file.
    List,
    /// Repeatable `Key:Value` on the command line, a map of string lists in the file.
    Headers,
    /// Repeatable on the command line, entries separated by `;` (each may hold commas); a list
    /// of objects in the file (reservedMemory's `{numaNode, limits}`).
    Records,
}

/// One knob of the agent.
pub struct Field {
    /// The KubeletConfiguration field name (also the key for flag-only knobs).
    pub name: &'static str,
    /// The upstream kubelet flag name, without dashes; empty for knobs of the file only.
    pub flag: &'static str,
    /// Whether the config file may set it (some upstream knobs are flags only).
    pub in_file: bool,
    pub kind: Kind,
    pub help: &'static str,
}

/// Every other field of upstream's KubeletConfiguration (v1beta1): accepted in a config file
/// but not acted on yet, so any file written for the kubelet (kubeadm's, for one) keeps working.
/// A field set to anything but its zero value is warned about.
pub const ACCEPTED_UPSTREAM_FIELDS: &[&str] = &[
    "configMapAndSecretChangeDetectionStrategy",
    "containerLogMaxWorkers",
    "crashLoopBackOff",
    "enableContentionProfiling",
    "enableControllerAttachDetach",
    "enableDebugFlagsHandler",
    "enableDebuggingHandlers",
    "enableProfilingHandler",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "hairpinMode",
    "imageMaximumGCAge",
    "iptablesDropBit",
    "iptablesMasqueradeBit",
    "localStorageCapacityIsolation",
    "logging",
    "makeIPTablesUtilChains",
    "maxOpenFiles",
    "memoryReservationPolicy",
    "memorySwap",
    "memoryThrottlingFactor",
    "mergeDefaultEvictionSettings",
    "nodeStatusMaxImages",
    "podCIDR",
    "podsPerCore",
    "providerID",
    "rotateCertificates",
    "seccompDefault",
    "serverTLSBootstrap",
    "showHiddenMetricsForVersion",
    "singleProcessOOMKill",
    "streamingConnectionIdleTimeout",
    "tlsCipherSuites",
    "tlsCurvePreferences",
    "tlsMinVersion",
    "topologyManagerPolicyOptions",
    "tracing",
    "volumePluginDir",
    "volumeStatsAggPeriod",
];

/// Upstream decodes the file into Go structs, where a zero in a field that is not a pointer
/// cannot be told from its absence, and its defaulting then fills the field in: a file saying
/// `syncFrequency: 0s` (as kubeadm writes) means the default. These are the fields where a zero
/// is a value of its own (pointers upstream, and nodelet's own fields).
pub const ZERO_IS_A_VALUE: &[&str] = &[
    "authentication.anonymous.enabled",
    "authentication.webhook.enabled",
    "cgroupsPerQOS",
    "containerLogMaxFiles",
    "containerLogMaxWorkers",
    "containerLogMonitorInterval",
    "containerLogsDir",
    "cpuCFSQuota",
    "cpuCFSQuotaPeriod",
    "enableControllerAttachDetach",
    "enableDebugFlagsHandler",
    "enableDebuggingHandlers",
    "enableProfilingHandler",
    "enableServer",
    "enableSystemLogHandler",
    "enableSystemLogQuery",
    "eventRecordQPS",
    "failCgroupV1",
    "failSwapOn",
    "healthzPort",
    "imageGCHighThresholdPercent",
    "imageGCLowThresholdPercent",
    "iptablesDropBit",
    "iptablesMasqueradeBit",
    "kernelMemcgNotification",
    "kubeAPIQPS",
    "localStorageCapacityIsolation",
    "makeIPTablesUtilChains",
    "maxParallelImagePulls",
    "memoryThrottlingFactor",
    "mergeDefaultEvictionSettings",
    "nodeStatusMaxImages",
    "oomScoreAdj",
    "podPidsLimit",
    "registerNode",
    "registryPullQPS",
    "resolvConf",
    "seccompDefault",
    "serializeImagePulls",
    "singleProcessOOMKill",
    "staticPodURLLocalSecrets",
    "tracing",
    "userNamespaces",
];

/// One knob's raw text as given by a flag or the file, before validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RawValue {
    Scalar(String),
    List(Vec<String>),
    Map(BTreeMap<String, Vec<String>>),
}

/// Raw knobs keyed by field name. Merging is `extend`: later layers win per knob.
pub type Raw = BTreeMap<&'static str, RawValue>;

/// The field with this config-file name.
pub fn by_name(name: &str) -> Option<&'static Field> {
    super::FIELDS.iter().find(|f| f.name == name)
}

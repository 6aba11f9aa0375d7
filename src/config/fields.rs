//! The table of every knob: its KubeletConfiguration field, its upstream flag name and its help text.
//! Flags and the config file both read into [`Raw`], keyed by the field name, so precedence is a map merge.

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

const fn field(
    name: &'static str,
    flag: &'static str,
    in_file: bool,
    kind: Kind,
    help: &'static str,
) -> Field {
    Field {
        name,
        flag,
        in_file,
        kind,
        help,
    }
}

use Kind::*;

/// Every knob nodelet understands.
pub const FIELDS: &[Field] = &[
    field(
        "config",
        "config",
        false,
        Scalar,
        "Path to a KubeletConfiguration file (YAML or JSON); flags override it",
    ),
    field(
        "staticPodPath",
        "pod-manifest-path",
        true,
        Scalar,
        "Directory (or single file) of static pod manifests to run",
    ),
    field(
        "staticPodURL",
        "manifest-url",
        true,
        Scalar,
        "URL serving static pod manifests",
    ),
    field(
        "staticPodURLHeader",
        "manifest-url-header",
        true,
        Headers,
        "HTTP header 'Key:Value' sent with --manifest-url (repeatable)",
    ),
    field(
        "staticPodURLLocalSecrets",
        "manifest-url-local-secrets",
        true,
        Bool,
        "Let pods from --manifest-url use the Secrets of --pod-manifest-path (nodelet's own knob) [default false]",
    ),
    field(
        "fileCheckFrequency",
        "file-check-frequency",
        true,
        Scalar,
        "How often the manifest path is relisted besides inotify [default 20s]",
    ),
    field(
        "httpCheckFrequency",
        "http-check-frequency",
        true,
        Scalar,
        "How often --manifest-url is polled [default 20s]",
    ),
    field(
        "syncFrequency",
        "sync-frequency",
        true,
        Scalar,
        "Maximum time between resyncs of a running pod [default 1m]",
    ),
    field(
        "containerRuntimeEndpoint",
        "container-runtime-endpoint",
        true,
        Scalar,
        "CRI runtime endpoint [default unix:///run/containerd/containerd.sock]",
    ),
    field(
        "imageServiceEndpoint",
        "image-service-endpoint",
        true,
        Scalar,
        "CRI image service endpoint [default: the runtime endpoint]",
    ),
    field(
        "runtimeRequestTimeout",
        "runtime-request-timeout",
        true,
        Scalar,
        "Timeout of every CRI call but long-running ones [default 2m]",
    ),
    field(
        "rootDir",
        "root-dir",
        false,
        Scalar,
        "Directory for the agent's files (pod dirs, volumes) [default /var/lib/kubelet]",
    ),
    field(
        "podLogsDir",
        "pod-logs-dir",
        true,
        Scalar,
        "Directory of the pods' container logs [default /var/log/pods]",
    ),
    field(
        "containerLogsDir",
        "container-logs-dir",
        true,
        Scalar,
        "Directory of the per-container log symlinks [default /var/log/containers]",
    ),
    field(
        "resolvConf",
        "resolv-conf",
        true,
        Scalar,
        "Resolver configuration for pods with dnsPolicy Default [default /etc/resolv.conf]",
    ),
    field(
        "clusterDNS",
        "cluster-dns",
        true,
        List,
        "DNS servers for pods with dnsPolicy ClusterFirst (comma-separated)",
    ),
    field(
        "clusterDomain",
        "cluster-domain",
        true,
        Scalar,
        "Cluster domain, added to pods' DNS search paths",
    ),
    field(
        "allowedUnsafeSysctls",
        "allowed-unsafe-sysctls",
        true,
        List,
        "Unsafe sysctls (or prefix* patterns) pods may set",
    ),
    field(
        "hostnameOverride",
        "hostname-override",
        false,
        Scalar,
        "Node name to use instead of the hostname",
    ),
    field("nodeIP", "node-ip", false, Scalar, "IP address of the node"),
    field(
        "healthzPort",
        "healthz-port",
        true,
        Scalar,
        "Port of the healthz endpoint, 0 disables it [default 10248]",
    ),
    field(
        "healthzBindAddress",
        "healthz-bind-address",
        true,
        Scalar,
        "Address of the healthz endpoint [default 127.0.0.1]",
    ),
    field(
        "port",
        "port",
        true,
        Scalar,
        "Port of the authenticated API server [default 10250]",
    ),
    field(
        "enableServer",
        "enable-server",
        true,
        Bool,
        "Serve the authenticated API on --port [default true]",
    ),
    field(
        "tlsCertFile",
        "tls-cert-file",
        true,
        Scalar,
        "Serving certificate of --port [default: a self-signed one in <root-dir>/pki]",
    ),
    field(
        "tlsPrivateKeyFile",
        "tls-private-key-file",
        true,
        Scalar,
        "Private key of --tls-cert-file",
    ),
    field(
        "authentication.x509.clientCAFile",
        "client-ca-file",
        true,
        Scalar,
        "CA bundle that signs the client certificates --port accepts",
    ),
    field(
        "authentication.anonymous.enabled",
        "anonymous-auth",
        true,
        Bool,
        "Let requests without a client certificate in on --port [default false]",
    ),
    field(
        "authentication.webhook.enabled",
        "authentication-token-webhook",
        true,
        Bool,
        "Authenticate bearer tokens on --port with the API server's TokenReview [default: on with --kubeconfig]",
    ),
    field(
        "authentication.webhook.cacheTTL",
        "authentication-token-webhook-cache-ttl",
        true,
        Scalar,
        "How long TokenReview answers are kept [default 2m]",
    ),
    field(
        "authorization.mode",
        "authorization-mode",
        true,
        Scalar,
        "AlwaysAllow, or Webhook (SubjectAccessReview on the API server) [default: Webhook with --kubeconfig, else AlwaysAllow]",
    ),
    field(
        "authorization.webhook.cacheAuthorizedTTL",
        "authorization-webhook-cache-authorized-ttl",
        true,
        Scalar,
        "How long an allowing SubjectAccessReview answer is kept [default 5m]",
    ),
    field(
        "authorization.webhook.cacheUnauthorizedTTL",
        "authorization-webhook-cache-unauthorized-ttl",
        true,
        Scalar,
        "How long a denying SubjectAccessReview answer is kept [default 30s]",
    ),
    field(
        "readOnlyPort",
        "read-only-port",
        true,
        Scalar,
        "Port of the read-only API server, 0 disables it [default 0]",
    ),
    field(
        "address",
        "address",
        true,
        Scalar,
        "Address the API servers bind to [default 0.0.0.0]",
    ),
    field(
        "kubeconfig",
        "kubeconfig",
        false,
        Scalar,
        "kubeconfig of the API server to join (cluster mode)",
    ),
    field(
        "kubeAPIQPS",
        "kube-api-qps",
        true,
        Scalar,
        "Requests per second to the API server [default 50]",
    ),
    field(
        "kubeAPIBurst",
        "kube-api-burst",
        true,
        Scalar,
        "Requests to the API server allowed at once above kube-api-qps [default 100]",
    ),
    field(
        "contentType",
        "kube-api-content-type",
        true,
        Scalar,
        "Content type of requests to the API server; nodelet speaks JSON whatever is asked [default application/vnd.kubernetes.protobuf]",
    ),
    field(
        "eventRecordQPS",
        "event-qps",
        true,
        Scalar,
        "Events sent to the API server per second [default 50]",
    ),
    field(
        "eventBurst",
        "event-burst",
        true,
        Scalar,
        "Events sent at once above event-qps [default 100]",
    ),
    field(
        "registerNode",
        "register-node",
        true,
        Bool,
        "Register the node with the API server [default true]",
    ),
    field(
        "registerWithTaints",
        "register-with-taints",
        true,
        List,
        "Taints the node registers with (key=value:Effect,...)",
    ),
    field(
        "nodeStatusUpdateFrequency",
        "node-status-update-frequency",
        true,
        Scalar,
        "How often the node status is computed and sent when it changed [default 10s]",
    ),
    field(
        "nodeStatusReportFrequency",
        "",
        true,
        Scalar,
        "How often the node status is sent when it did not change [default 5m]",
    ),
    field(
        "userNamespaces",
        "",
        true,
        Map,
        "User namespaces of hostUsers: false pods: idsPerPod, host IDs per pod [default 65536]",
    ),
    field(
        "nodeLeaseDurationSeconds",
        "",
        true,
        Scalar,
        "Duration of the node's Lease; it is renewed every quarter of it [default 40]",
    ),
    field(
        "runOnce",
        "run-once",
        false,
        Bool,
        "Run the static pods to completion, report and exit",
    ),
    field(
        "runOnceTimeout",
        "run-once-timeout",
        false,
        Scalar,
        "How long --run-once waits for its pods [default 10m]",
    ),
    field(
        "runOnceOutput",
        "run-once-output",
        false,
        Scalar,
        "Report of --run-once: text or json (on stdout) [default text]",
    ),
    field(
        "runOnceCleanup",
        "run-once-cleanup",
        false,
        Bool,
        "Remove the pods --run-once started before exiting",
    ),
    field(
        "lockFile",
        "lock-file",
        false,
        Scalar,
        "File lock held while running",
    ),
    field(
        "exitOnLockContention",
        "exit-on-lock-contention",
        false,
        Bool,
        "Exit when another process asks for the lock file",
    ),
    field(
        "cgroupRoot",
        "cgroup-root",
        true,
        Scalar,
        "Root cgroup for pods [default /]",
    ),
    field(
        "evictionPressureTransitionPeriod",
        "eviction-pressure-transition-period",
        true,
        Scalar,
        "How long a pressure condition stays after its last breach [default 5m]",
    ),
    field(
        "enforceNodeAllocatable",
        "enforce-node-allocatable",
        true,
        List,
        "Where allocatable is enforced: pods, or none [default pods]",
    ),
    field(
        "cgroupsPerQOS",
        "cgroups-per-qos",
        true,
        Bool,
        "Create the QoS cgroup hierarchy [default true]",
    ),
    field(
        "failSwapOn",
        "fail-swap-on",
        true,
        Bool,
        "Refuse to start when swap is on [default true]",
    ),
    field(
        "cgroupDriver",
        "cgroup-driver",
        true,
        Scalar,
        "cgroupfs or systemd [default cgroupfs]",
    ),
    field(
        "maxPods",
        "max-pods",
        true,
        Scalar,
        "Number of pods the node runs at most [default 110]",
    ),
    field(
        "podPidsLimit",
        "pod-max-pids",
        true,
        Scalar,
        "Most processes in one pod, -1 for no limit [default -1]",
    ),
    field(
        "imageGCHighThresholdPercent",
        "image-gc-high-threshold",
        true,
        Scalar,
        "Image filesystem use (percent) above which image GC runs; 100 disables [default 85]",
    ),
    field(
        "imageGCLowThresholdPercent",
        "image-gc-low-threshold",
        true,
        Scalar,
        "Image filesystem use (percent) image GC brings it down to [default 80]",
    ),
    field(
        "imageMinimumGCAge",
        "minimum-image-ttl-duration",
        true,
        Scalar,
        "Least age of an unused image before GC may remove it [default 2m]",
    ),
    field(
        "serializeImagePulls",
        "serialize-image-pulls",
        true,
        Bool,
        "Pull one image at a time [default true]",
    ),
    field(
        "maxParallelImagePulls",
        "max-parallel-image-pulls",
        true,
        Scalar,
        "With serializeImagePulls false, the most pulls at once [default no limit]",
    ),
    field(
        "registryPullQPS",
        "registry-qps",
        true,
        Scalar,
        "Image pulls per second, 0 for no limit [default 5]",
    ),
    field(
        "registryBurst",
        "registry-burst",
        true,
        Scalar,
        "Pulls allowed at once above registry-qps [default 10]",
    ),
    field(
        "imageCredentialProviderConfig",
        "image-credential-provider-config",
        false,
        Scalar,
        "Credential provider plugin config (a JSON/YAML file, or a directory of them merged in name order)",
    ),
    field(
        "imageCredentialProviderBinDir",
        "image-credential-provider-bin-dir",
        false,
        Scalar,
        "Directory of the credential provider plugin executables",
    ),
    field(
        "containerLogMaxSize",
        "container-log-max-size",
        true,
        Scalar,
        "Size (quantity) at which a container's log is rotated; negative disables rotation [default 10Mi]",
    ),
    field(
        "containerLogMaxFiles",
        "container-log-max-files",
        true,
        Scalar,
        "Most log files kept per container log, the current one included; at least 2 [default 5]",
    ),
    field(
        "containerLogMonitorInterval",
        "container-log-monitor-interval",
        true,
        Scalar,
        "How often container logs are checked for rotation; at least 3s [default 10s]",
    ),
    field(
        "kubeReserved",
        "kube-reserved",
        true,
        Map,
        "Resources reserved for Kubernetes components (cpu=100m,memory=256Mi)",
    ),
    field(
        "systemReserved",
        "system-reserved",
        true,
        Map,
        "Resources reserved for the system (cpu=100m,memory=256Mi)",
    ),
    field(
        "evictionHard",
        "eviction-hard",
        true,
        Map,
        "Hard eviction thresholds (memory.available<100Mi,...)",
    ),
    field(
        "featureGates",
        "feature-gates",
        true,
        Map,
        "Feature gates (Gate=true|false,...); nodelet knows EventedPLEG [default EventedPLEG=true]",
    ),
    field(
        "nodeLabels",
        "node-labels",
        false,
        Map,
        "Labels to register the node with (key=value,...)",
    ),
    field(
        "verbosity",
        "v",
        false,
        Scalar,
        "Log verbosity (0-10) [default 0]",
    ),
    // Hidden flags for the test suite: periods shorter than a node would use, so tests need
    // not wait minutes. Never set by a user.
    field(
        "testingBackoff",
        "testing-backoff",
        false,
        Scalar,
        "Tests only: first delay of the container restart and image pull backoffs",
    ),
    field(
        "testingEvictionPeriod",
        "testing-eviction-period",
        false,
        Scalar,
        "Tests only: how often the eviction manager looks",
    ),
    field(
        "testingImageGCPeriod",
        "testing-image-gc-period",
        false,
        Scalar,
        "Tests only: how often image garbage collection runs",
    ),
    field(
        "testingLogRotationPeriod",
        "testing-log-rotation-period",
        false,
        Scalar,
        "Tests only: how often container logs are checked for rotation",
    ),
];

/// Upstream KubeletConfiguration fields nodelet accepts in a config file but does not act on yet.
/// They are warned about instead of refused, so a kubeadm-written file keeps working.
pub const ACCEPTED_UPSTREAM_FIELDS: &[&str] = &[
    "cpuManagerPolicy",
    "cpuManagerReconcilePeriod",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "logging",
    "memorySwap",
    "rotateCertificates",
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "streamingConnectionIdleTimeout",
    "volumeStatsAggPeriod",
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
    FIELDS.iter().find(|f| f.name == name)
}

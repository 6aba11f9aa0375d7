//! Prometheus metrics with the upstream kubelet's names, in the text exposition format. A leaf:
//! components record into the process-wide registry, the server renders it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::time::Duration;

/// A counter or gauge family keyed by label values.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    labels: &'static [&'static str],
    values: Mutex<BTreeMap<Vec<String>, f64>>,
}

impl Family {
    const fn new(
        name: &'static str,
        help: &'static str,
        kind: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Family {
            name,
            help,
            kind,
            labels,
            values: Mutex::new(BTreeMap::new()),
        }
    }

    fn add(&self, labels: &[&str], by: f64) {
        let mut values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        *values
            .entry(labels.iter().map(|s| s.to_string()).collect())
            .or_default() += by;
    }

    fn set(&self, labels: &[&str], to: f64) {
        let mut values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        values.insert(labels.iter().map(|s| s.to_string()).collect(), to);
    }

    /// Drops the series whose label values `gone` picks.
    fn remove(&self, gone: impl Fn(&[String]) -> bool) {
        (self.values.lock().unwrap_or_else(|e| e.into_inner())).retain(|labels, _| !gone(labels));
    }

    /// Every series at once: those not in `series` go.
    fn replace(&self, series: BTreeMap<Vec<String>, f64>) {
        *self.values.lock().unwrap_or_else(|e| e.into_inner()) = series;
    }

    fn render(&self, out: &mut String) {
        let values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        // As upstream's client: a labelled family shows only once it has a series, one
        // without labels shows zero until set.
        if values.is_empty() && !self.labels.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "# HELP {} {}\n# TYPE {} {}",
            self.name, self.help, self.name, self.kind
        );
        if values.is_empty() {
            let _ = writeln!(out, "{} 0", self.name);
        }
        for (values, v) in values.iter() {
            let _ = writeln!(
                out,
                "{}{} {}",
                self.name,
                label_text(self.labels, values, None),
                v
            );
        }
    }
}

/// A label value escaped for the text format.
pub(crate) fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn label_text(names: &[&str], values: &[String], le: Option<&str>) -> String {
    let mut parts: Vec<String> = names
        .iter()
        .zip(values)
        .map(|(n, v)| format!("{n}=\"{}\"", label_value(v)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// Upper bounds (seconds) of the duration histograms, upstream's usual buckets.
const BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The Prometheus Go client's default buckets, which upstream's server metrics use.
const GO_DEFAULT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds (seconds) of upstream's pod startup latency histograms.
const POD_STARTUP_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// Upper bounds (seconds) of upstream's storage operation histograms.
const STORAGE_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// Upper bounds (seconds) of upstream's DRA histograms: 15 exponential buckets from 0.1 to 40,
/// as Go computes them.
const DRA_BUCKETS: &[f64] = &[
    0.1,
    0.1534127404634391,
    0.23535468936502524,
    0.36106407876409946,
    0.5539182980610752,
    0.849781240983936,
    1.303672689737678,
    1.9999999999999993,
    3.0682548092687805,
    4.7070937873005025,
    7.221281575281985,
    11.078365961221499,
    16.995624819678714,
    26.07345379475354,
    39.99999999999997,
];

/// The labels of the kubelet's HTTP server metrics.
const HTTP_LABELS: &[&str] = &["method", "path", "server_type", "long_running"];

#[derive(Default, Clone)]
struct HistogramData {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// A histogram family keyed by label values.
struct Histogram {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    buckets: &'static [f64],
    /// Whether a histogram without labels shows only once observed, as upstream's histogram
    /// vectors without labels do; one with labels always waits for its first series.
    hidden_until_observed: bool,
    values: Mutex<BTreeMap<Vec<String>, HistogramData>>,
}

impl Histogram {
    /// A histogram of durations, in [`BUCKETS`].
    const fn new(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Self {
        Histogram::with_buckets(name, help, labels, BUCKETS)
    }

    const fn with_buckets(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        buckets: &'static [f64],
    ) -> Self {
        Histogram {
            name,
            help,
            labels,
            buckets,
            hidden_until_observed: false,
            values: Mutex::new(BTreeMap::new()),
        }
    }

    /// This histogram shows only once observed.
    fn hidden_until_observed(self) -> Self {
        Histogram {
            hidden_until_observed: true,
            ..self
        }
    }

    fn empty(&self) -> HistogramData {
        HistogramData {
            counts: vec![0; self.buckets.len()],
            ..Default::default()
        }
    }

    /// Drops the series whose label values `gone` picks.
    fn remove(&self, gone: impl Fn(&[String]) -> bool) {
        (self.values.lock().unwrap_or_else(|e| e.into_inner())).retain(|labels, _| !gone(labels));
    }

    fn observe(&self, labels: &[&str], value: f64) {
        let mut values = self.values.lock().unwrap_or_else(|e| e.into_inner());
        let data = values
            .entry(labels.iter().map(|s| s.to_string()).collect())
            .or_insert_with(|| self.empty());
        for (i, bound) in self.buckets.iter().enumerate() {
            if value <= *bound {
                data.counts[i] += 1;
            }
        }
        data.sum += value;
        data.count += 1;
    }

    fn render(&self, out: &mut String) {
        let mut values = self
            .values
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if values.is_empty() {
            if !self.labels.is_empty() || self.hidden_until_observed {
                return;
            }
            values.insert(Vec::new(), self.empty());
        }
        let _ = writeln!(
            out,
            "# HELP {} {}\n# TYPE {} histogram",
            self.name, self.help, self.name
        );
        for (values, data) in values.iter() {
            for (bound, count) in self.buckets.iter().zip(&data.counts) {
                let _ = writeln!(
                    out,
                    "{}_bucket{} {count}",
                    self.name,
                    label_text(self.labels, values, Some(&bound.to_string()))
                );
            }
            let _ = writeln!(
                out,
                "{}_bucket{} {}",
                self.name,
                label_text(self.labels, values, Some("+Inf")),
                data.count
            );
            let _ = writeln!(
                out,
                "{}_sum{} {}",
                self.name,
                label_text(self.labels, values, None),
                data.sum
            );
            let _ = writeln!(
                out,
                "{}_count{} {}",
                self.name,
                label_text(self.labels, values, None),
                data.count
            );
        }
    }
}

/// Every metric nodelet records.
pub struct Metrics {
    running_pods: Family,
    running_containers: Family,
    started_pods: Family,
    started_containers: Family,
    runtime_operations: Family,
    runtime_errors: Family,
    runtime_duration: Histogram,
    pleg_relist_duration: Histogram,
    pleg_relist_interval: Histogram,
    pleg_pod_relist_duration: Histogram,
    evented_pleg_connected: Family,
    evented_pleg_errors: Family,
    pod_worker_duration: Histogram,
    pod_start_duration: Histogram,
    http_requests: Family,
    evictions: Family,
    probes: Family,
    probe_duration: Histogram,
    shutdown_start: Family,
    shutdown_end: Family,
    events_dropped: Family,
    node_name: Family,
    cgroup_version: Family,
    build_info: Family,
    feature_enabled: Family,
    desired_pods: Family,
    active_pods: Family,
    working_pods: Family,
    mirror_pods: Family,
    orphaned_runtime_pods: Family,
    pleg_last_seen: Family,
    pleg_discard_events: Family,
    run_podsandbox_duration: Histogram,
    started_pods_errors: Family,
    started_userns_pods: Family,
    started_userns_pods_errors: Family,
    containers_per_pod: Histogram,
    pod_worker_start_duration: Histogram,
    managed_ephemeral_containers: Family,
    terminated_containers: Family,
    sleep_terminated_early: Family,
    http_fallbacks: Family,
    cgroup_manager_duration: Histogram,
    restarted_pods: Family,
    evented_pleg_latency: Histogram,
    in_progress_resizes: Family,
    http_inflight: Family,
    http_duration: Histogram,
    ensure_image_requests: Family,
    image_volumes_requested: Family,
    image_volumes_mounted: Family,
    image_volume_errors: Family,
    pod_status_sync_duration: Histogram,
    metrics_provider: Family,
    volume_stats_duration: Histogram,
    node_startup: Mutex<NodeStartup>,
    startup_pre_agent: Family,
    startup_pre_registration: Family,
    startup_registration: Family,
    startup_post_registration: Family,
    startup_total: Family,
    cpu_pinning_requests: Family,
    cpu_pinning_errors: Family,
    cpu_shared_pool: Family,
    cpu_exclusive: Family,
    cpu_per_numa: Family,
    memory_pinning_requests: Family,
    memory_pinning_errors: Family,
    aligned: Family,
    aligned_failures: Family,
    topology_requests: Family,
    topology_errors: Family,
    topology_duration: Histogram,
    container_log_used: Family,
    orphan_pods_cleaned: Family,
    orphan_pods_failed: Family,
    storage_operation_duration: Histogram,
    volume_operation_total: Histogram,
    volume_manager_volumes: Family,
    reconstructed_volumes: Family,
    reconstructed_volume_errors: Family,
    force_cleaned_volumes: Family,
    force_cleaned_volume_errors: Family,
    pod_start_sli: Histogram,
    pod_start_total: Histogram,
    first_network_pod_start: Family,
    pull_intents_on_disk: Family,
    pulled_records_on_disk: Family,
    pull_intents_in_memory: Family,
    pulled_records_in_memory: Family,
    mustpull_checks: Family,
    dra_operations: Histogram,
    dra_grpc: Histogram,
    dra_claims_in_use: Family,
}

/// When the node first tried to register, first registered as a new Node and was first
/// reported Ready (unix seconds): upstream's node startup latency tracker.
#[derive(Default)]
struct NodeStartup {
    attempt: Option<f64>,
    registered: Option<f64>,
    ready: Option<f64>,
}

/// A step of the node's startup in cluster mode.
pub enum StartupStep {
    /// A registration is tried.
    Registering,
    /// The Node was created (not found from an earlier run).
    RegisteredNew,
    /// A status update left the Node Ready.
    Ready,
}

/// The labels of `kubernetes_build_info`, as upstream's.
const BUILD_INFO_LABELS: &[&str] = &[
    "build_date",
    "compiler",
    "git_commit",
    "git_tree_state",
    "git_version",
    "go_version",
    "major",
    "minor",
    "platform",
];

/// The process-wide registry. Its body is one declaration per family (name, help, type,
/// labels), kept together as a table rather than cut into functions.
pub fn get() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| Metrics {
        running_pods: Family::new(
            "kubelet_running_pods",
            "Number of pods that have a running pod sandbox",
            "gauge",
            &[],
        ),
        running_containers: Family::new(
            "kubelet_running_containers",
            "Number of containers currently running",
            "gauge",
            &["container_state"],
        ),
        started_pods: Family::new(
            "kubelet_started_pods_total",
            "Cumulative number of pods started",
            "counter",
            &[],
        ),
        started_containers: Family::new(
            "kubelet_started_containers_total",
            "Cumulative number of containers started",
            "counter",
            &["container_type"],
        ),
        evictions: Family::new(
            "kubelet_evictions",
            "Cumulative number of pod evictions by eviction signal",
            "counter",
            &["eviction_signal"],
        ),
        runtime_operations: Family::new(
            "kubelet_runtime_operations_total",
            "Cumulative number of runtime operations by operation type.",
            "counter",
            &["operation_type"],
        ),
        runtime_errors: Family::new(
            "kubelet_runtime_operations_errors_total",
            "Cumulative number of runtime operation errors by operation type.",
            "counter",
            &["operation_type"],
        ),
        runtime_duration: Histogram::new(
            "kubelet_runtime_operations_duration_seconds",
            "Duration in seconds of runtime operations. Broken down by operation type.",
            &["operation_type"],
        ),
        pleg_relist_duration: Histogram::new(
            "kubelet_pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG.",
            &[],
        ),
        pleg_relist_interval: Histogram::new(
            "kubelet_pleg_relist_interval_seconds",
            "Interval in seconds between relisting in PLEG.",
            &[],
        ),
        pleg_pod_relist_duration: Histogram::new(
            "kubelet_pleg_pod_relist_duration_seconds",
            "Duration in seconds for relisting a single pod in PLEG.",
            &[],
        ),
        evented_pleg_connected: Family::new(
            "kubelet_evented_pleg_connection_success_count",
            "The number of times a streaming client was obtained to receive CRI Events.",
            "counter",
            &[],
        ),
        evented_pleg_errors: Family::new(
            "kubelet_evented_pleg_connection_error_count",
            "The number of errors encountered during the establishment of streaming connection with the CRI runtime.",
            "counter",
            &[],
        ),
        pod_worker_duration: Histogram::new(
            "kubelet_pod_worker_duration_seconds",
            "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
            &["operation_type"],
        ),
        pod_start_duration: Histogram::new(
            "kubelet_pod_start_duration_seconds",
            "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            &[],
        ),
        http_requests: Family::new(
            "kubelet_http_requests_total",
            "Number of the http requests received since the server started",
            "counter",
            HTTP_LABELS,
        ),
        http_inflight: Family::new(
            "kubelet_http_inflight_requests",
            "Number of the inflight http requests",
            "gauge",
            HTTP_LABELS,
        ),
        http_duration: Histogram::with_buckets(
            "kubelet_http_requests_duration_seconds",
            "Duration in seconds to serve http requests",
            HTTP_LABELS,
            GO_DEFAULT_BUCKETS,
        ),
        ensure_image_requests: Family::new(
            "kubelet_image_manager_ensure_image_requests_total",
            "Number of ensure-image requests processed by the kubelet.",
            "counter",
            &["pull_policy", "present_locally", "pull_required"],
        ),
        image_volumes_requested: Family::new(
            "kubelet_image_volume_requested_total",
            "Number of requested image volumes.",
            "counter",
            &[],
        ),
        image_volumes_mounted: Family::new(
            "kubelet_image_volume_mounted_succeed_total",
            "Number of successful image volume mounts.",
            "counter",
            &[],
        ),
        image_volume_errors: Family::new(
            "kubelet_image_volume_mounted_errors_total",
            "Number of failed image volume mounts.",
            "counter",
            &[],
        ),
        pod_status_sync_duration: Histogram::with_buckets(
            "kubelet_pod_status_sync_duration_seconds",
            "Duration in seconds to sync a pod status update. Measures time from detection of a change to pod status until the API is successfully updated for that pod, even if multiple intevening changes to pod status occur.",
            &[],
            &[0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0],
        ),
        metrics_provider: Family::new(
            "kubelet_metrics_provider",
            "Metrics provider used by kubelet to collect container stats. Values can be 'cadvisor' and 'cri'",
            "gauge",
            &["provider"],
        ),
        volume_stats_duration: Histogram::with_buckets(
            "kubelet_volume_metric_collection_duration_seconds",
            "Duration in seconds to calculate volume stats",
            &["metric_source"],
            GO_DEFAULT_BUCKETS,
        ),
        node_startup: Mutex::new(NodeStartup {
            attempt: None,
            registered: None,
            ready: None,
        }),
        startup_pre_agent: Family::new(
            "kubelet_node_startup_pre_kubelet_duration_seconds",
            "Duration in seconds of node startup before kubelet starts.",
            "gauge",
            &[],
        ),
        startup_pre_registration: Family::new(
            "kubelet_node_startup_pre_registration_duration_seconds",
            "Duration in seconds of node startup before registration.",
            "gauge",
            &[],
        ),
        startup_registration: Family::new(
            "kubelet_node_startup_registration_duration_seconds",
            "Duration in seconds of node startup during registration.",
            "gauge",
            &[],
        ),
        startup_post_registration: Family::new(
            "kubelet_node_startup_post_registration_duration_seconds",
            "Duration in seconds of node startup after registration.",
            "gauge",
            &[],
        ),
        startup_total: Family::new(
            "kubelet_node_startup_duration_seconds",
            "Duration in seconds of node startup in total.",
            "gauge",
            &[],
        ),
        probes: Family::new(
            "prober_probe_total",
            "Cumulative number of a liveness, readiness or startup probe for a container by result.",
            "counter",
            &[
                "probe_type",
                "result",
                "container",
                "pod",
                "namespace",
                "pod_uid",
            ],
        ),
        events_dropped: Family::new(
            "nodelet_events_dropped_total",
            "Events lost on the way by reason: store_full (pushed out of the store before the API server had them), refused (by the API server), journal (not written to the event journal)",
            "counter",
            &["reason"],
        ),
        shutdown_start: Family::new(
            "kubelet_graceful_shutdown_start_time_seconds",
            "Last graceful shutdown start time since unix epoch in seconds",
            "gauge",
            &[],
        ),
        shutdown_end: Family::new(
            "kubelet_graceful_shutdown_end_time_seconds",
            "Last graceful shutdown end time since unix epoch in seconds",
            "gauge",
            &[],
        ),
        probe_duration: Histogram::new(
            "prober_probe_duration_seconds",
            "Duration in seconds for a probe response.",
            &["probe_type", "container", "pod", "namespace"],
        ),
        node_name: Family::new(
            "kubelet_node_name",
            "The node's name. The count is always 1.",
            "gauge",
            &["node"],
        ),
        cgroup_version: Family::new(
            "kubelet_cgroup_version",
            "cgroup version on the hosts.",
            "gauge",
            &[],
        ),
        build_info: Family::new(
            "kubernetes_build_info",
            "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
            "gauge",
            BUILD_INFO_LABELS,
        ),
        feature_enabled: Family::new(
            "kubernetes_feature_enabled",
            "This metric records the data about the stage and enablement of a k8s feature.",
            "gauge",
            &["name", "stage"],
        ),
        desired_pods: Family::new(
            "kubelet_desired_pods",
            "The number of pods the kubelet is being instructed to run. static is true if the pod is not from the apiserver.",
            "gauge",
            &["static"],
        ),
        active_pods: Family::new(
            "kubelet_active_pods",
            "The number of pods the kubelet considers active and which are being considered when admitting new pods. static is true if the pod is not from the apiserver.",
            "gauge",
            &["static"],
        ),
        working_pods: Family::new(
            "kubelet_working_pods",
            "Number of pods the kubelet is actually running, broken down by lifecycle phase, whether the pod is desired, orphaned, or runtime only (also orphaned), and whether the pod is static. An orphaned pod has been removed from local configuration or force deleted in the API and consumes resources that are not otherwise visible.",
            "gauge",
            &["lifecycle", "config", "static"],
        ),
        mirror_pods: Family::new(
            "kubelet_mirror_pods",
            "The number of mirror pods the kubelet will try to create (one per admitted static pod)",
            "gauge",
            &[],
        ),
        orphaned_runtime_pods: Family::new(
            "kubelet_orphaned_runtime_pods_total",
            "Number of pods that have been detected in the container runtime without being already known to the pod worker. This typically indicates the kubelet was restarted while a pod was force deleted in the API or in the local configuration, which is unusual.",
            "counter",
            &[],
        ),
        pleg_last_seen: Family::new(
            "kubelet_pleg_last_seen_seconds",
            "Timestamp in seconds when PLEG was last seen active.",
            "gauge",
            &[],
        ),
        pleg_discard_events: Family::new(
            "kubelet_pleg_discard_events",
            "The number of discard events in PLEG.",
            "counter",
            &[],
        ),
        run_podsandbox_duration: Histogram::new(
            "kubelet_run_podsandbox_duration_seconds",
            "Duration in seconds of the run_podsandbox operations. Broken down by RuntimeClass.Handler.",
            &["runtime_handler"],
        ),
        started_pods_errors: Family::new(
            "kubelet_started_pods_errors_total",
            "Cumulative number of errors when starting pods",
            "counter",
            &[],
        ),
        started_userns_pods: Family::new(
            "kubelet_started_user_namespaced_pods_total",
            "Cumulative number of pods with user namespaces started. This metric will only be collected on Linux.",
            "counter",
            &[],
        ),
        started_userns_pods_errors: Family::new(
            "kubelet_started_user_namespaced_pods_errors_total",
            "Cumulative number of errors when starting pods with user namespaces. This metric will only be collected on Linux.",
            "counter",
            &[],
        ),
        containers_per_pod: Histogram::with_buckets(
            "kubelet_containers_per_pod_count",
            "The number of containers per pod.",
            &[],
            &[1.0, 2.0, 4.0, 8.0, 16.0],
        ),
        pod_worker_start_duration: Histogram::new(
            "kubelet_pod_worker_start_duration_seconds",
            "Duration in seconds from kubelet seeing a pod to starting a worker.",
            &[],
        ),
        managed_ephemeral_containers: Family::new(
            "kubelet_managed_ephemeral_containers",
            "Current number of ephemeral containers in pods managed by this kubelet.",
            "gauge",
            &[],
        ),
        terminated_containers: Family::new(
            "kubelet_terminated_containers_total",
            "Cumulative number of container terminations.",
            "counter",
            &["container_type", "exit_code", "reason"],
        ),
        sleep_terminated_early: Family::new(
            "kubelet_sleep_action_terminated_early_total",
            "The number of times lifecycle sleep handler got terminated before it finishes",
            "counter",
            &[],
        ),
        // nodelet's httpGet handlers never fall back from https to http: this stays zero.
        http_fallbacks: Family::new(
            "kubelet_lifecycle_handler_http_fallbacks_total",
            "The number of times lifecycle handlers successfully fell back to http from https.",
            "counter",
            &[],
        ),
        cgroup_manager_duration: Histogram::new(
            "kubelet_cgroup_manager_duration_seconds",
            "Duration in seconds for cgroup manager operations. Broken down by method.",
            &["operation_type"],
        ),
        evented_pleg_latency: Histogram::new(
            "kubelet_evented_pleg_connection_latency_seconds",
            "The latency of streaming connection with the CRI runtime, measured in seconds.",
            &[],
        ),
        in_progress_resizes: Family::new(
            "kubelet_pod_in_progress_resizes",
            "Number of in-progress resizes for pods.",
            "gauge",
            &[],
        ),
        cpu_pinning_requests: Family::new(
            "kubelet_cpu_manager_pinning_requests_total",
            "The number of cpu core allocations which required pinning.",
            "counter",
            &[],
        ),
        cpu_pinning_errors: Family::new(
            "kubelet_cpu_manager_pinning_errors_total",
            "The number of cpu core allocations which required pinning failed.",
            "counter",
            &[],
        ),
        cpu_shared_pool: Family::new(
            "kubelet_cpu_manager_shared_pool_size_millicores",
            "The size of the shared CPU pool for non-guaranteed QoS pods, in millicores.",
            "gauge",
            &[],
        ),
        cpu_exclusive: Family::new(
            "kubelet_cpu_manager_exclusive_cpu_allocation_count",
            "The total number of CPUs exclusively allocated to containers running on this node",
            "gauge",
            &[],
        ),
        cpu_per_numa: Family::new(
            "kubelet_cpu_manager_allocation_per_numa",
            "Number of CPUs allocated per NUMA node",
            "gauge",
            &["numa_node"],
        ),
        memory_pinning_requests: Family::new(
            "kubelet_memory_manager_pinning_requests_total",
            "The number of memory pages allocations which required pinning.",
            "counter",
            &[],
        ),
        memory_pinning_errors: Family::new(
            "kubelet_memory_manager_pinning_errors_total",
            "The number of memory pages allocations which required pinning that failed.",
            "counter",
            &[],
        ),
        aligned: Family::new(
            "kubelet_container_aligned_compute_resources_count",
            "Cumulative number of aligned compute resources allocated to containers by alignment type.",
            "counter",
            &["scope", "boundary"],
        ),
        aligned_failures: Family::new(
            "kubelet_container_aligned_compute_resources_failure_count",
            "Cumulative number of failures to allocate aligned compute resources to containers by alignment type.",
            "counter",
            &["scope", "boundary"],
        ),
        topology_requests: Family::new(
            "kubelet_topology_manager_admission_requests_total",
            "The number of admission requests where resources have to be aligned.",
            "counter",
            &[],
        ),
        topology_errors: Family::new(
            "kubelet_topology_manager_admission_errors_total",
            "The number of admission request failures where resources could not be aligned.",
            "counter",
            &[],
        ),
        // Milliseconds, upstream's exponential buckets from 0.05 by doubling.
        topology_duration: Histogram::with_buckets(
            "kubelet_topology_manager_admission_duration_ms",
            "Duration in milliseconds to serve a pod admission request.",
            &[],
            &[
                0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 51.2, 102.4, 204.8, 409.6,
                819.2,
            ],
        ),
        container_log_used: Family::new(
            "kubelet_container_log_filesystem_used_bytes",
            "Bytes used by the container's logs on the filesystem.",
            "gauge",
            &["uid", "namespace", "pod", "container"],
        ),
        orphan_pods_cleaned: Family::new(
            "kubelet_orphan_pod_cleaned_volumes",
            "The total number of orphaned Pods whose volumes were cleaned in the last periodic sweep.",
            "gauge",
            &[],
        ),
        orphan_pods_failed: Family::new(
            "kubelet_orphan_pod_cleaned_volumes_errors",
            "The number of orphaned Pods whose volumes failed to be cleaned in the last periodic sweep.",
            "gauge",
            &[],
        ),
        restarted_pods: Family::new(
            "kubelet_restarted_pods_total",
            "Number of pods that have been restarted because they were deleted and recreated with the same UID while the kubelet was watching them (common for static pods, extremely uncommon for API pods)",
            "counter",
            &["static"],
        ),
        storage_operation_duration: Histogram::with_buckets(
            "storage_operation_duration_seconds",
            "Storage operation duration",
            &["volume_plugin", "operation_name", "status", "migrated"],
            STORAGE_BUCKETS,
        ),
        volume_operation_total: Histogram::with_buckets(
            "volume_operation_total_seconds",
            "Storage operation end to end duration in seconds",
            &["plugin_name", "operation_name"],
            STORAGE_BUCKETS,
        ),
        volume_manager_volumes: Family::new(
            "volume_manager_total_volumes",
            "Number of volumes in Volume Manager",
            "gauge",
            &["plugin_name", "state"],
        ),
        reconstructed_volumes: Family::new(
            "reconstruct_volume_operations_total",
            "The number of volumes that were attempted to be reconstructed from the operating system during kubelet startup. This includes both successful and failed reconstruction.",
            "counter",
            &[],
        ),
        reconstructed_volume_errors: Family::new(
            "reconstruct_volume_operations_errors_total",
            "The number of volumes that failed reconstruction from the operating system during kubelet startup.",
            "counter",
            &[],
        ),
        force_cleaned_volumes: Family::new(
            "force_cleaned_failed_volume_operations_total",
            "The number of volumes that were force cleaned after their reconstruction failed during kubelet startup. This includes both successful and failed cleanups.",
            "counter",
            &[],
        ),
        force_cleaned_volume_errors: Family::new(
            "force_cleaned_failed_volume_operation_errors_total",
            "The number of volumes that failed force cleanup after their reconstruction failed during kubelet startup.",
            "counter",
            &[],
        ),
        pod_start_sli: Histogram::with_buckets(
            "kubelet_pod_start_sli_duration_seconds",
            "Duration in seconds to start a pod, excluding time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch",
            &[],
            POD_STARTUP_BUCKETS,
        )
        .hidden_until_observed(),
        pod_start_total: Histogram::with_buckets(
            "kubelet_pod_start_total_duration_seconds",
            "Duration in seconds to start a pod since creation, including time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch",
            &[],
            POD_STARTUP_BUCKETS,
        )
        .hidden_until_observed(),
        first_network_pod_start: Family::new(
            "kubelet_first_network_pod_start_sli_duration_seconds",
            "Duration in seconds to start the first network pod, excluding time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch",
            "gauge",
            &[],
        ),
        pull_intents_on_disk: Family::new(
            "kubelet_imagemanager_ondisk_pullintents",
            "Number of ImagePullIntents stored on disk.",
            "gauge",
            &[],
        ),
        pulled_records_on_disk: Family::new(
            "kubelet_imagemanager_ondisk_pulledrecords",
            "Number of ImagePulledRecords stored on disk.",
            "gauge",
            &[],
        ),
        pull_intents_in_memory: Family::new(
            "kubelet_imagemanager_inmemory_pullintents_usage_percent",
            "The ImagePullIntents in-memory cache usage in percent.",
            "gauge",
            &[],
        ),
        pulled_records_in_memory: Family::new(
            "kubelet_imagemanager_inmemory_pulledrecords_usage_percent",
            "The ImagePulledRecords in-memory cache usage in percent.",
            "gauge",
            &[],
        ),
        mustpull_checks: Family::new(
            "kubelet_imagemanager_image_mustpull_checks_total",
            "Counter for how many times kubelet checked whether credentials need to be re-verified to access an image",
            "counter",
            &["result"],
        ),
        dra_operations: Histogram::with_buckets(
            "dra_operations_duration_seconds",
            "Latency histogram in seconds for the duration of handling all ResourceClaims referenced by a pod when the pod starts or stops. Identified by the name of the operation (PrepareResources or UnprepareResources) and separated by the success of the operation. The number of failed operations is provided through the histogram's overall count.",
            &["operation_name", "is_error"],
            DRA_BUCKETS,
        ),
        dra_grpc: Histogram::with_buckets(
            "dra_grpc_operations_duration_seconds",
            "Duration in seconds of the DRA gRPC operations",
            &["driver_name", "method_name", "grpc_status_code"],
            DRA_BUCKETS,
        ),
        dra_claims_in_use: Family::new(
            "dra_resource_claims_in_use",
            "The number of ResourceClaims that are currently in use on the node, by driver name (driver_name label value) and across all drivers (special value <any> for driver_name). Note that the sum of all by-driver counts is not the total number of in-use ResourceClaims because the same ResourceClaim might use devices from different drivers. Instead, use the count for the <any> driver_name.",
            "gauge",
            &["driver_name"],
        ),
    })
}

/// How many pods are in each state, for the pod count gauges: each (API pods, static pods).
pub struct PodCounts {
    pub desired: (usize, usize),
    pub active: (usize, usize),
    /// Pod workers by (lifecycle, config, static), upstream's label values.
    pub working: BTreeMap<(&'static str, &'static str, &'static str), usize>,
    /// Ephemeral containers in the pods the sources want.
    pub ephemeral_containers: usize,
    /// Pods whose resize is in progress.
    pub in_progress_resizes: usize,
}

/// One probe run, for /metrics/probes.
pub struct ProbeRun<'a> {
    /// Liveness, Readiness or Startup.
    pub probe_type: &'a str,
    pub success: bool,
    pub container: &'a str,
    pub pod: &'a str,
    pub namespace: &'a str,
    pub pod_uid: &'a str,
    pub took: Duration,
}

impl Metrics {
    /// A CRI call finished.
    pub fn runtime_operation(&self, operation: &str, took: Duration, failed: bool) {
        self.runtime_operations.add(&[operation], 1.0);
        self.runtime_duration
            .observe(&[operation], took.as_secs_f64());
        if failed {
            self.runtime_errors.add(&[operation], 1.0);
        }
    }

    pub fn pleg_relist(&self, took: Duration, since_last: Option<Duration>) {
        self.pleg_relist_duration.observe(&[], took.as_secs_f64());
        self.pleg_seen();
        if let Some(interval) = since_last {
            self.pleg_relist_interval
                .observe(&[], interval.as_secs_f64());
        }
    }

    /// One pod listed on its own (its sync could not start from the PLEG's reading).
    pub fn pleg_pod_relist(&self, took: Duration) {
        self.pleg_pod_relist_duration
            .observe(&[], took.as_secs_f64());
    }

    /// The PLEG is alive: it relisted, or an event came.
    pub fn pleg_seen(&self) {
        self.pleg_last_seen.set(&[], unix_now().floor());
    }

    /// A step of the node's startup; each is recorded the first time only, and the durations
    /// are set once the steps before are known, as upstream's tracker sets them.
    pub fn node_startup(&self, step: StartupStep) {
        let now = unix_now();
        let mut startup = self.node_startup.lock().unwrap_or_else(|e| e.into_inner());
        // The process's start and the boot time, when /proc tells them (read only by the steps
        // that set a gauge, once each).
        let process = || SelfStat::read().filter(|p| p.boot > 0.0);
        match step {
            StartupStep::Registering => {
                startup.attempt.get_or_insert(now);
            }
            StartupStep::RegisteredNew => {
                let Some(attempt) = startup.attempt.filter(|_| startup.registered.is_none()) else {
                    return;
                };
                startup.registered = Some(now);
                if let Some(p) = process() {
                    self.startup_pre_agent.set(&[], p.start - p.boot);
                    self.startup_pre_registration.set(&[], attempt - p.start);
                }
                self.startup_registration.set(&[], now - attempt);
            }
            StartupStep::Ready => {
                let Some(registered) = startup.registered.filter(|_| startup.ready.is_none())
                else {
                    return;
                };
                startup.ready = Some(now);
                self.startup_post_registration.set(&[], now - registered);
                if let Some(p) = process() {
                    self.startup_total.set(&[], now - p.boot);
                }
            }
        }
    }

    /// The runtime ran a pod sandbox with `handler` (empty: the default), or failed to; for a
    /// pod in a user namespace of its own or not.
    pub fn sandbox_run(&self, handler: &str, took: Duration, userns: bool, failed: bool) {
        self.run_podsandbox_duration
            .observe(&[handler], took.as_secs_f64());
        if failed {
            self.started_pods_errors.add(&[], 1.0);
        }
        if userns {
            self.started_userns_pods.add(&[], 1.0);
            if failed {
                self.started_userns_pods_errors.add(&[], 1.0);
            }
        }
    }

    /// A pod worker started for a new pod of `containers` containers, `since_seen` after the
    /// agent first saw the pod (when known).
    pub fn pod_worker_started(&self, containers: usize, since_seen: Option<Duration>) {
        self.containers_per_pod.observe(&[], containers as f64);
        if let Some(took) = since_seen {
            self.pod_worker_start_duration
                .observe(&[], took.as_secs_f64());
        }
    }

    /// A container's status turned terminated ("container", "init_container" or
    /// "ephemeral_container").
    pub fn container_terminated(&self, container_type: &str, exit_code: i32, reason: &str) {
        self.terminated_containers
            .add(&[container_type, &exit_code.to_string(), reason], 1.0);
    }

    /// A sleep hook was cut short by its grace period.
    pub fn sleep_terminated_early(&self) {
        self.sleep_terminated_early.add(&[], 1.0);
    }

    /// A container event came from the runtime, made at `created_ns` (unix nanoseconds): how
    /// long it took to arrive, and the PLEG is alive.
    pub fn container_event(&self, created_ns: i64) {
        let took = (unix_now() - created_ns as f64 / 1e9).max(0.0);
        self.evented_pleg_latency.observe(&[], took);
        self.pleg_seen();
    }

    /// A pod re-added with the same UID restarted once its termination finished.
    pub fn pod_restarted(&self, statics: bool) {
        self.restarted_pods
            .add(&[if statics { "true" } else { "" }], 1.0);
    }

    /// A cgroup operation ("create", "update" or "destroy") took `took`.
    pub fn cgroup_operation(&self, operation: &str, took: Duration) {
        self.cgroup_manager_duration
            .observe(&[operation], took.as_secs_f64());
    }

    /// The container event stream opened (`true`) or failed to open or broke (`false`).
    pub fn evented_pleg(&self, connected: bool) {
        if connected {
            self.evented_pleg_connected.add(&[], 1.0);
        } else {
            self.evented_pleg_errors.add(&[], 1.0);
        }
    }

    /// A pod worker finished one sync ("sync") or termination ("terminate").
    pub fn pod_worker(&self, operation: &str, took: Duration) {
        self.pod_worker_duration
            .observe(&[operation], took.as_secs_f64());
    }

    pub fn pod_started(&self, since_seen: Duration) {
        self.started_pods.add(&[], 1.0);
        self.pod_start_duration
            .observe(&[], since_seen.as_secs_f64());
    }

    pub fn container_started(&self, init: bool) {
        self.started_containers
            .add(&[if init { "init_container" } else { "container" }], 1.0);
    }

    /// The runtime was asked to create a container that mounts image volumes: `requested`
    /// of them, in `mounts` volume mounts, which the runtime `failed` to mount (its error says
    /// ImageVolumeMountFailed) or not, as upstream counts them.
    pub fn image_volumes(&self, requested: usize, mounts: usize, failed: bool) {
        self.image_volumes_requested.add(&[], requested as f64);
        let outcome = if failed {
            &self.image_volume_errors
        } else {
            &self.image_volumes_mounted
        };
        outcome.add(&[], mounts as f64);
    }

    /// A pod was evicted for `signal` (memory.available, nodefs.available...).
    pub fn eviction(&self, signal: &str) {
        self.evictions.add(&[signal], 1.0);
    }

    /// An event was lost for `reason`.
    pub fn event_dropped(&self, reason: &str) {
        self.events_dropped.add(&[reason], 1.0);
    }

    /// The last graceful node shutdown's start and end (unix seconds; 0: none).
    pub fn graceful_shutdown(&self, start: f64, end: f64) {
        self.shutdown_start.set(&[], start);
        self.shutdown_end.set(&[], end);
    }

    /// A request reached a server: `labels` are its method, path bucket, server type and
    /// whether it is long-running, upstream's labels. The request is in flight until
    /// [`Metrics::http_served`].
    pub fn http_request(&self, labels: &[&str; 4]) {
        self.http_requests.add(labels, 1.0);
        self.http_inflight.add(labels, 1.0);
    }

    /// A request [`Metrics::http_request`] counted was served (or given up), after `took`.
    pub fn http_served(&self, labels: &[&str; 4], took: Duration) {
        self.http_inflight.add(labels, -1.0);
        self.http_duration.observe(labels, took.as_secs_f64());
    }

    /// A container's image was ensured under `policy`: whether it was present and whether it
    /// had to be pulled, where known.
    pub fn ensure_image_request(&self, policy: &str, present: Option<bool>, pull: Option<bool>) {
        let text = |known: Option<bool>| match known {
            Some(true) => "true",
            Some(false) => "false",
            None => "unknown",
        };
        self.ensure_image_requests
            .add(&[&policy.to_lowercase(), text(present), text(pull)], 1.0);
    }

    /// A pod's status reached the API server, `took` after the first change it carries.
    pub fn pod_status_synced(&self, took: Duration) {
        self.pod_status_sync_duration
            .observe(&[], took.as_secs_f64());
    }

    /// A container's exclusive CPUs were asked of the CPU manager (and refused when `failed`).
    pub fn cpu_pinning(&self, failed: bool) {
        self.cpu_pinning_requests.add(&[], 1.0);
        if failed {
            self.cpu_pinning_errors.add(&[], 1.0);
        }
    }

    /// A container's NUMA-pinned memory was asked of the memory manager (and refused when
    /// `failed`).
    pub fn memory_pinning(&self, failed: bool) {
        self.memory_pinning_requests.add(&[], 1.0);
        if failed {
            self.memory_pinning_errors.add(&[], 1.0);
        }
    }

    /// A pod's resource claims were prepared or unprepared (`operation`), or could not be.
    pub fn dra_operation(&self, operation: &str, took: Duration, failed: bool) {
        let failed = if failed { "true" } else { "false" };
        self.dra_operations
            .observe(&[operation, failed], took.as_secs_f64());
    }

    /// A DRA driver answered `method` (its full gRPC path) with `code`.
    pub fn dra_grpc(&self, driver: &str, method: &str, code: &str, took: Duration) {
        self.dra_grpc
            .observe(&[driver, method, code], took.as_secs_f64());
    }

    /// The resource claims prepared on the node, by driver and in all (`<any>`).
    pub fn dra_claims_in_use(&self, counts: &BTreeMap<String, usize>) {
        let series = counts.iter().map(|(d, n)| (vec![d.clone()], *n as f64));
        self.dra_claims_in_use.replace(series.collect());
    }

    /// The static CPU manager's pools: the CPUs shared by every container without exclusive
    /// ones, and the exclusive ones in all and by NUMA node.
    pub fn cpu_pools(&self, shared: usize, exclusive_by_node: &BTreeMap<u32, usize>) {
        self.cpu_shared_pool.set(&[], (shared * 1000) as f64);
        let exclusive: usize = exclusive_by_node.values().sum();
        self.cpu_exclusive.set(&[], exclusive as f64);
        for (node, n) in exclusive_by_node {
            self.cpu_per_numa.set(&[&node.to_string()], *n as f64);
        }
    }

    /// A container's or pod's (`scope`) resources were aligned along `boundary`, or could not
    /// be (`aligned` false).
    pub fn alignment(&self, scope: &str, boundary: &str, aligned: bool) {
        let family = if aligned {
            &self.aligned
        } else {
            &self.aligned_failures
        };
        family.add(&[scope, boundary], 1.0);
    }

    /// Shows the alignment series a manager may count, at zero until it does, as upstream's
    /// managers declare them when they start (the failures too when `failures`).
    pub fn declare_alignment(&self, scope: &str, boundary: &str, failures: bool) {
        self.aligned.add(&[scope, boundary], 0.0);
        if failures {
            self.aligned_failures.add(&[scope, boundary], 0.0);
        }
    }

    /// The topology manager served a pod's admission in `took`, refusing it when `failed`.
    pub fn topology_admission(&self, took: Duration, failed: bool) {
        self.topology_requests.add(&[], 1.0);
        if failed {
            self.topology_errors.add(&[], 1.0);
        }
        self.topology_duration.observe(&[], took.as_millis() as f64);
    }

    /// What each container's logs use now, by (uid, namespace, pod, container), in bytes.
    pub fn set_log_usage(&self, usage: Vec<([String; 4], u64)>) {
        let series = usage
            .into_iter()
            .map(|(labels, bytes)| (labels.into(), bytes as f64))
            .collect();
        self.container_log_used.replace(series);
    }

    /// A sweep of orphaned pod directories found `found` and could not remove `failed` of them.
    pub fn orphan_pod_dirs(&self, found: usize, failed: usize) {
        self.orphan_pods_cleaned.set(&[], found as f64);
        self.orphan_pods_failed.set(&[], failed as f64);
    }

    /// An API pod was seen started on the watch, `total` seconds after its creation; `sli` is
    /// that without its image pulls and init containers, unless it is a stateful pod; the
    /// first pod on the pod network to start sets the network's figure.
    pub fn pod_start_observed(&self, total: f64, sli: Option<f64>, first_network: bool) {
        self.pod_start_total.observe(&[], total);
        if let Some(sli) = sli {
            self.pod_start_sli.observe(&[], sli);
            if first_network {
                self.first_network_pod_start.set(&[], sli);
            }
        }
    }

    /// Whether a pod had to show its credentials for an image on the node was decided, with
    /// upstream's result (`credentialPolicyAllowed`, `credentialRecordFound`,
    /// `mustAuthenticate`).
    pub fn image_mustpull_check(&self, result: &str) {
        self.mustpull_checks.add(&[result], 1.0);
    }

    /// The image pull records: (intents, pulled records) on the disk, and how full the
    /// in-memory caches of each are, in percent.
    pub fn image_pull_records(&self, on_disk: (usize, usize), in_memory: (f64, f64)) {
        self.pull_intents_on_disk.set(&[], on_disk.0 as f64);
        self.pulled_records_on_disk.set(&[], on_disk.1 as f64);
        self.pull_intents_in_memory.set(&[], in_memory.0);
        self.pulled_records_in_memory.set(&[], in_memory.1);
    }

    /// A volume operation (`volume_mount`, `volume_unmount`...) of a volume of `plugin`
    /// (`kubernetes.io/empty-dir`...) ended, as upstream's operation executor records it.
    pub fn storage_operation(&self, plugin: &str, operation: &str, took: Duration, failed: bool) {
        let status = if failed { "fail-unknown" } else { "success" };
        self.storage_operation_duration
            .observe(&[plugin, operation, status, "false"], took.as_secs_f64());
    }

    /// A volume of `plugin` was first mounted, `took` after its pod first wanted it.
    pub fn volume_mounted(&self, plugin: &str, took: Duration) {
        self.volume_operation_total
            .observe(&[plugin, "overall_volume_mount"], took.as_secs_f64());
    }

    /// How many volumes of each plugin the pods want and have, by (plugin, state), upstream's
    /// `desired_state_of_world` and `actual_state_of_world`.
    pub fn set_volumes(&self, counts: &BTreeMap<(&str, &str), usize>) {
        let series = counts
            .iter()
            .map(|((plugin, state), n)| (vec![plugin.to_string(), state.to_string()], *n as f64))
            .collect();
        self.volume_manager_volumes.replace(series);
    }

    /// The volumes found on the node at start: `found` of them, `failed` not known well enough
    /// to be taken back.
    pub fn volumes_reconstructed(&self, found: usize, failed: usize) {
        self.reconstructed_volumes.add(&[], found as f64);
        self.reconstructed_volume_errors.add(&[], failed as f64);
    }

    /// Volumes that could not be taken back were removed with their pod: `removed` of them,
    /// `failed` of which could not be.
    pub fn volumes_force_cleaned(&self, removed: usize, failed: usize) {
        self.force_cleaned_volumes.add(&[], removed as f64);
        self.force_cleaned_volume_errors.add(&[], failed as f64);
    }

    /// The usage of one volume was measured by walking it (`du`, upstream's metric source).
    pub fn volume_stats_measured(&self, took: Duration) {
        self.volume_stats_duration
            .observe(&["du"], took.as_secs_f64());
    }

    /// A probe ran (`/metrics/probes`, upstream names and labels).
    /// A pod's probes are gone: their series go, as upstream deletes them when its probe
    /// workers stop.
    pub fn forget_probes(&self, namespace: &str, pod: &str, pod_uid: &str) {
        // prober_probe_total: probe_type, result, container, pod, namespace, pod_uid.
        self.probes
            .remove(|l| l.get(5).is_some_and(|u| u == pod_uid));
        // prober_probe_duration_seconds: probe_type, container, pod, namespace.
        let named = |l: &[String]| {
            l.get(2).is_some_and(|p| p == pod) && l.get(3).is_some_and(|n| n == namespace)
        };
        self.probe_duration.remove(named);
    }

    pub fn probe(&self, run: &ProbeRun<'_>) {
        let result = if run.success { "successful" } else { "failed" };
        self.probes.add(
            &[
                run.probe_type,
                result,
                run.container,
                run.pod,
                run.namespace,
                run.pod_uid,
            ],
            1.0,
        );
        self.probe_duration.observe(
            &[run.probe_type, run.container, run.pod, run.namespace],
            run.took.as_secs_f64(),
        );
    }

    /// The text exposition of the probe metrics (`/metrics/probes`).
    pub fn render_probes(&self) -> String {
        let mut out = String::new();
        self.probes.render(&mut out);
        self.probe_duration.render(&mut out);
        out
    }

    /// What the agent runs as: the node's name, the host's cgroup version and nodelet's build
    /// (its Kubernetes version, which the kubelet's build info carries).
    pub fn set_node(&self, node: &str, cgroup_version: u8, version: &str) {
        self.node_name.set(&[node], 1.0);
        self.cgroup_version.set(&[], f64::from(cgroup_version));
        let numbers: Vec<&str> = version.trim_start_matches('v').split('.').collect();
        let platform = format!("{}/{}", std::env::consts::OS, go_arch());
        self.build_info.set(
            &[
                "",
                "rustc",
                "",
                "",
                version,
                "",
                numbers.first().copied().unwrap_or_default(),
                numbers.get(1).copied().unwrap_or_default(),
                &platform,
            ],
            1.0,
        );
        self.mirror_pods.set(&[], 0.0);
        // Container stats come from the runtime's ListContainerStats.
        self.metrics_provider.set(&["cri"], 1.0);
        self.orphaned_runtime_pods.add(&[], 0.0);
        for statics in ["true", ""] {
            self.restarted_pods.add(&[statics], 0.0);
        }
    }

    /// The feature gates nodelet acts on: name, stage and whether each is on.
    pub fn set_features(&self, gates: &[(&str, &str, bool)]) {
        for (name, stage, on) in gates {
            self.feature_enabled
                .set(&[name, stage], f64::from(u8::from(*on)));
        }
    }

    /// The pod counts housekeeping takes.
    pub fn set_pod_counts(&self, counts: &PodCounts) {
        self.managed_ephemeral_containers
            .set(&[], counts.ephemeral_containers as f64);
        self.in_progress_resizes
            .set(&[], counts.in_progress_resizes as f64);
        for (family, (api, statics)) in [
            (&self.desired_pods, counts.desired),
            (&self.active_pods, counts.active),
        ] {
            family.set(&[""], api as f64);
            family.set(&["true"], statics as f64);
        }
        for ((lifecycle, config, statics), n) in &counts.working {
            self.working_pods
                .set(&[lifecycle, config, statics], *n as f64);
        }
    }

    /// The mirror pods the API server holds for this node's static pods.
    pub fn set_mirror_pods(&self, n: usize) {
        self.mirror_pods.set(&[], n as f64);
    }

    /// Housekeeping found a pod in the runtime that no worker knew.
    pub fn orphaned_runtime_pod(&self) {
        self.orphaned_runtime_pods.add(&[], 1.0);
    }

    /// Sets the gauges computed at scrape time.
    pub fn set_running(&self, pods: usize, containers_by_state: &[(&str, usize)]) {
        self.running_pods.set(&[], pods as f64);
        for (state, n) in containers_by_state {
            self.running_containers.set(&[state], *n as f64);
        }
    }

    /// Every histogram, in the order they are rendered.
    fn histograms(&self) -> [&Histogram; 21] {
        [
            &self.runtime_duration,
            &self.pleg_relist_duration,
            &self.pleg_relist_interval,
            &self.pleg_pod_relist_duration,
            &self.pod_worker_duration,
            &self.pod_start_duration,
            &self.run_podsandbox_duration,
            &self.containers_per_pod,
            &self.pod_worker_start_duration,
            &self.cgroup_manager_duration,
            &self.evented_pleg_latency,
            &self.http_duration,
            &self.volume_stats_duration,
            &self.pod_status_sync_duration,
            &self.topology_duration,
            &self.storage_operation_duration,
            &self.volume_operation_total,
            &self.pod_start_sli,
            &self.pod_start_total,
            &self.dra_operations,
            &self.dra_grpc,
        ]
    }

    /// The text exposition of every metric, plus the process's own.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in [
            &self.running_pods,
            &self.running_containers,
            &self.started_pods,
            &self.started_containers,
            &self.runtime_operations,
            &self.runtime_errors,
            &self.http_requests,
            &self.evictions,
            &self.evented_pleg_connected,
            &self.evented_pleg_errors,
            &self.shutdown_start,
            &self.shutdown_end,
            &self.events_dropped,
            &self.node_name,
            &self.cgroup_version,
            &self.build_info,
            &self.feature_enabled,
            &self.desired_pods,
            &self.active_pods,
            &self.working_pods,
            &self.mirror_pods,
            &self.orphaned_runtime_pods,
            &self.pleg_last_seen,
            &self.pleg_discard_events,
            &self.started_pods_errors,
            &self.started_userns_pods,
            &self.started_userns_pods_errors,
            &self.managed_ephemeral_containers,
            &self.terminated_containers,
            &self.sleep_terminated_early,
            &self.http_fallbacks,
            &self.restarted_pods,
            &self.in_progress_resizes,
            &self.http_inflight,
            &self.ensure_image_requests,
            &self.image_volumes_requested,
            &self.image_volumes_mounted,
            &self.image_volume_errors,
            &self.metrics_provider,
            &self.startup_pre_agent,
            &self.startup_pre_registration,
            &self.startup_registration,
            &self.startup_post_registration,
            &self.startup_total,
            &self.cpu_pinning_requests,
            &self.cpu_pinning_errors,
            &self.cpu_shared_pool,
            &self.cpu_exclusive,
            &self.cpu_per_numa,
            &self.memory_pinning_requests,
            &self.memory_pinning_errors,
            &self.aligned,
            &self.aligned_failures,
            &self.topology_requests,
            &self.topology_errors,
            &self.container_log_used,
            &self.orphan_pods_cleaned,
            &self.orphan_pods_failed,
            &self.volume_manager_volumes,
            &self.reconstructed_volumes,
            &self.reconstructed_volume_errors,
            &self.force_cleaned_volumes,
            &self.force_cleaned_volume_errors,
            &self.first_network_pod_start,
            &self.pull_intents_on_disk,
            &self.pulled_records_on_disk,
            &self.pull_intents_in_memory,
            &self.pulled_records_in_memory,
            &self.mustpull_checks,
            &self.dra_claims_in_use,
        ] {
            f.render(&mut out);
        }
        for h in self.histograms() {
            h.render(&mut out);
        }
        process_metrics(&mut out);
        out
    }
}

/// The wall-clock time in unix seconds.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// The machine's architecture as Go names it (upstream's platform label).
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The process's soft limit of `resource` (unlimited is the largest 64-bit number, as Go's
/// client reports it).
fn soft_limit(resource: libc::__rlimit_resource_t) -> f64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only into `limit`, which outlives the call.
    if unsafe { libc::getrlimit(resource, &mut limit) } != 0 {
        return 0.0;
    }
    limit.rlim_cur as f64
}

/// The IP octets received and sent in the process's network namespace (the IpExt counters of
/// /proc/self/net/netstat), as Go's process collector reports them.
fn network_octets() -> (f64, f64) {
    let text = std::fs::read_to_string("/proc/self/net/netstat").unwrap_or_default();
    let mut lines = text.lines().filter(|l| l.starts_with("IpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return (0.0, 0.0);
    };
    let field = |wanted: &str| {
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(name, _)| *name == wanted)
            .and_then(|(_, v)| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field("InOctets"), field("OutOctets"))
}

/// The process's own figures from /proc/self/stat, in seconds and bytes.
struct SelfStat {
    cpu: f64,
    rss: f64,
    virtual_bytes: f64,
    start: f64,
    /// When the machine booted.
    boot: f64,
}

impl SelfStat {
    fn read() -> Option<SelfStat> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may hold spaces) start at state (field 3).
        let (_, rest) = stat.rsplit_once(')')?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        // SAFETY: sysconf has no preconditions.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK) as f64,
                libc::sysconf(libc::_SC_PAGESIZE) as f64,
            )
        };
        let ticks = ticks.max(1.0);
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    l.strip_prefix("btime ")
                        .and_then(|v| v.trim().parse::<f64>().ok())
                })
            })
            .unwrap_or(0.0);
        Some(SelfStat {
            cpu: (num(11) + num(12)) / ticks,
            rss: num(21) * page,
            virtual_bytes: num(20),
            start: boot + num(19) / ticks,
            boot,
        })
    }
}

fn process_metrics(out: &mut String) {
    let Some(stat) = SelfStat::read() else {
        return;
    };
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let (received, sent) = network_octets();
    for (name, kind, help, value) in [
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            stat.cpu,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            stat.rss,
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            stat.virtual_bytes,
        ),
        (
            "process_virtual_memory_max_bytes",
            "gauge",
            "Maximum amount of virtual memory available in bytes.",
            soft_limit(libc::RLIMIT_AS),
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            stat.start,
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            fds as f64,
        ),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            soft_limit(libc::RLIMIT_NOFILE),
        ),
        (
            "process_network_receive_bytes_total",
            "counter",
            "Number of bytes received by the process over the network.",
            received,
        ),
        (
            "process_network_transmit_bytes_total",
            "counter",
            "Number of bytes sent by the process over the network.",
            sent,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_in_the_text_format() {
        let f = Family::new("x_total", "Things", "counter", &["kind"]);
        f.add(&["a\"b"], 2.0);
        let h = Histogram::new("y_seconds", "Time", &[]);
        h.observe(&[], 0.02);
        let mut out = String::new();
        f.render(&mut out);
        h.render(&mut out);
        assert!(
            out.contains("# TYPE x_total counter\nx_total{kind=\"a\\\"b\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("y_seconds_bucket{le=\"0.01\"} 0\n"), "{out}");
        assert!(out.contains("y_seconds_bucket{le=\"0.025\"} 1\n"), "{out}");
        assert!(
            out.contains(
                "y_seconds_bucket{le=\"+Inf\"} 1\ny_seconds_sum 0.02\ny_seconds_count 1\n"
            ),
            "{out}"
        );
    }

    #[test]
    fn process_metrics_are_there() {
        let text = get().render();
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
    }
}

//! `/metrics/resource`: what metrics-server (and so `kubectl top` and the HorizontalPodAutoscaler)
//! scrapes from each node. The node's, each pod's and each container's CPU time and working set,
//! and each container's start time, taken from the summary, with upstream's names, help texts
//! and sample timestamps.

use std::fmt::Write as _;

use serde_json::Value;

/// One metric family: its name, help, type, stability and samples (labels, value, timestamp
/// in ms).
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    stability: &'static str,
    samples: Vec<(String, f64, Option<i64>)>,
}

impl Family {
    fn new(name: &'static str, help: &'static str, kind: &'static str) -> Family {
        Family {
            name,
            help,
            kind,
            stability: "STABLE",
            samples: Vec::new(),
        }
    }

    /// A family upstream marks ALPHA.
    fn alpha(name: &'static str, help: &'static str) -> Family {
        Family {
            stability: "ALPHA",
            ..Family::new(name, help, "gauge")
        }
    }

    fn render(&self, out: &mut String) {
        if self.samples.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "# HELP {} [{}] {}",
            self.name, self.stability, self.help
        );
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for (labels, value, at) in &self.samples {
            let _ = match at {
                Some(ms) => writeln!(out, "{}{labels} {value} {ms}", self.name),
                None => writeln!(out, "{}{labels} {value}", self.name),
            };
        }
    }
}

/// Milliseconds since the epoch of a summary `time` field.
fn millis(time: &Value) -> Option<i64> {
    let at: k8s_openapi::jiff::Timestamp = time.as_str()?.parse().ok()?;
    Some(at.as_millisecond())
}

/// A label value escaped for the text format.
fn escaped(v: &Value) -> String {
    let text = v.as_str().unwrap_or_default();
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Adds `stats`' CPU time (core-seconds) to `cpu` and working set to `memory`, labelled `labels`.
fn usage(stats: &Value, labels: &str, cpu: &mut Family, memory: &mut Family) {
    if let Some(ns) = stats["cpu"]["usageCoreNanoSeconds"].as_u64() {
        let at = millis(&stats["cpu"]["time"]);
        cpu.samples.push((labels.into(), ns as f64 / 1e9, at));
    }
    if let Some(bytes) = stats["memory"]["workingSetBytes"].as_u64() {
        let at = millis(&stats["memory"]["time"]);
        memory.samples.push((labels.into(), bytes as f64, at));
    }
}

/// Adds `stats`' swap use (and, with `limit`, what it may use in all) labelled `labels`.
fn swap(stats: &Value, labels: &str, usage: &mut Family, limit: Option<&mut Family>) {
    let swap = &stats["swap"];
    let at = millis(&swap["time"]);
    let Some(used) = swap["swapUsageBytes"].as_u64() else {
        return;
    };
    usage.samples.push((labels.into(), used as f64, at));
    if let (Some(limit), Some(available)) = (limit, swap["swapAvailableBytes"].as_u64()) {
        limit
            .samples
            .push((labels.into(), (available + used) as f64, at));
    }
}

/// The resource metrics of `summary` (the `/stats/summary` document), in the text format;
/// `scrape_failed` when the summary could not be read.
pub fn render(summary: Option<&Value>) -> String {
    let mut node_cpu = Family::new(
        "node_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the node in core-seconds",
        "counter",
    );
    let mut node_memory = Family::new(
        "node_memory_working_set_bytes",
        "Current working set of the node in bytes",
        "gauge",
    );
    let mut container_start = Family::new(
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds",
        "gauge",
    );
    let mut container_cpu = Family::new(
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the container in core-seconds",
        "counter",
    );
    let mut container_memory = Family::new(
        "container_memory_working_set_bytes",
        "Current working set of the container in bytes",
        "gauge",
    );
    let mut pod_cpu = Family::new(
        "pod_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the pod in core-seconds",
        "counter",
    );
    let mut pod_memory = Family::new(
        "pod_memory_working_set_bytes",
        "Current working set of the pod in bytes",
        "gauge",
    );
    let mut node_swap = Family::alpha(
        "node_swap_usage_bytes",
        "Current swap usage of the node in bytes. Reported only on non-windows systems",
    );
    let mut container_swap = Family::alpha(
        "container_swap_usage_bytes",
        "Current amount of the container swap usage in bytes. Reported only on non-windows systems",
    );
    let mut container_swap_limit = Family::alpha(
        "container_swap_limit_bytes",
        "Current amount of the container swap limit in bytes. Reported only on non-windows systems",
    );
    let mut pod_swap = Family::alpha(
        "pod_swap_usage_bytes",
        "Current amount of the pod swap usage in bytes. Reported only on non-windows systems",
    );
    let mut error = Family::new(
        "resource_scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
        "gauge",
    );
    error
        .samples
        .push((String::new(), f64::from(u8::from(summary.is_none())), None));
    if let Some(summary) = summary {
        usage(&summary["node"], "", &mut node_cpu, &mut node_memory);
        swap(&summary["node"], "", &mut node_swap, None);
        for pod in summary["pods"].as_array().into_iter().flatten() {
            let (name, namespace) = (
                escaped(&pod["podRef"]["name"]),
                escaped(&pod["podRef"]["namespace"]),
            );
            for c in pod["containers"].as_array().into_iter().flatten() {
                let labels = format!(
                    "{{container=\"{}\",namespace=\"{namespace}\",pod=\"{name}\"}}",
                    escaped(&c["name"])
                );
                if let Some(ms) = millis(&c["startTime"]).filter(|ms| *ms > 0) {
                    container_start
                        .samples
                        .push((labels.clone(), ms as f64 / 1e3, None));
                }
                usage(c, &labels, &mut container_cpu, &mut container_memory);
                swap(
                    c,
                    &labels,
                    &mut container_swap,
                    Some(&mut container_swap_limit),
                );
            }
            let labels = format!("{{namespace=\"{namespace}\",pod=\"{name}\"}}");
            usage(pod, &labels, &mut pod_cpu, &mut pod_memory);
            swap(pod, &labels, &mut pod_swap, None);
        }
    }
    let mut out = String::new();
    for family in [
        &container_cpu,
        &container_memory,
        &container_start,
        &container_swap_limit,
        &container_swap,
        &node_cpu,
        &node_memory,
        &node_swap,
        &pod_cpu,
        &pod_memory,
        &pod_swap,
        &error,
    ] {
        family.render(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_becomes_upstreams_resource_metrics() {
        let time = "2026-12-06T10:00:00Z";
        let summary = serde_json::json!({
            "node": {
                "cpu": {"time": time, "usageCoreNanoSeconds": 2_500_000_000u64},
                "memory": {"time": time, "workingSetBytes": 1024},
                "swap": {"time": time, "swapUsageBytes": 0, "swapAvailableBytes": 0},
            },
            "pods": [{
                "podRef": {"name": "web", "namespace": "default", "uid": "u"},
                "cpu": {"time": time, "usageCoreNanoSeconds": 1_000_000_000u64},
                "memory": {"time": time, "workingSetBytes": 512},
                "containers": [{
                    "name": "c",
                    "startTime": "2026-12-06T09:00:00Z",
                    "cpu": {"time": time, "usageCoreNanoSeconds": 500_000_000u64},
                    "memory": {"time": time, "workingSetBytes": 256},
                    "swap": {"time": time, "swapUsageBytes": 64, "swapAvailableBytes": 1024},
                }],
            }],
        });
        let text = render(Some(&summary));
        let ms = 1_796_551_200_000i64;
        for line in [
            "# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds".to_string(),
            "# TYPE node_cpu_usage_seconds_total counter".to_string(),
            format!("node_cpu_usage_seconds_total 2.5 {ms}"),
            format!("node_memory_working_set_bytes 1024 {ms}"),
            format!("pod_cpu_usage_seconds_total{{namespace=\"default\",pod=\"web\"}} 1 {ms}"),
            format!("pod_memory_working_set_bytes{{namespace=\"default\",pod=\"web\"}} 512 {ms}"),
            format!("container_cpu_usage_seconds_total{{container=\"c\",namespace=\"default\",pod=\"web\"}} 0.5 {ms}"),
            format!("container_memory_working_set_bytes{{container=\"c\",namespace=\"default\",pod=\"web\"}} 256 {ms}"),
            "container_start_time_seconds{container=\"c\",namespace=\"default\",pod=\"web\"} 1796547600".to_string(),
            "resource_scrape_error 0".to_string(),
            "# HELP node_swap_usage_bytes [ALPHA] Current swap usage of the node in bytes. Reported only on non-windows systems".to_string(),
            format!("node_swap_usage_bytes 0 {ms}"),
            format!("container_swap_usage_bytes{{container=\"c\",namespace=\"default\",pod=\"web\"}} 64 {ms}"),
            format!("container_swap_limit_bytes{{container=\"c\",namespace=\"default\",pod=\"web\"}} 1088 {ms}"),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        assert!(render(None).contains("resource_scrape_error 1\n"));
    }
}

//! `/metrics/resource`: what metrics-server (and so `kubectl top` and the HorizontalPodAutoscaler)
//! scrapes from each node. The node's, each pod's and each container's CPU time and working set,
//! and each container's start time, taken from the summary, with upstream's names, help texts
//! and sample timestamps.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

/// Every family served, in name order as upstream's: name, help, type and stability.
const FAMILIES: &[(&str, &str, &str, &str)] = &[
    (
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the container in core-seconds",
        "counter",
        "STABLE",
    ),
    (
        "container_memory_working_set_bytes",
        "Current working set of the container in bytes",
        "gauge",
        "STABLE",
    ),
    (
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds",
        "gauge",
        "STABLE",
    ),
    (
        "container_swap_limit_bytes",
        "Current amount of the container swap limit in bytes. Reported only on non-windows systems",
        "gauge",
        "ALPHA",
    ),
    (
        "container_swap_usage_bytes",
        "Current amount of the container swap usage in bytes. Reported only on non-windows systems",
        "gauge",
        "ALPHA",
    ),
    (
        "node_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the node in core-seconds",
        "counter",
        "STABLE",
    ),
    (
        "node_memory_working_set_bytes",
        "Current working set of the node in bytes",
        "gauge",
        "STABLE",
    ),
    (
        "node_swap_usage_bytes",
        "Current swap usage of the node in bytes. Reported only on non-windows systems",
        "gauge",
        "ALPHA",
    ),
    (
        "pod_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the pod in core-seconds",
        "counter",
        "STABLE",
    ),
    (
        "pod_memory_working_set_bytes",
        "Current working set of the pod in bytes",
        "gauge",
        "STABLE",
    ),
    (
        "pod_swap_usage_bytes",
        "Current amount of the pod swap usage in bytes. Reported only on non-windows systems",
        "gauge",
        "ALPHA",
    ),
    (
        "resource_scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
        "gauge",
        "STABLE",
    ),
];

/// One sample: its labels as `{...}` text (empty for none), value and time in ms (`None`:
/// measured now).
pub(super) type Sample = (String, f64, Option<i64>);

/// Writes one family in the text format: its help, type and samples.
pub(super) fn write_family(
    out: &mut String,
    name: &str,
    help: &str,
    kind: &str,
    samples: &[Sample],
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value, at) in samples {
        let _ = match at {
            Some(ms) => writeln!(out, "{name}{labels} {value} {ms}"),
            None => writeln!(out, "{name}{labels} {value}"),
        };
    }
}

/// Samples by family name.
#[derive(Default)]
struct Samples(BTreeMap<String, Vec<Sample>>);

impl Samples {
    fn push(&mut self, family: String, labels: &str, value: f64, at: Option<i64>) {
        self.0
            .entry(family)
            .or_default()
            .push((labels.to_string(), value, at));
    }
}

/// Milliseconds since the epoch of a summary `time` field.
fn millis(time: &Value) -> Option<i64> {
    let at: k8s_openapi::jiff::Timestamp = time.as_str()?.parse().ok()?;
    Some(at.as_millisecond())
}

/// A label value escaped for the text format.
fn escaped(v: &Value) -> String {
    crate::metrics::label_value(v.as_str().unwrap_or_default())
}

/// Adds the CPU time (core-seconds), working set and swap use of `stats`, the node's, a
/// pod's or a container's (`kind`), labelled `labels`; a container's swap limit too.
fn usage(out: &mut Samples, kind: &str, stats: &Value, labels: &str) {
    if let Some(ns) = stats["cpu"]["usageCoreNanoSeconds"].as_u64() {
        let at = millis(&stats["cpu"]["time"]);
        let name = format!("{kind}_cpu_usage_seconds_total");
        out.push(name, labels, ns as f64 / 1e9, at);
    }
    if let Some(bytes) = stats["memory"]["workingSetBytes"].as_u64() {
        let at = millis(&stats["memory"]["time"]);
        let name = format!("{kind}_memory_working_set_bytes");
        out.push(name, labels, bytes as f64, at);
    }
    let swap = &stats["swap"];
    if let Some(used) = swap["swapUsageBytes"].as_u64() {
        let at = millis(&swap["time"]);
        out.push(format!("{kind}_swap_usage_bytes"), labels, used as f64, at);
        if let Some(available) = swap["swapAvailableBytes"].as_u64()
            && kind == "container"
        {
            let limit = (available + used) as f64;
            out.push("container_swap_limit_bytes".into(), labels, limit, at);
        }
    }
}

/// The resource metrics of `summary` (the `/stats/summary` document), in the text format;
/// `scrape_failed` when the summary could not be read.
pub fn render(summary: Option<&Value>) -> String {
    let mut samples = Samples::default();
    let failed = f64::from(u8::from(summary.is_none()));
    samples.push("resource_scrape_error".into(), "", failed, None);
    if let Some(summary) = summary {
        usage(&mut samples, "node", &summary["node"], "");
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
                    let started = ms as f64 / 1e3;
                    samples.push(
                        "container_start_time_seconds".into(),
                        &labels,
                        started,
                        None,
                    );
                }
                usage(&mut samples, "container", c, &labels);
            }
            let labels = format!("{{namespace=\"{namespace}\",pod=\"{name}\"}}");
            usage(&mut samples, "pod", pod, &labels);
        }
    }
    let mut out = String::new();
    for (name, help, kind, stability) in FAMILIES {
        let Some(list) = samples.0.get(*name) else {
            continue;
        };
        write_family(&mut out, name, &format!("[{stability}] {help}"), kind, list);
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

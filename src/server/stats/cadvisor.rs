//! `/metrics/cadvisor`: the machine's facts as cAdvisor's machine collector serves them, and each
//! pod's and container's usage as the runtime measures it (CRI `ListPodSandboxMetrics`, in the
//! families `ListMetricDescriptors` names and describes). That is what the kubelet serves with its
//! `PodAndContainerStatsFromCRI` gate: the `container_*` names, help texts, labels (`pod`,
//! `namespace`, `container`, `id`, `image`, and `interface` or `device`) and sample times are the
//! runtime's. Except one value: the CRI carries whole numbers, so the runtime gives CPU time in
//! whole seconds, and each container's `container_cpu_usage_seconds_total` is taken from its
//! container stats (nanoseconds) instead, as precise as cAdvisor's. A runtime without these
//! calls (containerd before 2.0) leaves only the machine's facts.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::resource::{Sample, write_family};
use crate::host::MachineIds;
use crate::metrics::label_value;
use crate::runtime::cri;

/// What cAdvisor's machine collector reports under the kubelet's metric set.
#[derive(Debug)]
pub(crate) struct Machine {
    pub(crate) ids: MachineIds,
    /// Logical CPUs.
    pub(crate) cores: usize,
    pub(crate) physical_cores: usize,
    pub(crate) sockets: usize,
    pub(crate) memory_bytes: u64,
    pub(crate) swap_bytes: u64,
}

impl Machine {
    /// This machine, from sysfs and /proc/meminfo.
    pub(crate) fn detect() -> std::io::Result<Machine> {
        let topology = crate::cm::cpu::Topology::discover(Path::new("/sys/devices/system/cpu"))?;
        let count = |key: fn(&crate::cm::cpu::Cpu) -> (u32, u32)| {
            let keys: std::collections::BTreeSet<_> = topology.cpus.iter().map(key).collect();
            keys.len()
        };
        let mem = super::meminfo();
        Ok(Machine {
            ids: crate::host::machine_ids(),
            cores: topology.cpus.len(),
            physical_cores: count(|c| (c.socket, c.core)),
            sockets: count(|c| (c.socket, 0)),
            memory_bytes: mem.get("MemTotal").copied().unwrap_or(0),
            swap_bytes: mem.get("SwapTotal").copied().unwrap_or(0),
        })
    }

    /// The machine families.
    fn families(&self) -> [MachineFamily; 9] {
        let one = |v: f64| vec![(String::new(), v)];
        let nvm = ["app_direct_mode", "memory_mode"]
            .iter()
            .map(|mode| (format!(",mode=\"{mode}\""), 0.0))
            .collect();
        [
            ("machine_cpu_books", "Number of CPU books.", one(0.0)),
            (
                "machine_cpu_cores",
                "Number of logical CPU cores.",
                one(self.cores as f64),
            ),
            ("machine_cpu_drawers", "Number of CPU drawers.", one(0.0)),
            (
                "machine_cpu_physical_cores",
                "Number of physical CPU cores.",
                one(self.physical_cores as f64),
            ),
            (
                "machine_cpu_sockets",
                "Number of CPU sockets.",
                one(self.sockets as f64),
            ),
            (
                "machine_memory_bytes",
                "Amount of memory installed on the machine.",
                one(self.memory_bytes as f64),
            ),
            (
                "machine_nvm_avg_power_budget_watts",
                "NVM power budget.",
                one(0.0),
            ),
            (
                "machine_nvm_capacity",
                "NVM capacity value labeled by NVM mode (memory mode or app direct mode).",
                nvm,
            ),
            (
                "machine_swap_bytes",
                "Amount of swap memory available on the machine.",
                one(self.swap_bytes as f64),
            ),
        ]
    }
}

/// What the runtime reports for `/metrics/cadvisor`.
#[derive(Default)]
pub(crate) struct RuntimeMetrics {
    pub(crate) descriptors: Vec<cri::MetricDescriptor>,
    pub(crate) pods: Vec<cri::PodSandboxMetrics>,
    /// Each container's CPU time in nanoseconds, by container ID, from its container stats.
    pub(crate) cpu_ns: HashMap<String, u64>,
}

/// The family whose value comes from the container stats where they have it.
const CPU_USAGE: &str = "container_cpu_usage_seconds_total";

/// A machine family: name, help, and samples as (labels after the machine's ids, value).
type MachineFamily = (&'static str, &'static str, Vec<(String, f64)>);

/// The text format of the machine's families (`None`: it could not be read, which
/// `machine_scrape_error` says) and of the runtime's metrics, families in name order.
pub(crate) fn render(machine: Option<&Machine>, runtime: &RuntimeMetrics) -> String {
    let mut out = String::new();
    if let Some(m) = machine {
        let ids = format!(
            "boot_id=\"{}\",machine_id=\"{}\",system_uuid=\"{}\"",
            label_value(&m.ids.boot_id),
            label_value(&m.ids.machine_id),
            label_value(&m.ids.system_uuid),
        );
        for (name, help, values) in m.families() {
            let samples: Vec<Sample> = values
                .into_iter()
                .map(|(extra, value)| (format!("{{{ids}{extra}}}"), value, None))
                .collect();
            write_family(&mut out, name, help, "gauge", &samples);
        }
    }
    let failed = f64::from(u8::from(machine.is_none()));
    write_family(
        &mut out,
        "machine_scrape_error",
        "1 if there was an error while getting machine metrics, 0 otherwise.",
        "gauge",
        &[(String::new(), failed, None)],
    );
    render_runtime(&mut out, runtime);
    out
}

/// The runtime's metrics by family. A metric whose name no descriptor gives, or whose label
/// values do not match its descriptor's keys, is left out, as the kubelet leaves it out.
fn render_runtime(out: &mut String, runtime: &RuntimeMetrics) {
    let by_name: BTreeMap<&str, &cri::MetricDescriptor> = runtime
        .descriptors
        .iter()
        .map(|d| (d.name.as_str(), d))
        .collect();
    let mut families: BTreeMap<&str, (&cri::MetricDescriptor, &str, Vec<Sample>)> = BTreeMap::new();
    let metrics = runtime.pods.iter().flat_map(|p| {
        let containers = p.container_metrics.iter().flat_map(|c| &c.metrics);
        p.metrics.iter().chain(containers)
    });
    for m in metrics {
        let Some(d) = by_name.get(m.name.as_str()) else {
            continue;
        };
        if d.label_keys.len() != m.label_values.len() {
            continue;
        }
        let mut labels: Vec<(&String, &String)> =
            d.label_keys.iter().zip(&m.label_values).collect();
        labels.sort();
        let text: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", label_value(v)))
            .collect();
        let kind = match cri::MetricType::try_from(m.metric_type) {
            Ok(cri::MetricType::Counter) => "counter",
            _ => "gauge",
        };
        let id = labels.iter().find(|(k, _)| *k == "id").map(|(_, id)| id);
        let precise = id
            .filter(|_| m.name == CPU_USAGE)
            .and_then(|id| runtime.cpu_ns.get(id.as_str()));
        let value = match precise {
            Some(ns) => *ns as f64 / 1e9,
            None => m.value.as_ref().map_or(0, |v| v.value) as f64,
        };
        let at = (m.timestamp != 0).then_some(m.timestamp / 1_000_000);
        let family = families
            .entry(d.name.as_str())
            .or_insert((d, kind, Vec::new()));
        family
            .2
            .push((format!("{{{}}}", text.join(",")), value, at));
    }
    for (name, (d, kind, mut samples)) in families {
        samples.sort_by(|a, b| a.0.cmp(&b.0));
        samples.dedup_by(|a, b| a.0 == b.0);
        let help = format!("[INTERNAL] {}", d.help);
        write_family(out, name, &help, kind, &samples);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(name: &str, keys: &[&str]) -> cri::MetricDescriptor {
        cri::MetricDescriptor {
            name: name.into(),
            help: format!("{name} help"),
            label_keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    fn metric(name: &str, kind: cri::MetricType, values: &[&str], v: u64) -> cri::Metric {
        cri::Metric {
            name: name.into(),
            timestamp: 1_796_551_200_123_456_789,
            metric_type: kind as i32,
            label_values: values.iter().map(|k| k.to_string()).collect(),
            value: Some(cri::UInt64Value { value: v }),
        }
    }

    #[test]
    fn the_runtimes_metrics_and_the_machine_in_the_text_format() {
        let base = ["pod", "namespace", "container", "id", "image"];
        let descriptors = [
            descriptor("container_cpu_usage_seconds_total", &base),
            descriptor(
                "container_network_receive_bytes_total",
                &["pod", "namespace", "container", "id", "image", "interface"],
            ),
            descriptor("container_memory_rss", &base),
        ];
        let counter = cri::MetricType::Counter;
        let pods = [cri::PodSandboxMetrics {
            pod_sandbox_id: "s1".into(),
            metrics: vec![metric(
                "container_network_receive_bytes_total",
                counter,
                &["web", "default", "", "s1", "", "eth0"],
                1500,
            )],
            container_metrics: vec![cri::ContainerMetrics {
                container_id: "c1".into(),
                metrics: vec![
                    metric(
                        "container_cpu_usage_seconds_total",
                        counter,
                        &["web", "default", "app", "c1", "busybox:1.36"],
                        3,
                    ),
                    metric(
                        "container_memory_rss",
                        cri::MetricType::Gauge,
                        &["web", "default", "app", "c1", "quote\"d"],
                        4096,
                    ),
                    metric("not_described", counter, &["x"], 1),
                    metric("container_memory_rss", counter, &["too", "few"], 1),
                ],
            }],
        }];
        let machine = Machine {
            ids: MachineIds {
                machine_id: "m".into(),
                system_uuid: String::new(),
                boot_id: "b".into(),
            },
            cores: 4,
            physical_cores: 2,
            sockets: 1,
            memory_bytes: 1 << 30,
            swap_bytes: 0,
        };
        let runtime = RuntimeMetrics {
            descriptors: descriptors.to_vec(),
            pods: pods.to_vec(),
            cpu_ns: HashMap::from([("c1".to_string(), 3_250_000_000)]),
        };
        let text = render(Some(&machine), &runtime);
        let ids = "boot_id=\"b\",machine_id=\"m\",system_uuid=\"\"";
        for line in [
            "# HELP machine_cpu_cores Number of logical CPU cores.".to_string(),
            "# TYPE machine_cpu_cores gauge".to_string(),
            format!("machine_cpu_cores{{{ids}}} 4"),
            format!("machine_cpu_physical_cores{{{ids}}} 2"),
            format!("machine_cpu_sockets{{{ids}}} 1"),
            format!("machine_memory_bytes{{{ids}}} 1073741824"),
            format!("machine_nvm_capacity{{{ids},mode=\"memory_mode\"}} 0"),
            "machine_scrape_error 0".to_string(),
            "# HELP container_cpu_usage_seconds_total [INTERNAL] container_cpu_usage_seconds_total help".to_string(),
            "# TYPE container_cpu_usage_seconds_total counter".to_string(),
            "container_cpu_usage_seconds_total{container=\"app\",id=\"c1\",image=\"busybox:1.36\",namespace=\"default\",pod=\"web\"} 3.25 1796551200123".to_string(),
            "# TYPE container_memory_rss gauge".to_string(),
            "container_memory_rss{container=\"app\",id=\"c1\",image=\"quote\\\"d\",namespace=\"default\",pod=\"web\"} 4096 1796551200123".to_string(),
            "container_network_receive_bytes_total{container=\"\",id=\"s1\",image=\"\",interface=\"eth0\",namespace=\"default\",pod=\"web\"} 1500 1796551200123".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        assert!(!text.contains("not_described"), "{text}");
        assert_eq!(text.matches("container_memory_rss{").count(), 1, "{text}");
        let failed = render(None, &RuntimeMetrics::default());
        assert!(failed.contains("\nmachine_scrape_error 1\n"), "{failed}");
        assert!(!failed.contains("machine_cpu_cores"), "{failed}");
        assert!(!failed.contains("# TYPE container_"), "{failed}");
    }

    #[test]
    fn this_machine_is_detected() {
        let m = Machine::detect().expect("sysfs");
        assert!(m.cores >= m.physical_cores && m.physical_cores >= m.sockets && m.sockets >= 1);
        assert!(m.memory_bytes > 0);
    }
}

//! Network figures of the Summary API: the node's interfaces from /proc/net/dev, each pod's
//! from the runtime's sandbox stats (ListPodSandboxStats), or, when the runtime gives none,
//! from /proc/<pid>/net/dev of the sandbox's process. Pods on the host network get no network
//! figures, as upstream (cAdvisor and the runtimes report none for them).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;

use serde_json::{Value, json};

use crate::runtime::{RuntimeClient, cri};

/// The interface upstream reports at the top level of a pod's network stats.
const DEFAULT_INTERFACE: &str = "eth0";

/// Interfaces left out, as cAdvisor (so upstream) leaves them out: loopback, the host ends of
/// pod veth pairs (their traffic is the pods') and docker's or nerdctl's bridges.
const IGNORED_PREFIXES: &[&str] = &["lo", "veth", "docker", "nerdctl"];

/// One interface's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Interface {
    pub(super) name: String,
    pub(super) rx_bytes: u64,
    pub(super) rx_packets: u64,
    pub(super) rx_errors: u64,
    pub(super) rx_dropped: u64,
    pub(super) tx_bytes: u64,
    pub(super) tx_packets: u64,
    pub(super) tx_errors: u64,
    pub(super) tx_dropped: u64,
}

/// The interfaces of a /proc/net/dev text, ignored ones left out.
pub(super) fn parse_net_dev(text: &str) -> Vec<Interface> {
    text.lines()
        .filter_map(|line| {
            let (name, counters) = line.split_once(':')?;
            let name = name.trim();
            let counters: Vec<u64> = counters
                .split_whitespace()
                .map(|c| c.parse().ok())
                .collect::<Option<_>>()?;
            // Receive: bytes packets errs drop fifo frame compressed multicast; then transmit.
            Some(Interface {
                name: name.to_string(),
                rx_bytes: *counters.first()?,
                rx_packets: *counters.get(1)?,
                rx_errors: *counters.get(2)?,
                rx_dropped: *counters.get(3)?,
                tx_bytes: *counters.get(8)?,
                tx_packets: *counters.get(9)?,
                tx_errors: *counters.get(10)?,
                tx_dropped: *counters.get(11)?,
            })
        })
        .filter(|i| {
            let lower = i.name.to_lowercase();
            !IGNORED_PREFIXES.iter().any(|p| lower.starts_with(p))
        })
        .collect()
}

fn interface_json(i: &Interface) -> Value {
    json!({
        "name": i.name,
        "rxBytes": i.rx_bytes,
        "rxErrors": i.rx_errors,
        "txBytes": i.tx_bytes,
        "txErrors": i.tx_errors,
    })
}

/// The Summary API's NetworkStats: every interface, and the one named `default` repeated at
/// the top level.
fn network_json(interfaces: &[Interface], default: &str, time: &str) -> Value {
    let mut out = serde_json::Map::new();
    out.insert("time".into(), json!(time));
    if let Some(Value::Object(top)) = interfaces
        .iter()
        .find(|i| i.name == default)
        .map(interface_json)
    {
        out.extend(top);
    }
    out.insert(
        "interfaces".into(),
        interfaces.iter().map(interface_json).collect(),
    );
    Value::Object(out)
}

/// The interface of the default route, from /proc/net/route.
fn default_route_interface() -> Option<String> {
    let routes = std::fs::read_to_string("/proc/net/route").ok()?;
    routes.lines().skip(1).find_map(|line| {
        let mut fields = line.split_whitespace();
        let iface = fields.next()?;
        (fields.next()? == "00000000").then(|| iface.to_string())
    })
}

/// The node's network: the host's interfaces, with eth0 (upstream's choice) or else the
/// default route's interface at the top level. `None` when /proc/net/dev cannot be read.
pub(super) fn node(time: &str) -> Option<Value> {
    let interfaces = parse_net_dev(&std::fs::read_to_string("/proc/net/dev").ok()?);
    let default = if interfaces.iter().any(|i| i.name == DEFAULT_INTERFACE) {
        DEFAULT_INTERFACE.to_string()
    } else {
        default_route_interface().unwrap_or_default()
    };
    Some(network_json(&interfaces, &default, time))
}

/// Each pod's network by pod UID, for the ready sandboxes in `sandboxes` (pod UID to sandbox
/// ID): from the runtime's sandbox stats when it has them, else from /proc.
pub(super) async fn pods(
    runtime: &RuntimeClient,
    sandboxes: &HashMap<String, String>,
    time: &str,
) -> HashMap<String, Value> {
    match runtime.pod_sandbox_stats().await {
        Ok(stats) => {
            let uid_of: HashMap<&str, &str> = sandboxes
                .iter()
                .map(|(uid, id)| (id.as_str(), uid.as_str()))
                .collect();
            stats
                .iter()
                .filter_map(|s| {
                    let uid = uid_of.get(s.attributes.as_ref()?.id.as_str())?;
                    let network = s.linux.as_ref()?.network.as_ref()?;
                    Some((uid.to_string(), from_cri(network, time)))
                })
                .collect()
        }
        Err(e) => {
            tracing::debug!(error = %e, "no sandbox stats from the runtime; reading the pods' network from /proc");
            let mut out = HashMap::new();
            for (uid, id) in sandboxes {
                if let Some(network) = from_proc(runtime, id, time).await {
                    out.insert(uid.clone(), network);
                }
            }
            out
        }
    }
}

/// The runtime's network usage of a sandbox in the Summary API's shape.
fn from_cri(n: &cri::NetworkUsage, time: &str) -> Value {
    let value = |v: &Option<cri::UInt64Value>| v.as_ref().map_or(0, |v| v.value);
    let interfaces: Vec<Interface> = n
        .default_interface
        .iter()
        .chain(&n.interfaces)
        .map(|i| Interface {
            name: i.name.clone(),
            rx_bytes: value(&i.rx_bytes),
            rx_errors: value(&i.rx_errors),
            tx_bytes: value(&i.tx_bytes),
            tx_errors: value(&i.tx_errors),
            ..Interface::default()
        })
        .collect();
    let default = n
        .default_interface
        .as_ref()
        .map_or(DEFAULT_INTERFACE, |i| i.name.as_str());
    let time = k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(n.timestamp))
        .ok()
        .filter(|_| n.timestamp > 0)
        .map_or_else(|| time.to_string(), |t| t.to_string());
    network_json(&interfaces, default, &time)
}

/// A sandbox's network read in its network namespace through its process; `None` when the
/// runtime gives no process or the sandbox shares the host's network namespace.
async fn from_proc(runtime: &RuntimeClient, sandbox_id: &str, time: &str) -> Option<Value> {
    let pid = match runtime.sandbox_pid(sandbox_id).await {
        Ok(pid) => pid?,
        Err(e) => {
            tracing::debug!(sandbox = sandbox_id, error = %e, "cannot find the sandbox's process for its network stats");
            return None;
        }
    };
    let interfaces = pod_interfaces(u32::try_from(pid).ok()?)?;
    Some(network_json(&interfaces, DEFAULT_INTERFACE, time))
}

/// The interfaces seen from the process `pid`'s network namespace; `None` when that is the
/// host's (a pod on the host network) or cannot be read.
pub(super) fn pod_interfaces(pid: u32) -> Option<Vec<Interface>> {
    let netns = |pid: &str| {
        std::fs::metadata(format!("/proc/{pid}/ns/net"))
            .ok()
            .map(|m| (m.dev(), m.ino()))
    };
    let theirs = netns(&pid.to_string())?;
    if Some(theirs) == netns("self") {
        return None;
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    Some(parse_net_dev(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET_DEV: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  982309   67828    0    0    0     0          0         0   982309   67828    0    0    0     0       0          0
  eth0: 290265580   16061    3    0    0     0          0         0  1115536   12009    4    0    0     0       0          0
vethab12:    100       1    0    0    0     0          0         0      200       2    0    0    0     0       0          0
  cni0:1234567890      9    0    0    0     0          0         0       42       1    0    0    0     0       0          0
";

    #[test]
    fn proc_net_dev_is_read_without_loopback_and_veths() {
        let interfaces = parse_net_dev(NET_DEV);
        assert_eq!(
            interfaces,
            vec![
                Interface {
                    name: "eth0".into(),
                    rx_bytes: 290265580,
                    rx_packets: 16061,
                    rx_errors: 3,
                    rx_dropped: 0,
                    tx_bytes: 1115536,
                    tx_packets: 12009,
                    tx_errors: 4,
                    tx_dropped: 0,
                },
                Interface {
                    name: "cni0".into(),
                    rx_bytes: 1234567890,
                    rx_packets: 9,
                    rx_errors: 0,
                    rx_dropped: 0,
                    tx_bytes: 42,
                    tx_packets: 1,
                    tx_errors: 0,
                    tx_dropped: 0,
                },
            ]
        );
    }

    #[test]
    fn the_default_interface_is_repeated_at_the_top_level() {
        let stats = network_json(&parse_net_dev(NET_DEV), "eth0", "t");
        assert_eq!(stats["name"], "eth0");
        assert_eq!(stats["rxBytes"], 290265580);
        assert_eq!(stats["txErrors"], 4);
        assert_eq!(stats["time"], "t");
        assert_eq!(stats["interfaces"].as_array().map(Vec::len), Some(2));
        let without = network_json(&parse_net_dev(NET_DEV), "eth9", "t");
        assert!(without.get("rxBytes").is_none());
    }

    #[test]
    fn the_runtimes_network_usage_keeps_its_interfaces_and_time() {
        let usage = cri::NetworkUsage {
            timestamp: 1_700_000_000_000_000_000,
            default_interface: Some(cri::NetworkInterfaceUsage {
                name: "eth0".into(),
                rx_bytes: Some(cri::UInt64Value { value: 10 }),
                rx_errors: None,
                tx_bytes: Some(cri::UInt64Value { value: 20 }),
                tx_errors: Some(cri::UInt64Value { value: 1 }),
            }),
            interfaces: vec![],
        };
        let stats = from_cri(&usage, "fallback");
        assert_eq!(stats["name"], "eth0");
        assert_eq!(stats["rxBytes"], 10);
        assert_eq!(stats["rxErrors"], 0);
        assert_eq!(stats["txBytes"], 20);
        assert_eq!(stats["time"], "2023-11-14T22:13:20Z");
        assert_eq!(stats["interfaces"][0]["txErrors"], 1);
    }
}

//! The node's own object: registration, and the status setters (addresses, capacity and
//! allocatable, node info, daemon endpoints, conditions) sent every `nodeStatusUpdateFrequency`
//! when they changed and every `nodeStatusReportFrequency` regardless. A deleted Node is
//! registered again.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeRuntimeHandler,
    NodeRuntimeHandlerFeatures, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, GetParams, Patch, PatchParams, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::KUBELET_VERSION;
use crate::eviction::Pressure;
use crate::metrics::StartupStep;
use crate::types::Allocatable;

/// What the node is, fixed for the agent's lifetime.
#[derive(Clone, Debug)]
pub struct Config {
    pub name: String,
    /// Labels given with --node-labels (the well-known ones are added).
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<crate::config::Taint>,
    /// Create the Node when it does not exist (--register-node).
    pub register: bool,
    pub update_frequency: Duration,
    pub report_frequency: Duration,
    /// The authenticated API's port (daemonEndpoints.kubeletEndpoint).
    pub port: u16,
    /// --node-ip or the detected address.
    pub internal_ip: Option<String>,
    pub hostname: String,
    pub capacity: Allocatable,
    pub allocatable: Allocatable,
    pub info: NodeSystemInfo,
    /// `status.runtimeHandlers`: the runtime's handlers and what each supports.
    pub runtime_handlers: Vec<NodeRuntimeHandler>,
    /// The device plugins' extended resources, counted in capacity and allocatable.
    pub devices: Option<std::sync::Arc<crate::cm::devices::DeviceManager>>,
    /// `status.declaredFeatures`: the features the API server may send this node pods or
    /// changes needing (upstream's NodeDeclaredFeatures), sorted.
    pub declared_features: Vec<String>,
}

/// The runtime handlers as the Node's status lists them (the default one named `""`).
pub fn runtime_handlers(
    handlers: &[crate::runtime::cri::RuntimeHandler],
) -> Vec<NodeRuntimeHandler> {
    handlers
        .iter()
        .map(|h| NodeRuntimeHandler {
            name: Some(h.name.clone()),
            features: Some(NodeRuntimeHandlerFeatures {
                recursive_read_only_mounts: h.features.map(|f| f.recursive_read_only_mounts),
                user_namespaces: h.features.map(|f| f.user_namespaces),
            }),
        })
        .collect()
}

/// What the conditions are computed from.
#[derive(Clone)]
pub struct Signals {
    pub pleg: crate::pleg::Health,
    pub pressure: watch::Receiver<Pressure>,
    /// The runtime's own RuntimeReady and NetworkReady conditions.
    pub runtime: crate::runtime_state::RuntimeState,
    /// True once a graceful node shutdown began.
    pub shutting_down: watch::Receiver<bool>,
}

impl Signals {
    /// `Err(why)` when the node is not ready, as upstream words it (several reasons as its
    /// aggregate error prints them: `[a, b]`).
    fn ready(&self) -> Result<(), String> {
        let mut errors = Vec::new();
        if self.pleg.runtime_error().is_some() {
            errors.push("container runtime is down".to_string());
        }
        if let Err((age, threshold)) = self.pleg.check() {
            errors.push(format!(
                "PLEG is not healthy: pleg was last seen active {}; threshold is {}",
                crate::config::format_duration(age),
                crate::config::format_duration(threshold),
            ));
        }
        for e in self.runtime.errors() {
            if !errors.contains(&e) {
                errors.push(e);
            }
        }
        if *self.shutting_down.borrow() {
            errors.push("node is shutting down".into());
        }
        match errors.as_slice() {
            [] => Ok(()),
            [one] => Err(one.clone()),
            many => Err(format!("[{}]", many.join(", "))),
        }
    }
}

/// The labels every node carries, then the user's.
fn labels(config: &Config) -> BTreeMap<String, String> {
    let arch = host_arch();
    let mut labels = BTreeMap::from([
        (
            "kubernetes.io/hostname".to_string(),
            config.hostname.clone(),
        ),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), arch.to_string()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        ("beta.kubernetes.io/arch".to_string(), arch.to_string()),
    ]);
    labels.extend(config.labels.clone());
    labels
}

/// The Node as first registered.
pub fn initial(config: &Config, signals: &Signals) -> Node {
    let taints: Vec<Taint> = config
        .taints
        .iter()
        .map(|t| Taint {
            key: t.key.clone(),
            value: t.value.clone(),
            effect: t.effect.clone(),
            time_added: None,
        })
        .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(config.name.clone()),
            labels: Some(labels(config)),
            annotations: Some(BTreeMap::from([(
                "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            ..Default::default()
        }),
        status: Some(status(config, signals, None, crate::types::now())),
    }
}

/// GOARCH's name for this machine's architecture.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        "x86" => "386",
        other => other,
    }
}

/// Cores as a quantity: whole cores plainly, else millicores.
fn cpu(cores: f64) -> Quantity {
    let milli = (cores * 1000.0).round() as u64;
    if milli.is_multiple_of(1000) {
        Quantity((milli / 1000).to_string())
    } else {
        Quantity(format!("{milli}m"))
    }
}

/// Bytes as a quantity, in Ki when they divide evenly, as the kubelet reports memory.
fn bytes(n: f64) -> Quantity {
    let n = n.max(0.0) as u64;
    if n.is_multiple_of(1024) {
        Quantity(format!("{}Ki", n / 1024))
    } else {
        Quantity(n.to_string())
    }
}

fn resources(a: &Allocatable) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_string(), cpu(a.cpu)),
        ("memory".to_string(), bytes(a.memory)),
        ("ephemeral-storage".to_string(), bytes(a.ephemeral_storage)),
        ("pods".to_string(), Quantity(a.pods.to_string())),
    ])
}

/// One condition; its transition time is kept from `previous` while its status holds.
fn condition(
    kind: &str,
    on: bool,
    (reason, message): (&str, &str),
    previous: Option<&NodeStatus>,
    now: Time,
) -> NodeCondition {
    let status = if on { "True" } else { "False" };
    let since = previous
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == kind))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone());
    NodeCondition {
        type_: kind.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(since.unwrap_or(now)),
    }
}

/// The node's status now, with upstream's condition reasons and messages.
pub fn status(
    config: &Config,
    signals: &Signals,
    previous: Option<&NodeStatus>,
    now: k8s_openapi::jiff::Timestamp,
) -> NodeStatus {
    let conditions = conditions(signals, previous, Time(now));
    let (mut capacity, mut allocatable) =
        (resources(&config.capacity), resources(&config.allocatable));
    let extended = config.devices.as_ref().map(|d| d.resources());
    for (name, (all, healthy)) in extended.into_iter().flatten() {
        capacity.insert(name.clone(), Quantity(all.to_string()));
        allocatable.insert(name, Quantity(healthy.to_string()));
    }
    let addresses = config
        .internal_ip
        .iter()
        .map(|ip| ("InternalIP", ip))
        .chain([("Hostname", &config.hostname)])
        .map(|(kind, address)| NodeAddress {
            type_: kind.into(),
            address: address.clone(),
        })
        .collect();
    NodeStatus {
        addresses: Some(addresses),
        capacity: Some(capacity),
        allocatable: Some(allocatable),
        conditions: Some(conditions),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(config.port),
            }),
        }),
        node_info: Some(config.info.clone()),
        runtime_handlers: (!config.runtime_handlers.is_empty())
            .then(|| config.runtime_handlers.clone()),
        declared_features: (!config.declared_features.is_empty())
            .then(|| config.declared_features.clone()),
        ..Default::default()
    }
}

/// A condition's reason and message.
type Reason = (&'static str, &'static str);

/// The node's conditions: memory, disk and PID pressure, and Ready, each with upstream's
/// reasons and messages.
fn conditions(signals: &Signals, previous: Option<&NodeStatus>, now: Time) -> Vec<NodeCondition> {
    let pressure = *signals.pressure.borrow();
    let ready = signals.ready();
    let not_ready = ready.as_ref().err().cloned().unwrap_or_default();
    let rows: [(&str, bool, Reason, Reason); 3] = [
        (
            "MemoryPressure",
            pressure.memory,
            (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
            (
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
        ),
        (
            "DiskPressure",
            pressure.disk,
            ("KubeletHasDiskPressure", "kubelet has disk pressure"),
            ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ),
        (
            "PIDPressure",
            pressure.pid,
            (
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            ),
            (
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
        ),
    ];
    let mut out: Vec<NodeCondition> = rows
        .into_iter()
        .map(|(kind, on, yes, no)| {
            condition(kind, on, if on { yes } else { no }, previous, now.clone())
        })
        .collect();
    let why = match &ready {
        Ok(()) => ("KubeletReady", "kubelet is posting ready status"),
        Err(_) => ("KubeletNotReady", not_ready.as_str()),
    };
    out.push(condition("Ready", ready.is_ok(), why, previous, now));
    out
}

/// The status without its heartbeat times: what "changed" compares.
fn without_heartbeats(status: &NodeStatus) -> NodeStatus {
    let mut s = status.clone();
    for c in s.conditions.iter_mut().flatten() {
        c.last_heartbeat_time = None;
    }
    s
}

/// Facts about the machine the Node reports (`nodeInfo`).
pub fn system_info(runtime: &str, runtime_version: &str) -> NodeSystemInfo {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let os_image = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                l.strip_prefix("PRETTY_NAME=")
                    .map(|v| v.trim_matches('"').to_string())
            })
        })
        .unwrap_or_else(|| "Linux".into());
    let ids = crate::host::machine_ids();
    NodeSystemInfo {
        architecture: host_arch().into(),
        boot_id: ids.boot_id,
        container_runtime_version: format!("{runtime}://{runtime_version}"),
        kernel_version: read("/proc/sys/kernel/osrelease"),
        kube_proxy_version: String::new(),
        kubelet_version: KUBELET_VERSION.into(),
        machine_id: ids.machine_id,
        operating_system: "linux".into(),
        os_image,
        system_uuid: ids.system_uuid,
        ..Default::default()
    }
}

/// How long registration waits before trying again: upstream's 100 ms doubling to 7 s.
const REGISTER_FIRST: Duration = Duration::from_millis(100);
const REGISTER_MAX: Duration = Duration::from_secs(7);

/// Registers the node (or adopts the Node of that name) and returns its UID.
async fn register(nodes: &Api<Node>, config: &Config, signals: &Signals) -> kube::Result<String> {
    let node = initial(config, signals);
    crate::metrics::get().node_startup(StartupStep::Registering);
    match nodes.create(&PostParams::default(), &node).await {
        Ok(created) => {
            tracing::info!(node = %config.name, "registered the node");
            crate::metrics::get().node_startup(StartupStep::RegisteredNew);
            return Ok(created.metadata.uid.unwrap_or_default());
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    // The Node exists (an earlier run): keep it, with the labels this run registers with.
    let patch = serde_json::json!({"metadata": {"labels": labels(config)}});
    let node = nodes
        .patch(&config.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    tracing::info!(node = %config.name, "the node was registered before; updated its labels");
    Ok(node.metadata.uid.unwrap_or_default())
}

/// Keeps the Node registered and its status current until `cancel`. Its UID (once known, and
/// again after it was registered anew) is published on `uid`.
pub async fn run(
    client: kube::Client,
    config: Config,
    signals: Signals,
    uid: watch::Sender<Option<String>>,
    cancel: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    let mut registered = !config.register;
    let mut retry = REGISTER_FIRST;
    let mut sent: Option<(NodeStatus, Instant)> = None;
    let mut shutting_down = signals.shutting_down.clone();
    loop {
        let wait = if !registered {
            match register(&nodes, &config, &signals).await {
                Ok(id) => {
                    uid.send_replace(Some(id));
                    registered = true;
                    retry = REGISTER_FIRST;
                    sent = None;
                    Duration::ZERO
                }
                Err(e) => {
                    tracing::warn!(node = %config.name, error = %crate::types::error_chain(&e), "cannot register the node; trying again");
                    let wait = retry;
                    retry = (retry * 2).min(REGISTER_MAX);
                    wait
                }
            }
        } else if report(&nodes, &config, &signals, &uid, &mut sent).await {
            config.update_frequency
        } else {
            tracing::warn!(node = %config.name, "the Node is gone; registering it again");
            uid.send_replace(None);
            registered = false;
            continue;
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            // A node shutdown is told at once, as upstream.
            Ok(()) = shutting_down.changed() => {}
        }
    }
}

/// Whether the Node's Ready condition is True.
fn is_ready(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// One round of status reporting: the status is sent when it changed or its report is due.
/// False when the Node is gone and must be registered again.
async fn report(
    nodes: &Api<Node>,
    config: &Config,
    signals: &Signals,
    uid: &watch::Sender<Option<String>>,
    sent: &mut Option<(NodeStatus, Instant)>,
) -> bool {
    let previous = sent.as_ref().map(|(s, _)| s);
    let now = status(config, signals, previous, crate::types::now());
    let due = sent.as_ref().is_none_or(|(s, at)| {
        without_heartbeats(s) != without_heartbeats(&now) || at.elapsed() >= config.report_frequency
    });
    if !due {
        // The Node may be gone while its status stays the same: look (from the API server's
        // cache, as upstream) before deciding there is nothing to send.
        if config.register {
            match nodes
                .get_metadata_opt_with(&config.name, &GetParams::any())
                .await
            {
                Ok(None) => return false,
                Ok(Some(_)) => {}
                Err(e) => {
                    tracing::warn!(node = %config.name, error = %crate::types::error_chain(&e), "cannot read the Node")
                }
            }
        }
        return true;
    }
    let patch = serde_json::json!({"status": now});
    match nodes
        .patch_status(&config.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(node) => {
            if is_ready(&node) {
                crate::metrics::get().node_startup(StartupStep::Ready);
            }
            if uid.borrow().is_none() {
                uid.send_replace(node.metadata.uid);
            }
            *sent = Some((now, Instant::now()));
        }
        Err(kube::Error::Api(e)) if e.code == 404 && config.register => return false,
        Err(e) => {
            tracing::warn!(node = %config.name, error = %crate::types::error_chain(&e), "cannot update the node status")
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config {
            name: "n1".into(),
            labels: BTreeMap::from([("team".to_string(), "a".to_string())]),
            taints: vec![crate::config::Taint {
                key: "k".into(),
                value: None,
                effect: "NoSchedule".into(),
            }],
            register: true,
            update_frequency: Duration::from_secs(10),
            report_frequency: Duration::from_secs(300),
            port: 10250,
            internal_ip: Some("10.0.0.5".into()),
            hostname: "n1".into(),
            capacity: Allocatable {
                cpu: 2.0,
                memory: 4096.0 * 1024.0 * 1024.0,
                ephemeral_storage: 1e10,
                pods: 110,
            },
            allocatable: Allocatable {
                cpu: 1.9,
                memory: 3900.0 * 1024.0 * 1024.0,
                ephemeral_storage: 9e9,
                pods: 110,
            },
            info: system_info("containerd", "1.6.20"),
            runtime_handlers: runtime_handlers(&[crate::runtime::cri::RuntimeHandler {
                name: String::new(),
                features: Some(crate::runtime::cri::RuntimeHandlerFeatures {
                    recursive_read_only_mounts: true,
                    user_namespaces: true,
                }),
            }]),
            devices: None,
            declared_features: vec!["InPlacePodLevelResourcesVerticalScaling".into()],
        }
    }

    fn signals(pressure: Pressure) -> Signals {
        Signals {
            pleg: crate::pleg::Health::healthy_for_tests(),
            pressure: watch::channel(pressure).1,
            runtime: crate::runtime_state::RuntimeState::fixed(Vec::new()),
            shutting_down: watch::channel(false).1,
        }
    }

    #[tokio::test]
    async fn a_new_node_has_the_well_known_labels_taints_and_resources() {
        let node = initial(&config(), &signals(Pressure::default()));
        let labels = node.metadata.labels.unwrap();
        assert_eq!(labels["kubernetes.io/hostname"], "n1");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(labels["team"], "a");
        let taints = node.spec.unwrap().taints.unwrap();
        assert_eq!(
            (taints[0].key.as_str(), taints[0].effect.as_str()),
            ("k", "NoSchedule")
        );
        let status = node.status.unwrap();
        let alloc = status.allocatable.unwrap();
        assert_eq!(alloc["cpu"].0, "1900m");
        assert_eq!(alloc["memory"].0, "3993600Ki");
        assert_eq!(status.capacity.unwrap()["cpu"].0, "2");
        let info = status.node_info.unwrap();
        assert_eq!(info.container_runtime_version, "containerd://1.6.20");
        assert_eq!(info.kubelet_version, KUBELET_VERSION);
        assert_eq!(status.addresses.unwrap()[0].address, "10.0.0.5");
        let handlers = status.runtime_handlers.unwrap();
        assert_eq!(handlers[0].name.as_deref(), Some(""));
        let features = handlers[0].features.as_ref().unwrap();
        assert_eq!(
            (
                features.recursive_read_only_mounts,
                features.user_namespaces
            ),
            (Some(true), Some(true))
        );
        assert_eq!(
            status.declared_features,
            Some(vec!["InPlacePodLevelResourcesVerticalScaling".to_string()])
        );
    }

    #[tokio::test]
    async fn conditions_keep_their_transition_time_until_they_flip() {
        let c = config();
        let t0 = k8s_openapi::jiff::Timestamp::from_second(1000).unwrap();
        let t1 = k8s_openapi::jiff::Timestamp::from_second(2000).unwrap();
        let first = status(&c, &signals(Pressure::default()), None, t0);
        let same = status(&c, &signals(Pressure::default()), Some(&first), t1);
        assert_eq!(without_heartbeats(&first), without_heartbeats(&same));
        let memory = Pressure {
            memory: true,
            ..Default::default()
        };
        let flipped = status(&c, &signals(memory), Some(&same), t1);
        let cond = |s: &NodeStatus, kind: &str| {
            s.conditions
                .as_ref()
                .unwrap()
                .iter()
                .find(|c| c.type_ == kind)
                .cloned()
                .unwrap()
        };
        let m = cond(&flipped, "MemoryPressure");
        assert_eq!(m.status, "True");
        assert_eq!(m.reason.as_deref(), Some("KubeletHasInsufficientMemory"));
        assert_eq!(m.last_transition_time, Some(Time(t1)));
        let ready = cond(&flipped, "Ready");
        assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
        assert_eq!(ready.last_transition_time, Some(Time(t0)));
        let mut stopping = signals(Pressure::default());
        stopping.shutting_down = watch::channel(true).1;
        let ready = cond(&status(&c, &stopping, Some(&flipped), t1), "Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(ready.message.as_deref(), Some("node is shutting down"));
    }
}

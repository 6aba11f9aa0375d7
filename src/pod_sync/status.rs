//! PodStatus the upstream way, from the pod's spec, what the runtime holds and what the last
//! sync could not do: phase, conditions, container statuses, IPs, start time and QoS class. Pure.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{
    Container as SpecContainer, ContainerState as ApiState, ContainerStateRunning,
    ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, ContainerUser, HostIP,
    LinuxContainerUser, Pod, PodCondition, PodIP, PodStatus, ResourceRequirements,
    VolumeMountStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::convert::{ResourcesDigest, resources_digest};
use crate::pod::{qos_class, spec};
use crate::runtime::{Container, ContainerState, PodRuntime, SandboxState};

/// Why a container is not running, as the last sync found (e.g. `ErrImagePull` and the message).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

/// What probes say about one container; without probes a running container is ready and started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeState {
    pub ready: bool,
    pub started: bool,
}

/// Everything a status is computed from.
pub struct Input<'a> {
    pub pod: &'a Pod,
    pub rt: &'a PodRuntime,
    /// The current sandbox's IPs (empty for host-network pods or before the sandbox exists).
    pub pod_ips: Vec<String>,
    pub host_ip: &'a str,
    /// Per container name: why the last sync could not start it.
    pub waiting: &'a HashMap<String, Waiting>,
    /// Why the pod's last in-place resize could not be made.
    pub resize_error: Option<&'a str>,
    /// Per container ID: probe results.
    pub probes: &'a HashMap<String, ProbeState>,
    pub old: Option<&'a PodStatus>,
    pub now: Timestamp,
    /// The runtime's name, the scheme of container IDs (`containerd://<id>`).
    pub runtime_name: &'a str,
    /// Can the pod's runtime handler make recursive read-only mounts?
    pub rro_supported: bool,
}

fn time(nanos: i64) -> Option<Time> {
    (nanos > 0)
        .then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok())
        .flatten()
        .map(Time)
}

fn terminated(c: &Container, runtime: &str) -> ContainerStateTerminated {
    let reason = match c.reason.as_str() {
        "" if c.exit_code == 0 => "Completed".to_string(),
        "" => "Error".to_string(),
        other => other.to_string(),
    };
    ContainerStateTerminated {
        exit_code: c.exit_code,
        reason: Some(reason),
        message: (!c.message.is_empty()).then(|| c.message.clone()),
        started_at: time(c.started_at),
        finished_at: time(c.finished_at),
        container_id: Some(format!("{runtime}://{}", c.id)),
        signal: None,
    }
}

/// The resources a container runs with, as upstream reads them back from the runtime: its
/// spec's, and where it lists limits (or requests) but leaves cpu or memory to its pod's own
/// limits, those in their place (a cpu request, read from the shares its limit gave it).
fn running_resources(pod: &Pod, want: &SpecContainer) -> ResourceRequirements {
    let mut r = want.resources.clone().unwrap_or_default();
    let own = |limits: bool, key: &str| {
        crate::pod::container_quantity(want, limits, key).filter(|v| *v > 0.0)
    };
    let written = |key: &str, v: f64| {
        Quantity(if key == "cpu" {
            format!("{}m", (v * 1000.0).round() as u64)
        } else {
            crate::pod::format_quantity(v.round() as u64, true)
        })
    };
    if let Some(limits) = r.limits.as_mut() {
        for key in ["cpu", "memory"] {
            if own(true, key).is_none()
                && let Some(v) = crate::pod::pod_level(pod, true, key)
            {
                limits.insert(key.into(), written(key, v));
            }
        }
    }
    if let Some(requests) = r.requests.as_mut()
        && own(false, "cpu").is_none()
        && let Some(v) = own(true, "cpu").or_else(|| crate::pod::pod_level(pod, true, "cpu"))
    {
        requests.insert("cpu".into(), written("cpu", v));
    }
    r
}

fn waiting_state(reason: &str, message: &str) -> ApiState {
    ApiState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message: (!message.is_empty()).then(|| message.into()),
        }),
        ..Default::default()
    }
}

fn container_status(
    input: &Input<'_>,
    want: &SpecContainer,
    default_waiting: &str,
) -> ContainerStatus {
    let mut history = input.rt.containers.iter().filter(|c| c.name == want.name);
    let latest = history.next();
    let previous = history.next();
    let (state, last) = states(input, latest, previous, want, default_waiting);
    let running = state.running.is_some();
    let probes = latest
        .and_then(|c| input.probes.get(&c.id))
        .copied()
        .unwrap_or(ProbeState {
            ready: true,
            started: true,
        });
    ContainerStatus {
        name: want.name.clone(),
        image: want.image.clone().unwrap_or_default(),
        image_id: latest.map(|c| c.image_ref.clone()).unwrap_or_default(),
        container_id: latest.map(|c| format!("{}://{}", input.runtime_name, c.id)),
        ready: running && probes.ready,
        started: Some(running && probes.started),
        restart_count: latest.map_or(0, |c| c.attempt as i32),
        state: Some(state),
        last_state: Some(last.unwrap_or_default()),
        stop_signal: want.lifecycle.as_ref().and_then(|l| l.stop_signal.clone()),
        // A container the runtime has runs with its spec's resources (resized in place when
        // they change); as upstream, a container not created yet reports none.
        resources: latest.map(|_| running_resources(input.pod, want)),
        allocated_resources: latest.and_then(|_| want.resources.as_ref()?.requests.clone()),
        volume_mounts: latest.map(|_| volume_mounts(want, input.rro_supported)),
        user: latest.and_then(|c| c.user.as_ref()).map(|u| ContainerUser {
            linux: Some(LinuxContainerUser {
                uid: u.uid,
                gid: u.gid,
                supplemental_groups: (!u.supplemental_groups.is_empty())
                    .then(|| u.supplemental_groups.clone()),
            }),
        }),
        ..Default::default()
    }
}

/// A container's state and last state: from its latest and previous runtime containers, or
/// waiting with the reason the sync recorded (else `default_waiting`).
fn states(
    input: &Input<'_>,
    latest: Option<&Container>,
    previous: Option<&Container>,
    want: &SpecContainer,
    default_waiting: &str,
) -> (ApiState, Option<ApiState>) {
    let terminated_state = |c: &Container| ApiState {
        terminated: Some(terminated(c, input.runtime_name)),
        ..Default::default()
    };
    match (latest, input.waiting.get(&want.name)) {
        (Some(c), _) if c.state == ContainerState::Running => (
            ApiState {
                running: Some(ContainerStateRunning {
                    started_at: time(c.started_at),
                }),
                ..Default::default()
            },
            previous
                .filter(|p| p.state == ContainerState::Exited)
                .map(terminated_state),
        ),
        (Some(c), Some(w)) if c.state == ContainerState::Exited => (
            waiting_state(&w.reason, &w.message),
            Some(terminated_state(c)),
        ),
        (Some(c), None) if c.state == ContainerState::Exited => (
            terminated_state(c),
            previous
                .filter(|p| p.state == ContainerState::Exited)
                .map(terminated_state),
        ),
        (Some(c), _) if c.state == ContainerState::Unknown => (
            ApiState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some("ContainerStatusUnknown".into()),
                    message: Some(
                        "The container could not be located when the pod was terminated".into(),
                    ),
                    container_id: Some(format!("{}://{}", input.runtime_name, c.id)),
                    ..Default::default()
                }),
                ..Default::default()
            },
            None,
        ),
        (_, Some(w)) => (waiting_state(&w.reason, &w.message), None),
        (_, None) => (waiting_state(default_waiting, ""), None),
    }
}

/// Statuses ordered by container name, as upstream orders app and ephemeral containers'
/// (init containers' keep their spec's order).
fn by_name(mut statuses: Vec<ContainerStatus>) -> Vec<ContainerStatus> {
    statuses.sort_by(|a, b| a.name.cmp(&b.name));
    statuses
}

/// The container's mounts as upstream reports them: a read-only one says whether it is
/// recursively read-only.
fn volume_mounts(want: &SpecContainer, rro_supported: bool) -> Vec<VolumeMountStatus> {
    want.volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            let read_only = m.read_only.unwrap_or(false);
            let recursive =
                super::convert::recursive_read_only(m, read_only, rro_supported).unwrap_or(false);
            VolumeMountStatus {
                name: m.name.clone(),
                mount_path: m.mount_path.clone(),
                read_only: read_only.then_some(true),
                recursive_read_only: read_only
                    .then(|| if recursive { "Enabled" } else { "Disabled" }.to_string()),
                ..Default::default()
            }
        })
        .collect()
}

fn succeeded(s: &ContainerStatus) -> bool {
    s.state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .is_some_and(|t| t.exit_code == 0)
}

fn failed(s: &ContainerStatus) -> bool {
    s.state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .is_some_and(|t| t.exit_code != 0)
}

/// The containers of a pod by kind, for [`phase`].
pub struct Kinds<'a> {
    /// The regular init containers.
    pub init: &'a [ContainerStatus],
    /// The restartable init containers.
    pub sidecars: &'a [ContainerStatus],
    pub app: &'a [ContainerStatus],
}

/// The pod phase by the upstream rules (kubelet getPhase). `initializing` says the pod is not
/// initialized yet (its sidecars have not started). A running sidecar keeps the pod Running;
/// one that stopped does not count.
pub fn phase(restart_policy: &str, kinds: &Kinds<'_>, initializing: bool) -> &'static str {
    let mut pending_init = initializing;
    for s in kinds.init {
        if succeeded(s) {
            continue;
        }
        if failed(s) && restart_policy == "Never" {
            return "Failed";
        }
        pending_init = true;
    }
    let (mut running, mut waiting, mut stopped, mut ok) = (0, 0, 0, 0);
    for s in kinds.sidecars {
        let state = s.state.clone().unwrap_or_default();
        if state.running.is_some() {
            running += 1;
        } else if state.waiting.is_some()
            && s.last_state.as_ref().is_none_or(|l| l.terminated.is_none())
        {
            waiting += 1;
        }
    }
    for s in kinds.app {
        let state = s.state.clone().unwrap_or_default();
        if state.running.is_some() {
            running += 1;
        } else if let Some(t) = &state.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                ok += 1;
            }
        } else if s
            .last_state
            .as_ref()
            .is_some_and(|l| l.terminated.is_some())
        {
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    if pending_init || waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        return match restart_policy {
            "Always" => "Running",
            _ if stopped == ok => "Succeeded",
            "Never" => "Failed",
            _ => "Running",
        };
    }
    "Pending"
}

fn condition(
    old: Option<&PodStatus>,
    now: &Timestamp,
    kind: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let previous = old
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == kind))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone());
    PodCondition {
        type_: kind.into(),
        status: status.into(),
        last_transition_time: Some(previous.unwrap_or(Time(*now))),
        reason: if ok { None } else { reason.map(String::from) },
        message: if ok { None } else { message },
        ..Default::default()
    }
}

/// Why each of the pod's readiness gates is not passed, as upstream words it: the gates'
/// conditions are set by others on the pod's status in its source (the API server).
fn unready_gates(pod: &Pod) -> Vec<String> {
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    spec(pod)
        .readiness_gates
        .iter()
        .flatten()
        .filter_map(|gate| {
            let kind = &gate.condition_type;
            match conditions.iter().find(|c| &c.type_ == kind) {
                None => Some(format!(
                    "corresponding condition of pod readiness gate {kind:?} does not exist."
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate {kind:?} is not \"True\", but {}",
                    c.status
                )),
                Some(_) => None,
            }
        })
        .collect()
}

/// The in-place resize conditions, present only while true: PodResizePending while the spec's
/// resources wait for room (Deferred), PodResizeInProgress while a running container has other
/// resources than the ones allocated to it, or with reason Error while the resize cannot be
/// made.
fn resize_conditions(input: &Input<'_>) -> Vec<PodCondition> {
    let s = spec(input.pod);
    let in_progress = input.rt.containers.iter().any(|c| {
        c.state == ContainerState::Running
            && crate::pod::all_containers(s)
                .find(|w| w.name == c.name)
                .zip(ResourcesDigest::decode(&c.resources))
                .is_some_and(|(want, have)| resources_digest(input.pod, want) != have)
    });
    let pending = crate::pod::resize::pending(input.pod);
    let progress = match input.resize_error {
        Some(error) => Some(("Error", error)),
        None => in_progress.then_some(("", "")),
    };
    let shown = [
        ("PodResizePending", pending.map(|m| ("Deferred", m))),
        ("PodResizeInProgress", progress),
    ];
    shown
        .into_iter()
        .filter_map(|(kind, state)| {
            let (reason, message) = state?;
            let before = input
                .old
                .and_then(|o| o.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == kind));
            let now = Some(Time(input.now));
            Some(PodCondition {
                type_: kind.into(),
                status: "True".into(),
                reason: (!reason.is_empty()).then(|| reason.into()),
                message: (!message.is_empty()).then(|| message.into()),
                last_probe_time: now.clone(),
                last_transition_time: before.and_then(|b| b.last_transition_time.clone()).or(now),
                ..Default::default()
            })
        })
        .collect()
}

/// The pod's container statuses by kind, and how far its init containers got.
struct Statuses {
    /// Every init container's, sidecars included, in spec order.
    init: Vec<ContainerStatus>,
    regular_init: Vec<ContainerStatus>,
    sidecars: Vec<ContainerStatus>,
    app: Vec<ContainerStatus>,
    /// The init containers not done yet.
    incomplete: Vec<String>,
}

impl Statuses {
    fn initialized(&self) -> bool {
        self.incomplete.is_empty()
    }

    fn kinds(&self) -> Kinds<'_> {
        Kinds {
            init: &self.regular_init,
            sidecars: &self.sidecars,
            app: &self.app,
        }
    }
}

/// Each container's status, and whether the init containers are done.
fn statuses(input: &Input<'_>) -> Statuses {
    let s = spec(input.pod);
    let is_sidecar: Vec<bool> = s
        .init_containers
        .iter()
        .flatten()
        .map(crate::pod_sync::actions::is_sidecar)
        .collect();
    // A regular init container is ready once it succeeded (upstream's rule); a sidecar as any
    // running container.
    let init: Vec<ContainerStatus> = s
        .init_containers
        .iter()
        .flatten()
        .zip(&is_sidecar)
        .map(|(c, &sidecar)| {
            let status = container_status(input, c, "PodInitializing");
            ContainerStatus {
                ready: if sidecar {
                    status.ready
                } else {
                    succeeded(&status)
                },
                ..status
            }
        })
        .collect();
    // A regular init container is done when it succeeded; a sidecar once it runs and started.
    // Once an app container has run, the pod stays initialized whatever its sidecars do.
    let app_started = input
        .rt
        .containers
        .iter()
        .any(|c| s.containers.iter().any(|w| w.name == c.name));
    let done = |sidecar: bool, c: &ContainerStatus| {
        if sidecar {
            app_started
                || (c.state.as_ref().is_some_and(|st| st.running.is_some())
                    && c.started == Some(true))
        } else {
            succeeded(c)
        }
    };
    let incomplete: Vec<String> = init
        .iter()
        .zip(&is_sidecar)
        .filter(|&(c, &sidecar)| !done(sidecar, c))
        .map(|(c, _)| c.name.clone())
        .collect();
    let app_default = if incomplete.is_empty() {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let app = s
        .containers
        .iter()
        .map(|c| container_status(input, c, app_default))
        .collect();
    let (sidecars, regular_init): (Vec<_>, Vec<_>) = init
        .iter()
        .cloned()
        .zip(&is_sidecar)
        .partition(|(_, sidecar)| **sidecar);
    Statuses {
        regular_init: regular_init.into_iter().map(|(c, _)| c).collect(),
        sidecars: sidecars.into_iter().map(|(c, _)| c).collect(),
        init,
        app,
        incomplete,
    }
}

/// The pod's phase by upstream's rules, held back while a container still runs, and kept
/// once a pod that does not restart finished.
fn pod_phase(input: &Input<'_>, statuses: &Statuses) -> &'static str {
    let policy = spec(input.pod)
        .restart_policy
        .as_deref()
        .unwrap_or("Always");
    let mut phase = phase(policy, &statuses.kinds(), !statuses.initialized());
    // A pod is not reported finished while any of its containers still runs (upstream holds
    // the terminal phase back until the pod's termination is done): the phase stays the old one.
    if (phase == "Succeeded" || phase == "Failed")
        && input
            .rt
            .containers
            .iter()
            .any(|c| c.state == ContainerState::Running)
    {
        phase = match input.old.and_then(|o| o.phase.as_deref()) {
            Some("Running") => "Running",
            _ => "Pending",
        };
    }
    // A pod that finished stays finished, whatever the runtime later loses.
    if policy != "Always"
        && let Some(old) = input.old.and_then(|o| o.phase.as_deref())
        && (old == "Succeeded" || old == "Failed")
    {
        phase = if old == "Succeeded" {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    phase
}

/// The pod's conditions: sandbox, initialized, ready (with readiness gates), containers
/// ready, scheduled and the resize conditions, each for the spec generation it describes.
fn pod_conditions(input: &Input<'_>, statuses: &Statuses, terminal: bool) -> Vec<PodCondition> {
    // Sidecars count for readiness as the app containers do (upstream, since sidecars).
    let unready: Vec<&str> = statuses
        .sidecars
        .iter()
        .chain(&statuses.app)
        .filter(|c| !c.ready)
        .map(|c| c.name.as_str())
        .collect();
    let unready_message = format!("containers with unready status: [{}]", unready.join(" "));
    let gates = unready_gates(input.pod);
    let (ready_reason, ready_message) = if terminal {
        ("PodCompleted", None)
    } else if unready.is_empty() && !gates.is_empty() {
        ("ReadinessGatesNotReady", Some(gates.join(", ")))
    } else {
        ("ContainersNotReady", Some(unready_message.clone()))
    };
    let sandbox_ready = input
        .rt
        .latest_sandbox()
        .is_some_and(|sb| sb.state == SandboxState::Ready);
    let (old, now) = (input.old, &input.now);
    let conditions = [
        condition(
            old,
            now,
            "PodReadyToStartContainers",
            sandbox_ready,
            None,
            None,
        ),
        condition(
            old,
            now,
            "Initialized",
            statuses.initialized(),
            Some("ContainersNotInitialized"),
            Some(format!(
                "containers with incomplete status: [{}]",
                statuses.incomplete.join(" ")
            )),
        ),
        condition(
            old,
            now,
            "Ready",
            unready.is_empty() && gates.is_empty() && !terminal,
            Some(ready_reason),
            ready_message,
        ),
        condition(
            old,
            now,
            "ContainersReady",
            unready.is_empty() && !terminal,
            Some(if terminal {
                "PodCompleted"
            } else {
                "ContainersNotReady"
            }),
            (!terminal).then_some(unready_message),
        ),
        condition(old, now, "PodScheduled", true, None, None),
    ];
    // Which spec this status describes (upstream's observedGeneration, on the pod and on the
    // conditions the node owns).
    conditions
        .into_iter()
        .chain(resize_conditions(input))
        .map(|c| PodCondition {
            observed_generation: input.pod.metadata.generation,
            ..c
        })
        .collect()
}

/// Computes the pod's status.
pub fn generate(input: &Input<'_>) -> PodStatus {
    let s = spec(input.pod);
    let statuses = statuses(input);
    let phase = pod_phase(input, &statuses);
    let conditions = pod_conditions(input, &statuses, phase == "Succeeded" || phase == "Failed");
    // Ephemeral containers are never ready and count for nothing else (upstream).
    let ephemeral: Vec<ContainerStatus> = crate::pod::ephemeral_containers(s)
        .iter()
        .map(|c| ContainerStatus {
            ready: false,
            ..container_status(input, c, "ContainerCreating")
        })
        .collect();
    let host_network = s.host_network.unwrap_or(false);
    let pod_ips: Vec<String> = if host_network && !input.host_ip.is_empty() {
        vec![input.host_ip.to_string()]
    } else {
        input.pod_ips.clone()
    };
    let host_ip = (!input.host_ip.is_empty()).then(|| input.host_ip.to_string());
    let Statuses { init, app, .. } = statuses;
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        host_ips: host_ip.clone().map(|ip| vec![HostIP { ip }]),
        host_ip,
        pod_ip: pod_ips.first().cloned(),
        pod_ips: (!pod_ips.is_empty())
            .then(|| pod_ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect()),
        start_time: Some(
            input
                .old
                .and_then(|o| o.start_time.clone())
                .unwrap_or(Time(input.now)),
        ),
        qos_class: Some(qos_class(input.pod).into()),
        init_container_statuses: (!init.is_empty()).then_some(init),
        container_statuses: Some(by_name(app)),
        ephemeral_container_statuses: (!ephemeral.is_empty()).then(|| by_name(ephemeral)),
        observed_generation: input.pod.metadata.generation,
        allocated_resources: pod_resources(input.pod, false),
        resources: pod_requirements(input.pod),
        // The names of the claims made for the pod, as the API server has them (the
        // resource claim controller sets them; the node and its clients read them).
        resource_claim_statuses: (input.pod.status.as_ref())
            .and_then(|s| s.resource_claim_statuses.clone()),
        extended_resource_claim_status: (input.pod.status.as_ref())
            .and_then(|s| s.extended_resource_claim_status.clone()),
        ..Default::default()
    }
}

/// The pod's requests and limits together (upstream's pod-level resources status), none for a
/// pod that has neither.
fn pod_requirements(pod: &Pod) -> Option<ResourceRequirements> {
    let (requests, limits) = (pod_resources(pod, false), pod_resources(pod, true));
    (requests.is_some() || limits.is_some()).then(|| ResourceRequirements {
        requests,
        limits,
        ..Default::default()
    })
}

/// The pod's total requests (or `limits`) of each resource, as upstream's PodRequests and
/// PodLimits compute them from the spec: its containers summed (sidecars and init containers
/// counted as [`crate::cm::pod_total`] does), the pod-level resources in their place where the
/// spec has them, and the overhead added (to every request; to limits that are set). Upstream
/// reads a running pod's CPU and memory back from its cgroup, which nodelet sets from these
/// same figures. None when there are none.
fn pod_resources(pod: &Pod, limits: bool) -> Option<BTreeMap<String, Quantity>> {
    let s = crate::pod::spec(pod);
    // Each resource's first spelling decides the units its total is written in.
    let mut first: BTreeMap<String, String> = BTreeMap::new();
    for c in crate::pod::all_containers(s) {
        for (name, q) in quantities(c.resources.as_ref(), limits) {
            first.entry(name.clone()).or_insert_with(|| q.0.clone());
        }
    }
    let pod_level: BTreeMap<&String, &Quantity> = quantities(s.resources.as_ref(), limits)
        .filter(|(name, _)| crate::pod::pod_level_resource(name))
        .collect();
    let overhead = s.overhead.iter().flatten();
    for (name, q) in pod_level.iter().map(|(n, q)| (*n, *q)).chain(overhead) {
        if !limits || pod_level.contains_key(name) || first.contains_key(name) {
            first.entry(name.clone()).or_insert_with(|| q.0.clone());
        }
    }
    let units = |name: &str, q: &Quantity| {
        let scale = if name == "cpu" { 1e3 } else { 1.0 };
        crate::pod::parse_quantity(&q.0).map_or(0, |v| (v * scale).round().max(0.0) as u64)
    };
    let summed = crate::cm::pod_totals(pod, |c| {
        quantities(c.resources.as_ref(), limits)
            .map(|(name, q)| (name.clone(), units(name, q)))
            .collect()
    });
    let out: BTreeMap<String, Quantity> = first
        .into_iter()
        .map(|(name, text)| {
            let mut total = match pod_level.get(&name) {
                Some(q) => units(&name, q),
                None => summed.get(&name).copied().unwrap_or(0),
            };
            let overhead = s.overhead.as_ref().and_then(|o| o.get(&name));
            if let Some(q) = overhead.filter(|_| !limits || total > 0) {
                total = total.saturating_add(units(&name, q));
            }
            (name.clone(), Quantity(written(&name, total, &text)))
        })
        .collect();
    (!out.is_empty()).then_some(out)
}

/// The requests (or `limits`) of `r`.
fn quantities(
    r: Option<&ResourceRequirements>,
    limits: bool,
) -> impl Iterator<Item = (&String, &Quantity)> {
    let map = if limits {
        r.and_then(|r| r.limits.as_ref())
    } else {
        r.and_then(|r| r.requests.as_ref())
    };
    map.into_iter().flatten()
}

/// A total in the units of `like` (one of its addends): millicores for cpu, binary units for a
/// quantity written in them, decimal ones otherwise; the largest unit that divides it.
fn written(name: &str, total: u64, like: &str) -> String {
    if name == "cpu" {
        return if total.is_multiple_of(1000) {
            (total / 1000).to_string()
        } else {
            format!("{total}m")
        };
    }
    crate::pod::format_quantity(total, like.ends_with('i'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Sandbox;
    use crate::types::PodUid;

    fn status(state: ApiState, last: Option<ApiState>) -> ContainerStatus {
        ContainerStatus {
            state: Some(state),
            last_state: last,
            ..Default::default()
        }
    }

    fn running() -> ApiState {
        ApiState {
            running: Some(Default::default()),
            ..Default::default()
        }
    }

    fn exited(code: i32) -> ApiState {
        ApiState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn waiting() -> ApiState {
        waiting_state("ContainerCreating", "")
    }

    #[test]
    fn phases_follow_the_upstream_table() {
        let cases: Vec<(&str, Vec<ContainerStatus>, Vec<ContainerStatus>, &str)> = vec![
            ("Always", vec![], vec![status(waiting(), None)], "Pending"),
            (
                "Always",
                vec![],
                vec![status(running(), None), status(waiting(), None)],
                "Pending",
            ),
            (
                "Always",
                vec![],
                vec![status(running(), None), status(exited(1), None)],
                "Running",
            ),
            ("Always", vec![], vec![status(exited(0), None)], "Running"),
            (
                "Always",
                vec![],
                vec![status(
                    waiting_state("CrashLoopBackOff", ""),
                    Some(exited(1)),
                )],
                "Running",
            ),
            (
                "OnFailure",
                vec![],
                vec![status(exited(0), None)],
                "Succeeded",
            ),
            (
                "OnFailure",
                vec![],
                vec![status(exited(2), None)],
                "Running",
            ),
            (
                "Never",
                vec![],
                vec![status(exited(0), None), status(exited(0), None)],
                "Succeeded",
            ),
            (
                "Never",
                vec![],
                vec![status(exited(0), None), status(exited(3), None)],
                "Failed",
            ),
            (
                "Never",
                vec![status(exited(1), None)],
                vec![status(waiting(), None)],
                "Failed",
            ),
            (
                "Always",
                vec![status(exited(1), None)],
                vec![status(waiting(), None)],
                "Pending",
            ),
            (
                "Always",
                vec![status(exited(0), None)],
                vec![status(running(), None)],
                "Running",
            ),
        ];
        for (i, (policy, init, app, want)) in cases.into_iter().enumerate() {
            let kinds = Kinds {
                init: &init,
                sidecars: &[],
                app: &app,
            };
            assert_eq!(phase(policy, &kinds, false), want, "case {i}");
        }
    }

    #[test]
    fn a_running_sidecar_keeps_a_completed_pod_running_and_a_stopped_one_does_not_count() {
        let app = [status(exited(0), None)];
        let with = |sidecar: ContainerStatus| {
            let sidecars = [sidecar];
            let kinds = Kinds {
                init: &[],
                sidecars: &sidecars,
                app: &app,
            };
            phase("Never", &kinds, false)
        };
        assert_eq!(with(status(running(), None)), "Running");
        assert_eq!(with(status(exited(137), None)), "Succeeded");
        assert_eq!(
            with(status(
                waiting_state("CrashLoopBackOff", ""),
                Some(exited(1))
            )),
            "Succeeded"
        );
        assert_eq!(with(status(waiting(), None)), "Pending");
    }

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u", "namespace": "default"},
            "spec": {"restartPolicy": "Always", "initContainers": [{"name": "init", "image": "i"}],
                     "containers": [{"name": "a", "image": "busybox:1"}]}
        }))
        .unwrap()
    }

    fn input<'a>(
        pod: &'a Pod,
        rt: &'a PodRuntime,
        waiting: &'a HashMap<String, Waiting>,
        old: Option<&'a PodStatus>,
        probes: &'a HashMap<String, ProbeState>,
    ) -> Input<'a> {
        Input {
            pod,
            rt,
            pod_ips: vec!["10.0.0.5".into()],
            host_ip: "192.0.2.1",
            waiting,
            resize_error: None,
            probes,
            old,
            now: Timestamp::from_second(1_000).unwrap(),
            runtime_name: "containerd",
            rro_supported: false,
        }
    }

    fn container(
        id: &str,
        name: &str,
        attempt: u32,
        state: ContainerState,
        code: i32,
    ) -> Container {
        Container {
            id: id.into(),
            sandbox_id: "s".into(),
            name: name.into(),
            attempt,
            state,
            exit_code: code,
            started_at: 5_000_000_000,
            ..Default::default()
        }
    }

    fn runtime(containers: Vec<Container>) -> PodRuntime {
        PodRuntime {
            sandboxes: vec![Sandbox {
                id: "s".into(),
                uid: PodUid("u".into()),
                name: "p".into(),
                namespace: "default".into(),
                attempt: 0,
                state: SandboxState::Ready,
                created_at: 0,
                annotations: Default::default(),
                has_pod_labels: true,
            }],
            containers,
        }
    }

    #[test]
    fn a_pod_waiting_for_init_reports_pod_initializing() {
        let p = pod();
        let rt = runtime(vec![container("i1", "init", 0, ContainerState::Running, 0)]);
        let none = HashMap::new();
        let probes = HashMap::new();
        let st = generate(&input(&p, &rt, &none, None, &probes));
        assert_eq!(st.phase.as_deref(), Some("Pending"));
        let app = &st.container_statuses.as_ref().unwrap()[0];
        assert_eq!(
            app.state
                .as_ref()
                .unwrap()
                .waiting
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("PodInitializing")
        );
        let init = &st.init_container_statuses.as_ref().unwrap()[0];
        assert!(init.state.as_ref().unwrap().running.is_some());
        assert!(!init.ready, "a running init container is not ready yet");
        let initialized = st
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Initialized")
            .unwrap();
        assert_eq!(initialized.status, "False");
        assert_eq!(st.pod_ip.as_deref(), Some("10.0.0.5"));
        assert_eq!(st.qos_class.as_deref(), Some("BestEffort"));
    }

    #[test]
    fn a_running_pod_is_ready_and_keeps_transition_times() {
        let mut p = pod();
        p.metadata.generation = Some(3);
        let rt = runtime(vec![
            container("a2", "a", 1, ContainerState::Running, 0),
            container("a1", "a", 0, ContainerState::Exited, 137),
            container("i1", "init", 0, ContainerState::Exited, 0),
        ]);
        let none = HashMap::new();
        let probes = HashMap::new();
        let first = generate(&input(&p, &rt, &none, None, &probes));
        assert_eq!(first.phase.as_deref(), Some("Running"));
        let a = &first.container_statuses.as_ref().unwrap()[0];
        assert!(a.ready);
        assert_eq!(a.restart_count, 1);
        assert_eq!(a.container_id.as_deref(), Some("containerd://a2"));
        let last = a.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            (last.exit_code, last.reason.as_deref()),
            (137, Some("Error"))
        );
        let mut later = input(&p, &rt, &none, Some(&first), &probes);
        later.now = Timestamp::from_second(2_000).unwrap();
        let second = generate(&later);
        assert_eq!(
            second.conditions, first.conditions,
            "no transition, same times"
        );
        assert_eq!(second.start_time, first.start_time);
        assert_eq!(first.observed_generation, Some(3), "the spec it describes");
        assert!(
            first.init_container_statuses.as_ref().unwrap()[0].ready,
            "an init container that succeeded is ready"
        );
        assert!(
            first
                .conditions
                .iter()
                .flatten()
                .all(|c| c.observed_generation == Some(3))
        );

        let unready: HashMap<String, ProbeState> = [(
            "a2".to_string(),
            ProbeState {
                ready: false,
                started: true,
            },
        )]
        .into();
        let third = generate(&input(&p, &rt, &none, Some(&first), &unready));
        let ready = third
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(
            ready.message.as_deref(),
            Some("containers with unready status: [a]")
        );
    }

    #[test]
    fn a_failed_start_shows_its_reason() {
        let p = pod();
        let rt = runtime(vec![container("i1", "init", 0, ContainerState::Exited, 0)]);
        let waiting: HashMap<String, Waiting> = [(
            "a".to_string(),
            Waiting {
                reason: "ErrImageNeverPull".into(),
                message: "no image".into(),
            },
        )]
        .into();
        let probes = HashMap::new();
        let st = generate(&input(&p, &rt, &waiting, None, &probes));
        let w = st.container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .waiting
            .unwrap();
        assert_eq!(w.reason.as_deref(), Some("ErrImageNeverPull"));
        assert_eq!(st.phase.as_deref(), Some("Pending"));
    }

    #[test]
    fn pod_level_resources_sum_containers_and_add_the_overhead() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u", "namespace": "default"},
            "spec": {
                "overhead": {"cpu": "10m", "memory": "1Mi"},
                "initContainers": [
                    {"name": "init", "image": "i", "resources": {"requests": {"cpu": "2"}}},
                    {"name": "side", "image": "i", "restartPolicy": "Always",
                     "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}}}
                ],
                "containers": [
                    {"name": "a", "image": "i", "resources": {
                        "requests": {"cpu": "250m", "memory": "32Mi"},
                        "limits": {"memory": "64Mi"}}},
                    {"name": "b", "image": "i"}
                ]
            }
        }))
        .unwrap();
        let q = |m: Option<BTreeMap<String, Quantity>>| -> Vec<(String, String)> {
            m.unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect()
        };
        // The regular init container's 2 CPUs (before the sidecar starts) outweigh the apps'
        // with the sidecar; memory is the sidecar's and the apps'; the overhead goes on top.
        assert_eq!(
            q(pod_resources(&pod, false)),
            [
                ("cpu".into(), "2010m".into()),
                ("memory".into(), "49Mi".into())
            ]
        );
        assert_eq!(
            q(pod_resources(&pod, true)),
            [("memory".into(), "65Mi".into())]
        );
        let mut level = pod.clone();
        let spec = level.spec.as_mut().unwrap();
        spec.resources = Some(ResourceRequirements {
            requests: Some([("memory".to_string(), Quantity("1Gi".into()))].into()),
            ..Default::default()
        });
        spec.overhead = None;
        assert_eq!(
            q(pod_resources(&level, false)),
            [("cpu".into(), "2".into()), ("memory".into(), "1Gi".into())]
        );
        let empty =
            serde_json::json!({"metadata": {"name": "e"}, "spec": {"containers": [{"name": "c"}]}});
        assert!(pod_requirements(&serde_json::from_value(empty).unwrap()).is_none());
    }
}

//! The device manager: device plugins (API v1beta1) register on
//! `<root-dir>/device-plugins/kubelet.sock` and list their devices; each extended resource a
//! plugin serves counts in the node's capacity (every device) and allocatable (the healthy
//! ones). Admission reserves a pod's devices by count; the devices themselves are chosen when a
//! container first starts (the plugin's preferred allocation where it offers one; a regular
//! init container's devices go on to the containers after it), the plugin's Allocate answer
//! (environment, mounts, device nodes, annotations) is kept in the checkpoint
//! `kubelet_internal_checkpoint` beside the socket and applied at every start of the container,
//! after the plugin's PreStartContainer where it asks for one.

mod checkpoint;
pub mod plugin;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::numa::NumaMask;
use super::topology::{HintProvider, Hints, unit_hints};
use crate::types::Refusal;

/// The generated messages, servers and clients of the device plugin API.
pub mod proto {
    tonic::include_proto!("v1beta1");
}

/// The API version nodelet speaks, as plugins name it when they register.
pub const VERSION: &str = "v1beta1";
/// The registration socket's name in the device plugin dir.
pub const SOCKET: &str = "kubelet.sock";
/// How long a plugin that went away keeps its devices in the node's capacity (upstream's
/// endpointStopGracePeriod); they are unhealthy, so not allocatable, meanwhile.
const STOP_GRACE: Duration = Duration::from_secs(300);
/// How long a plugin has to answer a call (upstream's PreStartContainer timeout, used for
/// every call: devices are chosen one container at a time, so a plugin that hangs must not
/// hold back the others' choices for long).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no device plugin serves {0}")]
    NoPlugin(String),
    #[error(
        "requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}"
    )]
    Unavailable {
        resource: String,
        requested: usize,
        available: usize,
    },
    #[error("the device plugin of {resource} failed to {call}")]
    Plugin {
        resource: String,
        call: &'static str,
        #[source]
        source: tonic::Status,
    },
    #[error(
        "the device plugin of {resource} did not {call} within {:?}",
        CALL_TIMEOUT
    )]
    Timeout {
        resource: String,
        call: &'static str,
    },
    #[error("the device plugin of {0} answered Allocate with no response for the container")]
    NoResponse(String),
}

/// One device as its plugin last listed it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Device {
    healthy: bool,
    /// The NUMA nodes it is near (none: no topology).
    numa: Vec<i64>,
}

/// An extended resource that a plugin serves or served.
#[derive(Debug, Default)]
struct Resource {
    devices: BTreeMap<String, Device>,
    options: proto::DevicePluginOptions,
    /// The plugin's client while it serves the resource.
    client: Option<plugin::Client>,
    /// Which registration owns the resource (a newer one replaces an older one).
    registration: u64,
    /// When its plugin went away.
    stopped: Option<Instant>,
}

/// The devices a container holds of one resource and what the plugin answered for them.
#[derive(Clone, Debug, PartialEq)]
struct Held {
    ids: Vec<String>,
    response: proto::ContainerAllocateResponse,
}

/// A pod's devices: what admission reserved, and what each container holds.
#[derive(Debug, Default)]
struct PodDevices {
    needs: BTreeMap<String, usize>,
    /// container -> resource -> devices.
    containers: BTreeMap<String, BTreeMap<String, Held>>,
    /// container -> the NUMA nodes the topology manager aligned it to.
    affinity: BTreeMap<String, NumaMask>,
}

impl PodDevices {
    fn held(&self, resource: &str) -> BTreeSet<&str> {
        self.containers
            .values()
            .filter_map(|c| c.get(resource))
            .flat_map(|h| h.ids.iter().map(String::as_str))
            .collect()
    }
}

#[derive(Debug, Default)]
struct State {
    resources: BTreeMap<String, Resource>,
    pods: BTreeMap<String, PodDevices>,
}

/// The device manager; cheap to share.
#[derive(Debug)]
pub struct DeviceManager {
    dir: PathBuf,
    state: Mutex<State>,
    /// Told of the pods whose devices' health changed.
    health: super::HealthUpdates,
    /// Serializes the choice of devices with the plugin calls that make it.
    choosing: tokio::sync::Mutex<()>,
}

/// A device's NUMA nodes as ids.
fn numa_nodes(numa: &[i64]) -> Vec<u32> {
    numa.iter().filter_map(|n| u32::try_from(*n).ok()).collect()
}

impl DeviceManager {
    /// Upstream's device topology hints: for each resource whose devices say where they sit
    /// (among the machine's NUMA nodes), the nodes with enough free devices (or those the
    /// container holds already).
    fn hints_for(
        &self,
        machine: &[u32],
        pod: &Pod,
        wanted: BTreeMap<String, usize>,
        container: Option<&str>,
    ) -> Hints {
        let on_machine = |numa: &[i64]| -> Vec<u32> {
            numa_nodes(numa)
                .into_iter()
                .filter(|n| machine.contains(n))
                .collect()
        };
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let state = self.lock();
        let mine = state.pods.get(uid);
        wanted
            .into_iter()
            .map(|(resource, count)| {
                let Some(r) = state.resources.get(&resource) else {
                    return (resource, None);
                };
                let all: Vec<Vec<u32>> = r.devices.values().map(|d| on_machine(&d.numa)).collect();
                let nodes: BTreeSet<u32> = all.iter().flatten().copied().collect();
                if nodes.is_empty() {
                    return (resource, None);
                }
                let nodes: Vec<u32> = nodes.into_iter().collect();
                let where_ = |ids: &[String]| -> Vec<Vec<u32>> {
                    ids.iter()
                        .filter_map(|id| r.devices.get(id))
                        .map(|d| on_machine(&d.numa))
                        .collect()
                };
                let held: Vec<String> = match container {
                    Some(name) => mine
                        .and_then(|p| p.containers.get(name))
                        .and_then(|c| c.get(&resource))
                        .map(|h| h.ids.clone())
                        .unwrap_or_default(),
                    None => mine.map_or_else(Vec::new, |p| {
                        p.held(&resource).into_iter().map(String::from).collect()
                    }),
                };
                if !held.is_empty() {
                    let hints = if held.len() == count {
                        unit_hints(&nodes, &all, &[], &where_(&held), count)
                    } else {
                        Vec::new()
                    };
                    return (resource, Some(hints));
                }
                let reusable = match container {
                    Some(_) => reusable_devices(pod, mine, &resource),
                    None => Vec::new(),
                };
                let taken: HashSet<&str> = state
                    .pods
                    .values()
                    .flat_map(|p| p.held(&resource))
                    .collect();
                let free: Vec<String> = r
                    .devices
                    .iter()
                    .filter(|(id, d)| d.healthy && !taken.contains(id.as_str()))
                    .map(|(id, _)| id.clone())
                    .collect();
                let hints = unit_hints(&nodes, &all, &where_(&reusable), &where_(&free), count);
                (resource, Some(hints))
            })
            .collect()
    }
}

impl HintProvider for DeviceManager {
    fn hints(&self, nodes: &[u32], pod: &Pod, c: &Container) -> Hints {
        self.hints_for(nodes, pod, container_needs(pod, c), Some(&c.name))
    }

    fn pod_hints(&self, nodes: &[u32], pod: &Pod) -> Hints {
        self.hints_for(nodes, pod, pod_needs(pod), None)
    }

    /// Devices are chosen at the container's first start (choosing asks the plugin); the
    /// affinity is kept until then, and aligned devices are chosen first.
    fn allocate(
        &self,
        pod: &Pod,
        c: &Container,
        affinity: Option<NumaMask>,
    ) -> Result<(), Refusal> {
        if let Some(mask) = affinity.filter(|_| !container_needs(pod, c).is_empty()) {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let mut state = self.lock();
            let mine = state.pods.entry(uid).or_default();
            mine.affinity.insert(c.name.clone(), mask);
        }
        Ok(())
    }

    fn release(&self, uid: &str) {
        DeviceManager::release(self, uid);
    }

    fn holds(&self, uid: &str) -> bool {
        let state = self.lock();
        state
            .pods
            .get(uid)
            .is_some_and(|p| !p.containers.is_empty())
    }
}

/// Is this an extended resource, one that device plugins (or the API) may serve: a name with a
/// domain outside kubernetes.io, not a quota's `requests.` form (upstream's
/// IsExtendedResourceName)?
pub fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// The extended resources a container asks for, by its limits (which its requests equal), but
/// those a DRA claim of its pod serves.
fn container_needs(pod: &Pod, c: &Container) -> BTreeMap<String, usize> {
    let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
    limits
        .into_iter()
        .flatten()
        .filter(|(name, _)| is_extended(name))
        .filter(|(name, _)| !crate::cm::dra::backs(pod, &c.name, name))
        .filter_map(|(name, q)| {
            let count = crate::pod::parse_quantity(&q.0)?.round();
            (count >= 1.0).then(|| (name.clone(), count as usize))
        })
        .collect()
}

/// A pod's extended resources as upstream sums them: the app containers and sidecars
/// together, or the largest regular init container when that is more.
pub fn pod_needs(pod: &Pod) -> BTreeMap<String, usize> {
    let needs = |c: &Container| {
        let needs = container_needs(pod, c).into_iter();
        needs.map(|(name, n)| (name, n as u64)).collect()
    };
    super::pod_totals(pod, needs)
        .into_iter()
        .map(|(name, total)| (name, usize::try_from(total).unwrap_or(usize::MAX)))
        .collect()
}

impl DeviceManager {
    /// The manager of the plugins in `<root_dir>/device-plugins`: the allocations of the
    /// checkpoint come back (their devices stay held until their pods are gone), and the
    /// resources it names count with no device until their plugins register again. The pods
    /// whose devices' health changes go to `health`.
    pub fn start(root_dir: &Path, health: super::HealthUpdates) -> Arc<DeviceManager> {
        let dir = root_dir.join("device-plugins");
        let mut state = State::default();
        match checkpoint::read(&dir) {
            Ok(Some((pods, registered))) => {
                for (uid, containers) in pods {
                    state.pods.entry(uid).or_default().containers = containers;
                }
                for resource in registered {
                    state.resources.entry(resource).or_default().stopped = Some(Instant::now());
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %crate::types::error_chain(&e), "device allocations are not restored")
            }
        }
        Arc::new(DeviceManager {
            dir,
            state: Mutex::new(state),
            health,
            choosing: tokio::sync::Mutex::new(()),
        })
    }

    /// The device plugin dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the checkpoint; a failure is logged (the allocations in memory still hold).
    fn save(&self, state: &State) {
        let pods = state
            .pods
            .iter()
            .map(|(uid, p)| (uid.as_str(), &p.containers));
        let registered = state.resources.iter().map(|(name, r)| {
            let ids: Vec<&str> = r.devices.keys().map(String::as_str).collect();
            (name.as_str(), ids)
        });
        if let Err(e) = checkpoint::write(&self.dir, pods, registered) {
            tracing::warn!(error = %crate::types::error_chain(&e), "device allocations are not saved");
        }
    }

    /// The extended resources the node has: name -> (capacity, allocatable). A resource whose
    /// plugin went away more than five minutes ago counts zero, as upstream reports a resource
    /// it removed (the Node's status is merged, so a resource left out would stay as it was).
    pub fn resources(&self) -> BTreeMap<String, (usize, usize)> {
        let state = self.lock();
        state
            .resources
            .iter()
            .map(|(name, r)| {
                if r.stopped.is_some_and(|at| at.elapsed() >= STOP_GRACE) {
                    return (name.clone(), (0, 0));
                }
                let healthy = r.devices.values().filter(|d| d.healthy).count();
                (name.clone(), (r.devices.len(), healthy))
            })
            .collect()
    }

    /// The healthy devices of each resource, for the pod-resources API.
    pub fn allocatable_devices(&self) -> BTreeMap<String, Vec<(String, Vec<i64>)>> {
        let state = self.lock();
        state
            .resources
            .iter()
            .map(|(name, r)| {
                let devices = r.devices.iter().filter(|(_, d)| d.healthy);
                let devices = devices.map(|(id, d)| (id.clone(), d.numa.clone()));
                (name.clone(), devices.collect())
            })
            .collect()
    }

    /// The devices a container holds, by resource, with their NUMA nodes.
    pub fn container_devices(
        &self,
        uid: &str,
        container: &str,
    ) -> Vec<(String, Vec<String>, Vec<i64>)> {
        let state = self.lock();
        let Some(held) = state
            .pods
            .get(uid)
            .and_then(|p| p.containers.get(container))
        else {
            return Vec::new();
        };
        held.iter()
            .map(|(resource, h)| {
                let numa: BTreeSet<i64> = h
                    .ids
                    .iter()
                    .filter_map(|id| state.resources.get(resource)?.devices.get(id))
                    .flat_map(|d| d.numa.iter().copied())
                    .collect();
                (resource.clone(), h.ids.clone(), numa.into_iter().collect())
            })
            .collect()
    }

    /// The health of the devices a container holds, by resource (ResourceHealthStatus): each
    /// device and whether it is healthy. A device its plugin no longer lists counts as healthy,
    /// as upstream; those of a plugin that went away are unhealthy.
    pub fn health(&self, uid: &str, container: &str) -> Vec<(String, Vec<(String, bool)>)> {
        let state = self.lock();
        let Some(held) = (state.pods.get(uid)).and_then(|p| p.containers.get(container)) else {
            return Vec::new();
        };
        held.iter()
            .map(|(resource, h)| {
                let devices = state.resources.get(resource).map(|r| &r.devices);
                let health = h.ids.iter().map(|id| {
                    let device = devices.and_then(|d| d.get(id));
                    (id.clone(), device.is_none_or(|d| d.healthy))
                });
                (resource.clone(), health.collect())
            })
            .collect()
    }

    /// Tells of the pods holding devices of `resource` whose health differs between `before`
    /// and now (a device new to the list included: it may be one a pod held while it was gone).
    fn tell_health_changes(
        &self,
        state: &State,
        resource: &str,
        before: &BTreeMap<String, Device>,
    ) {
        let Some(r) = state.resources.get(resource) else {
            return;
        };
        let changed: BTreeSet<&str> = (r.devices.iter())
            .filter(|(id, d)| before.get(*id).is_none_or(|b| b.healthy != d.healthy))
            .map(|(id, _)| id.as_str())
            .collect();
        if changed.is_empty() {
            return;
        }
        for (uid, pod) in &state.pods {
            let held = pod.held(resource);
            if held.iter().any(|id| changed.contains(id)) {
                let _ = self.health.send(crate::types::PodUid(uid.clone()));
            }
        }
    }

    /// Upstream's admission of a pod's extended resources: one no plugin serves is
    /// `OutOf<resource>`; more devices than the healthy ones left for it is
    /// UnexpectedAdmissionError. What the pod already holds (a pod admitted again after a
    /// restart) counts as its own. An admitted pod's count is reserved until it is released.
    pub fn admit(&self, pod: &Pod) -> Result<(), Refusal> {
        let needs = pod_needs(pod);
        if needs.is_empty() {
            return Ok(());
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut state = self.lock();
        for (resource, &wanted) in &needs {
            let mine = state.pods.get(&uid).map_or(0, |p| p.held(resource).len());
            if mine >= wanted {
                continue;
            }
            let Some(r) = state
                .resources
                .get(resource)
                .filter(|r| r.stopped.is_none())
            else {
                return Err((
                    Cow::Owned(format!("OutOf{resource}")),
                    format!(
                        "Node didn't have enough resource: {resource}, requested: {wanted}, used: 0, capacity: 0"
                    ),
                ));
            };
            let healthy = r.devices.values().filter(|d| d.healthy).count();
            let others: usize = state
                .pods
                .iter()
                .filter(|(u, _)| **u != uid)
                .map(|(_, p)| {
                    let need = p.needs.get(resource).copied().unwrap_or(0);
                    need.max(p.held(resource).len())
                })
                .sum();
            let available = healthy.saturating_sub(others);
            if wanted > available {
                let e = Error::Unavailable {
                    resource: resource.clone(),
                    requested: wanted,
                    available,
                };
                return Err((
                    Cow::Borrowed("UnexpectedAdmissionError"),
                    format!("Allocate failed due to {e}, which is unexpected"),
                ));
            }
        }
        state.pods.entry(uid).or_default().needs = needs;
        Ok(())
    }

    /// The plugins' answers for a container about to start: its devices are chosen and
    /// allocated at its first start, and each plugin that asks is told before every start.
    /// `None` when the container asks for no device.
    pub async fn container_start(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Result<Option<proto::ContainerAllocateResponse>, Error> {
        let wanted = container_needs(pod, container);
        if wanted.is_empty() {
            return Ok(None);
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut merged = proto::ContainerAllocateResponse::default();
        for (resource, count) in wanted {
            let held = self.hold(pod, &uid, container, &resource, count).await?;
            let (client, pre_start) = {
                let state = self.lock();
                let r = state.resources.get(&resource);
                let client = r.and_then(|r| r.client.clone());
                (client, r.is_some_and(|r| r.options.pre_start_required))
            };
            if pre_start {
                let mut client = client.ok_or_else(|| Error::NoPlugin(resource.clone()))?;
                let call = client.pre_start_container(proto::PreStartContainerRequest {
                    devices_ids: held.ids.clone(),
                });
                ask(&resource, "prepare the devices (PreStartContainer)", call).await?;
            }
            let r = held.response;
            merged.envs.extend(r.envs);
            merged.mounts.extend(r.mounts);
            merged.devices.extend(r.devices);
            merged.annotations.extend(r.annotations);
            merged.cdi_devices.extend(r.cdi_devices);
        }
        Ok(Some(merged))
    }

    /// The devices of `resource` the container holds, chosen and allocated now if it holds
    /// none yet.
    async fn hold(
        &self,
        pod: &Pod,
        uid: &str,
        container: &Container,
        resource: &str,
        count: usize,
    ) -> Result<Held, Error> {
        let _choosing = self.choosing.lock().await;
        let mut pick = match self.choice(pod, uid, container, resource, count)? {
            Choice::Held(held) => return Ok(held),
            Choice::Pick(pick) => pick,
        };
        let candidates = &pick.candidates;
        if candidates.len() < count {
            return Err(Error::Unavailable {
                resource: resource.to_string(),
                requested: count,
                available: candidates.len(),
            });
        }
        let must: Vec<String> = pick.reusable.iter().take(count).cloned().collect();
        let mut ids: Vec<String> = candidates.iter().take(count).cloned().collect();
        if pick.options.get_preferred_allocation_available
            && let Some(preferred) =
                preferred(&mut pick.client, resource, &pick.candidates, &must, count).await?
        {
            ids = preferred;
        }
        let call = pick.client.allocate(proto::AllocateRequest {
            container_requests: vec![proto::ContainerAllocateRequest {
                devices_ids: ids.clone(),
            }],
        });
        let answer = ask(resource, "allocate the devices (Allocate)", call).await?;
        let response = answer
            .container_responses
            .into_iter()
            .next()
            .ok_or_else(|| Error::NoResponse(resource.to_string()))?;
        let held = Held { ids, response };
        let mut state = self.lock();
        state
            .pods
            .entry(uid.to_string())
            .or_default()
            .containers
            .entry(container.name.clone())
            .or_default()
            .insert(resource.to_string(), held.clone());
        self.save(&state);
        Ok(held)
    }

    /// The devices the container holds of `resource`, or the plugin and the devices to choose
    /// from: those the pod may reuse first, then the healthy free ones, those on the NUMA nodes
    /// the topology manager chose first where they are enough.
    fn choice(
        &self,
        pod: &Pod,
        uid: &str,
        container: &Container,
        resource: &str,
        count: usize,
    ) -> Result<Choice, Error> {
        let state = self.lock();
        if let Some(held) = state
            .pods
            .get(uid)
            .and_then(|p| p.containers.get(&container.name))
            .and_then(|c| c.get(resource))
        {
            return Ok(Choice::Held(held.clone()));
        }
        let r = state
            .resources
            .get(resource)
            .filter(|r| r.client.is_some())
            .ok_or_else(|| Error::NoPlugin(resource.to_string()))?;
        let reusable = reusable_devices(pod, state.pods.get(uid), resource);
        let taken: HashSet<&str> = state.pods.values().flat_map(|p| p.held(resource)).collect();
        let free = r
            .devices
            .iter()
            .filter(|(id, d)| d.healthy && !taken.contains(id.as_str()))
            .map(|(id, _)| id.clone());
        let mut candidates: Vec<String> = reusable.iter().cloned().chain(free).collect();
        let affinity = state
            .pods
            .get(uid)
            .and_then(|p| p.affinity.get(&container.name));
        if let Some(mask) = affinity {
            let aligned = |id: &String| {
                r.devices
                    .get(id)
                    .is_some_and(|d| mask.any_of(&numa_nodes(&d.numa)))
            };
            let (mut inside, outside): (Vec<String>, Vec<String>) =
                candidates.into_iter().partition(|id| aligned(id));
            if inside.len() < count {
                inside.extend(outside);
            }
            candidates = inside;
        }
        let client = r
            .client
            .clone()
            .ok_or_else(|| Error::NoPlugin(resource.into()))?;
        Ok(Choice::Pick(Pick {
            client,
            options: r.options,
            candidates,
            reusable,
        }))
    }

    /// Gives a pod's devices back (its containers are gone).
    pub fn release(&self, uid: &str) {
        let mut state = self.lock();
        if state
            .pods
            .remove(uid)
            .is_some_and(|p| !p.containers.is_empty())
        {
            self.save(&state);
        }
    }

    /// The devices and reservations of pods not in `keep` are released.
    pub fn retain(&self, keep: &HashSet<String>) {
        let mut state = self.lock();
        let before = state.pods.len();
        state.pods.retain(|uid, _| keep.contains(uid));
        if state.pods.len() != before {
            self.save(&state);
        }
    }

    /// A plugin registered (or registered again) for `resource`: it takes the resource over.
    fn registered(
        &self,
        resource: &str,
        registration: u64,
        client: plugin::Client,
        options: proto::DevicePluginOptions,
    ) {
        let mut state = self.lock();
        let r = state.resources.entry(resource.to_string()).or_default();
        r.client = Some(client);
        r.options = options;
        r.registration = registration;
        r.stopped = None;
        self.save(&state);
    }

    /// A plugin's latest device list; ignored once a newer registration owns the resource.
    fn listed(&self, resource: &str, registration: u64, devices: Vec<proto::Device>) {
        let mut state = self.lock();
        let Some(r) = state
            .resources
            .get_mut(resource)
            .filter(|r| r.registration == registration)
        else {
            return;
        };
        let listed = devices.into_iter().map(|d| {
            let numa = d.topology.map(|t| t.nodes.iter().map(|n| n.id).collect());
            let device = Device {
                healthy: d.health == "Healthy",
                numa: numa.unwrap_or_default(),
            };
            (d.id, device)
        });
        let before = std::mem::replace(&mut r.devices, listed.collect());
        self.tell_health_changes(&state, resource, &before);
        self.save(&state);
    }

    /// A plugin went away: its devices turn unhealthy, and leave the capacity after the grace.
    fn gone(&self, resource: &str, registration: u64) {
        let mut state = self.lock();
        if let Some(r) = state
            .resources
            .get_mut(resource)
            .filter(|r| r.registration == registration)
        {
            r.client = None;
            r.stopped = Some(Instant::now());
            let before = r.devices.clone();
            for d in r.devices.values_mut() {
                d.healthy = false;
            }
            self.tell_health_changes(&state, resource, &before);
        }
    }
}

/// A plugin's answer to `call`, within [`CALL_TIMEOUT`].
async fn ask<T>(
    resource: &str,
    call: &'static str,
    answer: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, Error> {
    let answered = tokio::time::timeout(CALL_TIMEOUT, answer).await;
    let answer = answered.map_err(|_| Error::Timeout {
        resource: resource.to_string(),
        call,
    })?;
    answer
        .map(tonic::Response::into_inner)
        .map_err(|source| Error::Plugin {
            resource: resource.to_string(),
            call,
            source,
        })
}

/// What a container's devices are chosen from (see [`DeviceManager::choice`]).
enum Choice {
    Held(Held),
    Pick(Pick),
}

/// The plugin to allocate from, and the devices to choose among (those the pod may reuse
/// first).
struct Pick {
    client: plugin::Client,
    options: proto::DevicePluginOptions,
    candidates: Vec<String>,
    reusable: Vec<String>,
}

/// The plugin's suggestion of `count` devices among `candidates` that include `must`; `None`
/// when it is not one the manager could have made (then it chooses by itself).
async fn preferred(
    client: &mut plugin::Client,
    resource: &str,
    candidates: &[String],
    must: &[String],
    count: usize,
) -> Result<Option<Vec<String>>, Error> {
    let request = proto::PreferredAllocationRequest {
        container_requests: vec![proto::ContainerPreferredAllocationRequest {
            available_device_i_ds: candidates.to_vec(),
            must_include_device_i_ds: must.to_vec(),
            allocation_size: i32::try_from(count).unwrap_or(i32::MAX),
        }],
    };
    let call = client.get_preferred_allocation(request);
    let answer = ask(resource, "suggest devices (GetPreferredAllocation)", call).await?;
    let preferred = answer
        .container_responses
        .into_iter()
        .next()
        .map(|r| r.device_i_ds)
        .unwrap_or_default();
    let distinct: BTreeSet<&String> = preferred.iter().collect();
    if distinct.len() == count
        && preferred.iter().all(|id| candidates.contains(id))
        && must.iter().all(|id| preferred.contains(id))
    {
        Ok(Some(preferred))
    } else {
        tracing::warn!(resource, suggested = ?preferred, "a device plugin's preferred allocation is not usable; choosing by itself");
        Ok(None)
    }
}

/// The devices a container may take over from the pod's regular init containers, which have
/// run to completion before it starts, less those a sidecar or app container already holds.
fn reusable_devices(pod: &Pod, mine: Option<&PodDevices>, resource: &str) -> Vec<String> {
    let Some(mine) = mine else {
        return Vec::new();
    };
    let spec = crate::pod::spec(pod);
    let init: HashSet<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| !crate::pod::is_sidecar(c))
        .map(|c| c.name.as_str())
        .collect();
    let (from_init, others): (Vec<_>, Vec<_>) = mine
        .containers
        .iter()
        .filter_map(|(name, c)| Some((name, c.get(resource)?)))
        .partition(|(name, _)| init.contains(name.as_str()));
    let in_use: HashSet<&String> = others.iter().flat_map(|(_, h)| &h.ids).collect();
    let reusable: BTreeSet<&String> = from_init.iter().flat_map(|(_, h)| &h.ids).collect();
    reusable
        .into_iter()
        .filter(|id| !in_use.contains(id))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).expect("a pod")
    }

    fn manager_with(devices: &[(&str, bool)]) -> (tempfile::TempDir, Arc<DeviceManager>) {
        let dir = tempfile::tempdir().expect("a temp dir");
        let m = DeviceManager::start(dir.path(), tokio::sync::mpsc::unbounded_channel().0);
        {
            let mut state = m.lock();
            let r = state.resources.entry("example.com/dev".into()).or_default();
            for (id, healthy) in devices {
                let d = Device {
                    healthy: *healthy,
                    numa: Vec::new(),
                };
                r.devices.insert((*id).into(), d);
            }
        }
        (dir, m)
    }

    const TWO: &str = r#"
metadata: {name: p, uid: u1}
spec:
  initContainers:
  - {name: init, image: i, resources: {limits: {example.com/dev: "2"}}}
  - {name: side, image: i, restartPolicy: Always, resources: {limits: {example.com/dev: "1"}}}
  containers:
  - {name: a, image: i, resources: {limits: {example.com/dev: "1", cpu: "1"}}}
"#;

    #[test]
    fn a_pod_needs_its_containers_sum_or_its_largest_init_container() {
        let needs = pod_needs(&pod(TWO));
        assert_eq!(needs, BTreeMap::from([("example.com/dev".to_string(), 2)]));
        assert!(is_extended("example.com/dev"));
        assert!(!is_extended("cpu"));
        assert!(!is_extended("kubernetes.io/thing"));
        assert!(!is_extended("requests.example.com/dev"));
    }

    #[test]
    fn admission_counts_healthy_devices_less_what_others_reserved() {
        let (_dir, m) = manager_with(&[("d1", true), ("d2", true), ("d3", false)]);
        assert_eq!(m.admit(&pod(TWO)), Ok(()));
        let other = TWO.replace("uid: u1", "uid: u2");
        let (reason, message) = m.admit(&pod(&other)).expect_err("no device is left");
        assert_eq!(reason, "UnexpectedAdmissionError");
        assert!(message.contains("Requested: 2, Available: 0"), "{message}");
        m.release("u1");
        assert_eq!(m.admit(&pod(&other)), Ok(()));
        let unknown = TWO.replace("example.com/dev", "example.com/other");
        let (reason, message) = m.admit(&pod(&unknown)).expect_err("nobody serves it");
        assert_eq!(reason, "OutOfexample.com/other");
        assert!(message.starts_with("Node didn't have enough resource: example.com/other"));
        assert_eq!(
            m.resources(),
            BTreeMap::from([("example.com/dev".to_string(), (3, 2))])
        );
    }

    #[test]
    fn an_init_containers_devices_go_on_to_the_containers_after_it() {
        let (_dir, m) = manager_with(&[("d1", true), ("d2", true)]);
        let p = pod(TWO);
        let held = |ids: &[&str]| {
            let h = Held {
                ids: ids.iter().map(|s| s.to_string()).collect(),
                response: Default::default(),
            };
            BTreeMap::from([("example.com/dev".to_string(), h)])
        };
        let mut mine = PodDevices::default();
        mine.containers.insert("init".into(), held(&["d1", "d2"]));
        assert_eq!(
            reusable_devices(&p, Some(&mine), "example.com/dev"),
            ["d1", "d2"]
        );
        mine.containers.insert("side".into(), held(&["d1"]));
        assert_eq!(reusable_devices(&p, Some(&mine), "example.com/dev"), ["d2"]);
        drop(m);
    }
}

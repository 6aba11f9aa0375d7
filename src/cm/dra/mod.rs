//! Dynamic resource allocation on the node. Drivers' kubelet plugins register through the
//! root dir's `plugins_registry` (registry.rs). Before a pod's sandbox is made, each
//! ResourceClaim the pod uses is read from the API server and checked (allocated, reserved for
//! the pod), and the drivers of its devices prepare it (NodePrepareResources), once however many
//! pods share it. The CDI IDs of its devices go to the containers that name the claim (or
//! request the extended resource it was made for). Once no pod on the node uses a claim any
//! more, its drivers unprepare it. What is prepared is kept in the root dir's
//! `dra_manager_state`, in upstream's format (checkpoint.rs).

pub mod checkpoint;
pub mod health;
pub mod registry;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use k8s_openapi::api::core::v1::{
    Container, Pod, PodExtendedResourceClaimStatus, ResourceHealth, ResourceStatus,
};
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use checkpoint::{ClaimState, Device, DriverState};

/// The generated messages of the DRA plugin API, v1. Its v1beta1 is the same on the wire
/// without `Device.share_id`, under another service name.
pub mod proto {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// How long a driver has to answer a call, as upstream.
const CALL_TIMEOUT: Duration = Duration::from_secs(45);
/// How long a driver's ResourceSlices outlive its plugin (upstream's wiping delay).
const WIPE_DELAY: Duration = Duration::from_secs(30);
/// How long a plugin's endpoint has to take a connection to count as up.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a deletion of slices may hold up the registry's loop (tried again on its next
/// round) when the API server does not answer.
const API_TIMEOUT: Duration = Duration::from_secs(10);

/// What the manager asks of the API server (in a cluster).
pub trait Api: Send + Sync {
    /// The ResourceClaim `namespace/name`.
    fn claim<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, String>>;
    /// Deletes the node's ResourceSlices: `driver`'s, or every driver's.
    fn delete_slices<'a>(&'a self, driver: Option<&'a str>) -> BoxFuture<'a, Result<(), String>>;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("pod {pod}: ResourceClaim not created yet")]
    NotCreated { pod: String },
    #[error("pod {pod}, spec.resourceClaim {claim}: none of the supported fields are set")]
    NoSource { pod: String, claim: String },
    #[error(
        "cannot read ResourceClaim {0}: there is no API server (pods with resource claims need --kubeconfig)"
    )]
    NoApi(String),
    #[error("fetch ResourceClaim {claim}: {message}")]
    Fetch { claim: String, message: String },
    #[error("ResourceClaim {claim} was not created for Pod {pod} (Pod is not owner)")]
    NotOwner { claim: String, pod: String },
    #[error("pod {pod} ({uid}) is not allowed to use ResourceClaim {claim} ({claim_uid})")]
    NotReserved {
        pod: String,
        uid: String,
        claim: String,
        claim_uid: String,
    },
    #[error("ResourceClaim {0}: not allocated")]
    NotAllocated(String),
    #[error("DRA driver {0} is not registered")]
    NotRegistered(String),
    #[error(
        "old ResourceClaim with same name {claim} and different UID {uid} still exists (previous pod force-deleted?!)"
    )]
    Replaced { claim: String, uid: String },
    #[error("{call} of DRA driver {driver}: {message}")]
    Call {
        call: &'static str,
        driver: String,
        message: String,
    },
    #[error("{call} returned result for unknown claim UID {uid}")]
    UnknownClaim { call: &'static str, uid: String },
    #[error("{call} failed for ResourceClaim {claim}: {message}")]
    Failed {
        call: &'static str,
        claim: String,
        message: String,
    },
    #[error("{call} skipped {count} ResourceClaims")]
    Skipped { call: &'static str, count: usize },
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::Error),
}

const PREPARE: &str = "NodePrepareResources";
const UNPREPARE: &str = "NodeUnprepareResources";

/// A registered driver's plugin.
#[derive(Debug)]
struct Plugin {
    endpoint: PathBuf,
    channel: Channel,
    /// The gRPC service called, of the API versions it serves the newest nodelet speaks
    /// (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`).
    service: String,
    /// The registration socket it came through.
    socket: PathBuf,
    /// Its device health stream, while it serves one.
    health: Option<tokio::task::AbortHandle>,
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if let Some(stream) = &self.health {
            stream.abort();
        }
    }
}

/// A claim on the node.
#[derive(Debug)]
struct Claim {
    state: ClaimState,
    /// Whether its drivers prepared it since nodelet started (upstream prepares again what
    /// its checkpoint lists after a restart: drivers prepare idempotently).
    prepared: bool,
}

/// The drivers and the claims prepared on the node.
pub struct DraManager {
    root_dir: PathBuf,
    api: OnceLock<Arc<dyn Api>>,
    plugins: Mutex<BTreeMap<String, Plugin>>,
    /// Claims by `namespace/name`.
    claims: Mutex<BTreeMap<String, Claim>>,
    /// The pods the node holds (admitted, or left in the runtime), once housekeeping said,
    /// and when it said so.
    held: Mutex<Option<(Instant, HashSet<String>)>>,
    /// When each pod last had its claims prepared: a pod prepared after housekeeping last
    /// said which pods the node holds is not an orphan.
    prepared_at: Mutex<HashMap<String, Instant>>,
    /// One prepare or unprepare at a time, so that two pods sharing a claim see each other's.
    busy: tokio::sync::Mutex<()>,
    /// What the drivers' health streams last said of their devices.
    reports: Mutex<health::Reports>,
    /// Told of the pods whose devices' health changed.
    health_tx: super::HealthUpdates,
}

impl std::fmt::Debug for DraManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraManager")
            .field("drivers", &self.plugins().keys().collect::<Vec<_>>())
            .field("claims", &self.claims().keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// `namespace/name`.
fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn pod_key(pod: &Pod) -> String {
    key(
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// The claim the scheduler made for the pod's extended resources that DRA serves.
fn extended_claim(pod: &Pod) -> Option<&PodExtendedResourceClaimStatus> {
    pod.status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
}

/// Whether a DRA claim of the pod serves the extended resource `resource` of its container
/// `container` (so no device plugin does).
pub fn backs(pod: &Pod, container: &str, resource: &str) -> bool {
    (extended_claim(pod).into_iter())
        .flat_map(|e| &e.request_mappings)
        .any(|m| m.container_name == container && m.resource_name == resource)
}

/// The name of the ResourceClaim behind each of the pod's claims (`pod claim name -> name`;
/// none for the claim of its extended resources), and whether it was made from a template for
/// the pod; a template's claim not made yet (`None` in the pod's status) is left out, as
/// upstream.
fn claim_names(pod: &Pod) -> Result<Vec<(String, String, bool)>, Error> {
    let spec = crate::pod::spec(pod);
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    let mut out = Vec::new();
    if let Some(extended) = extended_claim(pod) {
        out.push((String::new(), extended.resource_claim_name.clone(), false));
    }
    for claim in spec.resource_claims.iter().flatten() {
        if let Some(name) = &claim.resource_claim_name {
            out.push((claim.name.clone(), name.clone(), false));
        } else if claim.resource_claim_template_name.is_some() {
            let status = statuses
                .into_iter()
                .flatten()
                .find(|s| s.name == claim.name)
                .ok_or_else(|| Error::NotCreated { pod: pod_key(pod) })?;
            if let Some(name) = &status.resource_claim_name {
                out.push((claim.name.clone(), name.clone(), true));
            }
        } else {
            return Err(Error::NoSource {
                pod: pod_key(pod),
                claim: claim.name.clone(),
            });
        }
    }
    Ok(out)
}

/// The drivers with results in the claim's allocation.
fn drivers_of(claim: &ResourceClaim) -> BTreeSet<String> {
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_deref())
        .unwrap_or_default();
    results.iter().map(|r| r.driver.clone()).collect()
}

/// Checks that the pod may use the claim and that it is allocated.
fn check(pod: &Pod, claim: &ResourceClaim, from_template: bool) -> Result<(), Error> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let name = key(
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default(),
    );
    if from_template {
        let owned = claim.metadata.namespace == pod.metadata.namespace
            && (claim.metadata.owner_references.iter().flatten())
                .any(|o| o.controller == Some(true) && o.uid == uid);
        if !owned {
            return Err(Error::NotOwner {
                claim: name,
                pod: pod_key(pod),
            });
        }
    }
    let status = claim.status.as_ref();
    let reserved = (status
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten())
    .any(|r| r.uid == uid);
    if !reserved {
        return Err(Error::NotReserved {
            pod: pod_key(pod),
            uid: uid.into(),
            claim: name,
            claim_uid: claim.metadata.uid.clone().unwrap_or_default(),
        });
    }
    if status.and_then(|s| s.allocation.as_ref()).is_none() {
        return Err(Error::NotAllocated(name));
    }
    Ok(())
}

/// Whether a device serves a container's `request` of its claim (empty: all of them), as
/// upstream picks them: a device allocated for no request in particular serves every one.
fn serves(device: &Device, request: &str) -> bool {
    request.is_empty() || device.requests.is_empty() || device.requests.iter().any(|r| r == request)
}

/// A claim a container uses, and the devices it gets of it with their drivers.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerClaim {
    pub name: String,
    pub namespace: String,
    pub devices: Vec<(String, Device)>,
}

/// A gRPC status code as Go names it.
fn code_name(code: tonic::Code) -> String {
    match code {
        tonic::Code::Ok => "OK".into(),
        tonic::Code::Cancelled => "Canceled".into(),
        other => format!("{other:?}"),
    }
}

impl DraManager {
    /// The manager, with the claims its checkpoint in `root_dir` lists.
    pub fn start(root_dir: &Path, health_tx: super::HealthUpdates) -> Arc<DraManager> {
        let claims = match checkpoint::read(root_dir) {
            Ok(claims) => claims,
            Err(e) => {
                tracing::warn!(error = %crate::types::error_chain(&e), "prepared resource claims are not restored");
                Vec::new()
            }
        };
        let claims = claims
            .into_iter()
            .map(|state| {
                let claim = Claim {
                    state,
                    prepared: false,
                };
                (key(&claim.state.namespace, &claim.state.name), claim)
            })
            .collect();
        let dra = Arc::new(DraManager {
            root_dir: root_dir.to_path_buf(),
            api: OnceLock::new(),
            plugins: Mutex::default(),
            claims: Mutex::new(claims),
            held: Mutex::default(),
            prepared_at: Mutex::default(),
            busy: tokio::sync::Mutex::new(()),
            reports: Mutex::default(),
            health_tx,
        });
        crate::metrics::get().dra_claims_in_use(&dra.claims_in_use());
        dra
    }

    /// Claims are read through `api` from now on.
    pub fn set_api(&self, api: Arc<dyn Api>) {
        let _ = self.api.set(api);
    }

    fn api(&self) -> Option<&Arc<dyn Api>> {
        self.api.get()
    }

    fn plugins(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Plugin>> {
        self.plugins.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Claim>> {
        self.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reports(&self) -> std::sync::MutexGuard<'_, health::Reports> {
        self.reports.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `driver`'s plugin, serving API `version` (`v1.DRAPlugin`) on `endpoint`, and its
    /// device health stream where it serves one (`health`), registered through `socket` (a
    /// newer registration replaces an older one).
    pub fn register(
        self: &Arc<Self>,
        driver: &str,
        version: &str,
        health: bool,
        endpoint: &Path,
        socket: &Path,
    ) {
        let channel = crate::runtime::unix_channel(endpoint);
        let stream = health.then(|| {
            let follow = follow_health(Arc::downgrade(self), driver.to_string(), channel.clone());
            tokio::spawn(follow).abort_handle()
        });
        let plugin = Plugin {
            endpoint: endpoint.to_path_buf(),
            channel,
            service: format!("k8s.io.kubelet.pkg.apis.dra.{version}"),
            socket: socket.to_path_buf(),
            health: stream,
        };
        self.plugins().insert(driver.to_string(), plugin);
        tracing::info!(driver, version, health, endpoint = %endpoint.display(), "DRA driver registered");
    }

    /// Takes `driver`'s report of its devices' health; tells of the pods holding a device whose
    /// health changed.
    fn health_reported(&self, driver: &str, devices: Vec<health::proto::DeviceHealth>) {
        let changed = self.reports().report(driver, devices, Instant::now());
        if changed.is_empty() {
            return;
        }
        let holds = |state: &ClaimState| {
            (state.drivers.get(driver).into_iter())
                .flat_map(|d| &d.devices)
                .any(|d| changed.contains(&(d.pool.clone(), d.device.clone())))
        };
        let pods: BTreeSet<String> = (self.claims().values())
            .filter(|c| holds(&c.state))
            .flat_map(|c| c.state.pods.iter().cloned())
            .collect();
        for uid in pods {
            let _ = self.health_tx.send(crate::types::PodUid(uid));
        }
    }

    /// The health of the devices each claim the container names gives it, as upstream reports
    /// it in `allocatedResourcesStatus`: by `claim:<name>` (`claim:<name>/<request>`), each
    /// device by its first CDI ID (else `<driver>/<pool>/<device>`), with what its driver's
    /// health stream last said of it (unknown without one).
    pub fn health(&self, pod: &Pod, container: &Container) -> Vec<ResourceStatus> {
        let Some(named) = (container.resources.as_ref()).and_then(|r| r.claims.as_ref()) else {
            return Vec::new();
        };
        let Ok(names) = claim_names(pod) else {
            return Vec::new();
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let claims = self.claims();
        let reports = self.reports();
        let now = Instant::now();
        let mut out = Vec::new();
        for w in named {
            let Some((_, name, _)) = names.iter().find(|(pod_claim, ..)| *pod_claim == w.name)
            else {
                continue;
            };
            let Some(claim) = claims.get(&key(namespace, name)) else {
                continue;
            };
            let request = w.request.as_deref().unwrap_or_default();
            let base = request.split('/').next().unwrap_or_default();
            let mut resources: Vec<ResourceHealth> = Vec::new();
            for (driver, state) in &claim.state.drivers {
                for d in state.devices.iter().filter(|d| serves(d, base)) {
                    let id = (d.cdi_ids.first().cloned())
                        .unwrap_or_else(|| format!("{driver}/{}/{}", d.pool, d.device));
                    if resources.iter().any(|r| r.resource_id == id) {
                        continue;
                    }
                    let device = (d.pool.clone(), d.device.clone());
                    let (health, message) = reports.get(driver, &device, now);
                    resources.push(ResourceHealth {
                        resource_id: id,
                        health: Some(health.into()),
                        message: (!message.is_empty()).then_some(message),
                    });
                }
            }
            if !resources.is_empty() {
                let name = match request {
                    "" => format!("claim:{}", w.name),
                    request => format!("claim:{}/{request}", w.name),
                };
                out.push(ResourceStatus {
                    name,
                    resources: Some(resources),
                });
            }
        }
        out
    }

    /// Drops the plugins registered through `socket`; returns their drivers.
    pub fn deregister(&self, socket: &Path) -> Vec<String> {
        let mut plugins = self.plugins();
        let gone: Vec<String> = (plugins.iter())
            .filter(|(_, p)| p.socket == socket)
            .map(|(d, _)| d.clone())
            .collect();
        for driver in &gone {
            // Its health stream ends with it, and what it said of its devices is forgotten.
            plugins.remove(driver);
            self.reports().clear(driver);
            tracing::info!(driver, "DRA driver deregistered");
        }
        gone
    }

    /// Whether `driver` has a plugin registered.
    fn is_registered(&self, driver: &str) -> bool {
        self.plugins().contains_key(driver)
    }

    /// Whether each registered driver's plugin takes connections on its endpoint, by driver
    /// (a driver that died leaves its sockets behind).
    async fn reachable(&self) -> BTreeMap<String, bool> {
        let endpoints: Vec<(String, PathBuf)> = (self.plugins().iter())
            .map(|(driver, p)| (driver.clone(), p.endpoint.clone()))
            .collect();
        let mut reachable = BTreeMap::new();
        for (driver, endpoint) in endpoints {
            let probe = tokio::net::UnixStream::connect(&endpoint);
            let up = matches!(tokio::time::timeout(PROBE_TIMEOUT, probe).await, Ok(Ok(_)));
            reachable.insert(driver, up);
        }
        reachable
    }

    /// Prepares the pod's claims (before its sandbox is made), as upstream: every claim is
    /// read and checked first, so a pod that cannot have its claims leaves no trace to undo.
    pub async fn prepare(&self, pod: &Pod) -> Result<(), Error> {
        let began = Instant::now();
        let prepared = self.prepare_claims(pod).await;
        crate::metrics::get().dra_operation("PrepareResources", began.elapsed(), prepared.is_err());
        prepared
    }

    async fn prepare_claims(&self, pod: &Pod) -> Result<(), Error> {
        let names = claim_names(pod)?;
        if names.is_empty() {
            return Ok(());
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let mut fetched = Vec::new();
        for (_, name, from_template) in &names {
            let api = (self.api()).ok_or_else(|| Error::NoApi(key(namespace, name)))?;
            let claim = api
                .claim(namespace, name)
                .await
                .map_err(|message| Error::Fetch {
                    claim: key(namespace, name),
                    message,
                })?;
            check(pod, &claim, *from_template)?;
            let drivers = drivers_of(&claim);
            if let Some(missing) = drivers.iter().find(|d| !self.is_registered(d)) {
                return Err(Error::NotRegistered(missing.clone()));
            }
            fetched.push((claim, drivers));
        }
        let _busy = self.busy.lock().await;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        (self.prepared_at.lock().unwrap_or_else(|e| e.into_inner()))
            .insert(uid.clone(), Instant::now());
        // driver -> claims to prepare
        let mut batches: BTreeMap<String, Vec<proto::Claim>> = BTreeMap::new();
        {
            let mut claims = self.claims();
            for (claim, drivers) in &fetched {
                let (ns, name) = (
                    claim.metadata.namespace.clone().unwrap_or_default(),
                    claim.metadata.name.clone().unwrap_or_default(),
                );
                let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
                let entry = claims.entry(key(&ns, &name)).or_insert_with(|| Claim {
                    state: ClaimState {
                        uid: claim_uid.clone(),
                        name: name.clone(),
                        namespace: ns.clone(),
                        pods: BTreeSet::new(),
                        drivers: drivers
                            .iter()
                            .map(|d| (d.clone(), DriverState::default()))
                            .collect(),
                    },
                    prepared: false,
                });
                if entry.state.uid != claim_uid {
                    return Err(Error::Replaced {
                        claim: key(&ns, &name),
                        uid: entry.state.uid.clone(),
                    });
                }
                entry.state.pods.insert(uid.clone());
                if entry.prepared {
                    continue;
                }
                for driver in drivers {
                    batches
                        .entry(driver.clone())
                        .or_default()
                        .push(proto::Claim {
                            namespace: ns.clone(),
                            uid: claim_uid.clone(),
                            name: name.clone(),
                        });
                }
            }
        }
        self.save()?;
        if batches.is_empty() {
            return Ok(());
        }
        // claim UID -> driver -> devices
        let mut devices: BTreeMap<String, BTreeMap<String, Vec<Device>>> = BTreeMap::new();
        for (driver, batch) in batches {
            let request = proto::NodePrepareResourcesRequest {
                claims: batch.clone(),
            };
            let answer: proto::NodePrepareResourcesResponse =
                self.call(&driver, PREPARE, request).await?;
            let answer = answer.claims;
            let count = answer.len();
            for (claim_uid, result) in answer {
                answered(PREPARE, &batch, &claim_uid, result.error)?;
                let prepared = result.devices.into_iter().map(|d| Device {
                    pool: d.pool_name,
                    device: d.device_name,
                    share_id: d.share_id,
                    requests: d.request_names,
                    cdi_ids: d.cdi_device_ids,
                });
                devices
                    .entry(claim_uid)
                    .or_default()
                    .insert(driver.clone(), prepared.collect());
            }
            skipped(PREPARE, &batch, count)?;
        }
        {
            let mut claims = self.claims();
            for claim in claims.values_mut() {
                if let Some(by_driver) = devices.remove(&claim.state.uid) {
                    for (driver, prepared) in by_driver {
                        claim.state.drivers.entry(driver).or_default().devices = prepared;
                    }
                    claim.prepared = true;
                }
            }
        }
        self.save()
    }

    /// `method` of `driver`'s plugin with `request`: its answer within [`CALL_TIMEOUT`], timed
    /// in `dra_grpc_operations_duration_seconds`.
    async fn call<Q, A>(&self, driver: &str, method: &'static str, request: Q) -> Result<A, Error>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let error = |message: String| Error::Call {
            call: method,
            driver: driver.into(),
            message,
        };
        let (channel, path) = {
            let plugins = self.plugins();
            let plugin = (plugins.get(driver))
                .ok_or_else(|| error("the driver is not registered".into()))?;
            (
                plugin.channel.clone(),
                format!("/{}/{method}", plugin.service),
            )
        };
        let mut grpc = tonic::client::Grpc::new(channel);
        let began = Instant::now();
        let answer = tokio::time::timeout(CALL_TIMEOUT, async {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let path = tonic::codegen::http::uri::PathAndQuery::try_from(path.as_str())
                .map_err(|e| tonic::Status::internal(e.to_string()))?;
            let codec = tonic_prost::ProstCodec::default();
            grpc.unary(tonic::Request::new(request), path, codec).await
        })
        .await;
        let code = match &answer {
            Ok(Ok(_)) => tonic::Code::Ok,
            Ok(Err(status)) => status.code(),
            Err(_) => tonic::Code::DeadlineExceeded,
        };
        crate::metrics::get().dra_grpc(driver, &path, &code_name(code), began.elapsed());
        match answer {
            Ok(Ok(answer)) => Ok(answer.into_inner()),
            Ok(Err(status)) => Err(error(status.message().to_string())),
            Err(_) => Err(error(format!("no answer within {CALL_TIMEOUT:?}"))),
        }
    }

    /// Lets go of what the pod held (its containers are stopped): each claim no other pod on
    /// the node uses is unprepared by its drivers.
    pub async fn unprepare(&self, pod_uid: &str) -> Result<(), Error> {
        let began = Instant::now();
        let done = self.unprepare_pods(&HashSet::from([pod_uid])).await;
        crate::metrics::get().dra_operation("UnprepareResources", began.elapsed(), done.is_err());
        done
    }

    /// The pods the node holds now: the claims of others are let go of by [`DraManager::run`].
    pub fn hold(&self, pods: &HashSet<String>) {
        // Kept only while there are claims to let go of (a snapshot older than a claim's
        // preparation never lets it go).
        if !self.claims().is_empty() {
            *self.held.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((Instant::now(), pods.clone()));
        }
    }

    /// Lets go of the claims of pods the node no longer holds (gone while nodelet was not
    /// looking, or whose end could not let go of them).
    async fn release_orphans(&self) {
        if self.claims().is_empty() {
            return;
        }
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some((said, held)) = held else {
            return;
        };
        let prepared_at = self
            .prepared_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let gone: HashSet<String> = (self.claims().values())
            .flat_map(|c| &c.state.pods)
            .filter(|uid| !held.contains(*uid))
            .filter(|uid| prepared_at.get(*uid).is_none_or(|at| *at < said))
            .cloned()
            .collect();
        if gone.is_empty() {
            return;
        }
        let gone = gone.iter().map(String::as_str).collect();
        if let Err(e) = self.unprepare_pods(&gone).await {
            tracing::warn!(error = %crate::types::error_chain(&e), "cannot let go of the resource claims of pods that are gone; trying again later");
        }
    }

    /// Registers drivers' plugins through the registry directory under `root_dir`, lets go of
    /// the claims of pods gone, and, in a cluster, deletes the node's ResourceSlices at start
    /// and a driver's [`WIPE_DELAY`] after its plugin went away or stopped taking connections,
    /// unless it came back, as upstream (drivers publish theirs again when they register).
    /// Until `cancel`.
    pub async fn run(self: Arc<Self>, root_dir: PathBuf, cancel: CancellationToken) {
        let mut registry = match registry::Registry::open(&root_dir) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(dir = %root_dir.join(registry::DIR).display(), error = %e, "cannot make the plugin registry directory; DRA drivers cannot register");
                return;
            }
        };
        // driver -> when its slices go (None: gone already, while it stays unusable)
        let mut wipes: HashMap<String, Option<tokio::time::Instant>> = HashMap::new();
        let mut wiped_at_start = false;
        loop {
            // The slices left from before go before any driver registers (a registered
            // driver's are current); no driver is usable until it does.
            if !wiped_at_start && let Some(api) = self.api() {
                wiped_at_start = !self.plugins().is_empty() || wipe(api.as_ref(), None).await;
            }
            // A wipe already due keeps its time while the driver stays unusable.
            let wipe_at = Some(tokio::time::Instant::now() + WIPE_DELAY);
            for driver in registry.scan(&self).await {
                wipes.entry(driver).or_insert(wipe_at);
            }
            let reachable = self.reachable().await;
            for (driver, up) in &reachable {
                if !up && !wipes.contains_key(driver) {
                    tracing::warn!(
                        driver,
                        "the DRA driver's plugin takes no connections; its ResourceSlices go in {WIPE_DELAY:?} unless it comes back"
                    );
                    wipes.insert(driver.clone(), wipe_at);
                }
            }
            wipes.retain(|driver, _| reachable.get(driver) != Some(&true));
            if let Some(api) = self.api() {
                let now = tokio::time::Instant::now();
                for (driver, at) in wipes.iter_mut() {
                    if at.is_some_and(|at| at <= now) && wipe(api.as_ref(), Some(driver)).await {
                        *at = None;
                    }
                }
            }
            self.release_orphans().await;
            tokio::select! {
                // The plugins' health streams end with them.
                _ = cancel.cancelled() => return self.plugins().clear(),
                () = registry.wait() => {}
            }
        }
    }

    async fn unprepare_pods(&self, pods: &HashSet<&str>) -> Result<(), Error> {
        let uses = |c: &Claim| c.state.pods.iter().any(|p| pods.contains(p.as_str()));
        if !self.claims().values().any(uses) {
            return Ok(());
        }
        let _busy = self.busy.lock().await;
        let mut batches: BTreeMap<String, Vec<proto::Claim>> = BTreeMap::new();
        let mut released = Vec::new();
        {
            let mut claims = self.claims();
            for (name, claim) in claims.iter_mut() {
                if !uses(claim) {
                    continue;
                }
                let others = claim.state.pods.iter().any(|p| !pods.contains(p.as_str()));
                if others {
                    claim.state.pods.retain(|p| !pods.contains(p.as_str()));
                    continue;
                }
                released.push(name.clone());
                for driver in claim.state.drivers.keys() {
                    batches
                        .entry(driver.clone())
                        .or_default()
                        .push(proto::Claim {
                            namespace: claim.state.namespace.clone(),
                            uid: claim.state.uid.clone(),
                            name: claim.state.name.clone(),
                        });
                }
            }
        }
        self.save()?;
        for (driver, batch) in batches {
            let request = proto::NodeUnprepareResourcesRequest {
                claims: batch.clone(),
            };
            let answer: proto::NodeUnprepareResourcesResponse =
                self.call(&driver, UNPREPARE, request).await?;
            let answer = answer.claims;
            let count = answer.len();
            for (claim_uid, result) in answer {
                answered(UNPREPARE, &batch, &claim_uid, result.error)?;
            }
            skipped(UNPREPARE, &batch, count)?;
        }
        {
            let mut claims = self.claims();
            for name in released {
                claims.remove(&name);
            }
        }
        (self.prepared_at.lock().unwrap_or_else(|e| e.into_inner()))
            .retain(|uid, _| !pods.contains(uid.as_str()));
        self.save()
    }

    /// The claims the container uses (those it names, and its pod's claim for the extended
    /// resources it requests), each with the devices (and their drivers) it gets of it: those
    /// allocated for the request it names or its resources map to, or for none in particular.
    pub fn container_claims(&self, pod: &Pod, container: &Container) -> Vec<ContainerClaim> {
        let Ok(names) = claim_names(pod) else {
            return Vec::new();
        };
        // (claim name, request; empty: every request)
        let mut uses: Vec<(&str, &str)> = Vec::new();
        let named = (container.resources.as_ref())
            .and_then(|r| r.claims.as_ref())
            .into_iter()
            .flatten();
        for w in named {
            let claim = names.iter().find(|(pod_claim, ..)| *pod_claim == w.name);
            if let Some((_, name, _)) = claim {
                uses.push((name, w.request.as_deref().unwrap_or_default()));
            }
        }
        let requested = |resource: &str| {
            (container.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get(resource))
                .and_then(|q| crate::pod::parse_quantity(&q.0))
                .is_some_and(|n| n > 0.0)
        };
        if let Some(extended) = extended_claim(pod) {
            let mapped = (extended.request_mappings.iter())
                .filter(|m| m.container_name == container.name && requested(&m.resource_name));
            for m in mapped {
                uses.push((&extended.resource_claim_name, &m.request_name));
            }
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let claims = self.claims();
        let mut out = Vec::new();
        for (name, request) in uses {
            let Some(claim) = claims.get(&key(namespace, name)) else {
                continue;
            };
            let devices = (claim.state.drivers.iter())
                .flat_map(|(driver, state)| state.devices.iter().map(move |d| (driver, d)))
                .filter(|(_, d)| serves(d, request))
                .map(|(driver, d)| (driver.clone(), d.clone()));
            out.push(ContainerClaim {
                name: name.to_string(),
                namespace: namespace.to_string(),
                devices: devices.collect(),
            });
        }
        out
    }

    /// The CDI IDs of the devices the container's claims give it.
    pub fn cdi_devices(&self, pod: &Pod, container: &Container) -> Vec<String> {
        (self.container_claims(pod, container).into_iter())
            .flat_map(|c| c.devices)
            .flat_map(|(_, d)| d.cdi_ids)
            .collect()
    }

    /// The prepared claims, by driver and in all (`<any>`), as upstream's
    /// `dra_resource_claims_in_use` counts them.
    pub fn claims_in_use(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::from([("<any>".to_string(), 0)]);
        for claim in self.claims().values().filter(|c| c.prepared) {
            *counts.entry("<any>".into()).or_default() += 1;
            for driver in claim.state.drivers.keys() {
                *counts.entry(driver.clone()).or_default() += 1;
            }
        }
        counts
    }

    /// Writes the checkpoint, and shows the claims in use.
    fn save(&self) -> Result<(), Error> {
        crate::metrics::get().dra_claims_in_use(&self.claims_in_use());
        let states = (self.claims().values()).map(|c| c.state.clone()).collect();
        checkpoint::write(&self.root_dir, states)?;
        Ok(())
    }
}

/// Follows `driver`'s device health stream on `channel` into the manager's reports, opening
/// it again [`health::RETRY`] after it ends (what the driver said is forgotten then, as
/// upstream), while the manager lives.
async fn follow_health(dra: Weak<DraManager>, driver: String, channel: Channel) {
    loop {
        let reported = |devices| {
            let Some(dra) = dra.upgrade() else {
                return false;
            };
            dra.health_reported(&driver, devices);
            true
        };
        let ended = health::follow(channel.clone(), reported).await;
        let Some(manager) = dra.upgrade() else {
            return;
        };
        manager.reports().clear(&driver);
        drop(manager);
        tracing::debug!(driver, reason = %ended, "the DRA driver's device health stream ended; opening it again in {:?}", health::RETRY);
        tokio::time::sleep(health::RETRY).await;
    }
}

/// Checks that a driver gave `answers` to `call` for every claim of `batch` (each answer
/// about one of them: see [`answered`]).
fn skipped(call: &'static str, batch: &[proto::Claim], answers: usize) -> Result<(), Error> {
    match batch.len().checked_sub(answers) {
        Some(count) if count > 0 => Err(Error::Skipped { call, count }),
        _ => Ok(()),
    }
}

/// Checks a driver's answer to `call` for the claim `uid` of `batch`: about one of them, and
/// no `error`.
fn answered(
    call: &'static str,
    batch: &[proto::Claim],
    uid: &str,
    error: String,
) -> Result<(), Error> {
    let claim = (batch.iter().find(|c| c.uid == uid)).ok_or_else(|| Error::UnknownClaim {
        call,
        uid: uid.into(),
    })?;
    if error.is_empty() {
        Ok(())
    } else {
        Err(Error::Failed {
            call,
            claim: key(&claim.namespace, &claim.name),
            message: error,
        })
    }
}

/// Deletes the node's ResourceSlices (of `driver` only, when given); whether it did.
async fn wipe(api: &dyn Api, driver: Option<&str>) -> bool {
    let asked = tokio::time::timeout(API_TIMEOUT, api.delete_slices(driver)).await;
    match asked.unwrap_or_else(|_| Err("no answer from the API server".into())) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(driver = driver.unwrap_or("(all)"), error = %e, "cannot delete the node's ResourceSlices; trying again");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    fn claim(yaml: &str) -> ResourceClaim {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    const POD: &str = r#"
metadata: {name: p, namespace: ns, uid: pod-1}
spec:
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: t}
  - {name: shared, resourceClaimName: s}
  - {name: later, resourceClaimTemplateName: t}
  containers:
  - name: c
    resources: {claims: [{name: gpu}, {name: shared, request: r1}]}
status:
  resourceClaimStatuses:
  - {name: gpu, resourceClaimName: p-gpu-x}
  - {name: later}
"#;

    #[test]
    fn claim_names_come_from_the_spec_or_the_status_for_templates() {
        let names = claim_names(&pod(POD)).unwrap();
        assert_eq!(
            names,
            [
                ("gpu".to_string(), "p-gpu-x".to_string(), true),
                ("shared".to_string(), "s".to_string(), false),
            ]
        );
        let mut unmade = pod(POD);
        unmade.status = None;
        assert!(matches!(
            claim_names(&unmade),
            Err(Error::NotCreated { .. })
        ));
    }

    const CLAIM: &str = r#"
metadata:
  {name: p-gpu-x, namespace: ns, uid: claim-1,
   ownerReferences: [{apiVersion: v1, kind: Pod, name: p, uid: pod-1, controller: true}]}
spec: {}
status:
  reservedFor: [{resource: pods, name: p, uid: pod-1}]
  allocation:
    devices:
      results: [{request: gpu, driver: d.example.com, pool: n, device: dev-0}]
"#;

    #[test]
    fn a_claim_must_be_the_pods_reserved_for_it_and_allocated() {
        let p = pod(POD);
        let good = claim(CLAIM);
        assert!(check(&p, &good, true).is_ok());
        assert_eq!(drivers_of(&good), BTreeSet::from(["d.example.com".into()]));
        let mut other = good.clone();
        other.metadata.owner_references = None;
        assert!(matches!(
            check(&p, &other, true),
            Err(Error::NotOwner { .. })
        ));
        assert!(check(&p, &other, false).is_ok());
        let mut unreserved = good.clone();
        unreserved.status.as_mut().unwrap().reserved_for = None;
        let e = check(&p, &unreserved, true).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pod ns/p (pod-1) is not allowed to use ResourceClaim ns/p-gpu-x (claim-1)"
        );
        let mut unallocated = good;
        unallocated.status.as_mut().unwrap().allocation = None;
        assert!(matches!(
            check(&p, &unallocated, true),
            Err(Error::NotAllocated(_))
        ));
    }

    #[test]
    fn a_drivers_answers_must_cover_the_claims_asked_about_without_errors() {
        let batch = [proto::Claim {
            namespace: "ns".into(),
            uid: "u1".into(),
            name: "c".into(),
        }];
        assert!(answered(PREPARE, &batch, "u1", String::new()).is_ok());
        assert_eq!(
            answered(PREPARE, &batch, "u1", "no device".into())
                .unwrap_err()
                .to_string(),
            "NodePrepareResources failed for ResourceClaim ns/c: no device"
        );
        assert!(matches!(
            answered(UNPREPARE, &batch, "u2", String::new()),
            Err(Error::UnknownClaim { .. })
        ));
        assert!(skipped(PREPARE, &batch, 1).is_ok());
        assert_eq!(
            skipped(PREPARE, &batch, 0).unwrap_err().to_string(),
            "NodePrepareResources skipped 1 ResourceClaims"
        );
    }

    #[test]
    fn containers_get_the_cdi_ids_of_their_claims_requests() {
        let dir = tempfile::tempdir().unwrap();
        let dra = DraManager::start(dir.path(), tokio::sync::mpsc::unbounded_channel().0);
        let device = |requests: &[&str], id: &str| Device {
            requests: requests.iter().map(|r| r.to_string()).collect(),
            cdi_ids: vec![id.into()],
            ..Default::default()
        };
        for (name, devices) in [
            ("p-gpu-x", vec![device(&[], "v/c=all")]),
            (
                "s",
                vec![device(&["r1"], "v/c=one"), device(&["r2"], "v/c=two")],
            ),
        ] {
            let state = ClaimState {
                uid: format!("{name}-uid"),
                name: name.into(),
                namespace: "ns".into(),
                pods: BTreeSet::from(["pod-1".into()]),
                drivers: BTreeMap::from([("d".into(), DriverState { devices })]),
            };
            let claim = Claim {
                state,
                prepared: true,
            };
            dra.claims().insert(key("ns", name), claim);
        }
        let p = pod(POD);
        let c = &p.spec.as_ref().unwrap().containers[0];
        assert_eq!(dra.cdi_devices(&p, c), ["v/c=all", "v/c=one"]);
        assert_eq!(
            dra.claims_in_use(),
            BTreeMap::from([("<any>".into(), 2), ("d".into(), 2)])
        );
    }
}

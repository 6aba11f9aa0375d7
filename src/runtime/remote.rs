//! A tonic client for the CRI RuntimeService and ImageService over unix sockets, with a timeout
//! on every call and errors that name the call.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

use super::{ANNOTATION_TERMINATION_MESSAGE_PATH, LABEL_POD_UID};
use super::{
    Container, ContainerState, PodRuntime, Sandbox, SandboxState, container_from_cri, cri,
    sandbox_from_cri, state_from_cri,
};
use crate::types::PodUid;

/// A failed CRI call.
#[derive(Debug)]
pub enum Error {
    /// The runtime answered with an error, or could not be reached (`status`'s own source is
    /// the transport's error).
    Call {
        call: &'static str,
        status: tonic::Status,
    },
    Timeout {
        call: &'static str,
        timeout: Duration,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Call { call, status } => write!(f, "CRI {call} failed: {}", status.message()),
            Error::Timeout { call, timeout } => write!(f, "CRI {call} timed out after {timeout:?}"),
        }
    }
}

/// The runtime's message is this error's own text; what lies under the answer (a transport
/// failure) is its source. The status itself is not a source: its text repeats the message.
impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Call { status, .. } => std::error::Error::source(status),
            Error::Timeout { .. } => None,
        }
    }
}

impl Error {
    /// The CRI call that failed.
    pub fn call(&self) -> &'static str {
        match self {
            Error::Call { call, .. } | Error::Timeout { call, .. } => call,
        }
    }

    /// The gRPC code of a failed call, if the runtime answered.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Call { status, .. } => Some(status.code()),
            _ => None,
        }
    }

    /// The runtime's own message of a failed call; empty if the runtime did not answer.
    pub fn status_message(&self) -> &str {
        match self {
            Error::Call { status, .. } => status.message(),
            _ => "",
        }
    }

    /// True when the object the call was about does not exist (any more).
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(tonic::Code::NotFound)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How long one image pull may take.
const PULL_TIMEOUT: Duration = Duration::from_secs(3600);

/// How long an exec without a timeout of its own (a lifecycle hook's) may go on: a command that
/// outlives its container ends with it, so this only bounds a runtime that never answers.
const UNBOUNDED_EXEC: Duration = Duration::from_secs(24 * 3600);

/// A cheap-to-clone client of one runtime (and its image service).
#[derive(Clone)]
pub struct RuntimeClient {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    timeout: Duration,
    settled: Arc<Mutex<Settled>>,
    /// The runtime's channel, for calls the bindings cannot make (see `newer_fields`).
    channel: Channel,
    /// The image service's channel, for containerd's content service beside it.
    image_channel: Channel,
    /// Whether the runtime applies a container's own stop signal (asked once).
    stop_signals: Arc<tokio::sync::OnceCell<bool>>,
}

/// Answers of the runtime that cannot change while a listing shows the same state, so a sync
/// need not ask again: a running container's status details (fixed from its start until it
/// exits) and a ready sandbox's IPs (fixed when its network was set up). An entry goes when a
/// full listing asked after it was learnt no longer shows its container running, or its sandbox
/// ready. Exited containers are always asked afresh: a late event (an OOM kill) may still
/// change the reason.
#[derive(Default)]
struct Settled {
    running: HashMap<String, (Instant, Details)>,
    sandbox_ips: HashMap<String, (Instant, Vec<String>)>,
}

/// What ContainerStatus adds to a listed container.
#[derive(Clone)]
struct Details {
    state: ContainerState,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
    reason: String,
    message: String,
    image_ref: String,
    termination_message_file: Option<String>,
    log_path: String,
    user: Option<super::LinuxUser>,
}

impl Details {
    fn of(status: cri::ContainerStatus) -> Details {
        let message_path = status.annotations.get(ANNOTATION_TERMINATION_MESSAGE_PATH);
        let termination_message_file = status
            .mounts
            .iter()
            .find(|m| Some(&m.container_path) == message_path)
            .map(|m| m.host_path.clone());
        Details {
            state: state_from_cri(status.state),
            started_at: status.started_at,
            finished_at: status.finished_at,
            exit_code: status.exit_code,
            reason: status.reason,
            message: status.message,
            image_ref: status.image_ref,
            termination_message_file,
            log_path: status.log_path,
            user: status.user.and_then(|u| u.linux).map(|l| super::LinuxUser {
                uid: l.uid,
                gid: l.gid,
                supplemental_groups: l.supplemental_groups,
            }),
        }
    }

    fn apply(self, c: &mut Container) {
        c.state = self.state;
        c.started_at = self.started_at;
        c.finished_at = self.finished_at;
        c.exit_code = self.exit_code;
        c.reason = self.reason;
        c.message = self.message;
        c.image_ref = self.image_ref;
        c.termination_message_file = self.termination_message_file;
        c.user = self.user;
    }
}

/// Whether a runtime of this name and version applies `ContainerConfig.stop_signal`.
fn applies_stop_signals(name: &str, version: &str) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let at_least = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    match name {
        "containerd" => at_least >= (2, 1),
        "cri-o" => at_least >= (1, 33),
        _ => false,
    }
}

/// Forgets the settled answers a full listing asked at `asked` no longer vouches for: those
/// about IDs not among `kept` (running containers, ready sandboxes), unless learnt after the
/// listing was asked.
fn forget_unlisted<'a, V>(
    answers: &mut HashMap<String, (Instant, V)>,
    kept: impl Iterator<Item = &'a str>,
    asked: Instant,
) {
    let kept: HashSet<&str> = kept.collect();
    answers.retain(|id, (learnt, _)| kept.contains(id.as_str()) || *learnt >= asked);
}

/// A gRPC channel to the unix socket at `path`, dialled on first use (and again after a
/// dropped connection).
pub fn unix_channel(path: &Path) -> Channel {
    let socket = path.to_path_buf();
    // The URI is a placeholder: the connector below always dials the unix socket.
    let endpoint = Endpoint::from_static("http://[::1]:50051");
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let socket = socket.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
    });
    endpoint.connect_with_connector_lazy(connector)
}

impl RuntimeClient {
    /// A client of the runtime at `runtime` and the image service at `images` (unix socket paths).
    /// Connections are made lazily and re-made after the runtime restarts.
    pub fn new(runtime: &Path, images: &Path, timeout: Duration) -> Self {
        let runtime = unix_channel(runtime);
        let images = unix_channel(images);
        RuntimeClient {
            runtime: RuntimeServiceClient::new(runtime.clone()),
            images: ImageServiceClient::new(images.clone()),
            image_channel: images,
            timeout,
            settled: Default::default(),
            channel: runtime,
            stop_signals: Default::default(),
        }
    }

    fn settled(&self) -> std::sync::MutexGuard<'_, Settled> {
        self.settled.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One runtime call, cut at `timeout` and counted in the runtime operation metrics. The
    /// call is boxed before it is awaited: a gRPC call's state is kilobytes, and the
    /// futures of the syncs that make calls would otherwise hold a copy of it at each level.
    fn call<'a, T: 'a>(
        &'a self,
        call: &'static str,
        timeout: Duration,
        fut: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>> + 'a,
    ) -> impl Future<Output = Result<T>> + 'a {
        let fut = Box::pin(fut);
        async move {
            let started = std::time::Instant::now();
            let result = match tokio::time::timeout(timeout, fut).await {
                Ok(Ok(response)) => Ok(response.into_inner()),
                Ok(Err(status)) => Err(Error::Call { call, status }),
                Err(_) => Err(Error::Timeout { call, timeout }),
            };
            crate::metrics::get().runtime_operation(call, started.elapsed(), result.is_err());
            tracing::trace!(call, took = ?started.elapsed(), failed = result.is_err(), "runtime call");
            result
        }
    }

    /// The runtime's name and version.
    pub async fn version(&self) -> Result<cri::VersionResponse> {
        let mut c = self.runtime.clone();
        self.call(
            "Version",
            self.timeout,
            c.version(cri::VersionRequest::default()),
        )
        .await
    }

    /// Like [`Self::version`] but with a short timeout of its own, for health checks and start-up.
    pub async fn ping(&self, timeout: Duration) -> Result<cri::VersionResponse> {
        let mut c = self.runtime.clone();
        self.call(
            "Version",
            timeout,
            c.version(cri::VersionRequest::default()),
        )
        .await
    }

    pub async fn run_pod_sandbox(
        &self,
        config: cri::PodSandboxConfig,
        runtime_handler: String,
    ) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler,
        };
        Ok(self
            .call("RunPodSandbox", self.timeout, c.run_pod_sandbox(req))
            .await?
            .pod_sandbox_id)
    }

    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call("StopPodSandbox", self.timeout, c.stop_pod_sandbox(req))
            .await
            .map(drop)
    }

    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call("RemovePodSandbox", self.timeout, c.remove_pod_sandbox(req))
            .await
            .map(drop)
    }

    pub async fn pod_sandbox_status(&self, id: &str) -> Result<cri::PodSandboxStatus> {
        let mut c = self.runtime.clone();
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        };
        self.call("PodSandboxStatus", self.timeout, c.pod_sandbox_status(req))
            .await?
            .status
            .ok_or(Error::Call {
                call: "PodSandboxStatus",
                status: tonic::Status::internal("the runtime returned no status"),
            })
    }

    /// A sandbox's IPs, the pod IP first (none on the node's network), asked of the runtime
    /// once while the sandbox is ready.
    pub async fn sandbox_ips(&self, id: &str) -> Result<Vec<String>> {
        if let Some((_, ips)) = self.settled().sandbox_ips.get(id) {
            return Ok(ips.clone());
        }
        let asked = Instant::now();
        let status = self.pod_sandbox_status(id).await?;
        let ips: Vec<String> = status
            .network
            .map(|n| {
                std::iter::once(n.ip)
                    .chain(n.additional_ips.into_iter().map(|ip| ip.ip))
                    .filter(|ip| !ip.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        if status.state == cri::PodSandboxState::SandboxReady as i32 {
            self.settled()
                .sandbox_ips
                .insert(id.into(), (asked, ips.clone()));
        }
        Ok(ips)
    }

    /// Every sandbox, or only those carrying the given label.
    pub async fn list_sandboxes(&self, label: Option<(&str, &str)>) -> Result<Vec<Sandbox>> {
        let mut c = self.runtime.clone();
        let filter = label.map(|(k, v)| cri::PodSandboxFilter {
            label_selector: [(k.to_string(), v.to_string())].into(),
            ..Default::default()
        });
        let asked = Instant::now();
        let resp = self
            .call(
                "ListPodSandbox",
                self.timeout,
                c.list_pod_sandbox(cri::ListPodSandboxRequest { filter }),
            )
            .await?;
        let mut out: Vec<Sandbox> = resp.items.into_iter().map(sandbox_from_cri).collect();
        out.sort_by_key(|x| std::cmp::Reverse(x.created_at));
        if label.is_none() {
            let ready = out
                .iter()
                .filter(|s| s.state == SandboxState::Ready)
                .map(|s| s.id.as_str());
            forget_unlisted(&mut self.settled().sandbox_ips, ready, asked);
        }
        Ok(out)
    }

    /// Every container, or only those carrying the given label.
    pub async fn list_containers(&self, label: Option<(&str, &str)>) -> Result<Vec<Container>> {
        let mut c = self.runtime.clone();
        let filter = label.map(|(k, v)| cri::ContainerFilter {
            label_selector: [(k.to_string(), v.to_string())].into(),
            ..Default::default()
        });
        let asked = Instant::now();
        let resp = self
            .call(
                "ListContainers",
                self.timeout,
                c.list_containers(cri::ListContainersRequest { filter }),
            )
            .await?;
        let mut out: Vec<Container> = resp
            .containers
            .into_iter()
            .map(container_from_cri)
            .collect();
        out.sort_by_key(|x| std::cmp::Reverse(x.created_at));
        if label.is_none() {
            let running = out
                .iter()
                .filter(|c| c.state == ContainerState::Running)
                .map(|c| c.id.as_str());
            forget_unlisted(&mut self.settled().running, running, asked);
        }
        Ok(out)
    }

    /// Everything the runtime holds for one pod, with each container's status details: a
    /// single pod's relist, timed in `kubelet_pleg_pod_relist_duration_seconds`.
    pub async fn pod_runtime(&self, uid: &PodUid) -> Result<PodRuntime> {
        let began = Instant::now();
        let rt = match self.pod_listing(uid).await {
            Ok(listed) => self.with_details(listed).await,
            Err(e) => Err(e),
        };
        crate::metrics::get().pleg_pod_relist(began.elapsed());
        rt
    }

    /// The pod's sandboxes and containers as listed, without their containers' status details.
    pub async fn pod_listing(&self, uid: &PodUid) -> Result<PodRuntime> {
        let sandboxes = self.list_sandboxes(Some((LABEL_POD_UID, &uid.0))).await?;
        let containers = self.list_containers(Some((LABEL_POD_UID, &uid.0))).await?;
        Ok(PodRuntime {
            sandboxes,
            containers,
        })
    }

    /// A pod's listed sandboxes and containers, each container with its status details (and
    /// its state as the status tells; a container gone since the listing keeps the listing's).
    pub async fn with_details(&self, mut listed: PodRuntime) -> Result<PodRuntime> {
        for c in listed.containers.iter_mut() {
            match self
                .details(&c.id, c.state == ContainerState::Running)
                .await
            {
                Ok(details) => details.apply(c),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(listed)
    }

    /// A container's status details: remembered from the first answer while it runs
    /// (`listed_running`: the latest listing shows it running), else asked.
    async fn details(&self, id: &str, listed_running: bool) -> Result<Details> {
        if listed_running && let Some((_, details)) = self.settled().running.get(id) {
            return Ok(details.clone());
        }
        let asked = Instant::now();
        let details = Details::of(self.container_status(id).await?);
        if details.state == ContainerState::Running {
            self.settled()
                .running
                .insert(id.into(), (asked, details.clone()));
        }
        Ok(details)
    }

    /// The log file of a container a listing shows running (empty when it has none).
    pub async fn log_path(&self, id: &str) -> Result<std::path::PathBuf> {
        Ok(self.details(id, true).await?.log_path.into())
    }

    /// Creates a container; `stop_signal` (a CRI `Signal` value) goes to runtimes that apply it.
    pub async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
        stop_signal: Option<i32>,
    ) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let created = match stop_signal {
            Some(signal) if self.takes_stop_signals().await => {
                let call = super::newer_fields::create_container(self.channel.clone(), req, signal);
                self.call("CreateContainer", self.timeout, call).await?
            }
            _ => {
                self.call("CreateContainer", self.timeout, c.create_container(req))
                    .await?
            }
        };
        Ok(created.container_id)
    }

    /// True when the runtime applies the CRI's container stop signal (containerd 2.1 and CRI-O
    /// 1.33 on); older runtimes ignore the field, and nodelet sends the signal itself.
    pub async fn takes_stop_signals(&self) -> bool {
        let answer = self
            .stop_signals
            .get_or_try_init(|| async {
                let v = self.version().await?;
                Ok::<_, Error>(applies_stop_signals(&v.runtime_name, &v.runtime_version))
            })
            .await;
        answer.copied().unwrap_or(false)
    }

    pub async fn start_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::StartContainerRequest {
            container_id: id.into(),
        };
        self.call("StartContainer", self.timeout, c.start_container(req))
            .await
            .map(drop)
    }

    /// Stops a container: SIGTERM, then SIGKILL after `grace_seconds`.
    pub async fn stop_container(&self, id: &str, grace_seconds: i64) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::StopContainerRequest {
            container_id: id.into(),
            timeout: grace_seconds,
        };
        // The call lasts as long as the grace period: allow for it on top of the usual timeout.
        let timeout = self.timeout + Duration::from_secs(grace_seconds.max(0) as u64);
        self.call("StopContainer", timeout, c.stop_container(req))
            .await
            .map(drop)
    }

    /// Changes a running container's cgroup limits in place (an in-place resize).
    pub async fn update_container_resources(
        &self,
        id: &str,
        resources: cri::LinuxContainerResources,
    ) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::UpdateContainerResourcesRequest {
            container_id: id.into(),
            linux: Some(resources),
            ..Default::default()
        };
        self.call(
            "UpdateContainerResources",
            self.timeout,
            c.update_container_resources(req),
        )
        .await
        .map(drop)
    }

    pub async fn remove_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::RemoveContainerRequest {
            container_id: id.into(),
        };
        self.call("RemoveContainer", self.timeout, c.remove_container(req))
            .await
            .map(drop)
    }

    pub async fn container_status(&self, id: &str) -> Result<cri::ContainerStatus> {
        let mut c = self.runtime.clone();
        let req = cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        self.call("ContainerStatus", self.timeout, c.container_status(req))
            .await?
            .status
            .ok_or(Error::Call {
                call: "ContainerStatus",
                status: tonic::Status::internal("the runtime returned no status"),
            })
    }

    /// The runtime's verbose account of a container (containerd: `info`, a JSON document with
    /// the container's CRI config and OCI runtime spec).
    pub async fn container_info(&self, id: &str) -> Result<HashMap<String, String>> {
        let mut c = self.runtime.clone();
        let req = cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        };
        Ok(self
            .call("ContainerStatus", self.timeout, c.container_status(req))
            .await?
            .info)
    }

    /// The runtime's verbose account of a sandbox, as [`container_info`](Self::container_info).
    pub async fn sandbox_info(&self, id: &str) -> Result<HashMap<String, String>> {
        let mut c = self.runtime.clone();
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        };
        Ok(self
            .call("PodSandboxStatus", self.timeout, c.pod_sandbox_status(req))
            .await?
            .info)
    }

    /// The host PID of the container's first process, from the runtime's verbose status
    /// (`None` when the runtime does not tell or the container does not run).
    pub async fn container_pid(&self, id: &str) -> Result<Option<i32>> {
        Ok(verbose_pid(&self.container_info(id).await?))
    }

    /// The host PID of the sandbox's pause process, from the runtime's verbose status (`None`
    /// when the runtime does not tell or the sandbox does not run).
    pub async fn sandbox_pid(&self, id: &str) -> Result<Option<i32>> {
        Ok(verbose_pid(&self.sandbox_info(id).await?))
    }

    /// Asks the runtime to reopen the container's log file, after it was renamed or removed.
    pub async fn reopen_container_log(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::ReopenContainerLogRequest {
            container_id: id.into(),
        };
        self.call(
            "ReopenContainerLog",
            self.timeout,
            c.reopen_container_log(req),
        )
        .await
        .map(drop)
    }

    /// Resource usage of every pod sandbox (network included). Runtimes that predate the call
    /// answer `Unimplemented`.
    pub async fn pod_sandbox_stats(&self) -> Result<Vec<cri::PodSandboxStats>> {
        let mut c = self.runtime.clone();
        let req = cri::ListPodSandboxStatsRequest { filter: None };
        Ok(self
            .call(
                "ListPodSandboxStats",
                self.timeout,
                c.list_pod_sandbox_stats(req),
            )
            .await?
            .stats)
    }

    /// Runs a command in the container and waits for it, at most `timeout` (whole seconds, at
    /// least one); `Duration::ZERO`: until it ends or its container does, as upstream's hooks.
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<cri::ExecSyncResponse> {
        let mut c = self.runtime.clone();
        let unbounded = timeout.is_zero();
        let req = cri::ExecSyncRequest {
            container_id: id.into(),
            cmd,
            timeout: if unbounded {
                0
            } else {
                timeout.as_secs().max(1) as i64
            },
        };
        // The runtime enforces the command's timeout; allow a little on top for the call itself.
        let deadline = if unbounded {
            UNBOUNDED_EXEC
        } else {
            timeout + Duration::from_secs(2)
        };
        self.call("ExecSync", deadline, c.exec_sync(req)).await
    }

    /// Asks the runtime's streaming server for an exec session; returns the URL to upgrade.
    pub async fn exec(&self, req: cri::ExecRequest) -> Result<String> {
        let mut c = self.runtime.clone();
        Ok(self.call("Exec", self.timeout, c.exec(req)).await?.url)
    }

    /// Asks the runtime's streaming server for an attach session; returns the URL to upgrade.
    pub async fn attach(&self, req: cri::AttachRequest) -> Result<String> {
        let mut c = self.runtime.clone();
        Ok(self.call("Attach", self.timeout, c.attach(req)).await?.url)
    }

    /// Asks the runtime's streaming server to forward ports of a sandbox; returns the URL.
    pub async fn port_forward(&self, sandbox_id: &str, ports: Vec<i32>) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = cri::PortForwardRequest {
            pod_sandbox_id: sandbox_id.into(),
            port: ports,
        };
        Ok(self
            .call("PortForward", self.timeout, c.port_forward(req))
            .await?
            .url)
    }

    /// The image's status, or `None` when the runtime does not have it.
    pub async fn image_status(&self, image: &str) -> Result<Option<cri::Image>> {
        let mut c = self.images.clone();
        let req = cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        };
        Ok(self
            .call("ImageStatus", self.timeout, c.image_status(req))
            .await?
            .image)
    }

    /// Resource usage of every container the runtime has.
    pub async fn container_stats(&self) -> Result<Vec<cri::ContainerStats>> {
        let mut c = self.runtime.clone();
        let req = cri::ListContainerStatsRequest { filter: None };
        Ok(self
            .call(
                "ListContainerStats",
                self.timeout,
                c.list_container_stats(req),
            )
            .await?
            .stats)
    }

    /// Every image the runtime has.
    pub async fn list_images(&self) -> Result<Vec<cri::Image>> {
        let mut c = self.images.clone();
        let req = cri::ListImagesRequest { filter: None };
        Ok(self
            .call("ListImages", self.timeout, c.list_images(req))
            .await?
            .images)
    }

    /// Removes an image by ID, with every name it has.
    pub async fn remove_image(&self, id: &str) -> Result<()> {
        let mut c = self.images.clone();
        let req = cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: id.into(),
                ..Default::default()
            }),
        };
        self.call("RemoveImage", self.timeout, c.remove_image(req))
            .await
            .map(|_| ())
    }

    /// The mount point of the runtime's image filesystem and the bytes its images use there.
    pub async fn image_fs(&self) -> Result<Option<(String, u64)>> {
        let mut c = self.images.clone();
        let resp = self
            .call(
                "ImageFsInfo",
                self.timeout,
                c.image_fs_info(cri::ImageFsInfoRequest {}),
            )
            .await?;
        Ok(resp.image_filesystems.into_iter().next().map(|fs| {
            (
                fs.fs_id.map(|f| f.mountpoint).unwrap_or_default(),
                fs.used_bytes.map_or(0, |u| u.value),
            )
        }))
    }

    async fn status(&self, verbose: bool) -> Result<cri::StatusResponse> {
        let mut c = self.runtime.clone();
        self.call(
            "Status",
            self.timeout,
            c.status(cri::StatusRequest { verbose }),
        )
        .await
    }

    /// The runtime's conditions (RuntimeReady, NetworkReady and any of its own).
    pub async fn conditions(&self) -> Result<Vec<cri::RuntimeCondition>> {
        Ok(self
            .status(false)
            .await?
            .status
            .map(|s| s.conditions)
            .unwrap_or_default())
    }

    /// The runtime handlers the runtime names in its status, with what each supports (runtimes
    /// from before the field, containerd 1.6 among them, name none).
    pub async fn handlers(&self) -> Result<Vec<cri::RuntimeHandler>> {
        Ok(self.status(false).await?.runtime_handlers)
    }

    /// The runtime's stream of container events (GetContainerEvents). It has no deadline; the
    /// runtime may send its response headers only with the first event. Runtimes that predate
    /// the call (containerd 1.6) answer `Unimplemented`.
    pub async fn container_events(&self) -> Result<tonic::Streaming<cri::ContainerEventResponse>> {
        let mut c = self.runtime.clone();
        c.get_container_events(cri::GetEventsRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| Error::Call {
                call: "GetContainerEvents",
                status,
            })
    }

    /// The cgroup driver the runtime reports over the CRI's RuntimeConfig call; `None` from
    /// runtimes that predate the call (containerd 1.6 answers `Unimplemented`).
    pub async fn reported_cgroup_driver(&self) -> Result<Option<crate::types::CgroupDriver>> {
        let mut c = self.runtime.clone();
        let req = cri::RuntimeConfigRequest {};
        match self
            .call("RuntimeConfig", self.timeout, c.runtime_config(req))
            .await
        {
            Ok(resp) => Ok(resp.linux.map(|linux| match linux.cgroup_driver() {
                cri::CgroupDriver::Systemd => crate::types::CgroupDriver::Systemd,
                cri::CgroupDriver::Cgroupfs => crate::types::CgroupDriver::Cgroupfs,
            })),
            Err(e) if e.code() == Some(tonic::Code::Unimplemented) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The runtime's own configuration, from its verbose status (containerd's CRI plugin config),
    /// when it tells.
    pub async fn runtime_config(&self) -> Result<Option<serde_json::Value>> {
        let resp = self.status(true).await?;
        Ok(resp
            .info
            .get("config")
            .and_then(|text| serde_json::from_str(text).ok()))
    }

    /// Pulls an image and returns its reference (image ID or digest).
    pub async fn pull_image(
        &self,
        image: &str,
        auth: Option<cri::AuthConfig>,
        sandbox: Option<cri::PodSandboxConfig>,
    ) -> Result<String> {
        let mut c = self.images.clone();
        let req = cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            auth,
            sandbox_config: sandbox,
        };
        // Pulls of large images take long; upstream sets no deadline, an hour bounds a hung one.
        Ok(self
            .call(
                "PullImage",
                PULL_TIMEOUT.max(self.timeout),
                c.pull_image(req),
            )
            .await?
            .image_ref)
    }

    /// The image downloads in progress, where the image service is containerd (its content
    /// service lists them); `None` where the runtime has no such service.
    pub async fn downloads(&self) -> Result<Option<Vec<super::Download>>> {
        let asked = super::content::downloads(self.image_channel.clone());
        match self
            .call("ListStatuses", self.timeout, async {
                asked.await.map(tonic::Response::new)
            })
            .await
        {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.code() == Some(tonic::Code::Unimplemented) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The `pid` in the JSON `info` of a verbose container or sandbox status (containerd's layout).
fn verbose_pid(info: &std::collections::HashMap<String, String>) -> Option<i32> {
    info.get("info")
        .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
        .and_then(|v| v.get("pid").and_then(serde_json::Value::as_i64))
        .and_then(|pid| i32::try_from(pid).ok())
        .filter(|pid| *pid > 0)
}

/// Waits until the runtime answers, up to `deadline`, logging each failed attempt.
pub async fn wait_for_runtime(
    client: &RuntimeClient,
    endpoint: &Path,
    deadline: Duration,
) -> Result<cri::VersionResponse> {
    let started = tokio::time::Instant::now();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match client.ping(Duration::from_secs(2)).await {
            Ok(v) => return Ok(v),
            Err(e) if started.elapsed() + Duration::from_secs(1) >= deadline => return Err(e),
            Err(e) => {
                tracing::warn!(endpoint = %endpoint.display(), attempt, error = %crate::types::error_chain(&e), "container runtime not answering yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::applies_stop_signals;

    #[test]
    fn stop_signals_go_to_runtimes_that_apply_them() {
        assert!(applies_stop_signals("containerd", "v2.4.2"));
        assert!(applies_stop_signals("containerd", "2.1.0"));
        assert!(!applies_stop_signals("containerd", "v2.0.5"));
        assert!(!applies_stop_signals("containerd", "1.6.20~ds1"));
        assert!(applies_stop_signals("cri-o", "1.33.0"));
        assert!(!applies_stop_signals("cri-o", "1.32.4"));
        assert!(!applies_stop_signals("other", "9.9"));
    }
}

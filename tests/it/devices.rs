//! Device plugins: upstream's sample device plugin, and a plugin of the test's own for the
//! failure paths, register with nodelet; their devices reach pods and the pod-resources API.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;
use nodelet::cm::devices::proto::device_plugin_server::{DevicePlugin, DevicePluginServer};
use nodelet::cm::devices::proto::registration_client::RegistrationClient;
use nodelet::cm::devices::proto::{self, Device};
use nodelet::server::pod_resources::proto::{AllocatableResourcesRequest, ListPodResourcesRequest};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::bed::{BUSYBOX, FOREVER, Node, eventually};

/// A pod whose one container asks for `count` of `resource` and runs `script`.
pub fn pod(name: &str, resource: &str, count: u32, script: &str) -> String {
    let script = serde_json::to_string(&format!("trap 'exit 0' TERM; {script}")).expect("json");
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, {script}]
    resources:
      limits:
        {resource}: "{count}"
"#
    )
}

/// The healthy devices the node can hand out, by the pod-resources API.
pub async fn allocatable(node: &Node, resource: &str) -> Vec<String> {
    let Ok(answer) = node
        .pod_resources()
        .await
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
    else {
        return Vec::new();
    };
    let mut ids: Vec<String> = answer
        .into_inner()
        .devices
        .into_iter()
        .filter(|d| d.resource_name == resource)
        .flat_map(|d| d.device_ids)
        .collect();
    ids.sort();
    ids
}

/// The devices of `resource` the container `c` of the pod named `name` (its API name) holds, by
/// the pod-resources API.
pub async fn held(node: &Node, name: &str, resource: &str) -> Vec<String> {
    let listed = node
        .pod_resources()
        .await
        .list(ListPodResourcesRequest {})
        .await
        .expect("List")
        .into_inner();
    listed
        .pod_resources
        .into_iter()
        .filter(|p| p.name == name)
        .flat_map(|p| p.containers)
        .filter(|c| c.name == "c")
        .flat_map(|c| c.devices)
        .filter(|d| d.resource_name == resource)
        .flat_map(|d| d.device_ids)
        .collect()
}

/// The container's waiting reason and message, if it waits.
fn waiting(node: &Node, pod: &str) -> Option<(String, String)> {
    let status = node.status(pod)?;
    let w = status
        .container_statuses?
        .into_iter()
        .next()?
        .state?
        .waiting?;
    Some((w.reason?, w.message.unwrap_or_default()))
}

/// The test's own plugin: three devices whose health the test sets, a preference for the
/// highest ID, an Allocate that fails while `refuse` is set and answers with every kind of
/// container edit otherwise, and a record of PreStartContainer calls.
#[derive(Clone)]
pub struct OwnPlugin {
    pub devices: Arc<watch::Sender<Vec<Device>>>,
    refuse: Arc<AtomicBool>,
    pre_started: Arc<Mutex<Vec<Vec<String>>>>,
    info: PathBuf,
}

pub fn device(id: &str, healthy: bool) -> Device {
    Device {
        id: id.into(),
        health: if healthy { "Healthy" } else { "Unhealthy" }.into(),
        topology: None,
    }
}

const OPTIONS: proto::DevicePluginOptions = proto::DevicePluginOptions {
    pre_start_required: true,
    get_preferred_allocation_available: true,
};

type DeviceLists = Pin<Box<dyn Stream<Item = Result<proto::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for OwnPlugin {
    type ListAndWatchStream = DeviceLists;

    async fn get_device_plugin_options(
        &self,
        _: Request<proto::Empty>,
    ) -> Result<Response<proto::DevicePluginOptions>, Status> {
        Ok(Response::new(OPTIONS))
    }

    async fn list_and_watch(
        &self,
        _: Request<proto::Empty>,
    ) -> Result<Response<DeviceLists>, Status> {
        let rx = self.devices.subscribe();
        let lists = futures_util::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first {
                rx.changed().await.ok()?;
            }
            let devices = rx.borrow_and_update().clone();
            Some((Ok(proto::ListAndWatchResponse { devices }), (rx, false)))
        });
        Ok(Response::new(Box::pin(lists)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<proto::PreferredAllocationRequest>,
    ) -> Result<Response<proto::PreferredAllocationResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| {
                let mut ids = r.available_device_i_ds;
                ids.sort();
                ids.reverse();
                ids.truncate(usize::try_from(r.allocation_size).unwrap_or(0));
                proto::ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(proto::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<proto::AllocateRequest>,
    ) -> Result<Response<proto::AllocateResponse>, Status> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(Status::unavailable("the devices are being reset"));
        }
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| {
                let ids = r.devices_ids.join(",");
                proto::ContainerAllocateResponse {
                    envs: [("OWN_DEVICES".to_string(), ids.clone())].into(),
                    mounts: vec![proto::Mount {
                        container_path: "/run/own/info".into(),
                        host_path: self.info.display().to_string(),
                        read_only: true,
                    }],
                    devices: vec![proto::DeviceSpec {
                        container_path: "/dev/own0".into(),
                        host_path: "/dev/null".into(),
                        permissions: "rw".into(),
                    }],
                    annotations: [("example.com/own-devices".to_string(), ids)].into(),
                    cdi_devices: Vec::new(),
                }
            })
            .collect();
        Ok(Response::new(proto::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<proto::PreStartContainerRequest>,
    ) -> Result<Response<proto::PreStartContainerResponse>, Status> {
        let ids = request.into_inner().devices_ids;
        self.pre_started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ids);
        Ok(Response::new(proto::PreStartContainerResponse {}))
    }
}

/// Serves `plugin` on `socket` until `cancel`.
fn serve_plugin(plugin: OwnPlugin, socket: &Path, cancel: CancellationToken) {
    let listener = tokio::net::UnixListener::bind(socket).expect("the plugin's socket");
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(plugin))
            .serve_with_incoming_shutdown(incoming, cancel.cancelled_owned()),
    );
}

/// Registers the node's own plugin for `resource` with `version`.
async fn register(node: &Node, resource: &str, version: &str) -> Result<(), Status> {
    let kubelet = node.path("root/device-plugins/kubelet.sock");
    let mut registration = RegistrationClient::new(nodelet::runtime::unix_channel(&kubelet));
    let request = proto::RegisterRequest {
        version: version.into(),
        endpoint: "own.sock".into(),
        resource_name: resource.into(),
        options: Some(OPTIONS),
    };
    registration.register(request).await.map(|_| ())
}

/// Starts the test's own plugin for `node` with `devices` (ID, healthy), served on `own.sock` in
/// the node's device plugin dir until the token is cancelled; not registered yet.
pub async fn own_plugin(node: &Node, devices: &[(&str, bool)]) -> (OwnPlugin, CancellationToken) {
    let dir = node.path("root/device-plugins");
    let kubelet = dir.join("kubelet.sock");
    eventually(
        "the registration socket",
        Duration::from_secs(30),
        || async { kubelet.exists().then_some(()) },
    )
    .await;
    let info = node.path("own-info");
    std::fs::write(&info, "info-from-the-plugin\n").expect("the info file");
    let list = devices.iter().map(|(id, healthy)| device(id, *healthy));
    let plugin = OwnPlugin {
        devices: Arc::new(watch::channel(list.collect()).0),
        refuse: Arc::new(AtomicBool::new(false)),
        pre_started: Arc::default(),
        info,
    };
    let cancel = CancellationToken::new();
    serve_plugin(plugin.clone(), &dir.join("own.sock"), cancel.clone());
    (plugin, cancel)
}

/// Registers the node's own plugin for `resource` and waits until the node hands out `ids`.
pub async fn register_own(node: &Node, resource: &str, ids: &[&str]) {
    register(node, resource, "v1beta1")
        .await
        .expect("registered");
    eventually(
        "the plugin's devices to hand out",
        Duration::from_secs(30),
        || async { (allocatable(node, resource).await == ids).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn a_device_plugins_devices_reach_the_container_and_its_failures_hold_back_only_its_pod() {
    let node = Node::start("devown", &[]).await;
    let devices = [("a", true), ("b", true), ("c", true)];
    let (plugin, cancel) = own_plugin(&node, &devices).await;
    let refused = register(&node, "example.com/own", "v1alpha1")
        .await
        .expect_err("an old API version is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    register_own(&node, "example.com/own", &["a", "b", "c"]).await;

    // The plugin's preference, environment, mount, device node and annotation reach the
    // container, after its PreStartContainer.
    let script = format!(
        "echo env=$OWN_DEVICES; cat /run/own/info; test -c /dev/own0 && echo node-ok; {FOREVER}"
    );
    node.write_manifest("pref.yaml", &pod("pref", "example.com/own", 1, &script));
    node.wait_log("pref", "c", "env=c").await;
    node.wait_log("pref", "c", "info-from-the-plugin").await;
    node.wait_log("pref", "c", "node-ok").await;
    assert_eq!(
        *plugin.pre_started.lock().unwrap_or_else(|e| e.into_inner()),
        [vec!["c".to_string()]]
    );
    let (_, containers) = node.wait_running("pref", 1).await;
    let status = node
        .runtime
        .container_status(&containers[0].id)
        .await
        .expect("ContainerStatus");
    assert_eq!(
        status
            .annotations
            .get("example.com/own-devices")
            .map(String::as_str),
        Some("c")
    );
    assert_eq!(
        held(&node, &node.pod_name("pref"), "example.com/own").await,
        ["c"]
    );

    // A device the plugin calls unhealthy is no longer handed out.
    plugin.devices.send_replace(vec![
        device("a", false),
        device("b", true),
        device("c", true),
    ]);
    eventually("device a unhealthy", Duration::from_secs(30), || async {
        (allocatable(&node, "example.com/own").await == ["b", "c"]).then_some(())
    })
    .await;

    // A failing Allocate holds back only the pod asking, which starts once the plugin answers.
    plugin.refuse.store(true, Ordering::SeqCst);
    let script = format!("echo env=$OWN_DEVICES; {FOREVER}");
    node.write_manifest("late.yaml", &pod("late", "example.com/own", 1, &script));
    eventually(
        "the late pod waiting on its devices",
        Duration::from_secs(60),
        || async {
            let (reason, message) = waiting(&node, "late")?;
            (reason == "CreateContainerConfigError" && message.contains("example.com/own"))
                .then_some(())
        },
    )
    .await;
    plugin.refuse.store(false, Ordering::SeqCst);
    node.wait_log("late", "c", "env=b").await;
    assert_eq!(
        held(&node, &node.pod_name("late"), "example.com/own").await,
        ["b"]
    );

    // Both healthy devices are held: a pod asking for one more is refused, as upstream.
    node.write_manifest("more.yaml", &pod("more", "example.com/own", 1, FOREVER));
    let status = node
        .wait_status("more", "refused", |s| s.phase.as_deref() == Some("Failed"))
        .await;
    assert_eq!(status.reason.as_deref(), Some("UnexpectedAdmissionError"));
    node.write_manifest("none.yaml", &pod("none", "example.com/nobody", 1, FOREVER));
    let status = node
        .wait_status("none", "refused", |s| s.phase.as_deref() == Some("Failed"))
        .await;
    assert_eq!(status.reason.as_deref(), Some("OutOfexample.com/nobody"));

    // The health of a held device shows in its container's status (ResourceHealthStatus), and
    // a change wakes the pod at once, well before its next resync.
    let shown = |health: &'static str| {
        let node = &node;
        move || async move {
            let status = node.status("pref")?;
            let c = status.container_statuses?.into_iter().next()?;
            let all = c.allocated_resources_status?;
            let devices = all.first()?.resources.clone()?;
            let shown = (all.len() == 1 && all[0].name == "example.com/own")
                && devices.len() == 1
                && devices[0].resource_id == "c"
                && devices[0].health.as_deref() == Some(health);
            shown.then_some(())
        }
    };
    eventually(
        "c healthy in the status",
        Duration::from_secs(20),
        shown("Healthy"),
    )
    .await;
    plugin.devices.send_replace(vec![
        device("a", false),
        device("b", true),
        device("c", false),
    ]);
    eventually(
        "c unhealthy in the status",
        Duration::from_secs(20),
        shown("Unhealthy"),
    )
    .await;
    cancel.cancel();
    node.finish().await;
}

/// Runs upstream's sample device plugin where it looks for the kubelet: its
/// `/var/lib/kubelet/device-plugins` is the node's device plugin dir, in a mount namespace of
/// its own (the host's /var/lib is not touched). Its log goes beside that dir.
fn sample_plugin(dir: &Path) -> tokio::process::Child {
    let bin = PathBuf::from(std::env::var("K8S_BIN").expect("K8S_BIN (make test sets it)"))
        .join("sample-device-plugin");
    assert!(
        bin.exists(),
        "{} is missing: run make e2e-images",
        bin.display()
    );
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.with_file_name("sample-device-plugin.log"))
        .expect("the plugin's log");
    let script = r#"set -e
mount --make-rprivate /
mount --bind "$DIR" /mnt
mount -t tmpfs -o size=1m,mode=0755 sample-device-plugin /var/lib
mkdir -p /var/lib/kubelet/device-plugins
mount --move /mnt /var/lib/kubelet/device-plugins
exec "$BIN""#;
    tokio::process::Command::new("unshare")
        .args(["--mount", "--", "sh", "-c", script])
        .env("DIR", dir)
        .env("BIN", &bin)
        .env("PLUGIN_SOCK_DIR", "/var/lib/kubelet/device-plugins")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("unshare the sample device plugin")
}

#[tokio::test]
async fn upstreams_sample_device_plugin_serves_pods_across_restarts_of_either_side() {
    const RESOURCE: &str = "example.com/resource";
    let mut node = Node::start("devsample", &[]).await;
    let dir = node.path("root/device-plugins");
    let kubelet = dir.join("kubelet.sock");
    eventually(
        "the registration socket",
        Duration::from_secs(30),
        || async { kubelet.exists().then_some(()) },
    )
    .await;
    let mut plugin = sample_plugin(&dir);
    eventually(
        "the sample plugin's two devices",
        Duration::from_secs(60),
        || async { (allocatable(&node, RESOURCE).await == ["Dev-1", "Dev-2"]).then_some(()) },
    )
    .await;
    // The plugin mounts a file per device at /tmp/<device>.
    let script = format!("for f in /tmp/Dev-*; do echo has $f; done; {FOREVER}");
    node.write_manifest("first.yaml", &pod("first", RESOURCE, 1, &script));
    node.wait_log("first", "c", "has /tmp/Dev-1").await;
    let (_, before) = node.wait_running("first", 1).await;
    node.write_manifest("two.yaml", &pod("two", RESOURCE, 2, FOREVER));
    let status = node
        .wait_status("two", "refused", |s| s.phase.as_deref() == Some("Failed"))
        .await;
    assert_eq!(status.reason.as_deref(), Some("UnexpectedAdmissionError"));

    // nodelet restarts: the plugin registers again, the running pod keeps its device and its
    // container, and a new pod gets the other device.
    node.stop_agent().await;
    node.restart(&[]).await;
    eventually(
        "the sample plugin back",
        Duration::from_secs(90),
        || async { (allocatable(&node, RESOURCE).await == ["Dev-1", "Dev-2"]).then_some(()) },
    )
    .await;
    node.write_manifest("second.yaml", &pod("second", RESOURCE, 1, &script));
    node.wait_log("second", "c", "has /tmp/Dev-2").await;
    assert_eq!(
        held(&node, &node.pod_name("first"), RESOURCE).await,
        ["Dev-1"]
    );
    assert_eq!(
        held(&node, &node.pod_name("second"), RESOURCE).await,
        ["Dev-2"]
    );
    let (_, after) = node.wait_running("first", 1).await;
    assert_eq!(
        before[0].id, after[0].id,
        "the first pod's container was kept"
    );

    // The plugin restarts: its devices are unhealthy while it is away, then handed out again.
    plugin.kill().await.expect("stop the sample plugin");
    eventually("no healthy device", Duration::from_secs(30), || async {
        allocatable(&node, RESOURCE).await.is_empty().then_some(())
    })
    .await;
    let mut plugin = sample_plugin(&dir);
    eventually(
        "the sample plugin registered again",
        Duration::from_secs(60),
        || async { (allocatable(&node, RESOURCE).await == ["Dev-1", "Dev-2"]).then_some(()) },
    )
    .await;
    plugin.kill().await.expect("stop the sample plugin");
    node.finish().await;
    for device in ["Dev-1", "Dev-2"] {
        let _ = std::fs::remove_file(Path::new("/tmp").join(device));
    }
}

//! The CRI boundary: a client for the runtime and image services, and the runtime's state in our
//! vocabulary (sandboxes and containers of a pod, keyed by the kubelet's CRI labels).

mod cache;
mod content;
mod newer_fields;
mod remote;

use std::collections::HashMap;

pub use cache::{Changing, PodCache};
pub use content::Download;
pub use k8s_cri::v1 as cri;
pub use remote::{Error, Result, RuntimeClient, unix_channel, wait_for_runtime};

use crate::types::{CgroupDriver, PodUid};

/// CRI label: the pod's name.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// CRI label: the pod's namespace.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// CRI label: the pod's UID.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// CRI label: the container's name.
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// CRI label: the versioned digest of the container spec the container was created from (see
/// `pod::container_digest`), what decides whether it still matches its spec.
pub const LABEL_CONTAINER_DIGEST: &str = "nodelet.io/container-digest";
/// CRI annotation: the hash of the container spec the container was created from.
pub const ANNOTATION_CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// CRI annotation: the container's restart count.
pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// CRI annotation: where the container writes its termination message.
pub const ANNOTATION_TERMINATION_MESSAGE_PATH: &str =
    "io.kubernetes.container.terminationMessagePath";
/// CRI annotation: File or FallbackToLogsOnError.
pub const ANNOTATION_TERMINATION_MESSAGE_POLICY: &str =
    "io.kubernetes.container.terminationMessagePolicy";
/// CRI annotation: the pod's termination grace period in seconds.
pub const ANNOTATION_TERMINATION_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";
/// CRI annotation: the cgroup limits the container was created with (see
/// `pod_sync::convert::resources_digest`), so an in-place resize knows what changed.
pub const ANNOTATION_RESOURCES: &str = "nodelet.io/resources";
/// Sandbox annotation naming the node agent that owns the sandbox, so agents sharing one runtime
/// (tests, several nodes on one host) never collect each other's pods.
pub const ANNOTATION_NODE_NAME: &str = "nodelet.io/node-name";

/// Whether a sandbox is up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SandboxState {
    Ready,
    NotReady,
}

/// A pod sandbox as the runtime reports it.
#[derive(Clone, Debug)]
pub struct Sandbox {
    pub id: String,
    pub uid: PodUid,
    pub name: String,
    pub namespace: String,
    pub attempt: u32,
    pub state: SandboxState,
    pub created_at: i64,
    pub annotations: HashMap<String, String>,
    /// Whether the sandbox carries the kubelet's pod labels (the agent made it).
    pub has_pod_labels: bool,
}

impl Sandbox {
    /// Whether the node agent `node` may act on this sandbox: it was made by a kubelet-like agent
    /// (pod labels) and not by another node agent sharing the runtime.
    pub fn owned_by(&self, node: &str) -> bool {
        self.has_pod_labels
            && self
                .annotations
                .get(ANNOTATION_NODE_NAME)
                .is_none_or(|n| n == node)
    }
}

/// Where a container is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    #[default]
    Unknown,
}

/// A container as the runtime reports it.
#[derive(Clone, Debug, Default)]
pub struct Container {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    pub attempt: u32,
    pub state: ContainerState,
    pub created_at: i64,
    /// The spec digest recorded at creation ([`LABEL_CONTAINER_DIGEST`]).
    pub digest: String,
    /// Details from ContainerStatus (zero or empty until fetched): times in Unix nanoseconds.
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    /// The runtime's reason for an exit (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    pub message: String,
    /// The image as its creator named it (where the runtime reports it), the image as the
    /// runtime was asked for it, and the image ID it resolved to.
    pub user_image: String,
    pub image: String,
    pub image_ref: String,
    /// The host file behind the container's terminationMessagePath, and the message policy.
    pub termination_message_file: Option<String>,
    pub termination_message_policy: String,
    /// The pod's termination grace period recorded at creation, for pods no longer desired.
    pub grace_seconds: Option<i64>,
    /// The digest of the cgroup limits it was created with (empty when not recorded).
    pub resources: String,
    /// The user its first process runs as, where the runtime reports it: uid, gid and
    /// supplemental groups.
    pub user: Option<LinuxUser>,
}

/// The identity a container's first process started with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinuxUser {
    pub uid: i64,
    pub gid: i64,
    pub supplemental_groups: Vec<i64>,
}

/// Everything the runtime holds for one pod UID.
#[derive(Clone, Debug, Default)]
pub struct PodRuntime {
    /// Newest first.
    pub sandboxes: Vec<Sandbox>,
    /// Newest first.
    pub containers: Vec<Container>,
}

impl PodRuntime {
    /// The newest sandbox, if any.
    pub fn latest_sandbox(&self) -> Option<&Sandbox> {
        self.sandboxes.first()
    }

    /// The newest container with this name, if any.
    pub fn latest_container(&self, name: &str) -> Option<&Container> {
        self.containers.iter().find(|c| c.name == name)
    }
}

fn sandbox_from_cri(s: cri::PodSandbox) -> Sandbox {
    let meta = s.metadata.unwrap_or_default();
    Sandbox {
        id: s.id,
        uid: PodUid(meta.uid),
        name: meta.name,
        namespace: meta.namespace,
        attempt: meta.attempt,
        state: if s.state == cri::PodSandboxState::SandboxReady as i32 {
            SandboxState::Ready
        } else {
            SandboxState::NotReady
        },
        created_at: s.created_at,
        annotations: s.annotations,
        has_pod_labels: s.labels.contains_key(LABEL_POD_UID),
    }
}

fn container_from_cri(c: cri::Container) -> Container {
    let meta = c.metadata.unwrap_or_default();
    Container {
        id: c.id,
        sandbox_id: c.pod_sandbox_id,
        name: meta.name,
        attempt: meta.attempt,
        state: state_from_cri(c.state),
        created_at: c.created_at,
        digest: c
            .labels
            .get(LABEL_CONTAINER_DIGEST)
            .cloned()
            .unwrap_or_default(),
        started_at: 0,
        finished_at: 0,
        exit_code: 0,
        reason: String::new(),
        message: String::new(),
        user_image: c
            .image
            .as_ref()
            .map(|i| i.user_specified_image.clone())
            .unwrap_or_default(),
        image: c.image.map(|i| i.image).unwrap_or_default(),
        image_ref: c.image_ref,
        termination_message_file: None,
        user: None,
        termination_message_policy: c
            .annotations
            .get(ANNOTATION_TERMINATION_MESSAGE_POLICY)
            .cloned()
            .unwrap_or_default(),
        grace_seconds: c
            .annotations
            .get(ANNOTATION_TERMINATION_GRACE)
            .and_then(|g| g.parse().ok()),
        resources: c
            .annotations
            .get(ANNOTATION_RESOURCES)
            .cloned()
            .unwrap_or_default(),
    }
}

fn state_from_cri(state: i32) -> ContainerState {
    match cri::ContainerState::try_from(state) {
        Ok(cri::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

/// The sandbox (pause) image named in the runtime's configuration.
pub fn configured_sandbox_image(config: &serde_json::Value) -> Option<String> {
    config
        .get("sandboxImage")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string)
}

/// The cgroup driver the runtime's default runc runtime uses, when its configuration says.
pub fn configured_cgroup_driver(config: &serde_json::Value) -> Option<CgroupDriver> {
    let containerd = config.get("containerd")?;
    let default = containerd
        .get("defaultRuntimeName")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("runc");
    let systemd = containerd
        .get("runtimes")
        .and_then(|r| r.get(default))
        .and_then(|r| r.get("options"))
        .and_then(|o| o.get("SystemdCgroup"))
        .and_then(serde_json::Value::as_bool)
        .or_else(|| {
            config
                .get("systemdCgroup")
                .and_then(serde_json::Value::as_bool)
        })?;
    Some(if systemd {
        CgroupDriver::Systemd
    } else {
        CgroupDriver::Cgroupfs
    })
}

#[cfg(test)]
mod config_tests {
    use super::*;

    #[test]
    fn the_runtimes_cgroup_driver_and_sandbox_image_are_read_from_its_config() {
        let config = serde_json::json!({
            "sandboxImage": "registry.k8s.io/pause:3.9",
            "containerd": {
                "defaultRuntimeName": "runc",
                "runtimes": {"runc": {"options": {"SystemdCgroup": true}}}
            }
        });
        assert_eq!(
            configured_cgroup_driver(&config),
            Some(CgroupDriver::Systemd)
        );
        assert_eq!(
            configured_sandbox_image(&config).as_deref(),
            Some("registry.k8s.io/pause:3.9")
        );
        let legacy = serde_json::json!({"containerd": {}, "systemdCgroup": false});
        assert_eq!(
            configured_cgroup_driver(&legacy),
            Some(CgroupDriver::Cgroupfs)
        );
        assert_eq!(configured_cgroup_driver(&serde_json::json!({})), None);
    }
}

//! Dynamic resource allocation against a real control plane, with upstream's DRA test driver
//! as the node's kubelet plugin: a pod's claim, allocated by the scheduler from the slices the
//! driver published, is prepared by the driver through nodelet, its CDI device reaches the
//! container through the runtime, and the claim is unprepared when the pod goes. A driver that
//! serves only the older v1beta1 API is called through it.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::DeleteParams;

use nodelet::server::pod_resources::proto::GetPodResourcesRequest;

use crate::bed::{BUSYBOX, Node, eventually, read_container_logs};
use crate::control_plane::{ControlPlane, phase};

/// The test driver's name (its default).
const DRIVER: &str = "test-driver.cdi.k8s.io";
/// The name of the test driver that serves only the v1beta1 API (its default).
const BETA_DRIVER: &str = "v1beta1.test-driver.cdi.k8s.io";

/// A DRA test driver serving `node`'s kubelet plugin, its CDI specs in the test bed runtime's
/// CDI dir; stopped on drop.
struct Driver {
    child: std::process::Child,
}

impl Driver {
    /// Upstream's test driver, serving the API's v1.
    fn start(cp: &ControlPlane, node: &Node) -> Driver {
        Driver::program(cp, node, "dra-test-driver", DRIVER, &["kubelet-plugin"])
    }

    /// Upstream's test driver serving only the API's v1beta1 (kube/dra-v1beta1-driver).
    fn start_v1beta1(cp: &ControlPlane, node: &Node) -> Driver {
        Driver::program(cp, node, "dra-v1beta1-driver", BETA_DRIVER, &[])
    }

    /// `program` of the test binaries, serving driver `name`, with `args` first.
    fn program(cp: &ControlPlane, node: &Node, program: &str, name: &str, args: &[&str]) -> Driver {
        let bin = PathBuf::from(std::env::var("K8S_BIN").expect("K8S_BIN (make test sets it)"))
            .join(program);
        assert!(
            bin.is_file(),
            "no {program} at {}: hack/k8s/build.sh e2e builds it",
            bin.display()
        );
        let cdi = std::env::var("NODELET_TEST_CDI_DIR")
            .expect("NODELET_TEST_CDI_DIR (make test sets it)");
        let root = node.path("root");
        let log = std::fs::File::create(node.path(&format!("{program}.log"))).expect("driver log");
        // Where its DaemonSet would mount its socket directory.
        std::fs::create_dir_all(root.join("plugins").join(name)).expect("the driver's dir");
        let child = std::process::Command::new(bin)
            .args(args)
            .arg("--kubeconfig")
            .arg(&cp.kubeconfig)
            .args(["--node-name", &node.name, "--cdi-dir", &cdi])
            .arg("--plugin-registration-path")
            .arg(root.join("plugins_registry"))
            .arg("--datadir")
            .arg(root.join("plugins"))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start the DRA test driver");
        Driver { child }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // SIGTERM: the driver removes its sockets and CDI specs. (Not if it was waited for:
        // its PID may be another process's now.)
        if let Ok(None) = self.child.try_wait() {
            let _ = std::process::Command::new("kill")
                .arg(self.child.id().to_string())
                .status();
            let _ = self.child.wait();
        }
    }
}

/// The objects of upstream's inline-claim example: a DeviceClass of the driver's devices, a
/// claim template whose opaque config the driver turns into environment variables, and a pod
/// with a container that uses the claim and one that does not.
const OBJECTS: &str = r#"
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: example}
spec:
  selectors:
  - cel: {expression: 'device.driver == "test-driver.cdi.k8s.io"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: inline, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: my-device
        exactly: {deviceClassName: example}
      config:
      - opaque:
          driver: test-driver.cdi.k8s.io
          parameters: {a: b}
---
apiVersion: v1
kind: Pod
metadata: {name: dra, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - {name: resource, resourceClaimTemplateName: inline}
  containers:
  - name: with-resource
    image: IMAGE
    command: [sh, -c, "env; sleep 3600"]
    resources:
      claims: [{name: resource}]
  - name: without-resource
    image: IMAGE
    command: [sh, -c, "env; sleep 3600"]
"#;

/// A DeviceClass that serves an extended resource (DRAExtendedResource), and a pod asking for
/// it as for a device plugin's: the scheduler makes the claim.
const EXTENDED: &str = r#"
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: example-ext}
spec:
  extendedResourceName: example.com/dra-dev
  selectors:
  - cel: {expression: 'device.driver == "test-driver.cdi.k8s.io"'}
---
apiVersion: v1
kind: Pod
metadata: {name: dra-ext, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: ext
    image: IMAGE
    command: [sh, -c, "env; sleep 3600"]
    resources:
      limits: {example.com/dra-dev: "1"}
"#;

/// A claim on the v1beta1 driver's devices, with an opaque config it turns into an environment
/// variable.
const BETA: &str = r#"
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: example-beta}
spec:
  selectors:
  - cel: {expression: 'device.driver == "v1beta1.test-driver.cdi.k8s.io"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: beta, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: beta-device
        exactly: {deviceClassName: example-beta}
      config:
      - opaque:
          driver: v1beta1.test-driver.cdi.k8s.io
          parameters: {b: c}
---
apiVersion: v1
kind: Pod
metadata: {name: dra-beta, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  resourceClaims:
  - {name: resource, resourceClaimTemplateName: beta}
  containers:
  - name: beta
    image: IMAGE
    command: [sh, -c, "env; sleep 3600"]
    resources:
      claims: [{name: resource}]
"#;

/// Waits until `driver` has a ResourceSlice for `node`, or (`!present`) none.
async fn wait_slice(cp: &ControlPlane, node: &Node, driver: &str, present: bool) {
    let slices: Api<ResourceSlice> = Api::all(cp.admin.clone());
    let what = if present { "a" } else { "no" };
    eventually(
        &format!("{what} ResourceSlice of {driver} for the node"),
        Duration::from_secs(60),
        || async {
            let listed = slices.list(&Default::default()).await.ok()?;
            let found = (listed.items.iter()).any(|s| {
                s.spec.node_name.as_deref() == Some(&node.name) && s.spec.driver == driver
            });
            (found == present).then_some(())
        },
    )
    .await;
}

/// Applies `objects` (with the test image) and waits until their pod `default/pod` runs.
async fn run(cp: &ControlPlane, objects: &str, pod: &str) -> k8s_openapi::api::core::v1::Pod {
    let file = cp.dir.join(format!("{pod}.yaml"));
    std::fs::write(&file, objects.replace("IMAGE", BUSYBOX)).expect("write the objects");
    cp.kubectl_ok(&["apply", "-f", &file.display().to_string()])
        .await;
    cp.wait_pod("default", pod, "Running", |p| phase(p) == "Running")
        .await
}

/// The devices' health the API server shows for `container` of pod `default/pod`: each
/// device's resource name, health and message.
async fn device_health(
    cp: &ControlPlane,
    pod: &str,
    container: &str,
) -> Vec<(String, String, Option<String>)> {
    let Ok(pod) = cp.pods("default").get(pod).await else {
        return Vec::new();
    };
    let statuses = (pod.status.and_then(|s| s.container_statuses)).unwrap_or_default();
    let status = statuses.into_iter().find(|c| c.name == container);
    let all = status
        .and_then(|c| c.allocated_resources_status)
        .unwrap_or_default();
    (all.into_iter())
        .flat_map(|r| {
            let name = r.name;
            (r.resources.unwrap_or_default().into_iter())
                .map(move |h| (name.clone(), h.health.unwrap_or_default(), h.message))
        })
        .collect()
}

/// `name` as the test driver puts it in an environment variable's name.
fn env_name(name: &str) -> String {
    (name.chars())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// A pod's resource claim is allocated from the driver's slices, prepared by the driver
/// through nodelet before the sandbox, and its CDI device sets the environment of the
/// container that uses it (only); the claim is kept in the checkpoint and counted as in use, a
/// restarted nodelet gives it to the container again, and it is unprepared (its CDI spec
/// removed) once the pod is gone. A claim made for an extended resource reaches its container
/// too.
#[tokio::test]
async fn a_pods_resource_claim_is_prepared_by_its_dra_driver_and_reaches_its_container() {
    let cp = ControlPlane::start("dra", true).await;
    let node = crate::cluster::join(&cp, "dra", &[]).await;
    let driver = Driver::start(&cp, &node);
    wait_slice(&cp, &node, DRIVER, true).await;
    let pod = run(&cp, OBJECTS, "dra").await;
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node.name.as_str())
    );
    let claim = (pod.status.as_ref())
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.resource_claim_name.clone())
        .expect("the pod's claim in its status");
    let log = node
        .wait_log_of("default", "dra", "with-resource", "user_a=b")
        .await;
    assert!(
        log.contains(&format!("claim_{}_my_device=true", env_name(&claim))),
        "{log}"
    );
    let other = node
        .wait_log_of("default", "dra", "without-resource", "HOME=")
        .await;
    assert!(!other.contains("user_a"), "{other}");
    // The container's status shows its device, whose health the driver has not reported.
    let unknown = vec![("claim:resource".to_string(), "Unknown".to_string(), None)];
    eventually(
        "the device's health in the status",
        Duration::from_secs(30),
        || async { (device_health(&cp, "dra", "with-resource").await == unknown).then_some(()) },
    )
    .await;
    assert!(
        device_health(&cp, "dra", "without-resource")
            .await
            .is_empty()
    );
    let checkpoint = node.path("root/dra_manager_state");
    let saved = std::fs::read_to_string(&checkpoint).expect("the DRA checkpoint");
    let uid = pod.metadata.uid.clone().expect("the pod's UID");
    assert!(saved.contains(&claim) && saved.contains(&uid), "{saved}");
    let answer = node
        .pod_resources()
        .await
        .get(GetPodResourcesRequest {
            pod_name: "dra".into(),
            pod_namespace: "default".into(),
        })
        .await
        .expect("the pod's resources")
        .into_inner();
    let containers = answer.pod_resources.expect("the pod").containers;
    let used = |name: &str| {
        let c = containers
            .iter()
            .find(|c| c.name == name)
            .expect("the container");
        c.dynamic_resources.clone()
    };
    let with = used("with-resource");
    assert_eq!(with.len(), 1, "{with:?}");
    assert_eq!(with[0].claim_name, claim);
    assert_eq!(with[0].claim_resources[0].driver_name, DRIVER);
    assert_eq!(with[0].claim_resources[0].pool_name, node.name);
    assert!(used("without-resource").is_empty());
    let metrics = nodelet::metrics::get().render();
    assert!(
        metrics.contains(&format!(
            "dra_resource_claims_in_use{{driver_name=\"{DRIVER}\"}} 1"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "dra_operations_duration_seconds_count{operation_name=\"PrepareResources\",is_error=\"false\"}"
        ),
        "{metrics}"
    );
    let claim_uid = claim_uid(&saved, &claim);
    assert!(!claim_uid.is_empty(), "{saved}");
    let cdi = PathBuf::from(std::env::var("NODELET_TEST_CDI_DIR").unwrap_or_default());
    let specs = || {
        let specs = std::fs::read_dir(&cdi).into_iter().flatten().flatten();
        specs
            .filter(|e| e.file_name().to_string_lossy().contains(&claim_uid))
            .count()
    };
    assert!(specs() > 0, "no CDI spec of the claim in {}", cdi.display());
    // An extended resource served by DRA: no device plugin is asked, the scheduler's claim is
    // prepared and the container gets its device.
    let ext = run(&cp, EXTENDED, "dra-ext").await;
    let ext_claim = (ext.status.as_ref())
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|c| c.resource_claim_name.clone())
        .expect("the pod's extended resource claim in its status");
    let log = node.wait_log_of("default", "dra-ext", "ext", "HOME=").await;
    let wanted = format!("claim_{}_", env_name(&ext_claim));
    assert!(log.contains(&wanted), "no {wanted} in {log}");
    cp.pods("default")
        .delete("dra-ext", &DeleteParams::default())
        .await
        .expect("delete the pod");
    cp.wait_pod_gone("default", "dra-ext").await;
    // A driver built before the API's v1 is called through its v1beta1.
    let mut beta_driver = Driver::start_v1beta1(&cp, &node);
    wait_slice(&cp, &node, BETA_DRIVER, true).await;
    run(&cp, BETA, "dra-beta").await;
    node.wait_log_of("default", "dra-beta", "beta", "user_b=c")
        .await;
    // The driver's health stream says its devices went unhealthy: the container's status
    // shows it, with the driver's message.
    let _ = std::process::Command::new("kill")
        .args(["-USR1", &beta_driver.child.id().to_string()])
        .status();
    let unhealthy = vec![(
        "claim:resource".to_string(),
        "Unhealthy".to_string(),
        Some("marked unhealthy by the test".to_string()),
    )];
    eventually(
        "the unhealthy device in the status",
        Duration::from_secs(30),
        || async { (device_health(&cp, "dra-beta", "beta").await == unhealthy).then_some(()) },
    )
    .await;
    let metrics = nodelet::metrics::get().render();
    let beta_prepare = format!(
        "dra_grpc_operations_duration_seconds_count{{driver_name=\"{BETA_DRIVER}\",method_name=\"/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources\",grpc_status_code=\"OK\"}}"
    );
    assert!(
        metrics.contains(&beta_prepare),
        "no {beta_prepare} in {metrics}"
    );
    cp.pods("default")
        .delete("dra-beta", &DeleteParams::default())
        .await
        .expect("delete the pod");
    cp.wait_pod_gone("default", "dra-beta").await;
    eventually("the claim unprepared", Duration::from_secs(30), || async {
        (nodelet::metrics::get().render())
            .contains("dra_resource_claims_in_use{driver_name=\"<any>\"} 1")
            .then_some(())
    })
    .await;
    // A driver that dies leaves its sockets behind: its slices go once its plugin has taken
    // no connections for 30 s.
    beta_driver.child.kill().expect("kill the v1beta1 driver");
    let _ = beta_driver.child.wait();
    wait_slice(&cp, &node, BETA_DRIVER, false).await;
    drop(beta_driver);
    // A restarted nodelet has the claim back from its checkpoint: the container, stopped
    // meanwhile, starts again with its device.
    let mut node = node;
    node.stop_agent().await;
    let running = node
        .runtime
        .list_containers(Some(("io.kubernetes.pod.uid", &uid)))
        .await
        .expect("the pod's containers");
    let with = (running.iter())
        .find(|c| c.name == "with-resource")
        .expect("the container with the claim");
    node.runtime
        .stop_container(&with.id, 0)
        .await
        .expect("stop the container");
    let kubeconfig = cp.node_kubeconfig(&node.name).display().to_string();
    node.restart(&["--kubeconfig", &kubeconfig]).await;
    let logs = node.pod_logs();
    eventually(
        "the restarted container with its device",
        Duration::from_secs(60),
        || async {
            let log = read_container_logs(&logs, "default_dra_", "with-resource");
            (log.matches("user_a=b").count() >= 2).then_some(())
        },
    )
    .await;
    cp.pods("default")
        .delete("dra", &DeleteParams::default())
        .await
        .expect("delete the pod");
    cp.wait_pod_gone("default", "dra").await;
    eventually("the claim unprepared", Duration::from_secs(30), || async {
        let saved = std::fs::read_to_string(&checkpoint).ok()?;
        (!saved.contains(&claim) && specs() == 0).then_some(())
    })
    .await;
    assert!(
        nodelet::metrics::get()
            .render()
            .contains("dra_resource_claims_in_use{driver_name=\"<any>\"} 0")
    );
    drop(driver);
    node.finish().await;
}

/// The UID of claim `name` in the checkpoint's text.
fn claim_uid(checkpoint: &str, name: &str) -> String {
    let file: serde_json::Value = serde_json::from_str(checkpoint).expect("the checkpoint parses");
    let data: serde_json::Value =
        serde_json::from_str(file["Data"].as_str().unwrap_or_default()).expect("its data parses");
    (data["ClaimInfoStateList"].as_array().into_iter().flatten())
        .find(|c| c["ClaimName"] == name)
        .and_then(|c| c["ClaimUID"].as_str())
        .unwrap_or_default()
        .to_string()
}

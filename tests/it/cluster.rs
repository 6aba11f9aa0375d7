//! Cluster mode against a real control plane: registration, lease, API pods, status, graceful
//! deletion, mirror pods, and an API server that goes away.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node as ApiNode, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

use crate::bed::{BUSYBOX, FOREVER, Node, OtherRuntime, eventually, pod_yaml};
use crate::control_plane::{ControlPlane, client_for, condition, phase};
use nodelet::pod::annotation;

/// Starts nodelet as node `t-<test>` joined to `cp`, with quick status updates and a short
/// lease (renewed every second), plus `extra` flags.
pub async fn join(cp: &ControlPlane, test: &str, extra: &[&str]) -> Node {
    join_on(&crate::bed::endpoint(), cp, test, extra).await
}

/// [`join`], serving the node API on a port of its own (returned) to the API server, which dials
/// the node's InternalIP (loopback here) with its kubelet-client certificate, signed by the CA the
/// node trusts.
pub async fn join_serving(cp: &ControlPlane, test: &str, extra: &[&str]) -> (Node, String) {
    let port = crate::bed::free_port().to_string();
    let ca = cp.dir.join("pki/ca.crt").display().to_string();
    let mut args = vec![
        "--port",
        &port,
        "--client-ca-file",
        &ca,
        "--node-ip",
        "127.0.0.1",
    ];
    args.extend_from_slice(extra);
    let node = join(cp, test, &args).await;
    (node, port)
}

/// [`join`] on the runtime at `endpoint`.
async fn join_on(
    endpoint: &std::path::Path,
    cp: &ControlPlane,
    test: &str,
    extra: &[&str],
) -> Node {
    let kubeconfig = cp.node_kubeconfig(&format!("t-{test}"));
    let config = cp.dir.join(format!("{test}-kubelet.yaml"));
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
nodeLeaseDurationSeconds: 4
",
    )
    .expect("write the kubelet config");
    let mut args = vec![
        "--kubeconfig".to_string(),
        kubeconfig.display().to_string(),
        "--config".to_string(),
        config.display().to_string(),
        "--node-status-update-frequency=1s".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Node::start_on(endpoint, test, &args).await
}

/// A pod bound to `node`, from YAML with the node name filled in.
fn bound_pod(yaml: &str, node: &str) -> Pod {
    let mut pod: Pod = serde_yaml_ng::from_str(yaml).expect("the test pod parses");
    pod.spec.as_mut().expect("a spec").node_name = Some(node.to_string());
    pod
}

async fn lease_renewed(leases: &Api<Lease>, node: &str) -> Option<k8s_openapi::jiff::Timestamp> {
    let lease = leases.get_opt(node).await.ok().flatten()?;
    lease.spec?.renew_time.map(|t| t.0)
}

#[tokio::test]
async fn a_node_registers_renews_its_lease_and_comes_back_when_deleted() {
    let cp = ControlPlane::start("register", false).await;
    let node = join(
        &cp,
        "register",
        &[
            "--node-labels=team=blue",
            "--register-with-taints=dedicated=test:NoSchedule",
        ],
    )
    .await;
    let nodes = cp.nodes();
    let ready = eventually(
        "the node registers Ready",
        Duration::from_secs(60),
        || async {
            let n = nodes.get_opt(&node.name).await.ok().flatten()?;
            let ready = n
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then_some(n)
        },
    )
    .await;

    let json = cp
        .kubectl_ok(&["get", "node", &node.name, "-o", "json"])
        .await;
    let got: serde_json::Value = serde_json::from_str(&json).expect("node json");
    let labels = &got["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], node.name.as_str());
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert!(labels["kubernetes.io/arch"].is_string());
    assert_eq!(labels["team"], "blue");
    let taint = &got["spec"]["taints"][0];
    assert_eq!(
        (&taint["key"], &taint["value"], &taint["effect"]),
        (
            &serde_json::json!("dedicated"),
            &serde_json::json!("test"),
            &serde_json::json!("NoSchedule")
        )
    );
    let status = &got["status"];
    for resource in ["cpu", "memory", "ephemeral-storage", "pods"] {
        assert!(
            status["capacity"][resource].is_string(),
            "capacity {resource}: {status}"
        );
        assert!(
            status["allocatable"][resource].is_string(),
            "allocatable {resource}"
        );
    }
    assert_eq!(status["capacity"]["pods"], "110");
    // The runtime handlers as the runtime's status names them: containerd 2.x with runc 1.5
    // supports both features (the test bed's second handler too); 1.6 names none.
    let handlers = status["runtimeHandlers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if crate::bed::containerd2() {
        let default = handlers
            .iter()
            .find(|h| h["name"] == "")
            .unwrap_or_else(|| panic!("the default handler in {handlers:?}"));
        assert_eq!(default["features"]["userNamespaces"], true);
        assert_eq!(default["features"]["recursiveReadOnlyMounts"], true);
    } else {
        assert!(handlers.is_empty(), "{handlers:?}");
    }
    let info = &status["nodeInfo"];
    assert!(
        info["containerRuntimeVersion"]
            .as_str()
            .unwrap_or("")
            .starts_with("containerd://")
    );
    assert!(
        info["kubeletVersion"]
            .as_str()
            .unwrap_or("")
            .starts_with("v1.")
    );
    for field in ["bootID", "kernelVersion", "osImage", "machineID"] {
        assert!(
            !info[field].as_str().unwrap_or("").is_empty(),
            "nodeInfo.{field}: {info}"
        );
    }
    assert_eq!(info["operatingSystem"], "linux");
    assert!(status["daemonEndpoints"]["kubeletEndpoint"]["Port"].is_number());
    let addresses = status["addresses"].as_array().expect("addresses");
    assert!(
        addresses
            .iter()
            .any(|a| a["type"] == "Hostname" && a["address"] == node.name.as_str())
    );
    assert!(addresses.iter().any(|a| a["type"] == "InternalIP"));
    let conditions = status["conditions"].as_array().expect("conditions");
    for (kind, state, reason) in [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID"),
        ("Ready", "True", "KubeletReady"),
    ] {
        let c = conditions
            .iter()
            .find(|c| c["type"] == kind)
            .unwrap_or_else(|| panic!("condition {kind}"));
        assert_eq!(
            (c["status"].as_str(), c["reason"].as_str()),
            (Some(state), Some(reason))
        );
    }

    // The lease is held by the node, owned by it, and renewed.
    let leases: Api<Lease> = Api::namespaced(cp.admin.clone(), "kube-node-lease");
    let first = eventually("the lease exists", Duration::from_secs(30), || {
        lease_renewed(&leases, &node.name)
    })
    .await;
    eventually("the lease is renewed", Duration::from_secs(30), || async {
        lease_renewed(&leases, &node.name)
            .await
            .filter(|t| *t > first)
    })
    .await;
    let uid = ready.metadata.uid.clone().expect("node uid");
    let lease = leases.get(&node.name).await.expect("the lease");
    assert_eq!(
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref()),
        Some(node.name.as_str())
    );
    assert_eq!(
        lease.spec.as_ref().and_then(|s| s.lease_duration_seconds),
        Some(4)
    );
    let owner = &lease.metadata.owner_references.expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Node", uid.as_str())
    );

    // NodeRestriction: the node's identity may not touch another node or make plain pods.
    let other = format!("{}-other", node.name);
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value::<ApiNode>(serde_json::json!({"metadata": {"name": other}}))
                .expect("a node"),
        )
        .await
        .expect("the admin creates another node");
    let as_node = client_for(&cp.node_kubeconfig(&node.name)).await;
    let nodes_as_node: Api<ApiNode> = Api::all(as_node.clone());
    let patch = serde_json::json!({"metadata": {"labels": {"stolen": "yes"}}});
    match nodes_as_node
        .patch(&other, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("patching another node must be forbidden, got {other:?}"),
    }
    let plain = bound_pod(&pod_yaml("plain", &[("c", FOREVER)], ""), &node.name);
    match Api::<Pod>::namespaced(as_node, "default")
        .create(&PostParams::default(), &plain)
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("a node creating a plain pod must be forbidden, got {other:?}"),
    }

    // A deleted Node is registered again.
    nodes
        .delete(&node.name, &DeleteParams::default())
        .await
        .expect("delete the node");
    eventually(
        "the node is registered again",
        Duration::from_secs(60),
        || async {
            let n = nodes.get_opt(&node.name).await.ok().flatten()?;
            (n.metadata.uid.as_deref() != Some(uid.as_str())).then_some(())
        },
    )
    .await;
    node.finish().await;
}

#[tokio::test]
async fn api_pods_run_report_their_status_and_are_deleted_gracefully() {
    let cp = ControlPlane::start("apipods", true).await;
    let node = join(&cp, "apipods", &[]).await;
    let marks = node.path("marks");
    let pods = cp.pods("default");
    let graceful = format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: graceful
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 30
  volumes:
  - name: marks
    hostPath: {{path: {marks}, type: DirectoryOrCreate}}
  containers:
  - name: c
    image: {BUSYBOX}
    command:
    - sh
    - -c
    - trap 'echo > /marks/term; sleep 2; echo > /marks/done; exit 0' TERM; while true; do sleep 1; done
    lifecycle:
      preStop:
        exec: {{command: [sh, -c, "echo > /marks/prestop"]}}
    volumeMounts: [{{name: marks, mountPath: /marks}}]
"#,
        marks = marks.display()
    );
    pods.create(&PostParams::default(), &bound_pod(&graceful, &node.name))
        .await
        .expect("create the pod");
    let running = cp
        .wait_pod("default", "graceful", "Running and Ready", |p| {
            phase(p) == "Running" && condition(p, "Ready")
        })
        .await;
    let status = running.status.expect("status");
    assert!(status.pod_ip.is_some_and(|ip| !ip.is_empty()));
    assert!(status.host_ip.is_some_and(|ip| !ip.is_empty()));
    assert!(status.start_time.is_some());
    let c = &status.container_statuses.expect("container statuses")[0];
    assert!(
        c.ready
            && c.container_id
                .as_deref()
                .unwrap_or("")
                .starts_with("containerd://")
    );
    let wide = cp
        .kubectl_ok(&["get", "pod", "graceful", "-o", "wide"])
        .await;
    assert!(
        wide.contains("Running") && wide.contains(&node.name),
        "{wide}"
    );
    // The node's own CLI shows the API pod beside the static ones, with its source.
    node.write_manifest("local.yaml", &pod_yaml("local", &[("c", FOREVER)], ""));
    node.wait_running("local", 1).await;
    let out = node
        .cli(&["get", "pods", "-A", "-o", "wide"])
        .output()
        .await
        .expect("the CLI runs");
    let table = String::from_utf8_lossy(&out.stdout);
    let source_of = |pod: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(pod))
            .and_then(|l| l.split_whitespace().last())
            .map(String::from)
    };
    assert_eq!(source_of("graceful").as_deref(), Some("api"), "{table}");
    assert_eq!(
        source_of(&node.pod_name("local")).as_deref(),
        Some("file"),
        "{table}"
    );

    // A pod that does not fit is refused, and the API says so.
    let greedy = pod_yaml(
        "greedy",
        &[("c", FOREVER)],
        "  automountServiceAccountToken: false\n",
    )
    .replace(
        "    command:",
        "    resources: {requests: {cpu: \"1000\"}}\n    command:",
    );
    pods.create(&PostParams::default(), &bound_pod(&greedy, &node.name))
        .await
        .expect("create the greedy pod");
    let refused = cp
        .wait_pod("default", "greedy", "Failed", |p| phase(p) == "Failed")
        .await;
    assert_eq!(
        refused.status.and_then(|s| s.reason).as_deref(),
        Some("OutOfcpu")
    );

    // A pod whose Secret is missing waits, with upstream's FailedMount wording.
    let unmounted = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: unmounted}}
spec:
  automountServiceAccountToken: false
  containers:
  - {{name: c, image: {BUSYBOX}, command: [sleep, "600"], volumeMounts: [{{name: s, mountPath: /s}}]}}
  volumes:
  - {{name: s, secret: {{secretName: missing}}}}
"#
    );
    pods.create(&PostParams::default(), &bound_pod(&unmounted, &node.name))
        .await
        .expect("create the pod");

    // The node's events reach the API server.
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(cp.admin.clone(), "default");
    eventually(
        "the pods' events in the API",
        Duration::from_secs(30),
        || async {
            let list = events.list(&Default::default()).await.ok()?;
            let has = |pod: &str, reason: &str| {
                list.items.iter().any(|e| {
                    e.involved_object.name.as_deref() == Some(pod)
                        && e.reason.as_deref() == Some(reason)
                        && e.source.as_ref().and_then(|s| s.host.as_deref())
                            == Some(node.name.as_str())
                })
            };
            let failed_mount = list.items.iter().any(|e| {
                e.involved_object.name.as_deref() == Some("unmounted")
                    && e.reason.as_deref() == Some("FailedMount")
                    && e.message.as_deref()
                        == Some(r#"MountVolume.SetUp failed for volume "s" : secret "missing" not found"#)
            });
            (has("graceful", "Started")
                && has("graceful", "Created")
                && has("greedy", "OutOfcpu")
                && failed_mount)
                .then_some(())
        },
    )
    .await;

    // Deletion: preStop, then SIGTERM with the grace period to finish, then the final status
    // (Succeeded: the container exited 0), then gone from the API.
    let phases = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = phases.clone();
    let watched = cp.pods("default");
    let watch = tokio::spawn(async move {
        use futures_util::StreamExt as _;
        let config = kube::runtime::watcher::Config::default().fields("metadata.name=graceful");
        let mut events = kube::runtime::watcher(watched, config).boxed();
        while let Some(Ok(event)) = events.next().await {
            if let kube::runtime::watcher::Event::Apply(p) = event {
                seen.lock().unwrap().push(phase(&p).to_string());
            }
        }
    });
    cp.kubectl_ok(&["delete", "pod", "graceful", "--wait=false"])
        .await;
    cp.wait_pod_gone("default", "graceful").await;
    watch.abort();
    let phases = phases.lock().unwrap().clone();
    assert_eq!(
        phases.last().map(String::as_str),
        Some("Succeeded"),
        "{phases:?}"
    );
    for mark in ["prestop", "term", "done"] {
        assert!(
            marks.join(mark).exists(),
            "the container never wrote /marks/{mark}"
        );
    }
    cp.kubectl_ok(&["delete", "pod", "greedy", "unmounted", "--wait=false"])
        .await;
    cp.wait_pod_gone("default", "greedy").await;
    cp.wait_pod_gone("default", "unmounted").await;

    // A delete may shorten the grace period: its preStop hook and the container's stop get
    // what the delete asked for, not the ten minutes of the spec.
    let shortened = format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: shortened
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 600
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, "trap '' TERM; while true; do sleep 1; done"]
    lifecycle:
      preStop:
        sleep: {{seconds: 600}}
"#
    );
    pods.create(&PostParams::default(), &bound_pod(&shortened, &node.name))
        .await
        .expect("create the pod");
    cp.wait_pod("default", "shortened", "Running", |p| phase(p) == "Running")
        .await;
    cp.kubectl_ok(&[
        "delete",
        "pod",
        "shortened",
        "--grace-period=3",
        "--wait=false",
    ])
    .await;
    cp.wait_pod_gone("default", "shortened").await;
    node.finish().await;
}

#[tokio::test]
async fn static_pods_are_mirrored_in_the_api() {
    let cp = ControlPlane::start("mirror", false).await;
    let node = join(&cp, "mirror", &[]).await;
    node.write_manifest("web.yaml", &pod_yaml("web", &[("c", FOREVER)], ""));
    let name = node.pod_name("web");
    let mirror = cp
        .wait_pod("default", &name, "mirrored and Running", |p| {
            phase(p) == "Running"
        })
        .await;
    let hash = annotation(&mirror, "kubernetes.io/config.mirror")
        .expect("the mirror annotation")
        .to_string();
    assert_eq!(
        annotation(&mirror, "kubernetes.io/config.hash"),
        Some(hash.as_str())
    );
    let owner = &mirror.metadata.owner_references.clone().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", node.name.as_str())
    );

    // Deleted through the API: it comes back, and the static pod keeps running.
    let uid = mirror.metadata.uid.clone().expect("uid");
    cp.kubectl_ok(&["delete", "pod", &name, "--wait=false"])
        .await;
    cp.wait_pod("default", &name, "mirrored again", |p| {
        p.metadata.uid.as_deref() != Some(uid.as_str()) && p.metadata.deletion_timestamp.is_none()
    })
    .await;
    let (sandbox, _) = node.wait_running("web", 1).await;

    // Edited: the mirror follows the new version.
    node.write_manifest(
        "web.yaml",
        &pod_yaml("web", &[("c", &format!("echo v2; {FOREVER}"))], ""),
    );
    cp.wait_pod("default", &name, "mirroring the edit", |p| {
        annotation(p, "kubernetes.io/config.mirror").is_some_and(|h| h != hash)
            && phase(p) == "Running"
    })
    .await;
    node.wait_gone(&sandbox.uid, Duration::from_secs(60)).await;

    // Removed with the manifest.
    node.remove_manifest("web.yaml");
    cp.wait_pod_gone("default", &name).await;
    node.finish().await;
}

#[tokio::test]
async fn static_pods_keep_running_while_the_api_server_is_away() {
    let cp = ControlPlane::start("outage", false).await;
    let node = join(&cp, "outage", &[]).await;
    node.write_manifest("a.yaml", &pod_yaml("a", &[("c", FOREVER)], ""));
    let (before, _) = node.wait_running("a", 1).await;
    cp.wait_pod("default", &node.pod_name("a"), "mirrored", |p| {
        phase(p) == "Running"
    })
    .await;

    // History the node's watches have not seen yet is compacted away while the API server is
    // down: when it returns, their resource versions are too old (410 Gone) and they relist.
    cp.kubectl_ok(&["create", "configmap", "churn", "--from-literal=a=1"])
        .await;
    cp.stop("kube-apiserver").await;
    let outage = tokio::time::Instant::now();
    cp.compact_etcd().await;
    node.write_manifest("b.yaml", &pod_yaml("b", &[("c", FOREVER)], ""));
    node.wait_running("b", 1).await;
    // The outage lasts 30 s, long enough for every retry to back off to its longest; all the
    // while both static pods keep running, untouched.
    let mut every = tokio::time::interval(Duration::from_secs(2));
    while outage.elapsed() < Duration::from_secs(30) {
        every.tick().await;
        let (still, _) = node.wait_running("a", 1).await;
        assert_eq!(still.id, before.id, "pod a was restarted during the outage");
        node.wait_running("b", 1).await;
    }

    cp.start_again("kube-apiserver").await;
    let leases: Api<Lease> = Api::namespaced(cp.admin.clone(), "kube-node-lease");
    let back = k8s_openapi::jiff::Timestamp::now();
    eventually(
        "the lease is renewed after the outage",
        Duration::from_secs(60),
        || async {
            lease_renewed(&leases, &node.name)
                .await
                .filter(|t| *t > back)
        },
    )
    .await;
    cp.wait_pod(
        "default",
        &node.pod_name("b"),
        "mirrored after the outage",
        |p| phase(p) == "Running",
    )
    .await;
    eventually(
        "the pod watch relisted after 410 Gone",
        Duration::from_secs(60),
        || async {
            crate::bed::logs()
                .contains("too old resource version")
                .then_some(())
        },
    )
    .await;
    let (after, containers) = node.wait_running("a", 1).await;
    assert_eq!(after.id, before.id, "pod a was restarted by the relist");
    assert_eq!(containers[0].attempt, 0, "pod a's container was restarted");
    node.finish().await;
}

/// The kubectl the control plane was built with (a static binary, mounted into test pods).
fn kubectl_binary(cp: &ControlPlane) -> String {
    let env = std::fs::read_to_string(cp.dir.join("env")).expect("the cluster env");
    let bin = env
        .lines()
        .find_map(|l| l.strip_prefix("BIN="))
        .expect("BIN in the cluster env");
    format!("{bin}/kubectl")
}

#[tokio::test]
async fn a_deployment_runs_through_the_scheduler_with_its_token_configmap_secret_and_service_links()
{
    let cp = ControlPlane::start("deploy", true).await;
    let node = join(&cp, "deploy", &[]).await;
    let env = std::fs::read_to_string(cp.dir.join("env")).expect("the cluster env");
    let server = env
        .lines()
        .find_map(|l| l.strip_prefix("SERVER="))
        .expect("SERVER in the cluster env");
    let config = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {greeting: hello}
---
apiVersion: v1
kind: Secret
metadata: {name: creds}
stringData: {password: s3cret}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {selector: {app: web}, ports: [{name: http, port: 80}]}
"#;
    let file = cp.dir.join("deploy-objects.yaml");
    std::fs::write(&file, config).expect("write the objects");
    cp.kubectl_ok(&["apply", "-f", &file.display().to_string()])
        .await;
    // Every replica asks the API server who it is with its projected token and CA, through a
    // kubectl mounted from the host, and prints its settings.
    let deployment = format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      hostNetwork: true
      nodeSelector: {{kubernetes.io/hostname: {node}}}
      terminationGracePeriodSeconds: 5
      volumes:
      - name: kubectl
        hostPath: {{path: {kubectl}, type: File}}
      - name: settings
        configMap: {{name: settings}}
      containers:
      - name: c
        image: {BUSYBOX}
        env:
        - {{name: PASSWORD, valueFrom: {{secretKeyRef: {{name: creds, key: password}}}}}}
        volumeMounts:
        - {{name: kubectl, mountPath: /kubectl}}
        - {{name: settings, mountPath: /settings}}
        command:
        - sh
        - -c
        - |
          sa=/var/run/secrets/kubernetes.io/serviceaccount
          /kubectl --server={server} --token="$(cat $sa/token)" --certificate-authority=$sa/ca.crt auth whoami -o jsonpath='whoami={{.status.userInfo.username}}{{"\n"}}'
          echo "password=$PASSWORD"
          echo "links=$KUBERNETES_SERVICE_PORT,$WEB_SERVICE_PORT_HTTP,$WEB_PORT_80_TCP_PROTO"
          trap 'exit 0' TERM
          while true; do echo "greeting=$(cat /settings/greeting)"; sleep 1; done
"#,
        node = node.name,
        kubectl = kubectl_binary(&cp),
    );
    let file = cp.dir.join("deploy.yaml");
    std::fs::write(&file, deployment).expect("write the deployment");
    cp.kubectl_ok(&["apply", "-f", &file.display().to_string()])
        .await;

    let pods = cp.pods("default");
    let running = eventually(
        "three replicas Running and Ready on the node",
        Duration::from_secs(120),
        || async {
            let list = pods
                .list(&kube::api::ListParams::default().labels("app=web"))
                .await
                .ok()?;
            let ready: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| phase(p) == "Running" && condition(p, "Ready"))
                .collect();
            (ready.len() == 3).then_some(ready)
        },
    )
    .await;
    for pod in &running {
        let status = pod.status.as_ref().expect("status");
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(node.name.as_str())
        );
        assert!(status.host_ip.is_some() && status.pod_ip.is_some() && status.start_time.is_some());
    }
    let wide = cp
        .kubectl_ok(&["get", "pods", "-l", "app=web", "-o", "wide"])
        .await;
    assert_eq!(wide.matches("Running").count(), 3, "{wide}");

    let name = running[0].metadata.name.clone().expect("a name");
    let log = node
        .wait_log_of("default", &name, "c", "greeting=hello")
        .await;
    assert!(
        log.contains("whoami=system:serviceaccount:default:default"),
        "the token did not authenticate the pod: {log}"
    );
    assert!(log.contains("password=s3cret"), "{log}");
    assert!(
        log.contains("links=443,80,tcp"),
        "no service links for the API server and the namespace's Service: {log}"
    );

    // A ConfigMap update reaches the running pods' volumes.
    cp.kubectl_ok(&[
        "patch",
        "configmap",
        "settings",
        "--type=merge",
        "-p",
        r#"{"data":{"greeting":"bonjour"}}"#,
    ])
    .await;
    node.wait_log_of("default", &name, "c", "greeting=bonjour")
        .await;

    cp.kubectl_ok(&["delete", "deployment", "web", "--wait=false"])
        .await;
    for pod in &running {
        let name = pod.metadata.name.clone().expect("a name");
        cp.wait_pod_gone("default", &name).await;
    }
    node.finish().await;
}

#[tokio::test]
async fn kubectl_logs_exec_and_port_forward_reach_pods_through_the_api_server() {
    let cp = ControlPlane::start("proxy", true).await;
    let read_only = crate::bed::free_port();
    let (node, _) = join_serving(&cp, "proxy", &["--read-only-port", &read_only.to_string()]).await;
    let web = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: web}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 5
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, "echo started-web; mkdir /w; echo page-ok > /w/index.html; exec httpd -f -p 8080 -h /w"]
"#
    );
    cp.pods("default")
        .create(&PostParams::default(), &bound_pod(&web, &node.name))
        .await
        .expect("create the pod");
    cp.wait_pod("default", "web", "Running and Ready", |p| {
        phase(p) == "Running" && condition(p, "Ready")
    })
    .await;

    let logs = cp.kubectl_ok(&["logs", "web"]).await;
    assert!(logs.contains("started-web"), "kubectl logs: {logs}");
    let out = cp
        .kubectl_ok(&["exec", "web", "--", "sh", "-c", "echo exec-$((40 + 2))"])
        .await;
    assert_eq!(out.trim(), "exec-42");

    // The node's metrics: its startup steps, timed once it registered and was Ready, the pod
    // statuses it pushed, the pod's startup as the watch showed it (the first on the pod
    // network), and the requests its authenticated server served for the API server.
    let metrics = eventually(
        "the node startup metrics",
        Duration::from_secs(30),
        || async {
            let (_, text) = crate::healthz::get(read_only, "/metrics").await?;
            let set = |name: &str| crate::bed::sample(&text, name).is_some_and(|v| v > 0.0);
            [
                "kubelet_node_startup_pre_registration_duration_seconds",
                "kubelet_node_startup_registration_duration_seconds",
                "kubelet_node_startup_post_registration_duration_seconds",
                "kubelet_node_startup_duration_seconds",
                "kubelet_pod_status_sync_duration_seconds_count",
                "kubelet_pod_start_total_duration_seconds_count",
                "kubelet_pod_start_sli_duration_seconds_count",
                "kubelet_first_network_pod_start_sli_duration_seconds",
            ]
            .iter()
            .all(|name| set(name))
            .then_some(text)
        },
    )
    .await;
    for series in [
        "kubelet_pod_start_total_duration_seconds_count 1\n",
        "kubelet_pod_start_sli_duration_seconds_count 1\n",
        "kubelet_http_requests_total{method=\"GET\",path=\"containerLogs\",server_type=\"readwrite\",long_running=\"false\"}",
        "path=\"exec\",server_type=\"readwrite\",long_running=\"true\"}",
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }

    // exec -it: a terminal on both ends (script gives kubectl one).
    let kubectl = kubectl_binary(&cp);
    let mut tty = tokio::process::Command::new("script")
        .args(["-qec"])
        .arg(format!("{kubectl} exec -it web -- sh"))
        .arg("/dev/null")
        .env("KUBECONFIG", &cp.kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("script runs");
    {
        use tokio::io::AsyncWriteExt as _;
        let mut stdin = tty.stdin.take().expect("stdin");
        stdin
            .write_all(b"tty && echo tty-$((6 * 7))\nexit\n")
            .await
            .expect("type into the terminal");
    }
    let out = tty.wait_with_output().await.expect("kubectl exec -it ends");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("/dev/pts/") && text.contains("tty-42"),
        "exec -it: {text}"
    );

    // port-forward: a local port reaches the pod's port 8080.
    let local = crate::bed::free_port();
    let mut forward = tokio::process::Command::new(&kubectl)
        .env("KUBECONFIG", &cp.kubeconfig)
        .args(["port-forward", "pod/web", &format!("{local}:8080")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kubectl port-forward runs");
    let page = eventually(
        "the page through port-forward",
        Duration::from_secs(30),
        || async {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", local))
                .await
                .ok()?;
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            stream
                .write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
                .await
                .ok()?;
            let mut body = String::new();
            stream.read_to_string(&mut body).await.ok()?;
            body.contains("page-ok").then_some(body)
        },
    )
    .await;
    assert!(page.contains("200"), "{page}");
    let _ = forward.kill().await;

    // kubectl debug --target: an ephemeral container in the target's process namespace.
    cp.kubectl_ok(&[
        "debug",
        "web",
        &format!("--image={BUSYBOX}"),
        "--image-pull-policy=IfNotPresent",
        "--target=c",
        "--container=dbg",
        "--",
        "ps",
    ])
    .await;
    let ps = eventually(
        "the debug container's ps",
        Duration::from_secs(60),
        || async {
            let out = cp.kubectl(&["logs", "web", "-c", "dbg"]).await;
            let out = String::from_utf8_lossy(&out.stdout).into_owned();
            out.contains("httpd -f -p 8080").then_some(out)
        },
    )
    .await;
    assert!(ps.contains("ps"), "{ps}");
    node.finish().await;
}

#[tokio::test]
async fn a_pod_is_resized_in_place_and_restarted_only_where_its_resize_policy_says() {
    let cp = ControlPlane::start("resize", true).await;
    let (node, _) = join_serving(&cp, "resize", &[]).await;
    let pod = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: resized}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, "trap 'exit 0' TERM; while true; do sleep 1; done"]
    resources:
      requests: {{cpu: 100m, memory: 32Mi}}
      limits: {{cpu: 200m, memory: 64Mi}}
    resizePolicy:
    - {{resourceName: cpu, restartPolicy: RestartContainer}}
"#
    );
    cp.pods("default")
        .create(&PostParams::default(), &bound_pod(&pod, &node.name))
        .await
        .expect("create the pod");
    let status_of = |p: &Pod| {
        p.status
            .clone()
            .unwrap_or_default()
            .container_statuses
            .unwrap_or_default()
    };
    let before = cp
        .wait_pod("default", "resized", "Running and Ready", |p| {
            phase(p) == "Running" && condition(p, "Ready")
        })
        .await;
    let first = status_of(&before)[0].clone();
    let limit = |s: &k8s_openapi::api::core::v1::ContainerStatus, r: &str| {
        limit_of(s.resources.as_ref(), r)
    };
    assert_eq!(limit(&first, "cpu").as_deref(), Some("200m"));
    let cgroup = |file: &'static str| cat_in(&cp, "resized", file);
    assert_eq!(cgroup("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").await, "20000");

    // memory changes in place: the same container sees its new limit, and the status follows.
    resize(
        &cp,
        "resized",
        r#"{"spec":{"containers":[{"name":"c","resources":{"limits":{"memory":"96Mi"}}}]}}"#,
    )
    .await;
    eventually(
        "the memory resize in the container's cgroup",
        Duration::from_secs(60),
        || async {
            (cgroup("/sys/fs/cgroup/memory/memory.limit_in_bytes").await
                == (96 * 1024 * 1024).to_string())
            .then_some(())
        },
    )
    .await;
    let after = cp
        .wait_pod(
            "default",
            "resized",
            "the memory resize in the status",
            |p| {
                let s = status_of(p);
                s.first().and_then(|s| limit(s, "memory")).as_deref() == Some("96Mi")
                    && p.status.as_ref().and_then(|s| s.observed_generation)
                        == p.metadata.generation
            },
        )
        .await;
    let resized = status_of(&after)[0].clone();
    assert_eq!(
        resized.container_id, first.container_id,
        "a memory resize restarted the container"
    );
    assert_eq!(resized.restart_count, 0);
    assert_eq!(
        resized
            .allocated_resources
            .and_then(|a| a.get("memory").map(|q| q.0.clone()))
            .as_deref(),
        Some("32Mi")
    );

    // cpu's resize policy restarts the container, with upstream's shares for 150m.
    resize(&cp, "resized", r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"150m"},"limits":{"cpu":"300m"}}}]}}"#).await;
    let restarted = cp
        .wait_pod(
            "default",
            "resized",
            "restarted with the new cpu limit",
            |p| {
                let s = status_of(p);
                s.first().is_some_and(|s| s.restart_count == 1 && s.ready)
                    && s.first().and_then(|s| limit(s, "cpu")).as_deref() == Some("300m")
            },
        )
        .await;
    assert_ne!(status_of(&restarted)[0].container_id, first.container_id);
    assert_eq!(cgroup("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").await, "30000");
    assert_eq!(cgroup("/sys/fs/cgroup/cpu/cpu.shares").await, "153");

    // A resize that does not fit beside another pod's requests waits (Deferred), and is made
    // once that pod is gone.
    let hog = pod_yaml(
        "hog",
        &[("c", FOREVER)],
        "  automountServiceAccountToken: false\n",
    )
    .replacen(
        "    command:",
        "    resources: {requests: {cpu: 1500m}}\n    command:",
        1,
    );
    cp.pods("default")
        .create(&PostParams::default(), &bound_pod(&hog, &node.name))
        .await
        .expect("create the hog");
    cp.wait_pod("default", "hog", "Running", |p| phase(p) == "Running")
        .await;
    resize(&cp, "resized", r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"1"},"limits":{"cpu":"1"}}}]}}"#).await;
    let resize_condition = |p: &Pod, kind: &str| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == kind).cloned())
    };
    let deferred = cp
        .wait_pod("default", "resized", "the resize deferred", |p| {
            resize_condition(p, "PodResizePending").is_some()
        })
        .await;
    let pending = resize_condition(&deferred, "PodResizePending").expect("pending");
    assert_eq!(pending.reason.as_deref(), Some("Deferred"));
    assert!(
        pending
            .message
            .as_deref()
            .is_some_and(|m| m
                .starts_with("Node didn't have enough resource: cpu, requested: 1000, used: 1500")),
        "{pending:?}"
    );
    let waiting = &status_of(&deferred)[0];
    assert_eq!(
        waiting.restart_count, 1,
        "a deferred resize changes nothing"
    );
    assert_eq!(limit(waiting, "cpu").as_deref(), Some("300m"));
    cp.pods("default")
        .delete("hog", &DeleteParams::default())
        .await
        .expect("delete the hog");
    cp.wait_pod("default", "resized", "the deferred resize made", |p| {
        let s = status_of(p);
        resize_condition(p, "PodResizePending").is_none()
            && resize_condition(p, "PodResizeInProgress").is_none()
            && s.first().is_some_and(|s| s.restart_count == 2 && s.ready)
            && s.first().and_then(|s| limit(s, "cpu")).as_deref() == Some("1")
    })
    .await;
    node.finish().await;
}

/// The limit of `resource` in `r`, as written.
fn limit_of(
    r: Option<&k8s_openapi::api::core::v1::ResourceRequirements>,
    resource: &str,
) -> Option<String> {
    r.and_then(|x| x.limits.as_ref())
        .and_then(|l| l.get(resource))
        .map(|q| q.0.clone())
}

/// Resizes the default namespace's pod `pod` with the patch `patch` (the `resize` subresource).
async fn resize(cp: &ControlPlane, pod: &str, patch: &str) {
    cp.kubectl_ok(&["patch", "pod", pod, "--subresource", "resize", "-p", patch])
        .await;
}

/// What `file` holds, read in the default namespace's pod `pod`.
async fn cat_in(cp: &ControlPlane, pod: &str, file: &str) -> String {
    let out = cp.kubectl(&["exec", pod, "--", "cat", file]).await;
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The memory limit of the pod cgroup `pod<uid>` on the host, wherever the node's cgroup root
/// puts it.
fn pod_cgroup_memory(uid: &str) -> Option<String> {
    let mut dirs = vec![std::path::PathBuf::from("/sys/fs/cgroup/memory")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            if entry.file_name().to_string_lossy() == format!("pod{uid}") {
                let limit = std::fs::read_to_string(path.join("memory.limit_in_bytes")).ok()?;
                return Some(limit.trim().to_string());
            }
            dirs.push(path);
        }
    }
    None
}

#[tokio::test]
async fn a_pods_own_resources_bound_it_and_are_resized_in_place() {
    let cp = ControlPlane::start("podlevel", true).await;
    let (node, _) = join_serving(&cp, "podlevel", &[]).await;
    let declared = cp
        .kubectl(&[
            "get",
            "node",
            &node.name,
            "-o",
            "jsonpath={.status.declaredFeatures}",
        ])
        .await;
    assert!(
        String::from_utf8_lossy(&declared.stdout)
            .contains("InPlacePodLevelResourcesVerticalScaling"),
        "{declared:?}"
    );
    let pod = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: bounded}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  resources:
    requests: {{cpu: 100m, memory: 32Mi}}
    limits: {{cpu: 200m, memory: 64Mi}}
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, "trap 'exit 0' TERM; while true; do sleep 1; done"]
"#
    );
    let created = cp
        .pods("default")
        .create(&PostParams::default(), &bound_pod(&pod, &node.name))
        .await
        .expect("create the pod");
    let uid = created.metadata.uid.clone().unwrap_or_default();
    let before = cp
        .wait_pod("default", "bounded", "Running and Ready", |p| {
            phase(p) == "Running" && condition(p, "Ready")
        })
        .await;
    let status = before.status.clone().unwrap_or_default();
    assert_eq!(status.qos_class.as_deref(), Some("Burstable"));
    let pod_limit =
        |p: &Pod, r: &str| limit_of(p.status.as_ref().and_then(|s| s.resources.as_ref()), r);
    assert_eq!(pod_limit(&before, "memory").as_deref(), Some("64Mi"));
    let cgroup = |file: &'static str| cat_in(&cp, "bounded", file);
    // The container, which limits nothing itself, takes the pod's limits; so does the pod's
    // cgroup.
    let mib = |n: u64| (n * 1024 * 1024).to_string();
    assert_eq!(
        cgroup("/sys/fs/cgroup/memory/memory.limit_in_bytes").await,
        mib(64)
    );
    assert_eq!(cgroup("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").await, "20000");
    assert_eq!(pod_cgroup_memory(&uid), Some(mib(64)));
    let first = before
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.clone());

    // The pod's memory limit is resized in place: its cgroup and its container's follow, the
    // container keeps running, and the status shows the new limit.
    resize(
        &cp,
        "bounded",
        r#"{"spec":{"resources":{"limits":{"memory":"96Mi"}}}}"#,
    )
    .await;
    let after = cp
        .wait_pod(
            "default",
            "bounded",
            "the pod-level resize in the status",
            |p| {
                pod_limit(p, "memory").as_deref() == Some("96Mi")
                    && p.status.as_ref().and_then(|s| s.observed_generation)
                        == p.metadata.generation
            },
        )
        .await;
    eventually(
        "the resize in the container's cgroup",
        Duration::from_secs(60),
        || async {
            (cgroup("/sys/fs/cgroup/memory/memory.limit_in_bytes").await == mib(96)).then_some(())
        },
    )
    .await;
    assert_eq!(pod_cgroup_memory(&uid), Some(mib(96)));
    let now = after
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        now.container_id, first,
        "the resize restarted the container"
    );
    assert_eq!(now.restart_count, 0);

    // A memory limit below what the pod uses is not set: the resize stays in progress, with
    // upstream's reason and message, and the pod keeps its limit.
    resize(
        &cp,
        "bounded",
        r#"{"spec":{"resources":{"requests":{"memory":"10Ki"},"limits":{"memory":"10Ki"}}}}"#,
    )
    .await;
    let in_progress = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == "PodResizeInProgress")
                    .cloned()
            })
    };
    let refused = cp
        .wait_pod("default", "bounded", "the resize refused", |p| {
            in_progress(p).is_some_and(|c| c.reason.as_deref() == Some("Error"))
        })
        .await;
    let message = in_progress(&refused)
        .and_then(|c| c.message)
        .unwrap_or_default();
    assert!(
        message.contains("attempting to set pod memory limit (10240) below current usage"),
        "{message}"
    );
    assert_eq!(pod_cgroup_memory(&uid), Some(mib(96)));
    assert_eq!(
        cgroup("/sys/fs/cgroup/memory/memory.limit_in_bytes").await,
        mib(96)
    );
    node.finish().await;
}

#[tokio::test]
async fn an_api_pod_pulls_a_private_image_with_its_image_pull_secret() {
    use base64::Engine as _;
    let reg = crate::bed::registry(true);
    let (user, password) = crate::bed::registry_login();
    let image = format!(
        "{reg}/private/{}:1",
        crate::bed::unique_repo("t-pullsecret")
    );
    crate::bed::copy_image(
        &format!("{reg}/private/busybox:1"),
        &image,
        Some(&format!("{user}:{password}")),
    );
    let cp = ControlPlane::start("pullsecret", true).await;
    let read_only = crate::bed::free_port();
    let node = join(
        &cp,
        "pullsecret",
        &["--read-only-port", &read_only.to_string()],
    )
    .await;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let config = serde_json::json!({"auths": {reg.clone(): {"auth": auth}}}).to_string();
    let pull_secret = async |name: &str| {
        let secret: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "type": "kubernetes.io/dockerconfigjson",
                "stringData": {".dockerconfigjson": config},
            }))
            .expect("a secret");
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(cp.admin.clone(), "default")
            .create(&PostParams::default(), &secret)
            .await
            .expect("create the pull secret");
    };
    pull_secret("regcred").await;
    let pod = format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: private}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 5
  imagePullSecrets: [{{name: regcred}}]
  containers:
  - name: c
    image: {image}
    command: [sh, -c, "trap 'exit 0' TERM; while true; do sleep 1; done"]
"#
    );
    cp.pods("default")
        .create(&PostParams::default(), &bound_pod(&pod, &node.name))
        .await
        .expect("create the pod");
    let running = cp
        .wait_pod(
            "default",
            "private",
            "Running with the private image",
            |p| phase(p) == "Running",
        )
        .await;
    let status = &running
        .status
        .expect("status")
        .container_statuses
        .expect("statuses")[0];
    assert!(status.image_id.contains("sha256:"), "{status:?}");
    // The pod's start SLI leaves out its image pull.
    let (total, sli) = eventually(
        "the pod's startup latency",
        Duration::from_secs(30),
        || async {
            let (_, text) = crate::healthz::get(read_only, "/metrics").await?;
            let sum = |name: &str| crate::bed::sample(&text, &format!("{name}_sum"));
            Some((
                sum("kubelet_pod_start_total_duration_seconds")?,
                sum("kubelet_pod_start_sli_duration_seconds")?,
            ))
        },
    )
    .await;
    assert!(
        sli < total,
        "the SLI {sli} s leaves out the pull from {total} s"
    );

    // The image is on the node now, pulled with regcred's credentials: a pod with a Secret of
    // the same credentials uses it as it is, pods without credentials may not.
    pull_secret("regcred-twin").await;
    let user_of = |name: &str, policy: &str, secrets: &str| {
        pod.replace("name: private", &format!("name: {name}"))
            .replace(
                "  imagePullSecrets: [{name: regcred}]\n",
                &format!("  imagePullSecrets: [{secrets}]\n"),
            )
            .replace(
                &format!("    image: {image}\n"),
                &format!("    image: {image}\n    imagePullPolicy: {policy}\n"),
            )
    };
    for (name, policy, secrets) in [
        ("twin", "IfNotPresent", "{name: regcred-twin}"),
        ("thief", "IfNotPresent", ""),
        ("never", "Never", ""),
    ] {
        cp.pods("default")
            .create(
                &PostParams::default(),
                &bound_pod(&user_of(name, policy, secrets), &node.name),
            )
            .await
            .expect("create the pod");
    }
    cp.wait_pod(
        "default",
        "twin",
        "Running with the image on the node",
        |p| phase(p) == "Running",
    )
    .await;
    let waiting = |p: &Pod| -> String {
        let statuses = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref());
        let state = statuses.and_then(|s| s.first()?.state.clone());
        (state.and_then(|s| s.waiting?.reason)).unwrap_or_default()
    };
    cp.wait_pod(
        "default",
        "thief",
        "refused the image without credentials",
        |p| matches!(waiting(p).as_str(), "ErrImagePull" | "ImagePullBackOff"),
    )
    .await;
    cp.wait_pod(
        "default",
        "never",
        "refused the image it may not pull",
        |p| waiting(p) == "ErrImageNeverPull",
    )
    .await;
    let metrics = crate::healthz::get(read_only, "/metrics")
        .await
        .expect("metrics")
        .1;
    for series in [
        "kubelet_imagemanager_image_mustpull_checks_total{result=\"credentialRecordFound\"}",
        "kubelet_imagemanager_image_mustpull_checks_total{result=\"mustAuthenticate\"}",
        "kubelet_imagemanager_ondisk_pulledrecords 1\n",
        "kubelet_imagemanager_ondisk_pullintents 0\n",
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }
    node.finish().await;
}

/// GET https://127.0.0.1:<port><path> with an optional bearer token: (status, body).
async fn node_api(port: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut curl = tokio::process::Command::new("curl");
    curl.args(["-ks", "-w", "\n%{http_code}"]);
    if let Some(token) = token {
        curl.arg("-H").arg(format!("Authorization: Bearer {token}"));
    }
    let out = curl
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .await
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[tokio::test]
async fn the_node_api_asks_the_api_server_who_may_do_what() {
    let cp = ControlPlane::start("webhook", true).await;
    let (node, port) = join_serving(
        &cp,
        "webhook",
        &["--authorization-webhook-cache-unauthorized-ttl=1s"],
    )
    .await;
    cp.kubectl_ok(&["create", "serviceaccount", "reader"]).await;
    let token = cp.kubectl_ok(&["create", "token", "reader"]).await;
    let token = token.trim();

    // No credentials, and a token the API server does not know: not authenticated.
    assert_eq!(node_api(&port, "/pods", None).await.0, 401);
    assert_eq!(node_api(&port, "/pods", Some("not-a-token")).await.0, 401);
    // A known token without RBAC: authenticated, then refused by the SubjectAccessReview.
    let (code, body) = eventually(
        "the API server's answer",
        Duration::from_secs(30),
        || async {
            let answer = node_api(&port, "/pods", Some(token)).await;
            (answer.0 != 0).then_some(answer)
        },
    )
    .await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("user=system:serviceaccount:default:reader")
            && body.contains("subresource(s)=[pods, proxy]"),
        "{body}"
    );
    // Granted nodes/proxy through RBAC: allowed once the denial's short cache has passed.
    cp.kubectl_ok(&[
        "create",
        "clusterrole",
        "node-reader",
        "--verb=get",
        "--resource=nodes/proxy",
    ])
    .await;
    cp.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        "node-reader",
        "--clusterrole=node-reader",
        "--serviceaccount=default:reader",
    ])
    .await;
    let body = eventually(
        "the granted request is allowed",
        Duration::from_secs(30),
        || async {
            let (code, body) = node_api(&port, "/pods", Some(token)).await;
            (code == 200).then_some(body)
        },
    )
    .await;
    assert!(body.contains("\"kind\":\"PodList\""), "{body}");
    // Only what was granted: the stats subresource stays closed to it.
    assert_eq!(node_api(&port, "/stats/summary", Some(token)).await.0, 403);
    node.finish().await;
}

/// The nodes the pods labelled `app=<app>` run on, among those Running.
async fn placement(cp: &ControlPlane, app: &str) -> Vec<String> {
    let list = cp
        .pods("default")
        .list(&kube::api::ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut nodes: Vec<String> = list
        .iter()
        .filter(|p| {
            phase(p) == "Running"
                && condition(p, "Ready")
                && p.metadata.deletion_timestamp.is_none()
        })
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    nodes.sort();
    nodes
}

/// Whether the node is Ready and carries no taint (the node controller taints a node it has not
/// yet seen Ready, and the scheduler keeps pods off it).
async fn schedulable(cp: &ControlPlane, name: &str) -> bool {
    let Ok(Some(node)) = cp.nodes().get_opt(name).await else {
        return false;
    };
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| !t.is_empty());
    ready && !tainted
}

#[tokio::test]
async fn two_nodes_share_a_deployment_drain_and_take_over_from_a_lost_node() {
    // The node controller marks a node whose lease stopped NotReady after 8 s.
    let cp = ControlPlane::start_with("multi", true, &[("NODE_MONITOR_GRACE", "8s")]).await;
    let group = format!(
        "--node-labels=nodelet-test-group=multi-{}",
        std::process::id()
    );
    // Each node has a containerd of its own.
    let b_runtime = OtherRuntime::up("multib", 1).await;
    let a = join(&cp, "multia", &[&group]).await;
    let mut b = join_on(&b_runtime.endpoint, &cp, "multib", &[&group]).await;
    let deployment = format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: spread}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: spread}}}}
  template:
    metadata: {{labels: {{app: spread}}}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 5
      nodeSelector: {{nodelet-test-group: multi-{id}}}
      tolerations:
      - {{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 2}}
      - {{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 2}}
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              labelSelector: {{matchLabels: {{app: spread}}}}
              topologyKey: kubernetes.io/hostname
      containers:
      - name: c
        image: {BUSYBOX}
        command: [sh, -c, "trap 'exit 0' TERM; while true; do sleep 1; done"]
"#,
        id = std::process::id()
    );
    // Both nodes take pods before the replicas are scheduled, or both may land on one.
    eventually(
        "both nodes schedulable",
        Duration::from_secs(60),
        || async {
            (schedulable(&cp, &a.name).await && schedulable(&cp, &b.name).await).then_some(())
        },
    )
    .await;
    let file = cp.dir.join("spread.yaml");
    std::fs::write(&file, deployment).expect("write the deployment");
    cp.kubectl_ok(&["apply", "-f", &file.display().to_string()])
        .await;
    let both = vec![a.name.clone(), b.name.clone()];
    eventually(
        "one replica on each node",
        Duration::from_secs(90),
        || async { (placement(&cp, "spread").await == both).then_some(()) },
    )
    .await;

    // kubectl drain evicts a's replica through the Eviction API; it comes back on b.
    cp.kubectl_ok(&["drain", &a.name, "--ignore-daemonsets", "--timeout=90s"])
        .await;
    let on_b = vec![b.name.clone(), b.name.clone()];
    eventually(
        "both replicas on b after the drain",
        Duration::from_secs(90),
        || async { (placement(&cp, "spread").await == on_b).then_some(()) },
    )
    .await;
    cp.kubectl_ok(&["uncordon", &a.name]).await;

    // b's agent stops: its lease expires, the node controller marks it NotReady and evicts its
    // pods by taint, and they come back Running on a.
    b.stop_agent().await;
    let nodes = cp.nodes();
    eventually("b is NotReady", Duration::from_secs(90), || async {
        let node = nodes.get_opt(&b.name).await.ok().flatten()?;
        let ready = node
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.status != "True").then_some(())
    })
    .await;
    let on_a = vec![a.name.clone(), a.name.clone()];
    eventually(
        "both replicas on a after b was lost",
        Duration::from_secs(120),
        || async { (placement(&cp, "spread").await == on_a).then_some(()) },
    )
    .await;
    a.finish().await;
    b.finish().await;
    b_runtime.down().await;
}

#[tokio::test]
async fn nodelet_starts_its_static_pods_while_the_api_server_is_not_there_yet() {
    let cp = ControlPlane::start("latestart", false).await;
    cp.stop("kube-apiserver").await;
    let node = join(&cp, "latestart", &[]).await;
    node.write_manifest("a.yaml", &pod_yaml("a", &[("c", FOREVER)], ""));
    let (sandbox, _) = node.wait_running("a", 1).await;
    cp.start_again("kube-apiserver").await;
    let nodes = cp.nodes();
    eventually(
        "the node registers once the API server is there",
        Duration::from_secs(60),
        || async { nodes.get_opt(&node.name).await.ok().flatten() },
    )
    .await;
    cp.wait_pod("default", &node.pod_name("a"), "mirrored", |p| {
        phase(p) == "Running"
    })
    .await;
    let (still, _) = node.wait_running("a", 1).await;
    assert_eq!(still.id, sandbox.id);
    node.finish().await;
}

#[tokio::test]
async fn a_pod_deleted_while_nodelet_was_down_still_stops_gracefully_before_it_leaves_the_api() {
    let cp = ControlPlane::start("downdelete", true).await;
    let mut node = join(&cp, "downdelete", &[]).await;
    let marks = node.path("marks");
    let yaml = format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: late
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 30
  volumes:
  - name: marks
    hostPath: {{path: {marks}, type: DirectoryOrCreate}}
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, "trap 'echo > /marks/term; exit 0' TERM; while true; do sleep 1; done"]
    lifecycle:
      preStop:
        exec: {{command: [sh, -c, "echo > /marks/prestop"]}}
    volumeMounts: [{{name: marks, mountPath: /marks}}]
"#,
        marks = marks.display()
    );
    cp.pods("default")
        .create(&PostParams::default(), &bound_pod(&yaml, &node.name))
        .await
        .expect("create the pod");
    cp.wait_pod("default", "late", "Running", |p| phase(p) == "Running")
        .await;
    node.stop_agent().await;
    cp.kubectl_ok(&["delete", "pod", "late", "--wait=false"])
        .await;
    // Back up, nodelet finds the pod already being deleted: it stops it with its hook and
    // grace period first, and only then lets the API object go.
    let extra = [
        "--kubeconfig".to_string(),
        cp.node_kubeconfig(&node.name).display().to_string(),
    ];
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    node.restart(&extra).await;
    cp.wait_pod_gone("default", "late").await;
    for mark in ["prestop", "term"] {
        assert!(
            marks.join(mark).exists(),
            "the container never wrote /marks/{mark}"
        );
    }
    node.finish().await;
}

/// Graceful node shutdown in a cluster: the Node turns NotReady ("node is shutting down"), an
/// API pod and a static pod stop, and the API server has each one's final status (Failed,
/// Terminated, DisruptionTarget) before the agent ends; back up, the static pod runs again and
/// the API pod stays Failed.
#[tokio::test]
async fn a_node_shutdown_reports_not_ready_and_every_pods_final_status() {
    let cp = ControlPlane::start("nodeshutdown", true).await;
    let grace = ["--shutdown-grace-period=10s"];
    let mut node = join(&cp, "nodeshutdown", &grace).await;
    node.write_manifest("web.yaml", &pod_yaml("web", &[("c", FOREVER)], ""));
    let api = format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: api}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 5
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, \"trap 'exit 143' TERM; {FOREVER}\"]
"
    );
    cp.pods("default")
        .create(&PostParams::default(), &bound_pod(&api, &node.name))
        .await
        .expect("create the pod");
    let web = node.pod_name("web");
    for name in ["api", web.as_str()] {
        cp.wait_pod("default", name, "Running", |p| phase(p) == "Running")
            .await;
    }
    node.shut_down_node(Duration::from_secs(40)).await;
    // Read at once: the agent has ended, so all of this reached the API server before.
    let ready = cp
        .nodes()
        .get(&node.name)
        .await
        .expect("the node")
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    assert_eq!(ready.status, "False", "{ready:?}");
    assert_eq!(ready.message.as_deref(), Some("node is shutting down"));
    // The static pod's container exits 0 on SIGTERM: its pod ends Succeeded, as upstream keeps
    // it; the API pod's exits 143 and it ends Failed.
    for (name, ended) in [("api", "Failed"), (web.as_str(), "Succeeded")] {
        let pod = cp.pods("default").get(name).await.expect("the pod");
        let status = pod.status.clone().unwrap_or_default();
        assert_eq!(phase(&pod), ended, "{name}: {status:?}");
        assert_eq!(status.reason.as_deref(), Some("Terminated"), "{name}");
        assert!(condition(&pod, "DisruptionTarget"), "{name}: {status:?}");
        let c = &status.container_statuses.unwrap_or_default()[0];
        assert!(
            c.state.as_ref().is_some_and(|s| s.terminated.is_some()),
            "{name}: {c:?}"
        );
    }
    let extra = [
        "--kubeconfig".to_string(),
        cp.node_kubeconfig(&node.name).display().to_string(),
        grace[0].to_string(),
    ];
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    node.restart(&extra).await;
    cp.wait_pod("default", &web, "Running again", |p| phase(p) == "Running")
        .await;
    let api = cp.pods("default").get("api").await.expect("the pod");
    assert_eq!(
        phase(&api),
        "Failed",
        "a finished API pod never starts again"
    );
    node.finish().await;
}

#[tokio::test]
async fn a_readiness_gate_holds_ready_until_its_condition_is_true() {
    let cp = ControlPlane::start("gates", true).await;
    let node = join(&cp, "gates", &[]).await;
    let gated = pod_yaml(
        "gated",
        &[("c", FOREVER)],
        "  automountServiceAccountToken: false\n  readinessGates: [{conditionType: example.com/lb-ready}]\n",
    );
    cp.pods("default")
        .create(&PostParams::default(), &bound_pod(&gated, &node.name))
        .await
        .expect("create the pod");
    let held = cp
        .wait_pod(
            "default",
            "gated",
            "Running, its containers ready, held by its gate",
            |p| {
                phase(p) == "Running"
                    && condition(p, "ContainersReady")
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| {
                                c.type_ == "Ready"
                                    && c.reason.as_deref() == Some("ReadinessGatesNotReady")
                            })
                        })
            },
        )
        .await;
    assert!(!condition(&held, "Ready"));
    // A load balancer controller, say, passes the gate.
    cp.kubectl_ok(&[
        "patch",
        "pod",
        "gated",
        "--subresource=status",
        "--type=strategic",
        "-p",
        r#"{"status":{"conditions":[{"type":"example.com/lb-ready","status":"True"}]}}"#,
    ])
    .await;
    cp.wait_pod("default", "gated", "Ready once its gate passed", |p| {
        condition(p, "Ready") && condition(p, "example.com/lb-ready")
    })
    .await;
    node.finish().await;
}

#[tokio::test]
async fn an_api_pod_runs_under_the_handler_of_its_runtime_class() {
    let handler = std::env::var("NODELET_TEST_ALT_HANDLER").expect("NODELET_TEST_ALT_HANDLER");
    let alt_root = std::path::PathBuf::from(
        std::env::var("NODELET_TEST_ALT_RUNC_ROOT").expect("NODELET_TEST_ALT_RUNC_ROOT"),
    );
    let cp = ControlPlane::start("rtclass", true).await;
    let node = join(&cp, "rtclass", &[]).await;
    let class: k8s_openapi::api::node::v1::RuntimeClass =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "alt"},
            "handler": handler,
            "overhead": {"podFixed": {"memory": "32Mi"}},
        }))
        .expect("a RuntimeClass");
    Api::<k8s_openapi::api::node::v1::RuntimeClass>::all(cp.admin.clone())
        .create(&PostParams::default(), &class)
        .await
        .expect("create the RuntimeClass");
    let pod = pod_yaml(
        "alt",
        &[("c", FOREVER)],
        "  runtimeClassName: alt\n  automountServiceAccountToken: false\n",
    );
    cp.pods("default")
        .create(&PostParams::default(), &bound_pod(&pod, &node.name))
        .await
        .expect("create the pod");
    let running = cp
        .wait_pod("default", "alt", "Running", |p| phase(p) == "Running")
        .await;
    let overhead = running
        .spec
        .as_ref()
        .and_then(|s| s.overhead.clone())
        .expect("the API server gave the pod its RuntimeClass's overhead");
    assert_eq!(overhead["memory"].0, "32Mi");
    let sandbox = node
        .all_sandboxes()
        .await
        .into_iter()
        .find(|s| s.name == "alt")
        .expect("the pod's sandbox");
    assert!(
        alt_root.join("k8s.io").join(&sandbox.id).is_dir(),
        "the sandbox runs under the {handler} handler"
    );
    node.finish().await;
}

/// The node is Ready only while its runtime says it is: containerd reports NetworkReady=false
/// once its CNI config is gone, and the Node's Ready condition says so in upstream's words
/// until the config is back.
#[tokio::test]
async fn a_runtime_without_a_network_makes_the_node_not_ready_until_it_has_one_again() {
    let cp = ControlPlane::start("netready", false).await;
    let bed = OtherRuntime::up("netready", 2).await;
    let node = join_on(&bed.endpoint, &cp, "netready", &[]).await;
    let nodes = cp.nodes();
    let ready = |want: &'static str| {
        let nodes = nodes.clone();
        let name = node.name.clone();
        async move {
            let n = nodes.get_opt(&name).await.ok().flatten()?;
            let c = n
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (c.status == want).then_some(c.message.unwrap_or_default())
        }
    };
    eventually("the node Ready", Duration::from_secs(60), || ready("True")).await;
    let config = bed.cni_config();
    let saved = std::fs::read(&config).expect("the bed's CNI config");
    std::fs::remove_file(&config).expect("remove the CNI config");
    let message = eventually(
        "the node NotReady for want of a network",
        Duration::from_secs(60),
        || ready("False"),
    )
    .await;
    assert!(
        message.contains("container runtime network not ready: NetworkReady=false"),
        "{message}"
    );
    std::fs::write(&config, saved).expect("put the CNI config back");
    eventually("the node Ready again", Duration::from_secs(60), || {
        ready("True")
    })
    .await;
    node.finish().await;
    bed.down().await;
}

/// A TCP relay to the API server that can black-hole the path: while it does, nothing is relayed
/// (as if every packet were dropped), and a connection that carried anything meanwhile stays
/// dead afterwards (its retransmissions back off beyond the test); connections that sat idle,
/// and new ones, work again once the path is back.
struct BlackHole {
    port: u16,
    dropping: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: tokio_util::sync::CancellationToken,
}

impl BlackHole {
    async fn start(upstream: u16) -> BlackHole {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind the relay");
        let port = listener.local_addr().expect("its address").port();
        let dropping = std::sync::Arc::new(AtomicBool::new(false));
        let stop = tokio_util::sync::CancellationToken::new();
        let (flag, cancel) = (dropping.clone(), stop.clone());
        // Relays one direction until either side closes, or forever once it carried data while
        // the path was dropped.
        async fn relay(
            mut from: tokio::net::tcp::OwnedReadHalf,
            mut to: tokio::net::tcp::OwnedWriteHalf,
            dropping: std::sync::Arc<AtomicBool>,
            dead: std::sync::Arc<AtomicBool>,
        ) {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match from.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if dropping.load(Ordering::SeqCst) {
                    dead.store(true, Ordering::SeqCst);
                }
                if dead.load(Ordering::SeqCst) {
                    continue;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = cancel.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((client, _)) = accepted else { continue };
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    continue;
                };
                let dead = std::sync::Arc::new(AtomicBool::new(false));
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let cancel = cancel.clone();
                let (up, down) = (
                    relay(cr, sw, flag.clone(), dead.clone()),
                    relay(sr, cw, flag.clone(), dead),
                );
                tokio::spawn(async move {
                    tokio::select! {
                        _ = cancel.cancelled() => {}
                        _ = async { tokio::join!(up, down) } => {}
                    }
                });
            }
        });
        BlackHole {
            port,
            dropping,
            stop,
        }
    }

    fn drop_path(&self, dropping: bool) {
        self.dropping
            .store(dropping, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The lease under a black-holed connection: with the path to the API server dropped (not
/// refused) for 20 s, each renewal is given up after its deadline and the next goes over another
/// connection, so the lease is renewed within 10 s of the path coming back.
/// Starts nodelet as node `t-<test>` joined to `cp` through a [`BlackHole`] relay, with a
/// short lease (renewed every second).
async fn join_through_relay(cp: &ControlPlane, test: &str) -> (Node, BlackHole) {
    let env = std::fs::read_to_string(cp.dir.join("env")).expect("the cluster env");
    let apiserver: u16 = env
        .lines()
        .find_map(|l| l.strip_prefix("APISERVER_PORT="))
        .and_then(|p| p.parse().ok())
        .expect("APISERVER_PORT in the cluster env");
    let path = BlackHole::start(apiserver).await;
    let direct = cp.node_kubeconfig(&format!("t-{test}"));
    let text = std::fs::read_to_string(&direct).expect("the node kubeconfig");
    let via = text.replace(
        &format!("https://127.0.0.1:{apiserver}"),
        &format!("https://127.0.0.1:{}", path.port),
    );
    assert_ne!(
        via, text,
        "the kubeconfig names the API server by loopback and port"
    );
    let kubeconfig = cp.dir.join(format!("{test}-relayed.kubeconfig"));
    std::fs::write(&kubeconfig, via).expect("write the kubeconfig");
    let config = cp.dir.join(format!("{test}-kubelet.yaml"));
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
nodeLeaseDurationSeconds: 4
",
    )
    .expect("write the kubelet config");
    let (kubeconfig, config) = (
        kubeconfig.display().to_string(),
        config.display().to_string(),
    );
    let node = Node::start(test, &["--kubeconfig", &kubeconfig, "--config", &config]).await;
    (node, path)
}

#[tokio::test]
async fn the_lease_is_renewed_soon_after_a_black_holed_path_comes_back() {
    let cp = ControlPlane::start("blackhole", false).await;
    let (node, path) = join_through_relay(&cp, "blackhole").await;
    let leases: Api<Lease> = Api::namespaced(cp.admin.clone(), "kube-node-lease");
    let since = k8s_openapi::jiff::Timestamp::now();
    eventually("the lease renewed", Duration::from_secs(60), || async {
        lease_renewed(&leases, &node.name)
            .await
            .filter(|t| *t > since)
    })
    .await;

    path.drop_path(true);
    let (dropped, dropped_at) = (
        tokio::time::Instant::now(),
        k8s_openapi::jiff::Timestamp::now(),
    );
    let mut every = tokio::time::interval(Duration::from_millis(500));
    while dropped.elapsed() < Duration::from_secs(20) {
        every.tick().await;
    }
    // A renewal already on its way when the path went may have landed; none after.
    let during = lease_renewed(&leases, &node.name).await.expect("the lease");
    let landed = dropped_at
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(2))
        .expect("a time");
    assert!(
        during < landed,
        "the path was not dropped: renewed at {during}"
    );
    path.drop_path(false);
    let back = k8s_openapi::jiff::Timestamp::now();
    eventually(
        "the lease renewed within 10 s of the path coming back",
        Duration::from_secs(10),
        || async {
            lease_renewed(&leases, &node.name)
                .await
                .filter(|t| *t > back)
        },
    )
    .await;
    node.finish().await;
}

/// Static pods never wait on the API server: with every request to it hanging (its path
/// black-holed), a static pod's manifest edit still replaces its container at once.
#[tokio::test]
async fn a_static_pod_edit_applies_while_every_api_request_hangs() {
    let cp = ControlPlane::start("hangingapi", false).await;
    let (node, path) = join_through_relay(&cp, "hangingapi").await;
    node.write_manifest("a.yaml", &pod_yaml("a", &[("c", FOREVER)], ""));
    let (_, before) = node.wait_running("a", 1).await;
    cp.wait_pod("default", &node.pod_name("a"), "mirrored", |p| {
        phase(p) == "Running"
    })
    .await;

    path.drop_path(true);
    let edited = "trap 'exit 0' TERM; echo edited; while true; do sleep 1; done";
    node.write_manifest("a.yaml", &pod_yaml("a", &[("c", edited)], ""));
    let replaced = async {
        eventually(
            "the edited container running",
            Duration::from_secs(60),
            || async {
                let (_, now) = node.wait_running("a", 1).await;
                (now[0].id != before[0].id).then_some(())
            },
        )
        .await;
        node.wait_log("a", "c", "edited").await;
    };
    // The old container's stop takes its grace period (5 s) at most.
    tokio::time::timeout(Duration::from_secs(15), replaced)
        .await
        .expect("the edit applied within 15 s while the API server hung");
    path.drop_path(false);
    node.finish().await;
}

/// A device plugin's resource shows in the Node's capacity and allocatable, follows its
/// devices' health, and an API pod asking for it gets a device.
#[tokio::test]
async fn a_device_plugins_resource_shows_in_the_nodes_status_and_api_pods_get_its_devices() {
    const RESOURCE: &str = "example.com/own";
    let cp = ControlPlane::start("devapi", true).await;
    let node = join(&cp, "devapi", &[]).await;
    let (plugin, cancel) = crate::devices::own_plugin(&node, &[("a", true), ("b", true)]).await;
    crate::devices::register_own(&node, RESOURCE, &["a", "b"]).await;
    let counts = |n: &ApiNode| {
        let status = n.status.as_ref()?;
        let of = |m: Option<
            &std::collections::BTreeMap<
                String,
                k8s_openapi::apimachinery::pkg::api::resource::Quantity,
            >,
        >| { m.and_then(|m| m.get(RESOURCE)).map(|q| q.0.clone()) };
        Some((
            of(status.capacity.as_ref())?,
            of(status.allocatable.as_ref())?,
        ))
    };
    let nodes = cp.nodes();
    eventually(
        "the resource in the Node's status",
        Duration::from_secs(30),
        || async {
            let n = nodes.get(&node.name).await.ok()?;
            (counts(&n)? == ("2".to_string(), "2".to_string())).then_some(())
        },
    )
    .await;
    plugin.devices.send_replace(vec![
        crate::devices::device("a", true),
        crate::devices::device("b", false),
    ]);
    eventually(
        "an unhealthy device out of allocatable",
        Duration::from_secs(30),
        || async {
            let n = nodes.get(&node.name).await.ok()?;
            (counts(&n)? == ("2".to_string(), "1".to_string())).then_some(())
        },
    )
    .await;
    let yaml = crate::devices::pod("dev", RESOURCE, 1, "echo env=$OWN_DEVICES; sleep 3600");
    let yaml = yaml.replace("spec:\n", "spec:\n  automountServiceAccountToken: false\n");
    cp.pods("default")
        .create(&PostParams::default(), &bound_pod(&yaml, &node.name))
        .await
        .expect("create the pod");
    cp.wait_pod("default", "dev", "Running", |p| phase(p) == "Running")
        .await;
    assert_eq!(crate::devices::held(&node, "dev", RESOURCE).await, ["a"]);
    cancel.cancel();
    node.finish().await;
}

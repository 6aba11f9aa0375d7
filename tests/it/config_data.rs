//! ConfigMaps and Secrets beside static pods, and downwardAPI and projected volumes, against
//! containerd: env, envFrom, atomic volume updates seen from inside a running container,
//! secrets on tmpfs, a missing object that holds a container until it appears.

use std::time::Duration;

use crate::bed::{BUSYBOX, Node, eventually};

/// `n` lines of `token`: big enough that a file written in place would be seen half-written.
fn lines(token: &str, n: usize) -> String {
    vec![token; n].join("\n")
}

fn config_map(name: &str, version: &str) -> String {
    let body = serde_json::to_string(&lines(version, 2000)).expect("json string");
    format!(
        "apiVersion: v1
kind: ConfigMap
metadata: {{name: {name}}}
data:
  MODE: fast
  GREETING: hello
  a: {body}
  b: {body}
"
    )
}

const SECRET: &str = "apiVersion: v1
kind: Secret
metadata: {name: creds}
type: Opaque
data: {password: czNjcjN0}
stringData: {user: admin}
";

/// Reads the config volume in a loop: the two keys must always come from one version (read
/// through one resolution of `..data`) and each file must be whole (one version, every line).
const READER: &str = r#"
echo "mode=$MODE pw=$PW user=$CFG_user greeting=$CFG_GREETING"
echo "secret-mode=$(stat -L -c %a /sec/password) secret-fs=$(awk '$2=="/sec"{print $3}' /proc/mounts)"
echo "secret=$(cat /sec/password)"
last=""
while true; do
  d=$(readlink /cfg/..data)
  if a=$(cat /cfg/$d/a 2>/dev/null) && b=$(cat /cfg/$d/b 2>/dev/null); then
    [ "$a" = "$b" ] || echo MIXED
  fi
  x=$(cat /cfg/a)
  n=$(echo "$x" | sort -u | wc -l)
  c=$(echo "$x" | wc -l)
  [ "$n" = 1 ] && [ "$c" = 2000 ] || echo "TORN $n $c"
  v=$(echo "$x" | head -n 1)
  if [ "$v" != "$last" ]; then echo "seen=$v"; last=$v; fi
  sleep 0.02
done
"#;

fn pod() -> String {
    let script = serde_json::to_string(&format!("trap 'exit 0' TERM; {READER}")).expect("json");
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: app}}
spec:
  terminationGracePeriodSeconds: 5
  volumes:
  - {{name: cfg, configMap: {{name: app-cfg}}}}
  - {{name: sec, secret: {{secretName: creds, defaultMode: 0400}}}}
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, {script}]
    env:
    - {{name: MODE, valueFrom: {{configMapKeyRef: {{name: app-cfg, key: MODE}}}}}}
    - {{name: PW, valueFrom: {{secretKeyRef: {{name: creds, key: password}}}}}}
    envFrom:
    - {{configMapRef: {{name: app-cfg}}, prefix: CFG_}}
    - {{secretRef: {{name: creds}}, prefix: CFG_}}
    volumeMounts:
    - {{name: cfg, mountPath: /cfg}}
    - {{name: sec, mountPath: /sec}}
"
    )
}

#[tokio::test]
async fn config_maps_and_secrets_reach_env_and_volumes_and_updates_appear_whole() {
    let node = Node::start("cfgdata", &[]).await;
    // One multi-document file holds the pod and its ConfigMap; the Secret has a file of its own.
    node.write_manifest("creds.yaml", SECRET);
    node.write_manifest(
        "app.yaml",
        &format!("{}---\n{}", config_map("app-cfg", "v1"), pod()),
    );
    let (sandbox, containers) = node.wait_running("app", 1).await;
    let log = node.wait_log("app", "c", "secret=").await;
    assert!(
        log.contains("mode=fast pw=s3cr3t user=admin greeting=hello"),
        "{log}"
    );
    assert!(
        log.contains("secret-mode=400 secret-fs=tmpfs"),
        "the secret volume is on tmpfs with mode 0400: {log}"
    );
    assert!(log.contains("secret=s3cr3t"), "{log}");
    node.wait_log("app", "c", "seen=v1").await;

    // ConfigMap changes (the pod text is the same) reach the running container, whole.
    for version in ["v2", "v3", "v4", "v5", "v6"] {
        node.write_manifest(
            "app.yaml",
            &format!("{}---\n{}", config_map("app-cfg", version), pod()),
        );
        node.wait_log("app", "c", &format!("seen={version}")).await;
    }
    let log = node.wait_log("app", "c", "seen=v6").await;
    assert!(
        !log.contains("MIXED") && !log.contains("TORN"),
        "a reader saw a half-done update: {log}"
    );
    let (_, now) = node.wait_running("app", 1).await;
    assert_eq!(
        now[0].id, containers[0].id,
        "an object change never restarts the container"
    );

    // The pod's volumes (the secret's tmpfs among them) go with the pod.
    node.remove_manifest("app.yaml");
    node.wait_gone(&sandbox.uid, Duration::from_secs(30)).await;
    let pod_dir = node.path("root/pods").join(&sandbox.uid.0);
    eventually(
        "the pod's directory to be removed",
        Duration::from_secs(30),
        || async { (!pod_dir.exists()).then_some(()) },
    )
    .await;
    node.finish().await;
}

#[tokio::test]
async fn a_missing_reference_holds_the_container_until_the_object_appears() {
    let node = Node::start("cfgwait", &[]).await;
    let script = serde_json::to_string(
        "trap 'exit 0' TERM; echo \"value=$V\"; while true; do sleep 1; done",
    )
    .expect("json");
    node.write_manifest(
        "late.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: late}}
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, {script}]
    env:
    - {{name: V, valueFrom: {{configMapKeyRef: {{name: late-cfg, key: k}}}}}}
    - {{name: O, valueFrom: {{secretKeyRef: {{name: absent, key: k, optional: true}}}}}}
"
        ),
    );
    let waiting = |needle: &'static str| {
        move |s: &k8s_openapi::api::core::v1::PodStatus| {
            s.container_statuses
                .as_ref()
                .and_then(|c| c.first())
                .and_then(|c| c.state.as_ref())
                .and_then(|st| st.waiting.as_ref())
                .is_some_and(|w| {
                    w.reason.as_deref() == Some("CreateContainerConfigError")
                        && w.message.as_deref().unwrap_or_default().contains(needle)
                })
        }
    };
    node.wait_status(
        "late",
        "waiting for its ConfigMap",
        waiting("configmap \"late-cfg\" not found"),
    )
    .await;
    // The object appears without the key...
    node.write_manifest(
        "late-cfg.yaml",
        "apiVersion: v1
kind: ConfigMap
metadata: {name: late-cfg}
data: {other: x}
",
    );
    node.wait_status(
        "late",
        "waiting for its key",
        waiting("couldn't find key k in ConfigMap default/late-cfg"),
    )
    .await;
    // ...then with it: the container starts by itself, well before the periodic resync.
    node.write_manifest(
        "late-cfg.yaml",
        "apiVersion: v1
kind: ConfigMap
metadata: {name: late-cfg}
data: {k: arrived}
",
    );
    eventually(
        "the container to start",
        Duration::from_secs(30),
        || async {
            node.status("late")
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.first().cloned())
                .and_then(|c| c.state)
                .and_then(|st| st.running)
        },
    )
    .await;
    node.wait_log("late", "c", "value=arrived").await;
    node.finish().await;
}

#[tokio::test]
async fn downward_api_files_follow_label_changes_of_a_pod_with_a_fixed_uid() {
    let node = Node::start("cfgdown", &[]).await;
    let script = serde_json::to_string(
        "trap 'exit 0' TERM; last=''; while true; do l=$(cat /info/labels); if [ \"$l\" != \"$last\" ]; then echo \"labels: $l\"; echo \"extra: $(cat /info/greeting) $(cat /info/name) $(cat /info/mem)\"; last=$l; fi; sleep 0.1; done",
    )
    .expect("json");
    // With its own metadata.uid a static pod keeps its identity across edits, so a label change
    // is an update of the running pod (without one, any edit makes a new pod, as upstream).
    let manifest = |tier: &str| {
        format!(
            "apiVersion: v1
kind: ConfigMap
metadata: {{name: info}}
data: {{greeting: hi}}
---
apiVersion: v1
kind: Pod
metadata: {{name: down, uid: down-{node}, labels: {{tier: {tier}}}}}
spec:
  terminationGracePeriodSeconds: 5
  volumes:
  - name: info
    projected:
      sources:
      - downwardAPI:
          items:
          - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
          - {{path: name, fieldRef: {{fieldPath: metadata.name}}}}
          - {{path: mem, resourceFieldRef: {{containerName: c, resource: limits.memory, divisor: 1Mi}}}}
      - configMap: {{name: info}}
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, {script}]
    resources: {{limits: {{memory: 64Mi}}}}
    volumeMounts: [{{name: info, mountPath: /info}}]
",
            node = node.name
        )
    };
    node.write_manifest("down.yaml", &manifest("front"));
    let (_, before) = node.wait_running("down", 1).await;
    let log = node.wait_log("down", "c", "extra: ").await;
    assert!(log.contains("labels: tier=\"front\""), "{log}");
    assert!(
        log.contains(&format!("extra: hi {} 64", node.pod_name("down"))),
        "{log}"
    );
    node.write_manifest("down.yaml", &manifest("back"));
    node.wait_log("down", "c", "labels: tier=\"back\"").await;
    let (_, after) = node.wait_running("down", 1).await;
    assert_eq!(before[0].id, after[0].id, "a label change does not restart");
    node.finish().await;
}

//! Attacks on a real node, as a container, a local user or a network client would make them:
//! each must get nothing the upstream kubelet's trust model does not give them.

use std::time::Duration;

use crate::bed::{BUSYBOX, FOREVER, Node, eventually, logs};
use crate::resilience::make_sandbox_with_uid;

/// Containers that crash-loop with the raced subPath.
const VICTIMS: usize = 6;

#[tokio::test]
async fn a_container_racing_symlinks_never_gets_a_sub_path_outside_its_volume() {
    let node = Node::start("subrace", &[]).await;
    // A host directory the containers cannot see: a subPath through a link to it must not
    // make anything in it.
    let host_dir = node.path("host-only");
    std::fs::create_dir_all(&host_dir).expect("make the host directory");
    let host = host_dir.display();
    // `plant` points `y` at the host directory before the others start; `racer` swaps `x`
    // between a directory and a link to the host's root in a tight loop while six victims
    // crash-loop with subPath `x`, and `maker` asks for `y/made`.
    let victims: String = (0..VICTIMS)
        .map(|i| {
            format!(
                r#"  - name: v{i}
    image: {BUSYBOX}
    volumeMounts: [{{name: data, mountPath: /mnt, subPath: x}}]
    command: [sh, -c, "if [ -n \"$(ls -A /mnt)\" ]; then echo ESCAPED: $(ls /mnt); fi; exit 1"]
"#
            )
        })
        .collect();
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: race}}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{{name: data, emptyDir: {{}}}}]
  initContainers:
  - name: plant
    image: {BUSYBOX}
    volumeMounts: [{{name: data, mountPath: /data}}]
    command: [sh, -c, "ln -s {host} /data/y"]
  containers:
  - name: racer
    image: {BUSYBOX}
    volumeMounts: [{{name: data, mountPath: /data}}]
    command: [sh, -c, "trap 'exit 0' TERM; cd /data; while true; do mkdir x; rmdir x; ln -s / x; rm x; done 2>/dev/null"]
  - name: maker
    image: {BUSYBOX}
    volumeMounts: [{{name: data, mountPath: /mnt, subPath: y/made}}]
    command: [sh, -c, "{FOREVER}"]
{victims}"#
    );
    node.write_manifest("race.yaml", &pod);
    // Every start of a victim is an attempt, whether nodelet refused it, the runtime failed it
    // or it ran; none may see outside the volume.
    let pod_logs = node.pod_logs();
    eventually(
        "the victims to be started 24 times",
        Duration::from_secs(150),
        || async {
            for i in 0..VICTIMS {
                let text =
                    crate::bed::read_container_logs(&pod_logs, "default_race-", &format!("v{i}"));
                assert!(
                    !text.contains("ESCAPED"),
                    "victim {i} saw outside its volume: {text}"
                );
            }
            let logs = crate::bed::logs();
            let attempts = logs
                .lines()
                .filter(|l| l.contains(r#"object="spec.containers{v"#))
                .filter(|l| {
                    l.contains(r#"event="Created""#)
                        || (l.contains(r#"event="Failed""#)
                            && l.contains("CreateContainerConfigError"))
                })
                .count();
            (attempts >= 24).then_some(())
        },
    )
    .await;
    let status = node.status("race").expect("the pod has a status");
    let maker = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "maker")
        .expect("the maker's status");
    let waiting = maker
        .state
        .as_ref()
        .and_then(|s| s.waiting.as_ref())
        .expect("the maker waits");
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    assert!(
        waiting
            .message
            .as_deref()
            .is_some_and(|m| m.contains("symlink")),
        "{waiting:?}"
    );
    assert!(
        !host_dir.join("made").exists(),
        "nodelet made a directory through the container's link"
    );
    node.finish().await;
}

#[tokio::test]
async fn a_sandbox_whose_uid_is_a_path_never_aims_the_cleanup_outside_the_root_dir() {
    let node = Node::start("uidpath", &[]).await;
    // Outside the node's root dir: an orphan whose UID is this path, or a way up to it, must
    // not make nodelet remove it.
    let victim = node.path("victim");
    std::fs::create_dir_all(&victim).expect("make the victim directory");
    std::fs::write(victim.join("keep"), "x").expect("write the victim file");
    // Pod dirs are `<test dir>/root/pods/<uid>`.
    let mut sandboxes = Vec::new();
    for (name, uid) in [
        ("abs", victim.display().to_string()),
        ("up", "../../victim".into()),
    ] {
        sandboxes.push(make_sandbox_with_uid(&node.name, name, &uid, true).await);
    }
    eventually(
        "nodelet to refuse both sandboxes",
        Duration::from_secs(30),
        || async {
            let logs = logs();
            (logs.matches("cannot be a path; it is left alone").count() >= 2).then_some(())
        },
    )
    .await;
    assert!(
        victim.join("keep").exists(),
        "the directory outside the root dir is untouched"
    );
    for id in &sandboxes {
        assert!(
            node.runtime.pod_sandbox_status(id).await.is_ok(),
            "a sandbox nodelet cannot name is left alone"
        );
        let _ = node.runtime.stop_pod_sandbox(id).await;
        let _ = node.runtime.remove_pod_sandbox(id).await;
    }
    node.finish().await;
}

/// A local user no one gave anything: no account, no groups.
const STRANGER: u32 = 40_001;

/// Runs `args` as the uid `user` with the gid `group` and no other groups (without blocking
/// the agent, which runs in the test's runtime).
async fn as_user(user: u32, group: u32, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new("setpriv")
        .arg(format!("--reuid={user}"))
        .arg(format!("--regid={group}"))
        .args(["--clear-groups", "--"])
        .args(args)
        .output()
        .await
        .expect("run setpriv")
}

#[tokio::test]
async fn a_local_user_reads_no_secret_key_or_volume_and_cannot_use_the_admin_socket() {
    use std::os::unix::fs::PermissionsExt;
    let port = crate::bed::free_port().to_string();
    let node = Node::start("modes", &["--port", &port, "--address", "127.0.0.1"]).await;
    // The test's own directory is open, as /var/lib is: only nodelet's modes stand in the way.
    std::fs::set_permissions(node.path(""), std::fs::Permissions::from_mode(0o755))
        .expect("open the test dir");
    node.write_manifest(
        "m.yaml",
        &format!(
            r#"apiVersion: v1
kind: Secret
metadata: {{name: s}}
stringData: {{token: hunter2}}
---
apiVersion: v1
kind: Pod
metadata: {{name: m}}
spec:
  volumes: [{{name: sec, secret: {{secretName: s}}}}, {{name: data, emptyDir: {{}}}}]
  containers:
  - name: c
    image: {BUSYBOX}
    volumeMounts: [{{name: sec, mountPath: /sec}}, {{name: data, mountPath: /data}}]
    command: [sh, -c, "echo private > /data/f; {FOREVER}"]
"#
        ),
    );
    node.wait_running("m", 1).await;
    let root = node.path("root");
    let pods = root.join("pods");
    let (secret, data) = eventually("the volumes' files", Duration::from_secs(30), || async {
        let pod = std::fs::read_dir(&pods).ok()?.flatten().next()?.path();
        let volumes = pod.join("volumes");
        let secret = volumes.join("kubernetes.io~secret/sec/token");
        let data = volumes.join("kubernetes.io~empty-dir/data/f");
        (secret.exists() && data.exists()).then_some((secret, data))
    })
    .await;
    let key = root.join("pki/kubelet.key");
    let readable = [&secret, &data, &key];
    for path in readable {
        let path = path.to_str().expect("a UTF-8 path");
        assert!(
            as_user(0, 0, &["cat", path]).await.status.success(),
            "root reads {path}"
        );
        let out = as_user(STRANGER, STRANGER, &["cat", path]).await;
        assert!(!out.status.success(), "a local user read {path}: {out:?}");
    }
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!((mode(&root), mode(&pods)), (0o750, 0o750));
    assert_eq!(mode(&key), 0o600);
    assert_eq!(
        mode(data.parent().unwrap()),
        0o777,
        "emptyDir stays open to the containers"
    );

    let cli = env!("CARGO_BIN_EXE_nodelet");
    let root_arg = root.to_str().expect("a UTF-8 path");
    let args = [cli, "get", "pods", "--root-dir", root_arg];
    let get = |user: u32, group: u32| as_user(user, group, &args);
    assert!(
        get(0, 0).await.status.success(),
        "root uses the admin socket"
    );
    assert!(
        !get(STRANGER, STRANGER).await.status.success(),
        "a local user used the admin socket"
    );
    // A careless operator opens the way to the socket: the kernel lets the user connect, and
    // nodelet, reading the peer's credentials, still refuses; the socket's group gets in.
    let socket = root.join("nodelet.sock");
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let refused = get(STRANGER, STRANGER).await;
    assert!(
        !refused.status.success(),
        "a local user used the admin socket: {refused:?}"
    );
    assert!(
        logs().contains("refused a connection to the admin socket"),
        "the refusal is logged"
    );
    std::os::unix::fs::chown(&socket, None, Some(STRANGER)).unwrap();
    let group = get(STRANGER + 1, STRANGER).await;
    assert!(
        group.status.success(),
        "the socket's group uses it: {group:?}"
    );
    node.finish().await;
}

#[tokio::test]
async fn a_probes_output_is_cut_to_10_kib_and_cannot_forge_a_log_line() {
    let node = Node::start("probeout", &[]).await;
    // 50 KiB of output, then a line dressed as nodelet's own.
    let probe = r#"head -c 51200 /dev/zero | tr '\\0' x; printf '\\n2026-12-02T00:00:00.000000Z  INFO nodelet: FORGED\\n'; exit 1"#;
    let yaml = crate::bed::pod_yaml("noisy", &[("c", FOREVER)], "").replacen(
        "    command:",
        &format!("    readinessProbe: {{exec: {{command: [sh, -c, \"{probe}\"]}}, periodSeconds: 1}}\n    command:"),
        1,
    );
    node.write_manifest("noisy.yaml", &yaml);
    let line = eventually(
        "the probe's failure event",
        Duration::from_secs(60),
        || async {
            logs()
                .lines()
                .find(|l| l.contains("Readiness probe failed"))
                .map(str::to_string)
        },
    )
    .await;
    assert!(
        line.len() < 11 * 1024,
        "the output is cut: {} bytes",
        line.len()
    );
    assert!(
        !logs()
            .lines()
            .any(|l| l.contains("FORGED") && !l.contains("Readiness probe failed")),
        "a container forged a log line"
    );
    node.finish().await;
}

/// The test process's peak resident memory (nodelet runs inside it), in MiB.
fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        / 1024
}

#[tokio::test]
async fn yaml_bombs_of_every_shape_are_refused_before_they_grow() {
    let node = Node::start("bombs", &[]).await;
    node.write_manifest(
        "good.yaml",
        &crate::bed::pod_yaml("good", &[("c", FOREVER)], ""),
    );
    let (good, _) = node.wait_running("good", 1).await;
    let before = peak_rss_mib();
    // Fat leaves: one anchor of 5,000 values named 5,000 times (25 million values from some
    // 50 KiB), where a Pod ignores it, inside a List's items, and as a container's args.
    let leaf = vec!["xx"; 5000].join(", ");
    let refs = vec!["*a"; 5000].join(", ");
    let pod = "apiVersion: v1
kind: Pod
metadata: {name: fat}
spec: {containers: [{name: c, image: i}]}
";
    let shapes = [
        (
            "ignored.yaml",
            format!("{pod}x: &a [{leaf}]\ny: [{refs}]\n"),
        ),
        (
            "list.yaml",
            format!(
                "apiVersion: v1
kind: List
z: &a [{leaf}]
items: [{refs}]
"
            ),
        ),
        (
            "args.yaml",
            format!(
                "apiVersion: v1
kind: Pod
metadata: {{name: args}}
x: &a {{{}}}
spec: {{containers: [{{name: c, image: i, env: [{refs}]}}]}}
",
                (0..5000)
                    .map(|i| format!("k{i}: v"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        // The nested kind: ten levels of ten.
        ("nested.yaml", {
            let mut b = format!("{pod}x0: &x0 [a, a, a, a, a, a, a, a, a, a]\n");
            for i in 1..10 {
                b += &format!(
                    "x{i}: &x{i} [{}]\n",
                    vec![format!("*x{}", i - 1); 10].join(", ")
                );
            }
            b
        }),
    ];
    for (file, text) in &shapes {
        node.write_manifest(file, text);
    }
    eventually("every bomb refused", Duration::from_secs(60), || async {
        let logs = logs();
        shapes
            .iter()
            .all(|(file, _)| {
                logs.lines().any(|l| {
                    l.contains(file)
                        && (l.contains("expands to more than") || l.contains("repetition limit"))
                })
            })
            .then_some(())
    })
    .await;
    let after = peak_rss_mib();
    assert!(
        after < 100 && after < before + 50,
        "peak RSS went from {before} MiB to {after} MiB"
    );
    let (still, _) = node.wait_running("good", 1).await;
    assert_eq!(still.id, good.id, "the good pod was never touched");
    node.finish().await;
}

#[tokio::test]
async fn a_negative_or_sub_byte_limit_is_refused_never_unlimited() {
    let node = Node::start("quantity", &[]).await;
    let pod = |name: &str, limits: &str, size: &str| {
        crate::bed::pod_yaml(
            name,
            &[("c", FOREVER)],
            &format!("  volumes: [{{name: v, emptyDir: {{medium: Memory, sizeLimit: {size}}}}}]\n"),
        )
        .replacen(
            "    command:",
            &format!("    resources: {{limits: {limits}}}\n    command:"),
            1,
        )
    };
    node.write_manifest("negative.yaml", &pod("negative", "{memory: -1Gi}", "1Mi"));
    node.write_manifest("fraction.yaml", &pod("fraction", "{memory: 500m}", "1Mi"));
    node.write_manifest("tmpfs.yaml", &pod("tmpfs", "{memory: 64Mi}", "-1"));
    node.write_manifest("fine.yaml", &pod("fine", "{memory: 64Mi}", "1Mi"));
    node.wait_running("fine", 1).await;
    let expected = [
        ("negative.yaml", "resources.limits[memory]"),
        ("fraction.yaml", "resources.limits[memory]"),
        ("tmpfs.yaml", "emptyDir.sizeLimit"),
    ];
    eventually(
        "each refusal, naming its field",
        Duration::from_secs(30),
        || async {
            let logs = logs();
            expected
                .iter()
                .all(|(file, field)| logs.lines().any(|l| l.contains(file) && l.contains(field)))
                .then_some(())
        },
    )
    .await;
    for name in ["negative", "fraction", "tmpfs"] {
        assert!(node.sandboxes(name).await.is_empty(), "{name} was run");
    }
    node.finish().await;
}

#[tokio::test]
async fn secret_values_never_reach_the_log_even_when_they_do_not_parse() {
    let node = Node::start("secretlog", &[]).await;
    let secret = |name: &str, data: &str| {
        format!(
            "apiVersion: v1
kind: Secret
metadata: {{name: {name}}}
{data}
"
        )
    };
    let files = [
        ("tag.yaml", secret("tag", "stringData: {k: !!int leak-one-x9q}")),
        ("binary.yaml", secret("binary", "data: {k: !!binary leak-two-x9q}")),
        ("base64.yaml", secret("b64", "data: {k: 'leak-three-x9q!'}")),
        ("list.yaml", secret("list", "stringData: {k: [leak-four-x9q]}")),
        ("pod.yaml", format!("{}---\n{}", secret("used", "stringData: {k: leak-five-x9q}"), crate::bed::pod_yaml("user", &[("c", FOREVER)], "").replace("    command:", "    env: [{name: S, valueFrom: {secretKeyRef: {name: used, key: k}}}]\n    command:"))),
    ];
    for (file, text) in &files {
        node.write_manifest(file, text);
    }
    node.wait_running("user", 1).await;
    eventually(
        "each broken file reported",
        Duration::from_secs(30),
        || async {
            let logs = logs();
            files[..4]
                .iter()
                .all(|(file, _)| {
                    logs.lines()
                        .any(|l| l.contains(file) && l.contains("invalid static pod manifest"))
                })
                .then_some(())
        },
    )
    .await;
    let logs = logs();
    assert!(!logs.contains("leak-"), "a Secret value reached the log");
    node.finish().await;
}

#[tokio::test]
async fn mounts_propagate_bidirectionally_from_a_privileged_container_and_into_others() {
    let node = Node::start("propagation", &[]).await;
    // The init container mounts a tmpfs in the shared volume; the app container, which only
    // receives mounts (HostToContainer), sees it and what was written in it.
    let yaml = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: prop}}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{{name: mnt, emptyDir: {{}}}}]
  initContainers:
  - name: mount
    image: {BUSYBOX}
    securityContext: {{privileged: true}}
    volumeMounts: [{{name: mnt, mountPath: /mnt, mountPropagation: Bidirectional}}]
    command: [sh, -c, "mkdir -p /mnt/t && mount -t tmpfs none /mnt/t && echo shared > /mnt/t/f"]
  containers:
  - name: app
    image: {BUSYBOX}
    volumeMounts: [{{name: mnt, mountPath: /in, mountPropagation: HostToContainer}}]
    command: [sh, -c, "trap 'exit 0' TERM; grep ' /in/t ' /proc/mounts | cut -d' ' -f3; cat /in/t/f; {FOREVER}"]
"#
    );
    node.write_manifest("prop.yaml", &yaml);
    let log = node.wait_log("prop", "app", "shared").await;
    assert!(
        log.contains("tmpfs"),
        "the tmpfs reached the app container: {log}"
    );
    let (sandbox, _) = node.wait_running("prop", 1).await;
    let on_host = node
        .path("root/pods")
        .join(&sandbox.uid.0)
        .join("volumes/kubernetes.io~empty-dir/mnt/t/f");
    assert_eq!(
        std::fs::read_to_string(&on_host).ok().as_deref(),
        Some("shared\n"),
        "the tmpfs reached the host"
    );
    // A non-privileged container may not propagate its mounts back.
    node.write_manifest(
        "bad.yaml",
        &yaml
            .replace("name: prop", "name: bad")
            .replace("securityContext: {privileged: true}", "securityContext: {}"),
    );
    eventually("the refusal", Duration::from_secs(30), || async {
        logs()
            .contains("Bidirectional mount propagation is available only to privileged containers")
            .then_some(())
    })
    .await;
    node.remove_manifest("prop.yaml");
    node.wait_gone(&sandbox.uid, Duration::from_secs(60)).await;
    assert!(!on_host.exists(), "the pod's mounts went with it");
    node.finish().await;
}

/// `hostUsers: false`: on containerd 2.x (whose runc handler reports user namespaces) each pod
/// gets its own range of 65536 host IDs mapped to root in the pod, kept in the pod's `userns`
/// file, and its volumes are ID-mapped so the files nodelet wrote as root are root's in the pod.
/// A pod without it shares the node's IDs. containerd 1.6 names no handler features: the pod is
/// refused with upstream's message.
#[tokio::test]
async fn host_users_false_gives_each_pod_its_own_user_namespace() {
    let node = Node::start("userns", &[]).await;
    let report = format!(
        "echo \"map=$(cat /proc/self/uid_map | tr -s ' ' | sed 's/^ //')\"; echo \"file=$(stat -c %u:%g /cm/k)\"; {FOREVER}"
    );
    let pod = |name: &str, host_users: &str| {
        format!(
            "apiVersion: v1
kind: ConfigMap
metadata: {{name: cm-{name}}}
data: {{k: v}}
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  hostUsers: {host_users}
  terminationGracePeriodSeconds: 2
  volumes: [{{name: cm, configMap: {{name: cm-{name}}}}}]
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, {}]
    volumeMounts: [{{name: cm, mountPath: /cm}}]
",
            serde_json::to_string(&report).expect("json")
        )
    };
    node.write_manifest("a.yaml", &pod("a", "false"));
    if !crate::bed::containerd2() {
        eventually(
            "the pod to be refused for want of user namespaces",
            Duration::from_secs(30),
            || async {
                logs()
                    .contains("Failed to create pod sandbox: can't set `spec.hostUsers: false`, runtime does not support user namespaces")
                    .then_some(())
            },
        )
        .await;
        assert!(node.sandboxes("a").await.is_empty());
        node.finish().await;
        return;
    }
    node.write_manifest("b.yaml", &pod("b", "false"));
    node.write_manifest("host.yaml", &pod("host", "true"));
    let mapped = |log: &str| -> (u64, u64, u64) {
        let line = log
            .lines()
            .find_map(|l| l.split("map=").nth(1))
            .unwrap_or_else(|| panic!("a uid_map line in {log}"));
        let n: Vec<u64> = line
            .split_whitespace()
            .map(|f| f.parse().expect("a number"))
            .collect();
        assert_eq!(n.len(), 3, "one mapping: {line}");
        (n[0], n[1], n[2])
    };
    let a = node.wait_log("a", "c", "file=").await;
    let b = node.wait_log("b", "c", "file=").await;
    let host = node.wait_log("host", "c", "file=").await;
    let (inside, first_a, length) = mapped(&a);
    assert_eq!((inside, length), (0, 65536), "{a}");
    assert!(first_a >= 65536 && first_a % 65536 == 0, "{a}");
    let (_, first_b, _) = mapped(&b);
    assert_ne!(first_a, first_b, "each pod has a range of its own");
    assert_eq!(mapped(&host), (0, 0, 4294967295), "{host}");
    for log in [&a, &b, &host] {
        assert!(
            log.contains("file=0:0"),
            "the volume's files are root's in the pod: {log}"
        );
    }
    let sandbox = node.wait_sandbox("a").await;
    let stored = std::fs::read_to_string(
        node.path("root")
            .join("pods")
            .join(&sandbox.uid.0)
            .join("userns"),
    )
    .expect("the pod's userns file");
    assert!(
        stored.contains(&format!(
            "\"hostId\":{first_a},\"containerId\":0,\"length\":65536"
        )),
        "{stored}"
    );
    node.finish().await;
}

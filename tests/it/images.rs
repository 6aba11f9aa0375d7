//! Image pulls through containerd from the test bed's loopback registries: pull policies, one
//! pull for two pods, ErrImagePull and ImagePullBackOff with growing gaps, a pull that succeeds
//! once the image is pushed, and node-level credentials for the registry with basic auth.

use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::PodStatus;

use crate::bed::{
    BUSYBOX, FOREVER, Node, copy_image, eventually, logs, pulls, registry, registry_login,
    unique_repo,
};

/// Removes the names (tags and digests) of the repository a test pulled from, so the runtime
/// holds only the test bed's own images again. Only the names: the CRI's RemoveImage would
/// remove the image with every name it has, the test bed's own `localhost/busybox:local` among
/// them (the registries hold the same content).
fn forget_images(image: &str) {
    let repo = image.rsplit_once(':').map_or(image, |(r, _)| r);
    let ctr = |args: &[&str]| {
        std::process::Command::new(
            std::env::var("NODELET_TEST_CTR").unwrap_or_else(|_| "ctr".into()),
        )
        .arg("-a")
        .arg(crate::bed::endpoint())
        .args(["-n", "k8s.io", "images"])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
    };
    for name in ctr(&["ls", "-q"]).lines() {
        if name.starts_with(&format!("{repo}:")) || name.starts_with(&format!("{repo}@")) {
            ctr(&["rm", name]);
        }
    }
}

/// A pod running `image` with `policy` that prints which busybox build it runs, then waits.
fn pod(name: &str, image: &str, policy: &str) -> String {
    let script = serde_json::to_string(
        "trap 'exit 0' TERM; echo \"stamp=$(cat /etc/nodelet-stamp 2>/dev/null || echo one)\"; while true; do sleep 1; done",
    )
    .expect("json");
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: {image}
    imagePullPolicy: {policy}
    command: [sh, -c, {script}]
"
    )
}

fn waiting(st: &PodStatus) -> Option<(String, String)> {
    let w = st
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .clone()?;
    Some((w.reason?, w.message.unwrap_or_default()))
}

#[tokio::test]
async fn pull_policies_against_a_registry() {
    let reg = registry(false);
    let repo = unique_repo("t-policy");
    let image = format!("{reg}/{repo}/app:v");
    copy_image(&format!("{reg}/library/busybox:1"), &image, None);
    let node = Node::start("imgpolicy", &[]).await;
    let before = pulls();
    // Two pods wanting one absent image cause one pull.
    node.write_manifest("a.yaml", &pod("first", &image, "IfNotPresent"));
    node.write_manifest("b.yaml", &pod("second", &image, "IfNotPresent"));
    node.wait_log("first", "c", "stamp=one").await;
    node.wait_log("second", "c", "stamp=one").await;
    assert_eq!(pulls() - before, 1, "one pull for two pods");

    // The tag moves to other content: IfNotPresent keeps what it has, Always pulls the new one.
    copy_image(&format!("{reg}/library/busybox:2"), &image, None);
    node.write_manifest("c.yaml", &pod("cached", &image, "IfNotPresent"));
    node.wait_log("cached", "c", "stamp=one").await;
    assert_eq!(pulls() - before, 1, "IfNotPresent did not pull");
    node.write_manifest("d.yaml", &pod("fresh", &image, "Always"));
    node.wait_log("fresh", "c", "stamp=two").await;
    assert_eq!(pulls() - before, 2, "Always pulled");

    // Never: an absent image is an error that names the policy; a bad name is InvalidImageName.
    node.write_manifest(
        "e.yaml",
        &pod("never", &format!("{reg}/{repo}/absent:1"), "Never"),
    );
    node.wait_status("never", "ErrImageNeverPull", |s| {
        waiting(s).is_some_and(|(r, m)| r == "ErrImageNeverPull" && m.contains("Never"))
    })
    .await;
    node.write_manifest("f.yaml", &pod("invalid", "Bad/Name:1", "IfNotPresent"));
    node.wait_status("invalid", "InvalidImageName", |s| {
        waiting(s).is_some_and(|(r, _)| r == "InvalidImageName")
    })
    .await;
    // The test bed's pre-imported image still runs without any registry, although the node
    // has pulled the same content under another name: its own name is not one the node pulled.
    node.write_manifest("g.yaml", &pod("local", BUSYBOX, "IfNotPresent"));
    node.wait_log("local", "c", "stamp=one").await;
    node.finish().await;
    forget_images(&image);
}

#[tokio::test]
async fn a_missing_image_backs_off_and_starts_once_pushed() {
    let reg = registry(false);
    let image = format!("{reg}/{}/app:1", unique_repo("t-missing"));
    let node = Node::start("imgmissing", &["--testing-backoff=1s"]).await;
    node.write_manifest("m.yaml", &pod("missing", &image, "IfNotPresent"));
    node.wait_status("missing", "ErrImagePull", |s| {
        waiting(s).is_some_and(|(r, m)| r == "ErrImagePull" && m.contains(&image))
    })
    .await;
    node.wait_status("missing", "ImagePullBackOff", |s| {
        waiting(s).is_some_and(|(r, m)| r == "ImagePullBackOff" && m.contains("Back-off pulling"))
    })
    .await;
    // The retries come by themselves, further and further apart.
    let mut attempts = vec![(pulls(), tokio::time::Instant::now())];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while attempts.len() < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "retries stopped: {attempts:?}"
        );
        let n = pulls();
        if n > attempts[attempts.len() - 1].0 {
            attempts.push((n, tokio::time::Instant::now()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1].1 - w[0].1).collect();
    assert!(
        gaps[2] > gaps[1],
        "gaps between pull attempts must grow: {gaps:?}"
    );
    // Once the image exists, the next retry pulls it and the pod starts without outside help.
    copy_image(&format!("{reg}/library/busybox:1"), &image, None);
    node.wait_log("missing", "c", "stamp=one").await;
    node.finish().await;
    forget_images(&image);
}

#[tokio::test]
async fn the_registry_with_auth_takes_node_credentials_which_are_never_logged() {
    let reg = registry(true);
    let (user, password) = registry_login();
    let login = format!("{user}:{password}");
    let image = format!("{reg}/private/{}:1", unique_repo("busybox"));
    copy_image(&format!("{reg}/private/busybox:1"), &image, Some(&login));
    let node = Node::start("imgauth", &["--testing-backoff=1s"]).await;
    node.write_manifest("p.yaml", &pod("private", &image, "IfNotPresent"));
    node.wait_status("private", "refused without credentials", |s| {
        waiting(s).is_some_and(|(r, _)| r == "ErrImagePull" || r == "ImagePullBackOff")
    })
    .await;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    // A wrong login for the whole host comes second: the more specific entry is tried first.
    let wrong = base64::engine::general_purpose::STANDARD.encode("nobody:wrong");
    std::fs::write(
        node.path("root/config.json"),
        format!(r#"{{"auths": {{"{reg}": {{"auth": "{wrong}"}}, "{reg}/private": {{"auth": "{auth}"}}}}}}"#),
    )
    .expect("config.json");
    node.wait_log("private", "c", "stamp=one").await;
    eventually("the pull to be logged", Duration::from_secs(10), || async {
        logs().contains("Successfully pulled image").then_some(())
    })
    .await;
    let logged = logs();
    assert!(
        !logged.contains(&password) && !logged.contains(&auth),
        "credentials reached the logs"
    );
    node.finish().await;
    forget_images(&image);
}

/// A slow proxy in front of the open registry that records, for each repository, when its
/// requests are in flight, so a test can see whether two pulls overlapped. Each request waits
/// a second, or, for a stalled proxy, until the test releases it.
struct SlowProxy {
    addr: String,
    hosts_dir: std::path::PathBuf,
    /// Per repository, how many requests are in flight; and the most repositories seen at once.
    state: std::sync::Arc<std::sync::Mutex<(std::collections::HashMap<String, usize>, usize)>>,
    /// Cancelled when a stalled proxy's requests may go on.
    release: tokio_util::sync::CancellationToken,
    stop: tokio_util::sync::CancellationToken,
}

/// How a [`SlowProxy`] holds requests back.
#[derive(Clone, Copy)]
enum Hold {
    /// Each request to a repository waits a second.
    Second,
    /// Each request to a repository hangs until released.
    Stalled,
    /// Blobs come at 200 KiB/s; after this many bytes of one, the rest waits until released
    /// (and then comes at once).
    Trickle { stall_after: usize },
}

/// A blob's bytes as a [`Hold::Trickle`] proxy sends them.
fn trickled(
    bytes: axum::body::Bytes,
    stall_after: usize,
    release: tokio_util::sync::CancellationToken,
) -> axum::body::Body {
    const CHUNK: usize = 50 << 10;
    let stream = futures_util::stream::unfold(0usize, move |sent| {
        let (bytes, release) = (bytes.clone(), release.clone());
        async move {
            if sent >= bytes.len() {
                return None;
            }
            let end = if release.is_cancelled() {
                bytes.len()
            } else if sent >= stall_after {
                release.cancelled().await;
                bytes.len()
            } else {
                tokio::time::sleep(Duration::from_millis(250)).await;
                (sent + CHUNK).min(stall_after).min(bytes.len())
            };
            Some((Ok::<_, std::io::Error>(bytes.slice(sent..end)), end))
        }
    });
    axum::body::Body::from_stream(stream)
}

impl SlowProxy {
    async fn start(upstream: String) -> SlowProxy {
        SlowProxy::with_hold(upstream, Hold::Second).await
    }

    /// A proxy whose requests hang until [`SlowProxy::release`].
    async fn stalled(upstream: String) -> SlowProxy {
        SlowProxy::with_hold(upstream, Hold::Stalled).await
    }

    async fn with_hold(upstream: String, hold: Hold) -> SlowProxy {
        use axum::body::Body;
        use axum::extract::{Request, State};
        use http_body_util::BodyExt;
        type Counts =
            std::sync::Arc<std::sync::Mutex<(std::collections::HashMap<String, usize>, usize)>>;
        type Shared = (String, Counts, Hold, tokio_util::sync::CancellationToken);
        async fn forward(
            State((upstream, state, hold, release)): State<Shared>,
            req: Request,
        ) -> axum::response::Response {
            let path = req
                .uri()
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default();
            // /v2/<repository>/(manifests|blobs)/<ref>
            let repo = path
                .strip_prefix("/v2/")
                .and_then(|p| {
                    p.split_once("/manifests/")
                        .or_else(|| p.split_once("/blobs/"))
                })
                .map(|(r, _)| r.to_string());
            // In flight until answered, or until the client gives up (the handler is dropped).
            struct Flight(Counts, String);
            impl Drop for Flight {
                fn drop(&mut self) {
                    *self.0.lock().unwrap().0.entry(self.1.clone()).or_default() -= 1;
                }
            }
            let flight = repo.as_ref().map(|r| {
                let mut s = state.lock().unwrap();
                *s.0.entry(r.clone()).or_default() += 1;
                let busy = s.0.values().filter(|n| **n > 0).count();
                s.1 = s.1.max(busy);
                Flight(state.clone(), r.clone())
            });
            match (&repo, hold) {
                (None, _) | (_, Hold::Trickle { .. }) => {}
                (Some(_), Hold::Stalled) => release.cancelled().await,
                (Some(_), Hold::Second) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
            let client =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<Body>();
            let (mut parts, body) = req.into_parts();
            parts.uri = format!("http://{upstream}{path}").parse().unwrap();
            parts.headers.remove(axum::http::header::HOST);
            let answer = client.request(Request::from_parts(parts, body)).await;
            drop(flight);
            match answer {
                Ok(resp) => {
                    let (parts, body) = resp.into_parts();
                    let bytes = body
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    let body = match hold {
                        Hold::Trickle { stall_after } if path.contains("/blobs/") => {
                            trickled(bytes, stall_after, release)
                        }
                        _ => Body::from(bytes),
                    };
                    axum::response::Response::from_parts(parts, body)
                }
                Err(_) => axum::response::Response::builder()
                    .status(502)
                    .body(Body::empty())
                    .unwrap(),
            }
        }
        let state = std::sync::Arc::new(std::sync::Mutex::new(Default::default()));
        let release = tokio_util::sync::CancellationToken::new();
        let app = axum::Router::new().fallback(forward).with_state((
            upstream,
            state.clone(),
            hold,
            release.clone(),
        ));
        let (addr, stop) = crate::bed::serve(app).await;
        let addr = addr.to_string();
        // containerd reads its hosts files at each pull: this one sends it to the proxy by HTTP.
        let certs =
            std::env::var("NODELET_TEST_REGISTRY_CERTS").expect("NODELET_TEST_REGISTRY_CERTS");
        let hosts_dir = std::path::Path::new(&certs).join(&addr);
        std::fs::create_dir_all(&hosts_dir).unwrap();
        std::fs::write(
            hosts_dir.join("hosts.toml"),
            format!("server = \"http://{addr}\"\n\n[host.\"http://{addr}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"),
        )
        .unwrap();
        SlowProxy {
            addr,
            hosts_dir,
            state,
            release,
            stop,
        }
    }

    fn most_at_once(&self) -> usize {
        self.state.lock().unwrap().1
    }

    /// How many requests are in flight.
    fn in_flight(&self) -> usize {
        self.state.lock().unwrap().0.values().sum()
    }

    fn release(&self) {
        self.release.cancel();
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.release.cancel();
        self.stop.cancel();
        let _ = std::fs::remove_dir_all(&self.hosts_dir);
    }
}

/// Deleting a pod gives up its pull: with its registry stalled, the pod is gone within 10 s
/// and the pull's request to the registry is abandoned.
#[tokio::test]
async fn deleting_a_pod_cancels_its_stalled_pull() {
    let reg = registry(false);
    let stalled = SlowProxy::stalled(reg.clone()).await;
    let image = absent_image(&reg, &stalled.addr, "t-imgcancel");
    let node = Node::start("imgcancel", &[]).await;
    node.write_manifest("stuck.yaml", &pod("stuck", &image, "IfNotPresent"));
    eventually("the stalled pull", Duration::from_secs(60), || async {
        (stalled.in_flight() > 0).then_some(())
    })
    .await;
    node.remove_manifest("stuck.yaml");
    let gone = eventually("the pod gone", Duration::from_secs(60), || async {
        node.sandboxes("stuck").await.is_empty().then_some(())
    });
    tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .expect("the pod was gone within 10 s");
    eventually("the pull given up", Duration::from_secs(10), || async {
        (stalled.in_flight() == 0).then_some(())
    })
    .await;
    node.finish().await;
    forget_images(&image);
}

/// `nodelet describe` says why a pod is not running, from the agent's own state: what its sync
/// waits on (a pull from a registry that stalls), its last sync error (a ConfigMap that is
/// not there), its probes' latest results; and the events outlive a restart of the agent.
#[tokio::test]
async fn describe_says_why_a_pod_is_not_running_and_events_outlive_a_restart() {
    let reg = registry(false);
    let stalled = SlowProxy::stalled(reg.clone()).await;
    let image = absent_image(&reg, &stalled.addr, "t-whynot");
    let mut node = Node::start("whynot", &[]).await;
    node.write_manifest("stuck.yaml", &pod("stuck", &image, "IfNotPresent"));
    node.write_manifest(
        "broken.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: broken}}
spec:
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, '{FOREVER}']
    env: [{{name: X, valueFrom: {{configMapKeyRef: {{name: missing, key: k}}}}}}]
"
        ),
    );
    node.write_manifest(
        "probed.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: probed}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, \"trap 'exit 0' TERM; {FOREVER}\"]
    readinessProbe: {{exec: {{command: [sh, -c, 'echo not yet; exit 1']}}, periodSeconds: 1}}
"
        ),
    );
    let describe = |name: &str| {
        let pod = node.pod_name(name);
        let node = &node;
        async move {
            let out = node
                .cli(&["describe", "pod", &pod])
                .output()
                .await
                .expect("the CLI runs");
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    let waiting = format!("registry {} to serve image", stalled.addr);
    eventually(
        "the stalled pull in describe",
        Duration::from_secs(60),
        || async {
            let text = describe("stuck").await;
            (text.contains("Waiting On:") && text.contains(&waiting)).then_some(())
        },
    )
    .await;
    eventually(
        "the sync error in describe",
        Duration::from_secs(60),
        || async {
            let text = describe("broken").await;
            (text.contains("Last Sync Error:") && text.contains("CreateContainerConfigError"))
                .then_some(())
        },
    )
    .await;
    eventually(
        "the failing probe in describe",
        Duration::from_secs(60),
        || async {
            let text = describe("probed").await;
            text.lines()
                .any(|l| {
                    l.contains("Readiness") && l.contains("failure x") && l.contains("not yet")
                })
                .then_some(())
        },
    )
    .await;
    // Gone before the restart, the broken pod's events can come back only from the journal.
    node.remove_manifest("broken.yaml");
    eventually("the broken pod gone", Duration::from_secs(60), || async {
        node.sandboxes("broken").await.is_empty().then_some(())
    })
    .await;
    node.stop_agent().await;
    node.restart(&[]).await;
    let broken = node.pod_name("broken");
    let out = node.cli(&["events"]).output().await.expect("the CLI runs");
    let events = String::from_utf8_lossy(&out.stdout);
    assert!(
        events
            .lines()
            .any(|l| l.contains(&broken) && l.contains("CreateContainerConfigError")),
        "{events}"
    );
    stalled.release();
    node.finish().await;
    forget_images(&image);
}

/// An absent image in the open registry `reg`, reached through `through` (the registry itself
/// or a proxy in front of it): busybox copied to a repository of the test's own.
fn absent_image(reg: &str, through: &str, name: &str) -> String {
    let repo_tag = format!("{}/app:1", unique_repo(name));
    copy_image(
        &format!("{reg}/library/busybox:1"),
        &format!("{reg}/{repo_tag}"),
        None,
    );
    format!("{through}/{repo_tag}")
}

/// Two pods with two absent images, through the slow proxy: how many pulls overlapped.
async fn pulls_at_once(test: &str, extra: &[&str]) -> usize {
    let reg = registry(false);
    let proxy = SlowProxy::start(reg.clone()).await;
    let images: Vec<String> = ["one", "two"]
        .iter()
        .map(|n| absent_image(&reg, &proxy.addr, &format!("t-{test}-{n}")))
        .collect();
    let node = Node::start(test, extra).await;
    node.write_manifest("one.yaml", &pod("one", &images[0], "IfNotPresent"));
    node.write_manifest("two.yaml", &pod("two", &images[1], "IfNotPresent"));
    node.wait_log("one", "c", "stamp=one").await;
    node.wait_log("two", "c", "stamp=one").await;
    node.finish().await;
    for image in &images {
        forget_images(image);
    }
    proxy.most_at_once()
}

#[tokio::test]
async fn pulls_overlap_by_default_and_are_serialized_when_asked() {
    assert_eq!(
        pulls_at_once("imgparallel", &[]).await,
        2,
        "both pulls at once"
    );
    assert_eq!(
        pulls_at_once("imgserial", &["--serialize-image-pulls=true"]).await,
        1,
        "one pull at a time"
    );
}

/// One pod's two containers with absent images: their pulls overlap.
#[tokio::test]
async fn a_pods_images_are_pulled_at_once() {
    let reg = registry(false);
    let proxy = SlowProxy::start(reg.clone()).await;
    let one = absent_image(&reg, &proxy.addr, "t-imgpod-one");
    let two = absent_image(&reg, &proxy.addr, "t-imgpod-two");
    let node = Node::start("imgpod", &[]).await;
    let script = "trap 'exit 0' TERM; echo started; while true; do sleep 1; done";
    node.write_manifest(
        "both.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: both
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: one
    image: {one}
    command: [sh, -c, "{script}"]
  - name: two
    image: {two}
    command: [sh, -c, "{script}"]
"#
        ),
    );
    node.wait_log("both", "one", "started").await;
    node.wait_log("both", "two", "started").await;
    node.finish().await;
    forget_images(&one);
    forget_images(&two);
    assert_eq!(proxy.most_at_once(), 2, "the pod's pulls overlapped");
}

/// A registry that stalls holds back only the pods that need it: a pod whose image is local and
/// a pod whose image is in another registry run while the stalled pull still hangs.
#[tokio::test]
async fn a_stalled_registry_holds_back_no_other_pod() {
    let reg = registry(false);
    let stalled = SlowProxy::stalled(reg.clone()).await;
    let stuck = absent_image(&reg, &stalled.addr, "t-imgstall-stuck");
    let elsewhere = absent_image(&reg, &reg, "t-imgstall-elsewhere");
    let node = Node::start("imgstall", &[]).await;
    node.write_manifest("stuck.yaml", &pod("stuck", &stuck, "IfNotPresent"));
    eventually("the stalled pull", Duration::from_secs(60), || async {
        (stalled.in_flight() > 0).then_some(())
    })
    .await;
    node.write_manifest("local.yaml", &pod("local", BUSYBOX, "IfNotPresent"));
    node.write_manifest(
        "elsewhere.yaml",
        &pod("elsewhere", &elsewhere, "IfNotPresent"),
    );
    // containerd gives up on a stalled request after about a minute, which would let a pull
    // queued behind it through: the others must run well before.
    let others = async {
        node.wait_log("local", "c", "stamp=one").await;
        node.wait_log("elsewhere", "c", "stamp=one").await;
    };
    tokio::time::timeout(Duration::from_secs(20), others)
        .await
        .expect("the other pods ran within 20 s");
    assert!(stalled.in_flight() > 0, "the stalled pull still hangs");
    stalled.release();
    node.wait_log("stuck", "c", "stamp=one").await;
    node.finish().await;
    forget_images(&stuck);
    forget_images(&elsewhere);
}

#[tokio::test]
async fn a_new_pod_shows_container_creating_while_its_image_is_pulled() {
    let reg = registry(false);
    let proxy = SlowProxy::start(reg.clone()).await;
    let repo_tag = format!("{}/app:1", unique_repo("t-creating"));
    copy_image(
        &format!("{reg}/library/busybox:1"),
        &format!("{reg}/{repo_tag}"),
        None,
    );
    let image = format!("{}/{repo_tag}", proxy.addr);
    let node = Node::start("creating", &[]).await;
    node.write_manifest("slow.yaml", &pod("slow", &image, "IfNotPresent"));
    // Each request of the pull takes a second: the pod is Pending while it runs.
    let pending = node
        .wait_status("slow", "Pending with its container creating", |st| {
            st.phase.as_deref() == Some("Pending")
                && waiting(st).is_some_and(|(reason, _)| reason == "ContainerCreating")
        })
        .await;
    assert!(pending.start_time.is_some(), "{pending:?}");
    node.wait_log("slow", "c", "stamp=one").await;
    node.wait_status("slow", "Running", |st| {
        st.phase.as_deref() == Some("Running")
    })
    .await;
    node.finish().await;
    forget_images(&image);
}

#[tokio::test]
async fn image_gc_removes_unused_images_and_keeps_used_and_sandbox_ones() {
    let reg = registry(false);
    let image = format!("{reg}/{}/app:1", unique_repo("t-gc"));
    // Other content than the test bed's busybox, so removing it touches no image in use.
    copy_image(&format!("{reg}/library/busybox:2"), &image, None);
    // Every image counts as over the threshold: only use, the sandbox image and the minimum
    // age protect one. The age gives the test's own pods time to start using their images.
    let node = Node::start(
        "imagegc",
        &[
            "--testing-image-gc-period=1s",
            "--image-gc-high-threshold",
            "1",
            "--image-gc-low-threshold",
            "0",
            "--minimum-image-ttl-duration",
            "10s",
        ],
    )
    .await;
    node.write_manifest("keep.yaml", &pod("keep", BUSYBOX, "IfNotPresent"));
    node.write_manifest("gone.yaml", &pod("gone", &image, "IfNotPresent"));
    node.wait_log("keep", "c", "stamp=one").await;
    let (gone, _) = node.wait_running("gone", 1).await;
    node.remove_manifest("gone.yaml");
    node.wait_gone(&gone.uid, Duration::from_secs(30)).await;
    eventually(
        "the unused image to be collected",
        Duration::from_secs(30),
        || async {
            node.runtime
                .image_status(&image)
                .await
                .ok()
                .and_then(|found| found.is_none().then_some(()))
        },
    )
    .await;
    let mut lost = Vec::new();
    for kept in [BUSYBOX, "localhost/pause:local"] {
        if node
            .runtime
            .image_status(kept)
            .await
            .ok()
            .flatten()
            .is_none()
        {
            lost.push(kept);
        }
    }
    node.finish().await;
    forget_images(&image);
    if !lost.is_empty() {
        // Put the test bed's images back before failing, so no later test fails for this one.
        let _ = std::process::Command::new("bash")
            .args(["hack/testbed.sh", "images"])
            .status();
    }
    assert!(
        lost.is_empty(),
        "{lost:?} were in use or the sandbox image and must have stayed"
    );
}

#[tokio::test]
async fn a_credential_provider_plugin_logs_in_to_the_registry_with_auth() {
    let reg = registry(true);
    let (user, password) = registry_login();
    let image = format!("{reg}/private/{}:1", unique_repo("busybox"));
    copy_image(
        &format!("{reg}/private/busybox:1"),
        &image,
        Some(&format!("{user}:{password}")),
    );
    // The plugin takes the user from its args and the password from its env, as configured,
    // writes each request it gets beside it, and answers for the registry's private path.
    let plugins = crate::bed::test_dir("credplugin-bin");
    let requests = plugins.path().join("requests");
    let plugin = plugins.path().join("registry-login");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\ncat >>{requests}\necho >>{requests}\n\
             printf '{{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"kind\":\"CredentialProviderResponse\",\
             \"cacheKeyType\":\"Registry\",\"cacheDuration\":\"1m\",\
             \"auth\":{{\"{reg}/private\":{{\"username\":\"%s\",\"password\":\"%s\"}}}}}}' \"$2\" \"$REGISTRY_PASSWORD\"\n",
            requests = requests.display()
        ),
    )
    .expect("plugin");
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let config = plugins.path().join("providers.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
             - name: registry-login\n  matchImages: [\"{reg}\"]\n  defaultCacheDuration: 10m\n\
             \x20 apiVersion: credentialprovider.kubelet.k8s.io/v1\n  args: [--user, \"{user}\"]\n\
             \x20 env: [{{name: REGISTRY_PASSWORD, value: \"{password}\"}}]\n"
        ),
    )
    .expect("config");
    let bin_dir = plugins.path().display().to_string();
    let config = config.display().to_string();
    let node = Node::start(
        "credplugin",
        &[
            "--image-credential-provider-config",
            &config,
            "--image-credential-provider-bin-dir",
            &bin_dir,
        ],
    )
    .await;
    node.write_manifest("p.yaml", &pod("private", &image, "IfNotPresent"));
    node.wait_log("private", "c", "stamp=one").await;
    let asked = std::fs::read_to_string(&requests).expect("the plugin was run");
    let request: serde_json::Value =
        serde_json::from_str(asked.lines().next().unwrap_or_default()).expect("a JSON request");
    assert_eq!(request["kind"], "CredentialProviderRequest");
    let repo = image.rsplit_once(':').map_or(image.as_str(), |(r, _)| r);
    assert_eq!(request["image"], repo, "the image without its tag");
    assert!(
        !logs().contains(&password),
        "the plugin's password reached the logs"
    );
    node.finish().await;
    forget_images(&image);
}

/// An image volume (`volumes[].image`): the image is pulled under the volume's pull policy and
/// the runtime mounts its contents read-only (CRI Mount.image, containerd 2.1 on). containerd
/// 1.6 predates the field and cannot create the container.
#[tokio::test]
async fn an_image_volume_mounts_the_images_contents_read_only() {
    let port = crate::bed::free_port();
    let node = Node::start("imagevol", &["--read-only-port", &port.to_string()]).await;
    let script = serde_json::to_string(
        "trap 'exit 0' TERM; if [ -x /img/bin/busybox ]; then echo found; fi; if touch /img/x 2>/dev/null; then echo writable; else echo read-only; fi; while true; do sleep 1; done",
    )
    .expect("json");
    node.write_manifest(
        "v.yaml",
        &format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: v}}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{{name: img, image: {{reference: {BUSYBOX}, pullPolicy: IfNotPresent}}}}]
  containers:
  - name: c
    image: {BUSYBOX}
    command: [sh, -c, {script}]
    volumeMounts: [{{name: img, mountPath: /img}}]
"
        ),
    );
    if crate::bed::containerd2() {
        let log = node.wait_log("v", "c", "read-only").await;
        assert!(log.contains("found"), "the image's files are there: {log}");
        let counted = [
            "kubelet_image_volume_requested_total 1",
            "kubelet_image_volume_mounted_succeed_total 1",
            "kubelet_image_volume_mounted_errors_total 0",
        ]
        .map(String::from);
        crate::bed::metrics_show(port, "the image volume counts", &counted).await;
    } else {
        node.wait_status("v", "CreateContainerError", |s: &PodStatus| {
            s.container_statuses.as_ref().is_some_and(|c| {
                c[0].state
                    .as_ref()
                    .and_then(|st| st.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    == Some("CreateContainerError")
            })
        })
        .await;
    }
    node.finish().await;
}

/// An image in the open registry whose layer no other image has (busybox with a stamp of its
/// own and `noise` random bytes, so the runtime must download all of it), named through
/// `through`.
fn unique_image(reg: &str, through: &str, name: &str, noise: usize) -> String {
    use std::io::Read as _;
    let repo = unique_repo(name);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let archive = dir.path().join("image.tar");
    let mut bytes = vec![0; noise];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("random bytes");
    let noise_file = dir.path().join("noise");
    std::fs::write(&noise_file, bytes).expect("the noise file");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/mkimage.py");
    let busybox = std::env::var("NODELET_BUSYBOX").unwrap_or_else(|_| "/bin/busybox".into());
    let built = std::process::Command::new("python3")
        .arg(script)
        .args(["busybox", "--busybox", &busybox, "--stamp", &repo])
        .arg("--add")
        .arg(format!("{}:/noise", noise_file.display()))
        .arg("--ref")
        .arg(format!("{reg}/{repo}:1"))
        .arg("--out")
        .arg(&archive)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("python3 runs");
    assert!(built.success(), "mkimage.py failed");
    let pushed = std::process::Command::new("skopeo")
        .args(["--insecure-policy", "copy", "-q", "--dest-tls-verify=false"])
        .arg(format!("oci-archive:{}", archive.display()))
        .arg(format!("docker://{reg}/{repo}:1"))
        .status()
        .expect("skopeo runs");
    assert!(pushed.success(), "skopeo could not push {repo}");
    format!("{through}/{repo}:1")
}

/// A pull shows its progress in bytes, in `nodelet describe` and in the pod's events, and a
/// pull whose download stands still for the progress deadline is cancelled with a reason that
/// names the registry, then retried after its backoff.
#[tokio::test]
async fn a_pulls_progress_shows_and_a_stalled_download_is_cancelled_naming_the_registry() {
    let reg = registry(false);
    // The runtime writes a download in steps of 1 MiB (containerd fills a buffer of that size
    // first), so the layer is over 4 MiB: it comes at 200 KiB/s, then nothing after 2.5 MiB
    // until released.
    let proxy = SlowProxy::with_hold(
        reg.clone(),
        Hold::Trickle {
            stall_after: 5 << 19,
        },
    )
    .await;
    let image = unique_image(&reg, &proxy.addr, "t-imgprogress", 4 << 20);
    let node = Node::start(
        "imgprogress",
        &["--image-pull-progress-deadline=5s", "--testing-backoff=1s"],
    )
    .await;
    node.write_manifest("slow.yaml", &pod("slow", &image, "IfNotPresent"));
    let pod_name = node.pod_name("slow");
    let cli = |args: &[&str]| {
        let mut cmd = node.cli(args);
        async move {
            let out = cmd.output().await.expect("the CLI runs");
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    eventually(
        "the pull's bytes in describe",
        Duration::from_secs(60),
        || async {
            let text = cli(&["describe", "pod", &pod_name]).await;
            text.lines()
                .any(|l| {
                    l.contains(" MiB received, the last") && !l.trim_start().starts_with("0.0 MiB")
                })
                .then_some(())
        },
    )
    .await;
    let progress_event = format!("from registry {}: ", proxy.addr);
    let cancelled = format!("no progress from registry {} for 5s", proxy.addr);
    eventually(
        "a progress event, then the stalled pull cancelled",
        Duration::from_secs(60),
        || async {
            let events = cli(&["events"]).await;
            let mine = |needle: &str| {
                events
                    .lines()
                    .any(|l| l.contains(&pod_name) && l.contains(needle))
            };
            (mine(&progress_event) && mine("received") && mine(&cancelled)).then_some(())
        },
    )
    .await;
    proxy.release();
    node.wait_log("slow", "c", "stamp=t-imgprogress").await;
    node.finish().await;
    forget_images(&image);
}

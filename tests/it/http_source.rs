//! The manifest URL source against a test server on loopback.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use tokio_util::sync::CancellationToken;

use crate::bed::{FOREVER, Node, eventually, pod_yaml};

/// What the test server answers, and what it saw.
#[derive(Default)]
struct Served {
    status: u16,
    body: Vec<u8>,
    delay: Duration,
    requests: usize,
    headers: Vec<HeaderMap>,
}

struct Server {
    url: String,
    served: Arc<Mutex<Served>>,
    stop: CancellationToken,
}

impl Server {
    async fn start() -> Server {
        let served = Arc::new(Mutex::new(Served {
            status: 200,
            ..Default::default()
        }));
        let app = axum::Router::new()
            .route("/pods", axum::routing::get(answer))
            .with_state(served.clone());
        let (addr, stop) = crate::bed::serve(app).await;
        let url = format!("http://{addr}/pods");
        Server { url, served, stop }
    }

    fn answer(&self, status: u16, body: impl Into<Vec<u8>>) {
        let mut s = self.served.lock().unwrap();
        s.status = status;
        s.body = body.into();
        s.delay = Duration::ZERO;
    }

    fn delay(&self, d: Duration) {
        self.served.lock().unwrap().delay = d;
    }

    fn requests(&self) -> usize {
        self.served.lock().unwrap().requests
    }

    /// Waits until the source has polled `n` more times.
    async fn polled(&self, n: usize) {
        let target = self.requests() + n;
        eventually(
            &format!("{n} more polls"),
            Duration::from_secs(60),
            || async { (self.requests() >= target).then_some(()) },
        )
        .await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn answer(
    State(served): State<Arc<Mutex<Served>>>,
    headers: HeaderMap,
) -> (StatusCode, Vec<u8>) {
    let (status, body, delay) = {
        let mut s = served.lock().unwrap();
        s.requests += 1;
        s.headers.push(headers);
        (s.status, s.body.clone(), s.delay)
    };
    tokio::time::sleep(delay).await;
    (StatusCode::from_u16(status).unwrap(), body)
}

fn pod_json(name: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "image": crate::bed::BUSYBOX,
                            "command": ["sh", "-c", format!("trap 'exit 0' TERM; {FOREVER}")]}]
        }
    })
}

#[tokio::test]
async fn a_pod_list_from_the_url_runs_and_the_headers_are_sent() {
    let server = Server::start().await;
    let list = serde_json::json!({"apiVersion": "v1", "kind": "PodList", "items": [pod_json("one"), pod_json("two")]});
    server.answer(200, serde_json::to_vec(&list).unwrap());
    let node = Node::start(
        "httplist",
        &[
            "--manifest-url",
            &server.url,
            "--manifest-url-header",
            "X-Provisioner:test",
            "--http-check-frequency",
            "1s",
        ],
    )
    .await;
    let (one, _) = node.wait_running("one", 1).await;
    node.wait_running("two", 1).await;
    assert_eq!(one.annotations["kubernetes.io/config.source"], "http");
    let headers = server.served.lock().unwrap().headers[0].clone();
    assert_eq!(
        headers.get("x-provisioner").and_then(|v| v.to_str().ok()),
        Some("test")
    );

    // A ConfigMap may come in the same body as the pod that uses it.
    let script = format!("echo v=$V; {FOREVER}");
    let three = pod_yaml("three", &[("c", &script)], "").replace(
        "    command:",
        "    env: [{name: V, valueFrom: {configMapKeyRef: {name: url-cfg, key: v}}}]\n    command:",
    );
    server.answer(
        200,
        format!(
            "apiVersion: v1
kind: ConfigMap
metadata: {{name: url-cfg}}
data: {{v: from-url}}
---
{three}"
        ),
    );
    node.wait_running("three", 1).await;
    node.wait_log("three", "c", "v=from-url").await;
    node.wait_gone(&one.uid, Duration::from_secs(30)).await;
    eventually(
        "only the new pod to be left",
        Duration::from_secs(30),
        || async { (node.all_sandboxes().await.len() == 1).then_some(()) },
    )
    .await;
    node.finish().await;
}

#[tokio::test]
async fn failures_keep_the_pods_and_an_empty_body_removes_them() {
    let server = Server::start().await;
    server.answer(200, pod_yaml("kept", &[("c", FOREVER)], ""));
    let node = Node::start(
        "httpfail",
        &[
            "--manifest-url",
            &server.url,
            "--http-check-frequency",
            "1s",
        ],
    )
    .await;
    let (kept, _) = node.wait_running("kept", 1).await;

    server.answer(500, "oops");
    server.polled(3).await;
    server.answer(200, "this is: [not a pod");
    server.polled(2).await;
    server.answer(200, vec![b' '; 11 * 1024 * 1024]);
    server.polled(2).await;
    server.answer(200, pod_yaml("kept", &[("c", FOREVER)], ""));
    server.delay(Duration::from_secs(12));
    server.polled(1).await;
    // The slow answer is abandoned after 10 s; the next poll starts after it.
    server.polled(1).await;
    server.delay(Duration::ZERO);
    let (still, _) = node.wait_running("kept", 1).await;
    assert_eq!(still.id, kept.id, "no failure touched the pod");

    server.answer(200, "");
    node.wait_gone(&kept.uid, Duration::from_secs(30)).await;
    node.finish().await;
}

#[tokio::test]
async fn file_and_url_sources_run_side_by_side_and_never_block_each_other() {
    let server = Server::start().await;
    server.answer(503, "not yet");
    let node = Node::start(
        "httpfile",
        &[
            "--manifest-url",
            &server.url,
            "--http-check-frequency",
            "1s",
        ],
    )
    .await;
    node.write_manifest("local.yaml", &pod_yaml("local", &[("c", FOREVER)], ""));
    node.wait_running("local", 1).await;
    server.answer(200, serde_json::to_vec(&serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "remote"}, "spec": pod_json("remote")["spec"]})).unwrap());
    node.wait_running("remote", 1).await;
    node.wait_running("local", 1).await;
    node.finish().await;
}

#[tokio::test]
async fn the_urls_credentials_stay_hidden_and_its_pods_get_no_local_secret() {
    let server = Server::start().await;
    let with_password = server.url.replacen("http://", "http://me:url-pw-7781@", 1);
    let pod = |name: &str| {
        pod_yaml(name, &[("c", FOREVER)], "").replace(
            "    command:",
            "    env: [{name: S, valueFrom: {secretKeyRef: {name: local, key: k}}}]\n    command:",
        )
    };
    server.answer(200, pod("remote"));
    let port = crate::bed::free_port().to_string();
    let args = [
        "--manifest-url",
        &with_password,
        "--manifest-url-header",
        "Authorization:Bearer hdr-pw-5523",
        "--http-check-frequency",
        "1s",
        "--port",
        &port,
        "--address",
        "127.0.0.1",
        "--anonymous-auth",
    ];
    let mut node = Node::start("urlcreds", &args).await;
    let secret = "apiVersion: v1
kind: Secret
metadata: {name: local}
stringData: {k: v}
";
    node.write_manifest("local.yaml", &format!("{secret}---\n{}", pod("beside")));
    node.wait_running("beside", 1).await;
    // The URL's pod may not use the directory's Secret: it waits, as for a missing one.
    node.wait_status("remote", "held for its Secret", |s| {
        s.container_statuses.iter().flatten().any(|c| {
            c.state
                .as_ref()
                .and_then(|st| st.waiting.as_ref())
                .is_some_and(|w| {
                    w.reason.as_deref() == Some("CreateContainerConfigError")
                        && w.message
                            .as_deref()
                            .is_some_and(|m| m.contains("\"local\" not found"))
                })
        })
    })
    .await;
    let api = crate::secure::Client::new(&node, port.parse().unwrap(), None);
    let (code, configz) = eventually("/configz", Duration::from_secs(30), || async {
        api.get("/configz").await.ok()
    })
    .await;
    assert_eq!(code, 200);
    assert!(
        configz.contains("me:xxxxx@") && configz.contains("\"Authorization\":[\"xxxxx\"]"),
        "{configz}"
    );
    let logs = crate::bed::logs();
    assert!(
        logs.contains("the manifest URL is plain http://"),
        "the plain URL is warned about"
    );
    for secret in ["url-pw-7781", "hdr-pw-5523"] {
        assert!(
            !configz.contains(secret) && !logs.contains(secret),
            "{secret} was shown"
        );
    }

    // The operator may let URL pods use the directory's Secrets.
    node.stop_agent().await;
    node.restart(&[&args[..], &["--manifest-url-local-secrets"]].concat())
        .await;
    node.wait_running("remote", 1).await;
    node.finish().await;
}

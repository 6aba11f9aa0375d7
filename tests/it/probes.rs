//! Liveness, readiness and startup probes against real containers. Probes of host-network
//! pods go to the node IP, set to loopback here so no traffic leaves the machine.

use k8s_openapi::api::core::v1::PodStatus;

use crate::bed::{FOREVER, Node, eventually, free_port, pod_yaml};

fn ready(s: &PodStatus) -> bool {
    s.conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn with_hostpath(yaml: String, dir: &std::path::Path, mount: &str) -> String {
    yaml.replacen(
        "  containers:\n",
        &format!(
            "  volumes: [{{name: m, hostPath: {{path: {}}}}}]\n  containers:\n",
            dir.display()
        ),
        1,
    )
    .replacen(
        "    command:",
        &format!("    volumeMounts: [{{name: m, mountPath: {mount}}}]\n    command:"),
        1,
    )
}

#[tokio::test]
async fn an_http_readiness_probe_follows_a_file_appearing_and_disappearing() {
    let node = Node::start("httpready", &["--node-ip", "127.0.0.1"]).await;
    let www = node.path("www");
    std::fs::create_dir_all(&www).unwrap();
    let port = free_port();
    let yaml = with_hostpath(
        pod_yaml("web", &[("httpd", &format!("httpd -f -p 127.0.0.1:{port} -h /www & {FOREVER}"))], "  hostNetwork: true\n"),
        &www,
        "/www",
    )
    .replacen(
        "    command:",
        &format!("    readinessProbe: {{httpGet: {{path: /ready, port: {port}}}, periodSeconds: 1, failureThreshold: 1}}\n    command:"),
        1,
    );
    node.write_manifest("web.yaml", &yaml);
    node.wait_running("web", 1).await;
    let st = node
        .wait_status("web", "running, not ready", |s| {
            s.phase.as_deref() == Some("Running") && !ready(s)
        })
        .await;
    assert!(!st.container_statuses.unwrap()[0].ready);
    std::fs::write(www.join("ready"), "ok").unwrap();
    node.wait_status("web", "Ready", ready).await;
    std::fs::remove_file(www.join("ready")).unwrap();
    node.wait_status("web", "not Ready again", |s| !ready(s))
        .await;
    node.finish().await;
}

#[tokio::test]
async fn a_failing_exec_liveness_probe_restarts_the_container() {
    let node = Node::start("liveness", &[]).await;
    let yaml = pod_yaml("live", &[("c", &format!("touch /tmp/healthy; sleep 2; rm /tmp/healthy; {FOREVER}"))], "").replacen(
        "    command:",
        "    livenessProbe: {exec: {command: [cat, /tmp/healthy]}, periodSeconds: 1, failureThreshold: 1, terminationGracePeriodSeconds: 1}\n    command:",
        1,
    );
    node.write_manifest("live.yaml", &yaml);
    let st = node
        .wait_status("live", "restarted once", |s| {
            s.container_statuses
                .as_ref()
                .is_some_and(|c| c[0].restart_count >= 1)
        })
        .await;
    let c = &st.container_statuses.unwrap()[0];
    assert!(c.last_state.as_ref().unwrap().terminated.is_some(), "{c:?}");
    node.finish().await;
}

#[tokio::test]
async fn a_startup_probe_holds_liveness_back_until_it_succeeds() {
    let node = Node::start("startup", &[]).await;
    let marks = node.path("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let yaml = with_hostpath(pod_yaml("slow", &[("c", FOREVER)], ""), &marks, "/m").replacen(
        "    command:",
        "    startupProbe: {exec: {command: [sh, -c, 'echo x >> /m/startup-runs; test -f /m/started']}, periodSeconds: 1, failureThreshold: 100}\n    livenessProbe: {exec: {command: [sh, -c, 'echo x >> /m/liveness-runs']}, periodSeconds: 1}\n    command:",
        1,
    );
    node.write_manifest("slow.yaml", &yaml);
    eventually(
        "the startup probe to run three times",
        std::time::Duration::from_secs(30),
        || async {
            let runs = std::fs::read_to_string(marks.join("startup-runs")).unwrap_or_default();
            (runs.lines().count() >= 3).then_some(())
        },
    )
    .await;
    assert!(
        !marks.join("liveness-runs").exists(),
        "liveness must wait for the startup probe"
    );
    let st = node.status("slow").unwrap();
    let c = &st.container_statuses.unwrap()[0];
    assert_eq!((c.started, c.ready), (Some(false), false));

    std::fs::write(marks.join("started"), "").unwrap();
    node.wait_status("slow", "started and ready", ready).await;
    eventually(
        "the liveness probe to run",
        std::time::Duration::from_secs(30),
        || async { marks.join("liveness-runs").exists().then_some(()) },
    )
    .await;
    node.finish().await;
}

#[tokio::test]
async fn a_tcp_socket_probe_checks_the_pod_ip() {
    let node = Node::start("tcpprobe", &[]).await;
    let yaml = pod_yaml("tcp", &[("c", &format!("mkdir -p /www; httpd -f -p 8080 -h /www & {FOREVER}"))], "").replacen(
        "    command:",
        "    ports: [{name: web, containerPort: 8080}]\n    readinessProbe: {tcpSocket: {port: web}, periodSeconds: 1}\n    command:",
        1,
    );
    node.write_manifest("tcp.yaml", &yaml);
    let st = node.wait_status("tcp", "Ready", ready).await;
    assert!(st.pod_ip.is_some());
    node.finish().await;
}

#[tokio::test]
async fn a_grpc_probe_asks_the_health_service() {
    let port = free_port();
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_shutdown(
                ([127, 0, 0, 1], port).into(),
                stop.clone().cancelled_owned(),
            ),
    );
    let node = Node::start("grpcprobe", &["--node-ip", "127.0.0.1"]).await;
    let yaml = pod_yaml("grpc", &[("c", FOREVER)], "  hostNetwork: true\n").replacen(
        "    command:",
        &format!("    readinessProbe: {{grpc: {{port: {port}}}, periodSeconds: 1, failureThreshold: 1}}\n    command:"),
        1,
    );
    node.write_manifest("grpc.yaml", &yaml);
    node.wait_status("grpc", "Ready", ready).await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    node.wait_status("grpc", "not Ready", |s| !ready(s)).await;
    node.finish().await;
    stop.cancel();
    let _ = server.await;
}

/// An `openssl s_server` on loopback with a throwaway self-signed certificate; killed on drop.
struct TlsServer(std::process::Child);

impl TlsServer {
    fn start(dir: &std::path::Path, port: u16) -> TlsServer {
        let (key, cert) = (dir.join("key.pem"), dir.join("cert.pem"));
        let made = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=localhost",
                "-days",
                "1",
                "-keyout",
            ])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl is installed (make deps)");
        assert!(made.success(), "openssl req failed");
        let child = std::process::Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(&cert)
            .arg("-key")
            .arg(&key)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start openssl s_server");
        TlsServer(child)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn an_https_probe_skips_certificate_verification_like_upstream() {
    let node = Node::start("httpsprobe", &["--node-ip", "127.0.0.1"]).await;
    let port = free_port();
    let server = TlsServer::start(node.dir.path(), port);
    let yaml = pod_yaml("tls", &[("c", FOREVER)], "  hostNetwork: true\n").replacen(
        "    command:",
        &format!("    readinessProbe: {{httpGet: {{scheme: HTTPS, path: /, port: {port}}}, periodSeconds: 1}}\n    command:"),
        1,
    );
    node.write_manifest("tls.yaml", &yaml);
    node.wait_status("tls", "Ready", ready).await;
    drop(server);
    node.finish().await;
}

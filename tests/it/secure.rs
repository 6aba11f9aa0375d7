//! The authenticated API on --port over TLS: client certificates, anonymous requests, the
//! container and node logs, /configz, exec proxied to the runtime's streaming server, and the
//! limits that keep idle and half-open connections from starving the servers.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::{self, ClientConfig, DigitallySignedStruct};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::bed::{FOREVER, Node, eventually, free_port, pod_yaml};
use crate::healthz::dechunk;

/// A CA and a client certificate it signed, as PEM files in `dir`; returns (ca, cert, key).
fn client_ca(dir: &Path, name: &str) -> (String, rcgen::Certificate, rcgen::KeyPair) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, format!("{name}-ca"));
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut client = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:admin");
    client.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = client.signed_by(&key, &issuer).unwrap();
    let path = dir.join(format!("{name}-ca.pem"));
    std::fs::write(&path, ca_cert.pem()).unwrap();
    (path.display().to_string(), cert, key)
}

/// Trusts exactly the certificate the node wrote to its pki dir (its self-signed one).
#[derive(Debug)]
struct Pinned(CertificateDer<'static>);

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.0.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General("not the pinned certificate".into()))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = rustls::crypto::ring::default_provider().signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, &algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = rustls::crypto::ring::default_provider().signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, &algs)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A client of one node's authenticated API, with or without a client certificate.
pub struct Client {
    port: u16,
    config: Arc<ClientConfig>,
}

impl Client {
    pub fn new(
        node: &Node,
        port: u16,
        identity: Option<(&rcgen::Certificate, &rcgen::KeyPair)>,
    ) -> Client {
        let pem =
            std::fs::read(node.path("root/pki/kubelet.crt")).expect("the self-signed certificate");
        let pinned = CertificateDer::from_pem_slice(&pem).expect("a PEM certificate");
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Pinned(pinned)));
        let config = match identity {
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    vec![cert.der().clone()],
                    PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        Client {
            port,
            config: Arc::new(config),
        }
    }

    async fn connect(&self) -> std::io::Result<TlsStream<tokio::net::TcpStream>> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
        TlsConnector::from(self.config.clone())
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
    }

    /// (status, body) of a GET sent exactly as written (no path normalisation).
    pub async fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        let mut s = self.connect().await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut out = Vec::new();
        // A refused client certificate shows as an error on the first read.
        s.read_to_end(&mut out).await?;
        let text = String::from_utf8_lossy(&out).into_owned();
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        Ok((
            code,
            if chunked {
                dechunk(body)
            } else {
                body.to_string()
            },
        ))
    }
}

/// A node whose authenticated API (on a free loopback port) lets anonymous requests in.
async fn open_node(test: &str) -> (Node, u16) {
    let port = free_port();
    let p = port.to_string();
    let args = ["--port", &p, "--address", "127.0.0.1", "--anonymous-auth"];
    (Node::start(test, &args).await, port)
}

#[tokio::test]
async fn the_authenticated_api_wants_a_certificate_from_the_client_ca() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = client_ca(dir.path(), "good");
    let (_, other_cert, other_key) = client_ca(dir.path(), "other");
    let p = port.to_string();
    let args = [
        "--port",
        &p,
        "--address",
        "127.0.0.1",
        "--client-ca-file",
        &ca,
        "--cgroup-driver",
        "systemd",
    ];
    let mut node = Node::start("secure-auth", &args).await;
    node.write_manifest("a.yaml", &pod_yaml("a", &[("app", FOREVER)], ""));
    node.wait_running("a", 1).await;

    let good = Client::new(&node, port, Some((&cert, &key)));
    let (code, body) = eventually("the API to answer", Duration::from_secs(30), || async {
        good.get("/pods").await.ok()
    })
    .await;
    assert_eq!(code, 200);
    let pods: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(pods["kind"], "PodList");
    assert_eq!(good.get("/healthz").await.unwrap(), (200, "ok".into()));
    let (code, configz) = good.get("/configz").await.unwrap();
    assert_eq!(code, 200);
    let configz: serde_json::Value = serde_json::from_str(&configz).unwrap();
    assert_eq!(configz["kubeletconfig"]["port"], port);
    // The driver in use (the runtime's), not the setting.
    assert_eq!(configz["kubeletconfig"]["cgroupDriver"], "cgroupfs");
    assert_eq!(
        configz["kubeletconfig"]["authentication"]["anonymous"]["enabled"],
        false
    );

    let anonymous = Client::new(&node, port, None);
    assert_eq!(anonymous.get("/pods").await.unwrap().0, 401);
    let stranger = Client::new(&node, port, Some((&other_cert, &other_key)));
    match stranger.get("/pods").await {
        Err(_) => {}
        Ok((code, _)) => assert_eq!(code, 401, "a certificate from another CA got in"),
    }

    node.stop_agent().await;
    let with_anonymous = [&args[..], &["--anonymous-auth"]].concat();
    node.restart(&with_anonymous).await;
    let anonymous = Client::new(&node, port, None);
    let (code, _) = eventually(
        "anonymous requests to get in",
        Duration::from_secs(30),
        || async { anonymous.get("/pods").await.ok() },
    )
    .await;
    assert_eq!(code, 200);
    let warning = "--anonymous-auth=true on a port open beyond this host";
    assert!(
        !crate::bed::logs().contains(warning),
        "loopback only: no warning"
    );

    // Open beyond the host (requests still go to loopback), the risk is named at start.
    node.stop_agent().await;
    let open = [&with_anonymous[..], &["--address", "0.0.0.0"]].concat();
    node.restart(&open).await;
    let logs = eventually("the warning", Duration::from_secs(30), || async {
        Some(crate::bed::logs()).filter(|l| l.contains(warning))
    })
    .await;
    assert!(
        logs.contains("AlwaysAllow lets anyone who reaches it exec"),
        "{logs}"
    );
    node.finish().await;
}

#[tokio::test]
async fn container_logs_and_node_logs_are_served_and_stay_inside_their_dirs() {
    let (node, port) = open_node("secure-logs").await;
    let script =
        "echo one; echo two; echo three; while [ ! -f /tmp/go ]; do sleep 0.2; done; echo four";
    node.write_manifest(
        "l.yaml",
        &pod_yaml("l", &[("app", script)], "  restartPolicy: Never\n"),
    );
    let (_, containers) = node.wait_running("l", 1).await;
    node.wait_log("l", "app", "three").await;
    let pod = node.pod_name("l");
    let api = Client::new(&node, port, None);
    let logs = |q: &str| format!("/containerLogs/default/{pod}/app{q}");
    // The pod is known to the API once its first sync has recorded a status.
    let (code, all) = eventually(
        "the API to serve the log",
        Duration::from_secs(30),
        || async {
            api.get(&logs(""))
                .await
                .ok()
                .filter(|(code, _)| *code == 200)
        },
    )
    .await;
    assert_eq!((code, all.as_str()), (200, "one\ntwo\nthree\n"));
    assert_eq!(
        api.get(&logs("?tailLines=2")).await.unwrap().1,
        "two\nthree\n"
    );
    assert_eq!(api.get(&logs("?limitBytes=5")).await.unwrap().1, "one\nt");
    // Out of range: a window before all time is the whole log, a wrong value the reader's error.
    assert_eq!(
        api.get(&logs("?sinceSeconds=9223372036854775807"))
            .await
            .unwrap(),
        (200, all.clone())
    );
    for bad in [
        "?sinceSeconds=0",
        "?sinceSeconds=-9223372036854775808",
        "?tailLines=-1",
        "?limitBytes=0",
        "?sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z",
        "?tailLines=99999999999999999999",
    ] {
        assert_eq!(api.get(&logs(bad)).await.unwrap().0, 400, "{bad}");
    }
    let (_, stamped) = api
        .get(&logs("?timestamps=true&tailLines=1"))
        .await
        .unwrap();
    let (time, line) = stamped.split_once(' ').unwrap();
    assert!(
        time.parse::<k8s_openapi::jiff::Timestamp>().is_ok() && line == "three\n",
        "{stamped}"
    );
    assert_eq!(api.get(&logs("?previous=true")).await.unwrap().0, 400);
    assert_eq!(
        api.get(&format!("/containerLogs/default/{pod}/nothing"))
            .await
            .unwrap()
            .0,
        404
    );
    assert_eq!(
        api.get("/containerLogs/default/..%2f..%2fetc/passwd")
            .await
            .unwrap()
            .0,
        404
    );

    // Follow: the line written after the request arrives, and the stream ends with the container.
    let mut follower = api.connect().await.unwrap();
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        logs("?follow=true")
    );
    follower.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("three") {
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(30), follower.read(&mut buf))
            .await
            .expect("the followed log starts")
            .unwrap();
        assert!(
            n > 0,
            "the follow ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    node.touch(&containers[0].id, "/tmp/go").await;
    tokio::time::timeout(Duration::from_secs(30), follower.read_to_end(&mut seen))
        .await
        .expect("the followed log ends with its container")
        .unwrap();
    let text = String::from_utf8_lossy(&seen);
    let body = dechunk(text.split_once("\r\n\r\n").unwrap().1);
    assert_eq!(body, "one\ntwo\nthree\nfour\n");

    // /logs/ lists and serves the node's log dir, and nothing outside it.
    let base = tempfile::Builder::new()
        .prefix("nodelet-it-")
        .tempdir_in("/var/log")
        .unwrap();
    std::fs::write(base.path().join("node.log"), "hello\n").unwrap();
    std::os::unix::fs::symlink("/etc", base.path().join("out")).unwrap();
    let name = base
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let (code, listing) = api.get("/logs/").await.unwrap();
    assert_eq!(code, 200);
    assert!(listing.contains(&format!("href=\"{name}/\"")), "{listing}");
    assert_eq!(
        api.get(&format!("/logs/{name}/node.log")).await.unwrap(),
        (200, "hello\n".into())
    );
    for escape in [
        format!("/logs/{name}/out/passwd"),
        "/logs/../etc/passwd".to_string(),
        "/logs/%2e%2e/etc/passwd".to_string(),
        "/logs/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd".to_string(),
        "/logs//etc/passwd".to_string(),
    ] {
        let (code, body) = api.get(&escape).await.unwrap();
        assert!(code == 404 || code == 400, "{escape} gave {code}: {body}");
        assert!(!body.contains("root:"), "{escape} leaked {body}");
    }
    // Names are escaped in the listing and encoded in the links; a FIFO is never opened.
    std::fs::write(base.path().join("javascript:alert(1)"), "x").unwrap();
    std::fs::write(base.path().join("\"><b>"), "x").unwrap();
    let fifo = std::ffi::CString::new(
        base.path()
            .join("pipe")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let (_, listing) = api.get(&format!("/logs/{name}/")).await.unwrap();
    assert!(
        listing.contains("href=\"javascript%3Aalert%281%29\""),
        "{listing}"
    );
    assert!(
        listing.contains("href=\"%22%3E%3Cb%3E\">&quot;&gt;&lt;b&gt;</a>"),
        "{listing}"
    );
    let (code, _) = tokio::time::timeout(
        Duration::from_secs(10),
        api.get(&format!("/logs/{name}/pipe")),
    )
    .await
    .expect("a FIFO never blocks the server")
    .unwrap();
    assert_eq!(code, 404);
    // A directory swapped for a link to /etc in a tight loop never leads out.
    let race = base.path().join("race");
    std::fs::create_dir(&race).unwrap();
    std::fs::write(race.join("passwd"), "inside\n").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racer = {
        let (stop, race) = (stop.clone(), race.clone());
        let parked = base.path().join("race.d");
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::fs::rename(&race, &parked);
                let _ = std::os::unix::fs::symlink("/etc", &race);
                let _ = std::fs::remove_file(&race);
                let _ = std::fs::rename(&parked, &race);
            }
        })
    };
    for _ in 0..400 {
        let (_, body) = api.get(&format!("/logs/{name}/race/passwd")).await.unwrap();
        assert!(!body.contains("root:"), "the race led out: {body}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    racer.join().unwrap();
    // The path the race asked for is served once the race is over: the refusals above were
    // the race's, not the path's. (How often the race lets a request through depends on the
    // machine's load, so it is not counted.)
    let (code, body) = api.get(&format!("/logs/{name}/race/passwd")).await.unwrap();
    assert_eq!((code, body.as_str()), (200, "inside\n"));
    node.finish().await;
}

#[tokio::test]
async fn exec_through_the_api_returns_the_output_and_exit_code() {
    let (node, port) = open_node("secure-exec").await;
    node.write_manifest("e.yaml", &pod_yaml("e", &[("app", FOREVER)], ""));
    let (_, containers) = node.wait_running("e", 1).await;
    // The API knows a pod once its first sync has recorded a status.
    node.wait_status("e", "recorded", |_| true).await;
    let pod = node.pod_name("e");
    let api = Client::new(&node, port, None);
    eventually("the API to answer", Duration::from_secs(30), || async {
        api.get("/healthz").await.ok()
    })
    .await;
    // The command ends once the test lets it, so the session is seen in flight first.
    let script = "echo hi; echo oops >&2; while [ ! -e /tmp/go ]; do sleep 0.1; done; exit 3";
    let script: String = script
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'0'..=b'9' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let url = format!(
        "wss://localhost:{port}/exec/default/{pod}/app?command=sh&command=-c&command={script}&output=1&error=1"
    );
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v4.channel.k8s.io".parse().unwrap(),
    );
    let tls = api.connect().await.unwrap();
    let (mut ws, response) = tokio_tungstenite::client_async(request, tls)
        .await
        .expect("the exec session upgrades");
    assert_eq!(
        response.headers().get("Sec-WebSocket-Protocol").unwrap(),
        "v4.channel.k8s.io"
    );
    let (mut stdout, mut stderr, mut status) = (Vec::new(), Vec::new(), None);
    let mut released = false;
    while let Some(Ok(message)) = tokio::time::timeout(Duration::from_secs(30), ws.next())
        .await
        .expect("exec output")
    {
        let Message::Binary(data) = message else {
            continue;
        };
        match data.split_first() {
            Some((1, rest)) => {
                stdout.extend_from_slice(rest);
                if !released {
                    in_flight_until_released(&api, &node, &containers[0].id).await;
                    released = true;
                }
            }
            Some((2, rest)) => stderr.extend_from_slice(rest),
            Some((3, rest)) => {
                status = Some(serde_json::from_slice::<serde_json::Value>(rest).unwrap());
                break;
            }
            _ => {}
        }
    }
    let _ = ws.close(None).await;
    drop(ws);
    assert_eq!(String::from_utf8_lossy(&stdout), "hi\n");
    assert_eq!(String::from_utf8_lossy(&stderr), "oops\n");
    let status = status.expect("a final status");
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["message"], "3", "{status}");
    // The stream over and the client gone, the request is no longer in flight.
    let done = format!("{EXEC_IN_FLIGHT} 0");
    eventually("the exec served", Duration::from_secs(10), || async {
        let (_, body) = api.get("/metrics").await.ok()?;
        body.lines().any(|l| l == done).then_some(())
    })
    .await;
    node.finish().await;
}

/// The in-flight gauge of exec requests to the authenticated server.
const EXEC_IN_FLIGHT: &str = "kubelet_http_inflight_requests{method=\"GET\",path=\"exec\",server_type=\"readwrite\",long_running=\"true\"}";

/// Waits until the running exec session shows in flight on `/metrics`, then lets its command
/// in `container` end.
async fn in_flight_until_released(api: &Client, node: &Node, container: &str) {
    let open = format!("{EXEC_IN_FLIGHT} 1");
    eventually("the exec in flight", Duration::from_secs(10), || async {
        let (_, body) = api.get("/metrics").await.ok()?;
        body.lines().any(|l| l == open).then_some(())
    })
    .await;
    let go = ["touch", "/tmp/go"].map(String::from).to_vec();
    let touched = node
        .runtime
        .exec_sync(container, go, Duration::from_secs(10));
    assert_eq!(touched.await.expect("exec touch").exit_code, 0);
}

/// CPU seconds this process has used (the in-process node's included).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest.split(' ').collect())
        .unwrap_or_default();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Descriptors this process has open (the in-process node's included).
fn descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Whether the server closed `stream` (end of file or reset), without waiting for it.
fn closed(stream: &tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match stream.try_read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

#[tokio::test]
async fn idle_and_half_open_connections_cannot_starve_the_servers() {
    let port = free_port();
    let healthz = free_port();
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = client_ca(dir.path(), "slow");
    let (p, h) = (port.to_string(), healthz.to_string());
    let args = [
        "--port",
        &p,
        "--address",
        "127.0.0.1",
        "--client-ca-file",
        &ca,
        "--healthz-port",
        &h,
    ];
    let node = Node::start("slowloris", &args).await;
    let client = Client::new(&node, port, Some((&cert, &key)));
    eventually("the API to answer", Duration::from_secs(30), || async {
        client.get("/healthz").await.ok()
    })
    .await;

    let fds_before = descriptors();
    // 2,000 connections: most never send a byte, some stop inside the TLS handshake, and a few
    // finish it and then send a request's headers one byte at a time, then stop.
    let mut silent = Vec::new();
    for target in [port, healthz] {
        for _ in 0..900 {
            silent.push(
                tokio::net::TcpStream::connect(("127.0.0.1", target))
                    .await
                    .expect("connect"),
            );
        }
    }
    let mut half_open = Vec::new();
    for _ in 0..180 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        // The start of a TLS ClientHello record.
        s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
            .await
            .expect("write");
        half_open.push(s);
    }
    let mut slow = Vec::new();
    for _ in 0..20 {
        let mut s = client.connect().await.expect("a TLS connection");
        s.write_all(b"GET /pods HTTP/1.1\r\nHost: loc")
            .await
            .expect("write");
        slow.push(s);
    }
    let (cpu_before, start) = (cpu_seconds(), std::time::Instant::now());

    // The servers keep answering, each within a second.
    let health_url = format!("http://127.0.0.1:{healthz}/healthz");
    for _ in 0..3 {
        let answer = tokio::time::timeout(Duration::from_secs(1), async {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", healthz)).await?;
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await?;
            let mut out = String::new();
            s.read_to_string(&mut out).await?;
            std::io::Result::Ok(out)
        })
        .await;
        let text = answer
            .unwrap_or_else(|_| panic!("{health_url} did not answer within a second"))
            .expect("healthz answers");
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        let answer = tokio::time::timeout(Duration::from_secs(1), client.get("/pods")).await;
        let (code, _) = answer
            .expect("the authenticated API answers within a second")
            .expect("the authenticated API answers");
        assert_eq!(code, 200);
    }

    // Connections that send nothing are closed once their deadline passes (the TLS handshake's
    // on the authenticated port, the request headers' on healthz), and so are the slow ones.
    eventually(
        "the idle and half-open connections to be closed",
        Duration::from_secs(60),
        || async {
            let open = silent
                .iter()
                .chain(&half_open)
                .filter(|s| !closed(s))
                .count();
            (open == 0).then_some(())
        },
    )
    .await;
    for s in &mut slow {
        let mut buf = [0u8; 512];
        let read = tokio::time::timeout(Duration::from_secs(60), s.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0) | Err(_))),
            "a request sent too slowly was not cut: {read:?}"
        );
    }
    // Holding them cost little CPU: under a tenth of a core on average.
    let cpu = cpu_seconds() - cpu_before;
    let elapsed = start.elapsed().as_secs_f64();
    assert!(
        cpu < 0.1 * elapsed,
        "{cpu:.2} CPU seconds in {elapsed:.1} s while holding idle connections"
    );
    // And the node's descriptors went with them.
    drop((silent, half_open, slow));
    let fds = descriptors();
    assert!(
        fds < fds_before + 50,
        "{fds} descriptors open, {fds_before} before"
    );
    node.finish().await;
}

#[tokio::test]
async fn followed_logs_are_capped_and_a_freed_slot_is_taken_again() {
    let (node, port) = open_node("secure-followers").await;
    // A line a second: a follower whose client went away learns it at its next write.
    let script = "while true; do echo tick; sleep 1; done";
    node.write_manifest("f.yaml", &pod_yaml("f", &[("app", script)], ""));
    node.wait_running("f", 1).await;
    node.wait_log("f", "app", "tick").await;
    let api = Client::new(&node, port, None);
    let path = format!(
        "/containerLogs/default/{}/app?follow=true",
        node.pod_name("f")
    );
    let follow = || async {
        let mut stream = api.connect().await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut buf = [0u8; 1024];
            let n = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buf))
                .await
                .expect("an answer")
                .unwrap();
            assert!(n > 0, "closed before the headers");
            head.extend_from_slice(&buf[..n]);
        }
        let code: u16 = String::from_utf8_lossy(&head)[9..12].parse().unwrap();
        (code, stream)
    };
    let mut followers = Vec::new();
    for _ in 0..nodelet::server::logs::MAX_FOLLOWERS {
        let (code, stream) = follow().await;
        assert_eq!(code, 200);
        followers.push(stream);
    }
    assert_eq!(follow().await.0, 429, "one follower too many");
    let (code, _) = api
        .get(&path.replace("follow=true", "tailLines=1"))
        .await
        .unwrap();
    assert_eq!(code, 200, "reading without following is not capped");
    drop(followers.pop());
    let (code, _again) = eventually("the freed slot", Duration::from_secs(30), || async {
        let (code, stream) = follow().await;
        (code == 200).then_some((code, stream))
    })
    .await;
    assert_eq!(code, 200);
    node.finish().await;
}

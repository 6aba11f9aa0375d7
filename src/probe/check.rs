//! One probe attempt: exec (CRI ExecSync), httpGet (a small HTTP/1.1 GET, same-host redirects
//! followed), tcpSocket (connect) and grpc (grpc.health.v1 Check).

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use crate::runtime::RuntimeClient;

/// What a probe runs against.
pub struct Target<'a> {
    pub container_id: &'a str,
    /// Host for httpGet without a host, tcpSocket without a host, and grpc.
    pub pod_ip: &'a str,
    pub ports: &'a [ContainerPort],
}

/// Resolves a numbered or named port of the container.
fn port(p: &IntOrString, ports: &[ContainerPort]) -> Result<u16, String> {
    let number = match p {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => match name.parse::<i32>() {
            Ok(n) => n,
            Err(_) => ports
                .iter()
                .find(|cp| cp.name.as_deref() == Some(name))
                .map(|cp| cp.container_port)
                .ok_or_else(|| format!("no container port named {name:?}"))?,
        },
    };
    u16::try_from(number)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("invalid port {number}"))
}

/// How much of an exec probe's or hook's output is kept, as upstream (10 KiB).
const MAX_OUTPUT: usize = 10 * 1024;

/// A command's output as a failure reports it: its first 10 KiB (stdout, then stderr), with
/// control characters escaped.
fn output(stdout: &[u8], stderr: &[u8]) -> String {
    let both: Vec<u8> = stdout
        .iter()
        .chain(stderr)
        .take(MAX_OUTPUT)
        .copied()
        .collect();
    let text = String::from_utf8_lossy(&both);
    crate::types::printable(text.trim()).into_owned()
}

/// An exec's success (exit code 0), or its exit code and output.
pub fn exec_outcome(out: &crate::runtime::cri::ExecSyncResponse) -> Result<(), String> {
    if out.exit_code == 0 {
        Ok(())
    } else {
        Err(format!(
            "exit code {}: {}",
            out.exit_code,
            output(&out.stdout, &out.stderr)
        ))
    }
}

/// A successful attempt that has something to say (upstream's probe.Warning): an HTTP probe
/// redirected to another host, whose redirect is not followed.
pub type Warning = Option<String>;

/// Runs one attempt; `Err` carries the failure's description.
pub async fn attempt(
    probe: &Probe,
    target: &Target<'_>,
    runtime: &RuntimeClient,
) -> Result<Warning, String> {
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    if let Some(exec) = &probe.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        let out = runtime
            .exec_sync(target.container_id, cmd, timeout)
            .await
            .map_err(|e| e.to_string())?;
        return exec_outcome(&out).map(|()| None);
    }
    if let Some(http) = &probe.http_get {
        let host = http
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| target.pod_ip.to_string());
        let port = port(&http.port, target.ports)?;
        let tls = http
            .scheme
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"));
        let path = http.path.clone().unwrap_or_else(|| "/".into());
        let headers: Vec<(String, String)> = http
            .http_headers
            .iter()
            .flatten()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect();
        return bounded(timeout, http_get(tls, host, port, path, headers)).await;
    }
    if let Some(tcp) = &probe.tcp_socket {
        let host = tcp
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| target.pod_ip.to_string());
        let port = port(&tcp.port, target.ports)?;
        let connect = async move {
            TcpStream::connect((host.as_str(), port))
                .await
                .map(|_| None)
                .map_err(|e| format!("dial tcp {host}:{port}: {e}"))
        };
        return bounded(timeout, connect).await;
    }
    if let Some(grpc) = &probe.grpc {
        let addr = format!("http://{}:{}", bracket(target.pod_ip), grpc.port);
        let service = grpc.service.clone().unwrap_or_default();
        let check = async move { grpc_check(addr, service).await.map(|()| None) };
        return bounded(timeout, check).await;
    }
    Err("the probe has no handler".into())
}

async fn bounded(
    timeout: Duration,
    fut: impl Future<Output = Result<Warning, String>>,
) -> Result<Warning, String> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(format!("timed out after {timeout:?}")),
    }
}

fn bracket(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// GET with upstream's rules: 200-399 is success; redirects are followed (up to 10) only to the
/// same host, a redirect elsewhere counts as success with a warning that carries its body.
async fn http_get(
    tls: bool,
    host: String,
    port: u16,
    mut path: String,
    headers: Vec<(String, String)>,
) -> Result<Warning, String> {
    let scheme = if tls { "https" } else { "http" };
    for _ in 0..10 {
        let stream = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("dial tcp {host}:{port}: {e}"))?;
        let reply = if tls {
            get_once(
                tls_connect(stream, &host).await?,
                &host,
                port,
                &path,
                &headers,
            )
            .await?
        } else {
            get_once(stream, &host, port, &path, &headers).await?
        };
        match reply {
            (300..=399, Some(loc), body) => {
                let same_host = [
                    format!("{scheme}://{host}:{port}"),
                    format!("{scheme}://{host}"),
                ];
                // The rest must start a path: `http://10.0.0.5` is no prefix of `http://10.0.0.55/`.
                let rest = same_host.iter().find_map(|p| {
                    loc.strip_prefix(p.as_str())
                        .filter(|r| r.is_empty() || r.starts_with('/'))
                });
                if let Some(rest) = rest {
                    path = if rest.is_empty() {
                        "/".into()
                    } else {
                        rest.to_string()
                    };
                } else if loc.starts_with('/') {
                    path = loc;
                } else {
                    return Ok(Some(format!(
                        "Probe terminated redirects, Response body: {body}"
                    )));
                }
            }
            (200..=399, ..) => return Ok(None),
            (code, ..) => return Err(format!("HTTP probe failed with statuscode: {code}")),
        }
    }
    Err("stopped after 10 redirects".into())
}

/// TLS without verifying the server's certificate, as upstream's HTTPS probes do.
async fn tls_connect(
    stream: TcpStream,
    host: &str,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
        .with_no_client_auth();
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| format!("invalid TLS server name {host:?}: {e}"))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
        .map_err(|e| format!("TLS handshake with {host}: {e}"))
}

/// Accepts any server certificate; handshake signatures are still checked.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// One GET: the status code, the Location header and the body's first 10 KiB (as upstream
/// keeps it).
async fn get_once(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> Result<(u16, Option<String>, String), String> {
    let mut request = format!("GET {path} HTTP/1.1\r\n");
    let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    if !has("Host") {
        request += &format!("Host: {}:{port}\r\n", bracket(host));
    }
    if !has("User-Agent") {
        request += "User-Agent: kube-probe/1.34\r\n";
    }
    if !has("Accept") {
        request += "Accept: */*\r\n";
    }
    for (k, v) in headers {
        request += &format!("{k}: {v}\r\n");
    }
    request += "Connection: close\r\n\r\n";
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        let n = stream.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let body_at = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(head.len(), |i| i + 4);
    let mut body = head.split_off(body_at);
    while body.len() < MAX_OUTPUT {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&buf[..n]),
        }
    }
    body.truncate(MAX_OUTPUT);
    let body = String::from_utf8_lossy(&body).into_owned();
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.split("\r\n");
    let code = lines
        .next()
        .and_then(|status| status.split_whitespace().nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| "malformed HTTP response".to_string())?;
    let location = lines
        .take_while(|l| !l.is_empty())
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.trim().eq_ignore_ascii_case("location"))
        })
        .map(|(_, v)| v.trim().to_string());
    Ok((code, location, body))
}

async fn grpc_check(addr: String, service: String) -> Result<(), String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let channel = tonic::transport::Endpoint::from_shared(addr.clone())
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest { service })
        .await
        .map_err(|e| format!("health check: {}", e.message()))?
        .into_inner();
    if reply.status == ServingStatus::Serving as i32 {
        Ok(())
    } else {
        Err(format!(
            "service unhealthy (responded with {:?})",
            ServingStatus::try_from(reply.status).unwrap_or(ServingStatus::Unknown)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_cut_at_10_kib_and_cannot_break_a_line() {
        let long = vec![b'x'; 50 * 1024];
        assert_eq!(output(&long, b"never shown").len(), MAX_OUTPUT);
        assert_eq!(
            output(b"bad\n2026-12-02T00:00:00Z INFO forged\x1b[2J", b"\r\n"),
            "bad\\n2026-12-02T00:00:00Z INFO forged\\u{1b}[2J"
        );
    }

    #[test]
    fn ports_resolve_by_number_and_name() {
        let ports = vec![ContainerPort {
            name: Some("http".into()),
            container_port: 8080,
            ..Default::default()
        }];
        assert_eq!(port(&IntOrString::Int(80), &ports), Ok(80));
        assert_eq!(port(&IntOrString::String("http".into()), &ports), Ok(8080));
        assert_eq!(port(&IntOrString::String("81".into()), &ports), Ok(81));
        assert!(port(&IntOrString::String("nope".into()), &ports).is_err());
        assert!(port(&IntOrString::Int(0), &ports).is_err());
    }

    /// A loopback server answering each connection with the next of `replies`.
    async fn serve(replies: Vec<&'static str>) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for reply in replies {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut request = [0u8; 4096];
                let _ = conn.read(&mut request).await;
                let _ = conn.write_all(reply.as_bytes()).await;
            }
        });
        port
    }

    #[tokio::test]
    async fn http_probes_follow_same_host_redirects_and_warn_about_others() {
        let elsewhere = "HTTP/1.1 302 Found\r\nLocation: http://0.0.0.0/\r\n\r\n<a href=\"http://0.0.0.0/\">Found</a>.\n";
        let port = serve(vec![elsewhere]).await;
        let got = http_get(false, "127.0.0.1".into(), port, "/redirect".into(), vec![]).await;
        assert_eq!(
            got,
            Ok(Some(
                "Probe terminated redirects, Response body: <a href=\"http://0.0.0.0/\">Found</a>.\n".into()
            ))
        );

        let here = "HTTP/1.1 301 Moved\r\nLocation: /healthz\r\n\r\n";
        let broken = "HTTP/1.1 500 Oops\r\n\r\n";
        let port = serve(vec![here, broken]).await;
        let got = http_get(false, "127.0.0.1".into(), port, "/".into(), vec![]).await;
        assert_eq!(got, Err("HTTP probe failed with statuscode: 500".into()));
    }
}

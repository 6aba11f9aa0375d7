//! The authenticated API on --port (10250) over TLS, as the upstream kubelet serves it:
//! client certificates signed by --client-ca-file, bearer tokens the API server vouches for, and
//! anonymous requests only with --anonymous-auth get in, and are authorized (`auth`); then
//! everything the read-only API has, plus /containerLogs, /logs/,
//! /configz, and /exec, /attach, /portForward, which are proxied to the runtime's streaming
//! server. Without --tls-cert-file a self-signed pair is made in `<root-dir>/pki`.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::{auth, logs};
use crate::runtime::{RuntimeClient, cri};
use crate::status;

/// Why the server cannot start; each names the file involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {what} {}: {why}", .path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("cannot write the self-signed serving certificate to {}", .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot make a self-signed serving certificate: {0}")]
    Generate(String),
    #[error("invalid TLS setup: {0}")]
    Tls(String),
}

/// Where the server's certificate, key and client CA come from.
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// The self-signed pair `<root-dir>/pki/kubelet.{crt,key}` for `node`, made on first start
/// (upstream's names and place), for when no --tls-cert-file is given.
pub fn self_signed(root_dir: &Path, node: &str) -> Result<(PathBuf, PathBuf), Error> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = root_dir.join("pki");
    let (cert, key) = (dir.join("kubelet.crt"), dir.join("kubelet.key"));
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Write { path, source }
    };
    crate::volumes::private_dir(&dir).map_err(write_err(&dir))?;
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    let generate = |e: rcgen::Error| Error::Generate(e.to_string());
    let pair = rcgen::KeyPair::generate().map_err(generate)?;
    let names = vec![node.to_string(), "localhost".into(), "127.0.0.1".into()];
    let mut params = rcgen::CertificateParams::new(names).map_err(generate)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{node}@nodelet"));
    let made = params.self_signed(&pair).map_err(generate)?;
    // The key is private from its first byte: made 0600, never opened up and then narrowed.
    let _ = std::fs::remove_file(&key);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&key)
        .and_then(|mut f| f.write_all(pair.serialize_pem().as_bytes()))
        .map_err(write_err(&key))?;
    std::fs::write(&cert, made.pem()).map_err(write_err(&cert))?;
    Ok((cert, key))
}

/// The TLS configuration: our pair, and client certificates verified against the client CA
/// when they are offered (a connection without one gets in as anonymous, refused later unless
/// --anonymous-auth).
pub fn tls_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, Error> {
    let read = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |e: rustls::pki_types::pem::Error| Error::Read {
            what,
            path,
            why: e.to_string(),
        }
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(read("certificate", &files.cert))?
        .collect::<Result<_, _>>()
        .map_err(read("certificate", &files.cert))?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(read("private key", &files.key))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).map_err(read("client CA", ca))? {
                roots
                    .add(cert.map_err(read("client CA", ca))?)
                    .map_err(|e| Error::Read {
                        what: "client CA",
                        path: ca.clone(),
                        why: e.to_string(),
                    })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| Error::Tls(format!("client CA {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| Error::Tls(format!("{}: {e}", files.cert.display())))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What the authenticated API's own endpoints read.
#[derive(Clone)]
pub struct Handles {
    pub runtime: RuntimeClient,
    pub statuses: status::Reader,
    /// The node's log dir served under /logs/ (upstream: /var/log).
    pub log_dir: PathBuf,
    /// /configz's body.
    pub configz: serde_json::Value,
}

fn text(code: StatusCode, message: impl std::fmt::Display) -> Response {
    (code, format!("{message}\n")).into_response()
}

fn flag(query: &[(String, String)], name: &str) -> bool {
    query
        .iter()
        .any(|(k, v)| k == name && matches!(v.as_str(), "1" | "true" | "True"))
}

fn value<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn query_of(req: &Request) -> Vec<(String, String)> {
    form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

fn log_error(e: logs::Error) -> Response {
    let code = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    text(code, crate::types::error_chain(&e))
}

/// The query options of /containerLogs, as upstream names them.
fn log_options(query: &[(String, String)]) -> Result<logs::Options, String> {
    let number = |name: &str| -> Result<Option<i64>, String> {
        value(query, name)
            .map(|v| {
                v.parse::<i64>()
                    .map_err(|_| format!("{name}: {v:?} is not a number"))
            })
            .transpose()
    };
    logs::Query {
        follow: flag(query, "follow"),
        previous: flag(query, "previous"),
        timestamps: flag(query, "timestamps"),
        since_seconds: number("sinceSeconds")?,
        since_time: value(query, "sinceTime"),
        tail_lines: number("tailLines")?,
        limit_bytes: number("limitBytes")?,
    }
    .options()
}

/// /containerLogs/{namespace}/{pod}/{container} with upstream's query options.
async fn container_logs(
    State(h): State<Handles>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    req: Request,
) -> Response {
    let options = match log_options(&query_of(&req)) {
        Ok(o) => o,
        Err(why) => return text(StatusCode::BAD_REQUEST, why),
    };
    let found = match logs::locate(
        &h.runtime,
        &h.statuses,
        &namespace,
        &pod,
        Some(&container),
        options.previous,
    )
    .await
    {
        Ok(found) => found,
        Err(e) => return log_error(e),
    };
    match logs::open(&h.runtime, &found, options).await {
        Ok(chunks) => {
            let stream = tokio_stream::StreamExt::map(ReceiverStream::new(chunks), |c| {
                Ok::<_, std::convert::Infallible>(c)
            });
            (
                [(header::CONTENT_TYPE, "text/plain")],
                Body::from_stream(stream),
            )
                .into_response()
        }
        Err(e) => log_error(e),
    }
}

/// What a /logs/ path names: a directory's entries (directories marked with a trailing `/`),
/// or an open regular file.
enum LogPath {
    Dir(Vec<String>),
    File(std::fs::File),
}

/// Opens what `wanted` names under the log dir, or says why not (as a status). Links are
/// followed while they stay inside (container log links point into the pod log dir), then the
/// resolved path is opened beneath the log dir component by component without following any
/// link, so a link swapped in meanwhile is refused rather than followed out. Only directories
/// and regular files are served: a FIFO or a device never is.
fn open_log_path(log_dir: &Path, wanted: &str) -> Result<LogPath, StatusCode> {
    use std::os::fd::AsRawFd as _;
    let relative = Path::new(wanted.trim_start_matches('/'));
    if relative
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(StatusCode::NOT_FOUND);
    }
    let root = log_dir.canonicalize().map_err(|_| StatusCode::NOT_FOUND)?;
    let real = root
        .join(relative)
        .canonicalize()
        .map_err(|_| StatusCode::NOT_FOUND)?;
    let beneath = real
        .strip_prefix(&root)
        .map_err(|_| StatusCode::NOT_FOUND)?;
    let fd = crate::volumes::subpath::open_beneath(&root, &beneath.to_string_lossy(), false)
        .map_err(|_| StatusCode::NOT_FOUND)?;
    // The descriptor's own inode, reached through its /proc link (never through the path).
    let opened = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    let kind = std::fs::metadata(&opened)
        .map_err(|_| StatusCode::NOT_FOUND)?
        .file_type();
    if kind.is_dir() {
        let entries = std::fs::read_dir(&opened).map_err(|_| StatusCode::FORBIDDEN)?;
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    name + "/"
                } else {
                    name
                }
            })
            .collect();
        names.sort();
        Ok(LogPath::Dir(names))
    } else if kind.is_file() {
        std::fs::File::open(&opened)
            .map(LogPath::File)
            .map_err(|_| StatusCode::FORBIDDEN)
    } else {
        Err(StatusCode::NOT_FOUND)
    }
}

/// What a listing's link leaves as it is: unreserved characters and the path separator.
const HREF: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// A directory listing as upstream's file server writes it: each name HTML-escaped in the
/// text and percent-encoded in its link (so a name is never read as a scheme or a query).
fn listing(names: &[String]) -> String {
    let mut body = String::from("<pre>\n");
    for n in names {
        let escaped = n
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
            .replace('\'', "&#39;");
        let href = percent_encoding::utf8_percent_encode(n, HREF);
        body.push_str(&format!("<a href=\"{href}\">{escaped}</a>\n"));
    }
    body.push_str("</pre>\n");
    body
}

/// /logs/ and /logs/{path}: a directory listing (HTML links, as upstream's file server) or a
/// file's contents, for paths under the node's log dir only.
async fn node_logs(State(h): State<Handles>, req: Request) -> Response {
    let raw = req.uri().path().trim_start_matches("/logs");
    let Ok(decoded) = percent_decoded(raw) else {
        return text(StatusCode::BAD_REQUEST, "invalid path");
    };
    let log_dir = h.log_dir.clone();
    let opened = tokio::task::spawn_blocking(move || open_log_path(&log_dir, &decoded)).await;
    match opened {
        Ok(Ok(LogPath::Dir(names))) => (
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            listing(&names),
        )
            .into_response(),
        Ok(Ok(LogPath::File(file))) => (
            [(header::CONTENT_TYPE, "text/plain")],
            Body::from_stream(tokio_util::io::ReaderStream::new(
                tokio::fs::File::from_std(file),
            )),
        )
            .into_response(),
        Ok(Err(StatusCode::FORBIDDEN)) => text(StatusCode::FORBIDDEN, "cannot read the path"),
        Ok(Err(code)) => text(code, "404 page not found"),
        Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "the log reader failed"),
    }
}

fn percent_decoded(path: &str) -> Result<String, std::str::Utf8Error> {
    percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .map(|s| s.into_owned())
}

async fn configz(State(h): State<Handles>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "kubeletconfig": h.configz }).to_string(),
    )
        .into_response()
}

/// The streaming session the request asks for, as a URL of the runtime's streaming server.
async fn session_url(
    h: &Handles,
    kind: &str,
    params: &[String],
    query: &[(String, String)],
) -> Result<String, Response> {
    let (namespace, pod) = (&params[0], &params[1]);
    let container = params.last().filter(|_| kind != "portForward");
    let found = logs::locate(
        &h.runtime,
        &h.statuses,
        namespace,
        pod,
        container.map(String::as_str),
        false,
    )
    .await
    .map_err(log_error)?;
    let (stdin, stdout, stderr, tty) = (
        flag(query, "input"),
        flag(query, "output"),
        flag(query, "error"),
        flag(query, "tty"),
    );
    let unavailable = |e: crate::runtime::Error| text(StatusCode::INTERNAL_SERVER_ERROR, e);
    match kind {
        "exec" => {
            let cmd: Vec<String> = query
                .iter()
                .filter(|(k, _)| k == "command")
                .map(|(_, v)| v.clone())
                .collect();
            if cmd.is_empty() {
                return Err(text(StatusCode::BAD_REQUEST, "exec needs a command"));
            }
            h.runtime
                .exec(cri::ExecRequest {
                    container_id: found.container_id,
                    cmd,
                    tty,
                    stdin,
                    stdout,
                    stderr,
                })
                .await
                .map_err(unavailable)
        }
        "attach" => h
            .runtime
            .attach(cri::AttachRequest {
                container_id: found.container_id,
                stdin,
                tty,
                stdout,
                stderr,
            })
            .await
            .map_err(unavailable),
        _ => {
            let ports = query
                .iter()
                .filter(|(k, _)| k == "port")
                .filter_map(|(_, v)| v.parse::<i32>().ok())
                .collect();
            h.runtime
                .port_forward(&found.sandbox_id, ports)
                .await
                .map_err(unavailable)
        }
    }
}

/// /exec, /attach and /portForward: asks the runtime for a session and proxies the client's
/// upgrade (SPDY or websocket, whichever it speaks) to the runtime's streaming server.
async fn stream(
    State(h): State<Handles>,
    UrlPath(params): UrlPath<Vec<(String, String)>>,
    req: Request,
) -> Response {
    let kind = req
        .uri()
        .path()
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let params: Vec<String> = params.into_iter().map(|(_, v)| v).collect();
    let query = query_of(&req);
    match session_url(&h, &kind, &params, &query).await {
        Ok(url) => proxy(&url, req).await,
        Err(r) => r,
    }
}

/// The client's headers for the streaming server: the upgrade's own pass, but not the hop's
/// framing nor the client's credentials (the streaming URL is its own authorization).
fn forwarded(headers: &HeaderMap) -> HeaderMap {
    let mut out = headers.clone();
    for h in [
        header::HOST,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::AUTHORIZATION,
        header::COOKIE,
    ] {
        out.remove(h);
    }
    out
}

/// Sends the request to the streaming server and, on 101, splices the two upgraded connections.
async fn proxy(url: &str, mut req: Request) -> Response {
    let Ok(uri) = url.parse::<axum::http::Uri>() else {
        return text(
            StatusCode::BAD_GATEWAY,
            format!("invalid streaming URL {url:?}"),
        );
    };
    let host = uri
        .host()
        .unwrap_or("127.0.0.1")
        .trim_matches(['[', ']'])
        .to_string();
    let port = uri.port_u16().unwrap_or(80);
    let tcp = match tokio::net::TcpStream::connect((host.as_str(), port)).await {
        Ok(s) => s,
        Err(e) => {
            return text(
                StatusCode::BAD_GATEWAY,
                format!("cannot reach the runtime's streaming server: {e}"),
            );
        }
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok(pair) => pair,
        Err(e) => return text(StatusCode::BAD_GATEWAY, format!("streaming server: {e}")),
    };
    tokio::spawn(conn.with_upgrades());
    let client_side = hyper::upgrade::on(&mut req);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut upstream = axum::http::Request::builder()
        .method(req.method())
        .uri(path)
        .body(Body::empty())
        .unwrap_or_default();
    *upstream.headers_mut() = forwarded(req.headers());
    if let Ok(v) = header::HeaderValue::from_str(&format!("{host}:{port}")) {
        upstream.headers_mut().insert(header::HOST, v);
    }
    let mut response = match sender.send_request(upstream).await {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_GATEWAY, format!("streaming server: {e}")),
    };
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = response.into_parts();
        return Response::from_parts(parts, Body::new(body));
    }
    let server_side = hyper::upgrade::on(&mut response);
    let in_flight = req.extensions_mut().remove::<super::instrument::InFlight>();
    tokio::spawn(async move {
        let _in_flight = in_flight;
        let (Ok(client), Ok(server)) = tokio::join!(client_side, server_side) else {
            tracing::debug!("a streaming upgrade did not complete");
            return;
        };
        let (mut a, mut b) = (TokioIo::new(client), TokioIo::new(server));
        let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
    });
    let (parts, _) = response.into_parts();
    Response::from_parts(parts, Body::empty())
}

/// The authenticated router: the read-only API's routes and the node's own, behind
/// authentication and authorization ([`auth::check`]).
pub fn router(read_only: Router, handles: Handles, auth: auth::Auth) -> Router {
    let own = Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(container_logs),
        )
        .route("/logs/", get(node_logs))
        .route("/logs/{*path}", get(node_logs))
        .route("/configz", get(configz))
        .route("/exec/{namespace}/{pod}/{container}", any(stream))
        .route("/exec/{namespace}/{pod}/{uid}/{container}", any(stream))
        .route("/attach/{namespace}/{pod}/{container}", any(stream))
        .route("/attach/{namespace}/{pod}/{uid}/{container}", any(stream))
        .route("/portForward/{namespace}/{pod}", any(stream))
        .route("/portForward/{namespace}/{pod}/{uid}", any(stream))
        .with_state(handles);
    read_only
        .merge(own)
        .layer(middleware::from_fn_with_state(auth, auth::check))
        .layer(middleware::from_fn_with_state(
            "readwrite",
            super::instrument::record,
        ))
}

/// Serves `router` over TLS on `listener` until `cancel`; each connection is told whether its
/// client certificate was verified.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    router: Router,
    cancel: CancellationToken,
) {
    // The TLS layer only lets certificates the client CA signed through.
    let app = move |chain: Option<&[tokio_rustls::rustls::pki_types::CertificateDer<'static>]>| {
        let user = chain
            .and_then(|c| c.first())
            .and_then(|leaf| auth::User::from_certificate(leaf));
        router
            .clone()
            .layer(axum::Extension(auth::CertificateUser(user)))
    };
    let mode = super::listen::Mode::Tls(TlsAcceptor::from(tls), Arc::new(app));
    super::listen::serve(listener, mode, "authenticated API", cancel).await;
}

//! The accept loop of every TCP server of the node, with the limits a server facing the network
//! needs: a cap on open connections, a deadline for the TLS handshake and for each request's
//! headers (which also ends a keep-alive connection left idle), and a pause when accept fails
//! (out of descriptors) instead of a busy loop. A connection upgraded to a stream (exec, attach,
//! port-forward) or sending a long response (a followed log) is not cut: the deadlines only
//! cover waiting for a request.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Open connections per server beyond which new ones wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 4096;
/// How long a client has to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client has to send a request's headers, also once a connection is idle.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// The pause after a failed accept, doubled up to a second while it keeps failing.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(5), Duration::from_secs(1));

/// The router for one TLS connection, from its client's certificate chain.
pub type TlsApp = Arc<dyn Fn(Option<&[CertificateDer<'static>]>) -> Router + Send + Sync>;

/// How a server turns a connection into its application.
pub enum Mode {
    /// Plain HTTP: the same router for every connection.
    Plain(Router),
    /// TLS: the router for a connection is made once its handshake is done, from its client
    /// certificate chain (the authenticated port tells each connection its user).
    Tls(TlsAcceptor, TlsApp),
}

/// Serves `mode` on `listener` until `cancel`; `name` is the server's in logs.
pub async fn serve(
    listener: TcpListener,
    mode: Mode,
    name: &'static str,
    cancel: CancellationToken,
) {
    let mode = Arc::new(mode);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let connections = TaskTracker::new();
    let mut backoff = ACCEPT_BACKOFF.0;
    loop {
        let slot = tokio::select! {
            _ = cancel.cancelled() => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let (tcp, peer) = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(server = name, error = %e, "accept failed; pausing");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF.1);
                    continue;
                }
            },
        };
        backoff = ACCEPT_BACKOFF.0;
        let mode = mode.clone();
        let cancel = cancel.clone();
        connections.spawn(async move {
            let _slot = slot;
            match &*mode {
                Mode::Plain(router) => connection(tcp, router.clone(), &cancel).await,
                Mode::Tls(acceptor, app) => {
                    let tls =
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(tls)) => tls,
                            Ok(Err(e)) => {
                                tracing::debug!(server = name, %peer, error = %e, "TLS handshake refused");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(server = name, %peer, "TLS handshake timed out");
                                return;
                            }
                        };
                    let router = app(tls.get_ref().1.peer_certificates());
                    connection(tls, router, &cancel).await;
                }
            }
        });
    }
    connections.close();
}

/// HTTP/1.1 on one connection, upgrades allowed, until it ends or `cancel`.
async fn connection<IO>(io: IO, router: Router, cancel: &CancellationToken)
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(router);
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::select! {
        _ = conn => {}
        _ = cancel.cancelled() => {}
    }
}

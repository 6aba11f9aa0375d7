//! The healthz endpoint (127.0.0.1:10248 by default): `ok` while the sync loop is turning.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The sync loop counts as stuck when it has not turned for this long.
const SYNC_LOOP_STALE: Duration = Duration::from_secs(30);

async fn healthz(State(heartbeat): State<watch::Receiver<Instant>>) -> (StatusCode, String) {
    let last = *heartbeat.borrow();
    let age = last.elapsed();
    if age > SYNC_LOOP_STALE {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "[-]syncloop failed: no iteration for {}s\nhealthz check failed\n",
                age.as_secs()
            ),
        )
    } else {
        (StatusCode::OK, "ok".into())
    }
}

/// The router; `heartbeat` carries the time of the sync loop's last iteration.
pub fn router(heartbeat: watch::Receiver<Instant>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .with_state(heartbeat)
}

/// Serves healthz on `listener` until `cancel`.
pub async fn serve(
    listener: TcpListener,
    heartbeat: watch::Receiver<Instant>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(heartbeat))
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
}

//! The healthz endpoint (127.0.0.1:10248 by default): `ok` while the sync loop turns and the
//! PLEG relists in time.

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

/// What healthz looks at.
#[derive(Clone)]
pub struct Checks {
    /// The time of the sync loop's last iteration.
    pub sync_loop: watch::Receiver<Instant>,
    pub pleg: crate::pleg::Health,
}

async fn healthz(State(checks): State<Checks>) -> (StatusCode, String) {
    let mut failed = Vec::new();
    let age = checks.sync_loop.borrow().elapsed();
    if age > SYNC_LOOP_STALE {
        failed.push(format!(
            "[-]syncloop failed: no iteration for {}s",
            age.as_secs()
        ));
    }
    if let Some(error) = checks.pleg.runtime_error() {
        failed.push(format!(
            "[-]runtime failed: container runtime is down: {error}"
        ));
    }
    if let Err(age) = checks.pleg.check() {
        failed.push(format!(
            "[-]pleg failed: PLEG is not healthy: last relist {}s ago",
            age.as_secs()
        ));
    }
    if failed.is_empty() {
        (StatusCode::OK, "ok".into())
    } else {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{}\nhealthz check failed\n", failed.join("\n")),
        )
    }
}

/// The router.
pub fn router(checks: Checks) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .with_state(checks)
}

/// Serves healthz on `listener` until `cancel`.
pub async fn serve(
    listener: TcpListener,
    checks: Checks,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(checks))
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
}

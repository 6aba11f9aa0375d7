//! Health checks (127.0.0.1:10248 by default): `/healthz` is ok while the sync loop turns, the
//! PLEG relists in time and the runtime answers; `/healthz/<check>` and `?verbose` as upstream.

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, State};
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

impl Checks {
    /// Every check by name, with the reason when it fails.
    fn run(&self) -> Vec<(&'static str, Result<(), String>)> {
        let age = self.sync_loop.borrow().elapsed();
        vec![
            ("ping", Ok(())),
            (
                "syncloop",
                if age > SYNC_LOOP_STALE {
                    Err(format!("sync loop has not turned for {}s", age.as_secs()))
                } else {
                    Ok(())
                },
            ),
            (
                "pleg",
                self.pleg.check().map_err(|(age, _)| {
                    format!("PLEG is not healthy: last relist {}s ago", age.as_secs())
                }),
            ),
            (
                "runtime",
                match self.pleg.runtime_error() {
                    Some(e) => Err(format!("container runtime is down: {e}")),
                    None => Ok(()),
                },
            ),
        ]
    }
}

#[derive(serde::Deserialize)]
struct Params {
    verbose: Option<String>,
}

fn answer(results: Vec<(&'static str, Result<(), String>)>, verbose: bool) -> (StatusCode, String) {
    let healthy = results.iter().all(|(_, r)| r.is_ok());
    if healthy && !verbose {
        return (StatusCode::OK, "ok".into());
    }
    let mut text = String::new();
    for (name, r) in &results {
        match r {
            Ok(()) => text += &format!("[+]{name} ok\n"),
            Err(why) => text += &format!("[-]{name} failed: {why}\n"),
        }
    }
    if healthy {
        text += "healthz check passed\n";
        (StatusCode::OK, text)
    } else {
        text += "healthz check failed\n";
        (StatusCode::INTERNAL_SERVER_ERROR, text)
    }
}

async fn all(State(checks): State<Checks>, Query(p): Query<Params>) -> (StatusCode, String) {
    answer(checks.run(), p.verbose.is_some())
}

async fn one(
    State(checks): State<Checks>,
    Path(name): Path<String>,
    Query(p): Query<Params>,
) -> (StatusCode, String) {
    let results: Vec<_> = checks
        .run()
        .into_iter()
        .filter(|(n, _)| *n == name)
        .collect();
    if results.is_empty() {
        return (
            StatusCode::NOT_FOUND,
            format!("no health check named {name:?}\n"),
        );
    }
    answer(results, p.verbose.is_some())
}

/// The healthz routes, for any server that offers them.
pub fn routes(checks: Checks) -> Router {
    Router::new()
        .route("/healthz", get(all))
        .route("/healthz/{check}", get(one))
        .with_state(checks)
}

/// Serves healthz on `listener` until `cancel`.
pub async fn serve(
    listener: TcpListener,
    checks: Checks,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    super::listen::serve(
        listener,
        super::listen::Mode::Plain(routes(checks)),
        "healthz",
        cancel,
    )
    .await;
    Ok(())
}

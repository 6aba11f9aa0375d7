//! The HTTP metrics upstream records for every request to the read-only and the authenticated
//! server: counted, in flight and timed, by method, path bucket, server type and whether the
//! request is long-running.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::BodyExt as _;

/// The paths nodelet serves, as upstream buckets them: the first segment, or two for
/// `/metrics/...`. Any other path counts as `other`.
const PATHS: &[&str] = &[
    "healthz",
    "pods",
    "runningpods",
    "stats",
    "metrics",
    "metrics/cadvisor",
    "metrics/probes",
    "metrics/resource",
    "containerLogs",
    "logs",
    "configz",
    "exec",
    "attach",
    "portForward",
];

/// The methods upstream counts by name; any other counts as `other`.
const METHODS: &[&str] = &[
    "OPTIONS", "GET", "HEAD", "POST", "PUT", "DELETE", "TRACE", "CONNECT",
];

/// Upstream's long-running paths. Its list spells `portforward` in lower case, so a port
/// forward is not counted as long-running there, and is not here either.
const LONG_RUNNING: &[&str] = &["exec", "attach", "portforward", "debug"];

/// The path bucket of a request path.
fn bucket(path: &str) -> &'static str {
    let mut parts = path.trim_start_matches('/').splitn(3, '/');
    let first = parts.next().unwrap_or_default();
    let root = match (first, parts.next()) {
        ("metrics", Some(second)) => PATHS
            .iter()
            .find(|p| p.strip_prefix("metrics/") == Some(second)),
        _ => PATHS.iter().find(|p| **p == first),
    };
    root.copied().unwrap_or("other")
}

/// Records a request to the server of `server_type` (`readonly` or `readwrite`). It is in
/// flight until its response body is sent or dropped (a followed log until the client leaves),
/// and a stream upgraded from it (exec, attach, port-forward) until the stream ends: the
/// request carries an [`InFlight`] for the handler to hold in the stream's task.
pub async fn record(
    State(server_type): State<&'static str>,
    mut request: Request,
    next: Next,
) -> Response {
    let method = METHODS
        .iter()
        .find(|m| **m == request.method().as_str())
        .copied()
        .unwrap_or("other");
    let path = bucket(request.uri().path());
    let long_running = if LONG_RUNNING.contains(&path) {
        "true"
    } else {
        "false"
    };
    let served = Arc::new(Served {
        labels: [method, path, server_type, long_running],
        since: Instant::now(),
    });
    crate::metrics::get().http_request(&served.labels);
    request.extensions_mut().insert(InFlight {
        _served: served.clone(),
    });
    let response = next.run(request).await;
    // The body owns the record: dropping the body, at its end or with the client, ends it.
    response.map(|body| {
        axum::body::Body::new(body.map_frame(move |frame| {
            let _in_flight = &served;
            frame
        }))
    })
}

/// A request in flight, for a handler whose work outlives the response (an upgraded stream)
/// to hold until that work ends.
#[derive(Clone)]
pub struct InFlight {
    _served: Arc<Served>,
}

/// A request in flight; dropping it (its last holder) records the request as served.
struct Served {
    labels: [&'static str; 4],
    since: Instant,
}

impl Drop for Served {
    fn drop(&mut self) {
        crate::metrics::get().http_served(&self.labels, self.since.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_bucketed_as_upstream_buckets_them() {
        assert_eq!(bucket("/pods"), "pods");
        assert_eq!(bucket("/stats/summary"), "stats");
        assert_eq!(bucket("/metrics"), "metrics");
        assert_eq!(bucket("/metrics/resource"), "metrics/resource");
        assert_eq!(bucket("/metrics/cadvisor"), "metrics/cadvisor");
        assert_eq!(bucket("/metrics/other"), "other");
        assert_eq!(bucket("/exec/ns/pod/c"), "exec");
        assert_eq!(bucket("/containerLogs/ns/pod/c"), "containerLogs");
        assert_eq!(bucket("/nothing/here"), "other");
        assert_eq!(bucket("/"), "other");
    }
}

//! The read-only server (--read-only-port on --address, off by default): /pods, /runningpods,
//! /metrics, /metrics/probes, /metrics/resource, /metrics/cadvisor, /stats/summary and /healthz,
//! as the upstream kubelet serves them.

use std::borrow::Borrow;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::healthz;
use crate::status;

fn json<T: serde::Serialize>(value: &T) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(value).unwrap_or_default(),
    )
        .into_response()
}

/// A PodList of `items`, as JSON.
fn pod_list<P: Borrow<Pod>>(items: &[P]) -> Response {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct PodList<'a> {
        kind: &'static str,
        api_version: &'static str,
        metadata: ObjectMeta,
        items: Vec<&'a Pod>,
    }
    let list = PodList {
        kind: "PodList",
        api_version: "v1",
        metadata: ObjectMeta::default(),
        items: items.iter().map(Borrow::borrow).collect(),
    };
    json(&list)
}

/// Every pod with its status, by namespace and name.
fn sorted(reader: &status::Reader) -> Vec<Arc<Pod>> {
    let mut pods: Vec<Arc<Pod>> = reader.list().into_iter().map(|e| e.pod).collect();
    pods.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    pods
}

fn running(c: &ContainerStatus) -> bool {
    c.state.as_ref().is_some_and(|s| s.running.is_some())
}

async fn pods(State(reader): State<status::Reader>) -> impl IntoResponse {
    pod_list(&sorted(&reader))
}

/// Pods with running containers, as the runtime sees them: metadata and those containers.
async fn running_pods(State(reader): State<status::Reader>) -> impl IntoResponse {
    let items = sorted(&reader)
        .into_iter()
        .filter_map(|p| {
            let statuses = p.status.as_ref()?.container_statuses.as_deref()?;
            let containers: Vec<Container> = statuses
                .iter()
                .filter(|c| running(c))
                .map(|c| Container {
                    name: c.name.clone(),
                    image: Some(c.image.clone()),
                    ..Default::default()
                })
                .collect();
            (!containers.is_empty()).then(|| Pod {
                metadata: ObjectMeta {
                    name: p.metadata.name.clone(),
                    namespace: p.metadata.namespace.clone(),
                    uid: p.metadata.uid.clone(),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    containers,
                    ..Default::default()
                }),
                status: None,
            })
        })
        .collect::<Vec<Pod>>();
    pod_list(&items)
}

async fn metrics(State(source): State<super::stats::Source>) -> impl IntoResponse {
    let m = crate::metrics::get();
    let pods = source.statuses.list();
    let mut by_state = [
        ("running", 0usize),
        ("exited", 0),
        ("created", 0),
        ("unknown", 0),
    ];
    let mut running_pods = 0;
    for e in &pods {
        let statuses = (e.pod.status.as_ref())
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or_default();
        if statuses.iter().any(running) {
            running_pods += 1;
        }
        for state in statuses.iter().map(|c| c.state.as_ref()) {
            let slot = match state {
                Some(s) if s.running.is_some() => 0,
                Some(s) if s.terminated.is_some() => 1,
                Some(s) if s.waiting.is_some() => 2,
                _ => 3,
            };
            by_state[slot].1 += 1;
        }
    }
    m.set_running(running_pods, &by_state);
    m.set_log_usage(source.log_usage(pods).await);
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        m.render(),
    )
}

async fn probe_metrics() -> impl IntoResponse {
    let m = crate::metrics::get();
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        m.render_probes(),
    )
}

async fn stats_summary(State(source): State<super::stats::Source>) -> impl IntoResponse {
    match super::stats::summary(&source).await {
        Ok(summary) => json(&summary),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot read container stats from the runtime: {e}\n"),
        )
            .into_response(),
    }
}

/// `/metrics/resource`, from the CPU and memory part of the summary; one that cannot be read is
/// a scrape error.
async fn resource_metrics(State(source): State<super::stats::Source>) -> impl IntoResponse {
    let summary = super::stats::cpu_and_memory(&source).await;
    if let Err(e) = &summary {
        tracing::warn!(error = %crate::types::error_chain(&e), "cannot read the summary for /metrics/resource");
    }
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        super::stats::resource::render(summary.as_ref().ok()),
    )
}

async fn cadvisor_metrics(State(source): State<super::stats::Source>) -> impl IntoResponse {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        super::stats::cadvisor_metrics(&source).await,
    )
}

/// The read-only router.
pub fn router(
    reader: status::Reader,
    checks: healthz::Checks,
    stats: super::stats::Source,
) -> Router {
    let summary = Router::new()
        .route("/stats/summary", get(stats_summary))
        .route("/metrics/resource", get(resource_metrics))
        .route("/metrics/cadvisor", get(cadvisor_metrics))
        .route("/metrics", get(metrics))
        .with_state(stats);
    Router::new()
        .route("/pods", get(pods))
        .route("/runningpods", get(running_pods))
        .route("/runningpods/", get(running_pods))
        .route("/metrics/probes", get(probe_metrics))
        .with_state(reader)
        .merge(summary)
        .merge(healthz::routes(checks))
}

/// Serves the read-only API on `listener` until `cancel`.
pub async fn serve(
    listener: TcpListener,
    reader: status::Reader,
    checks: healthz::Checks,
    stats: super::stats::Source,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    super::listen::serve(
        listener,
        super::listen::Mode::Plain(router(reader, checks, stats).layer(
            axum::middleware::from_fn_with_state("readonly", super::instrument::record),
        )),
        "read-only API",
        cancel,
    )
    .await;
    Ok(())
}

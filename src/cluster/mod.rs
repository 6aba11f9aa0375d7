//! Cluster mode: everything that talks to the API server. The node registers and keeps its
//! status and lease current; the pods bound to it become the `api` source; pod statuses are
//! pushed; static pods get mirror pods; events are sent; the node's API asks the API server
//! who may do what. Every part retries on its own, so an API server that is away never holds
//! up static pods, and each part resumes when it returns.

pub mod client;
pub mod events;
pub mod lease;
pub mod mirror;
pub mod node;
pub mod objects;
pub mod pods;
pub mod resources;
pub mod review;
pub mod services;
pub mod status;
mod watch_backoff;

use std::path::PathBuf;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::sources::SourceSnapshot;
use crate::sync_loop::Desired;
use crate::types::Source;

/// Deletes the pod `namespace/name` with this UID at once (grace 0, the UID as precondition), as
/// the kubelet deletes what is finished on its node. A pod of that name with another UID, or
/// none, is left alone; a failure is logged and the caller's next pass tries again.
pub(crate) async fn delete_pod_now(
    client: &kube::Client,
    (namespace, name, uid): (&str, &str, &str),
    what: &str,
) {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), namespace);
    let params = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match pods.delete(name, &params).await {
        Ok(_) => tracing::info!(pod = %format!("{namespace}/{name}"), "deleted {what}"),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => {
            tracing::warn!(pod = %format!("{namespace}/{name}"), error = %crate::types::error_chain(&e), "cannot delete {what}")
        }
    }
}

/// How nodelet joins the cluster.
#[derive(Clone, Debug)]
pub struct Config {
    pub kubeconfig: PathBuf,
    pub qps: f64,
    pub burst: u32,
    /// Events' own pacing.
    pub event_qps: f64,
    pub event_burst: u32,
    pub node: node::Config,
    pub lease_duration_seconds: u32,
    /// The static sources configured (their mirrors are collected once they are read).
    pub static_sources: Vec<Source>,
}

/// What the cluster parts read from the rest of the agent, and where API pods go.
pub struct Handles {
    pub signals: node::Signals,
    pub statuses: crate::status::Reader,
    pub desired: watch::Receiver<Desired>,
    pub snapshots: mpsc::Sender<SourceSnapshot>,
    pub recorder: crate::events::Recorder,
    /// Where the Services go, for the containers' service links.
    pub services: crate::service_links::Store,
}

/// The agent's API clients, each paced on its own as upstream keeps them apart (a flood of one
/// kind of request never holds up another), over one connection stack.
pub struct Clients {
    /// Pods, their status, mirrors, objects and tokens (`--kube-api-qps`, `--kube-api-burst`).
    pub main: kube::Client,
    /// The node's status and lease, not paced.
    pub heartbeat: kube::Client,
    /// Events (`--event-qps`, `--event-burst`).
    pub events: kube::Client,
    /// TokenReview and SubjectAccessReview for the node's API, paced like the main client.
    pub reviews: kube::Client,
}

/// The clients, from the kubeconfig. Nothing is asked of the API server yet.
pub async fn connect(config: &Config) -> Result<Clients, client::Error> {
    let heartbeat = client::from_kubeconfig(&config.kubeconfig).await?;
    Ok(Clients {
        main: client::paced(&heartbeat, config.qps, config.burst),
        events: client::paced(&heartbeat, config.event_qps, config.event_burst),
        reviews: client::paced(&heartbeat, config.qps, config.burst),
        heartbeat,
    })
}

/// Starts the cluster parts on `tracker`. An API server that does not answer is retried by
/// each part. Returns the status store generation last seen at the API server in full.
pub fn start(
    config: Config,
    clients: Clients,
    handles: Handles,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> watch::Receiver<u64> {
    let client = clients.main;
    tracing::info!(kubeconfig = %config.kubeconfig.display(), node = %config.node.name, "joining the cluster");
    let (uid_tx, uid) = watch::channel(None);
    let name = config.node.name.clone();
    tracker.spawn(events::run(
        clients.events,
        handles.recorder,
        name.clone(),
        cancel.clone(),
    ));
    tracker.spawn(node::run(
        clients.heartbeat.clone(),
        config.node,
        handles.signals,
        uid_tx,
        cancel.clone(),
    ));
    tracker.spawn(lease::run(
        clients.heartbeat,
        name.clone(),
        config.lease_duration_seconds,
        uid.clone(),
        cancel.clone(),
    ));
    let (bound, watch) = pods::watch(
        client.clone(),
        &name,
        handles.snapshots,
        tracker.clone(),
        cancel.clone(),
    );
    tracker.spawn(watch);
    tracker.spawn(services::run(
        client.clone(),
        handles.services,
        cancel.clone(),
    ));
    let (synced_tx, synced) = watch::channel(0);
    tracker.spawn(status::run(
        client.clone(),
        handles.statuses,
        bound.clone(),
        synced_tx,
        cancel.clone(),
    ));
    tracker.spawn(mirror::run(
        client,
        name,
        config.static_sources,
        uid,
        handles.desired,
        bound,
        cancel.clone(),
    ));
    synced
}

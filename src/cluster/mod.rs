//! Cluster mode: everything that talks to the API server. The node registers and keeps its
//! status and lease current; the pods bound to it become the `api` source; pod statuses are
//! pushed; static pods get mirror pods; events are sent. Every part retries on its own, so an API server that is
//! away never holds up static pods, and each part resumes when it returns.

pub mod client;
pub mod events;
pub mod lease;
pub mod mirror;
pub mod node;
pub mod objects;
pub mod pods;
pub mod review;
pub mod status;

use std::path::PathBuf;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::sync_loop::Desired;
use crate::types::{Source, SourceSnapshot};

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
}

/// The API client of the agent, from the kubeconfig, paced at `qps`/`burst`.
pub async fn connect(config: &Config) -> Result<kube::Client, client::Error> {
    client::from_kubeconfig(&config.kubeconfig, config.qps, config.burst).await
}

/// Starts the cluster parts on `tracker` with `client` (and a client of the events' own).
/// Fails only on a kubeconfig that cannot be used; an API server that does not answer is
/// retried by each part.
pub async fn start(
    config: Config,
    client: kube::Client,
    handles: Handles,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> Result<(), client::Error> {
    let events_client =
        client::from_kubeconfig(&config.kubeconfig, config.event_qps, config.event_burst).await?;
    tracing::info!(kubeconfig = %config.kubeconfig.display(), node = %config.node.name, "joining the cluster");
    let (uid_tx, uid) = watch::channel(None);
    let name = config.node.name.clone();
    tracker.spawn(events::run(
        events_client,
        handles.recorder,
        name.clone(),
        cancel.clone(),
    ));
    tracker.spawn(node::run(
        client.clone(),
        config.node,
        handles.signals,
        uid_tx,
        cancel.clone(),
    ));
    tracker.spawn(lease::run(
        client.clone(),
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
    tracker.spawn(status::run(
        client.clone(),
        handles.statuses,
        bound.clone(),
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
    Ok(())
}

//! The node's servers: the admin, pod-resources and device plugin sockets (and the plugin
//! registry), healthz, the authenticated API over TLS and the read-only API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use tokio_util::sync::CancellationToken;

use super::{Core, spawn_server};
use crate::config::{AuthorizationMode, Config};
use crate::server;

/// Serves the admin socket, the pod-resources socket and the device plugin registration
/// socket in the root dir, and follows its plugin registry.
pub(super) async fn serve_sockets(
    config: &Config,
    core: &Core,
    cancel: &CancellationToken,
) -> Result<()> {
    let socket = server::admin::socket_path(&config.root_dir);
    let listener = server::admin::bind(&socket).await?;
    let handles = server::admin::Handles {
        node_name: config.node_name.clone(),
        statuses: core.status.clone(),
        events: core.recorder.clone(),
        diagnoses: core.diagnoses.clone(),
        cleanups: core.cleanups.clone(),
        runtime: core.runtime.clone(),
        debugger: core.sync_loop.debugger(),
    };
    let served = server::admin::serve(listener, socket, handles, cancel.clone());
    spawn_server(&core.tracker, "admin socket server", served);
    let socket = server::pod_resources::socket_path(&config.root_dir);
    let listener = server::admin::bind(&socket).await?;
    let handles = server::pod_resources::Handles {
        statuses: core.status.clone(),
        resources: core.resources.clone(),
    };
    let served = server::pod_resources::serve(listener, socket, handles, cancel.clone());
    spawn_server(&core.tracker, "pod-resources socket server", served);
    let devices = &core.resources.devices;
    let socket = devices.dir().join(crate::cm::devices::SOCKET);
    let listener = server::admin::bind(&socket).await?;
    let what = "the device plugin registration socket";
    let incoming = server::admin::admitted_connections(listener, socket, what);
    let served = crate::cm::devices::plugin::serve(
        devices.clone(),
        incoming,
        core.tracker.clone(),
        cancel.clone(),
    );
    let what = "device plugin registration socket server";
    spawn_server(&core.tracker, what, served);
    let dra = core.resources.dra.clone();
    core.tracker
        .spawn(dra.run(config.root_dir.clone(), cancel.clone()));
    Ok(())
}

/// Serves healthz, the authenticated API (with `reviewer`, the API server's, in a cluster)
/// and the read-only API, each where its port is set.
pub(super) async fn serve_http(
    config: &Config,
    core: &Core,
    reviewer: Option<Arc<dyn server::auth::Reviewer>>,
    cancel: &CancellationToken,
) -> Result<()> {
    let checks = server::healthz::Checks {
        sync_loop: core.sync_loop.heartbeat(),
        pleg: core.pleg_health.clone(),
    };
    if config.healthz_port != 0 {
        let addr = SocketAddr::new(config.healthz_bind_address, config.healthz_port);
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!("cannot listen on {addr} for healthz (--healthz-port, --healthz-bind-address)")
        })?;
        tracing::info!(%addr, "serving healthz");
        let served = server::healthz::serve(listener, checks.clone(), cancel.clone());
        spawn_server(&core.tracker, "healthz server", served);
    }
    if config.enable_server && config.port != 0 {
        serve_secure(config, core, reviewer, checks.clone(), cancel).await?;
    }
    if config.read_only_port != 0 {
        let addr = SocketAddr::new(config.address, config.read_only_port);
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!("cannot listen on {addr} for the read-only API (--read-only-port, --address)")
        })?;
        tracing::info!(%addr, "serving the read-only API");
        let stats = stats_source(config, core);
        let served =
            server::read_only::serve(listener, core.status.clone(), checks, stats, cancel.clone());
        spawn_server(&core.tracker, "read-only server", served);
    }
    Ok(())
}

/// The API server's TokenReview and SubjectAccessReview, cached for the configured times.
pub(super) fn reviewer(
    config: &Config,
    clients: &crate::cluster::Clients,
) -> Arc<dyn server::auth::Reviewer> {
    let ttls = crate::cluster::review::Ttls {
        authenticated: config.authentication_token_webhook_cache_ttl,
        allowed: config.authorization_webhook_cache_authorized_ttl,
        denied: config.authorization_webhook_cache_unauthorized_ttl,
    };
    Arc::new(crate::cluster::review::Reviewer::new(
        clients.reviews.clone(),
        ttls,
    ))
}

/// Serves the authenticated API over TLS (its own self-signed certificate unless one is
/// given), warning when anonymous requests are served beyond this host.
async fn serve_secure(
    config: &Config,
    core: &Core,
    reviewer: Option<Arc<dyn server::auth::Reviewer>>,
    checks: server::healthz::Checks,
    cancel: &CancellationToken,
) -> Result<()> {
    let (cert, key) = match (&config.tls_cert_file, &config.tls_private_key_file) {
        (Some(cert), Some(key)) => (cert.clone(), key.clone()),
        _ => server::secure::self_signed(&config.root_dir, &config.node_name)?,
    };
    let tls = server::secure::tls_config(&server::secure::TlsFiles {
        cert,
        key,
        client_ca: config.client_ca_file.clone(),
    })?;
    let addr = SocketAddr::new(config.address, config.port);
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!("cannot listen on {addr} for the authenticated API (--port, --address)")
    })?;
    tracing::info!(%addr, anonymous = config.anonymous_auth, "serving the authenticated API over TLS");
    if config.anonymous_auth && !config.address.is_loopback() {
        let who = match config.authorization_mode {
            AuthorizationMode::AlwaysAllow => {
                "and --authorization-mode=AlwaysAllow lets anyone who reaches it exec into any container, read every log and stop pods"
            }
            AuthorizationMode::Webhook => {
                "and anyone who reaches it acts as system:anonymous, with what the API server's authorization grants that user"
            }
        };
        tracing::warn!(%addr, "--anonymous-auth=true on a port open beyond this host: requests without credentials are served, {who}");
    }
    let read_only =
        server::read_only::router(core.status.clone(), checks, stats_source(config, core));
    let handles = server::secure::Handles {
        runtime: core.runtime.clone(),
        statuses: core.status.clone(),
        log_dir: PathBuf::from("/var/log"),
        configz: configz(config, core.cgroup_driver),
    };
    let auth = server::auth::Auth {
        anonymous: config.anonymous_auth,
        node: config.node_name.clone(),
        token_webhook: config.authentication_token_webhook,
        authorization_webhook: config.authorization_mode == AuthorizationMode::Webhook,
        reviewer,
    };
    let router = server::secure::router(read_only, handles, auth);
    core.tracker
        .spawn(server::secure::serve(listener, tls, router, cancel.clone()));
    Ok(())
}

/// /configz: the configuration, with the cgroup driver in use (as upstream shows the runtime's).
fn configz(config: &Config, driver: crate::types::CgroupDriver) -> serde_json::Value {
    let mut out = config.kubelet_configuration();
    out["cgroupDriver"] = driver.as_str().into();
    out
}

/// Where /stats/summary reads the node's and pods' usage.
fn stats_source(config: &Config, core: &Core) -> server::stats::Source {
    server::stats::Source {
        runtime: core.runtime.clone(),
        node_name: config.node_name.clone(),
        root_dir: config.root_dir.clone(),
        pod_logs_dir: config.pod_logs_dir.clone(),
        statuses: core.status.clone(),
        system_containers: core.system_containers.clone(),
    }
}

//! Lifecycle hooks and graceful stops: postStart runs right after a container starts; preStop
//! runs before the stop signal and counts against the grace period.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container as SpecContainer, LifecycleHandler, Probe};
use tokio::time::Instant;

use crate::probe;
use crate::runtime::{self, RuntimeClient};

/// The least time a container gets between SIGTERM and SIGKILL after its preStop hook (upstream).
const MIN_GRACE_AFTER_HOOK: Duration = Duration::from_secs(2);

/// Runs one handler (exec, httpGet, tcpSocket or sleep) against the container, within `timeout`.
pub async fn run(
    runtime: &RuntimeClient,
    handler: &LifecycleHandler,
    container: &SpecContainer,
    container_id: &str,
    host: &str,
    timeout: Duration,
) -> Result<(), String> {
    if let Some(sleep) = &handler.sleep {
        let wanted = Duration::from_secs(sleep.seconds.max(0) as u64);
        tokio::time::sleep(wanted.min(timeout)).await;
        return Ok(());
    }
    let as_probe = Probe {
        exec: handler.exec.clone(),
        http_get: handler.http_get.clone(),
        tcp_socket: handler.tcp_socket.clone(),
        timeout_seconds: Some(timeout.as_secs().clamp(1, i32::MAX as u64) as i32),
        ..Default::default()
    };
    let ports = container.ports.clone().unwrap_or_default();
    let target = probe::Target {
        container_id,
        pod_ip: host,
        ports: &ports,
    };
    probe::attempt(&as_probe, &target, runtime).await
}

/// Stops a container gracefully: its preStop hook first (cut at the grace deadline), then the
/// stop signal with what is left of the grace period (at least 2 s), then SIGKILL.
pub async fn stop_container(
    runtime: RuntimeClient,
    id: String,
    spec: Option<SpecContainer>,
    host: String,
    grace: Duration,
) -> runtime::Result<()> {
    let started = Instant::now();
    let pre_stop = spec
        .as_ref()
        .and_then(|c| c.lifecycle.as_ref())
        .and_then(|l| l.pre_stop.as_ref());
    if let (Some(handler), Some(container)) = (pre_stop, spec.as_ref()) {
        let hook = run(&runtime, handler, container, &id, &host, grace);
        match tokio::time::timeout(grace, hook).await {
            Ok(Ok(())) => {}
            Ok(Err(why)) => {
                tracing::warn!(container = %container.name, %why, "FailedPreStopHook: preStop hook failed")
            }
            Err(_) => {
                tracing::warn!(container = %container.name, "preStop hook did not finish within the grace period")
            }
        }
    }
    let left = if pre_stop.is_some() {
        grace
            .saturating_sub(started.elapsed())
            .max(MIN_GRACE_AFTER_HOOK)
    } else {
        grace
    };
    match runtime.stop_container(&id, left.as_secs() as i64).await {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

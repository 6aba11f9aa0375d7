//! Lifecycle hooks and graceful stops: postStart runs right after a container starts; preStop
//! runs before the stop signal and counts against the grace period. A container's own
//! `lifecycle.stopSignal` goes to the runtime at creation where it applies it (containerd 2.1
//! on); with an older runtime nodelet sends it itself, then the runtime stops what is left at
//! the deadline.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container as SpecContainer, LifecycleHandler, Probe};
use tokio::time::Instant;

use crate::events::{Recorder, Target};
use crate::probe;
use crate::runtime::{self, RuntimeClient};

/// The least time a container gets between SIGTERM and SIGKILL after its preStop hook (upstream).
const MIN_GRACE_AFTER_HOOK: Duration = Duration::from_secs(2);

/// Sends the container's own stop signal to its first process and waits, up to `left`, for it
/// to exit. Returns the grace left for the runtime's stop (zero once it is spent: SIGKILL).
async fn send_stop_signal(
    runtime: &RuntimeClient,
    id: &str,
    name: &str,
    left: Duration,
) -> Duration {
    let started = Instant::now();
    let Some(signal) = crate::pod::signal_number(name) else {
        return left;
    };
    let pid = match runtime.container_pid(id).await {
        Ok(Some(pid)) => pid,
        Ok(None) => return left,
        Err(e) => {
            tracing::warn!(container = %id, error = %e, "cannot find the container's process for its stop signal; the runtime's applies");
            return left;
        }
    };
    // SAFETY: kill(2) with a pid and a signal number; no memory is shared.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return left;
    }
    tracing::debug!(container = %id, signal = name, pid, "sent the container's stop signal");
    while started.elapsed() < left {
        match runtime.container_status(id).await {
            Ok(st) if st.state() == crate::runtime::cri::ContainerState::ContainerExited => {
                return Duration::ZERO;
            }
            Err(e) if e.is_not_found() => return Duration::ZERO,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    Duration::ZERO
}

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
        if wanted > timeout {
            crate::metrics::get().sleep_terminated_early();
        }
        return Ok(());
    }
    if let Some(exec) = &handler.exec {
        // As upstream's, the command has no timeout of its own: waiting for it stops at
        // `timeout`, the command goes on until it ends or its container is stopped. Cancelling
        // the runtime call would kill it, so the call runs on by itself; it ends with the
        // container at the latest.
        let (runtime, id) = (runtime.clone(), container_id.to_string());
        let cmd = exec.command.clone().unwrap_or_default();
        let call = tokio::spawn(async move { runtime.exec_sync(&id, cmd, Duration::ZERO).await });
        return match tokio::time::timeout(timeout, call).await {
            Err(_) => Err(format!(
                "the command did not finish within {}s",
                timeout.as_secs()
            )),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(Err(e))) => Err(e.to_string()),
            Ok(Ok(Ok(out))) => probe::exec_outcome(&out),
        };
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
    probe::attempt(&as_probe, &target, runtime).await.map(drop)
}

/// Stops a container gracefully: its preStop hook first (cut at the grace deadline), then the
/// stop signal with what is left of the grace period (at least 2 s), then SIGKILL.
/// Waits for a container's turn to get its stop signal: for a sidecar, until the app
/// containers and the sidecars after it have stopped.
pub type Turn = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// A stop's time: the grace period, and the turn the container waits for within it.
pub struct Grace {
    pub period: Duration,
    pub turn: Option<Turn>,
}

impl From<Duration> for Grace {
    fn from(period: Duration) -> Grace {
        Grace { period, turn: None }
    }
}

/// Stops a container: its preStop hook, then its turn (if it has to wait for one), then the
/// stop signal with what is left of the grace period (at least 2 s after a hook or a wait).
pub async fn stop_container(
    runtime: RuntimeClient,
    id: String,
    spec: Option<SpecContainer>,
    host: String,
    grace: Grace,
    events: (Recorder, Target),
) -> runtime::Result<()> {
    let Grace {
        period: grace,
        turn,
    } = grace;
    let started = Instant::now();
    let pre_stop = spec
        .as_ref()
        .and_then(|c| c.lifecycle.as_ref())
        .and_then(|l| l.pre_stop.as_ref());
    if let (Some(handler), Some(container)) = (pre_stop, spec.as_ref()) {
        // Boxed: most containers have no hook, and their stops should not carry its state.
        let hook = Box::pin(run(&runtime, handler, container, &id, &host, grace));
        match tokio::time::timeout(grace, hook).await {
            Ok(Ok(())) => {}
            Ok(Err(why)) => events.0.warning(
                events.1,
                "FailedPreStopHook",
                format!("PreStopHook failed: {why}"),
            ),
            Err(_) => events.0.warning(
                events.1,
                "FailedPreStopHook",
                "PreStopHook did not finish within the grace period".into(),
            ),
        }
    }
    let waits = turn.is_some();
    if let Some(turn) = turn {
        let left = grace.saturating_sub(started.elapsed());
        // The turn does not come after the grace period: the stop goes on regardless.
        let _ = tokio::time::timeout(left, turn).await;
    }
    let mut left = if pre_stop.is_some() || waits {
        grace
            .saturating_sub(started.elapsed())
            .max(MIN_GRACE_AFTER_HOOK)
    } else {
        grace
    };
    let stop_signal = spec
        .as_ref()
        .and_then(|c| c.lifecycle.as_ref())
        .and_then(|l| l.stop_signal.as_deref());
    if let Some(name) = stop_signal
        && !runtime.takes_stop_signals().await
    {
        left = send_stop_signal(&runtime, &id, name, left).await;
    }
    match runtime.stop_container(&id, left.as_secs() as i64).await {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

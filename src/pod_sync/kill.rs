//! Stopping containers: one gracefully (its preStop hook, stop signal and grace period), the
//! ones the plan kills, or all of a pod's in upstream's termination order.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{Error, Syncer, actions, hooks, ignore_not_found, watched};
use crate::events::Target;
use crate::pod::{grace_period_seconds, spec};
use crate::runtime::{self, ContainerState, PodRuntime, SandboxState};
use crate::types::{PodUid, full_name};

/// Where the grace period of each container of a pod being stopped comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum GraceFrom {
    /// The pod's spec (its terminationGracePeriodSeconds).
    Spec,
    /// Each container's own, as recorded on it at its creation: for a pod only the runtime has.
    Containers,
}

impl Syncer {
    /// Stops the containers the plan kills, each with its own grace period (a failed probe's
    /// or the pod's).
    pub(super) async fn kill(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
        kills: &[actions::Kill],
    ) -> Result<(), Error> {
        if kills.is_empty() {
            return Ok(());
        }
        let host = (self.hook_host(pod, rt, kills.iter().map(|k| k.name.as_str()))).await;
        for k in kills {
            let grace = k.grace.unwrap_or_else(|| grace_period_seconds(pod)).max(0) as u64;
            let why = format!("Stopping container {} ({})", k.name, k.reason);
            let grace = Duration::from_secs(grace).into();
            self.stop(pod, &k.id, &k.name, &host, grace, why).await?;
        }
        Ok(())
    }

    /// Stops every running container of the pod in upstream's order (see [`Self::stop_live`]),
    /// then stops its sandboxes; with `remove`, removes them all too.
    pub(super) async fn kill_all(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
        remove: bool,
        grace_from: GraceFrom,
    ) -> Result<(), Error> {
        self.stop_live(pod, rt, grace_from).await?;
        // A removal follows the stop of the pod, which stopped every sandbox it had: those not
        // ready now need no second stop.
        let stopping =
            (rt.sandboxes.iter()).filter(|sb| !remove || sb.state == SandboxState::Ready);
        for sb in stopping {
            let stop = self.runtime.stop_pod_sandbox(&sb.id);
            let what = format!("the stop of its sandbox {}", sb.id);
            let target = Target::pod(pod);
            let reporting = (&self.events, &self.diagnoses);
            let stopped = watched(reporting, &target, &what, Duration::ZERO, stop).await;
            ignore_not_found(stopped)?;
        }
        // A pod being replaced keeps its dead containers (their last state and logs) for the
        // garbage collection of later syncs; a terminated pod leaves nothing behind.
        if !remove {
            return Ok(());
        }
        for c in &rt.containers {
            self.remove_container(pod, rt, &c.id).await?;
        }
        for sb in &rt.sandboxes {
            ignore_not_found(self.runtime.remove_pod_sandbox(&sb.id).await)?;
        }
        Ok(())
    }

    /// Stops every running container of the pod: app containers in parallel, then sidecars in
    /// reverse order, all within one grace period (preStop hooks first, then SIGTERM, then
    /// SIGKILL at the deadline). Every stop runs to its end; the first failure is returned.
    async fn stop_live(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
        grace_from: GraceFrom,
    ) -> Result<(), Error> {
        let live: Vec<&runtime::Container> = rt
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running || c.state == ContainerState::Created)
            .collect();
        let grace_of = |c: &runtime::Container| {
            Duration::from_secs(
                match grace_from {
                    GraceFrom::Spec => grace_period_seconds(pod),
                    GraceFrom::Containers => c.grace_seconds.unwrap_or(grace_period_seconds(pod)),
                }
                .max(0) as u64,
            )
        };
        let host = (self.hook_host(pod, rt, live.iter().map(|c| c.name.as_str()))).await;
        let mut stops = JoinSet::new();
        for (c, (turn, done)) in live.iter().zip(stop_order(pod, &live)) {
            let grace = hooks::Grace {
                period: grace_of(c),
                turn,
            };
            let why = format!("Stopping container {}", c.name);
            let stop = self.stop(pod, &c.id, &c.name, &host, grace, why);
            stops.spawn(async move {
                let result = stop.await;
                done.cancel();
                result
            });
        }
        // Every stop runs to its end; the first failure is reported after all of them.
        let mut first_error: Option<Error> = None;
        while let Some(joined) = stops.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(e.into());
                }
                Err(e) => {
                    first_error.get_or_insert(Error::Io {
                        path: PathBuf::from(full_name(pod)),
                        source: std::io::Error::other(e.to_string()),
                    });
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Stops one of the pod's containers gracefully (its preStop hook, stop signal and grace
    /// period), recording the Killing event with `why`.
    pub(super) fn stop(
        &self,
        pod: &Pod,
        id: &str,
        name: &str,
        host: &str,
        grace: hooks::Grace,
        why: String,
    ) -> impl Future<Output = runtime::Result<()>> + Send + 'static {
        let target = Target::container(pod, name);
        self.events.normal(target.clone(), "Killing", why);
        let want = crate::pod::all_containers(spec(pod))
            .find(|w| w.name == name)
            .cloned();
        let (events, expected) = (self.events.clone(), grace.period);
        let diagnoses = self.diagnoses.clone();
        let step = format!(
            "the stop of container {name} (grace {}s)",
            grace.period.as_secs()
        );
        let what = format!("the stop of container {name} ({id})");
        // Boxed: the stop's state is large, and the futures that await it hold it only once.
        let stop = Box::pin(hooks::stop_container(
            self.runtime.clone(),
            id.to_string(),
            want,
            host.to_string(),
            grace,
            (self.events.clone(), target.clone()),
        ));
        async move {
            let _step = diagnoses.begin(&PodUid(target.uid.clone()), step);
            watched((&events, &diagnoses), &target, &what, expected, stop).await
        }
    }

    /// Where the preStop hooks of the containers `stopping` connect (httpGet, tcpSocket): the
    /// pod's IP, or the node's on the host network or when the sandbox is gone. Empty, with no
    /// call to the runtime, when none of those hooks connects anywhere.
    pub(super) async fn hook_host<'a>(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
        stopping: impl IntoIterator<Item = &'a str>,
    ) -> String {
        let stopping: Vec<&str> = stopping.into_iter().collect();
        let connects = crate::pod::all_containers(spec(pod))
            .filter(|c| stopping.contains(&c.name.as_str()))
            .filter_map(|c| c.lifecycle.as_ref()?.pre_stop.as_ref())
            .any(|hook| hook.http_get.is_some() || hook.tcp_socket.is_some());
        if !connects {
            return String::new();
        }
        if !spec(pod).host_network.unwrap_or(false)
            && let Some(sb) = rt.latest_sandbox()
            && let Ok(ip) = self.pod_ip(&sb.id).await
            && !ip.is_empty()
        {
            return ip;
        }
        self.ctx.host_ip.clone()
    }
}

/// Upstream's termination order for the pod's `live` containers: every container's preStop
/// hook runs at once; the app containers then get their stop signal, each sidecar only once the
/// app containers and the sidecars after it have stopped (reverse order). For each container in
/// turn: what its stop signal waits for (nothing for an app container), and the token its stop
/// cancels when it is done.
fn stop_order(
    pod: &Pod,
    live: &[&runtime::Container],
) -> Vec<(Option<hooks::Turn>, CancellationToken)> {
    let sidecars: Vec<&str> = spec(pod)
        .init_containers
        .iter()
        .flatten()
        .filter(|c| actions::is_sidecar(c))
        .map(|c| c.name.as_str())
        .collect();
    let stopped: HashMap<&str, CancellationToken> = live
        .iter()
        .map(|c| (c.name.as_str(), CancellationToken::new()))
        .collect();
    let apps: Vec<CancellationToken> = live
        .iter()
        .filter(|c| !sidecars.contains(&c.name.as_str()))
        .filter_map(|c| stopped.get(c.name.as_str()).cloned())
        .collect();
    live.iter()
        .map(|c| {
            let name = c.name.as_str();
            let turn = sidecars.iter().position(|s| *s == name).map(|i| {
                let mut before: Vec<CancellationToken> = apps.clone();
                before.extend(
                    sidecars[i + 1..]
                        .iter()
                        .filter_map(|later| stopped.get(later).cloned()),
                );
                Box::pin(async move {
                    for t in before {
                        t.cancelled().await;
                    }
                }) as hooks::Turn
            });
            (turn, stopped.get(name).cloned().unwrap_or_default())
        })
        .collect()
}

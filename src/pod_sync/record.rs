//! The last step of a sync: the pod's status, from its runtime state, its probes and the
//! failures of its latest starts; a terminal one for a pod that ended.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use super::{Error, Syncer, convert, status, watched};
use crate::events::Target;
use crate::pod::spec;
use crate::runtime::{self, ContainerState, PodRuntime};
use crate::types::{PodUid, full_name};

/// Largest termination message read from a container's file (upstream: 4 KiB).
const MAX_TERMINATION_MESSAGE: u64 = 4096;

impl Syncer {
    /// An exited container's termination message: its terminationMessagePath file (at most
    /// 4 KiB), or with FallbackToLogsOnError and a failure, the tail of its log.
    fn termination_message(&self, pod: &Pod, c: &runtime::Container) -> Option<String> {
        if c.state != ContainerState::Exited {
            return None;
        }
        if let Some(file) = &c.termination_message_file
            && let Ok(bytes) = read_bounded(std::path::Path::new(file), false)
            && !bytes.is_empty()
        {
            return Some(String::from_utf8_lossy(&bytes).into_owned());
        }
        if c.termination_message_policy != "FallbackToLogsOnError" || c.exit_code == 0 {
            return None;
        }
        let log = convert::pod_log_dir(&self.ctx, pod)
            .join(convert::container_log_path(&c.name, c.attempt));
        let bytes = read_bounded(&log, true).ok()?;
        Some(log_tail(&String::from_utf8_lossy(&bytes)))
    }

    /// Records the pod's status from a reading of its runtime state and the failures of its
    /// latest starts.
    pub(super) async fn update_status(&self, pod: &Pod, rt: &PodRuntime) -> Result<(), Error> {
        let uid = PodUid::of(pod);
        let mut rt = rt.clone();
        for c in rt.containers.iter_mut() {
            if let Some(message) = self.termination_message(pod, c) {
                c.message = message;
            }
        }
        let pod_ips = self.pod_ips(pod, &rt).await?;
        let (waiting, resize_error) = {
            let books = self.books.lock().unwrap_or_else(|e| e.into_inner());
            let book = books.get(&uid);
            (
                book.map(|b| b.waiting.clone()).unwrap_or_default(),
                book.and_then(|b| b.resize_error.clone()),
            )
        };
        let host_network = spec(pod).host_network.unwrap_or(false);
        let probe_host = match pod_ips.first() {
            Some(ip) if !host_network => ip.clone(),
            _ => self.ctx.host_ip.clone(),
        };
        self.probes.sync_pod(pod, &rt, &probe_host);
        let old = self.statuses.get(&uid);
        let old = old.as_ref().and_then(|e| e.pod.status.as_ref());
        let mut status = status::generate(&status::Input {
            pod,
            rt: &rt,
            pod_ips,
            host_ip: &self.ctx.host_ip,
            waiting: &waiting,
            resize_error: resize_error.as_deref(),
            probes: &self.probe_states(pod, &rt),
            old,
            now: crate::types::now(),
            runtime_name: &self.ctx.runtime_name,
            rro_supported: self.rro_supported(pod, || self.objects.view(pod)),
        });
        self.resources.health_status(pod, &mut status);
        if !all_started(old) && all_started(Some(&status)) {
            count_start(pod);
        }
        if self.status.set(pod, status) {
            tracing::debug!(pod = %full_name(pod), "pod status changed");
        }
        Ok(())
    }

    /// The IPs of the pod's ready sandbox (none without one).
    async fn pod_ips(&self, pod: &Pod, rt: &PodRuntime) -> Result<Vec<String>, Error> {
        let Some(sb) = rt
            .latest_sandbox()
            .filter(|sb| sb.state == runtime::SandboxState::Ready)
        else {
            return Ok(Vec::new());
        };
        let ips = self.runtime.sandbox_ips(&sb.id);
        let what = "the status of its sandbox";
        let reporting = (&self.events, &self.diagnoses);
        match watched(reporting, &Target::pod(pod), what, Duration::ZERO, ips).await {
            Ok(ips) => Ok(ips),
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// What the probes say of each of the pod's containers, by container ID.
    fn probe_states(&self, pod: &Pod, rt: &PodRuntime) -> HashMap<String, status::ProbeState> {
        let results = self.probes.results();
        rt.containers
            .iter()
            .filter_map(|c| {
                let want = crate::pod::all_containers(spec(pod)).find(|w| w.name == c.name)?;
                let (ready, started) = results.state(&c.id, want);
                Some((c.id.clone(), status::ProbeState { ready, started }))
            })
            .collect()
    }

    /// Records the status of a pod whose containers are all stopped, in a terminal phase.
    pub(super) async fn record_final_status(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
    ) -> Result<(), Error> {
        self.update_status(pod, rt).await?;
        let Some(entry) = self.statuses.get(&PodUid::of(pod)) else {
            return Ok(());
        };
        let mut status = entry.pod.status.clone().unwrap_or_default();
        // A container that never ran (or is gone) ends as upstream ends it: unknown, 137.
        let containers = status
            .container_statuses
            .iter_mut()
            .flatten()
            .chain(status.init_container_statuses.iter_mut().flatten());
        for c in containers {
            if c.state.as_ref().is_some_and(|s| s.terminated.is_some()) {
                continue;
            }
            c.ready = false;
            c.started = Some(false);
            c.state = Some(k8s_openapi::api::core::v1::ContainerState {
                terminated: Some(k8s_openapi::api::core::v1::ContainerStateTerminated {
                    reason: Some("ContainerStatusUnknown".into()),
                    message: Some(
                        "The container could not be located when the pod was terminated".into(),
                    ),
                    exit_code: 137,
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        let all_succeeded = status.container_statuses.iter().flatten().all(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        });
        if !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            status.phase = Some(if all_succeeded { "Succeeded" } else { "Failed" }.into());
        }
        self.status.set(pod, status);
        Ok(())
    }
}

fn all_started(status: Option<&PodStatus>) -> bool {
    status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            !cs.is_empty()
                && cs
                    .iter()
                    .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
}

/// The status of a pod the node refused or stopped for good, from its last one (what is known
/// of its containers stays): Failed with `reason` and `message`, as upstream. A pod stopped by
/// node shutdown that had succeeded stays Succeeded. Stops the node decided on by itself
/// (eviction, node shutdown) carry upstream's DisruptionTarget condition.
pub(super) fn failure(last: Option<PodStatus>, reason: &str, message: &str) -> PodStatus {
    let mut status = last.unwrap_or_default();
    let succeeded = status.phase.as_deref() == Some("Succeeded");
    if !(succeeded && reason == crate::shutdown::REASON) {
        status.phase = Some("Failed".into());
    }
    status.reason = Some(reason.into());
    status.message = Some(message.into());
    if matches!(reason, "Evicted" | crate::shutdown::REASON) {
        let conditions = status.conditions.get_or_insert_default();
        conditions.retain(|c| c.type_ != "DisruptionTarget");
        conditions.push(k8s_openapi::api::core::v1::PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some(message.into()),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                crate::types::now(),
            )),
            ..Default::default()
        });
    }
    status
}

/// At most 4 KiB of a file: its start, or with `tail` its end (a log's last lines).
fn read_bounded(path: &std::path::Path, tail: bool) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    if tail {
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(
            len.saturating_sub(MAX_TERMINATION_MESSAGE * 4),
        ))?;
    }
    let mut bytes = Vec::new();
    f.take(MAX_TERMINATION_MESSAGE * if tail { 4 } else { 1 })
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The last 80 lines (at most 2 KiB) of a CRI-format log, without the time/stream/tag prefixes.
fn log_tail(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(""))
        .collect();
    let tail = lines[lines.len().saturating_sub(80)..].join("\n");
    let mut start = tail.len().saturating_sub(2048);
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    tail[start..].to_string()
}

/// Counts a pod whose containers all run for the first time in the pod-start metric, from when
/// the agent first saw its config.
fn count_start(pod: &Pod) {
    if let Some(took) = crate::pod::since_seen(pod) {
        crate::metrics::get().pod_started(took);
    }
}

//! Run-once mode: read each source's first snapshot, run those pods, wait until every pod has
//! its result (Always pods running and ready; OnFailure and Never pods finished), report, and
//! exit. The batch mode upstream's --runonce never was.

use std::collections::HashSet;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::agent::{Core, file_config, http_config, stop_tasks};
use crate::config::{Config, RunOnceOutput, format_duration};
use crate::pod::spec;
use crate::pod_workers::PodSyncer;
use crate::sources::SourceSnapshot;
use crate::sources::{file, http};
use crate::types::{PodUid, full_name, now};

/// Where a pod of the batch stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not there yet.
    Pending,
    /// Done: succeeded, or (restartPolicy Always) running and ready.
    Ok,
    /// Done: failed.
    Failed,
}

/// The outcome of a pod from its restart policy and status.
pub fn outcome(restart_policy: &str, status: Option<&PodStatus>) -> Outcome {
    let Some(status) = status else {
        return Outcome::Pending;
    };
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    match (restart_policy, status.phase.as_deref()) {
        (_, Some("Succeeded")) => Outcome::Ok,
        (_, Some("Failed")) => Outcome::Failed,
        ("Always", Some("Running")) if ready => Outcome::Ok,
        _ => Outcome::Pending,
    }
}

fn restart_policy(pod: &Pod) -> &str {
    spec(pod).restart_policy.as_deref().unwrap_or("Always")
}

/// One line per pod: its phase and its containers' states.
fn progress_line(pod: &Pod, status: Option<&PodStatus>) -> String {
    let Some(status) = status else {
        return format!("{}: waiting to start", full_name(pod));
    };
    let containers: Vec<String> = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .map(|c| format!("{}={}", c.name, state_text(c)))
        .collect();
    format!(
        "{}: {} [{}]",
        full_name(pod),
        status.phase.as_deref().unwrap_or("Pending"),
        containers.join(" ")
    )
}

fn state_text(c: &ContainerStatus) -> String {
    let state = c.state.clone().unwrap_or_default();
    if state.running.is_some() {
        if c.ready {
            "running,ready".into()
        } else {
            "running".into()
        }
    } else if let Some(t) = state.terminated {
        format!("exited({})", t.exit_code)
    } else if let Some(w) = state.waiting {
        w.reason.unwrap_or_else(|| "waiting".into())
    } else {
        "unknown".into()
    }
}

/// Progress on stderr: redrawn in place on a terminal, one line per change otherwise.
struct Progress {
    tty: bool,
    drawn: usize,
    last: Vec<String>,
}

impl Progress {
    fn show(&mut self, lines: Vec<String>) {
        if lines == self.last {
            return;
        }
        let mut err = std::io::stderr().lock();
        if self.tty {
            if self.drawn > 0 {
                let _ = write!(err, "\x1b[{}A", self.drawn);
            }
            for line in &lines {
                let _ = writeln!(err, "\x1b[2K{line}");
            }
            self.drawn = lines.len();
        } else {
            for (i, line) in lines.iter().enumerate() {
                if self.last.get(i) != Some(line) {
                    let _ = writeln!(err, "{line}");
                }
            }
        }
        self.last = lines;
    }
}

fn seconds_between(from: Option<&Timestamp>, to: Option<&Timestamp>) -> Option<f64> {
    let (from, to) = (from?, to?);
    Some(to.duration_since(*from).as_secs_f64().max(0.0))
}

fn container_times(
    c: &ContainerStatus,
) -> (
    Option<Timestamp>,
    Option<Timestamp>,
    Option<i32>,
    Option<String>,
) {
    let state = c.state.clone().unwrap_or_default();
    if let Some(r) = state.running {
        (r.started_at.map(|t| t.0), None, None, None)
    } else if let Some(t) = state.terminated {
        (
            t.started_at.map(|t| t.0),
            t.finished_at.map(|t| t.0),
            Some(t.exit_code),
            t.reason,
        )
    } else {
        (None, None, None, state.waiting.and_then(|w| w.reason))
    }
}

fn duration_text(seconds: Option<f64>) -> String {
    seconds.map_or_else(
        || "-".into(),
        |s| format_duration(Duration::from_secs_f64(s)),
    )
}

/// The final report: a table and, when asked, JSON.
fn report(
    config: &Config,
    pods: &[(Arc<Pod>, Option<PodStatus>, Outcome)],
) -> (String, serde_json::Value) {
    let at = now();
    let mut table = vec![
        ["POD", "CONTAINER", "STATE", "EXIT", "RESTARTS", "DURATION"]
            .map(String::from)
            .to_vec(),
    ];
    let mut json_pods = Vec::new();
    for (pod, status, outcome) in pods {
        let (rows, json) = pod_report(config, pod, status.as_ref(), outcome, at);
        table.extend(rows);
        json_pods.push(json);
    }
    let succeeded = pods.iter().all(|(_, _, o)| *o == Outcome::Ok);
    (
        aligned(&table),
        json!({"succeeded": succeeded, "pods": json_pods}),
    )
}

/// A pod's rows of the report (its own, then one per container) and its JSON.
fn pod_report(
    config: &Config,
    pod: &Pod,
    status: Option<&PodStatus>,
    outcome: &Outcome,
    at: Timestamp,
) -> (Vec<Vec<String>>, serde_json::Value) {
    let st = status.cloned().unwrap_or_default();
    let phase = st.phase.clone().unwrap_or_else(|| "Pending".into());
    let started = st.start_time.as_ref().map(|t| t.0);
    let all: Vec<(bool, &ContainerStatus)> = st
        .init_container_statuses
        .iter()
        .flatten()
        .map(|c| (true, c))
        .chain(st.container_statuses.iter().flatten().map(|c| (false, c)))
        .collect();
    let finished = all.iter().filter_map(|(_, c)| container_times(c).1).max();
    let end = if *outcome == Outcome::Ok && phase == "Running" {
        Some(at)
    } else {
        finished.or(Some(at))
    };
    let mut rows = vec![vec![
        full_name(pod),
        String::new(),
        phase.clone(),
        String::new(),
        String::new(),
        duration_text(seconds_between(started.as_ref(), end.as_ref())),
    ]];
    let mut json_containers = Vec::new();
    for (init, c) in all {
        let (row, json) = container_report(config, pod, init, c, at);
        rows.push(row);
        json_containers.push(json);
    }
    let json = json!({
        "namespace": pod.metadata.namespace,
        "name": pod.metadata.name,
        "uid": pod.metadata.uid,
        "phase": phase,
        "result": match outcome { Outcome::Ok => "ok", Outcome::Failed => "failed", Outcome::Pending => "pending" },
        "startTime": started.map(|t| t.to_string()),
        "containers": json_containers,
    });
    (rows, json)
}

/// A container's row of the report and its JSON (with its log's path).
fn container_report(
    config: &Config,
    pod: &Pod,
    init: bool,
    c: &ContainerStatus,
    at: Timestamp,
) -> (Vec<String>, serde_json::Value) {
    let (from, to, exit, reason) = container_times(c);
    let seconds = seconds_between(from.as_ref(), to.as_ref().or(Some(&at)));
    let row = vec![
        String::new(),
        if init {
            format!("{} (init)", c.name)
        } else {
            c.name.clone()
        },
        state_text(c),
        exit.map_or_else(|| "-".into(), |e| e.to_string()),
        c.restart_count.to_string(),
        duration_text(seconds),
    ];
    let log = config
        .pod_logs_dir
        .join(format!(
            "{}_{}_{}",
            crate::types::namespace(pod),
            pod.metadata.name.as_deref().unwrap_or_default(),
            pod.metadata.uid.as_deref().unwrap_or_default()
        ))
        .join(format!("{}/{}.log", c.name, c.restart_count));
    let json = json!({
        "name": c.name,
        "init": init,
        "state": state_text(c),
        "reason": reason,
        "exitCode": exit,
        "restarts": c.restart_count,
        "startedAt": from.map(|t| t.to_string()),
        "finishedAt": to.map(|t| t.to_string()),
        "logPath": log.display().to_string(),
    });
    (row, json)
}

/// The table's cells padded to their columns' widths.
fn aligned(table: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..6)
        .map(|i| table.iter().map(|row| row[i].len()).max().unwrap_or(0))
        .collect();
    table
        .iter()
        .map(|row| {
            row.iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each pod of the batch with its latest status and outcome.
fn evaluate(
    batch: &[Arc<Pod>],
    status: &crate::status::Reader,
) -> Vec<(Arc<Pod>, Option<PodStatus>, Outcome)> {
    batch
        .iter()
        .map(|p| {
            let st = status
                .get(&PodUid::of(p))
                .and_then(|e| e.pod.status.clone());
            let o = outcome(restart_policy(p), st.as_ref());
            (p.clone(), st, o)
        })
        .collect()
}

/// Reads the sources once: the pods of the batch.
async fn snapshots(config: &Config, deadline: tokio::time::Instant) -> Result<Vec<SourceSnapshot>> {
    let mut out = Vec::new();
    if let Some(path) = &config.static_pod_path {
        let snapshot = file::Scanner::new(file_config(config, path))
            .scan()
            .with_context(|| format!("cannot read the manifest path {}", path.display()))?;
        out.push(snapshot);
    }
    if let Some(url) = &config.static_pod_url {
        let snapshot = http::first_snapshot(&http_config(config, url), deadline)
            .await
            .map_err(|reason| {
                anyhow::anyhow!(
                    "manifest URL {} gave no pods: {reason}",
                    crate::types::redacted_url(url)
                )
            })?;
        out.push(snapshot);
    }
    Ok(out)
}

/// Runs the batch. `Ok(true)` when every pod succeeded (or runs and is ready).
pub async fn run(config: Config, cancel: CancellationToken) -> Result<bool> {
    let deadline = tokio::time::Instant::now() + config.run_once_timeout;
    // Everything the batch starts stops on this token, before any cleanup.
    let core_cancel = cancel.child_token();
    let Some(core) = Core::connect(&config, &core_cancel).await? else {
        return Ok(false);
    };
    let snapshots = snapshots(&config, deadline).await?;
    let mut names = HashSet::new();
    let batch: Vec<Arc<Pod>> = snapshots
        .iter()
        .flat_map(|s| s.pods.iter())
        .filter(|p| names.insert(full_name(p)))
        .cloned()
        .collect();
    eprintln!("run-once: {} pod(s) to run", batch.len());
    let syncer = core.syncer.clone();
    let (tx, rx) = mpsc::channel(snapshots.len().max(1));
    for s in snapshots {
        tx.send(s).await.context("the sync loop stopped")?;
    }
    let (status, tracker) = core.run(rx, core_cancel.clone());

    let timed_out = wait(&batch, &status, &cancel, deadline).await;
    let results = evaluate(&batch, &status);
    let ok = print_report(&config, &results, timed_out, cancel.is_cancelled());

    core_cancel.cancel();
    stop_tasks(&tracker).await;
    if config.run_once_cleanup {
        for pod in &batch {
            if let Err(e) = syncer.terminate_pod(pod.clone()).await {
                eprintln!("run-once: cleaning up {}: {e}", full_name(pod));
            }
        }
    }
    drop(tx);
    Ok(ok)
}

/// Shows the batch's progress until every pod has an outcome (false) or the run is cancelled
/// or times out (true).
async fn wait(
    batch: &[Arc<Pod>],
    status: &crate::status::Reader,
    cancel: &CancellationToken,
    deadline: tokio::time::Instant,
) -> bool {
    let mut progress = Progress {
        tty: unsafe_isatty_stderr(),
        drawn: 0,
        last: Vec::new(),
    };
    let mut watch = status.clone();
    loop {
        let states = evaluate(batch, status);
        progress.show(
            states
                .iter()
                .map(|(p, st, _)| progress_line(p, st.as_ref()))
                .collect(),
        );
        if states.iter().all(|(_, _, o)| *o != Outcome::Pending) {
            return false;
        }
        tokio::select! {
            _ = cancel.cancelled() => return true,
            _ = tokio::time::sleep_until(deadline) => return true,
            _ = watch.changed() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Prints the report in the configured form and names the pods that failed or are still
/// pending; true when every pod ended well.
fn print_report(
    config: &Config,
    results: &[(Arc<Pod>, Option<PodStatus>, Outcome)],
    timed_out: bool,
    interrupted: bool,
) -> bool {
    let (table, json) = report(config, results);
    match config.run_once_output {
        RunOnceOutput::Text => println!("{table}"),
        RunOnceOutput::Json => {
            eprintln!("{table}");
            println!(
                "{}",
                serde_json::to_string_pretty(&json).unwrap_or_default()
            );
        }
    }
    let named = |outcome: Outcome| -> Vec<String> {
        results
            .iter()
            .filter(|(_, _, o)| *o == outcome)
            .map(|(p, _, _)| full_name(p))
            .collect()
    };
    let pending = named(Outcome::Pending);
    let failed = named(Outcome::Failed);
    if timed_out && !pending.is_empty() {
        let why = if interrupted {
            "interrupted".to_string()
        } else {
            format!(
                "timed out after {}",
                format_duration(config.run_once_timeout)
            )
        };
        eprintln!("run-once: {why}; still pending: {}", pending.join(", "));
    }
    if !failed.is_empty() {
        eprintln!("run-once: failed: {}", failed.join(", "));
    }
    !timed_out && failed.is_empty() && pending.is_empty()
}

fn unsafe_isatty_stderr() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(2) == 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodCondition;

    fn status(phase: &str, ready: bool) -> PodStatus {
        PodStatus {
            phase: Some(phase.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn outcomes_follow_the_restart_policy() {
        assert_eq!(outcome("Always", None), Outcome::Pending);
        assert_eq!(
            outcome("Always", Some(&status("Running", false))),
            Outcome::Pending
        );
        assert_eq!(
            outcome("Always", Some(&status("Running", true))),
            Outcome::Ok
        );
        assert_eq!(
            outcome("Never", Some(&status("Running", true))),
            Outcome::Pending
        );
        assert_eq!(
            outcome("Never", Some(&status("Succeeded", false))),
            Outcome::Ok
        );
        assert_eq!(
            outcome("OnFailure", Some(&status("Failed", false))),
            Outcome::Failed
        );
        assert_eq!(
            outcome("OnFailure", Some(&status("Pending", false))),
            Outcome::Pending
        );
    }
}

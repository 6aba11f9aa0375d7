//! Cluster mode in `make bench`: a control plane of its own (hack/k8s/cluster.sh), nodelet
//! joined to it, and pods started through the API beside the same pods as static pods, each
//! timed from its creation to Running as a watch of the API sees it; the API requests per pod;
//! how long after each container of a burst started (the runtime's own timestamp) a watch of
//! the API sees its pod Running; and nodelet's idle footprint in cluster mode.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt as _, watcher};
use nodelet::runtime::RuntimeClient;

use crate::agent::Agent;

/// The node name, also its identity's CN.
const NODE: &str = "bench-cluster";
const LABEL: &str = "nodelet-bench";

/// A control plane in `dir`, stopped (and its directory removed) on drop.
struct ControlPlane {
    script: PathBuf,
    dir: PathBuf,
}

impl ControlPlane {
    fn up(dir: &Path) -> Result<ControlPlane> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/k8s/cluster.sh");
        let cp = ControlPlane {
            script,
            dir: dir.to_path_buf(),
        };
        cp.run(&["up", &dir.display().to_string()])?;
        Ok(cp)
    }

    fn run(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("bash").arg(&self.script).args(args).output()?;
        if !out.status.success() {
            bail!(
                "hack/k8s/cluster.sh {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self.run(&["down", &self.dir.display().to_string()]);
    }
}

/// A bench pod bound to the node; the footprint's pods use the host's network, as the
/// standalone footprint's do.
fn pod_yaml(name: &str, host_network: bool) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{{LABEL}: x}}}}\nspec:\n  nodeName: {NODE}\n  hostNetwork: {host_network}\n  automountServiceAccountToken: false\n  terminationGracePeriodSeconds: 30\n  containers:\n  - name: c\n    image: {}\n    command: [sh, -c, \"{}\"]\n",
        super::IMAGE,
        super::SCRIPT
    )
}

/// What a watch of the API saw: when it first saw each pod (by name) Running, and whether it is
/// gone; and, by pod UID, the wall clock (ns since the epoch) of that first sighting.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Sightings>>);

#[derive(Default)]
struct Sightings {
    running: HashMap<String, Option<Instant>>,
    running_ns: HashMap<String, i64>,
}

impl Seen {
    fn lock(&self) -> std::sync::MutexGuard<'_, Sightings> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn running(&self, names: &[String]) -> Option<Instant> {
        let seen = self.lock();
        names
            .iter()
            .map(|n| seen.running.get(n).copied().flatten())
            .collect::<Option<Vec<Instant>>>()
            .and_then(|t| t.into_iter().max())
    }

    fn gone(&self, names: &[String]) -> bool {
        let seen = self.lock();
        names.iter().all(|n| !seen.running.contains_key(n))
    }
}

fn watch(client: kube::Client) -> Seen {
    let seen = Seen::default();
    let record = seen.clone();
    let api: Api<Pod> = Api::namespaced(client, "default");
    tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default().labels(LABEL))
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let at_ns = super::epoch_ns();
            let mut seen = record.lock();
            let (pod, deleted) = match event {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                Ok(watcher::Event::Delete(p)) => (p, true),
                _ => continue,
            };
            let name = pod.metadata.name.clone().unwrap_or_default();
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            if deleted {
                seen.running.remove(&name);
                seen.running_ns.remove(&uid);
                continue;
            }
            let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            let entry = seen.running.entry(name).or_insert(None);
            if running && entry.is_none() {
                *entry = Some(Instant::now());
                seen.running_ns.insert(uid, at_ns);
            }
        }
    });
    seen
}

async fn wait(what: &str, check: impl Fn() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !check() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Seconds from the first create to the last pod Running, for `n` pods through the API.
async fn through_api(pods: &Api<Pod>, seen: &Seen, n: usize, round: usize) -> Result<f64> {
    let names: Vec<String> = (0..n).map(|i| format!("a{round}-{i}")).collect();
    let started = Instant::now();
    for name in &names {
        let pod: Pod = serde_yaml_ng::from_str(&pod_yaml(name, false))?;
        pods.create(&PostParams::default(), &pod).await?;
    }
    wait("API pods Running", || seen.running(&names).is_some()).await?;
    let took = seen
        .running(&names)
        .map_or(0.0, |t| t.duration_since(started).as_secs_f64());
    for name in &names {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    wait("API pods gone", || seen.gone(&names)).await?;
    Ok(took)
}

/// Seconds from the first manifest written to the last mirror pod Running, for `n` static pods.
async fn through_files(agent: &Agent, seen: &Seen, n: usize, round: usize) -> Result<f64> {
    let names: Vec<String> = (0..n).map(|i| format!("s{round}-{i}")).collect();
    let started = Instant::now();
    for name in &names {
        let tmp = agent.manifests().join(format!(".{name}.tmp"));
        std::fs::write(
            &tmp,
            pod_yaml(name, false).replace(&format!("  nodeName: {NODE}\n"), ""),
        )?;
        std::fs::rename(&tmp, agent.manifests().join(format!("{name}.yaml")))?;
    }
    let mirrors: Vec<String> = names.iter().map(|n| format!("{n}-{NODE}")).collect();
    wait("mirror pods Running", || seen.running(&mirrors).is_some()).await?;
    let took = seen
        .running(&mirrors)
        .map_or(0.0, |t| t.duration_since(started).as_secs_f64());
    for name in &names {
        std::fs::remove_file(agent.manifests().join(format!("{name}.yaml")))?;
    }
    wait("mirror pods gone", || seen.gone(&mirrors)).await?;
    Ok(took)
}

/// For a burst of `n` API pods: seconds from each container's start, as the runtime stamped it,
/// to a watch of the API seeing its pod Running (kubernetes#39113 asks for 1 s at p99).
async fn status_latency(
    rt: &RuntimeClient,
    pods: &Api<Pod>,
    seen: &Seen,
    n: usize,
    round: usize,
) -> Result<Vec<f64>> {
    let names: Vec<String> = (0..n).map(|i| format!("l{round}-{i}")).collect();
    for name in &names {
        let pod: Pod = serde_yaml_ng::from_str(&pod_yaml(name, false))?;
        pods.create(&PostParams::default(), &pod).await?;
    }
    wait("API pods Running", || seen.running(&names).is_some()).await?;
    let sightings: HashMap<String, i64> = seen.lock().running_ns.clone();
    let seen_at: HashMap<String, i64> = rt
        .list_sandboxes(None)
        .await?
        .into_iter()
        .filter_map(|s| Some((s.id, *sightings.get(&s.uid.0)?)))
        .collect();
    let mut latencies = Vec::new();
    for c in rt.list_containers(None).await? {
        let Some(at) = seen_at.get(&c.sandbox_id) else {
            continue;
        };
        let started = rt.container_status(&c.id).await?.started_at;
        latencies.push(super::seconds_since(started, *at));
    }
    if latencies.len() != n {
        bail!(
            "{} of {n} containers found for the status latency",
            latencies.len()
        );
    }
    for name in &names {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    wait("API pods gone", || seen.gone(&names)).await?;
    Ok(latencies)
}

/// The API server's request count so far (every verb and resource).
async fn requests(client: &kube::Client) -> Result<f64> {
    let text = client
        .request_text(axum::http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Which cluster-mode measurements to take.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The start scenarios, the status latency and the footprint.
    All,
    /// The footprint only.
    Footprint,
    /// The status latency only.
    Status,
}

/// The cluster-mode measurements, as JSON rows.
pub async fn run(
    nodelet: &Path,
    endpoint: &Path,
    work: &Path,
    (burst, max): (usize, usize),
    (pairs, window): (usize, Duration),
    part: Part,
) -> Result<serde_json::Value> {
    let rt = RuntimeClient::new(endpoint, endpoint, Duration::from_secs(120));
    let cp = ControlPlane::up(&work.join("cluster"))?;
    let kubeconfig = cp.run(&["node", &cp.dir.display().to_string(), NODE])?;
    let admin = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(
            Kubeconfig::read_from(cp.dir.join("admin.kubeconfig"))?,
            &KubeConfigOptions::default(),
        )
        .await?,
    )?;
    // Without a controller manager, the namespace's service account is made here: pods need it.
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}}))?;
    Api::<ServiceAccount>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &account)
        .await?;
    // The standalone agent with a kubeconfig: it serves the authenticated port too (the
    // default, as a kubelet in a cluster must), so the footprints compare like for like.
    let agent = Agent::nodelet(
        nodelet,
        (endpoint, NODE),
        &work.join("cluster-agent"),
        &["--kubeconfig", &kubeconfig],
        &work.join("cluster-agent.log"),
    )?;
    let seen = watch(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let mut rows = Vec::new();
    let mut round = 0;
    let scenarios = match part {
        Part::Footprint | Part::Status => vec![],
        Part::All => vec![
            ("one pod x10", 1usize, 10usize),
            ("burst", burst, 2 * pairs),
        ],
    };
    for (name, n, count) in scenarios {
        let (mut api, mut files) = (Vec::new(), Vec::new());
        let mut per_pod = Vec::new();
        for i in 0..count {
            round += 1;
            // Which goes first alternates, as the floor pairs do.
            if i % 2 == 1 {
                super::quiesce().await;
                files.push(through_files(&agent, &seen, n, round).await?);
            }
            super::quiesce().await;
            let before = requests(&admin).await?;
            api.push(through_api(&pods, &seen, n, round).await?);
            // The bench's own requests: n creates, n deletes and one metrics read.
            let mine = 2.0 * n as f64 + 1.0;
            per_pod.push(((requests(&admin).await? - before - mine) / n as f64).max(0.0));
            if i % 2 == 0 {
                super::quiesce().await;
                files.push(through_files(&agent, &seen, n, round).await?);
            }
        }
        let row = serde_json::json!({
            "scenario": name, "pods": n, "runs": count,
            "api_start_s": super::median(api.clone()),
            "static_start_s": super::median(files.clone()),
            "api_over_static": super::median(api.iter().zip(&files).map(|(a, f)| a / f.max(1e-9)).collect()),
            "api_requests_per_pod": super::median(per_pod),
            "api_s": api, "static_s": files,
        });
        eprintln!("{row}");
        rows.push(row);
    }
    let mut status = serde_json::Value::Null;
    if part != Part::Footprint {
        let mut all = Vec::new();
        for _ in 0..pairs {
            round += 1;
            super::quiesce().await;
            all.extend(status_latency(&rt, &pods, &seen, max, round).await?);
        }
        status = serde_json::json!({
            "pods": max, "runs": pairs,
            "p50_s": super::percentile(all.clone(), 0.5),
            "p99_s": super::percentile(all.clone(), 0.99),
            "max_s": super::percentile(all.clone(), 1.0),
        });
        eprintln!("status latency: {status}");
    }
    let pid = agent.pid();
    let mut prints = Vec::new();
    let footprints: &[usize] = if part == Part::Status { &[] } else { &[0, max] };
    for &n in footprints {
        round += 1;
        let names: Vec<String> = (0..n).map(|i| format!("f{round}-{i}")).collect();
        for name in &names {
            let pod: Pod = serde_yaml_ng::from_str(&pod_yaml(name, true))?;
            pods.create(&PostParams::default(), &pod).await?;
        }
        wait("footprint pods Running", || {
            seen.running(&names).is_some() || n == 0
        })
        .await?;
        prints.push(
            serde_json::json!({"pods": n, "usage": super::footprint(pid, None, window).await}),
        );
        for name in &names {
            pods.delete(name, &DeleteParams::default()).await?;
        }
        wait("footprint pods gone", || seen.gone(&names)).await?;
    }
    drop(agent);
    drop(cp);
    Ok(serde_json::json!({"scenarios": rows, "status_latency": status, "footprint": prints}))
}

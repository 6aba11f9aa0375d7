//! `make bench`: pod start-up and teardown through nodelet against the runtime's own floor (the
//! same CRI calls made directly) and against the upstream kubelet (`--kubelet`, on a containerd
//! of its own), and both agents' footprints. The sides run in turns within one invocation; only
//! ratios are meant to be compared across runs. By default that is all, over CNI only, with 3
//! rounds, the floor all at once, and 20 s footprints: a run short enough for every change to a
//! hot path.
//!
//! With `--full` (5 rounds and 60 s footprints unless given, the floor's fastest concurrency
//! chosen first, the host's network too), then
//! cluster mode (`cluster.rs`): pods through the API beside static pods, API requests per pod,
//! and the footprint joined to a control plane. Then the PLEG following the runtime's container
//! events against relisting every second. Last (`bootstrap.rs`), `kubeadm init` with nodelet as
//! the node agent against the same with the upstream kubelet.
//!
//! Usage: bench --endpoint unix:///path.sock --nodelet PATH [--out DIR] [--pairs N]
//!              [--kubelet PATH --kubelet-endpoint unix:///other.sock]
//!              [--footprint-secs S] [--work-dir DIR] [--sizes B,M]
//!              [--full | --only footprint|pleg|bootstrap|status]

mod agent;
mod bootstrap;
mod cluster;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent::{Agent, AgentRun};
use anyhow::{Context, Result, bail};
use nodelet::pod_sync::convert::{MASKED_PATHS, READONLY_PATHS};
use nodelet::runtime::{ANNOTATION_NODE_NAME, LABEL_POD_UID, RuntimeClient, cri};
use tokio::task::JoinSet;

const IMAGE: &str = "localhost/busybox:local";
const NODE: &str = "bench";
/// The floor's cgroup root: like the agents' pods, the floor's share one parent cgroup (the CPU
/// weight of a busy machine is split between groups, not processes).
const FLOOR_CGROUP_ROOT: &str = "nodelet-bench-floor";
/// Exits at once on SIGTERM, so teardown measures the agent, not a grace period.
const SCRIPT: &str = "trap 'exit 0' TERM; sleep 3600 & wait";

struct Args {
    endpoint: PathBuf,
    nodelet: PathBuf,
    /// The upstream kubelet and the socket of the containerd it runs on alone.
    kubelet: Option<(PathBuf, PathBuf)>,
    out: PathBuf,
    /// Rounds (floor, nodelet and kubelet once each) of the burst and max-pods scenarios; with
    /// `--full` the burst has twice as many (its target is a ratio, and one burst's time spreads
    /// by a tenth or more from run to run, so a median of five moves by several hundredths), the
    /// one-pod scenario always 10.
    pairs: usize,
    footprint: Duration,
    /// Pod counts of the burst and max-pods scenarios (30 and 110; smaller for a smoke run).
    sizes: (usize, usize),
    /// Where the agent's directories and the floor's pod files go (a fresh directory inside
    /// it): the system's temporary directory unless given.
    work_dir: PathBuf,
    /// Only the footprints, standalone and in cluster mode (`--only footprint`): minutes
    /// instead of an hour, for work on memory.
    footprint_only: bool,
    /// Only the PLEG comparison (`--only pleg`).
    pleg_only: bool,
    /// Only kubeadm init under nodelet and under the kubelet (`--only bootstrap`).
    bootstrap_only: bool,
    /// Only the status latency in cluster mode (`--only status`).
    status_only: bool,
    /// Every part, cluster mode, the PLEG and kubeadm included (`--full`): about an hour.
    full: bool,
}

fn args() -> Result<Args> {
    let mut a = Args {
        endpoint: PathBuf::from("/var/lib/nodelet-testbed/containerd.sock"),
        nodelet: PathBuf::from("target/release/nodelet"),
        kubelet: None,
        out: PathBuf::from("target/bench"),
        pairs: 0,
        footprint: Duration::ZERO,
        sizes: (30, 110),
        work_dir: std::env::temp_dir(),
        footprint_only: false,
        pleg_only: false,
        bootstrap_only: false,
        status_only: false,
        full: false,
    };
    let (mut kubelet, mut kubelet_endpoint) = (None, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--full" {
            a.full = true;
            continue;
        }
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--endpoint" => a.endpoint = PathBuf::from(value.trim_start_matches("unix://")),
            "--nodelet" => a.nodelet = PathBuf::from(value),
            "--kubelet" => kubelet = Some(PathBuf::from(value)),
            "--kubelet-endpoint" => {
                kubelet_endpoint = Some(PathBuf::from(value.trim_start_matches("unix://")))
            }
            "--out" => a.out = PathBuf::from(value),
            "--pairs" => a.pairs = value.parse()?,
            "--footprint-secs" => a.footprint = Duration::from_secs(value.parse()?),
            "--work-dir" => a.work_dir = PathBuf::from(value),
            "--sizes" => {
                let (burst, max) = value.split_once(',').context("--sizes BURST,MAX")?;
                a.sizes = (burst.parse()?, max.parse()?);
            }
            "--only" if value == "footprint" => a.footprint_only = true,
            "--only" if value == "pleg" => a.pleg_only = true,
            "--only" if value == "bootstrap" => a.bootstrap_only = true,
            "--only" if value == "status" => a.status_only = true,
            other => bail!("unknown flag {other} {value}"),
        }
    }
    a.kubelet = match (kubelet, kubelet_endpoint) {
        (Some(binary), Some(endpoint)) => Some((binary, endpoint)),
        (None, None) => None,
        _ => bail!("--kubelet and --kubelet-endpoint go together"),
    };
    let (pairs, footprint) = if a.full { (5, 60) } else { (3, 20) };
    if a.pairs == 0 {
        a.pairs = pairs;
    }
    if a.footprint.is_zero() {
        a.footprint = Duration::from_secs(footprint);
    }
    Ok(a)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 0 => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        n => v[n / 2],
    }
}

fn p90(v: Vec<f64>) -> f64 {
    percentile(v, 0.9)
}

/// The nearest-rank percentile `q` (0 to 1) of `v`.
fn percentile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.0
    } else {
        v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
    }
}

/// The bench pod's namespaces, as nodelet sets them: the node's network or the pod's, a PID
/// namespace per container, the pod's IPC namespace.
fn namespaces(host_network: bool) -> cri::NamespaceOption {
    let network = if host_network {
        cri::NamespaceMode::Node
    } else {
        cri::NamespaceMode::Pod
    };
    cri::NamespaceOption {
        network: network as i32,
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// Floor runs so far: each run's pods are new pods (a UID, files and cgroups of their own), as
/// the agent's are, rather than finding the previous run's files and pod cgroups in place.
static FLOOR_RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One floor pod: its sandbox, its container, and its UID.
struct FloorPod {
    sandbox: String,
    container: String,
    uid: String,
}

/// One pod the way nodelet would make it, made directly over CRI.
async fn floor_pod(
    rt: RuntimeClient,
    (run, i): (usize, usize),
    host_network: bool,
    image: String,
    logs: PathBuf,
) -> Result<FloorPod> {
    let uid = format!("floor-{}-{run}-{i}", std::process::id());
    let labels: std::collections::HashMap<String, String> =
        [(LABEL_POD_UID.to_string(), uid.clone())].into();
    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: format!("floor-{i}"),
            uid: uid.clone(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: if host_network {
            String::new()
        } else {
            format!("floor-{i}")
        },
        log_directory: logs.join(&uid).display().to_string(),
        labels: labels.clone(),
        // Marked as another node's, so the nodelet under test leaves the floor's pods alone.
        annotations: [(ANNOTATION_NODE_NAME.to_string(), "bench-floor".to_string())].into(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: format!("/{}", floor_pod_cgroup(&uid)),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces(host_network)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = rt.run_pod_sandbox(sandbox.clone(), String::new()).await?;
    let container = floor_container(&logs.join(&uid), host_network, image, labels)?;
    let cid = rt.create_container(&id, container, sandbox, None).await?;
    rt.start_container(&cid).await?;
    Ok(FloorPod {
        sandbox: id,
        container: cid,
        uid,
    })
}

/// A floor pod's cgroup, as nodelet lays out a BestEffort pod's.
fn floor_pod_cgroup(uid: &str) -> String {
    format!("{FLOOR_CGROUP_ROOT}/kubepods/besteffort/pod{uid}")
}

/// The floor's container: what nodelet asks of the runtime for the bench's pod (a BestEffort
/// container with upstream's defaults), so that the floor does the same runtime work and only
/// the agent's own costs stand between the two: its own PID namespace, /proc and /sys paths
/// masked and read-only, the termination-log and /etc/hosts files bind-mounted, CPU shares and
/// oom_score_adj set.
fn floor_container(
    dir: &Path,
    host_network: bool,
    image: String,
    labels: std::collections::HashMap<String, String>,
) -> Result<cri::ContainerConfig> {
    std::fs::create_dir_all(dir)?;
    let hosts = dir.join("etc-hosts");
    std::fs::write(&hosts, "127.0.0.1\tlocalhost\n::1\tlocalhost\n")?;
    let termination_log = dir.join("termination-log");
    std::fs::write(&termination_log, "")?;
    let mount = |container_path: &str, host_path: &Path| cri::Mount {
        container_path: container_path.into(),
        host_path: host_path.display().to_string(),
        ..Default::default()
    };
    let to_strings = |paths: &[&str]| paths.iter().map(|p| p.to_string()).collect();
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "c".into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image,
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), SCRIPT.into()],
        log_path: "c/0.log".into(),
        labels,
        mounts: vec![
            mount("/dev/termination-log", &termination_log),
            mount("/etc/hosts", &hosts),
        ],
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(cri::LinuxContainerResources {
                cpu_shares: 2,
                oom_score_adj: 1000,
                ..Default::default()
            }),
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(namespaces(host_network)),
                seccomp: Some(cri::SecurityProfile {
                    profile_type: cri::security_profile::ProfileType::Unconfined as i32,
                    ..Default::default()
                }),
                masked_paths: to_strings(MASKED_PATHS),
                readonly_paths: to_strings(READONLY_PATHS),
                ..Default::default()
            }),
        }),
        ..Default::default()
    })
}

/// One run's (start seconds, teardown seconds).
type Run = (f64, f64);

/// The floor for n pods, started and torn down at these concurrencies.
async fn floor(
    rt: &RuntimeClient,
    n: usize,
    host_network: bool,
    (start_at, teardown_at): (usize, usize),
    image: &str,
    logs: &Path,
) -> Result<Run> {
    let run = FLOOR_RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    quiesce().await;
    let started = epoch_ns();
    let mut made = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(start_at) {
        let mut set = JoinSet::new();
        for &i in chunk {
            set.spawn(floor_pod(
                rt.clone(),
                (run, i),
                host_network,
                image.to_string(),
                logs.to_path_buf(),
            ));
        }
        while let Some(r) = set.join_next().await {
            made.push(r??);
        }
    }
    let containers: Vec<String> = made.iter().map(|p| p.container.clone()).collect();
    let start = seconds_since(started, last_started(rt, &containers).await?);
    let started = Instant::now();
    for chunk in made.chunks(teardown_at) {
        let mut set = JoinSet::new();
        for pod in chunk {
            let (rt, sandbox, container) = (rt.clone(), pod.sandbox.clone(), pod.container.clone());
            let (files, cgroup) = (logs.join(&pod.uid), floor_pod_cgroup(&pod.uid));
            // What a pod's removal needs besides the runtime's work: its files (the logs,
            // etc-hosts, the termination log) and its cgroup go, as the agent's do.
            set.spawn(async move {
                rt.stop_container(&container, 30).await?;
                rt.remove_container(&container).await?;
                rt.stop_pod_sandbox(&sandbox).await?;
                rt.remove_pod_sandbox(&sandbox).await?;
                std::fs::remove_dir_all(&files)?;
                nodelet::cgroups::remove_tree(&cgroup)?;
                anyhow::Ok(())
            });
        }
        while let Some(r) = set.join_next().await {
            r??;
        }
    }
    Ok((start, started.elapsed().as_secs_f64()))
}

/// The concurrency levels the floor is measured at for n pods: sequential, 2 to 16, and all at
/// once (what the agent does).
fn concurrencies(n: usize) -> Vec<usize> {
    let mut levels: Vec<usize> = [1, 2, 4, 8, 16, n]
        .into_iter()
        .filter(|&c| c <= n)
        .collect();
    levels.dedup();
    levels
}

/// The floor's level for one measure (start or teardown seconds): the one with the fastest
/// median over the selection passes.
fn best_level(samples: &BTreeMap<usize, Vec<Run>>, measure: impl Fn(&Run) -> f64) -> usize {
    let at = |c: &usize| median(samples[c].iter().map(&measure).collect());
    samples
        .keys()
        .copied()
        .min_by(|a, b| at(a).total_cmp(&at(b)))
        .unwrap_or(1)
}

/// One scenario's runs. With `select`, the floor's levels are first measured in two selection
/// passes (in rising order, then falling, so drift over the passes falls evenly on them) to
/// find the fastest for starting and for tearing down; otherwise the floor makes every pod at
/// once, as the agents do. Then the floor at those levels, nodelet and the kubelet run in
/// rounds, each side once, in alternating order (floor first, then kubelet first; nodelet always
/// between), and each round gives one ratio per comparison. Rounds take the machine's drift
/// out of the ratios, and measuring the floor apart from choosing its level keeps the luckiest
/// of six noisy levels from becoming the floor.
struct Scenario {
    /// Floor (start, teardown) seconds by concurrency, from the selection passes.
    levels: BTreeMap<usize, Vec<Run>>,
    start_at: usize,
    teardown_at: usize,
    rounds: Vec<Round>,
}

#[derive(serde::Serialize)]
struct Round {
    floor: Run,
    nodelet: AgentRun,
    kubelet: Option<AgentRun>,
}

/// The sides under comparison: the floor runs on nodelet's runtime.
struct Sides<'a> {
    rt: &'a RuntimeClient,
    nodelet: &'a Agent,
    kubelet: Option<&'a Agent>,
    image: &'a str,
    logs: &'a Path,
}

/// One agent's run, the agent thawed only for it.
async fn thawed(agent: &Agent, n: usize, host_network: bool) -> Result<AgentRun> {
    agent.resume().await?;
    let run = agent.run(n, host_network).await;
    agent.pause();
    run
}

async fn scenario(
    sides: &Sides<'_>,
    (n, host_network, rounds): (usize, bool, usize),
    select: bool,
) -> Result<Scenario> {
    let (rt, image, logs) = (sides.rt, sides.image, sides.logs);
    let mut levels: BTreeMap<usize, Vec<Run>> = BTreeMap::new();
    let mut order = if select { concurrencies(n) } else { Vec::new() };
    for _ in 0..2 {
        for &c in &order {
            let sample = floor(rt, n, host_network, (c, c), image, logs).await?;
            levels.entry(c).or_default().push(sample);
        }
        order.reverse();
    }
    let at = if select {
        (best_level(&levels, |s| s.0), best_level(&levels, |s| s.1))
    } else {
        (n, n)
    };
    let mut out = Scenario {
        levels,
        start_at: at.0,
        teardown_at: at.1,
        rounds: Vec::new(),
    };
    for i in 0..rounds {
        let kubelet = async || match sides.kubelet {
            Some(k) => thawed(k, n, host_network).await.map(Some),
            None => Ok(None),
        };
        let round = if i % 2 == 0 {
            let floor = floor(rt, n, host_network, at, image, logs).await?;
            let nodelet = thawed(sides.nodelet, n, host_network).await?;
            let kubelet = kubelet().await?;
            Round {
                floor,
                nodelet,
                kubelet,
            }
        } else {
            let kubelet = kubelet().await?;
            let nodelet = thawed(sides.nodelet, n, host_network).await?;
            let floor = floor(rt, n, host_network, at, image, logs).await?;
            Round {
                floor,
                nodelet,
                kubelet,
            }
        };
        out.rounds.push(round);
    }
    Ok(out)
}

/// Nanoseconds since the epoch, the clock the runtime stamps container starts with.
fn epoch_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

fn seconds_since(start_ns: i64, end_ns: i64) -> f64 {
    (end_ns - start_ns) as f64 / 1e9
}

/// When the last of these containers started, as the runtime recorded it.
async fn last_started(rt: &RuntimeClient, containers: &[String]) -> Result<i64> {
    let mut last = 0;
    for id in containers {
        last = last.max(rt.container_status(id).await?.started_at);
    }
    Ok(last)
}

/// Waits (up to half a minute) until the machine is quiet: under a tenth of its CPU busy over a
/// quarter of a second. A run ends when the runtime reports its pods gone, but shims exiting and
/// snapshots being removed go on for a while; without this the next run, floor or nodelet, pays
/// for them.
async fn quiesce() {
    const WINDOW: Duration = Duration::from_millis(250);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let before = nodelet::server::stats::node_cpu_ns();
        tokio::time::sleep(WINDOW).await;
        let (Some(before), Some(after)) = (before, nodelet::server::stats::node_cpu_ns()) else {
            return;
        };
        let busy = after.saturating_sub(before) as f64 / 1e9;
        if busy < 0.1 * cpus * WINDOW.as_secs_f64() {
            return;
        }
    }
}

/// What a process uses: RSS, of it the anonymous part (the rest is mostly the binary's code
/// pages, shared and reclaimable), peak RSS (MiB) and CPU seconds.
struct Usage {
    rss: f64,
    anon: f64,
    peak: f64,
    cpu: f64,
}

fn usage(pid: u32) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = (rest.get(11)?.parse::<f64>().ok()? + rest.get(12)?.parse::<f64>().ok()?) / ticks;
    Some(Usage {
        rss: kib("VmRSS:")? / 1024.0,
        anon: kib("RssAnon:")? / 1024.0,
        peak: kib("VmHWM:")? / 1024.0,
        cpu,
    })
}

/// Idle footprint over `window`: RSS, peak and % of one core, for the agent and its runtime.
async fn footprint(pid: u32, containerd: Option<u32>, window: Duration) -> serde_json::Value {
    let before = (usage(pid), containerd.and_then(usage));
    tokio::time::sleep(window).await;
    let after = (usage(pid), containerd.and_then(usage));
    let describe = |b: Option<Usage>, a: Option<Usage>| match (b, a) {
        (Some(b), Some(a)) => {
            serde_json::json!({"rss_mib": a.rss, "anon_rss_mib": a.anon, "peak_rss_mib": a.peak, "cpu_percent": 100.0 * (a.cpu - b.cpu) / window.as_secs_f64()})
        }
        _ => serde_json::Value::Null,
    };
    serde_json::json!({"agent": describe(before.0, after.0), "containerd": describe(before.1, after.1)})
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    std::fs::create_dir_all(&a.out)?;
    let rt = RuntimeClient::new(&a.endpoint, &a.endpoint, Duration::from_secs(120));
    rt.version().await.context("the runtime does not answer")?;
    let image = rt
        .image_status(IMAGE)
        .await?
        .context("busybox image missing: run make images")?
        .id;
    let work = tempfile::tempdir_in(&a.work_dir)
        .with_context(|| format!("a work directory in {}", a.work_dir.display()))?;
    let logs = work.path().join("floor-logs");
    if a.pleg_only {
        let pleg = pleg_comparison(&a, work.path()).await?;
        return write_report(&a, BTreeMap::from([("pleg", pleg)]));
    }
    if a.bootstrap_only {
        let b = bootstrap::run(&a.nodelet, a.pairs, a.footprint).await?;
        return write_report(&a, BTreeMap::from([("bootstrap", b)]));
    }
    if a.status_only {
        let c = cluster::run(
            &a.nodelet,
            &a.endpoint,
            work.path(),
            a.sizes,
            (a.pairs, a.footprint),
            cluster::Part::Status,
        )
        .await?;
        print_status_latency(&c);
        return write_report(&a, BTreeMap::from([("cluster", c)]));
    }
    let nodelet = Agent::nodelet(
        &a.nodelet,
        (&a.endpoint, NODE),
        &work.path().join("agent"),
        &[],
        &a.out.join("nodelet.log"),
    )?;
    nodelet.ready().await?;
    nodelet.pause();
    let kubelet = match &a.kubelet {
        Some((binary, endpoint)) => {
            let k = Agent::kubelet(
                binary,
                endpoint,
                &work.path().join("kubelet"),
                &a.out.join("kubelet.log"),
            )?;
            k.ready().await?;
            k.pause();
            Some(k)
        }
        None => None,
    };
    let sides = Sides {
        rt: &rt,
        nodelet: &nodelet,
        kubelet: kubelet.as_ref(),
        image: &image,
        logs: &logs,
    };
    let mut report = BTreeMap::new();
    let mut rows = Vec::new();
    let networks: &[bool] = if a.footprint_only {
        &[]
    } else if a.full {
        &[false, true]
    } else {
        &[false]
    };
    for &host_network in networks {
        let net = if host_network { "hostNetwork" } else { "cni" };
        let (burst, max) = a.sizes;
        let burst_rounds = if a.full { 2 * a.pairs } else { a.pairs };
        for (name, n, rounds) in [
            ("one pod x10".to_string(), 1usize, 10usize),
            (format!("burst of {burst}"), burst, burst_rounds),
            (format!("{max} pods"), max, a.pairs),
        ] {
            let run = scenario(&sides, (n, host_network, rounds), a.full).await?;
            let row = scenario_row(&run, net, &name, n);
            eprintln!("{row}");
            rows.push(row);
        }
    }
    report.insert("scenarios", serde_json::Value::Array(rows.clone()));
    let mut prints = Vec::new();
    for pods in [0usize, a.sizes.0, a.sizes.1] {
        let mut entry = serde_json::json!({ "pods": pods });
        for agent in std::iter::once(&nodelet).chain(kubelet.as_ref()) {
            agent.resume().await?;
            agent.start_pods(pods, true).await?;
            quiesce().await;
            entry[agent.kind.name()] =
                footprint(agent.pid(), agent.containerd_pid, a.footprint).await;
            agent.stop_pods(pods).await?;
            agent.pause();
        }
        prints.push(entry);
    }
    report.insert("footprint", serde_json::Value::Array(prints.clone()));
    drop(nodelet);
    drop(kubelet);
    let _ = nodelet::cgroups::remove_tree(FLOOR_CGROUP_ROOT);
    print_scenarios(&rows);
    print_footprints(&prints);
    if !(a.full || a.footprint_only) {
        return write_report(&a, report);
    }
    let in_cluster = cluster::run(
        &a.nodelet,
        &a.endpoint,
        work.path(),
        a.sizes,
        (a.pairs, a.footprint),
        if a.footprint_only {
            cluster::Part::Footprint
        } else {
            cluster::Part::All
        },
    )
    .await?;
    report.insert("cluster", in_cluster.clone());

    println!(
        "\ncluster mode: {:<12} {:>12} {:>12} {:>10} {:>14}",
        "scenario", "API s", "static s", "API/static", "API req/pod"
    );
    for r in in_cluster["scenarios"].as_array().into_iter().flatten() {
        println!(
            "              {:<12} {:>12.3} {:>12.3} {:>10.2} {:>14.1}",
            format!("{} x{}", r["scenario"].as_str().unwrap_or(""), r["pods"]),
            r["api_start_s"].as_f64().unwrap_or(0.0),
            r["static_start_s"].as_f64().unwrap_or(0.0),
            r["api_over_static"].as_f64().unwrap_or(0.0),
            r["api_requests_per_pod"].as_f64().unwrap_or(0.0),
        );
    }
    print_status_latency(&in_cluster);
    let standalone = |pods: u64, key: &str| {
        prints
            .iter()
            .find(|p| p["pods"] == pods)
            .and_then(|p| p["nodelet"]["agent"][key].as_f64())
            .unwrap_or(0.0)
    };
    for p in in_cluster["footprint"].as_array().into_iter().flatten() {
        let pods = p["pods"].as_u64().unwrap_or(0);
        let rss = p["usage"]["agent"]["rss_mib"].as_f64().unwrap_or(0.0);
        let anon = p["usage"]["agent"]["anon_rss_mib"].as_f64().unwrap_or(0.0);
        let cpu = p["usage"]["agent"]["cpu_percent"].as_f64().unwrap_or(0.0);
        println!(
            "cluster mode, {pods} API pods: RSS {rss:.1} MiB ({:.2}x standalone; anonymous {anon:.1} MiB, {:.2}x), CPU {cpu:.2}% ({:.2}x standalone)",
            rss / standalone(pods, "rss_mib").max(1e-9),
            anon / standalone(pods, "anon_rss_mib").max(1e-9),
            cpu / standalone(pods, "cpu_percent").max(1e-9),
        );
    }
    if a.footprint_only {
        return write_report(&a, report);
    }
    let pleg = pleg_comparison(&a, work.path()).await?;
    report.insert("pleg", pleg);
    report.insert(
        "bootstrap",
        bootstrap::run(&a.nodelet, a.pairs, a.footprint).await?,
    );
    write_report(&a, report)
}

/// A scenario's medians and ratios, and every run's seconds.
fn scenario_row(run: &Scenario, net: &str, name: &str, n: usize) -> serde_json::Value {
    let each = |pick: &dyn Fn(&Round) -> Option<f64>| -> Vec<f64> {
        run.rounds.iter().filter_map(pick).collect()
    };
    let added = each(&|r| Some((r.nodelet.start - r.floor.0) * 1000.0));
    let by_level: BTreeMap<String, f64> = run
        .levels
        .iter()
        .map(|(c, v)| (c.to_string(), median(v.iter().map(|s| s.0).collect())))
        .collect();
    let selection: BTreeMap<String, &Vec<Run>> =
        run.levels.iter().map(|(c, v)| (c.to_string(), v)).collect();
    let mut row = serde_json::json!({
        "network": net, "scenario": name, "pods": n, "rounds": run.rounds.len(),
        "floor_start_s": median(each(&|r| Some(r.floor.0))),
        "nodelet_start_s": median(each(&|r| Some(r.nodelet.start))),
        "floor_concurrency": run.start_at, "floor_start_s_by_concurrency": by_level,
        "start_ratio": median(each(&|r| Some(r.nodelet.start / r.floor.0.max(1e-9)))),
        "added_ms_median": median(added.clone()), "added_ms_p90": p90(added),
        "floor_teardown_s": median(each(&|r| Some(r.floor.1))),
        "floor_teardown_concurrency": run.teardown_at,
        "nodelet_teardown_s": median(each(&|r| r.nodelet.removed)),
        "teardown_ratio": median(each(&|r| Some(r.nodelet.removed? / r.floor.1.max(1e-9)))),
        "nodelet_stop_s": median(each(&|r| Some(r.nodelet.stopped))),
        "floor_selection_s": selection, "rounds_s": run.rounds,
    });
    if run.rounds.iter().any(|r| r.kubelet.is_some()) {
        let k = |pick: &dyn Fn(&AgentRun, &Round) -> f64| {
            median(each(&|r| Some(pick(r.kubelet.as_ref()?, r))))
        };
        row["kubelet_start_s"] = k(&|k, _| k.start).into();
        row["kubelet_stop_s"] = k(&|k, _| k.stopped).into();
        row["kubelet_start_ratio"] = k(&|k, r| k.start / r.floor.0.max(1e-9)).into();
        row["nodelet_over_kubelet_start"] = k(&|k, r| r.nodelet.start / k.start.max(1e-9)).into();
        row["nodelet_over_kubelet_teardown"] =
            k(&|k, r| r.nodelet.stopped / k.stopped.max(1e-9)).into();
    }
    row
}

fn print_scenarios(rows: &[serde_json::Value]) {
    let f = |r: &serde_json::Value, key: &str| r[key].as_f64().unwrap_or(f64::NAN);
    println!(
        "{:<12} {:<12} {:>8} {:>9} {:>9} {:>8} {:>8} {:>11} {:>11} {:>9}",
        "network",
        "scenario",
        "floor s",
        "kubelet s",
        "nodelet s",
        "n/floor",
        "n/kubelet",
        "teardown/fl",
        "teardown/kl",
        "floor at"
    );
    for r in rows {
        println!(
            "{:<12} {:<12} {:>8.3} {:>9.3} {:>9.3} {:>8.2} {:>8.2} {:>11.2} {:>11.2} {:>9}",
            r["network"].as_str().unwrap_or(""),
            r["scenario"].as_str().unwrap_or(""),
            f(r, "floor_start_s"),
            f(r, "kubelet_start_s"),
            f(r, "nodelet_start_s"),
            f(r, "start_ratio"),
            f(r, "nodelet_over_kubelet_start"),
            f(r, "teardown_ratio"),
            f(r, "nodelet_over_kubelet_teardown"),
            format!(
                "{}/{}",
                r["floor_concurrency"].as_u64().unwrap_or(0),
                r["floor_teardown_concurrency"].as_u64().unwrap_or(0)
            )
        );
    }
}

/// Each agent's idle footprint, side by side, and the targets against the kubelet.
fn print_footprints(prints: &[serde_json::Value]) {
    let f = |p: &serde_json::Value, agent: &str, key: &str| {
        p[agent]["agent"][key].as_f64().unwrap_or(f64::NAN)
    };
    println!(
        "\n{:<6} {:>12} {:>12} {:>12} {:>8} {:>12} {:>12} {:>8} {:>15}",
        "pods",
        "nodelet RSS",
        "kubelet RSS",
        "nodelet peak",
        "n/k RSS",
        "nodelet CPU",
        "kubelet CPU",
        "n/k CPU",
        "containerd RSS"
    );
    for p in prints {
        println!(
            "{:<6} {:>8.1} MiB {:>8.1} MiB {:>8.1} MiB {:>8.2} {:>11.2}% {:>11.2}% {:>8.2} {:>11.1} MiB",
            p["pods"],
            f(p, "nodelet", "rss_mib"),
            f(p, "kubelet", "rss_mib"),
            f(p, "nodelet", "peak_rss_mib"),
            f(p, "nodelet", "rss_mib") / f(p, "kubelet", "rss_mib"),
            f(p, "nodelet", "cpu_percent"),
            f(p, "kubelet", "cpu_percent"),
            f(p, "nodelet", "cpu_percent") / f(p, "kubelet", "cpu_percent"),
            p["nodelet"]["containerd"]["rss_mib"]
                .as_f64()
                .unwrap_or(f64::NAN),
        );
    }
}

fn print_status_latency(cluster: &serde_json::Value) {
    let s = &cluster["status_latency"];
    if s.is_null() {
        return;
    }
    println!(
        "cluster mode, status latency (container started to Running at the API), bursts of {} pods x{}: p50 {:.3} s, p99 {:.3} s, max {:.3} s",
        s["pods"],
        s["runs"],
        s["p50_s"].as_f64().unwrap_or(0.0),
        s["p99_s"].as_f64().unwrap_or(0.0),
        s["max_s"].as_f64().unwrap_or(0.0),
    );
}

fn write_report(a: &Args, report: BTreeMap<&str, serde_json::Value>) -> Result<()> {
    std::fs::create_dir_all(&a.out)?;
    let file = a.out.join("bench.json");
    std::fs::write(&file, serde_json::to_string_pretty(&report)?)?;
    println!("\nwritten to {}", file.display());
    Ok(())
}

/// The PLEG driven by the runtime's container events against the relist every second
/// (`--feature-gates=EventedPLEG=false`): the start of the max-pods scenario (alternating
/// runs, `pairs` of each) and the idle CPU with those pods running. Where the runtime streams
/// no events (containerd 1.6) both relist every second.
async fn pleg_comparison(a: &Args, work: &Path) -> Result<serde_json::Value> {
    let n = a.sizes.1;
    let modes: [(&str, &[&str]); 2] = [
        ("events", &[]),
        ("relist", &["--feature-gates=EventedPLEG=false"]),
    ];
    let start = |mode: &str, extra: &[&str]| {
        Agent::nodelet(
            &a.nodelet,
            (&a.endpoint, NODE),
            &work.join(format!("pleg-{mode}")),
            extra,
            &a.out.join(format!("nodelet-pleg-{mode}.log")),
        )
    };
    let mut starts: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for pair in 0..a.pairs {
        for k in 0..modes.len() {
            // which goes first alternates
            let (mode, extra) = modes[(pair + k) % modes.len()];
            let agent = start(mode, extra)?;
            agent.ready().await?;
            let run = agent.run(n, false).await?;
            starts.entry(mode).or_default().push(run.start);
        }
    }
    let mut out = serde_json::Map::new();
    for (mode, extra) in modes {
        let agent = start(mode, extra)?;
        agent.ready().await?;
        agent.start_pods(n, false).await?;
        quiesce().await;
        let idle = footprint(agent.pid(), agent.containerd_pid, a.footprint).await;
        agent.stop_pods(n).await?;
        let start = starts.remove(mode).unwrap_or_default();
        println!(
            "PLEG {mode:<7} {n} pods: start {:.3} s (median of {}), idle CPU {:.2}% nodelet, {:.2}% containerd",
            median(start.clone()),
            start.len(),
            idle["agent"]["cpu_percent"].as_f64().unwrap_or(0.0),
            idle["containerd"]["cpu_percent"].as_f64().unwrap_or(0.0),
        );
        out.insert(
            mode.to_string(),
            serde_json::json!({"pods": n, "start_s": median(start.clone()), "starts_s": start, "idle": idle}),
        );
    }
    Ok(serde_json::Value::Object(out))
}

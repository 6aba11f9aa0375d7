//! The node agents the bench runs pods through: nodelet, on the runtime it shares with the
//! floor, and the upstream kubelet, on a containerd of its own (it kills every pod it does not
//! know, the floor's too). The kubelet is frozen (SIGSTOP) between its runs, so that it never
//! runs beside another side. nodelet is not: it follows containerd's container event stream,
//! and containerd holds up CRI calls (the floor's) while a subscriber stops reading; between
//! its runs it idles with no pods.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nodelet::runtime::{ANNOTATION_NODE_NAME, ContainerState, RuntimeClient, SandboxState};

use crate::{IMAGE, NODE, SCRIPT, epoch_ns, last_started, quiesce, seconds_since};

#[path = "../../tests/it/kubelet.rs"]
mod kubelet;
use kubelet::{HostChanges, Settings};

/// How often the runtime is asked whether the agent's pods run, and whether they are gone.
/// Start times come from the runtime's own clock, so the start poll only decides when the
/// bench notices, and is sparse: each poll lists every sandbox and container, work the runtime
/// and the bench do on the machine's CPUs while the agent starts pods (the floor pays none).
/// Teardown has no timestamp of its own, so it is polled closely.
pub const START_POLL: Duration = Duration::from_millis(250);
pub const TEARDOWN_POLL: Duration = Duration::from_millis(5);

/// The agents' cgroup roots, of the same depth as the floor's.
pub const CGROUP_ROOT: &str = "nodelet-bench";
pub const KUBELET_CGROUP_ROOT: &str = "nodelet-bench-kubelet";

/// Agent runs so far: each run's pods carry the run's number in their names, so that they are
/// new pods in every run, as the floor's are (the kubelet holds back a static pod whose name a
/// pod it has not yet forgotten had, for its 10 s worker backoff).
static RUNS: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy, PartialEq)]
pub enum Kind {
    Nodelet,
    Kubelet,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Nodelet => "nodelet",
            Kind::Kubelet => "kubelet",
        }
    }
}

pub struct Agent {
    pub kind: Kind,
    /// The node name it runs as.
    node: String,
    child: Child,
    dir: PathBuf,
    pub rt: RuntimeClient,
    pub containerd_pid: Option<u32>,
    healthz: u16,
    host: Option<HostChanges>,
}

/// What the runtime holds of an agent's pods.
pub struct Census {
    pub sandboxes: usize,
    pub ready: usize,
    pub running: Vec<String>,
}

/// One run through an agent: seconds until every container ran, until every pod was stopped
/// (no sandbox ready, no container running), and until every sandbox was removed. The kubelet
/// removes sandboxes only in its container GC, a minute apart, so its runs have no removal time.
#[derive(Clone, Copy, serde::Serialize)]
pub struct AgentRun {
    pub start: f64,
    pub stopped: f64,
    pub removed: Option<f64>,
}

/// `N` ports free on loopback now, all bound at once so that no two are the same.
fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// The containerd serving `endpoint` (a test bed's socket beside its pid file).
pub fn containerd_pid(endpoint: &Path) -> Option<u32> {
    let file = endpoint.parent()?.join("containerd.pid");
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Starts `command` killed with the bench, its output in `log`.
fn spawn(mut command: Command, log: &Path) -> Result<Child> {
    let out = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    // SAFETY: prctl is async-signal-safe and touches only the child's own state.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(command
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()?)
}

impl Agent {
    /// nodelet on the runtime at `endpoint` as node `node`, with its directories under `dir`,
    /// the bench's cgroup root, and `extra` flags.
    pub fn nodelet(
        binary: &Path,
        (endpoint, node): (&Path, &str),
        dir: &Path,
        extra: &[&str],
        log: &Path,
    ) -> Result<Agent> {
        std::fs::create_dir_all(dir.join("manifests"))?;
        let [healthz] = free_ports()?;
        let mut command = Command::new(binary);
        command
            .arg("--pod-manifest-path")
            .arg(dir.join("manifests"))
            .arg(format!(
                "--container-runtime-endpoint=unix://{}",
                endpoint.display()
            ))
            .arg("--root-dir")
            .arg(dir.join("root"))
            .arg("--pod-logs-dir")
            .arg(dir.join("pods"))
            .arg("--container-logs-dir")
            .arg(dir.join("containers"))
            .args(["--hostname-override", node, "--max-pods", "200"])
            .arg(format!("--healthz-port={healthz}"))
            .arg(format!("--cgroup-root=/{CGROUP_ROOT}"))
            .args(extra);
        let child = spawn(command, log).context("start nodelet")?;
        Ok(Agent {
            kind: Kind::Nodelet,
            node: node.to_string(),
            child,
            dir: dir.to_path_buf(),
            rt: RuntimeClient::new(endpoint, endpoint, Duration::from_secs(120)),
            containerd_pid: containerd_pid(endpoint),
            healthz,
            host: None,
        })
    }

    /// The upstream kubelet in standalone mode on the containerd at `endpoint`, configured as
    /// nodelet is run: the same node name, pod limit, cgroup driver and root depth, and
    /// manifest check period (the default; both also watch the directory).
    pub fn kubelet(binary: &Path, endpoint: &Path, dir: &Path, log: &Path) -> Result<Agent> {
        if !binary.is_file() {
            bail!(
                "no kubelet at {}: hack/k8s/build.sh builds it",
                binary.display()
            );
        }
        std::fs::create_dir_all(dir.join("manifests"))?;
        let [port, healthz] = free_ports()?;
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            kubelet::config(&Settings {
                dir,
                endpoint,
                cgroup_root: &format!("/{KUBELET_CGROUP_ROOT}"),
                port,
                read_only_port: 0,
                healthz_port: healthz,
                extra: "maxPods: 200\n",
            }),
        )?;
        let host = HostChanges::record(KUBELET_CGROUP_ROOT)?;
        let mut command = Command::new(binary);
        command
            .arg("--config")
            .arg(&config)
            .arg("--root-dir")
            .arg(dir.join("root"))
            .arg("--cert-dir")
            .arg(dir.join("pki"))
            .args(["--hostname-override", NODE]);
        let child = match spawn(command, log) {
            Ok(child) => child,
            Err(e) => {
                host.undo(dir);
                return Err(e.context("start the kubelet"));
            }
        };
        // From here on, dropping the agent stops the kubelet and undoes its changes.
        let agent = Agent {
            kind: Kind::Kubelet,
            node: NODE.to_string(),
            child,
            dir: dir.to_path_buf(),
            rt: RuntimeClient::new(endpoint, endpoint, Duration::from_secs(120)),
            containerd_pid: containerd_pid(endpoint),
            healthz,
            host: Some(host),
        };
        // The test bed's teardown kills it too, if the bench dies without doing so.
        if let Some(bed) = endpoint.parent() {
            let mut companions = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(bed.join("companions"))?;
            writeln!(companions, "{} {}", agent.pid(), binary.display())?;
        }
        Ok(agent)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the agent's /healthz answers ok, then until the machine is quiet.
    pub async fn ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !healthy(self.healthz) {
            if Instant::now() > deadline {
                bail!("{} never became healthy", self.kind.name());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        quiesce().await;
        Ok(())
    }

    /// Freezes the kubelet until [`Agent::resume`] (see the module's comment for nodelet).
    pub fn pause(&self) {
        if self.kind == Kind::Kubelet {
            // SAFETY: kill has no memory preconditions; the pid is our own child's.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGSTOP) };
        }
    }

    pub async fn resume(&self) -> Result<()> {
        if self.kind == Kind::Kubelet {
            // SAFETY: as in `pause`.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
        }
        self.ready().await
    }

    /// Its static pod directory.
    pub fn manifests(&self) -> PathBuf {
        self.dir.join("manifests")
    }

    pub fn write(&self, i: usize, host_network: bool, run: usize) -> Result<()> {
        let tmp = self.manifests().join(format!(".b{i}.tmp"));
        std::fs::write(&tmp, manifest(i, host_network, run))?;
        std::fs::rename(tmp, self.manifests().join(format!("b{i}.yaml")))?;
        Ok(())
    }

    pub fn remove(&self, i: usize) -> Result<()> {
        Ok(std::fs::remove_file(
            self.manifests().join(format!("b{i}.yaml")),
        )?)
    }

    /// The agent's sandboxes (on nodelet's shared runtime, those it marks as the bench node's),
    /// how many are ready, and their running containers.
    pub async fn census(&self) -> Result<Census> {
        let sandboxes: Vec<_> = self
            .rt
            .list_sandboxes(None)
            .await?
            .into_iter()
            .filter(|s| {
                self.kind == Kind::Kubelet
                    || s.annotations.get(ANNOTATION_NODE_NAME) == Some(&self.node)
            })
            .collect();
        let ids: std::collections::HashSet<&str> =
            sandboxes.iter().map(|s| s.id.as_str()).collect();
        let running = self
            .rt
            .list_containers(None)
            .await?
            .into_iter()
            .filter(|c| ids.contains(c.sandbox_id.as_str()) && c.state == ContainerState::Running)
            .map(|c| c.id)
            .collect();
        Ok(Census {
            sandboxes: sandboxes.len(),
            ready: sandboxes
                .iter()
                .filter(|s| s.state == SandboxState::Ready)
                .count(),
            running,
        })
    }

    /// Polls the runtime every `every` until `done` holds, and returns that census.
    pub async fn until(
        &self,
        what: &str,
        every: Duration,
        done: impl Fn(&Census) -> bool,
    ) -> Result<Census> {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let census = self.census().await?;
            if done(&census) {
                return Ok(census);
            }
            if Instant::now() > deadline {
                bail!("{}: timed out waiting for {what}", self.kind.name());
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Writes n manifests, then waits until their containers run.
    pub async fn start_pods(&self, n: usize, host_network: bool) -> Result<Census> {
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            self.write(i, host_network, run)?;
        }
        self.until("pods running", START_POLL, |c| c.running.len() == n)
            .await
    }

    /// Removes the n manifests; the seconds until the pods are stopped, and until their
    /// sandboxes are gone (the kubelet's are removed here instead, untimed). Then, untimed,
    /// waits until the agent has removed the pods' directories: what it leaves undone would fall
    /// into the next run (the kubelet's, frozen between its runs, into its own next run).
    pub async fn stop_pods(&self, n: usize) -> Result<(f64, Option<f64>)> {
        let timed = self.stop_pods_timed(n).await?;
        let pods = self.dir.join("root/pods");
        let deadline = Instant::now() + Duration::from_secs(120);
        while std::fs::read_dir(&pods).is_ok_and(|mut d| d.next().is_some()) {
            if Instant::now() > deadline {
                bail!(
                    "{}: pod directories left in {}",
                    self.kind.name(),
                    pods.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(timed)
    }

    async fn stop_pods_timed(&self, n: usize) -> Result<(f64, Option<f64>)> {
        let began = Instant::now();
        for i in 0..n {
            self.remove(i)?;
        }
        self.until("pods stopped", TEARDOWN_POLL, |c| {
            c.ready == 0 && c.running.is_empty()
        })
        .await?;
        let stopped = began.elapsed().as_secs_f64();
        match self.kind {
            Kind::Nodelet => {
                self.until("sandboxes gone", TEARDOWN_POLL, |c| c.sandboxes == 0)
                    .await?;
                Ok((stopped, Some(began.elapsed().as_secs_f64())))
            }
            Kind::Kubelet => {
                // The kubelet removes the exited containers meanwhile: a removal that meets
                // its own is tried again until nothing is left.
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let left = self.rt.list_sandboxes(None).await?;
                    if left.is_empty() {
                        break;
                    }
                    if Instant::now() > deadline {
                        bail!("kubelet: {} sandboxes cannot be removed", left.len());
                    }
                    for sandbox in left {
                        let _ = self.rt.remove_pod_sandbox(&sandbox.id).await;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok((stopped, None))
            }
        }
    }

    /// n pods through the agent, on a quiet machine.
    pub async fn run(&self, n: usize, host_network: bool) -> Result<AgentRun> {
        quiesce().await;
        let started = epoch_ns();
        let census = self.start_pods(n, host_network).await?;
        let start = seconds_since(started, last_started(&self.rt, &census.running).await?);
        let (stopped, removed) = self.stop_pods(n).await?;
        Ok(AgentRun {
            start,
            stopped,
            removed,
        })
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        unmount_under(&self.dir);
        if let Some(host) = &self.host {
            host.undo(&self.dir);
        }
        // Whatever the agent left under its cgroup root (all of it, once its pods are gone).
        let root = match self.kind {
            Kind::Nodelet => CGROUP_ROOT,
            Kind::Kubelet => KUBELET_CGROUP_ROOT,
        };
        let _ = nodelet::cgroups::remove_tree(root);
    }
}

fn manifest(i: usize, host_network: bool, run: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: b{run}-{i}}}\nspec:\n  hostNetwork: {host_network}\n  terminationGracePeriodSeconds: 30\n  containers:\n  - name: c\n    image: {IMAGE}\n    command: [sh, -c, \"{SCRIPT}\"]\n"
    )
}

/// Whether GET /healthz on the loopback port answers 200.
fn healthy(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer
        .split_whitespace()
        .nth(1)
        .is_some_and(|code| code == "200")
}

/// Unmounts everything mounted under `dir` (the agents make their root dir a shared mount),
/// deepest first, so the work dir can go.
fn unmount_under(dir: &Path) {
    let mut points: Vec<PathBuf> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        if let Ok(path) = std::ffi::CString::new(point.as_os_str().as_encoded_bytes()) {
            // SAFETY: `path` is a valid NUL-terminated path that outlives the call.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

//! A control plane bootstrapped by `kubeadm init` (hack/k8s/bootstrap.sh) with nodelet as the
//! node agent against the same with the upstream kubelet built beside the control plane: the time
//! from kubeadm's start to a Ready node with the four control-plane mirror pods Ready (alternating
//! runs), and each agent's footprint while it serves the control plane.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// The machines' test bed network (each run takes its machine down before the next).
const NET: &str = "23";
const COMPONENTS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];
const POLL: Duration = Duration::from_millis(250);
const DEADLINE: Duration = Duration::from_secs(300);

struct Machine {
    name: String,
    nodelet: PathBuf,
    agent: &'static str,
}

impl Machine {
    fn script(&self, args: &[&str]) -> Result<Output> {
        let out = Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/k8s/bootstrap.sh"))
            .args(args)
            .env("NODELET", &self.nodelet)
            .env("NODE_AGENT", self.agent)
            .output()?;
        Ok(out)
    }

    fn up(name: &str, nodelet: &Path, agent: &'static str) -> Result<Machine> {
        let m = Machine {
            name: name.to_string(),
            nodelet: nodelet.to_path_buf(),
            agent,
        };
        let out = m.script(&["up", name, NET])?;
        if !out.status.success() {
            bail!(
                "bootstrap.sh up with the {agent}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(m)
    }

    fn dir(&self) -> PathBuf {
        PathBuf::from(
            std::env::var("NODELET_TESTBED").unwrap_or_else(|_| "/var/lib/nodelet-testbed".into()),
        )
        .join("beds")
        .join(format!("kubeadm-{}", self.name))
    }

    fn read(&self, file: &str) -> Result<String> {
        let path = self.dir().join(file);
        Ok(std::fs::read_to_string(&path)
            .with_context(|| format!("read {}", path.display()))?
            .trim()
            .to_string())
    }

    fn get(&self, args: &[&str]) -> Option<Value> {
        let mut all = vec!["exec", &self.name, "kubectl", "get", "-o", "json"];
        all.extend_from_slice(args);
        let out = self.script(&all).ok()?;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// The node Ready and the four control-plane mirror pods Running and Ready.
    fn ready(&self) -> bool {
        let node = format!("kubeadm-{}", self.name);
        let Some(n) = self.get(&["node", &node]) else {
            return false;
        };
        if !condition_true(&n, "Ready") {
            return false;
        }
        let Some(pods) = self.get(&["-n", "kube-system", "pods"]) else {
            return false;
        };
        let items = pods["items"].as_array().cloned().unwrap_or_default();
        COMPONENTS.iter().all(|c| {
            let name = format!("{c}-{node}");
            items.iter().any(|p| {
                p["metadata"]["name"] == name.as_str()
                    && p["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string()
                    && p["status"]["phase"] == "Running"
                    && condition_true(p, "Ready")
            })
        })
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = self.script(&["down", &self.name]);
    }
}

fn condition_true(object: &Value, kind: &str) -> bool {
    object["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// One bootstrap: seconds from kubeadm's start to the control plane Ready on a Ready node.
async fn bootstrap(nodelet: &Path, agent: &'static str) -> Result<(Machine, f64)> {
    let m = Machine::up(&format!("bench-{agent}"), nodelet, agent)?;
    let started: f64 = m.read("init-started")?.parse()?;
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !m.ready() {
        if tokio::time::Instant::now() > deadline {
            bail!("the control plane under the {agent} was not Ready within {DEADLINE:?}");
        }
        tokio::time::sleep(POLL).await;
    }
    Ok((m, now() - started))
}

pub async fn run(nodelet: &Path, pairs: usize, window: Duration) -> Result<Value> {
    let agents = ["nodelet", "kubelet"];
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for pair in 0..pairs {
        for k in 0..agents.len() {
            // which goes first alternates
            let i = (pair + k) % agents.len();
            let (_machine, secs) = bootstrap(nodelet, agents[i]).await?;
            eprintln!("bootstrap with the {}: {secs:.2} s", agents[i]);
            times[i].push(secs);
        }
    }
    let mut footprints = Vec::new();
    for agent in agents {
        let (machine, _) = bootstrap(nodelet, agent).await?;
        let pid: u32 = machine.read("agent.pid")?.parse()?;
        crate::quiesce().await;
        let usage = crate::footprint(pid, None, window).await;
        footprints.push(usage["agent"].clone());
    }
    let [nodelet_s, kubelet_s] = times.clone().map(crate::median);
    let field = |i: usize, key: &str| footprints[i][key].as_f64().unwrap_or(0.0);
    println!(
        "\nkubeadm init to a Ready control plane (median of {pairs}): nodelet {nodelet_s:.2} s, kubelet {kubelet_s:.2} s, ratio {:.2}",
        nodelet_s / kubelet_s.max(1e-9)
    );
    println!(
        "serving the control plane over {window:?}: nodelet RSS {:.1} MiB, CPU {:.2}%; kubelet RSS {:.1} MiB, CPU {:.2}%",
        field(0, "rss_mib"),
        field(0, "cpu_percent"),
        field(1, "rss_mib"),
        field(1, "cpu_percent"),
    );
    Ok(serde_json::json!({
        "pairs": pairs,
        "init_to_ready_s": {"nodelet": nodelet_s, "kubelet": kubelet_s},
        "ratio": nodelet_s / kubelet_s.max(1e-9),
        "runs_s": {"nodelet": times[0], "kubelet": times[1]},
        "footprint": {"nodelet": footprints[0], "kubelet": footprints[1]},
    }))
}

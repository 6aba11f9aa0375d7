//! A real control plane per test (etcd, kube-apiserver and, when asked, the controller manager
//! and the scheduler), built from upstream's modules and started by hack/k8s/cluster.sh on
//! loopback ports of its own. Dropping it stops every process and removes its directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::bed::{eventually, testbed_dir};

/// The control plane script.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/k8s/cluster.sh")
}

/// Runs `cluster.sh args...` and returns its standard output; panics with its output on failure.
fn cluster_sh(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("bash runs hack/k8s/cluster.sh");
    assert!(
        out.status.success(),
        "hack/k8s/cluster.sh {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A client for the API server a kubeconfig names.
pub async fn client_for(kubeconfig: &Path) -> kube::Client {
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig).expect("the kubeconfig reads"),
        &KubeConfigOptions::default(),
    )
    .await
    .expect("the kubeconfig is usable");
    kube::Client::try_from(config).expect("a client")
}

/// One running control plane.
pub struct ControlPlane {
    pub dir: PathBuf,
    /// The cluster admin's kubeconfig (system:masters).
    pub kubeconfig: PathBuf,
    /// A client with the admin's rights.
    pub admin: kube::Client,
}

impl ControlPlane {
    /// Starts a control plane for test `test`; with `controllers`, also the controller manager
    /// and the scheduler.
    pub async fn start(test: &str, controllers: bool) -> ControlPlane {
        ControlPlane::start_with(test, controllers, &[]).await
    }

    /// [`ControlPlane::start`] with variables for hack/k8s/cluster.sh (`NODE_MONITOR_GRACE`).
    pub async fn start_with(test: &str, controllers: bool, env: &[(&str, &str)]) -> ControlPlane {
        let base = testbed_dir().join("clusters");
        std::fs::create_dir_all(&base).expect("the clusters dir");
        let dir = base.join(format!("{test}-{}", std::process::id()));
        // What a killed run of this test left behind.
        cluster_sh(&["down", &dir.display().to_string()], &[]);
        let mut args = vec!["up".to_string(), dir.display().to_string()];
        if controllers {
            args.push("--controllers".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cluster_sh(&args, env);
        let kubeconfig = dir.join("admin.kubeconfig");
        let admin = client_for(&kubeconfig).await;
        if controllers {
            // Pods are refused until the controller manager made the namespace's service account.
            let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
            eventually(
                "the default service account",
                Duration::from_secs(60),
                || async { accounts.get_opt("default").await.ok().flatten() },
            )
            .await;
        }
        ControlPlane {
            dir,
            kubeconfig,
            admin,
        }
    }

    /// Issues node `node` its identity (CN=system:node:<node>, O=system:nodes) and returns
    /// the path of its kubeconfig.
    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        PathBuf::from(
            cluster_sh(&["node", &self.dir.display().to_string(), node], &[])
                .trim()
                .to_string(),
        )
    }

    /// Compacts etcd's history up to its latest revision, so watches older than now get 410 Gone.
    pub async fn compact_etcd(&self) {
        let env = std::fs::read_to_string(self.dir.join("env")).expect("the cluster env");
        let port = env
            .lines()
            .find_map(|l| l.strip_prefix("ETCD_PORT="))
            .expect("ETCD_PORT in the cluster env");
        let post = |path: &str, body: String| {
            let url = format!("http://127.0.0.1:{port}{path}");
            async move {
                let out = tokio::process::Command::new("curl")
                    .args(["-fsS", "-X", "POST", "-d", &body, &url])
                    .output()
                    .await
                    .expect("curl runs");
                assert!(
                    out.status.success(),
                    "etcd {url}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("etcd answers JSON")
            }
        };
        // Any range read tells the current revision.
        let answer = post("/v3/kv/range", r#"{"key":"AA=="}"#.into()).await;
        let revision = answer["header"]["revision"]
            .as_str()
            .expect("a revision")
            .to_string();
        post(
            "/v3/kv/compaction",
            format!(r#"{{"revision":"{revision}","physical":true}}"#),
        )
        .await;
    }

    /// Stops one component (kube-apiserver, etcd, ...). Async, as the node under test runs
    /// on this test's runtime meanwhile.
    pub async fn stop(&self, component: &str) {
        self.script(&["stop", component]).await;
    }

    /// Starts a stopped component again, waiting until it serves.
    pub async fn start_again(&self, component: &str) {
        self.script(&["start", component]).await;
    }

    async fn script(&self, args: &[&str]) {
        let out = tokio::process::Command::new("bash")
            .arg(script())
            .arg(args[0])
            .arg(&self.dir)
            .args(&args[1..])
            .output()
            .await
            .expect("bash runs hack/k8s/cluster.sh");
        assert!(
            out.status.success(),
            "hack/k8s/cluster.sh {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The directory of the upstream binaries this control plane runs (kubectl, e2e.test, ...).
    pub fn bin(&self) -> PathBuf {
        let env = std::fs::read_to_string(self.dir.join("env")).expect("the cluster env");
        let bin = env
            .lines()
            .find_map(|l| l.strip_prefix("BIN="))
            .expect("BIN in the cluster env");
        PathBuf::from(bin)
    }

    /// Runs the kubectl built with the control plane as the admin; returns its output. Async:
    /// the nodelet under test runs on this test's runtime and must answer meanwhile.
    pub async fn kubectl(&self, args: &[&str]) -> std::process::Output {
        tokio::process::Command::new(self.bin().join("kubectl"))
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .output()
            .await
            .expect("kubectl runs")
    }

    /// Runs kubectl and returns its standard output; panics when it fails.
    pub async fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args).await;
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), namespace)
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.admin.clone())
    }

    /// Waits until the pod `namespace/name` in the API satisfies `check`, and returns it.
    pub async fn wait_pod(
        &self,
        namespace: &str,
        name: &str,
        what: &str,
        check: impl Fn(&Pod) -> bool,
    ) -> Pod {
        let pods = self.pods(namespace);
        let what = format!("pod {namespace}/{name} {what}");
        eventually(&what, Duration::from_secs(90), || async {
            pods.get_opt(name).await.ok().flatten().filter(|p| check(p))
        })
        .await
    }

    /// Waits until the pod `namespace/name` is gone from the API.
    pub async fn wait_pod_gone(&self, namespace: &str, name: &str) {
        let pods = self.pods(namespace);
        let what = format!("pod {namespace}/{name} gone from the API");
        eventually(&what, Duration::from_secs(90), || async {
            matches!(pods.get_opt(name).await, Ok(None)).then_some(())
        })
        .await
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .args(["down", &self.dir.display().to_string()])
            .status();
    }
}

/// The pod's phase in the API.
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Is the pod's condition `kind` True in the API?
pub fn condition(pod: &Pod, kind: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == kind && c.status == "True"))
}

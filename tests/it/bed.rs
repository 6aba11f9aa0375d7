//! Test bed helpers: the private containerd, and an in-process nodelet per test with its own
//! node name, directories and pods, so tests run in parallel without touching each other.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nodelet::config::{Invocation, from_args};
use nodelet::runtime::{
    ANNOTATION_NODE_NAME, Container, ContainerState, LABEL_POD_NAME, LABEL_POD_UID, RuntimeClient,
    Sandbox,
};
use nodelet::types::PodUid;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The busybox image the test bed imports.
pub const BUSYBOX: &str = "localhost/busybox:local";

/// The test bed's CRI socket. Fails loudly when the test bed is expected but missing: these
/// tests never skip.
pub fn endpoint() -> PathBuf {
    let endpoint = std::env::var("NODELET_TEST_ENDPOINT").unwrap_or_default();
    let Some(path) = endpoint.strip_prefix("unix://").filter(|p| !p.is_empty()) else {
        panic!(
            "NODELET_TEST_ENDPOINT is not set: these tests need the containerd test bed; run them with `make test`"
        );
    };
    PathBuf::from(path)
}

/// Which containerd generation the test bed runs: "2" or "1.6" (`hack/testbed.sh env`).
pub fn containerd_generation() -> String {
    std::env::var("NODELET_TEST_CONTAINERD").unwrap_or_else(|_| {
        panic!("NODELET_TEST_CONTAINERD is not set: run the tests with `make test` (it comes from `hack/testbed.sh env`)")
    })
}

/// True on the test bed's containerd 2.x (false on 1.6).
pub fn containerd2() -> bool {
    containerd_generation() == "2"
}

/// The test bed's directory; per-test directories are made below it.
pub fn testbed_dir() -> PathBuf {
    PathBuf::from(
        std::env::var("NODELET_TESTBED").unwrap_or_else(|_| "/var/lib/nodelet-testbed".into()),
    )
}

/// A client of the test bed's runtime, checked to answer.
pub async fn runtime() -> RuntimeClient {
    runtime_at(&endpoint()).await
}

/// A client of the runtime at `path`, checked to answer.
pub async fn runtime_at(path: &Path) -> RuntimeClient {
    let client = RuntimeClient::new(path, path, Duration::from_secs(60));
    if let Err(e) = client.ping(Duration::from_secs(10)).await {
        panic!(
            "the test bed runtime at {} does not answer: {e}; is `make runtime-up` done?",
            path.display()
        );
    }
    client
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everything nodelet logged in this test process (tests run one per process), so a test can
/// check what reaches the logs.
static LOGS: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

/// Writes log lines to stderr and to [`LOGS`].
struct Tee;

impl std::io::Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        std::io::stderr().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("nodelet=debug"))
        .with_ansi(false)
        .with_writer(|| Tee)
        .try_init();
}

/// What nodelet has logged so far in this test.
pub fn logs() -> String {
    String::from_utf8_lossy(&LOGS.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

/// The address of a test registry (`make registries`): the open one, or the one with basic auth.
pub fn registry(with_auth: bool) -> String {
    let var = if with_auth {
        "NODELET_TEST_AUTH_REGISTRY"
    } else {
        "NODELET_TEST_REGISTRY"
    };
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run the tests with `make test` (the test registries are part of the test bed)")
    })
}

/// `user:password` of the registry with basic auth.
pub fn registry_login() -> (String, String) {
    let user = std::env::var("NODELET_TEST_REGISTRY_USER").expect("NODELET_TEST_REGISTRY_USER");
    let file = std::env::var("NODELET_TEST_REGISTRY_PASSWORD_FILE")
        .expect("NODELET_TEST_REGISTRY_PASSWORD_FILE");
    let password = std::fs::read_to_string(&file).expect("the registry password file");
    (user, password.trim().to_string())
}

/// Copies an image between repositories of a test registry with skopeo (`login` is
/// `user:password` for the registry with auth).
pub fn copy_image(from: &str, to: &str, login: Option<&str>) {
    let mut cmd = std::process::Command::new("skopeo");
    cmd.args([
        "--insecure-policy",
        "copy",
        "-q",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
    ]);
    if let Some(login) = login {
        cmd.arg("--src-creds")
            .arg(login)
            .arg("--dest-creds")
            .arg(login);
    }
    let status = cmd
        .arg(format!("docker://{from}"))
        .arg(format!("docker://{to}"))
        .status()
        .expect("skopeo runs");
    assert!(status.success(), "skopeo copy {from} {to} failed");
}

/// A repository name no earlier run used (the runtime keeps images across runs of the tests).
pub fn unique_repo(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// How many PullImage calls this test's nodelet made (from its metrics).
pub fn pulls() -> u64 {
    nodelet::metrics::get()
        .render()
        .lines()
        .find(|l| l.starts_with("kubelet_runtime_operations_total{operation_type=\"PullImage\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .map_or(0, |n| n as u64)
}

/// One nodelet running in this process against the test bed, with its own node name and dirs.
pub struct Node {
    pub name: String,
    pub dir: tempfile::TempDir,
    pub runtime: RuntimeClient,
    endpoint: PathBuf,
    cancel: CancellationToken,
    node_shutdown: CancellationToken,
    agent: Option<JoinHandle<()>>,
    status: Option<nodelet::status::Reader>,
}

impl Node {
    /// Starts nodelet for test `test` (a short unique name) with extra flags.
    pub async fn start(test: &str, extra: &[&str]) -> Node {
        Node::start_on(&endpoint(), test, extra).await
    }

    /// Starts nodelet for test `test` on the runtime at `endpoint`.
    pub async fn start_on(endpoint: &Path, test: &str, extra: &[&str]) -> Node {
        init_tracing();
        let runtime = runtime_at(endpoint).await;
        let dir = test_dir(test);
        let name = format!("t-{test}");
        // What an earlier, failed run of this test left behind must not be mistaken for its pods.
        remove_node_pods(&runtime, &name).await;
        let mut node = Node {
            name,
            dir,
            runtime,
            endpoint: endpoint.to_path_buf(),
            cancel: CancellationToken::new(),
            node_shutdown: CancellationToken::new(),
            agent: None,
            status: None,
        };
        node.launch(extra).await;
        node
    }

    async fn launch(&mut self, extra: &[&str]) {
        let endpoint = format!("unix://{}", self.endpoint.display());
        let manifests = self.manifests().display().to_string();
        let root = self.path("root").display().to_string();
        let pod_logs = self.pod_logs().display().to_string();
        let container_logs = self.path("containers").display().to_string();
        let cgroup_root = cgroup_root(&self.name);
        let mut args = vec![
            "nodelet",
            "--cgroup-root",
            &cgroup_root,
            "--pod-manifest-path",
            &manifests,
            "--container-runtime-endpoint",
            &endpoint,
            "--root-dir",
            &root,
            "--pod-logs-dir",
            &pod_logs,
            "--container-logs-dir",
            &container_logs,
            "--hostname-override",
            &self.name,
        ];
        // Tests share the host: the healthz port only where a test asks for it.
        if !extra.iter().any(|a| a.starts_with("--healthz-port")) {
            args.extend_from_slice(&["--healthz-port", "0"]);
        }
        // Image GC would remove images other tests share; only the GC test turns it on.
        if !extra
            .iter()
            .any(|a| a.starts_with("--image-gc-high-threshold"))
        {
            args.extend_from_slice(&["--image-gc-high-threshold", "100"]);
        }
        // Tests share the host: the authenticated API only where a test asks for its port.
        if !extra.iter().any(|a| a.starts_with("--port")) {
            args.extend_from_slice(&["--port", "0"]);
        }
        args.extend_from_slice(extra);
        let config = match from_args(args) {
            Invocation::Run(r) => match *r {
                Ok(loaded) => loaded.config,
                Err(e) => panic!("test config is invalid: {e}"),
            },
            Invocation::Exit(e) => panic!("test flags are invalid: {e}"),
            Invocation::Version(_) => panic!("test flags ask for the version"),
        };
        self.cancel = CancellationToken::new();
        self.node_shutdown = CancellationToken::new();
        let agent = nodelet::agent::start(config, self.cancel.clone())
            .await
            .expect("the agent starts")
            .expect("not cancelled");
        self.status = Some(agent.status.clone());
        self.agent = Some(tokio::spawn(agent.serve(self.node_shutdown.clone())));
    }

    /// The latest status of the static pod `name`.
    pub fn status(&self, name: &str) -> Option<k8s_openapi::api::core::v1::PodStatus> {
        let reader = self.status.as_ref()?;
        reader
            .by_name("default", &self.pod_name(name))?
            .pod
            .status
            .clone()
    }

    /// Waits until the pod's status satisfies `check`, and returns it.
    pub async fn wait_status(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&k8s_openapi::api::core::v1::PodStatus) -> bool,
    ) -> k8s_openapi::api::core::v1::PodStatus {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let status = self.status(name);
            if let Some(s) = status.as_ref().filter(|s| check(s)) {
                return s.clone();
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "{} status never became {what}; last: {status:?}",
                    self.pod_name(name)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    pub fn manifests(&self) -> PathBuf {
        self.path("manifests")
    }

    pub fn pod_logs(&self) -> PathBuf {
        self.path("pods")
    }

    /// The static pod's full name on this node.
    pub fn pod_name(&self, name: &str) -> String {
        format!("{name}-{}", self.name)
    }

    /// Writes a manifest atomically (a dotfile renamed into place), as careful tools do.
    pub fn write_manifest(&self, file: &str, content: &str) {
        let tmp = self.manifests().join(format!(".{file}.partial"));
        std::fs::write(&tmp, content).expect("write manifest");
        std::fs::rename(&tmp, self.manifests().join(file)).expect("rename manifest");
    }

    pub fn remove_manifest(&self, file: &str) {
        std::fs::remove_file(self.manifests().join(file)).expect("remove manifest");
    }

    /// Is the agent task still running (it never exits on bad input)?
    pub fn agent_alive(&self) -> bool {
        self.agent.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Ready sandboxes of the static pod `name`.
    pub async fn sandboxes(&self, name: &str) -> Vec<Sandbox> {
        let full = self.pod_name(name);
        self.runtime
            .list_sandboxes(Some((LABEL_POD_NAME, &full)))
            .await
            .expect("list sandboxes")
    }

    /// Waits for the static pod `name`'s sandbox (ready or not) and returns it.
    pub async fn wait_sandbox(&self, name: &str) -> Sandbox {
        let what = format!("the sandbox of {}", self.pod_name(name));
        let (sandbox, ()) = eventually(&what, Duration::from_secs(30), || async {
            self.sandboxes(name)
                .await
                .into_iter()
                .next()
                .map(|s| (s, ()))
        })
        .await;
        sandbox
    }

    /// Every sandbox this node owns.
    pub async fn all_sandboxes(&self) -> Vec<Sandbox> {
        self.runtime
            .list_sandboxes(None)
            .await
            .expect("list sandboxes")
            .into_iter()
            .filter(|s| s.annotations.get(ANNOTATION_NODE_NAME) == Some(&self.name))
            .collect()
    }

    /// Waits until the pod has a ready sandbox with `containers` running containers.
    pub async fn wait_running(&self, name: &str, containers: usize) -> (Sandbox, Vec<Container>) {
        let what = format!(
            "pod {} with {containers} running containers",
            self.pod_name(name)
        );
        eventually(&what, Duration::from_secs(60), || async {
            let sandboxes = self.sandboxes(name).await;
            let ready: Vec<_> = sandboxes
                .into_iter()
                .filter(|s| s.state == nodelet::runtime::SandboxState::Ready)
                .collect();
            let [sandbox] = ready.as_slice() else {
                return None;
            };
            let running: Vec<Container> = self
                .runtime
                .list_containers(Some((LABEL_POD_UID, &sandbox.uid.0)))
                .await
                .ok()?
                .into_iter()
                .filter(|c| c.sandbox_id == sandbox.id && c.state == ContainerState::Running)
                .collect();
            (running.len() == containers).then(|| (sandbox.clone(), running))
        })
        .await
    }

    /// Waits until the runtime holds nothing of the pod with this UID.
    pub async fn wait_gone(&self, uid: &PodUid, timeout: Duration) {
        eventually(
            &format!("pod {uid} removed from the runtime"),
            timeout,
            || async {
                let sandboxes = self
                    .runtime
                    .list_sandboxes(Some((LABEL_POD_UID, &uid.0)))
                    .await
                    .ok()?;
                let containers = self
                    .runtime
                    .list_containers(Some((LABEL_POD_UID, &uid.0)))
                    .await
                    .ok()?;
                (sandboxes.is_empty() && containers.is_empty()).then_some(())
            },
        )
        .await
    }

    /// Waits until the container's log (any restart) contains `needle`, and returns the log.
    pub async fn wait_log(&self, pod: &str, container: &str, needle: &str) -> String {
        self.wait_log_of("default", &self.pod_name(pod), container, needle)
            .await
    }

    /// Waits until the log of `namespace/name`'s container holds `needle` (any pod of this
    /// node, static or from the API), and returns the log.
    pub async fn wait_log_of(
        &self,
        namespace: &str,
        name: &str,
        container: &str,
        needle: &str,
    ) -> String {
        let prefix = format!("{namespace}_{name}_");
        let pod = format!("{namespace}/{name}");
        let what = format!("{needle:?} in the log of {pod}/{container}");
        eventually(&what, Duration::from_secs(60), || async {
            let text = read_container_logs(&self.pod_logs(), &prefix, container);
            text.contains(needle).then_some(text)
        })
        .await
    }

    /// The nodelet CLI aimed at this node: `args[0]` is the command; the root dir follows it
    /// (what comes after `--` belongs to exec).
    pub fn cli(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodelet"));
        cmd.arg(args[0])
            .arg("--root-dir")
            .arg(self.path("root"))
            .args(&args[1..]);
        cmd
    }

    /// Creates `path` inside a running container (tests use it to let a script go on).
    pub async fn touch(&self, container_id: &str, path: &str) {
        self.runtime
            .exec_sync(
                container_id,
                vec!["touch".into(), path.into()],
                Duration::from_secs(10),
            )
            .await
            .expect("touch in the container");
    }

    /// A client of the node's pod-resources socket.
    pub async fn pod_resources(
        &self,
    ) -> nodelet::server::pod_resources::proto::pod_resources_lister_client::PodResourcesListerClient<
        tonic::transport::Channel,
    >{
        let channel = nodelet::runtime::unix_channel(&self.path("root/pod-resources/kubelet.sock"));
        nodelet::server::pod_resources::proto::pod_resources_lister_client::PodResourcesListerClient::new(channel)
    }

    /// Starts the agent again after [`Node::stop_agent`], with the same node and dirs.
    pub async fn restart(&mut self, extra: &[&str]) {
        self.launch(extra).await;
    }

    /// Stops the agent (pods keep running, as upstream) and waits for it.
    pub async fn stop_agent(&mut self) {
        self.cancel.cancel();
        if let Some(h) = self.agent.take() {
            let result = tokio::time::timeout(Duration::from_secs(10), h).await;
            result
                .expect("agent stops within 10 s")
                .expect("agent task");
        }
    }

    /// A graceful node shutdown (as SIGTERM with a shutdown grace period triggers it), and
    /// waits for the agent to end it, at most `within`.
    pub async fn shut_down_node(&mut self, within: Duration) {
        self.node_shutdown.cancel();
        if let Some(h) = self.agent.take() {
            let result = tokio::time::timeout(within, h).await;
            result
                .expect("the node shutdown ends in time")
                .expect("agent task");
        }
    }

    /// Stops the agent and removes every pod of this node from the runtime.
    pub async fn finish(mut self) {
        self.stop_agent().await;
        remove_node_pods(&self.runtime, &self.name).await;
        unmount_all_under(self.dir.path());
        remove_cgroups(&self.name);
    }
}

/// What a test that failed before [`Node::finish`] left mounted in its directory goes with it,
/// so the directory can be removed.
impl Drop for Node {
    fn drop(&mut self) {
        unmount_all_under(self.dir.path());
    }
}

/// A containerd of its own, for a second node: a test bed in the main one's `beds/<name>` on
/// network `net` (1-30, one per test), taken down by [`OtherRuntime::down`], or on drop after a
/// failure (and by the main test bed's `down` after a killed run).
pub struct OtherRuntime {
    dir: PathBuf,
    net: u8,
    pub endpoint: PathBuf,
    down: bool,
}

impl OtherRuntime {
    /// This bed's CNI network config, which its containerd watches.
    pub fn cni_config(&self) -> PathBuf {
        self.dir
            .join("cni/net.d")
            .join(format!("10-nodelet-testbed-{}.conflist", self.net))
    }

    pub async fn up(name: &str, net: u8) -> OtherRuntime {
        let dir = testbed_dir().join("beds").join(name);
        let bed = OtherRuntime {
            endpoint: dir.join("containerd.sock"),
            dir,
            net,
            down: false,
        };
        bed.run("up").await;
        bed
    }

    fn command(&self, command: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/testbed.sh"))
            .arg(command)
            .env("NODELET_TESTBED", &self.dir)
            .env("NODELET_TESTBED_NET", self.net.to_string())
            .stdin(std::process::Stdio::null());
        // The same runtime generation as the main test bed's.
        if let Ok(generation) = std::env::var("NODELET_TEST_CONTAINERD") {
            cmd.env("NODELET_CONTAINERD", generation);
        }
        cmd
    }

    /// Runs `hack/testbed.sh <command>` for this bed, which must succeed.
    async fn run(&self, command: &str) {
        let out = tokio::process::Command::from(self.command(command))
            .output()
            .await
            .unwrap_or_else(|e| panic!("run hack/testbed.sh {command}: {e}"));
        assert!(
            out.status.success(),
            "hack/testbed.sh {command} for the test bed in {}: {}",
            self.dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Removes its pods, stops it and removes its directory.
    pub async fn down(mut self) {
        self.down = true;
        self.run("down").await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for OtherRuntime {
    fn drop(&mut self) {
        if !self.down {
            let _ = self.command("down").status();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Serves `app` on a free loopback port until the returned token is cancelled.
pub async fn serve(app: axum::Router) -> (std::net::SocketAddr, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    let stop = CancellationToken::new();
    let shutdown = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .expect("the test server runs");
    });
    (addr, stop)
}

/// One metric family as Prometheus's own text parser reads it.
#[derive(Debug, serde::Deserialize)]
pub struct Family {
    #[serde(rename = "type")]
    pub kind: String,
    pub help: String,
}

/// The families of a Prometheus text exposition, by name, as Prometheus's own parser
/// (`promparse`, built beside the control plane) reads them; or the parser's complaint.
pub fn prometheus_families(text: &str) -> Result<BTreeMap<String, Family>, String> {
    use std::io::Write as _;
    let bin = PathBuf::from(std::env::var("K8S_BIN").expect("K8S_BIN (make test sets it)"))
        .join("promparse");
    let mut child = std::process::Command::new(&bin)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (hack/k8s/build.sh bin builds it)", bin.display()));
    let mut stdin = child.stdin.take().expect("promparse's stdin");
    let input = text.to_string();
    let feeder = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("promparse runs");
    let _ = feeder.join();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("promparse's JSON"))
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A directory of its own for one test under the test bed, with an empty `manifests/`.
pub fn test_dir(test: &str) -> tempfile::TempDir {
    let base = testbed_dir().join("tests");
    std::fs::create_dir_all(&base).expect("create the tests dir");
    let dir = tempfile::Builder::new()
        .prefix(&format!("{test}-"))
        .tempdir_in(&base)
        .expect("tempdir");
    std::fs::create_dir_all(dir.path().join("manifests")).expect("manifest dir");
    dir
}

/// The nodelet binary set up for a test node living in `dir` (its manifests, root, logs and
/// cgroup root), healthz off.
pub fn nodelet_command(dir: &Path, node: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_nodelet"));
    cmd.arg("--pod-manifest-path")
        .arg(dir.join("manifests"))
        .arg(format!(
            "--container-runtime-endpoint=unix://{}",
            endpoint().display()
        ))
        .arg("--root-dir")
        .arg(dir.join("root"))
        .arg("--pod-logs-dir")
        .arg(dir.join("pods"))
        .arg("--container-logs-dir")
        .arg(dir.join("containers"))
        .args([
            "--hostname-override",
            node,
            "--healthz-port",
            "0",
            "--port",
            "0",
        ])
        .args(["--image-gc-high-threshold", "100"])
        .args(["--cgroup-root", &cgroup_root(node)])
        .stdin(std::process::Stdio::null());
    cmd
}

/// Removes everything a test node left: its pods, mounts and cgroups.
pub async fn clean_node(node: &str, dir: &Path) {
    remove_node_pods(&runtime().await, node).await;
    unmount_all_under(dir);
    remove_cgroups(node);
}

/// The cgroup root of a test node: its own, so parallel tests never share pod cgroups.
pub fn cgroup_root(node: &str) -> String {
    format!("/nodelet-test/{node}")
}

/// Removes a test node's cgroup tree (after its pods are gone).
pub fn remove_cgroups(node: &str) {
    let root = cgroup_root(node);
    let _ = nodelet::cgroups::remove_tree(root.trim_start_matches('/'));
}

/// The sandboxes the node named `node` owns in the runtime.
pub async fn node_sandboxes(runtime: &RuntimeClient, node: &str) -> Vec<Sandbox> {
    runtime
        .list_sandboxes(None)
        .await
        .expect("list sandboxes")
        .into_iter()
        .filter(|s| s.annotations.get(ANNOTATION_NODE_NAME).map(String::as_str) == Some(node))
        .collect()
}

/// Removes every pod of the node `node` from the runtime, whatever state it is in.
pub async fn remove_node_pods(runtime: &RuntimeClient, node: &str) {
    for sb in node_sandboxes(runtime, node).await {
        for c in runtime
            .list_containers(Some((LABEL_POD_UID, &sb.uid.0)))
            .await
            .unwrap_or_default()
        {
            let _ = runtime.stop_container(&c.id, 0).await;
            let _ = runtime.remove_container(&c.id).await;
        }
        let _ = runtime.stop_pod_sandbox(&sb.id).await;
        let _ = runtime.remove_pod_sandbox(&sb.id).await;
    }
}

/// Everything `container` of the pods whose log directory starts with `prefix` wrote, over all
/// its restarts.
pub fn read_container_logs(pod_logs: &Path, prefix: &str, container: &str) -> String {
    let mut out = String::new();
    let Ok(pods) = std::fs::read_dir(pod_logs) else {
        return out;
    };
    for pod_dir in pods.flatten() {
        if !pod_dir.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(pod_dir.path().join(container)) else {
            continue;
        };
        let mut files: Vec<_> = files.flatten().map(|f| f.path()).collect();
        files.sort();
        for f in files {
            out.push_str(&std::fs::read_to_string(f).unwrap_or_default());
        }
    }
    out
}

/// Unmounts whatever a test left mounted below `dir`.
pub fn unmount_all_under(dir: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(m)
            .status();
    }
}

/// A static pod manifest running busybox `sh -c script` in each named container; every
/// container exits at once on SIGTERM.
pub fn pod_yaml(name: &str, containers: &[(&str, &str)], extra_spec: &str) -> String {
    let mut out = format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 5
{extra_spec}  containers:
"
    );
    for (c, script) in containers {
        let script = format!("trap 'exit 0' TERM; {script}");
        out += &format!(
            "  - name: {c}\n    image: {BUSYBOX}\n    command: [sh, -c, {}]\n",
            serde_json::to_string(&script).expect("json string")
        );
    }
    out
}

/// A script fragment that keeps a container running until it is stopped.
pub const FOREVER: &str = "while true; do sleep 1; done";

/// The value of the sample `series` (a metric name, with its labels as the text shows them) in
/// the metrics `text`, if it is there.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

/// Waits until the node's `/metrics` on the read-only `port` holds every line of `lines`; on
/// timeout, says which are missing and what the node shows of their families.
pub async fn metrics_show(port: u16, what: &str, lines: &[String]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let body = crate::healthz::get(port, "/metrics").await.map(|(_, b)| b);
        let body = body.unwrap_or_default();
        let missing: Vec<&String> = (lines.iter())
            .filter(|want| !body.lines().any(|l| l == want.as_str()))
            .collect();
        if missing.is_empty() {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let family = |l: &str| l.split(['{', ' ']).next().unwrap_or_default().to_string();
            let families: Vec<String> = missing.iter().map(|m| family(m)).collect();
            let shown: Vec<&str> = (body.lines())
                .filter(|l| !l.starts_with('#') && families.contains(&family(l)))
                .collect();
            panic!("{what}: missing {missing:?}; the node shows {shown:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

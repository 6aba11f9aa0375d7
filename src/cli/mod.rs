//! The nodelet CLI: `get`, `describe`, `logs`, `exec` and `events` against a running agent's
//! admin socket (`<root-dir>/nodelet.sock`), printing what kubectl would.

mod print;

use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Event, Pod};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

use crate::server::admin::proto::admin_client::AdminClient;
use crate::server::admin::proto::{self, exec_input, exec_output};
use crate::server::admin::socket_path;

/// The subcommands; anything else on the command line runs the agent.
pub const COMMANDS: &[&str] = &["get", "describe", "logs", "exec", "debug", "events"];

#[derive(Parser, Debug)]
#[command(
    name = "nodelet",
    about = "Inspect and operate the pods of a running nodelet",
    disable_help_subcommand = true
)]
struct Cli {
    /// The agent's --root-dir (its admin socket is <root-dir>/nodelet.sock); without it, the
    /// default's, or the one running agent's.
    #[arg(long, global = true)]
    root_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Debug)]
struct Scope {
    /// The namespace.
    #[arg(short, long, default_value = "default")]
    namespace: String,
    /// Every namespace.
    #[arg(short = 'A', long)]
    all_namespaces: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List pods (`get pods`) or show one (`get pod NAME`); or what ended pods left on the node
    /// that could not be removed yet (`get cleanups`).
    Get {
        /// pods (pod, po), or cleanups
        resource: String,
        name: Option<String>,
        #[command(flatten)]
        scope: Scope,
        /// Output format: wide, json or yaml.
        #[arg(short, long)]
        output: Option<String>,
    },
    /// Show a pod in detail, with its recent events.
    Describe {
        /// pod (pods, po)
        resource: String,
        name: String,
        #[arg(short, long, default_value = "default")]
        namespace: String,
    },
    /// Print a container's log.
    Logs(LogsArgs),
    /// Run a command in a container: `nodelet exec POD [-c C] [-it] -- CMD [ARG...]`.
    Exec {
        pod: String,
        #[arg(short, long, default_value = "default")]
        namespace: String,
        #[arg(short, long)]
        container: Option<String>,
        /// Pass stdin to the command.
        #[arg(short = 'i', long)]
        stdin: bool,
        /// Allocate a terminal (with -i: an interactive shell).
        #[arg(short, long)]
        tty: bool,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Add a debugging container to a static pod (what `kubectl debug` does through the API
    /// server): `nodelet debug POD --image I [--target C] [-it] [-- CMD [ARG...]]`.
    Debug(DebugArgs),
    /// List the node's recent events.
    Events {
        #[command(flatten)]
        scope: Scope,
    },
}

/// `logs`' arguments.
#[derive(clap::Args, Debug)]
struct LogsArgs {
    pod: String,
    #[arg(short, long, default_value = "default")]
    namespace: String,
    /// The container (needed when the pod has several).
    #[arg(short, long)]
    container: Option<String>,
    /// Keep printing new lines until the container stops.
    #[arg(short, long)]
    follow: bool,
    /// The previous instance of the container.
    #[arg(short, long)]
    previous: bool,
    /// Only the last N lines (-1: all).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    tail: i64,
    /// Prefix each line with its time.
    #[arg(long)]
    timestamps: bool,
    /// Only lines newer than this (e.g. 5s, 2m, 3h).
    #[arg(long)]
    since: Option<String>,
    /// Stop after this many bytes.
    #[arg(long)]
    limit_bytes: Option<i64>,
}

/// `debug`'s arguments.
#[derive(clap::Args, Debug)]
struct DebugArgs {
    pod: String,
    #[arg(short, long, default_value = "default")]
    namespace: String,
    /// The debugging container's image.
    #[arg(long)]
    image: String,
    /// Share this container's process namespace.
    #[arg(long)]
    target: Option<String>,
    /// The debugging container's name (default: debugger-XXXXX).
    #[arg(short, long)]
    container: Option<String>,
    /// Keep stdin open and attach to the container.
    #[arg(short = 'i', long)]
    stdin: bool,
    /// Allocate a terminal (with -i: an interactive shell).
    #[arg(short, long)]
    tty: bool,
    /// The command (default: the image's).
    #[arg(last = true)]
    command: Vec<String>,
}

/// Why a command failed; printed as `nodelet: <message>`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach the agent at {}: {why}; is nodelet running with --root-dir {}?", .socket.display(), .root.display())]
    NotRunning {
        socket: PathBuf,
        root: PathBuf,
        why: String,
    },
    #[error("{0}")]
    Call(String),
    #[error("{0}")]
    Usage(String),
}

impl From<tonic::Status> for Error {
    fn from(s: tonic::Status) -> Self {
        Error::Call(s.message().to_string())
    }
}

/// Whether the process arguments ask for the CLI rather than the agent: a command comes
/// first, or after the CLI's own global flag (`nodelet --root-dir D get pods`).
pub fn is_invocation(args: &[std::ffi::OsString]) -> bool {
    let mut rest = args.iter().skip(1).filter_map(|a| a.to_str());
    while let Some(arg) = rest.next() {
        match arg {
            "--root-dir" => {
                rest.next();
            }
            a if a.starts_with("--root-dir=") => {}
            a => return COMMANDS.contains(&a),
        }
    }
    false
}

/// The root dir of the agent to talk to: the one asked for; else the default's when an agent
/// serves it; else the one agent found running (its command line says its `--root-dir`).
fn root_dir(asked: Option<PathBuf>) -> Result<PathBuf, Error> {
    if let Some(root) = asked {
        return Ok(root);
    }
    let default = PathBuf::from(DEFAULT_ROOT_DIR);
    if socket_path(&default).exists() {
        return Ok(default);
    }
    let mut running: Vec<PathBuf> = running_agents()
        .into_iter()
        .filter(|r| socket_path(r).exists())
        .collect();
    running.sort();
    running.dedup();
    match running.as_slice() {
        [] => Ok(default),
        [one] => Ok(one.clone()),
        many => Err(Error::Usage(format!(
            "several agents are running; pass one of: {}",
            many.iter()
                .map(|r| format!("--root-dir {}", r.display()))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The upstream default of `--root-dir`.
const DEFAULT_ROOT_DIR: &str = "/var/lib/kubelet";

/// The root dirs of the nodelet agents running on this host, read from their command lines.
fn running_agents() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter_map(|cmdline| {
            let args: Vec<std::ffi::OsString> = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| std::ffi::OsStr::from_bytes(a).to_os_string())
                .collect();
            let program = Path::new(args.first()?).file_name()?;
            if program != "nodelet" || is_invocation(&args) {
                return None;
            }
            Some(agent_root_dir(&args))
        })
        .collect()
}

/// The `--root-dir` on an agent's command line (the last one wins, as for the agent).
fn agent_root_dir(args: &[std::ffi::OsString]) -> PathBuf {
    let mut root = PathBuf::from(DEFAULT_ROOT_DIR);
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        let bytes = arg.as_bytes();
        if bytes == b"--root-dir" {
            if let Some(value) = rest.next() {
                root = PathBuf::from(value);
            }
        } else if let Some(value) = bytes.strip_prefix(b"--root-dir=") {
            root = PathBuf::from(std::ffi::OsStr::from_bytes(value));
        }
    }
    root
}

/// Runs the CLI on the process arguments; returns the exit code.
pub fn main(args: Vec<std::ffi::OsString>) -> u8 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = e.exit_code();
            let _ = e.print();
            return code as u8;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nodelet: cannot start the async runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nodelet: {e}");
            1
        }
    }
}

async fn connect(root: &Path) -> Result<AdminClient<Channel>, Error> {
    let socket = socket_path(root);
    let not_running = |why: String| Error::NotRunning {
        socket: socket.clone(),
        root: root.to_path_buf(),
        why,
    };
    // A first connection tells a missing agent (or a missing right) apart from other failures.
    if let Err(e) = UnixStream::connect(&socket).await {
        let why = match e.kind() {
            std::io::ErrorKind::PermissionDenied => {
                "permission denied (the socket is root's)".into()
            }
            std::io::ErrorKind::NotFound => "no socket there".into(),
            _ => e.to_string(),
        };
        return Err(not_running(why));
    }
    let path = socket.clone();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
    });
    let channel = Endpoint::from_static("http://[::1]:50051")
        .connect_with_connector(connector)
        .await
        .map_err(|e| not_running(e.to_string()))?;
    Ok(AdminClient::new(channel))
}

fn parse<T: serde::de::DeserializeOwned>(json: &str) -> Result<T, Error> {
    serde_json::from_str(json).map_err(|e| Error::Call(format!("the agent sent a bad object: {e}")))
}

fn parse_all<T: serde::de::DeserializeOwned>(items: &[String]) -> Result<Vec<T>, Error> {
    items.iter().map(|i| parse(i)).collect()
}

fn is_pods(resource: &str) -> Result<(), Error> {
    match resource {
        "pods" | "pod" | "po" => Ok(()),
        other => Err(Error::Usage(format!(
            "the server doesn't have a resource type {other:?}; nodelet knows pods and cleanups (and `nodelet events`)"
        ))),
    }
}

async fn run(cli: Cli) -> Result<u8, Error> {
    let mut client = connect(&root_dir(cli.root_dir)?).await?;
    match cli.command {
        Command::Get { resource, .. } if resource == "cleanups" => get_cleanups(&mut client).await,
        Command::Get {
            resource,
            name,
            scope,
            output,
        } => {
            is_pods(&resource)?;
            get_pods(&mut client, name, scope, output.as_deref()).await
        }
        Command::Describe {
            resource,
            name,
            namespace,
        } => {
            is_pods(&resource)?;
            describe(&mut client, namespace, name).await
        }
        Command::Events { scope } => events(&mut client, scope).await,
        Command::Logs(args) => logs(&mut client, args).await,
        Command::Debug(args) => debug(&mut client, args).await,
        Command::Exec {
            pod,
            namespace,
            container,
            stdin,
            tty,
            command,
        } => {
            let start = proto::ExecStart {
                namespace,
                pod,
                container: container.unwrap_or_default(),
                command,
                stdin,
                tty,
            };
            exec(&mut client, start).await
        }
    }
}

/// `get cleanups`.
async fn get_cleanups(client: &mut AdminClient<Channel>) -> Result<u8, Error> {
    let cleanups = client
        .list_cleanups(proto::ListCleanupsRequest {})
        .await?
        .into_inner()
        .cleanups;
    let cleanups: Vec<crate::status::Cleanup> = parse_all(&cleanups)?;
    let _ = std::io::stdout().write_all(print::cleanups(&cleanups).as_bytes());
    Ok(0)
}

/// `get pods [NAME]`.
async fn get_pods(
    client: &mut AdminClient<Channel>,
    name: Option<String>,
    scope: Scope,
    output: Option<&str>,
) -> Result<u8, Error> {
    let pods = client
        .list_pods(proto::ListPodsRequest {})
        .await?
        .into_inner()
        .pods;
    let pods: Vec<Pod> = parse_all(&pods)?;
    let pods: Vec<Pod> = pods
        .into_iter()
        .filter(|p| {
            scope.all_namespaces || p.metadata.namespace.as_deref() == Some(&scope.namespace)
        })
        .filter(|p| name.is_none() || p.metadata.name == name)
        .collect();
    if let (Some(n), true) = (&name, pods.is_empty()) {
        return Err(Error::Call(format!("pods {n:?} not found")));
    }
    let text =
        print::pods(&pods, output, scope.all_namespaces, name.is_some()).map_err(Error::Usage)?;
    let _ = std::io::stdout().write_all(text.as_bytes());
    Ok(0)
}

/// `describe pod NAME`.
async fn describe(
    client: &mut AdminClient<Channel>,
    namespace: String,
    name: String,
) -> Result<u8, Error> {
    let got = client
        .get_pod(proto::GetPodRequest { namespace, name })
        .await?
        .into_inner();
    let pod: Pod = parse(&got.pod)?;
    let events: Vec<Event> = parse_all(&got.events)?;
    // An older agent sends no diagnosis: the pod is described without one.
    let diagnosis = serde_json::from_str(&got.diagnosis).unwrap_or_default();
    let _ = std::io::stdout().write_all(print::describe(&pod, &events, &diagnosis).as_bytes());
    Ok(0)
}

/// `events`.
async fn events(client: &mut AdminClient<Channel>, scope: Scope) -> Result<u8, Error> {
    let namespace = if scope.all_namespaces {
        String::new()
    } else {
        scope.namespace
    };
    let events = client
        .list_events(proto::ListEventsRequest { namespace })
        .await?
        .into_inner()
        .events;
    let events: Vec<Event> = parse_all(&events)?;
    if events.is_empty() {
        eprintln!("No events found.");
    } else {
        let text = print::events(&events, scope.all_namespaces);
        let _ = std::io::stdout().write_all(text.as_bytes());
    }
    Ok(0)
}

/// `logs POD`: the log as it comes, until it ends or stdout closes.
async fn logs(client: &mut AdminClient<Channel>, args: LogsArgs) -> Result<u8, Error> {
    let since_seconds = match args.since {
        Some(text) => crate::config::parse_duration(&text)
            .map_err(|e| Error::Usage(format!("--since {text:?}: {e}")))
            .map(|d| i64::try_from(d.as_secs().max(1)).unwrap_or(i64::MAX))?,
        None => 0,
    };
    let mut chunks = client
        .logs(proto::LogsRequest {
            namespace: args.namespace,
            pod: args.pod,
            container: args.container.unwrap_or_default(),
            follow: args.follow,
            previous: args.previous,
            tail_lines: args.tail,
            timestamps: args.timestamps,
            since_seconds,
            limit_bytes: args.limit_bytes.unwrap_or(0),
        })
        .await?
        .into_inner();
    let mut out = std::io::stdout().lock();
    while let Some(chunk) = chunks.message().await? {
        if out
            .write_all(&chunk.data)
            .and_then(|()| out.flush())
            .is_err()
        {
            break;
        }
    }
    Ok(0)
}

/// `debug POD`: adds the debugging container, then attaches to it when asked (-i, -t).
async fn debug(client: &mut AdminClient<Channel>, args: DebugArgs) -> Result<u8, Error> {
    let name = match args.container {
        Some(name) => name,
        None => {
            let name = debugger_name();
            eprintln!("Defaulting debug container name to {name}.");
            name
        }
    };
    let mut spec = serde_json::json!({
        "name": name, "image": args.image, "imagePullPolicy": "IfNotPresent",
        "terminationMessagePolicy": "File", "stdin": args.stdin, "tty": args.tty,
    });
    if !args.command.is_empty() {
        spec["command"] = serde_json::json!(args.command);
    }
    if let Some(target) = args.target {
        spec["targetContainerName"] = serde_json::json!(target);
    }
    let request = proto::DebugRequest {
        namespace: args.namespace.clone(),
        pod: args.pod.clone(),
        container: spec.to_string(),
    };
    client.debug(request).await?;
    if !(args.stdin || args.tty) {
        return Ok(0);
    }
    wait_running(client, &args.namespace, &args.pod, &name).await?;
    let start = proto::ExecStart {
        namespace: args.namespace,
        pod: args.pod,
        container: name,
        command: Vec::new(),
        stdin: args.stdin,
        tty: args.tty,
    };
    exec(client, start).await
}

/// `debugger-` and five lower-case letters or digits, as kubectl names them.
fn debugger_name() -> String {
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id());
    let alphabet = b"bcdfghjklmnpqrstvwxz2456789";
    let suffix: String = (0..5)
        .map(|_| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            alphabet[(seed >> 33) as usize % alphabet.len()] as char
        })
        .collect();
    format!("debugger-{suffix}")
}

/// Waits (at most a minute) until the pod's ephemeral container `name` runs.
async fn wait_running(
    client: &mut AdminClient<Channel>,
    namespace: &str,
    pod: &str,
    name: &str,
) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let got = client
            .get_pod(proto::GetPodRequest {
                namespace: namespace.into(),
                name: pod.into(),
            })
            .await?
            .into_inner();
        let found: Pod = parse(&got.pod)?;
        let state = found
            .status
            .and_then(|s| s.ephemeral_container_statuses)
            .into_iter()
            .flatten()
            .find(|c| c.name == name)
            .and_then(|c| c.state);
        match state {
            Some(s) if s.running.is_some() => return Ok(()),
            Some(s) if s.terminated.is_some() => {
                return Err(Error::Usage(format!(
                    "the debug container {name} ended before it could be attached; see nodelet logs {pod} -c {name}"
                )));
            }
            _ if tokio::time::Instant::now() > deadline => {
                return Err(Error::Usage(format!(
                    "the debug container {name} did not start within a minute; see nodelet describe pod {pod}"
                )));
            }
            _ => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    }
}

/// Runs the command, relaying stdin (with -i) and the terminal size (with -t); returns its
/// exit code.
async fn exec(client: &mut AdminClient<Channel>, start: proto::ExecStart) -> Result<u8, Error> {
    let (tx, rx) = tokio::sync::mpsc::channel::<proto::ExecInput>(16);
    let send = |input| proto::ExecInput { input: Some(input) };
    let with_stdin = start.stdin;
    let tty = start.tty;
    let _ = tx.send(send(exec_input::Input::Start(start))).await;
    let raw = if tty { terminal::Raw::enter() } else { None };
    if tty {
        // The size now, then again whenever the terminal is resized.
        let tx = tx.clone();
        let mut resized =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok();
        tokio::spawn(async move {
            loop {
                if let Some((width, height)) = terminal::size() {
                    let size = proto::TerminalSize { width, height };
                    if tx
                        .send(send(exec_input::Input::Resize(size)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                let Some(signal) = resized.as_mut() else {
                    return;
                };
                if signal.recv().await.is_none() {
                    return;
                }
            }
        });
    }
    if with_stdin {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 4096];
            loop {
                match std::io::Read::read(&mut stdin, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let input = send(exec_input::Input::Stdin(buf[..n].to_vec()));
                        if tx.blocking_send(input).is_err() {
                            break;
                        }
                    }
                }
            }
        });
    }
    let mut outputs = client
        .exec(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut code = 1;
    while let Some(out) = outputs.message().await? {
        match out.output {
            Some(exec_output::Output::Stdout(d)) => {
                let mut o = std::io::stdout().lock();
                let _ = o.write_all(&d).and_then(|()| o.flush());
            }
            Some(exec_output::Output::Stderr(d)) => {
                let _ = std::io::stderr().write_all(&d);
            }
            Some(exec_output::Output::ExitCode(c)) => {
                code = c;
                break;
            }
            None => {}
        }
    }
    drop(raw);
    drop(tx);
    Ok(u8::try_from(code).unwrap_or(1))
}

/// The local terminal for `exec -t`: raw mode while the session lasts, and its size.
mod terminal {
    /// Raw mode on stdin, restored when dropped.
    pub struct Raw(libc::termios);

    impl Raw {
        /// Raw mode, when stdin is a terminal.
        pub fn enter() -> Option<Raw> {
            // SAFETY: termios calls on fd 0 with a zeroed struct filled by tcgetattr.
            unsafe {
                let mut saved: libc::termios = std::mem::zeroed();
                if libc::isatty(0) != 1 || libc::tcgetattr(0, &mut saved) != 0 {
                    return None;
                }
                let mut raw = saved;
                libc::cfmakeraw(&mut raw);
                (libc::tcsetattr(0, libc::TCSANOW, &raw) == 0).then_some(Raw(saved))
            }
        }
    }

    impl Drop for Raw {
        fn drop(&mut self) {
            // SAFETY: restores the attributes read in `enter`.
            unsafe {
                libc::tcsetattr(0, libc::TCSANOW, &self.0);
            }
        }
    }

    /// The terminal's columns and rows, when stdout is a terminal.
    pub fn size() -> Option<(u32, u32)> {
        // SAFETY: TIOCGWINSZ fills a winsize struct.
        unsafe {
            let mut ws: libc::winsize = std::mem::zeroed();
            (libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_col > 0)
                .then(|| (u32::from(ws.ws_col), u32::from(ws.ws_row)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<std::ffi::OsString> {
        line.split(' ').map(Into::into).collect()
    }

    #[test]
    fn the_root_dir_may_stand_before_the_command() {
        for cli in [
            "nodelet get pods",
            "nodelet --root-dir /r get pods",
            "nodelet --root-dir=/r logs p",
            "nodelet get pods --root-dir /r",
        ] {
            assert!(is_invocation(&args(cli)), "{cli}");
        }
        for agent in [
            "nodelet",
            "nodelet --root-dir /r",
            "nodelet --root-dir /r --pod-manifest-path /m",
            "nodelet --pod-manifest-path get",
        ] {
            assert!(!is_invocation(&args(agent)), "{agent}");
        }
    }

    #[test]
    fn an_agents_root_dir_is_read_from_its_command_line() {
        assert_eq!(
            agent_root_dir(&args("nodelet --pod-manifest-path /m")),
            PathBuf::from(DEFAULT_ROOT_DIR)
        );
        assert_eq!(
            agent_root_dir(&args("/usr/bin/nodelet --root-dir /a --v 2")),
            PathBuf::from("/a")
        );
        assert_eq!(
            agent_root_dir(&args("nodelet --root-dir=/a --root-dir=/b")),
            PathBuf::from("/b")
        );
    }
}

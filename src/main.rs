//! The nodelet binary: parse flags, set up logging, load and validate the configuration, run
//! the agent, and map failures to exit codes (2: bad configuration, 1: runtime failure). A first
//! argument naming a CLI command (`get`, `describe`, `logs`, `exec`, `events`) runs the CLI instead.

use std::process::ExitCode;

use nodelet::config::{self, Invocation};
use tokio_util::sync::CancellationToken;

fn init_tracing(verbosity: u8, run_once: bool) {
    let default = match verbosity {
        // Run-once prints its own progress; routine logs would only interleave with it.
        0 if run_once => "warn",
        0..=3 => "info",
        4..=5 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("nodelet={default},warn")));
    // Colours only on a terminal: a log file or a log shipper gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
}

/// SIGINT stops the agent (pods keep running, as upstream). So does SIGTERM, unless graceful
/// node shutdown is configured (`node_shutdown`): then SIGTERM means the node goes down, and
/// nodelet stops every pod before it exits. A second signal exits at once.
async fn shutdown_signal(cancel: CancellationToken, node_shutdown: Option<CancellationToken>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    let terminated = tokio::select! {
        _ = term.recv() => true,
        _ = int.recv() => false,
    };
    match node_shutdown {
        Some(node_shutdown) if terminated => {
            tracing::info!(
                "SIGTERM received with a shutdown grace period: stopping every pod, then exiting (a second signal exits at once)"
            );
            node_shutdown.cancel();
        }
        _ => {
            tracing::info!("signal received; stopping (a second signal exits at once)");
            cancel.cancel();
        }
    }
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    std::process::exit(130);
}

/// Sets the agent's own oom_score_adj (oomScoreAdj, --oom-score-adj), so that under memory
/// pressure the kernel's OOM killer takes pods before the agent that would evict them, as the
/// kubelet does for itself.
fn protect_from_oom(adj: i32) {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", adj.to_string()) {
        tracing::warn!(oom_score_adj = adj, error = %e, "cannot set the agent's oom_score_adj (--oom-score-adj); the OOM killer may take it before pods");
    }
}

/// Why nodelet ends other than successfully; each maps to its exit code.
enum Exit {
    /// clap's own answer to the command line (help, or a usage error), with clap's code.
    CommandLine(clap::Error),
    /// The settings are invalid (2).
    Config(String),
    /// The agent could not start, or failed (1).
    Failed(String),
    /// Run-once: not every pod succeeded (1; the pods' results are already reported).
    PodsFailed,
}

impl Exit {
    /// Says why, where it has not been said, and gives the exit code.
    fn report(self) -> ExitCode {
        match self {
            Exit::CommandLine(e) => {
                let code = e.exit_code();
                let _ = e.print();
                ExitCode::from(u8::try_from(code).unwrap_or(2))
            }
            Exit::Config(message) => {
                eprintln!("nodelet: {message}");
                ExitCode::from(2)
            }
            Exit::Failed(message) => {
                eprintln!("nodelet: {message}");
                ExitCode::from(1)
            }
            Exit::PodsFailed => ExitCode::from(1),
        }
    }
}

/// glibc's malloc gives threads arenas of their own, up to eight per core, and memory freed
/// stays in the arena that took it: a burst of pods handled across the runtime's threads left
/// the idle agent's heap spread over many part-used arenas. Two keep it compact; the agent's
/// allocations are few enough that the threads rarely wait on each other.
#[cfg(target_env = "gnu")]
fn limit_malloc_arenas() {
    // SAFETY: mallopt only tunes the allocator, and runs before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn main() -> ExitCode {
    #[cfg(target_env = "gnu")]
    limit_malloc_arenas();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if nodelet::cli::is_invocation(&args) {
        return ExitCode::from(nodelet::cli::main(args));
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(exit) => exit.report(),
    }
}

fn run(args: Vec<std::ffi::OsString>) -> Result<(), Exit> {
    let loaded = match config::from_args(args) {
        Invocation::Exit(e) => return Err(Exit::CommandLine(e)),
        Invocation::Version(line) => {
            println!("{line}");
            return Ok(());
        }
        Invocation::Run(result) => (*result).map_err(|e| Exit::Config(e.to_string()))?,
    };
    init_tracing(loaded.config.verbosity, loaded.config.run_once);
    if let Some(kubeconfig) = &loaded.config.kubeconfig
        && loaded.config.run_once
    {
        tracing::warn!(kubeconfig = %kubeconfig.display(), "run-once mode reads only the static pod sources; --kubeconfig is ignored");
    }
    for gate in loaded.config.feature_gates.keys() {
        if !nodelet::config::FEATURE_GATES
            .iter()
            .any(|(known, _, _)| known == gate)
        {
            tracing::warn!(gate = %gate, "feature gate is not one nodelet acts on; ignored");
        }
    }
    protect_from_oom(loaded.config.oom_score_adj);
    if let Some(cgroup) = &loaded.config.kubelet_cgroups {
        let floor = loaded
            .config
            .kube_reserved
            .get("memory")
            .and_then(|q| nodelet::pod::parse_quantity(q))
            .map(|bytes| bytes as u64);
        nodelet::cgroups::enter(cgroup, floor).map_err(|e| {
            Exit::Failed(format!(
                "cannot move the agent into --kubelet-cgroups {cgroup}: {e}"
            ))
        })?;
    }
    for field in &loaded.ignored_fields {
        tracing::warn!(field = %field, "config file field is accepted but not acted on yet");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Exit::Failed(format!("cannot start the async runtime: {e}")))?;
    let _lock = match &loaded.config.lock_file {
        Some(path) => Some(
            nodelet::lock::acquire(path)
                .map_err(|e| Exit::Failed(nodelet::types::error_chain(&e)))?,
        ),
        None => None,
    };
    let result = runtime.block_on(async {
        let cancel = CancellationToken::new();
        let node_shutdown = CancellationToken::new();
        let graceful = !loaded.config.run_once && !loaded.config.shutdown_stages().is_empty();
        tokio::spawn(shutdown_signal(
            cancel.clone(),
            graceful.then(|| node_shutdown.clone()),
        ));
        let _watch = match (
            &loaded.config.lock_file,
            loaded.config.exit_on_lock_contention,
        ) {
            (Some(path), true) => Some(nodelet::lock::exit_on_contention(path, cancel.clone())?),
            _ => None,
        };
        if loaded.config.run_once {
            nodelet::run_once::run(loaded.config, cancel).await
        } else {
            nodelet::agent::run(loaded.config, cancel, node_shutdown)
                .await
                .map(|()| true)
        }
    });
    match result {
        Ok(true) => Ok(()),
        Ok(false) => Err(Exit::PodsFailed),
        Err(e) => Err(Exit::Failed(nodelet::types::error_chain(e.as_ref()))),
    }
}

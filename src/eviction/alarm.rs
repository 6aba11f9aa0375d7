//! What wakes the eviction manager between its polls, so memory pressure is seen within a second:
//! the kernel's memory threshold notification on the node's memory cgroup (cgroup v1; re-armed
//! after every observation at the working set where memory.available meets its threshold, as
//! upstream's memcg notifier does), and a PSI trigger on /proc/pressure/memory (any kernel with
//! PSI, on either hierarchy) that fires when tasks stall on memory.

use std::fs::File;
use std::future::pending;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

use crate::cgroups;

/// The PSI trigger: some task stalled on memory for 100 ms within a 1 s window.
const PSI_TRIGGER: &[u8] = b"some 100000 1000000\0";

/// The least time between two passes an alarm starts, so a working set that hovers at the
/// threshold cannot make the manager spin.
const QUIET: Duration = Duration::from_secs(1);

pub(super) struct Alarms {
    enabled: bool,
    threshold: Option<AsyncFd<OwnedFd>>,
    psi: Option<AsyncFd<File>>,
    /// The working set was past the threshold once armed: the kernel reports no crossing then,
    /// so the next pass comes as soon as the alarms are no longer quiet.
    past: bool,
    not_before: Instant,
    /// Whether arming the threshold has failed already (said once, not every pass).
    threshold_failed: bool,
}

fn psi_trigger() -> std::io::Result<AsyncFd<File>> {
    let mut file = File::options()
        .read(true)
        .write(true)
        .open("/proc/pressure/memory")?;
    file.write_all(PSI_TRIGGER)?;
    // SAFETY: the file owns its descriptor, which stays open until the AsyncFd drops it.
    unsafe { AsyncFd::register_with_interest(file, Interest::PRIORITY) }.map_err(Into::into)
}

impl Alarms {
    /// No alarm ever fires unless `enabled`.
    pub fn new(enabled: bool) -> Alarms {
        let psi = match enabled.then(psi_trigger) {
            Some(Ok(fd)) => Some(fd),
            Some(Err(e)) => {
                tracing::info!(error = %e, "no PSI trigger on /proc/pressure/memory: memory stalls are seen by the eviction manager's poll only");
                None
            }
            None => None,
        };
        Alarms {
            enabled,
            threshold: None,
            psi,
            past: false,
            not_before: Instant::now(),
            threshold_failed: false,
        }
    }

    /// Replaces the threshold notification with one at `working_set` bytes (none for `None`),
    /// and holds the alarms quiet for a moment.
    pub fn arm(&mut self, cgroups: &cgroups::Manager, working_set: Option<u64>) {
        self.not_before = Instant::now() + QUIET;
        self.threshold = None;
        self.past = false;
        let Some(armed) = working_set
            .filter(|_| self.enabled)
            .and_then(|w| cgroups.node_memory_threshold(w))
        else {
            return;
        };
        // SAFETY: the OwnedFd keeps its descriptor open until the AsyncFd drops it.
        let registered = armed.and_then(|(fd, past)| {
            unsafe { AsyncFd::register(fd) }
                .map(|fd| (fd, past))
                .map_err(Into::into)
        });
        match registered {
            Ok((fd, past)) => {
                self.threshold = Some(fd);
                self.past = past;
            }
            Err(e) if !self.threshold_failed => {
                self.threshold_failed = true;
                tracing::warn!(error = %e, "cannot arm the memory cgroup's threshold notification: memory pressure is seen by the eviction manager's poll only");
            }
            Err(_) => {}
        }
    }

    /// Waits for an alarm; never returns when none is set. Cancel safe.
    pub async fn fired(&self) -> &'static str {
        tokio::time::sleep_until(self.not_before).await;
        if self.past {
            return "the memory threshold was already crossed";
        }
        let threshold = async {
            match &self.threshold {
                Some(fd) => {
                    let _ = fd.readable().await;
                }
                None => pending().await,
            }
        };
        let psi = async {
            match &self.psi {
                Some(fd) => match fd.ready(Interest::PRIORITY).await {
                    Ok(mut guard) => guard.clear_ready(),
                    Err(_) => pending().await,
                },
                None => pending().await,
            }
        };
        tokio::select! {
            _ = threshold => "the memory threshold was crossed",
            _ = psi => "tasks stalled on memory",
        }
    }
}

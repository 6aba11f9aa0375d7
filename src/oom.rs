//! The OOM watcher: the kernel's log (`/dev/kmsg`) read as upstream's OOM watcher reads it, and a
//! `SystemOOM` warning on the node for every OOM kill the whole machine ran into (not a
//! container's own memory limit), naming the victim process.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

use tokio::io::unix::AsyncFd;
use tokio_util::sync::CancellationToken;

use crate::events::{Recorder, Target};

/// One OOM kill read from the kernel's log.
#[derive(Debug, PartialEq, Eq)]
pub struct OomKill {
    /// The memory cgroup whose limit was hit; `/` when the machine ran out of memory.
    pub oom_memcg: String,
    pub process: String,
    pub pid: u32,
}

impl OomKill {
    fn new() -> OomKill {
        OomKill {
            oom_memcg: "/".into(),
            process: String::new(),
            pid: 0,
        }
    }

    /// Did the whole machine run out of memory (rather than a cgroup hitting its limit)?
    pub fn is_system(&self) -> bool {
        self.oom_memcg == "/"
    }

    /// Upstream's event message.
    pub fn message(&self) -> String {
        if self.process.is_empty() || self.pid == 0 {
            "System OOM encountered".into()
        } else {
            format!(
                "System OOM encountered, victim process: {}, pid: {}",
                self.process, self.pid
            )
        }
    }
}

/// Follows the kernel's OOM report over its log lines: it starts at `invoked oom-killer:` and
/// ends at the `oom-kill:` summary (the victim's memory cgroup, `global_oom` when there was
/// none, its name and pid) or, on kernels without that summary, at `Killed process`.
#[derive(Default)]
pub struct Parser {
    current: Option<OomKill>,
}

impl Parser {
    /// Takes one log message; returns the OOM kill it completes.
    pub fn feed(&mut self, message: &str) -> Option<OomKill> {
        if message.contains("invoked oom-killer:") {
            self.current = Some(OomKill::new());
            return None;
        }
        let current = self.current.as_mut()?;
        if let Some(summary) = message
            .find("oom-kill:")
            .map(|i| &message[i + "oom-kill:".len()..])
        {
            for field in summary.split(',') {
                match field.split_once('=') {
                    Some(("oom_memcg", v)) => current.oom_memcg = v.into(),
                    Some(("task", v)) => current.process = v.into(),
                    Some(("pid", v)) => current.pid = v.trim().parse().unwrap_or(0),
                    _ => {}
                }
            }
            return self.current.take();
        }
        if let Some(rest) = message
            .find("Killed process ")
            .map(|i| &message[i + "Killed process ".len()..])
            && let Some((pid, rest)) = rest.split_once(" (")
            && let Some((name, _)) = rest.split_once(')')
        {
            current.pid = pid.parse().unwrap_or(0);
            current.process = name.into();
            return self.current.take();
        }
        None
    }
}

/// The text of one `/dev/kmsg` record (`prefix;text`, then optional `\n key=value` lines).
fn record_text(record: &str) -> &str {
    let text = record.split_once(';').map_or(record, |(_, t)| t);
    text.split('\n').next().unwrap_or_default()
}

/// Reads the kernel's log from now on until `cancel`, recording a `SystemOOM` warning on `node`
/// for each system OOM kill. Without a readable `/dev/kmsg` it says so once and stops.
pub async fn run(recorder: Recorder, node: String, cancel: CancellationToken) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/kmsg");
    let file = match file {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the kernel log (/dev/kmsg); system OOM kills are not reported");
            return;
        }
    };
    // Only what the kernel logs from now on: its earlier OOM kills were reported before.
    // SAFETY: lseek on a descriptor this function owns.
    unsafe { libc::lseek(std::os::fd::AsRawFd::as_raw_fd(&file), 0, libc::SEEK_END) };
    // SAFETY: the File owns its descriptor, which stays open and the same until the AsyncFd,
    // which owns the File, is dropped.
    let fd = match unsafe { AsyncFd::register(file) } {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the kernel log (/dev/kmsg); system OOM kills are not reported");
            return;
        }
    };
    let mut parser = Parser::default();
    let mut buf = vec![0u8; 8192];
    loop {
        let mut ready = tokio::select! {
            _ = cancel.cancelled() => return,
            ready = fd.readable() => match ready {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "the kernel log (/dev/kmsg) cannot be read any more; system OOM kills are not reported");
                    return;
                }
            },
        };
        // Each read returns one record; records overwritten before they were read fail with
        // EPIPE, and the next read goes on after them.
        loop {
            match ready.try_io(|f| f.get_ref().read(&mut buf)) {
                Ok(Ok(n)) => {
                    let record = String::from_utf8_lossy(&buf[..n]);
                    if let Some(kill) = parser.feed(record_text(&record))
                        && kill.is_system()
                    {
                        recorder.warning(Target::node(&node), "SystemOOM", kill.message());
                    }
                }
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "the kernel log (/dev/kmsg) cannot be read any more; system OOM kills are not reported");
                    return;
                }
                Err(_would_block) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(lines: &[&str]) -> Vec<OomKill> {
        let mut p = Parser::default();
        lines
            .iter()
            .filter_map(|l| p.feed(record_text(l)))
            .collect()
    }

    #[test]
    fn a_machine_wide_oom_kill_is_a_system_oom_and_a_cgroup_limit_is_not() {
        let global = feed_all(&[
            "4,100,1,-;stress invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0",
            "4,101,2,-;Mem-Info:",
            "6,102,3,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice,task=stress,pid=4242,uid=0\n SUBSYSTEM=memory",
            "3,103,4,-;Out of memory: Killed process 4242 (stress) total-vm:1kB",
        ]);
        assert_eq!(
            global,
            [OomKill {
                oom_memcg: "/".into(),
                process: "stress".into(),
                pid: 4242
            }]
        );
        assert!(global[0].is_system());
        assert_eq!(
            global[0].message(),
            "System OOM encountered, victim process: stress, pid: 4242"
        );
        let limited = feed_all(&[
            "4,200,1,-;tail invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=999",
            "6,201,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=1a14,mems_allowed=0,oom_memcg=/kubepods/burstable/pode68,task_memcg=/kubepods/burstable/pode68/1a14,task=tail,pid=5667,uid=0",
            "3,202,3,-;Memory cgroup out of memory: Killed process 5667 (tail) total-vm:17920kB",
        ]);
        assert_eq!(limited.len(), 1);
        assert!(!limited[0].is_system());
    }

    #[test]
    fn kernels_without_the_summary_line_end_the_report_at_killed_process() {
        let kills = feed_all(&[
            "6,1,1,-;Killed process 1 (init) before any report",
            "4,2,2,-;java invoked oom-killer: gfp_mask=0x24201ca, order=0",
            "3,3,3,-;Out of memory: Killed process 77 (java) total-vm:1kB",
        ]);
        assert_eq!(
            kills,
            [OomKill {
                oom_memcg: "/".into(),
                process: "java".into(),
                pid: 77
            }]
        );
    }
}

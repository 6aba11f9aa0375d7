//! The lock file (--lock-file): an exclusive flock held for the agent's life, and with
//! --exit-on-lock-contention a watch that ends the agent when another process opens the file
//! or deletes it, as upstream does for in-place upgrades.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use notify::{EventKind, RecursiveMode, Watcher};
use tokio_util::sync::CancellationToken;

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("lock file {} is held by another process (is another nodelet or kubelet running?)", .0.display())]
    Held(PathBuf),
    #[error("cannot open lock file {}", .path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot watch lock file {} for contention", .path.display())]
    Watch {
        path: PathBuf,
        #[source]
        source: notify::Error,
    },
}

/// A held lock; released when dropped (or when the process ends).
pub struct Lock {
    _file: File,
}

/// Takes the exclusive lock on `path`, creating the file if needed; fails at once if it is held.
pub fn acquire(path: &Path) -> Result<Lock, Error> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|source| Error::Open {
            path: path.to_path_buf(),
            source,
        })?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        return Err(if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            Error::Held(path.to_path_buf())
        } else {
            Error::Open {
                path: path.to_path_buf(),
                source: err,
            }
        });
    }
    Ok(Lock { _file: file })
}

/// Cancels `cancel` when another process opens the lock file or it is deleted. The returned
/// watcher must be kept alive.
pub fn exit_on_contention(
    path: &Path,
    cancel: CancellationToken,
) -> Result<notify::RecommendedWatcher, Error> {
    let shown = path.display().to_string();
    let handler = move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        let contention = matches!(
            event.kind,
            EventKind::Access(notify::event::AccessKind::Open(_)) | EventKind::Remove(_)
        );
        if contention && !cancel.is_cancelled() {
            tracing::info!(lock_file = %shown, "another process wants the lock file; exiting");
            cancel.cancel();
        }
    };
    let watch_error = |source| Error::Watch {
        path: path.to_path_buf(),
        source,
    };
    let mut watcher = notify::recommended_watcher(handler).map_err(watch_error)?;
    watcher
        .watch(path, RecursiveMode::NonRecursive)
        .map_err(watch_error)?;
    Ok(watcher)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nodelet.lock");
        let first = acquire(&path).unwrap();
        let err = acquire(&path).err().unwrap().to_string();
        assert!(err.contains("held by another process"), "{err}");
        drop(first);
        acquire(&path).unwrap();
    }
}

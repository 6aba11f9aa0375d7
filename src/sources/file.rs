//! The file source: static pod manifests in a directory (or one file), seen through inotify plus
//! a full relist every --file-check-frequency. Each scan yields the source's complete snapshot.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::SourceSnapshot;
use super::{MAX_MANIFEST_BYTES, Manifest, manifest};
use crate::pod::StaticOrigin;
use crate::types::{Source, full_name};

/// A change that may be the first of several (a create, a write, a chmod) is read this long
/// after it, or sooner when a change that finishes a write comes, so an editor's save is read
/// once, after it is done. A change that finishes a write is read at once.
const SETTLE: Duration = Duration::from_millis(25);

/// Settings of the file source.
#[derive(Clone, Debug)]
pub struct Config {
    pub path: PathBuf,
    pub node_name: String,
    pub check_frequency: Duration,
    pub api_references: super::ApiReferences,
}

/// Is this directory entry an editor or package-manager artifact rather than a manifest?
pub fn is_ignored_name(name: &str) -> bool {
    name.starts_with('.')
        || name == "4913"
        || name.ends_with('~')
        || [
            ".swp", ".swx", ".bak", ".tmp", ".orig", ".rpmnew", ".rpmsave",
        ]
        .iter()
        .any(|ext| name.ends_with(ext))
        || name.contains(".dpkg-")
}

/// What reading one manifest file found.
enum Read {
    /// Its bytes are those parsed last time, whose outcome stands.
    Unchanged,
    /// It was removed since the directory was listed.
    Gone,
    /// Its new bytes: what they describe, or every problem found in them.
    Parsed(Result<Manifest, Vec<String>>),
}

/// Scans the manifest path and remembers what it needs across scans: the bytes each file had
/// when it was last parsed (an unchanged file is not parsed again), the last good contents of
/// each file (kept while a file is being rewritten or is broken) and the last error per file (so a
/// broken file is reported once, not on every relist).
pub struct Scanner {
    config: Config,
    parsed: HashMap<PathBuf, Vec<u8>>,
    last_good: HashMap<PathBuf, Manifest>,
    last_error: HashMap<PathBuf, String>,
}

impl Scanner {
    pub fn new(config: Config) -> Self {
        Scanner {
            config,
            parsed: HashMap::new(),
            last_good: HashMap::new(),
            last_error: HashMap::new(),
        }
    }

    /// The manifest files to read, in lexical order.
    /// `None` when the path cannot be listed right now (the pods are then left as they are:
    /// a passing error must not stop every static pod).
    fn files(&self) -> Option<Vec<PathBuf>> {
        let path = &self.config.path;
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::debug!(path = %path.display(), "manifest path does not exist; no static pods");
                return Some(Vec::new());
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the manifest path; pods are left as they are");
                return None;
            }
        };
        if meta.is_file() {
            return Some(vec![path.clone()]);
        }
        let entries = match std::fs::read_dir(path) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot list the manifest directory; pods are left as they are");
                return None;
            }
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        let mut files = Vec::new();
        for name in names {
            if is_ignored_name(&name) {
                tracing::debug!(file = %name, "ignoring hidden or editor file in the manifest directory");
                continue;
            }
            let file = path.join(&name);
            // Follows symlinks; subdirectories are not entered.
            match std::fs::metadata(&file) {
                Ok(m) if m.is_file() => files.push(file),
                Ok(_) => tracing::debug!(file = %file.display(), "not a regular file; skipped"),
                // Gone since the listing: no manifest.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // Unreadable (a symlink loop, no permission): reading it reports why and keeps
                // what it described before.
                Err(_) => files.push(file),
            }
        }
        Some(files)
    }

    /// The bytes of one file, `None` when it is gone, or why it cannot be read.
    fn read_file(file: &Path) -> Result<Option<Vec<u8>>, Vec<String>> {
        let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        let size = match std::fs::metadata(file) {
            Ok(meta) => meta.len(),
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(vec![format!("cannot stat: {e}")]),
        };
        if size > MAX_MANIFEST_BYTES {
            return Err(vec![format!(
                "file is {size} bytes, larger than the {MAX_MANIFEST_BYTES} bytes a manifest may have"
            )]);
        }
        match std::fs::read(file) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if gone(&e) => Ok(None),
            Err(e) => Err(vec![format!("cannot read: {e}")]),
        }
    }

    /// What one file describes now.
    fn read_changed(&mut self, file: &Path, seen: &str) -> Read {
        let bytes = match Self::read_file(file) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Read::Gone,
            Err(problems) => {
                self.parsed.remove(file);
                return Read::Parsed(Err(problems));
            }
        };
        if self.parsed.get(file) == Some(&bytes) {
            return Read::Unchanged;
        }
        let origin = file.to_string_lossy();
        let found = manifest(
            &bytes,
            &self.config.node_name,
            (StaticOrigin::File(&origin), self.config.api_references),
            seen,
        );
        self.parsed.insert(file.to_path_buf(), bytes);
        Read::Parsed(found)
    }

    /// Reads every manifest and returns the source's full snapshot, or `None` when the path
    /// cannot be listed.
    pub fn scan(&mut self) -> Option<SourceSnapshot> {
        self.scan_without(&HashSet::new())
    }

    /// Forgets what a file that is gone described.
    fn forget(&mut self, file: &Path) {
        self.parsed.remove(file);
        self.last_good.remove(file);
        self.last_error.remove(file);
    }

    /// Whether any of these files, deleted since the last scan, described something and is
    /// back already: its pods must be seen to go before they come back.
    fn deleted_and_back(&self, deleted: &HashSet<PathBuf>) -> bool {
        deleted
            .iter()
            .any(|f| self.last_good.contains_key(f) && f.exists())
    }

    /// [`Scanner::scan`] as if the files `skip` were not there.
    fn scan_without(&mut self, skip: &HashSet<PathBuf>) -> Option<SourceSnapshot> {
        let seen = crate::types::now().to_string();
        let mut files = self.files()?;
        files.retain(|f| !skip.contains(f));
        let present: HashSet<&PathBuf> = files.iter().collect();
        self.parsed.retain(|f, _| present.contains(f));
        self.last_good.retain(|f, _| present.contains(f));
        self.last_error.retain(|f, _| present.contains(f));
        let mut pods = Vec::new();
        let mut objects = Vec::new();
        let mut names: HashMap<String, PathBuf> = HashMap::new();
        for file in &files {
            let found = match self.read_changed(file, &seen) {
                Read::Unchanged => self.last_good.get(file).cloned().unwrap_or_default(),
                // Removed since the listing: as if it had not been listed.
                Read::Gone => {
                    self.forget(file);
                    continue;
                }
                Read::Parsed(Ok(found)) => {
                    if self.last_error.remove(file).is_some() {
                        tracing::info!(file = %file.display(), "manifest is valid again");
                    }
                    if found.pods.is_empty() && found.objects.is_empty() {
                        tracing::warn!(file = %file.display(), "manifest file holds no object (empty, or only comments and ---); it runs nothing");
                    }
                    self.last_good.insert(file.clone(), found.clone());
                    found
                }
                Read::Parsed(Err(problems)) => {
                    let message = problems.join("; ");
                    let kept = self.last_good.get(file).cloned().unwrap_or_default();
                    if self.last_error.get(file) != Some(&message) {
                        tracing::error!(
                            file = %file.display(),
                            kept_pods = kept.pods.len(),
                            kept_objects = kept.objects.len(),
                            "invalid static pod manifest, ignored (what it described before is kept): {message}"
                        );
                        self.last_error.insert(file.clone(), message);
                    }
                    kept
                }
            };
            for pod in found.pods {
                let name = full_name(&pod);
                if let Some(first) = names.get(&name) {
                    tracing::warn!(pod = %name, file = %file.display(), first = %first.display(),
                        "duplicate static pod name; the one from the first file is kept");
                    continue;
                }
                names.insert(name, file.clone());
                pods.push(pod);
            }
            for object in found.objects {
                let name = format!("{} {}", object.kind, object.full_name());
                if let Some(first) = names.get(&name) {
                    tracing::warn!(object = %name, file = %file.display(), first = %first.display(),
                        "duplicate object; the one from the first file is kept");
                    continue;
                }
                names.insert(name, file.clone());
                objects.push(object);
            }
        }
        Some(SourceSnapshot {
            source: Source::File,
            pods,
            objects,
        })
    }
}

/// What the watcher has seen since the last scan.
#[derive(Default)]
struct Changes {
    notify: Notify,
    /// Some change finished a write: the files can be read now.
    finished: AtomicBool,
    /// The files deleted: one deleted and written again is a pod removed and added again
    /// (restarted, as upstream), not an unchanged file.
    deleted: std::sync::Mutex<HashSet<PathBuf>>,
}

impl Changes {
    /// Waits, after a first change, until the files can be read: at once when a change finished
    /// its write, else when no change finished one within SETTLE.
    async fn settled(&self) {
        let deadline = tokio::time::Instant::now() + SETTLE;
        while !self.finished.swap(false, Ordering::AcqRel) {
            if tokio::time::timeout_at(deadline, self.notify.notified())
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

/// A change after which the file it touched is complete: a rename into place (the atomic way
/// to write a manifest, and how `..data` symlinks are swapped), a writer closing the file, or a
/// removal.
fn finishes_a_write(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::Modify(ModifyKind::Name(_))
            | EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Remove(_)
    )
}

/// Watches the manifest path and sends a snapshot after every settled change and every relist
/// period, until `cancel`.
pub async fn run(config: Config, tx: mpsc::Sender<SourceSnapshot>, cancel: CancellationToken) {
    let changed = Arc::new(Changes::default());
    let mut scanner = Scanner::new(config.clone());
    let mut watcher: Option<notify::RecommendedWatcher> = None;
    let mut ticker = tokio::time::interval(config.check_frequency);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if watcher.is_none() {
            watcher = watch(&config.path, changed.clone());
        }
        let deleted =
            std::mem::take(&mut *changed.deleted.lock().unwrap_or_else(|e| e.into_inner()));
        if scanner.deleted_and_back(&deleted)
            && let Some(snapshot) = scanner.scan_without(&deleted)
            && tx.send(snapshot).await.is_err()
        {
            return;
        }
        if let Some(snapshot) = scanner.scan()
            && tx.send(snapshot).await.is_err()
        {
            return;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
            _ = changed.notify.notified() => {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = changed.settled() => {}
                }
            }
        }
    }
}

/// An inotify watch on the directory that holds the manifests (the parent, for a single file),
/// so renames and symlink swaps are seen. `None` when it cannot be set up yet (e.g. the directory
/// does not exist): the periodic relist retries.
fn watch(path: &Path, changed: Arc<Changes>) -> Option<notify::RecommendedWatcher> {
    let dir = if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent().filter(|p| p.is_dir())?.to_path_buf()
    };
    // Opening and reading files (our own scans among them) changes nothing: only other events
    // count, or every scan would trigger the next one.
    let handler = move |event: notify::Result<notify::Event>| match event {
        Ok(e)
            if matches!(
                e.kind,
                EventKind::Access(
                    AccessKind::Open(_) | AccessKind::Read | AccessKind::Close(AccessMode::Read)
                )
            ) => {}
        Ok(e) => {
            if let EventKind::Remove(_) = e.kind {
                let mut deleted = changed.deleted.lock().unwrap_or_else(|e| e.into_inner());
                deleted.extend(e.paths);
            }
            if finishes_a_write(&e.kind) {
                changed.finished.store(true, Ordering::Release);
            }
            changed.notify.notify_one();
        }
        Err(_) => {}
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot create an inotify watcher; relying on the periodic relist");
            return None;
        }
    };
    match watcher.watch(&dir, RecursiveMode::NonRecursive) {
        Ok(()) => Some(watcher),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the manifest directory; relying on the periodic relist");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn editor_and_package_manager_files_are_ignored() {
        for name in [
            ".web.yaml",
            "web.yaml.swp",
            "web.yaml.swx",
            "web.yaml~",
            "4913",
            "web.yaml.bak",
            "web.tmp",
            "web.yaml.orig",
            "web.yaml.dpkg-new",
            "web.yaml.dpkg-old",
            "web.yaml.rpmnew",
            "web.yaml.rpmsave",
            "..data",
        ] {
            assert!(is_ignored_name(name), "{name}");
        }
        for name in ["web.yaml", "etcd.json", "pod", "tmp.yaml"] {
            assert!(!is_ignored_name(name), "{name}");
        }
    }

    fn seen_of(snapshot: &SourceSnapshot) -> Vec<String> {
        snapshot
            .pods
            .iter()
            .map(|p| {
                p.metadata.annotations.as_ref().expect("annotations")
                    [crate::pod::ANNOTATION_CONFIG_SEEN]
                    .clone()
            })
            .collect()
    }

    #[test]
    fn an_unchanged_file_is_not_parsed_again_and_a_changed_one_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pod = |image: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  containers:\n  - {{name: c, image: {image}}}\n"
            )
        };
        std::fs::write(dir.path().join("web.yaml"), pod("a")).expect("write");
        let mut scanner = Scanner::new(Config {
            path: dir.path().to_path_buf(),
            node_name: "n".into(),
            check_frequency: Duration::from_secs(20),
            api_references: crate::sources::ApiReferences::Local,
        });
        let first = scanner.scan().expect("scan");
        std::thread::sleep(Duration::from_millis(2));
        let again = scanner.scan().expect("scan");
        // Parsing stamps the time it was seen: the same stamp means the file was not re-parsed.
        assert_eq!(seen_of(&first), seen_of(&again));
        assert!(Arc::ptr_eq(&first.pods[0], &again.pods[0]));
        std::fs::write(dir.path().join("web.yaml"), pod("b")).expect("write");
        let changed = scanner.scan().expect("scan");
        assert_ne!(seen_of(&first), seen_of(&changed));
        let spec = changed.pods[0].spec.as_ref().expect("spec");
        assert_eq!(spec.containers[0].image.as_deref(), Some("b"));
        std::fs::remove_file(dir.path().join("web.yaml")).expect("remove");
        assert!(scanner.scan().expect("scan").pods.is_empty());
    }

    #[test]
    fn a_file_removed_after_the_listing_is_gone_not_invalid() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("web.yaml");
        std::fs::write(&file, "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers: [{name: c, image: i}]\n").expect("write");
        let mut scanner = Scanner::new(Config {
            path: dir.path().to_path_buf(),
            node_name: "n".into(),
            check_frequency: Duration::from_secs(20),
            api_references: crate::sources::ApiReferences::Local,
        });
        assert_eq!(scanner.scan().expect("scan").pods.len(), 1);
        std::fs::remove_file(&file).expect("remove");
        assert!(matches!(scanner.read_changed(&file, "t"), Read::Gone));
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_write_is_read_at_once_and_others_settle_first() {
        let changes = Changes::default();
        let started = tokio::time::Instant::now();
        changes.finished.store(true, Ordering::Release);
        changes.settled().await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        // A write that is not known to be finished waits out the settle time...
        changes.settled().await;
        assert_eq!(started.elapsed(), SETTLE);
        // ...unless a change finishing it comes first.
        let started = tokio::time::Instant::now();
        let finisher = async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            changes.finished.store(true, Ordering::Release);
            changes.notify.notify_one();
        };
        tokio::join!(changes.settled(), finisher);
        assert_eq!(started.elapsed(), Duration::from_millis(5));
        assert!(finishes_a_write(&EventKind::Modify(ModifyKind::Name(
            notify::event::RenameMode::To
        ))));
        assert!(!finishes_a_write(&EventKind::Modify(ModifyKind::Data(
            notify::event::DataChange::Any
        ))));
    }
}

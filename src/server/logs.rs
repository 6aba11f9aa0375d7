//! Container logs as `kubectl logs` shows them: the CRI log file of a pod's container (or of its
//! previous instance) decoded from the runtime's `<time> <stream> <P|F> <text>` lines, with
//! partial lines joined, and the upstream options: follow, tailLines, limitBytes, sinceSeconds /
//! sinceTime, timestamps. Shared by the authenticated API and the admin socket.

use std::io::SeekFrom;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
use tokio::sync::mpsc;

use crate::runtime::{RuntimeClient, cri};
use crate::status;
use crate::types::PodUid;

/// Logs followed at once, over every server; one more is refused until one ends.
pub const MAX_FOLLOWERS: usize = 256;
static FOLLOWERS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_FOLLOWERS);
/// How much of a log file is read at a time: a log is streamed, never read whole.
const CHUNK: usize = 64 * 1024;
/// How much of a line's start tells its time, stream and tag.
const PREFIX: usize = 64;

/// How often a followed log is read for new lines.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// How often a follower asks whether the container still runs.
const RUNNING_CHECK: Duration = Duration::from_secs(1);

/// What the reader asked for.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub follow: bool,
    pub tail_lines: Option<u64>,
    pub limit_bytes: Option<u64>,
    pub since: Option<Timestamp>,
    pub timestamps: bool,
    pub previous: bool,
}

/// The options as a reader gives them, before they are checked.
#[derive(Clone, Debug, Default)]
pub struct Query<'a> {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub since_seconds: Option<i64>,
    pub since_time: Option<&'a str>,
    pub tail_lines: Option<i64>,
    pub limit_bytes: Option<i64>,
}

impl Query<'_> {
    /// The options, checked as upstream checks a PodLogOptions (a wrong value is the reader's
    /// error, never a panic). A `sinceSeconds` reaching before the earliest time there is
    /// means the whole log.
    pub fn options(&self) -> Result<Options, String> {
        let invalid = |field: &str, value: i64, rule: &str| {
            format!("{field}: Invalid value: {value}: must be {rule}")
        };
        let since = match (self.since_seconds, self.since_time) {
            (Some(_), Some(_)) => {
                return Err("at most one of `sinceTime` or `sinceSeconds` may be specified".into());
            }
            (Some(s), None) if s < 1 => return Err(invalid("sinceSeconds", s, "greater than 0")),
            (Some(s), None) => crate::types::now()
                .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
                .ok(),
            (None, Some(t)) => Some(
                t.parse::<Timestamp>()
                    .map_err(|_| format!("sinceTime: {t:?} is not an RFC 3339 time"))?,
            ),
            (None, None) => None,
        };
        let tail = match self.tail_lines {
            Some(n) if n < 0 => return Err(invalid("tailLines", n, "greater than or equal to 0")),
            n => n.and_then(|n| u64::try_from(n).ok()),
        };
        let limit = match self.limit_bytes {
            Some(n) if n < 1 => return Err(invalid("limitBytes", n, "greater than 0")),
            n => n.and_then(|n| u64::try_from(n).ok()),
        };
        Ok(Options {
            follow: self.follow,
            tail_lines: tail,
            limit_bytes: limit,
            since,
            timestamps: self.timestamps,
            previous: self.previous,
        })
    }
}

/// Why a log cannot be read; the message names the pod or container.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("pod {namespace}/{name} not found")]
    PodNotFound { namespace: String, name: String },
    #[error("a container name must be specified for pod {pod}, choose one of: {choices:?}")]
    ContainerRequired { pod: String, choices: Vec<String> },
    #[error("container {container:?} in pod {pod} not found")]
    ContainerNotFound { pod: String, container: String },
    #[error("previous terminated container {container:?} in pod {pod} not found")]
    NoPrevious { pod: String, container: String },
    #[error("cannot read the log of container {container:?} in pod {pod}")]
    Runtime {
        pod: String,
        container: String,
        #[source]
        source: crate::runtime::Error,
    },
    #[error("too many logs are followed at once ({MAX_FOLLOWERS}); try again later")]
    TooManyFollowers,
    #[error("cannot open log file {}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether the caller named something that does not exist (HTTP 404) rather than asked
    /// wrongly (400) or hit a failure (500).
    pub fn http_status(&self) -> u16 {
        match self {
            Error::PodNotFound { .. } | Error::ContainerNotFound { .. } => 404,
            Error::ContainerRequired { .. } | Error::NoPrevious { .. } => 400,
            Error::TooManyFollowers => 429,
            Error::Runtime { .. } | Error::Io { .. } => 500,
        }
    }
}

/// A container of a pod the node runs, found by the pod's namespace and name.
pub struct Located {
    pub pod: String,
    pub container: String,
    pub container_id: String,
    pub sandbox_id: String,
}

/// Finds the newest (or, with `previous`, the one before) container of that name in the pod;
/// `container` may be left out when the pod has only one.
pub async fn locate(
    runtime: &RuntimeClient,
    statuses: &status::Reader,
    namespace: &str,
    name: &str,
    container: Option<&str>,
    previous: bool,
) -> Result<Located, Error> {
    let pod = format!("{namespace}/{name}");
    let entry = statuses
        .by_name(namespace, name)
        .ok_or_else(|| Error::PodNotFound {
            namespace: namespace.into(),
            name: name.into(),
        })?;
    let spec = crate::pod::spec(&entry.pod);
    let container = match container.filter(|c| !c.is_empty()) {
        Some(c) => c.to_string(),
        None if spec.containers.len() == 1 => spec.containers[0].name.clone(),
        None => {
            return Err(Error::ContainerRequired {
                pod,
                choices: crate::pod::all_containers(spec)
                    .map(|c| c.name.clone())
                    .collect(),
            });
        }
    };
    if crate::pod::find_container(spec, &container).is_none() {
        return Err(Error::ContainerNotFound { pod, container });
    }
    let rt = runtime
        .pod_runtime(&PodUid::of(&entry.pod))
        .await
        .map_err(|source| Error::Runtime {
            pod: pod.clone(),
            container: container.clone(),
            source,
        })?;
    let mut instances = rt.containers.iter().filter(|c| c.name == container);
    let found = if previous {
        instances.nth(1).ok_or_else(|| Error::NoPrevious {
            pod: pod.clone(),
            container: container.clone(),
        })?
    } else {
        instances.next().ok_or_else(|| Error::ContainerNotFound {
            pod: pod.clone(),
            container: container.clone(),
        })?
    };
    Ok(Located {
        container_id: found.id.clone(),
        sandbox_id: found.sandbox_id.clone(),
        pod,
        container,
    })
}

/// Opens the located container's log and streams it, as chunks of bytes, until its end (or,
/// when following, until the container stops or the receiver is dropped).
pub async fn open(
    runtime: &RuntimeClient,
    found: &Located,
    options: Options,
) -> Result<mpsc::Receiver<Vec<u8>>, Error> {
    let status = runtime
        .container_status(&found.container_id)
        .await
        .map_err(|source| Error::Runtime {
            pod: found.pod.clone(),
            container: found.container.clone(),
            source,
        })?;
    let follow = options.follow && status.state == cri::ContainerState::ContainerRunning as i32;
    let slot = if follow {
        Some(
            FOLLOWERS
                .try_acquire()
                .map_err(|_| Error::TooManyFollowers)?,
        )
    } else {
        None
    };
    let path = PathBuf::from(&status.log_path);
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
    let (tx, rx) = mpsc::channel(16);
    let reader = Reader {
        path,
        file,
        options,
        pending: Vec::new(),
        written: 0,
        tx,
    };
    let runtime = runtime.clone();
    let id = found.container_id.clone();
    tokio::spawn(async move {
        reader.run(follow.then_some((runtime, id))).await;
        drop(slot);
    });
    Ok(rx)
}

/// One decoded CRI log line.
#[derive(Debug, PartialEq, Eq)]
struct Line<'a> {
    time: &'a str,
    partial: bool,
    text: &'a [u8],
}

/// `<RFC 3339 time> <stdout|stderr> <P|F> <text>`; `None` for a line of another shape.
fn parse(line: &[u8]) -> Option<Line<'_>> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let time = std::str::from_utf8(parts.next()?).ok()?;
    let stream = parts.next()?;
    if stream != b"stdout" && stream != b"stderr" {
        return None;
    }
    let tag = parts.next()?;
    let text = parts.next().unwrap_or_default();
    Some(Line {
        time,
        partial: tag.first() == Some(&b'P'),
        text,
    })
}

struct Reader {
    path: PathBuf,
    file: tokio::fs::File,
    options: Options,
    /// Bytes read after the last newline.
    pending: Vec<u8>,
    written: u64,
    tx: mpsc::Sender<Vec<u8>>,
}

/// Where the last `tail` logical lines of the log begin: past the end of the full line before
/// them (a run of partial lines belongs to the full line after it; lines of another shape count
/// for nothing), and how many of them there are (fewer than `tail` when the file holds fewer;
/// then it is read from its start). Streams through the file, keeping only the ends of the last
/// `tail + 1`.
async fn tail_start(file: &mut tokio::fs::File, tail: u64) -> std::io::Result<(u64, u64)> {
    let keep = usize::try_from(tail)
        .unwrap_or(usize::MAX)
        .saturating_add(1);
    let mut ends: std::collections::VecDeque<u64> = std::collections::VecDeque::new();
    let mut prefix: Vec<u8> = Vec::with_capacity(PREFIX);
    let mut offset = 0u64;
    let mut last_newline = 0u64;
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let n = file.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        let mut rest = &chunk[..n];
        let mut at = offset;
        while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
            let wanted = PREFIX.saturating_sub(prefix.len()).min(nl);
            prefix.extend_from_slice(&rest[..wanted]);
            at += nl as u64 + 1;
            last_newline = at;
            if parse(&prefix).is_some_and(|l| !l.partial) {
                ends.push_back(at);
                if ends.len() > keep {
                    ends.pop_front();
                }
            }
            prefix.clear();
            rest = &rest[nl + 1..];
        }
        let wanted = PREFIX.saturating_sub(prefix.len()).min(rest.len());
        prefix.extend_from_slice(&rest[..wanted]);
        offset += n as u64;
    }
    Ok(match tail {
        // Nothing of what is there now.
        0 => (last_newline, 0),
        _ if ends.len() == keep => (ends.front().copied().unwrap_or(0), tail),
        _ => (0, ends.len() as u64),
    })
}

/// The rotated files of the log at `path` (`<name>.<time>`, the compressed ones of an upstream
/// kubelet left out), oldest first.
fn rotated_files(path: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let prefix = format!("{name}.");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|f| f.starts_with(&prefix) && !f.ends_with(".gz") && !f.ends_with(".tmp"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names.into_iter().map(|n| dir.join(n)).collect()
}

impl Reader {
    /// Decodes whole lines into output text; `true` once limitBytes is reached.
    fn decode(&mut self, lines: &[&[u8]]) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        for raw in lines {
            let Some(line) = parse(raw) else { continue };
            if let Some(since) = self.options.since {
                match line.time.parse::<Timestamp>() {
                    Ok(t) if t < since => continue,
                    _ => {}
                }
            }
            if self.options.timestamps {
                out.extend_from_slice(line.time.as_bytes());
                out.push(b' ');
            }
            out.extend_from_slice(line.text);
            if !line.partial {
                out.push(b'\n');
            }
        }
        let Some(limit) = self.options.limit_bytes else {
            self.written += out.len() as u64;
            return (out, false);
        };
        let left = limit.saturating_sub(self.written);
        if out.len() as u64 >= left {
            out.truncate(usize::try_from(left).unwrap_or(usize::MAX));
            self.written = limit;
            return (out, true);
        }
        self.written += out.len() as u64;
        (out, false)
    }

    /// Reads the next chunk of the file; `Some(false)` at its end, `None` on a read error.
    async fn fill(&mut self) -> Option<bool> {
        // Into the pending bytes' spare room: an idle follower at the end allocates nothing.
        self.pending.reserve(CHUNK);
        match self.file.read_buf(&mut self.pending).await {
            Ok(0) => Some(false),
            Ok(_) => Some(true),
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read container log");
                None
            }
        }
    }

    /// Sends the whole lines read so far, keeping an unfinished last line for later; false
    /// when reading should stop (the receiver is gone, or limitBytes was reached).
    async fn flush(&mut self) -> bool {
        let Some(end) = self.pending.iter().rposition(|b| *b == b'\n') else {
            return true;
        };
        let rest = self.pending.split_off(end + 1);
        let data = std::mem::replace(&mut self.pending, rest);
        let lines: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
        let (out, done) = self.decode(&lines);
        (out.is_empty() || self.tx.send(out).await.is_ok()) && !done
    }

    /// Sends what the file holds up to its end as it is now; whether anything new was read,
    /// or `None` when reading should stop.
    async fn drain(&mut self) -> Option<bool> {
        let mut got_any = false;
        while self.fill().await? {
            got_any = true;
            if !self.flush().await {
                return None;
            }
        }
        Some(got_any)
    }

    /// Where reading begins: the rotated files to read first, each from an offset, and the
    /// offset in the current file. Only tailLines and since look back past the current file
    /// (the rotated files they reach); otherwise it alone is read, as upstream reads it.
    async fn plan(&mut self) -> std::io::Result<(Vec<(PathBuf, u64)>, u64)> {
        if let Some(tail) = self.options.tail_lines {
            let (start, found) = tail_start(&mut self.file, tail).await?;
            let mut wanted = tail - found;
            let mut earlier = Vec::new();
            for path in rotated_files(&self.path).into_iter().rev() {
                if wanted == 0 {
                    break;
                }
                // Removed since it was listed: the lines go on from the next one.
                let Ok(mut file) = tokio::fs::File::open(&path).await else {
                    continue;
                };
                let (at, found) = tail_start(&mut file, wanted).await?;
                earlier.push((path, at));
                wanted -= found;
            }
            earlier.reverse();
            return Ok((earlier, start));
        }
        let Some(since) = self.options.since else {
            return Ok((Vec::new(), 0));
        };
        // A file last written before `since` has no line to show.
        let after = |m: std::fs::Metadata| {
            m.modified()
                .ok()
                .and_then(|t| Timestamp::try_from(t).ok())
                .is_some_and(|t| t >= since)
        };
        let earlier = rotated_files(&self.path)
            .into_iter()
            .filter(|p| std::fs::metadata(p).is_ok_and(after))
            .map(|p| (p, 0))
            .collect();
        Ok((earlier, 0))
    }

    /// Streams the log; with `follow` (the runtime and the container), goes on with what is
    /// appended until the container stops or the receiver is dropped.
    async fn run(mut self, follow: Option<(RuntimeClient, String)>) {
        let planned = match self.plan().await {
            Ok(planned) => planned,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot read container log");
                return;
            }
        };
        let (earlier, start) = planned;
        for (path, at) in earlier {
            let Ok(mut file) = tokio::fs::File::open(&path).await else {
                continue;
            };
            if file.seek(SeekFrom::Start(at)).await.is_err() {
                continue;
            }
            let current = std::mem::replace(&mut self.file, file);
            let read = self.drain().await;
            self.file = current;
            // A rotated file ends with a whole line; anything after it is not carried over.
            self.pending.clear();
            if read.is_none() {
                return;
            }
        }
        if let Err(e) = self.file.seek(SeekFrom::Start(start)).await {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot read container log");
            return;
        }
        if self.drain().await.is_none() {
            return;
        }
        let Some((runtime, id)) = follow else { return };
        let mut last_check = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(FOLLOW_POLL) => {}
                _ = self.tx.closed() => return,
            }
            let Some(got_any) = self.drain().await else {
                return;
            };
            if self.rotated().await {
                // The runtime wrote to the old file until it opened the new one: what it wrote
                // there after the last read is read before the next file.
                if self.drain().await.is_none() {
                    return;
                }
                self.pending.clear();
                let next = self.next_file().await;
                match tokio::fs::File::open(&next).await {
                    Ok(file) => {
                        self.file = file;
                        continue;
                    }
                    Err(e) => {
                        tracing::debug!(path = %next.display(), error = %e, "log file gone while following");
                    }
                }
            }
            if !got_any && last_check.elapsed() >= RUNNING_CHECK {
                last_check = tokio::time::Instant::now();
                let running = runtime
                    .container_status(&id)
                    .await
                    .map(|s| s.state == cri::ContainerState::ContainerRunning as i32);
                if !matches!(running, Ok(true)) {
                    // One last read: lines written just before the exit.
                    self.drain().await;
                    return;
                }
            }
        }
    }

    /// The file written after the one open: the rotated file after it (when the log was
    /// rotated more than once since it was last read), else the current log.
    async fn next_file(&self) -> PathBuf {
        let Ok(open) = self.file.metadata().await else {
            return self.path.clone();
        };
        let rotated = rotated_files(&self.path);
        let after = rotated.iter().position(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.ino() == open.ino() && m.dev() == open.dev())
        });
        after
            .and_then(|i| rotated.get(i + 1).cloned())
            .unwrap_or_else(|| self.path.clone())
    }

    /// Whether the path now names another file than the one open (the log was rotated).
    async fn rotated(&mut self) -> bool {
        let (Ok(open), Ok(now)) = (
            self.file.metadata().await,
            tokio::fs::metadata(&self.path).await,
        ) else {
            return false;
        };
        if open.ino() != now.ino() {
            return true;
        }
        // Truncated in place: start over from its beginning.
        let at = self.file.stream_position().await.unwrap_or(0);
        if now.len() < at {
            let _ = self.file.seek(SeekFrom::Start(0)).await;
            self.pending.clear();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_options_are_the_readers_error_and_huge_windows_mean_everything() {
        let check = |q: Query| {
            q.options()
                .map(|o| (o.since.is_some(), o.tail_lines, o.limit_bytes))
        };
        assert_eq!(
            check(Query {
                since_seconds: Some(i64::MAX),
                tail_lines: Some(0),
                limit_bytes: Some(i64::MAX),
                ..Query::default()
            }),
            Ok((false, Some(0), Some(i64::MAX as u64)))
        );
        assert_eq!(
            check(Query {
                since_seconds: Some(60),
                ..Query::default()
            }),
            Ok((true, None, None))
        );
        for (query, field) in [
            (
                Query {
                    since_seconds: Some(0),
                    ..Query::default()
                },
                "sinceSeconds",
            ),
            (
                Query {
                    since_seconds: Some(i64::MIN),
                    ..Query::default()
                },
                "sinceSeconds",
            ),
            (
                Query {
                    tail_lines: Some(-1),
                    ..Query::default()
                },
                "tailLines",
            ),
            (
                Query {
                    limit_bytes: Some(0),
                    ..Query::default()
                },
                "limitBytes",
            ),
            (
                Query {
                    since_time: Some("yesterday"),
                    ..Query::default()
                },
                "sinceTime",
            ),
            (
                Query {
                    since_seconds: Some(1),
                    since_time: Some("2026-01-01T00:00:00Z"),
                    ..Query::default()
                },
                "sinceSeconds",
            ),
        ] {
            let e = query.options().unwrap_err();
            assert!(e.contains(field), "{e}");
        }
    }

    const LOG: &[u8] = b"2026-01-01T00:00:01.000000001Z stdout F one\n\
2026-01-01T00:00:02Z stderr P tw\n\
2026-01-01T00:00:02.5Z stderr F o\n\
not a cri line\n\
2026-01-01T00:00:03Z stdout F three\n";

    /// What a reader with `options` sends for `log`, without following.
    fn read(log: &[u8], options: Options) -> String {
        read_rotated(&[], log, options)
    }

    /// Reads the log `current` whose rotated files (oldest first) hold `rotated`.
    fn read_rotated(rotated: &[&[u8]], current: &[u8], options: Options) -> String {
        let dir = tempfile::tempdir().unwrap();
        for (i, text) in rotated.iter().enumerate() {
            let name = format!("0.log.20260101-00000{i}");
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let path = dir.path().join("0.log");
        std::fs::write(&path, current).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (tx, mut rx) = mpsc::channel(1);
            let reader = Reader {
                file: tokio::fs::File::open(&path).await.unwrap(),
                path,
                options,
                pending: Vec::new(),
                written: 0,
                tx,
            };
            tokio::spawn(reader.run(None));
            let mut out = Vec::new();
            while let Some(chunk) = rx.recv().await {
                out.extend(chunk);
            }
            String::from_utf8(out).unwrap()
        })
    }

    fn show(options: Options) -> String {
        read(LOG, options)
    }

    #[test]
    fn tail_and_since_reach_into_the_rotated_files_and_nothing_else_does() {
        let line = |i: usize| format!("2026-01-01T00:00:0{i}Z stdout F line {i}\n");
        let (a, b, c) = (line(1) + &line(2), line(3) + &line(4), line(5));
        let rotated: [&[u8]; 2] = [a.as_bytes(), b.as_bytes()];
        let tail = |n| Options {
            tail_lines: Some(n),
            ..Default::default()
        };
        let read = |options| read_rotated(&rotated, c.as_bytes(), options);
        assert_eq!(
            read(Options::default()),
            "line 5\n",
            "as upstream: the current file"
        );
        assert_eq!(read(tail(2)), "line 4\nline 5\n");
        assert_eq!(read(tail(4)), "line 2\nline 3\nline 4\nline 5\n");
        assert_eq!(read(tail(9)).lines().count(), 5);
        assert_eq!(read(tail(0)), "");
        let since = Options {
            since: Some("2026-01-01T00:00:02Z".parse().unwrap()),
            ..Default::default()
        };
        assert_eq!(read(since), "line 2\nline 3\nline 4\nline 5\n");
    }

    #[test]
    fn a_large_log_streams_in_chunks_and_its_tail_is_found() {
        let line = |i: usize| format!("2026-01-01T00:00:00Z stdout F line {i:06}\n");
        let log: String = (0..40_000).map(line).collect();
        assert!(log.len() > 20 * CHUNK);
        let all = read(log.as_bytes(), Options::default());
        assert_eq!(all.lines().count(), 40_000);
        let tail = read(
            log.as_bytes(),
            Options {
                tail_lines: Some(3),
                ..Default::default()
            },
        );
        assert_eq!(tail, "line 039997\nline 039998\nline 039999\n");
    }

    #[test]
    fn partial_lines_are_joined_and_other_lines_skipped() {
        assert_eq!(show(Options::default()), "one\ntwo\nthree\n");
    }

    #[test]
    fn tail_counts_logical_lines() {
        let tail = |n| {
            show(Options {
                tail_lines: Some(n),
                ..Default::default()
            })
        };
        assert_eq!(tail(1), "three\n");
        assert_eq!(tail(2), "two\nthree\n");
        assert_eq!(tail(0), "");
        assert_eq!(tail(10), "one\ntwo\nthree\n");
    }

    #[test]
    fn since_timestamps_and_limit_bytes_apply() {
        let since = "2026-01-01T00:00:02.2Z".parse().unwrap();
        assert_eq!(
            show(Options {
                since: Some(since),
                ..Default::default()
            }),
            "o\nthree\n"
        );
        assert_eq!(
            show(Options {
                timestamps: true,
                tail_lines: Some(1),
                ..Default::default()
            }),
            "2026-01-01T00:00:03Z three\n"
        );
        assert_eq!(
            show(Options {
                limit_bytes: Some(6),
                ..Default::default()
            }),
            "one\ntw"
        );
    }

    #[test]
    fn an_unfinished_line_waits_for_its_newline() {
        let log = b"2026-01-01T00:00:01Z stdout F a\n2026-01-01T00:00:02Z stdout F b";
        assert_eq!(read(log, Options::default()), "a\n");
    }
}

//! Container logs as `kubectl logs` shows them: the CRI log file of a pod's container (or of its
//! previous instance) decoded from the runtime's `<time> <stream> <P|F> <text>` lines, with
//! partial lines joined, and the upstream options: follow, tailLines, limitBytes, sinceSeconds /
//! sinceTime, timestamps. Shared by the authenticated API and the admin socket.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;

use crate::runtime::{RuntimeClient, cri};
use crate::status;
use crate::types::PodUid;

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
    #[error("cannot read the log of container {container:?} in pod {pod}: {source}")]
    Runtime {
        pod: String,
        container: String,
        #[source]
        source: crate::runtime::Error,
    },
    #[error("cannot open log file {}: {source}", .path.display())]
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
    if !crate::pod::all_containers(spec).any(|c| c.name == container) {
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
    let path = PathBuf::from(&status.log_path);
    let file = std::fs::File::open(&path).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    let (tx, rx) = mpsc::channel(16);
    let follow = options.follow && status.state == cri::ContainerState::ContainerRunning as i32;
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
    tokio::spawn(reader.run(follow, runtime, id));
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
    file: std::fs::File,
    options: Options,
    /// Bytes read after the last newline.
    pending: Vec<u8>,
    written: u64,
    tx: mpsc::Sender<Vec<u8>>,
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
            out.truncate(left as usize);
            self.written = limit;
            return (out, true);
        }
        self.written += out.len() as u64;
        (out, false)
    }

    /// Reads what the file holds now, past what was read before; `None` on a read error.
    fn read_more(&mut self) -> Option<Vec<u8>> {
        let mut buf = std::mem::take(&mut self.pending);
        if let Err(e) = self.file.read_to_end(&mut buf) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot read container log");
            return None;
        }
        Some(buf)
    }

    /// Splits off the whole lines, keeping an unfinished last line for later.
    fn whole_lines(&mut self, mut buf: Vec<u8>) -> Vec<u8> {
        match buf.iter().rposition(|b| *b == b'\n') {
            Some(end) => {
                self.pending = buf.split_off(end + 1);
                buf
            }
            None => {
                self.pending = buf;
                Vec::new()
            }
        }
    }

    /// The lines to show first: all of them, or the last tailLines logical lines.
    fn first_lines<'a>(&self, data: &'a [u8]) -> Vec<&'a [u8]> {
        let lines: Vec<&[u8]> = data
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        let Some(tail) = self.options.tail_lines else {
            return lines;
        };
        // Count full lines from the end; a run of partials belongs to the full line after it.
        let mut full = 0;
        let mut start = lines.len();
        for (i, raw) in lines.iter().enumerate().rev() {
            // Partials and lines of another shape (skipped when shown) count for nothing.
            let full_line = parse(raw).is_some_and(|l| !l.partial);
            if full_line {
                if full == tail {
                    break;
                }
                full += 1;
            }
            start = i;
        }
        if tail == 0 {
            start = lines.len();
        }
        lines[start..].to_vec()
    }

    /// The output of the whole lines written since the last read: (text, limit reached,
    /// whether anything new was read); `None` on a read error.
    fn next_lines(&mut self) -> Option<(Vec<u8>, bool, bool)> {
        let kept = self.pending.len();
        let buf = self.read_more()?;
        let got_any = buf.len() > kept;
        let data = self.whole_lines(buf);
        let lines: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
        let (out, done) = self.decode(&lines);
        Some((out, done, got_any))
    }

    async fn send(&self, out: Vec<u8>) -> bool {
        out.is_empty() || self.tx.send(out).await.is_ok()
    }

    async fn run(mut self, follow: bool, runtime: RuntimeClient, id: String) {
        let Some(buf) = self.read_more() else { return };
        let data = self.whole_lines(buf);
        let first = self.first_lines(&data);
        let (out, done) = self.decode(&first);
        if !self.send(out).await || done || !follow {
            return;
        }
        let mut last_check = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(FOLLOW_POLL) => {}
                _ = self.tx.closed() => return,
            }
            let Some((out, done, got_any)) = self.next_lines() else {
                return;
            };
            if !self.send(out).await || done {
                return;
            }
            if self.rotated() {
                match std::fs::File::open(&self.path) {
                    Ok(file) => {
                        self.file = file;
                        continue;
                    }
                    Err(e) => {
                        tracing::debug!(path = %self.path.display(), error = %e, "log file gone while following");
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
                    if let Some((out, _, _)) = self.next_lines() {
                        self.send(out).await;
                    }
                    return;
                }
            }
        }
    }

    /// Whether the path now names another file than the one open (the log was rotated).
    fn rotated(&mut self) -> bool {
        let (Ok(open), Ok(now)) = (self.file.metadata(), std::fs::metadata(&self.path)) else {
            return false;
        };
        if open.ino() != now.ino() {
            return true;
        }
        // Truncated in place: start over from its beginning.
        let at = self.file.stream_position().unwrap_or(0);
        if now.len() < at {
            let _ = self.file.seek(SeekFrom::Start(0));
            self.pending.clear();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(options: Options) -> Reader {
        let (tx, _rx) = mpsc::channel(1);
        Reader {
            path: PathBuf::from("/dev/null"),
            file: std::fs::File::open("/dev/null").unwrap(),
            options,
            pending: Vec::new(),
            written: 0,
            tx,
        }
    }

    const LOG: &[u8] = b"2026-01-01T00:00:01.000000001Z stdout F one\n\
2026-01-01T00:00:02Z stderr P tw\n\
2026-01-01T00:00:02.5Z stderr F o\n\
not a cri line\n\
2026-01-01T00:00:03Z stdout F three\n";

    fn show(options: Options) -> String {
        let mut r = reader(options);
        let lines = r.first_lines(LOG);
        String::from_utf8(r.decode(&lines).0).unwrap()
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
        let mut r = reader(Options::default());
        let whole = r.whole_lines(b"a\nb".to_vec());
        assert_eq!(whole, b"a\n");
        assert_eq!(r.pending, b"b");
    }
}

//! A pull's progress, read from the runtime's downloads in progress (containerd lists its
//! ingests; the CRI says nothing until a pull ends). The downloads that began once the pull had
//! begun are counted as its own: overlapping pulls count each other's, so a pull is judged
//! stalled only when nothing it could be waiting for has moved.

use std::collections::HashMap;
use std::time::Duration;

use crate::runtime::Download;

/// How much earlier than the pull a download may begin and still be counted as its own (the
/// pull's start is stamped before its request goes out).
const SLACK_NS: i64 = 1_000_000_000;

#[derive(Debug)]
struct Seen {
    received: i64,
    total: i64,
    listed: bool,
}

/// What a pull has received so far, and when it last moved.
#[derive(Debug)]
pub struct Progress {
    /// When the pull began (Unix ns).
    began: i64,
    seen: HashMap<String, Seen>,
    /// When a download of the pull last began, grew or ended (Unix ns); the pull's start at
    /// first.
    moved: i64,
}

impl Progress {
    pub fn new(began: i64) -> Progress {
        Progress {
            began,
            seen: HashMap::new(),
            moved: began,
        }
    }

    /// Takes in a listing of the downloads in progress made at `now` (Unix ns). A download no
    /// longer listed has ended: its bytes count as received.
    pub fn observe(&mut self, downloads: &[Download], now: i64) {
        let own: HashMap<&str, &Download> = downloads
            .iter()
            .filter(|d| d.started_at >= self.began - SLACK_NS)
            .map(|d| (d.reference.as_str(), d))
            .collect();
        for (reference, seen) in &mut self.seen {
            if seen.listed && !own.contains_key(reference.as_str()) {
                seen.listed = false;
                seen.received = seen.received.max(seen.total);
                self.moved = self.moved.max(now);
            }
        }
        for d in own.values() {
            let when = d.updated_at.max(d.started_at);
            match self.seen.get_mut(&d.reference) {
                Some(seen) => {
                    if d.offset != seen.received || !seen.listed {
                        self.moved = self.moved.max(when);
                    }
                    seen.received = d.offset;
                    seen.total = d.total;
                    seen.listed = true;
                }
                None => {
                    self.moved = self.moved.max(when);
                    self.seen.insert(
                        d.reference.clone(),
                        Seen {
                            received: d.offset,
                            total: d.total,
                            listed: true,
                        },
                    );
                }
            }
        }
    }

    /// How long nothing has moved, at `now` (Unix ns).
    pub fn idle(&self, now: i64) -> Duration {
        Duration::from_nanos(u64::try_from(now - self.moved).unwrap_or(0))
    }

    /// Bytes received and the total of the downloads known so far.
    pub fn bytes(&self) -> (i64, i64) {
        self.seen.values().fold((0, 0), |(r, t), s| {
            (r + s.received, t + s.total.max(s.received))
        })
    }

    /// "2.5 MiB of 4.0 MiB received, the last 3s ago", at `now`.
    pub fn describe(&self, now: i64) -> String {
        let (received, total) = self.bytes();
        let mib = |b: i64| b as f64 / f64::from(1u32 << 20);
        format!(
            "{:.1} MiB of {:.1} MiB received, the last {}s ago",
            mib(received),
            mib(total),
            self.idle(now).as_secs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn download(reference: &str, offset: i64, total: i64, started: i64, updated: i64) -> Download {
        Download {
            reference: reference.into(),
            offset,
            total,
            started_at: started * S,
            updated_at: updated * S,
        }
    }

    #[test]
    fn a_pull_counts_its_downloads_and_stalls_when_none_moves() {
        let mut p = Progress::new(100 * S);
        // Another pull's download, begun long before, is not this pull's.
        let old = download("layer-sha256:old", 50, 100, 10, 104);
        p.observe(std::slice::from_ref(&old), 105 * S);
        assert_eq!(p.bytes(), (0, 0));
        assert_eq!(p.idle(105 * S), Duration::from_secs(5));

        let layer = download("layer-sha256:a", 10, 40, 106, 107);
        p.observe(&[old, layer], 108 * S);
        assert_eq!(p.bytes(), (10, 40));
        assert_eq!(p.idle(108 * S), Duration::from_secs(1));

        // The same bytes later: idle since the last growth.
        p.observe(&[download("layer-sha256:a", 10, 40, 106, 107)], 120 * S);
        assert_eq!(p.idle(120 * S), Duration::from_secs(13));
        assert_eq!(
            p.describe(120 * S),
            "0.0 MiB of 0.0 MiB received, the last 13s ago"
        );

        // Growth, then the download ends: all its bytes count, and the end is progress.
        p.observe(&[download("layer-sha256:a", 30, 40, 106, 121)], 121 * S);
        p.observe(&[], 125 * S);
        assert_eq!(p.bytes(), (40, 40));
        assert_eq!(p.idle(125 * S), Duration::ZERO);
        p.observe(&[], 130 * S);
        assert_eq!(p.idle(130 * S), Duration::from_secs(5));
    }
}

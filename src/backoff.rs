//! Per-key exponential backoff as upstream's: 10 s doubling to 300 s, an entry forgotten once it
//! has not been bumped for twice the cap (10 min). Container restarts (CrashLoopBackOff, keyed by
//! pod, container and spec hash) and image pulls (ImagePullBackOff, keyed by pod and image) use it.
//! The token bucket that paces image pulls and API requests lives here too.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

/// The longest a token bucket asks anyone to wait, whatever its rate says.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// A token bucket: `burst` tokens at most, refilled at `qps` per second.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(qps: f64, burst: u32, now: Instant) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps,
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Takes a token at `now`, or says how long until one is there (at most a minute).
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else if self.qps <= 0.0 {
            Err(Duration::from_secs(1))
        } else {
            let wait = (1.0 - self.tokens) / self.qps;
            Err(Duration::try_from_secs_f64(wait).map_or(MAX_WAIT, |d| d.min(MAX_WAIT)))
        }
    }
}

/// Delays per key; a key starts with the pod UID it belongs to.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
    /// When this process began keeping the delays: only what started earlier is resumed.
    created: SystemTime,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    delay: Duration,
    last_update: SystemTime,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            entries: HashMap::new(),
            created: SystemTime::now(),
        }
    }

    fn expired(&self, at: SystemTime, entry: &Entry) -> bool {
        at.duration_since(entry.last_update).unwrap_or_default() > self.max * 2
    }

    /// How much longer a container that finished at `finished` must wait before its restart,
    /// or `None` when it may restart now.
    pub fn remaining(&self, key: &str, finished: SystemTime, now: SystemTime) -> Option<Duration> {
        let entry = self.entries.get(key)?;
        if self.expired(now, entry) {
            return None;
        }
        let waited = now.duration_since(finished).unwrap_or_default();
        entry.delay.checked_sub(waited).filter(|d| !d.is_zero())
    }

    /// How much longer `key` must wait, counted from its last bump, or `None` when it may go.
    pub fn remaining_since_last(&self, key: &str, now: SystemTime) -> Option<Duration> {
        let last = self.entries.get(key)?.last_update;
        self.remaining(key, last, now)
    }

    /// Records a restart of a container that finished at `finished`: the next delay doubles.
    pub fn next(&mut self, key: &str, finished: SystemTime) {
        let delay = match self.entries.get(key) {
            Some(e) if !self.expired(finished, e) => (e.delay * 2).min(self.max),
            _ => self.initial,
        };
        self.entries.insert(
            key.to_string(),
            Entry {
                delay,
                last_update: finished,
            },
        );
    }

    /// Takes up a backoff this process has not seen being built: a container already restarted
    /// `restarts` times (its restart count, from the runtime, e.g. after nodelet restarted) that
    /// ran from `started` to `finished` waits as long as it would have, counted from `finished`.
    /// One that ran cleanly long enough to be forgiven starts over; known keys are left alone,
    /// and so is a container started since this backoff was made: this process saw its
    /// backoff being built, and a new key then means a new spec, which starts from the beginning.
    pub fn resume(&mut self, key: &str, restarts: u32, started: SystemTime, finished: SystemTime) {
        let ran = finished.duration_since(started).unwrap_or_default();
        if restarts == 0
            || self.entries.contains_key(key)
            || ran > self.max * 2
            || started >= self.created
        {
            return;
        }
        let delay = self
            .initial
            .saturating_mul(1u32 << (restarts - 1).min(20))
            .min(self.max);
        self.entries.insert(
            key.to_string(),
            Entry {
                delay,
                last_update: finished,
            },
        );
    }

    /// Forgets one key (its last try succeeded).
    pub fn forget_key(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Forgets every entry of a pod (its keys start with its UID).
    pub fn forget_pod(&mut self, uid: &str) {
        self.entries.retain(|k, _| !k.starts_with(uid));
    }
}

/// A number in [0, 1), different each call: jitter for retry delays (not for anything that
/// needs real randomness).
pub fn random_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Instant::now().elapsed().as_nanos() as u64);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_a_burst_then_paces_at_qps() {
        let now = Instant::now();
        let mut b = TokenBucket::new(2.0, 3, now);
        for _ in 0..3 {
            assert_eq!(b.take(now), Ok(()));
        }
        assert_eq!(b.take(now), Err(Duration::from_millis(500)));
        assert_eq!(b.take(now + Duration::from_millis(500)), Ok(()));
        assert!(b.take(now + Duration::from_millis(600)).is_err());
        // A long pause refills no more than the burst.
        let later = now + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(b.take(later), Ok(()));
        }
        assert!(b.take(later).is_err());
        let mut stopped = TokenBucket::new(0.0, 1, now);
        assert_eq!(stopped.take(now), Ok(()));
        assert_eq!(stopped.take(later), Err(Duration::from_secs(1)));
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn delays_double_to_the_cap_and_reset_after_ten_quiet_minutes() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        assert_eq!(
            b.remaining("k", at(100), at(100)),
            None,
            "the first restart is immediate"
        );
        b.next("k", at(100));
        let mut finished = 100;
        let mut expected = 10;
        for _ in 0..8 {
            finished += 1;
            assert_eq!(
                b.remaining("k", at(finished), at(finished)),
                Some(Duration::from_secs(expected))
            );
            assert_eq!(
                b.remaining("k", at(finished), at(finished + expected)),
                None
            );
            b.next("k", at(finished));
            expected = (expected * 2).min(300);
        }
        assert_eq!(
            b.remaining("k", at(finished + 1), at(finished + 1)),
            Some(Duration::from_secs(300))
        );
        assert_eq!(
            b.remaining("k", at(finished + 700), at(finished + 700)),
            None,
            "expired after 2 x cap"
        );
        b.next("k", at(finished + 700));
        assert_eq!(
            b.remaining("k", at(finished + 701), at(finished + 701)),
            Some(Duration::from_secs(10))
        );
        b.forget_pod("k");
        assert_eq!(
            b.remaining("k", at(finished + 702), at(finished + 702)),
            None
        );
    }

    #[test]
    fn a_resumed_backoff_continues_the_doubling() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        b.resume("k", 4, at(99), at(100));
        assert_eq!(
            b.remaining("k", at(100), at(100)),
            Some(Duration::from_secs(80))
        );
        b.resume("k", 1, at(99), at(100));
        assert_eq!(
            b.remaining("k", at(100), at(100)),
            Some(Duration::from_secs(80)),
            "a known key is kept"
        );
        b.resume("first", 0, at(99), at(100));
        b.resume("calm", 3, at(0), at(700));
        assert_eq!(
            b.remaining("calm", at(700), at(700)),
            None,
            "ran 11 minutes: forgiven"
        );
        assert_eq!(b.remaining("first", at(100), at(100)), None);
        b.resume("many", 40, at(99), at(100));
        assert_eq!(
            b.remaining("many", at(100), at(100)),
            Some(Duration::from_secs(300))
        );
        let now = SystemTime::now() + Duration::from_secs(1);
        b.resume("new-spec", 7, now, now + Duration::from_secs(5));
        assert_eq!(
            b.remaining("new-spec", now, now),
            None,
            "a container this process started (a changed spec) starts a new backoff"
        );
    }
}

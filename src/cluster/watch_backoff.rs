//! How the node's watches of the API server retry: 800 ms doubling to 8 s, each delay stretched
//! by up to half again at random so that nodes spread out, and back to the start after any
//! event. kube-runtime's default (client-go's reflector: up to 30 s, doubled at random) let a
//! node take a minute or more after an API server restart to see its pods again: every failed
//! try of the outage lengthened the wait, and the first answer after it (410 Gone, for a
//! resource version the outage let expire) is one more failure.

use std::time::Duration;

const FIRST: Duration = Duration::from_millis(800);
const LONGEST: Duration = Duration::from_secs(8);

/// The retry delays of one watch.
pub struct WatchBackoff {
    next: Duration,
}

/// A fresh backoff for a watch (`.backoff(watch_backoff())`).
pub fn watch_backoff() -> WatchBackoff {
    WatchBackoff { next: FIRST }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (delay * 2).min(LONGEST);
        Some(delay.mul_f64(1.0 + crate::backoff::random_unit() / 2.0))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff as _;

    #[test]
    fn delays_double_to_eight_seconds_with_jitter_and_start_over_after_a_reset() {
        let mut b = watch_backoff();
        let delays: Vec<Duration> = b.by_ref().take(6).collect();
        let bases = [0.8, 1.6, 3.2, 6.4, 8.0, 8.0];
        for (d, base) in delays.iter().zip(bases) {
            let d = d.as_secs_f64();
            assert!(d >= base && d <= base * 1.5, "{d} for {base}");
        }
        b.reset();
        assert!(b.next().is_some_and(|d| d < Duration::from_millis(1300)));
    }
}

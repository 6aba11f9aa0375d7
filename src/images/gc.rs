//! Image garbage collection, as upstream's: when the image filesystem is fuller than the high
//! threshold, images no container uses and older than the minimum age are removed, least
//! recently used first, until usage is down to the low threshold. The sandbox image and images
//! the runtime pins are never removed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::PullRecords;
use crate::runtime::{self, RuntimeClient};

/// The thresholds (imageGCHighThresholdPercent, imageGCLowThresholdPercent, imageMinimumGCAge).
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub high_percent: u8,
    pub low_percent: u8,
    pub min_age: Duration,
}

/// What GC knows of one image.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub id: String,
    pub size: u64,
    /// When this process first saw the image, and when it last saw a container use it.
    pub first_seen: SystemTime,
    pub last_used: SystemTime,
    /// Used by a container, pinned by the runtime, or the sandbox image.
    pub keep: bool,
}

/// The images to remove to free `to_free` bytes: old enough, not kept, least recently used
/// first (then oldest seen).
pub fn choose(
    images: &[Candidate],
    to_free: u64,
    now: SystemTime,
    min_age: Duration,
) -> Vec<String> {
    let mut old: Vec<&Candidate> = images
        .iter()
        .filter(|c| !c.keep)
        .filter(|c| now.duration_since(c.first_seen).unwrap_or_default() >= min_age)
        .collect();
    old.sort_by_key(|c| (c.last_used, c.first_seen));
    let mut freed = 0u64;
    let mut out = Vec::new();
    for c in old {
        if freed >= to_free {
            break;
        }
        freed += c.size;
        out.push(c.id.clone());
    }
    out
}

/// The image collector; it remembers when it saw each image and its last use.
pub struct ImageGc {
    runtime: RuntimeClient,
    policy: Policy,
    seen: HashMap<String, (SystemTime, SystemTime)>,
    /// The pull records to prune of the images GC removed.
    records: Option<Arc<PullRecords>>,
}

/// How full the filesystem holding `path` is, in percent, and its size in bytes.
fn usage(path: &str) -> Option<(f64, u64)> {
    let fs = crate::host::fs_stats(path).filter(|fs| fs.capacity > 0)?;
    Some((
        100.0 - fs.available as f64 * 100.0 / fs.capacity as f64,
        fs.capacity,
    ))
}

impl ImageGc {
    pub fn new(
        runtime: RuntimeClient,
        policy: Policy,
        records: Option<Arc<PullRecords>>,
    ) -> ImageGc {
        ImageGc {
            runtime,
            policy,
            seen: HashMap::new(),
            records,
        }
    }

    /// One pass: notes which images are in use and, above the high threshold, removes images.
    /// Returns the bytes freed.
    pub async fn collect(&mut self) -> runtime::Result<u64> {
        let now = SystemTime::now();
        let images = self.runtime.list_images().await?;
        // Containers name their image by ID, digest or tag, depending on the runtime.
        let in_use: HashSet<String> = self
            .runtime
            .list_containers(None)
            .await?
            .into_iter()
            .flat_map(|c| [c.image_ref, c.image])
            .collect();
        let configured = self.runtime.runtime_config().await?;
        let sandbox = match configured
            .as_ref()
            .and_then(runtime::configured_sandbox_image)
        {
            Some(name) => self.runtime.image_status(&name).await?.map(|i| i.id),
            None => None,
        };
        self.seen.retain(|id, _| images.iter().any(|i| &i.id == id));
        let mut candidates = Vec::new();
        for image in &images {
            let used = std::iter::once(&image.id)
                .chain(&image.repo_tags)
                .chain(&image.repo_digests)
                .any(|name| in_use.contains(name));
            let entry = self.seen.entry(image.id.clone()).or_insert((now, now));
            if used {
                entry.1 = now;
            }
            candidates.push(Candidate {
                id: image.id.clone(),
                size: image.size,
                first_seen: entry.0,
                last_used: entry.1,
                keep: used || image.pinned || sandbox.as_deref() == Some(image.id.as_str()),
            });
        }
        if self.policy.high_percent >= 100 {
            return Ok(0);
        }
        let Some((mount, _)) = self.runtime.image_fs().await? else {
            return Ok(0);
        };
        let Some((percent, capacity)) = usage(&mount) else {
            return Ok(0);
        };
        if percent < f64::from(self.policy.high_percent) {
            return Ok(0);
        }
        let to_free =
            ((percent - f64::from(self.policy.low_percent)) / 100.0 * capacity as f64) as u64;
        tracing::info!(
            usage_percent = format!("{percent:.1}"),
            high = self.policy.high_percent,
            to_free,
            "image filesystem above the GC threshold; removing unused images"
        );
        let chosen = choose(&candidates, to_free, now, self.policy.min_age);
        tracing::debug!(?candidates, ?chosen, "image GC candidates");
        let mut freed = 0;
        let mut remaining: HashSet<String> = images.iter().map(|i| i.id.clone()).collect();
        for id in chosen {
            let size = candidates.iter().find(|c| c.id == id).map_or(0, |c| c.size);
            match self.runtime.remove_image(&id).await {
                Ok(()) => {
                    tracing::info!(image = %id, bytes = size, "removed unused image");
                    self.seen.remove(&id);
                    remaining.remove(&id);
                    freed += size;
                }
                Err(e) => {
                    tracing::warn!(image = %id, error = %crate::types::error_chain(&e), "cannot remove image")
                }
            }
        }
        if let Some(records) = &self.records {
            records.prune(&remaining, now);
        }
        Ok(freed)
    }
}

/// Collects every `period` until `cancel`.
pub async fn run(mut gc: ImageGc, period: Duration, cancel: tokio_util::sync::CancellationToken) {
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        if let Err(e) = gc.collect().await {
            tracing::warn!(error = %crate::types::error_chain(&e), "image garbage collection failed; trying again next period");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn image(id: &str, size: u64, seen: u64, used: u64, keep: bool) -> Candidate {
        Candidate {
            id: id.into(),
            size,
            first_seen: at(seen),
            last_used: at(used),
            keep,
        }
    }

    #[test]
    fn least_recently_used_old_unkept_images_go_first_until_enough_is_freed() {
        let images = [
            image("recent", 100, 0, 90, false),
            image("stale", 100, 0, 10, false),
            image("used", 100, 0, 0, true),
            image("young", 100, 95, 95, false),
            image("older", 100, 0, 50, false),
        ];
        let min_age = Duration::from_secs(60);
        assert_eq!(choose(&images, 150, at(100), min_age), ["stale", "older"]);
        assert_eq!(
            choose(&images, 10_000, at(100), min_age),
            ["stale", "older", "recent"],
            "kept and young images stay whatever is asked"
        );
        assert!(choose(&images, 0, at(100), min_age).is_empty());
    }
}

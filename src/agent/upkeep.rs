//! The agent's periodic upkeep: image garbage collection, container log rotation, OOM kill
//! events, and memory handed back to the system.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Core, test_period};
use crate::config::Config;

/// Starts the upkeep tasks on the core's tracker.
pub(super) fn spawn(config: &Config, core: &Core, cancel: &CancellationToken) {
    let gc = crate::images::gc::ImageGc::new(
        core.runtime.clone(),
        crate::images::gc::Policy {
            high_percent: config.image_gc_high_threshold_percent,
            low_percent: config.image_gc_low_threshold_percent,
            min_age: config.image_minimum_gc_age,
        },
        core.pull_records.clone(),
    );
    core.tracker.spawn(crate::images::gc::run(
        gc,
        test_period(
            "testing-image-gc-period",
            config.testing_image_gc_period,
            Duration::from_secs(300),
        ),
        cancel.clone(),
    ));
    match config.container_log_max_size {
        Some(max_size) => {
            let rotation = crate::log_rotation::Config {
                policy: crate::log_rotation::Policy {
                    max_size,
                    max_files: config.container_log_max_files as usize,
                },
                interval: test_period(
                    "testing-log-rotation-period",
                    config.testing_log_rotation_period,
                    config.container_log_monitor_interval,
                ),
                node_name: config.node_name.clone(),
            };
            core.tracker.spawn(crate::log_rotation::run(
                core.runtime.clone(),
                rotation,
                cancel.clone(),
            ));
        }
        None => tracing::info!("container log rotation is off (--container-log-max-size < 0)"),
    }

    core.tracker.spawn(crate::oom::run(
        core.recorder.clone(),
        config.node_name.clone(),
        cancel.clone(),
    ));

    #[cfg(target_env = "gnu")]
    core.tracker.spawn(return_freed_memory(cancel.clone()));
}

/// How often memory that the allocator holds free is handed back to the system: soon after a
/// burst of pods went (a trim takes well under a millisecond at this heap size).
#[cfg(target_env = "gnu")]
const TRIM_PERIOD: Duration = Duration::from_secs(5);

/// glibc's malloc keeps the memory freed inside its per-thread arenas, so after a burst of pods
/// came and went the agent stayed at its peak. `malloc_trim` hands the free pages of every
/// arena back, cheaply at this heap size.
#[cfg(target_env = "gnu")]
async fn return_freed_memory(cancel: CancellationToken) {
    let mut ticker = tokio::time::interval(TRIM_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        // SAFETY: malloc_trim only releases free memory; it has no preconditions.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

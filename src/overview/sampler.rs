//! The per-instance overview sampler: a background task, started with the
//! server, that reads the processed/failed counter sums once a second into
//! a [`ThroughputRing`] and runs the split-brain check every
//! [`SPLIT_BRAIN_EVERY`]. Browsers read both from memory, so however many
//! dashboards are open, the database sees one 32-row sum a second and one
//! bounded check every few seconds per instance.
//!
//! Overlaps found stay reported for the check's whole window, even after
//! the bounded check no longer reaches back to them.

use super::{Throughput, ThroughputRing};
use leasekeeper_core::counts::finished_totals;
use leasekeeper_core::lease::history::split_brain::SplitBrain;
use leasekeeper_core::lease::history::split_brain::{self, MAX_EVENTS, WINDOW};
use sqlx::PgPool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the counters are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How often the split-brain check runs.
pub const SPLIT_BRAIN_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, Default)]
struct Memory {
    ring: ThroughputRing,
    split_brain: Option<SplitBrain>,
}

/// A handle on the sampler's memory; cheap to clone. A default sampler
/// samples nothing (for tests that build the server state by hand): its
/// throughput is empty and it has no split-brain result.
#[derive(Clone, Debug, Default)]
pub struct Sampler {
    memory: Arc<Mutex<Memory>>,
    stop: CancellationToken,
}

impl Sampler {
    /// Starts sampling `pool` until [`Sampler::stop`].
    pub fn spawn(pool: PgPool) -> Self {
        let sampler = Sampler::default();
        let this = sampler.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let checks_every = (SPLIT_BRAIN_EVERY.as_secs() / SAMPLE_EVERY.as_secs()).max(1);
            let mut n: u64 = 0;
            loop {
                tokio::select! {
                    _ = this.stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                if let Err(e) = this.sample(&pool, n.is_multiple_of(checks_every)).await {
                    tracing::warn!(error = %e, "overview sampler: cannot read the counters");
                }
                n += 1;
            }
        });
        sampler
    }

    async fn sample(&self, pool: &PgPool, check: bool) -> sqlx::Result<()> {
        let schema = leasekeeper_core::db::Schema::of(pool);
        let mut conn = pool.acquire().await?;
        let (at_ms, processed, failed) = finished_totals(&mut conn, &schema).await?;
        self.memory().ring.record(at_ms, processed, failed);
        if check {
            let found = split_brain::check(&mut conn, &schema, WINDOW, MAX_EVENTS).await?;
            let mut memory = self.memory();
            let merged = merge(memory.split_brain.take(), found);
            memory.split_brain = Some(merged);
        }
        Ok(())
    }

    fn memory(&self) -> MutexGuard<'_, Memory> {
        // A panic while holding the lock leaves plain numbers behind: usable.
        self.memory
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The throughput chart ending at `now_ms` (database clock).
    pub fn throughput(&self, now_ms: i64) -> Throughput {
        self.memory().ring.snapshot(now_ms)
    }

    /// The latest split-brain result, `None` before the first check.
    pub fn split_brain(&self) -> Option<SplitBrain> {
        self.memory().split_brain.clone()
    }

    /// Stops the background task.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

/// The new check's result, plus earlier overlaps still within the window.
fn merge(previous: Option<SplitBrain>, mut found: SplitBrain) -> SplitBrain {
    let Some(previous) = previous else {
        return found;
    };
    let horizon = found
        .checked_at
        .map(|at| at - chrono::Duration::seconds(found.window_secs));
    for old in previous.overlaps {
        let recent = horizon.is_none_or(|h| old.at > h);
        let again = found.overlaps.iter().any(|o| {
            (&o.resource, o.fencing_token, o.other_token, &o.source)
                == (
                    &old.resource,
                    old.fencing_token,
                    old.other_token,
                    &old.source,
                )
        });
        if recent && !again {
            found.overlaps.push(old);
        }
    }
    found
}

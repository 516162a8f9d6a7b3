//! The overview: what the whole system is doing, at a glance and cheaply.
//!
//! - **Counts** by task status come from `task_counts`, a sharded counter
//!   table kept by triggers on `tasks` (migration `…000006_task_counts`):
//!   summing 16 rows instead of counting a million. "late" is a
//!   capped count over the small partial index of started tasks.
//! - **Throughput** (completed and failed per [`BUCKET_SECS`] over the last
//!   [`THROUGHPUT_SECS`]) is sampled in memory by each instance
//!   ([`sampler`]): once a second it reads the two counter sums and adds the
//!   difference to the current bucket. No query ever scans `tasks` or
//!   `lease_events` for it, however fast tasks complete; the price is that
//!   an instance's chart starts empty when it starts. Buckets are aligned to
//!   the database clock, so every instance draws the same bars.
//! - **Split brain** ([`split_brain`]): two live holders of one resource,
//!   found in a bounded recent window of `lease_events` and by comparing
//!   each started task with its lease.
//!
//! This module holds the types the server and the browser share, and the
//! pure throughput ring; the SQL and the sampler are server-only.

#[cfg(feature = "ssr")]
pub mod sampler;
#[cfg(feature = "ssr")]
pub mod store;

use leasekeeper_core::counts::Counts;
use leasekeeper_core::instance::Instance;
use leasekeeper_core::lease::history::split_brain::SplitBrain;
use leasekeeper_core::worker::WorkerInfo;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Width of one throughput bar, in seconds.
pub const BUCKET_SECS: i64 = 10;
/// How far back the throughput chart reaches, in seconds.
pub const THROUGHPUT_SECS: i64 = 300;
/// Completions and failures in one time bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct Bucket {
    /// Start of the bucket, milliseconds since the epoch (database clock).
    pub start_ms: i64,
    /// Tasks completed in it.
    pub completed: i64,
    /// Tasks marked failed in it.
    pub failed: i64,
}

/// Throughput buckets, oldest first, plus how long this instance has been
/// sampling (a younger instance has empty bars before it started).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct Throughput {
    /// Width of each bucket, in seconds.
    pub bucket_secs: i64,
    /// Exactly `THROUGHPUT_SECS / BUCKET_SECS` buckets ending now, oldest first.
    pub buckets: Vec<Bucket>,
    /// Whether this instance has taken two samples yet (before that, no bar
    /// can show anything).
    pub sampling: bool,
}

/// Everything the overview page and `GET /api/overview` show.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct Overview {
    /// Counts by state.
    pub counts: Counts,
    /// Instances alive now.
    pub instances_alive: i64,
    /// Workers alive now.
    pub workers_alive: i64,
    /// Alive workers holding a task.
    pub workers_busy: i64,
    /// Every instance, newest first.
    pub instances: Vec<Instance>,
    /// Alive workers, newest first.
    pub workers: Vec<WorkerInfo>,
    /// Completions and failures over the last five minutes.
    pub throughput: Throughput,
    /// The split-brain check.
    pub split_brain: SplitBrain,
    /// The instance that answered.
    pub answered_by: String,
}

/// The throughput sampler's memory: the last counter totals seen and the
/// buckets they were added to. Pure, so it is tested without a database.
#[derive(Clone, Debug, Default)]
pub struct ThroughputRing {
    last: Option<(i64, i64)>,
    buckets: VecDeque<Bucket>,
    samples: u64,
}

fn bucket_start(at_ms: i64) -> i64 {
    let width = BUCKET_SECS * 1000;
    at_ms.div_euclid(width) * width
}

impl ThroughputRing {
    /// Records the totals of processed and failed tasks read at `at_ms`
    /// (database clock): what grew since the last sample goes to the bucket
    /// of `at_ms`. A total that shrank (tasks deleted) adds nothing.
    pub fn record(&mut self, at_ms: i64, processed: i64, failed: i64) {
        self.samples += 1;
        let Some((last_processed, last_failed)) = self.last.replace((processed, failed)) else {
            return;
        };
        let start = bucket_start(at_ms);
        if self.buckets.back().is_none_or(|b| b.start_ms < start) {
            self.buckets.push_back(Bucket {
                start_ms: start,
                ..Bucket::default()
            });
        }
        if let Some(bucket) = self.buckets.iter_mut().rev().find(|b| b.start_ms == start) {
            bucket.completed += (processed - last_processed).max(0);
            bucket.failed += (failed - last_failed).max(0);
        }
        let oldest = start - THROUGHPUT_SECS * 1000;
        while self.buckets.front().is_some_and(|b| b.start_ms <= oldest) {
            self.buckets.pop_front();
        }
    }

    /// The chart at `now_ms`: every bucket of the last [`THROUGHPUT_SECS`],
    /// oldest first, empty where nothing was recorded.
    pub fn snapshot(&self, now_ms: i64) -> Throughput {
        let width = BUCKET_SECS * 1000;
        let n = THROUGHPUT_SECS / BUCKET_SECS;
        let last = bucket_start(now_ms);
        let buckets = (0..n)
            .map(|i| {
                let start_ms = last - (n - 1 - i) * width;
                self.buckets
                    .iter()
                    .find(|b| b.start_ms == start_ms)
                    .copied()
                    .unwrap_or(Bucket {
                        start_ms,
                        ..Bucket::default()
                    })
            })
            .collect();
        Throughput {
            bucket_secs: BUCKET_SECS,
            buckets,
            sampling: self.samples >= 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_700_000_000_000;

    #[test]
    fn differences_land_in_the_bucket_of_the_sample() {
        let mut ring = ThroughputRing::default();
        ring.record(T0, 100, 5);
        ring.record(T0 + 1_000, 130, 5);
        ring.record(T0 + 2_000, 150, 7);
        ring.record(T0 + 10_000, 160, 7);
        let chart = ring.snapshot(T0 + 10_000);
        assert_eq!(
            chart.buckets.len(),
            (THROUGHPUT_SECS / BUCKET_SECS) as usize
        );
        let nonzero: Vec<_> = chart
            .buckets
            .iter()
            .filter(|b| b.completed + b.failed > 0)
            .collect();
        assert_eq!(nonzero.len(), 2);
        assert_eq!((nonzero[0].completed, nonzero[0].failed), (50, 2));
        assert_eq!((nonzero[1].completed, nonzero[1].failed), (10, 0));
        assert_eq!(nonzero[1].start_ms, bucket_start(T0 + 10_000));
        assert_eq!(
            chart.buckets.last().unwrap().start_ms,
            bucket_start(T0 + 10_000)
        );
        assert!(chart.sampling);
    }

    #[test]
    fn the_first_sample_counts_nothing_and_shrinking_totals_add_nothing() {
        let mut ring = ThroughputRing::default();
        ring.record(T0, 1_000_000, 10);
        assert!(!ring.snapshot(T0).sampling);
        ring.record(T0 + 1_000, 10, 3);
        let chart = ring.snapshot(T0 + 1_000);
        assert!(
            chart
                .buckets
                .iter()
                .all(|b| b.completed == 0 && b.failed == 0)
        );
        ring.record(T0 + 2_000, 12, 3);
        let total: i64 = ring
            .snapshot(T0 + 2_000)
            .buckets
            .iter()
            .map(|b| b.completed)
            .sum();
        assert_eq!(total, 2);
    }

    #[test]
    fn old_buckets_fall_off_the_chart() {
        let mut ring = ThroughputRing::default();
        ring.record(T0, 0, 0);
        ring.record(T0 + 1_000, 7, 0);
        let later = T0 + (THROUGHPUT_SECS + BUCKET_SECS) * 1000;
        ring.record(later, 9, 0);
        let chart = ring.snapshot(later);
        let total: i64 = chart.buckets.iter().map(|b| b.completed).sum();
        assert_eq!(total, 2, "the 7 from over five minutes ago is gone");
        assert!(ring.buckets.len() <= (THROUGHPUT_SECS / BUCKET_SECS) as usize);
    }
}

//! The round's queue limits (issue 39): the queue the round's workers
//! serve is limited before any process starts, bursts of keyed tasks join
//! the load, and after the round its claims are read back from `attempts`
//! and handed to [`super::check::limits`].
//!
//! The limited queue is the default one: it is the only queue the round's
//! workers serve (`leasekeeper worker` and the instances' simulated
//! workers claim from [`DEFAULT_QUEUE`], and neither takes another), and
//! the point is that the same fleet, under the same faults (kills, pauses,
//! cut sessions, PostgreSQL crashes and failovers, a claim frozen before
//! its commit, which now holds the queue's turn), claims it. So every task
//! of the round is claimed the limited way, the harness's, the
//! generator's and the schedule's alike; the round's checks of exactly
//! once cover them all.

use super::check::limits::{AttemptRow, LimitChecks, check_limits};
use anyhow::Result;
use chrono::{DateTime, Utc};
use leasekeeper_core::db::Schema;
use leasekeeper_core::queue::queue_limits::QueueLimits;
use leasekeeper_core::queue::{DEFAULT_QUEUE, NewTask, queues};
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::json;
use sqlx::PgPool;

/// The limited queue.
pub(super) const QUEUE: &str = DEFAULT_QUEUE;

/// The limits, chosen to bind under the round's own load. The fleet claims
/// into twelve slots (six worker processes holding a task each, two
/// instances' workers holding one running and two prefetched) and the
/// round keeps them busy (a task every 150 ms of 0.05-3 s, the
/// generator's one every 0.5 s of 1 s, the schedule's every second): an
/// unlimited round has 10-13 started at most claims, and a killed or
/// paused worker's task holds a slot until it is taken over.
/// - `max_started` 11: one below the fleet's slots, so it binds at most
///   claims (a claimer finds the queue full and waits for a slot), and
///   costs a prefetched claim rather than a running one at worst.
/// - `max_started_per_key` 2: each burst (below) gives a key four tasks
///   at once, and a limited queue serves the key with the fewest started
///   first, ahead of the busy keyless bulk: two start at once, the other
///   two wait for them.
/// - 15 claims a second with a burst of 5: the unlimited round claims
///   about 10 a second, but up to 20 in a second and 8 in 200 ms when the
///   fleet claims together (after a PostgreSQL restart, a prefetch, a
///   burst of short tasks): the bucket cuts those peaks and leaves the
///   average half again as much room.
pub(super) const LIMITS: QueueLimits = QueueLimits {
    max_started: Some(11),
    max_started_per_key: Some(2),
    rate_per_second: Some(15.0),
    rate_burst: Some(5),
};

/// Every this many of the harness's 150 ms enqueues, a burst of keyed tasks.
pub(super) const BURST_EVERY: u64 = 40;
/// Keys in a burst, tasks per key, out of this many keys in turn.
const BURST_KEYS: usize = 3;
const PER_KEY: usize = 4;
const KEYS: usize = 5;

/// Sets the limits, before any process of the round starts: every claim
/// is one they hold.
pub(super) async fn set(pool: &PgPool, schema: &Schema) -> Result<()> {
    queues::set_limits(&mut *pool.acquire().await?, schema, QUEUE, &LIMITS, "chaos").await?;
    Ok(())
}

/// Burst `n`'s tasks: four of each of three keys (of five, in turn), short
/// work (0.05-0.3 s) so that a key's slots turn over within the burst.
pub(super) fn burst(n: u64, rng: &mut StdRng) -> Vec<NewTask> {
    let mut tasks = Vec::new();
    for k in 0..BURST_KEYS {
        let key = format!("tenant-{}", (n as usize * BURST_KEYS + k) % KEYS);
        for _ in 0..PER_KEY {
            let secs = f64::from(rng.random_range(50..300)) / 1000.0;
            tasks.push(
                NewTask::new(
                    leasekeeper_core::worker::simulated::KIND,
                    json!({ "sleep_duration_seconds": secs }),
                )
                .queue(QUEUE)
                .concurrency_key(key.clone())
                .max_attempts(10),
            );
        }
    }
    tasks
}

/// Reads the queue's limits and its tasks' attempts, and checks them.
/// Read after every process of the round stopped: nothing races it.
pub(super) async fn check(pool: &PgPool) -> Result<LimitChecks> {
    type Limits = (Option<i32>, Option<i32>, Option<f64>, Option<i32>);
    let limits: Option<Limits> = sqlx::query_as(
        "SELECT max_started, max_started_per_key, rate_per_second, rate_burst
           FROM queues WHERE name = $1",
    )
    .bind(QUEUE)
    .fetch_optional(pool)
    .await?;
    let limits = limits.map(
        |(max_started, max_started_per_key, rate_per_second, rate_burst)| QueueLimits {
            max_started,
            max_started_per_key,
            rate_per_second,
            rate_burst,
        },
    );
    type Row = (
        i64,
        i32,
        Option<String>,
        DateTime<Utc>,
        Option<DateTime<Utc>>,
        String,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT a.task_id, a.number, t.concurrency_key, a.claimed_at, a.ended_at, a.outcome
           FROM attempts a JOIN tasks t ON t.id = a.task_id
          WHERE t.queue = $1",
    )
    .bind(QUEUE)
    .fetch_all(pool)
    .await?;
    let rows: Vec<AttemptRow> = rows
        .into_iter()
        .map(
            |(task_id, number, key, claimed_at, ended_at, outcome)| AttemptRow {
                task_id,
                number,
                key,
                claimed_at,
                ended_at,
                outcome,
            },
        )
        .collect();
    Ok(check_limits(QUEUE, limits.as_ref(), &rows))
}

//! Fairness between keys (issue 39): how long a key's one task waits for a
//! slot behind two keys with a backlog each (`fair_wait_*`).
//!
//! A runtime of [`CONCURRENCY`] workers with the default settings serves a
//! queue held to [`SLOTS`] started tasks at once (`max_started`): the cap,
//! not the workers, decides who runs. Two keys hold [`BACKLOG`] tasks each,
//! every task [`TASK_MS`] ms long. Once they run, a task of a key of its
//! own is enqueued, one at a time, each after the one before started; its
//! wait is from the enqueue's commit to its handler's first instruction,
//! both read from this process's monotonic clock.
//!
//! Served fairly, it starts at the next free slot: a slot frees every
//! `TASK_MS / SLOTS` ms on average, so about that, and at most one task's
//! duration plus a claim. Served first in, first out (by priority and due
//! time, as an unlimited queue is), it would start after every task queued
//! before it: `fair_fifo_wait_p50_ms` is that wait, the tasks of the two keys
//! pending ahead of it at each enqueue (counted in the same run) times
//! `TASK_MS / SLOTS`.

use super::fleet::CONCURRENCY;
use super::pickup::Starts;
use super::{BenchDb, Samples};
use crate::bench::Results;
use anyhow::{Context, Result, ensure};
use leasekeeper_core::queue::queue_limits::QueueLimits;
use leasekeeper_core::queue::{DEFAULT_QUEUE, NewTask};
use leasekeeper_core::{Done, HandlerResult, Job, Runtime, TaskContext};
use std::time::{Duration, Instant};

/// The queue's `max_started`.
const SLOTS: i32 = 4;
/// Each backlog task's duration.
const TASK_MS: u64 = 40;
/// Tasks in each of the two backlogged keys: far more than the run gets
/// through (`2 × BACKLOG × TASK_MS / SLOTS` = 40 s).
const BACKLOG: i64 = 2_000;
/// The kinds: the backlog's, and the measured task's.
const SLOW: &str = "fair-backlog";
const PROBE: &str = "fair-probe";

/// The measured waits (ms) and the first-in-first-out waits they would
/// have been (ms), `n` of each, into `r`.
pub(super) async fn fair_waits(db: &BenchDb, n: usize, r: &mut Results) -> Result<()> {
    let schema = leasekeeper_core::db::Schema::of(&db.pool);
    super::empty(&db.pool).await?;
    let limits = QueueLimits {
        max_started: Some(SLOTS),
        ..QueueLimits::default()
    };
    let mut conn = db.pool.acquire().await?;
    leasekeeper_core::queue::queues::set_limits(
        &mut conn,
        &schema,
        DEFAULT_QUEUE,
        &limits,
        "bench",
    )
    .await
    .context("limiting the default queue")?;
    sqlx::query(
        "INSERT INTO tasks (kind, task_data, concurrency_key)
         SELECT $1, '{}'::jsonb, 'backlog-' || (g % 2) FROM generate_series(1, $2::bigint) g",
    )
    .bind(SLOW)
    .bind(2 * BACKLOG)
    .execute(&mut *conn)
    .await?;
    let service_pool = db.service_pool().await?;
    let mut starts = Starts::new();
    let runtime = Runtime::builder(service_pool.clone())
        .id("bench-fairness")
        .queue(DEFAULT_QUEUE, CONCURRENCY)
        .handler(SLOW, |_job: Job, _ctx: TaskContext| async {
            tokio::time::sleep(Duration::from_millis(TASK_MS)).await;
            HandlerResult::Ok(Done::empty())
        })
        .handler(PROBE, starts.handler())
        .start()
        .await?;
    let result = async {
        // The backlog runs: every slot taken.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (mut waits, mut fifo) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            let ahead: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM tasks WHERE kind = $1 AND status = 'pending'",
            )
            .bind(SLOW)
            .fetch_one(&mut *conn)
            .await?;
            ensure!(
                ahead > 0,
                "the backlog ran out: the fairness figures would be of an idle queue"
            );
            let task = leasekeeper_core::queue::store::enqueue(
                &mut conn,
                &schema,
                &NewTask::new(PROBE, serde_json::json!({})).concurrency_key(format!("probe-{i}")),
            )
            .await?;
            let committed = Instant::now();
            let waited = starts
                .of(task.id, committed, Duration::from_secs(30))
                .await
                .context("a fresh key's task behind the backlog")?;
            waits.push(waited);
            fifo.push(ahead as f64 * TASK_MS as f64 / f64::from(SLOTS));
            // The next one lands at another point of the slots' cycle.
            tokio::time::sleep(Duration::from_millis(TASK_MS * 3 / 2)).await;
        }
        let (waits, fifo) = (Samples(waits), Samples(fifo));
        r.push(("fair_wait_p50_ms", waits.percentile_fine(50.0)));
        r.push(("fair_wait_max_ms", waits.percentile_fine(100.0)));
        r.push((
            "fair_wait_max_in_task_durations",
            waits.percentile_fine(100.0) / TASK_MS as f64,
        ));
        r.push(("fair_fifo_wait_p50_ms", fifo.percentile_fine(50.0)));
        anyhow::Ok(())
    }
    .await;
    runtime.shutdown().await;
    service_pool.close().await;
    leasekeeper_core::queue::queues::set_limits(
        &mut conn,
        &schema,
        DEFAULT_QUEUE,
        &QueueLimits::default(),
        "bench",
    )
    .await?;
    drop(conn);
    super::empty(&db.pool).await?;
    result
}

//! Pickup latency: how long one task waits for its handler on an idle
//! runtime with every setting at its default (`pickup_p50_ms`,
//! `pickup_p99_ms`).
//!
//! From the enqueue's commit (the call returned: the task exists and its
//! announcement is on its way) to the handler's first instruction, both
//! read from this process's monotonic clock. One task at a time: the next
//! is enqueued only after the previous one's handler started and a pause
//! let the runtime go idle again, so every sample is a cold pickup (the
//! wake-up by `NOTIFY`, the claim's commit, the hand-over to a worker),
//! not one that found a worker already polling. Unlike
//! `fleet_latency_*`, the completion's commit is not in it: a handler that
//! starts is what a user waits for.

use super::BenchDb;
use super::Samples;
use super::fleet::CONCURRENCY;
use anyhow::{Context, Result, ensure};
use leasekeeper_core::queue::{DEFAULT_QUEUE, NewTask};
use leasekeeper_core::{Done, HandlerResult, Job, Runtime, TaskContext};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The kind of the tasks measured: a handler of its own, so that nothing
/// else in the bench's database is picked up by it.
const PICKUP: &str = "pickup";

/// `n` tasks, one at a time, to an idle runtime of [`CONCURRENCY`] workers
/// with the default settings; each sample in ms. The queue must be empty.
pub(super) async fn pickups(db: &BenchDb, n: usize) -> Result<Samples> {
    let schema = leasekeeper_core::db::Schema::of(&db.pool);
    let service_pool = db.service_pool().await?;
    let (started, mut starts) = mpsc::unbounded_channel::<(i64, Instant)>();
    let runtime = Runtime::builder(service_pool.clone())
        .id("bench-pickup")
        .queue(DEFAULT_QUEUE, CONCURRENCY)
        .handler(PICKUP, move |job: Job, _ctx: TaskContext| {
            // Read before anything else the handler would do.
            let at = Instant::now();
            let started = started.clone();
            async move {
                let _ = started.send((job.id, at));
                HandlerResult::Ok(Done::empty())
            }
        })
        .start()
        .await?;
    let mut conn = db.pool.acquire().await?;
    let mut samples = Vec::with_capacity(n);
    // One more than asked: the first warms the pool's connections and is
    // not kept.
    for i in 0..=n {
        // Idle again: the previous task's completion committed and every
        // worker went back to waiting for an announcement.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let task = leasekeeper_core::queue::store::enqueue(
            &mut conn,
            &schema,
            &NewTask::new(PICKUP, serde_json::json!({})),
        )
        .await?;
        let committed = Instant::now();
        let (id, at) = tokio::time::timeout(Duration::from_secs(10), starts.recv())
            .await
            .context("no handler started within 10 s of an enqueue on an idle runtime")?
            .context("the runtime's handler is gone")?;
        ensure!(
            id == task.id,
            "the handler started task {id}, not {}",
            task.id
        );
        // A start before the enqueue call returned (the claim raced the
        // commit's reply) counts as no wait at all.
        if i > 0 {
            samples.push(at.saturating_duration_since(committed).as_secs_f64() * 1000.0);
        }
    }
    runtime.shutdown().await;
    service_pool.close().await;
    Ok(Samples(samples))
}

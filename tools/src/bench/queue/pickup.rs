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
    let mut starts = Starts::new();
    let runtime = Runtime::builder(service_pool.clone())
        .id("bench-pickup")
        .queue(DEFAULT_QUEUE, CONCURRENCY)
        .handler(PICKUP, starts.handler())
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
        let waited = starts
            .of(task.id, committed, Duration::from_secs(10))
            .await
            .context("on an idle runtime")?;
        if i > 0 {
            samples.push(waited);
        }
    }
    runtime.shutdown().await;
    service_pool.close().await;
    Ok(Samples(samples))
}

/// The instants handlers began, each reported by its task: what a pickup
/// or a wait for a slot is timed to.
pub(super) struct Starts {
    tx: mpsc::UnboundedSender<(i64, Instant)>,
    rx: mpsc::UnboundedReceiver<(i64, Instant)>,
}

impl Starts {
    pub(super) fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Starts { tx, rx }
    }

    /// A handler that reports its task's id and the instant it began
    /// (read before anything else it does), and completes.
    pub(super) fn handler(
        &self,
    ) -> impl Fn(Job, TaskContext) -> std::future::Ready<HandlerResult> + Send + Sync + 'static
    {
        let tx = self.tx.clone();
        move |job: Job, _ctx: TaskContext| {
            let _ = tx.send((job.id, Instant::now()));
            std::future::ready(HandlerResult::Ok(Done::empty()))
        }
    }

    /// How long (ms) after `committed` the next reported task, which must
    /// be task `id`, began; an error when none began `within`. A start
    /// before `committed` (the claim raced the enqueue's reply) is no wait.
    pub(super) async fn of(
        &mut self,
        id: i64,
        committed: Instant,
        within: Duration,
    ) -> Result<f64> {
        let (started, at) = tokio::time::timeout(within, self.rx.recv())
            .await
            .with_context(|| format!("task {id}'s handler did not start within {within:?}"))?
            .context("the runtime's handler is gone")?;
        ensure!(
            started == id,
            "the handler started task {started}, not {id}"
        );
        Ok(at.saturating_duration_since(committed).as_secs_f64() * 1000.0)
    }
}

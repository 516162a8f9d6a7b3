//! Wake-up latency: from an enqueue to the claim by an idle worker waiting
//! on a [`WorkSignal`] (LISTEN/NOTIFY, not a poll).

use super::{Samples, TTL, prepare};
use anyhow::{Context, Result};
use leasekeeper_core::lease::Holder;
use leasekeeper_core::live::LiveHub;
use leasekeeper_core::queue::store as tasks;
use leasekeeper_core::queue::wake::WorkSignal;
use rand::Rng;
use serde_json::json;
use sqlx::PgPool;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// From the start of an enqueue to an idle worker's claim, `n` times; the
/// worker waits on a [`WorkSignal`] with a poll far longer than any sample.
pub(super) async fn wakeups(pool: &PgPool, hub: &LiveHub, n: usize) -> Result<Wakeups> {
    prepare(pool, 0).await?;
    let (claimed_tx, mut claimed_rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let waiter = {
        let mut conn = pool.acquire().await?.detach();
        let mut signal = WorkSignal::new(hub);
        let stop = stop.clone();
        let me = Holder::parse("bench-idle")?;
        let schema = leasekeeper_core::db::Schema::of(pool);
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                while let Some(task) = tasks::claim_next(&mut conn, &schema, &me, TTL).await? {
                    let _ = claimed_tx.send(Instant::now());
                    let token = task.fencing_token.unwrap_or_default();
                    tasks::complete(&mut conn, &schema, task.id, &me, token, None).await?;
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = signal.wait(Duration::from_secs(60)) => {}
                }
            }
            anyhow::Ok(())
        })
    };
    let schema = &leasekeeper_core::db::Schema::of(pool);
    let mut conn = pool.acquire().await?;
    let (mut from_commit, mut from_call) = (Vec::new(), Vec::new());
    for _ in 0..n {
        // Idle long enough to be waiting again (the completion's own
        // announcement has gone out too).
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(30..60))).await;
        while claimed_rx.try_recv().is_ok() {}
        let started = Instant::now();
        tasks::enqueue(
            &mut conn,
            schema,
            &leasekeeper_core::queue::NewTask::new(
                leasekeeper_core::worker::simulated::KIND,
                json!({"sleep_duration_seconds": 0}),
            )
            .max_attempts(1),
        )
        .await?;
        let committed = Instant::now();
        let claimed = tokio::time::timeout(Duration::from_secs(10), claimed_rx.recv())
            .await
            .context("an idle worker did not claim a new task within 10 s")?
            .context("the waiting worker stopped")?;
        let ms = |from: Instant| claimed.saturating_duration_since(from).as_secs_f64() * 1000.0;
        from_commit.push(ms(committed));
        from_call.push(ms(started));
    }
    stop.cancel();
    waiter.await??;
    Ok(Wakeups {
        from_commit: Samples(from_commit),
        from_call: Samples(from_call),
    })
}

/// Wake-up latencies in ms: from the enqueue's commit (its call returned:
/// the task is visible) to the claim, and from the enqueue call's start
/// (its own commit included).
pub(super) struct Wakeups {
    pub(super) from_commit: Samples,
    pub(super) from_call: Samples,
}

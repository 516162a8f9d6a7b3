//! Bulk insert, three ways in one run: leasekeeper's [`enqueue_many`],
//! graphile-worker's `addJobs` and Awa's `QueueStorage::enqueue_params_copy`,
//! [`BULK`] no-op jobs each, each into its own emptied queue, timed from the
//! call to its committed return (the connection or pool already open; the
//! rows built beforehand). With more than one round they alternate, so a
//! noisy moment of the machine does not land on one side only; the figures
//! are the medians.
//!
//! [`enqueue_many`]: leasekeeper_core::queue::store::enqueue_many

use super::{BenchDb, Plan, Progress, awa, graphile, median, prepare_noop};
use anyhow::Result;
use leasekeeper_core::queue::NewTask;
use leasekeeper_core::queue::store::{MAX_ENQUEUE_BATCH, enqueue_many};
use serde_json::json;
use std::time::Instant;

/// Jobs per bulk insert: the 10,000, which is also the most one
/// `enqueue_many` call takes, so ours is one call as its API intends.
pub(super) const BULK: usize = 10_000;
const _: () = assert!(BULK <= MAX_ENQUEUE_BATCH);

/// Jobs per second of each bulk insert; `NaN` where it could not run.
pub(super) struct BulkInserts {
    pub ours: f64,
    pub graphile: f64,
    pub awa: f64,
}

pub(super) async fn bulk_inserts(
    db: &BenchDb,
    plan: &Plan,
    progress: &Progress,
) -> Result<BulkInserts> {
    let (mut ours, mut graphile_runs, mut awa_runs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..plan.rounds {
        ours.push(enqueue_many_rate(db).await?);
        if let Some(rate) = graphile::graphile_add_jobs(&db.conninfo, BULK as i64, progress).await {
            graphile_runs.push(rate);
        }
        if let Some(rate) = awa::awa_insert_many(&db.conninfo, BULK as i64, progress).await {
            awa_runs.push(rate);
        }
    }
    Ok(BulkInserts {
        ours: median(&ours),
        graphile: median(&graphile_runs),
        awa: median(&awa_runs),
    })
}

/// One `enqueue_many` of [`BULK`] no-op tasks into the emptied queue.
async fn enqueue_many_rate(db: &BenchDb) -> Result<f64> {
    prepare_noop(&db.pool, 0, 0).await?;
    let tasks: Vec<NewTask> = (0..BULK)
        .map(|_| NewTask::new(super::NOOP, json!({ "sleep_duration_seconds": 0 })))
        .collect();
    let mut conn = db.pool.acquire().await?;
    let started = Instant::now();
    let added = enqueue_many(&mut conn, &db.schema, &tasks).await?;
    let seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        added.iter().all(|e| e.is_new()) && added.len() == BULK,
        "enqueue_many added {} of {BULK}",
        added.iter().filter(|e| e.is_new()).count()
    );
    // The next phase starts from an emptied queue again.
    drop(conn);
    prepare_noop(&db.pool, 0, 0).await?;
    Ok((BULK as f64 / seconds).round())
}

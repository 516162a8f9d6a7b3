//! Bulk insert, three ways by one protocol: leasekeeper's
//! [`enqueue_many`], graphile-worker's `addJobs` and Awa's
//! `QueueStorage::enqueue_params_copy`, [`BULK`] no-op jobs each. In each
//! round each contestant, on a connection (ours) or in a process (the
//! peers') of its own, first inserts [`BULK`] jobs untimed (the warm-up:
//! its connection, statements and code paths), empties its queue, takes a
//! `CHECKPOINT`, then times one insert from the call to its committed
//! return (the rows built beforehand). [`ROUNDS`] rounds (3 with
//! `--quick`, which is not for the targets), the order of the
//! three rotated each round; the figures are the medians, every round
//! kept (`<key>_rounds`) and the spread given (`<key>_spread`, max - min
//! over the median).
//!
//! [`enqueue_many`]: leasekeeper_core::queue::store::enqueue_many

use super::{BenchDb, Progress, awa, graphile, key, median, spread};
use crate::bench::{Details, Results};
use anyhow::Result;
use leasekeeper_core::queue::NewTask;
use leasekeeper_core::queue::store::{MAX_ENQUEUE_BATCH, enqueue_many};
use serde_json::json;
use sqlx::Connection;
use std::time::Instant;

/// Jobs per bulk insert: the 10,000, which is also the most one
/// `enqueue_many` call takes, so ours is one call as its API intends.
pub(super) const BULK: usize = 10_000;
const _: () = assert!(BULK <= MAX_ENQUEUE_BATCH);
/// Rounds (the issue asks for at least 5): a round takes a few seconds.
pub(super) const ROUNDS: usize = 5;
const _: () = assert!(ROUNDS >= 5, "the issue asks for at least five bulk rounds");
/// Rounds of a `--quick` run, which keeps under four minutes.
const QUICK_ROUNDS: usize = 3;

/// Rounds of a full or a `quick` run.
pub(super) fn round_count(quick: bool) -> usize {
    if quick { QUICK_ROUNDS } else { ROUNDS }
}

/// Jobs per second of each bulk insert, median; `NaN` where it could not
/// run.
pub(super) struct BulkInserts {
    pub ours: f64,
    pub graphile: f64,
    pub awa: f64,
}

/// Every round of the three ([`round_count`]),
/// the figures pushed to `r` and `details`.
pub(super) async fn bulk_inserts(
    db: &BenchDb,
    quick: bool,
    progress: &Progress,
    r: &mut Results,
    details: &mut Details,
) -> Result<BulkInserts> {
    let mut rounds: [Vec<f64>; 3] = Default::default();
    let mut skipped = [false; 3];
    for round in 0..round_count(quick) {
        for i in 0..3 {
            let k = (i + round) % 3;
            if skipped[k] {
                continue;
            }
            let rate = match k {
                0 => enqueue_many_rate(db).await?,
                1 => {
                    match graphile::skipped(
                        graphile::add_jobs(&db.conninfo, BULK as i64).await,
                        progress,
                    ) {
                        Some(rate) => rate.round(),
                        None => {
                            skipped[k] = true;
                            continue;
                        }
                    }
                }
                _ => match awa::insert_many(&db.conninfo, BULK as i64).await {
                    Ok(rate) => rate.round(),
                    Err(e) => {
                        progress.note(&format!("bench: awa skipped: {e:#}"));
                        skipped[k] = true;
                        continue;
                    }
                },
            };
            rounds[k].push(rate);
        }
    }
    let keys = [
        "enqueue_many_per_s",
        "graphile_add_jobs_per_s",
        "awa_insert_many_per_s",
    ];
    let mut medians = [f64::NAN; 3];
    for k in 0..3 {
        let runs = if skipped[k] { &[][..] } else { &rounds[k][..] };
        medians[k] = median(runs);
        r.push((keys[k], medians[k]));
        r.push((key(format!("{}_spread", keys[k])), spread(runs)));
        details.push((format!("{}_rounds", keys[k]), json!(runs)));
    }
    Ok(BulkInserts {
        ours: medians[0],
        graphile: medians[1],
        awa: medians[2],
    })
}

/// One round of ours: on a connection of its own, an untimed
/// `enqueue_many` of [`BULK`] no-op tasks, the queue emptied, a
/// checkpoint, then one timed.
async fn enqueue_many_rate(db: &BenchDb) -> Result<f64> {
    let tasks = || -> Vec<NewTask> {
        (0..BULK)
            .map(|_| NewTask::new(super::NOOP, json!({ "sleep_duration_seconds": 0 })))
            .collect()
    };
    let mut conn = sqlx::PgConnection::connect_with(&db.pool.connect_options()).await?;
    super::empty(&db.pool).await?;
    enqueue_many(&mut conn, &db.schema, &tasks()).await?;
    super::empty(&db.pool).await?;
    sqlx::query("CHECKPOINT").execute(&mut conn).await?;
    let batch = tasks();
    let started = Instant::now();
    let added = enqueue_many(&mut conn, &db.schema, &batch).await?;
    let seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        added.iter().all(|e| e.is_new()) && added.len() == BULK,
        "enqueue_many added {} of {BULK}",
        added.iter().filter(|e| e.is_new()).count()
    );
    conn.close().await?;
    super::empty(&db.pool).await?;
    Ok((BULK as f64 / seconds).round())
}

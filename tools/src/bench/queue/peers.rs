//! `leasekeeper-tools bench peers [--quick] [--json PATH]`: only the peers'
//! phases of the queue suite, for a figure in minutes instead of the whole
//! suite: graphile-worker and Awa at concurrency 16 (defaults and best
//! settings), and the three bulk inserts (ours among them); with
//! `--bulk-only`, the bulk inserts alone. Same database, same plan, same
//! keys as the full suite.

use super::{DB, Plan, awa, bulk, graphile};
use crate::bench::{Options, Progress, Results, fresh_database, ratio, report};
use anyhow::Result;
use leasekeeper::settings::Settings;

const PHASES: u64 = 5;

/// Runs the peers' phases (or, `bulk_only`, the bulk inserts) and prints
/// (and optionally writes) their results.
pub async fn suite(settings: Settings, options: Options, bulk_only: bool) -> Result<()> {
    let plan = Plan::new(options.quick);
    let db = fresh_database(&settings, DB, 40).await?;
    let progress = Progress::new(if bulk_only { 1 } else { PHASES });
    let mut r = Results::new();
    let result = async {
        if !bulk_only {
            fleets(&db.conninfo, &plan, &progress, &mut r).await;
        }
        progress.phase("bulk insert: enqueue_many, graphile-worker's addJobs, Awa's COPY");
        let bulk = bulk::bulk_inserts(&db, &plan, &progress).await?;
        r.push(("enqueue_many_per_s", bulk.ours));
        r.push(("graphile_add_jobs_per_s", bulk.graphile));
        r.push(("awa_insert_many_per_s", bulk.awa));
        r.push((
            "enqueue_many_vs_fastest_peer",
            ratio(bulk.ours, bulk.graphile.max(bulk.awa)),
        ));
        anyhow::Ok(())
    }
    .await;
    progress.finish();
    db.close().await?;
    result?;
    report(&r, &options)
}

/// The four peer figures at concurrency 16, tasks/s (`NaN` where a peer
/// could not run).
pub(super) struct Fleets {
    pub graphile_default: f64,
    pub graphile_best: f64,
    pub awa_default: f64,
    pub awa_best: f64,
}

/// graphile-worker and Awa at concurrency 16, each with its defaults and
/// with its best settings: four phases, their keys pushed to `r`.
pub(super) async fn fleets(g: &str, plan: &Plan, progress: &Progress, r: &mut Results) -> Fleets {
    progress.phase("graphile-worker from npm, concurrency 16, its defaults");
    let graphile_default = graphile::graphile_worker(
        g,
        plan.graphile_jobs,
        16,
        graphile::Config::Default,
        progress,
    )
    .await
    .unwrap_or(f64::NAN);
    r.push(("graphile_default_w16", graphile_default));
    // The name of the same figure before there were two.
    r.push(("graphile_worker_w16", graphile_default));
    progress.phase("graphile-worker, concurrency 16, local queue and batched completions");
    let graphile_best = graphile::graphile_worker(
        g,
        plan.graphile_best_jobs,
        16,
        graphile::Config::Best,
        progress,
    )
    .await
    .unwrap_or(f64::NAN);
    r.push(("graphile_best_w16", graphile_best));
    progress.phase("Awa 0.6.9 (crates.io), 16 workers, its defaults");
    let awa_default = awa::awa_worker(g, plan.awa_jobs, 16, awa::Config::Default, progress)
        .await
        .unwrap_or(f64::NAN);
    r.push(("awa_default_w16", awa_default));
    progress.phase("Awa 0.6.9, 16 workers, its documented hot-queue settings");
    let awa_best = awa::awa_worker(g, plan.awa_jobs, 16, awa::Config::Best, progress)
        .await
        .unwrap_or(f64::NAN);
    r.push(("awa_best_w16", awa_best));
    Fleets {
        graphile_default,
        graphile_best,
        awa_default,
        awa_best,
    }
}

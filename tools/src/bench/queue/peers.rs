//! Parts of the queue suite on their own, for a figure in minutes instead
//! of the whole suite, with the same keys and the same protocol
//! (`race.rs`):
//!
//! - `bench peers [--quick] [--bulk-only] [--json PATH]`: the whole race
//!   (ours, graphile-worker and Awa, defaults and tuned) and the three bulk
//!   inserts; with `--bulk-only`, the bulk inserts alone.
//! - `bench fleet [--quick] [--json PATH]`: only our runtime's two
//!   contestants (`fleet_w16`, `fleet_best_w16`): the quick way to measure
//!   a change to the runtime.

use super::race::{Protocol, race};
use super::{DB, bulk, contestants};
use crate::bench::{Details, Options, Progress, Results, fresh_database, ratio, report_with};
use anyhow::Result;
use leasekeeper::settings::Settings;

/// `bench peers`: the race and the bulk inserts (or, `bulk_only`, the
/// bulk inserts alone).
pub async fn suite(settings: Settings, options: Options, bulk_only: bool) -> Result<()> {
    partial(settings, options, !bulk_only, true, |_| true).await
}

/// `bench fleet`: our runtime's contestants only.
pub async fn fleet_only(settings: Settings, options: Options) -> Result<()> {
    partial(settings, options, true, false, |key| {
        key.starts_with("fleet")
    })
    .await
}

/// The race of the contestants whose key `keep` keeps (when `racing`),
/// then the bulk inserts (when `inserting`), on a fresh database.
async fn partial(
    settings: Settings,
    options: Options,
    racing: bool,
    inserting: bool,
    keep: fn(&str) -> bool,
) -> Result<()> {
    let protocol = Protocol::new(options.quick);
    let db = fresh_database(&settings, DB, 40).await?;
    let progress = Progress::new(u64::from(racing) + u64::from(inserting));
    let mut r = Results::new();
    let mut details = Details::new();
    let result = async {
        if racing {
            progress.phase(&format!("the race, {} alternating rounds", protocol.rounds));
            details.push(("protocol".into(), protocol.describe()));
            let chosen = contestants().into_iter().filter(|(k, _)| keep(k)).collect();
            for standing in race(&db, &protocol, chosen, &progress).await? {
                standing.report(&mut r, &mut details);
            }
        }
        if inserting {
            progress.phase("bulk insert: enqueue_many, graphile-worker's addJobs, Awa's COPY");
            let bulk = bulk::bulk_inserts(&db, &progress, &mut r, &mut details).await?;
            r.push((
                "enqueue_many_vs_fastest_peer",
                ratio(bulk.ours, bulk.graphile.max(bulk.awa)),
            ));
        }
        anyhow::Ok(())
    }
    .await;
    progress.finish();
    db.close().await?;
    result?;
    report_with(&r, &details, &options)
}

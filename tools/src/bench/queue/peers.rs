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
//! - `bench floor [--quick] [--json PATH]`: what a task's history and
//!   attempt rows cost, measured against the fastest peer in one race: our
//!   best settings as they are (`fleet_best_w16`), the same with the tasks
//!   trigger off (`fleet_best_w16_no_history`: no attempt and no history
//!   rows, two row writes a task as graphile-worker's), and graphile-worker
//!   tuned (`graphile_best_w16`); and the same best with the workflows'
//!   trigger off (`fleet_best_w16_no_parents`: `tasks_parents_ended`,
//!   issue 40), what a workflow parent's end reaching its children costs
//!   the tasks that are in no workflow. An experiment, not a product
//!   setting: no deployment can turn a trigger off (issue 41's note).
//! - `bench limits [--quick] [--json PATH]`: what limits cost (issue 39):
//!   the runtime with its defaults (`fleet_w16`), the same on a queue with
//!   `max_started_per_key` 5 over 100 keys, every key busy
//!   (`fleet_w16_keyed`; target at least 0.8 × `fleet_w16`) and with 1 a
//!   key (`fleet_w16_keyed_one`), and the same held to a fleet-wide rate
//!   (`fleet_w16_rate`; target within 2 % of the rate); then fairness: a
//!   fresh key's task behind two keys' backlog (`fair_wait_*`, see
//!   `fairness.rs`).

use super::race::{Ablated, Contestant, Limited, Protocol, race};
use super::{DB, bulk, contestants, tune};
use crate::bench::{Details, Options, Progress, Results, fresh_database, ratio, report_with};
use anyhow::Result;
use leasekeeper::settings::Settings;

/// `bench peers`: the race and the bulk inserts (or, `bulk_only`, the
/// bulk inserts alone).
pub async fn suite(settings: Settings, options: Options, bulk_only: bool) -> Result<()> {
    let racing = if bulk_only { Vec::new() } else { contestants() };
    partial(settings, options, racing, Extra::Inserts).await
}

/// `bench fleet`: our runtime's contestants only.
pub async fn fleet_only(settings: Settings, options: Options) -> Result<()> {
    let ours = contestants()
        .into_iter()
        .filter(|(key, _)| key.starts_with("fleet"))
        .collect();
    partial(settings, options, ours, Extra::None).await
}

/// `bench floor`: our best as it ships, without the history trigger and
/// without the workflows' trigger, and graphile-worker's best, in one race.
pub async fn floor(settings: Settings, options: Options) -> Result<()> {
    let ours = tune::ours_best();
    let chosen = vec![
        ("fleet_best_w16", Contestant::Ours(ours)),
        (
            "fleet_best_w16_no_history",
            Contestant::OursWithout(ours, Ablated::History),
        ),
        (
            "fleet_best_w16_no_parents",
            Contestant::OursWithout(ours, Ablated::Parents),
        ),
        (
            "graphile_best_w16",
            Contestant::Graphile(tune::graphile_best()),
        ),
    ];
    partial(settings, options, chosen, Extra::None).await
}

/// What a [`partial`] suite measures beside its race.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Extra {
    None,
    /// Bulk inserts against the peers'.
    Inserts,
    /// Fairness between keys ([`super::fairness`]).
    Fairness,
}

/// `racing` cut to the keys named in `LEASEKEEPER_BENCH_ONLY` (comma
/// separated), when set: for looking into one contestant without waiting
/// for the others; figures of such a run are not the suite's.
fn only(racing: Vec<(&'static str, Contestant)>) -> Vec<(&'static str, Contestant)> {
    let Ok(keys) = std::env::var("LEASEKEEPER_BENCH_ONLY") else {
        return racing;
    };
    let keys: Vec<&str> = keys.split(',').map(str::trim).collect();
    racing
        .into_iter()
        .filter(|(key, _)| keys.contains(key))
        .collect()
}

/// `bench limits`' rate: about a third of what the runtime does unlimited
/// on this machine, so the bucket, not the runtime, sets the pace.
pub(super) const LIMITED_RATE: f64 = 4_000.0;

/// `bench limits`: our runtime's defaults unlimited, keyed and held to a
/// rate, in one race.
pub async fn limits(settings: Settings, options: Options) -> Result<()> {
    let ours = super::fleet::Settings::defaults();
    let chosen = vec![
        ("fleet_w16", Contestant::Ours(ours)),
        // Five a key: 500 slots, just under the 528 claims (16 running, 32
        // waiting per worker) the runtime holds at most, so the cap binds.
        (
            "fleet_w16_keyed",
            Contestant::OursLimited(
                ours,
                Limited::Keyed {
                    keys: 100,
                    per_key: 5,
                },
            ),
        ),
        // One a key: 100 tasks in flight at most, which bounds the rate by
        // itself (Little's law: 100 over a claim-to-commit cycle).
        (
            "fleet_w16_keyed_one",
            Contestant::OursLimited(
                ours,
                Limited::Keyed {
                    keys: 100,
                    per_key: 1,
                },
            ),
        ),
        (
            "fleet_w16_rate",
            Contestant::OursLimited(
                ours,
                Limited::Rate {
                    per_second: LIMITED_RATE,
                    burst: 50,
                },
            ),
        ),
    ];
    partial(settings, options, chosen, Extra::Fairness).await
}

/// The ratios reported when both their figures ran: (key, figure over,
/// figure under).
const RATIOS: [(&str, &str, &str); 6] = [
    (
        "fleet_w16_keyed_one_vs_fleet_w16",
        "fleet_w16_keyed_one",
        "fleet_w16",
    ),
    (
        "fleet_w16_keyed_vs_fleet_w16",
        "fleet_w16_keyed",
        "fleet_w16",
    ),
    (
        "fleet_best_vs_graphile_best",
        "fleet_best_w16",
        "graphile_best_w16",
    ),
    (
        "fleet_best_no_history_vs_graphile_best",
        "fleet_best_w16_no_history",
        "graphile_best_w16",
    ),
    (
        "fleet_best_no_history_vs_with",
        "fleet_best_w16_no_history",
        "fleet_best_w16",
    ),
    (
        "fleet_best_no_parents_vs_with",
        "fleet_best_w16_no_parents",
        "fleet_best_w16",
    ),
];

/// The race of the contestants `racing` (none: no race), then the bulk
/// inserts (when `inserting`), on a fresh database.
async fn partial(
    settings: Settings,
    options: Options,
    racing: Vec<(&'static str, Contestant)>,
    extra: Extra,
) -> Result<()> {
    let inserting = extra == Extra::Inserts;
    let fairness = extra == Extra::Fairness;
    let racing = only(racing);
    let protocol = Protocol::new(options.quick);
    let db = fresh_database(&settings, DB, 40).await?;
    let progress =
        Progress::new(u64::from(!racing.is_empty()) + u64::from(inserting) + u64::from(fairness));
    let mut r = Results::new();
    let mut details = Details::new();
    let result = async {
        if !racing.is_empty() {
            progress.phase(&format!("the race, {} alternating rounds", protocol.rounds));
            details.push(("protocol".into(), protocol.describe()));
            let standings = race(&db, &protocol, racing, &progress).await?;
            for standing in &standings {
                standing.report(&mut r, &mut details);
            }
            let figure = |key: &str| standings.iter().find(|s| s.key == key).map(|s| s.per_s());
            for (name, over, under) in RATIOS {
                if let (Some(a), Some(b)) = (figure(over), figure(under)) {
                    r.push((name, ratio(a, b)));
                }
            }
            if let Some(rate) = figure("fleet_w16_rate") {
                r.push(("fleet_w16_rate_vs_target", ratio(rate, LIMITED_RATE)));
            }
        }
        if inserting {
            progress.phase("bulk insert: enqueue_many, graphile-worker's addJobs, Awa's COPY");
            let bulk =
                bulk::bulk_inserts(&db, options.quick, &progress, &mut r, &mut details).await?;
            r.push((
                "enqueue_many_vs_fastest_peer",
                ratio(bulk.ours, bulk.graphile.max(bulk.awa)),
            ));
        }
        if fairness {
            progress.phase("fairness: a fresh key's task behind two keys' backlog, 4 slots");
            let n = if options.quick { 10 } else { 40 };
            super::fairness::fair_waits(&db, n, &mut r).await?;
        }
        anyhow::Ok(())
    }
    .await;
    progress.finish();
    db.close().await?;
    result?;
    report_with(&r, &details, &options)
}

//! The tuning pass (`leasekeeper-tools bench tune`): every contestant
//! through a sweep of its own settings, one short round per candidate by
//! the race's protocol (`race.rs`), the candidates of the three
//! interleaved so that no contestant's sweep gets the machine's quiet
//! minute. Apart from the measured rounds: `bench` runs each contestant's
//! winner, fixed here (`ours_best`, `graphile_best`, `awa_best`),
//! three rounds or more, and reports those (issue 41: "any sweep we run for
//! ourselves, we run for them").
//!
//! The winners below are those of the pass recorded in
//! docs/BENCHMARKS.md ("Tuning pass"); run `bench tune` again after a
//! change that moves any contestant's speed, and put its winners here.

use super::race::{Contestant, Protocol, race};
use super::{DB, awa, fleet, graphile};
use crate::bench::{Details, Options, Progress, Results, fresh_database, report_with};
use anyhow::Result;
use leasekeeper::settings::Settings;
use leasekeeper_core::worker::batch::Batching;
use serde_json::json;
use std::time::Duration;

/// The completer's big batches: a longer linger, more per statement.
fn big_batches() -> Batching {
    Batching {
        linger: Duration::from_millis(5),
        max: 500,
        ..Batching::default()
    }
}

/// Our sweep: prefetch depths (8, the default 32, and 100, the most one
/// claim statement takes at 16 workers) with the default and the big
/// completion batches.
pub(super) fn ours_grid() -> Vec<fleet::Settings> {
    let mut grid = Vec::new();
    for prefetch in [8, 32, 100] {
        for batching in [Batching::default(), big_batches()] {
            grid.push(fleet::Settings { prefetch, batching });
        }
    }
    grid
}

/// graphile-worker's sweep at 16 jobs at once: one process of 16 or two of
/// 8, local queues of 100, 500 and 2,000, completion batches with no delay
/// and with 10 ms (its documented fast path, "Performance" in its docs).
pub(super) fn graphile_grid() -> Vec<graphile::Settings> {
    let mut grid = Vec::new();
    for (processes, concurrency) in [(1, 16), (2, 8)] {
        for local_queue in [100, 500, 2000] {
            for batch_delay_ms in [0, 10] {
                grid.push(graphile::Settings {
                    processes,
                    concurrency,
                    local_queue: Some(local_queue),
                    batch_delay_ms: Some(batch_delay_ms),
                    no_log_success: true,
                });
            }
        }
    }
    grid
}

/// Awa's sweep: its hot-queue settings with 16 permits and with the large
/// permit counts its docs size for a fast no-op queue (a permit is held
/// until the completion commits; docs/configuration.md and
/// docs/benchmarking.md: about 1,024 in flight for 10k/s), 4 or 8 enqueue
/// shards.
pub(super) fn awa_grid() -> Vec<awa::Settings> {
    let mut grid = Vec::new();
    for max_workers in [16, 128, 512, 1024] {
        grid.push(awa::Settings::hot(max_workers));
    }
    for max_workers in [512, 1024] {
        grid.push(awa::Settings {
            enqueue_shards: Some(8),
            ..awa::Settings::hot(max_workers)
        });
    }
    grid
}

/// Our winner of the recorded tuning pass: prefetch 32 (the default) with
/// the big completion batches (9,463 tasks/s; the defaults 7,665).
pub(super) fn ours_best() -> fleet::Settings {
    fleet::Settings {
        prefetch: 32,
        batching: big_batches(),
    }
}

/// graphile-worker's winner of the recorded tuning pass: two processes of
/// 8, local queues of 500, completions batched over 10 ms (29,419 jobs/s;
/// one process of 16 with the same, 20,722).
pub(super) fn graphile_best() -> graphile::Settings {
    graphile::Settings {
        processes: 2,
        concurrency: 8,
        local_queue: Some(500),
        batch_delay_ms: Some(10),
        no_log_success: true,
    }
}

/// Awa's winner of the recorded tuning pass: its hot-queue settings with
/// 1,024 permits (7,746 jobs/s; with 16 permits, 943).
pub(super) fn awa_best() -> awa::Settings {
    awa::Settings::hot(1024)
}

/// `bench tune`: every candidate once, interleaved; each contestant's
/// candidates sorted by rate, the winner first. With `only` (`ours`,
/// `graphile` or `awa`), that contestant's sweep alone.
pub async fn tune(settings: Settings, options: Options, only: Option<&str>) -> Result<()> {
    let protocol = Protocol::tuning(options.quick);
    let db = fresh_database(&settings, DB, 40).await?;
    let wanted = |who: &str| only.is_none_or(|o| o == who);
    let (ours, graphile, awa) = (
        if wanted("ours") {
            ours_grid()
        } else {
            Vec::new()
        },
        if wanted("graphile") {
            graphile_grid()
        } else {
            Vec::new()
        },
        if wanted("awa") {
            awa_grid()
        } else {
            Vec::new()
        },
    );
    let most = ours.len().max(graphile.len()).max(awa.len());
    let mut contestants = Vec::new();
    for i in 0..most {
        if let Some(s) = ours.get(i) {
            contestants.push(("ours", Contestant::Ours(*s)));
        }
        if let Some(s) = graphile.get(i) {
            contestants.push(("graphile", Contestant::Graphile(*s)));
        }
        if let Some(s) = awa.get(i) {
            contestants.push(("awa", Contestant::Awa(*s)));
        }
    }
    let progress = Progress::new(1);
    progress.phase(&format!(
        "tuning pass: {} candidates, one round each",
        contestants.len()
    ));
    let result = race(&db, &protocol, contestants, &progress).await;
    progress.finish();
    db.close().await?;
    let standings = result?;
    let mut r = Results::new();
    let mut details = Details::new();
    details.push(("protocol".into(), protocol.describe()));
    for (who, key) in [
        ("ours", "fleet_tuned_w16"),
        ("graphile", "graphile_tuned_w16"),
        ("awa", "awa_tuned_w16"),
    ] {
        if !wanted(who) {
            continue;
        }
        let mut mine: Vec<_> = standings.iter().filter(|s| s.key == who).collect();
        // Fastest first; a candidate that could not run (NaN) last.
        let rate = |s: &&crate::bench::queue::race::Standing| {
            let v = s.per_s();
            if v.is_nan() { f64::NEG_INFINITY } else { v }
        };
        mine.sort_by(|a, b| rate(b).total_cmp(&rate(a)));
        let sweep: Vec<_> = mine
            .iter()
            .map(|s| {
                json!({
                    "per_s": s.per_s(),
                    "rows_per_task": s.rounds.first().map(|r| r.rows_per_task),
                    "wal_bytes_per_task": s.rounds.first().map(|r| r.wal_per_task),
                    "settings": s.contestant.settings(),
                })
            })
            .collect();
        r.push((key, mine.first().map_or(f64::NAN, |s| s.per_s())));
        details.push((format!("{key}_sweep"), json!(sweep)));
    }
    report_with(&r, &details, &options)
}

//! `leasekeeper-tools bench`: the queue suite. Every figure is measured in this
//! one run, on one fresh database in the embedded cluster (durable commits),
//! next to baselines measured the same way:
//!
//! 1. **Throughput**: tasks claimed and completed per second by 1, 4, 16 and
//!    64 workers (each a loop on its own connection calling
//!    [`tasks::claim_next`] then [`tasks::complete`], the worker loop's own
//!    calls), one task per claim; and with the batch API
//!    ([`tasks::claim_batch`] / [`tasks::complete_all_of`]).
//! 2. **Claim latency** at 16 workers (each `claim_next` call under that
//!    load), and **wake-up latency**: from an enqueue's commit (the task is
//!    visible) to the moment an idle worker, waiting on a [`WorkSignal`]
//!    (LISTEN/NOTIFY, not a poll), has claimed it; also from the start of
//!    the enqueue call, its own commit included.
//! 3. **Depth**: 16-worker throughput with 1,000 and with 1,000,000 tasks
//!    queued (a feeder keeps the queue at that depth).
//! 4. **Lease operations**: acquire and renew latency, renewals per second,
//!    16 clients.
//! 5. **Failover**: `kill -9` of an HTTP worker process (`leasekeeper
//!    worker`) holding a task, until another worker process claims it (the
//!    `taken_over` event), repeatedly; no task may be lost or completed
//!    twice.
//! 6. **The worker runtime** ([`Runtime`]): tasks/s through one runtime of
//!    16 workers with a no-op handler, default settings (what a service
//!    embedding the library gets), and the `lease_events` rows it wrote per
//!    task; the same runtime in 1, 2 and 4 processes of its own on the one
//!    database (scale-out); and once more with millions of rows already in
//!    `lease_events` (history must not slow claims); and its **pickup**
//!    latency, one task at a time on the idle runtime, from the enqueue's
//!    commit to the handler's start.
//! 7. **Baselines**: (a) the raw SQL ceiling: pgbench driving the very same
//!    claim and complete statements ([`tasks::sql::claim`],
//!    [`tasks::sql::complete`]) with no application code; (b) the minimal
//!    ceiling: pgbench on a bare SKIP LOCKED queue table, the physical
//!    reference; (c) the original design's algorithm (`ORDER BY
//!    scheduled_at LIMIT 1 OFFSET n FOR UPDATE`, then a separate lease
//!    insert, in one transaction; `n` random below the worker count); (d)
//!    graphile-worker from npm processing no-op jobs on the same database,
//!    with its defaults and with its documented fast path; (e) Awa 0.6.9
//!    (crates.io `awa`, a program of the bench's own built outside the
//!    workspace) likewise, with its defaults and its documented settings
//!    for a hot queue.
//! 8. **Bulk insert**: 10,000 tasks in one call, ours ([`tasks::enqueue_many`])
//!    next to graphile-worker's `addJobs` and Awa's COPY insert.
//!
//! The runtime's figures against graphile-worker's and Awa's (6, 7 d and
//! e) are taken by one protocol for every contestant, `race.rs` (the same
//! depth and preparation, each contestant its own processes, one clock
//! outside them all, three alternating rounds, medians), with each
//! contestant's defaults and the winner of its tuning pass (`tune.rs`,
//! `bench tune`); the bulk inserts (8) by a protocol of their own in
//! `bulk.rs` (a warm-up each, a checkpoint, five rotated rounds).
//!
//! One file per idea: `throughput.rs` (1-3), `wakeup.rs` (2), `leases.rs`
//! (4), `failover.rs` (5), `fleet.rs`, `scale_out.rs` and `pickup.rs`
//! (6), `ceilings.rs`, `baselines.rs`, `graphile.rs` and `awa.rs` (7),
//! `race.rs` and `tune.rs` (6 and 7), `bulk.rs` (8); this one plans the run
//! and reports; `--charts` draws it ([`super::charts`]).
//!
//! Every queue run starts from an emptied queue, prefilled with enough
//! tasks not to run dry, vacuumed and checkpointed, so no run pays for the
//! previous one's garbage.
//!
//! [`tasks::claim_next`]: leasekeeper_core::queue::store::claim_next
//! [`tasks::complete`]: leasekeeper_core::queue::store::complete
//! [`tasks::claim_batch`]: leasekeeper_core::queue::store::claim_batch
//! [`tasks::complete_all_of`]: leasekeeper_core::queue::store::complete_all_of
//! [`tasks::enqueue_many`]: leasekeeper_core::queue::store::enqueue_many
//! [`tasks::sql::claim`]: leasekeeper_core::queue::store::sql::claim
//! [`tasks::sql::complete`]: leasekeeper_core::queue::store::sql::complete
//! [`WorkSignal`]: leasekeeper_core::queue::wake::WorkSignal
//! [`Runtime`]: leasekeeper_core::Runtime

mod awa;
mod baselines;
mod bulk;
mod ceilings;
mod failover;
mod fairness;
pub(crate) mod fleet;
pub use peers::fleet_only;
mod graphile;
mod leases;
pub mod peers;
mod pickup;
pub(crate) mod race;
mod rescue;
mod scale_out;
mod throughput;
pub mod tune;
mod wakeup;

pub use fleet::Settings as RuntimeSettings;
pub use rescue::rescue_only;
pub use scale_out::runtime_process;

use super::{
    BenchDb, BenchServer, Details, Options, Progress, Results, Samples, charts, fresh_database,
    ratio, report_with,
};
use anyhow::{Context, Result};
use ceilings::{minimal_ceiling, raw_ceiling};
use failover::failovers;
use fleet::{NOOP, seed_history, single_task_latency};
use leasekeeper::settings::Settings;
use leasekeeper_core::live::LiveHub;
use leasekeeper_core::worker::batch::Batching;
use leases::lease_ops;
use sqlx::PgPool;
use std::path::Path;
use std::time::Duration;
use throughput::{Algo, at_depth, drive};
use wakeup::wakeups;

const DB: &str = "leasekeeper_bench_queue";
/// The lease every benchmark claim takes (long: no run should see expiry).
const TTL: Duration = Duration::from_secs(30);
/// Tasks per batch claim and completion.
const BATCH: usize = 100;
/// Workers claiming in batches.
const BATCH_WORKERS: usize = 4;
/// Lease clients.
const LEASE_CLIENTS: usize = 16;
/// Runtime processes of the scale-out phases.
const INSTANCES: [usize; 3] = [1, 2, 4];
const PHASES: u64 = 23;

/// How long and how much: full or `--quick`.
struct Plan {
    warmup: Duration,
    run: Duration,
    wakeups: usize,
    failovers: usize,
    /// `--quick`: the race's rounds are shorter too ([`race::Protocol`]).
    quick: bool,
    /// Rows of old history in `lease_events` for the history run.
    history_rows: i64,
    /// Rounds of the pairs whose ratio matters most (ours vs the raw SQL
    /// at 16 workers; 1,000 vs 1,000,000 queued), alternated so that a
    /// noisy moment of the machine does not land on one side only; the
    /// figures are the medians.
    rounds: usize,
    /// Single tasks timed through an idle runtime, per batching setting.
    latency_tasks: usize,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Plan {
                warmup: Duration::from_millis(500),
                run: Duration::from_secs(2),
                wakeups: 60,
                failovers: 3,
                quick: true,
                history_rows: 300_000,
                rounds: 1,
                latency_tasks: 40,
            }
        } else {
            Plan {
                warmup: Duration::from_millis(1500),
                run: Duration::from_secs(8),
                wakeups: 300,
                failovers: 20,
                quick: false,
                history_rows: 10_000_000,
                rounds: 3,
                latency_tasks: 200,
            }
        }
    }

    /// Tasks enough for `rate` tasks/s through warm-up and run, and then some.
    fn prefill(&self, rate: f64) -> i64 {
        ((self.warmup + self.run).as_secs_f64() * rate * 1.5) as i64 + 1_000
    }
}

/// The race's contestants: ours, graphile-worker and Awa, each with its
/// defaults and with the winner of the tuning pass ([`tune`]).
fn contestants() -> Vec<(&'static str, race::Contestant)> {
    use race::Contestant::{Awa, Graphile, Ours};
    vec![
        ("fleet_w16", Ours(fleet::Settings::defaults())),
        (
            "graphile_default_w16",
            Graphile(graphile::Settings::defaults()),
        ),
        ("awa_default_w16", Awa(awa::Settings::defaults())),
        ("fleet_best_w16", Ours(tune::ours_best())),
        ("graphile_best_w16", Graphile(tune::graphile_best())),
        ("awa_best_w16", Awa(tune::awa_best())),
    ]
}

/// Runs the queue suite and prints (and optionally writes) its results.
pub async fn suite(settings: Settings, options: Options) -> Result<()> {
    let plan = Plan::new(options.quick);
    let db = fresh_database(&settings, DB, 100).await?;
    let progress = Progress::new(PHASES);
    let result = run(&settings, &plan, &db, &progress).await;
    progress.finish();
    db.close().await?;
    let (results, details) = result?;
    report_with(&results, &details, &options)?;
    if let Some(dir) = &options.charts {
        write_charts(dir, &results)?;
    }
    Ok(())
}

async fn run(
    settings: &Settings,
    plan: &Plan,
    db: &BenchDb,
    progress: &Progress,
) -> Result<(Results, Details)> {
    let pool = &db.pool;
    let race_protocol = race::Protocol::new(plan.quick);
    let mut details = Details::new();
    // The instance's announcer and LISTEN hub run throughout, as in a
    // server: our figures include announcing every change.
    let hub = LiveHub::start(pool.clone());
    let mut r = Results::new();

    let mut by_workers = Vec::new();
    let mut claims = Samples(Vec::new());
    for workers in [1usize, 4, 16, 64] {
        progress.phase(&format!(
            "throughput, {workers} workers, one task per claim"
        ));
        prepare(pool, plan.prefill(6_000.0)).await?;
        let run = drive(pool, Algo::Ours, workers, plan, progress).await?;
        if workers == 16 {
            claims = run.claims;
        }
        by_workers.push((workers, run.per_s));
    }
    r.push(("throughput_w1", by_workers[0].1));
    r.push(("throughput_w4", by_workers[1].1));
    r.push(("throughput_w16", by_workers[2].1));
    r.push(("throughput_w64", by_workers[3].1));
    r.push(("claim_p50_ms", claims.percentile_fine(50.0)));
    r.push(("claim_p99_ms", claims.percentile_fine(99.0)));

    progress.phase(&format!(
        "throughput, {BATCH_WORKERS} workers, batches of {BATCH}"
    ));
    prepare(pool, plan.prefill(60_000.0)).await?;
    let batched = drive(pool, Algo::Batched, BATCH_WORKERS, plan, progress).await?;
    r.push(("throughput_batched", batched.per_s));

    progress.phase("raw SQL ceiling: the same statements from pgbench, 16 clients");
    // Alternated with ours at 16 workers; the sweep's run is ours' first round.
    let mut ours16_runs = vec![by_workers[2].1];
    let mut raw_runs = Vec::new();
    for round in 0..plan.rounds {
        if round > 0 {
            prepare(pool, plan.prefill(6_000.0)).await?;
            ours16_runs.push(drive(pool, Algo::Ours, 16, plan, progress).await?.per_s);
        }
        prepare(pool, plan.prefill(8_000.0)).await?;
        match raw_ceiling(&db.conninfo, &db.schema, 16, plan).await {
            Ok(tps) => raw_runs.push(tps),
            Err(e) => {
                progress.note(&format!("bench: the raw SQL ceiling could not run: {e:#}"));
                break;
            }
        }
    }
    let ours16 = median(&ours16_runs);
    let raw = median(&raw_runs);
    r.push(("throughput_w16_median", ours16));
    r.push(("raw_ceiling_w16", raw));

    progress.phase("minimal ceiling: a bare SKIP LOCKED queue from pgbench, 16 clients");
    let minimal = match minimal_ceiling(
        pool,
        &db.conninfo,
        &db.schema,
        16,
        plan.prefill(20_000.0),
        plan,
    )
    .await
    {
        Ok(tps) => tps,
        Err(e) => {
            progress.note(&format!("bench: the minimal ceiling could not run: {e:#}"));
            f64::NAN
        }
    };
    r.push(("minimal_ceiling_w16", minimal));

    progress.phase("original design (OFFSET scan, separate lease insert), 16 workers");
    prepare(pool, plan.prefill(3_000.0)).await?;
    let original = drive(pool, Algo::Original, 16, plan, progress).await?;
    r.push(("original_design_w16", original.per_s));

    progress.phase(&format!(
        "the race: the worker runtime, graphile-worker and Awa at 16, defaults and tuned, {} alternating rounds",
        race_protocol.rounds
    ));
    details.push(("protocol".into(), race_protocol.describe()));
    let standings = race::race(db, &race_protocol, contestants(), progress).await?;
    for standing in &standings {
        standing.report(&mut r, &mut details);
    }
    let figure = |key: &str| {
        standings
            .iter()
            .find(|s| s.key == key)
            .map_or(f64::NAN, |s| s.per_s())
    };
    let (fleet_w16, fleet_best) = (figure("fleet_w16"), figure("fleet_best_w16"));
    let (graphile_default, graphile_best) =
        (figure("graphile_default_w16"), figure("graphile_best_w16"));
    let (awa_default, awa_best) = (figure("awa_default_w16"), figure("awa_best_w16"));
    // What a task costs our runtime with its defaults, by table.
    if let Some(ours) = standings.iter().find(|s| s.key == "fleet_w16") {
        let rows = |table: &str| {
            ours.by_table
                .iter()
                .find(|(t, _)| t == table)
                .map_or(0.0, |(_, n)| (n * 100.0).round() / 100.0)
        };
        r.push(("lease_events_per_task", rows("lease_events")));
        for table in PROFILED {
            r.push((rows_key(table), rows(table)));
        }
        r.push((
            "rows_per_task",
            (ours.by_table.iter().map(|(_, n)| n).sum::<f64>() * 100.0).round() / 100.0,
        ));
    }

    progress.phase(&format!(
        "bulk insert of {} tasks, {} rotated rounds: enqueue_many, graphile-worker's addJobs, Awa's COPY",
        bulk::BULK,
        bulk::round_count(plan.quick)
    ));
    let bulk = bulk::bulk_inserts(db, plan.quick, progress, &mut r, &mut details).await?;

    progress.phase("what batching costs one task: enqueue to committed completion, idle runtime");
    let latency_tasks = plan.latency_tasks;
    prepare_noop(pool, 0, 0).await?;
    let lingering = single_task_latency(db, Batching::default(), latency_tasks).await?;
    prepare_noop(pool, 0, 0).await?;
    let no_linger = single_task_latency(
        db,
        Batching {
            linger: std::time::Duration::ZERO,
            ..Batching::default()
        },
        latency_tasks,
    )
    .await?;
    r.push(("fleet_latency_p50_ms", lingering.percentile_fine(50.0)));
    r.push(("fleet_latency_p99_ms", lingering.percentile_fine(99.0)));
    r.push((
        "fleet_latency_no_linger_p50_ms",
        no_linger.percentile_fine(50.0),
    ));
    r.push((
        "fleet_latency_no_linger_p99_ms",
        no_linger.percentile_fine(99.0),
    ));
    progress.phase("pickup: enqueue commit to handler start, idle runtime, defaults");
    prepare_noop(pool, 0, 0).await?;
    let pickup = pickup::pickups(db, latency_tasks).await?;
    r.push(("pickup_p50_ms", pickup.percentile_fine(50.0)));
    r.push(("pickup_p99_ms", pickup.percentile_fine(99.0)));
    // Sized on the figure just measured, generously: more instances may
    // get through more.
    let prefill = plan.prefill(fleet_w16.max(5_000.0) * 2.0);

    let mut by_instances = Vec::new();
    for n in INSTANCES {
        progress.phase(&format!(
            "the worker runtime in {n} process{}, 16 workers each",
            if n == 1 { "" } else { "es" }
        ));
        prepare_noop(pool, prefill, 0).await?;
        let per_s = scale_out::instances(db, n, plan, progress).await?;
        by_instances.push(per_s);
    }
    r.push(("fleet_instances_1", by_instances[0]));
    r.push(("fleet_instances_2", by_instances[1]));
    r.push(("fleet_instances_4", by_instances[2]));

    progress.phase(&format!(
        "the worker runtime over {} rows of lease history",
        plan.history_rows
    ));
    let history = race::race(
        db,
        &race::Protocol {
            rounds: 1,
            ..race_protocol
        },
        vec![(
            "fleet_w16_history",
            race::Contestant::OursOverHistory(fleet::Settings::defaults(), plan.history_rows),
        )],
        progress,
    )
    .await?;
    let with_history = history[0].per_s();
    r.push(("history_rows", plan.history_rows as f64));
    r.push(("fleet_w16_history", with_history));
    r.push(("history_vs_empty", ratio(with_history, fleet_w16)));

    progress.phase("depth: 16 workers with 1,000 and with 1,000,000 tasks queued");
    let (mut shallow_runs, mut deep_runs) = (Vec::new(), Vec::new());
    for _ in 0..plan.rounds.min(2) {
        shallow_runs.push(at_depth(pool, 1_000, plan, progress).await?);
        deep_runs.push(at_depth(pool, 1_000_000, plan, progress).await?);
    }
    let (shallow, deep) = (median(&shallow_runs), median(&deep_runs));
    r.push(("throughput_depth_1k", shallow));
    r.push(("throughput_depth_1m", deep));
    r.push(("depth_ratio_1m_vs_1k", ratio(deep, shallow)));

    progress.phase("wake-up latency of an idle worker");
    let wake = wakeups(pool, &hub, plan.wakeups).await?;
    r.push(("wakeup_p50_ms", wake.from_commit.percentile_fine(50.0)));
    r.push(("wakeup_p99_ms", wake.from_commit.percentile_fine(99.0)));
    r.push((
        "enqueue_to_claim_p50_ms",
        wake.from_call.percentile_fine(50.0),
    ));
    r.push((
        "enqueue_to_claim_p99_ms",
        wake.from_call.percentile_fine(99.0),
    ));

    progress.phase(&format!("lease acquire and renew, {LEASE_CLIENTS} clients"));
    let lease = lease_ops(pool, plan).await?;
    r.push(("acquire_p50_ms", lease.acquire.percentile_fine(50.0)));
    r.push(("acquire_p99_ms", lease.acquire.percentile_fine(99.0)));
    r.push(("renew_p50_ms", lease.renew.percentile_fine(50.0)));
    r.push(("renew_p99_ms", lease.renew.percentile_fine(99.0)));
    r.push(("renews_per_s", lease.renews_per_s.round()));

    progress.phase(&format!(
        "failover: kill -9 of an HTTP worker holding a task, {} times",
        plan.failovers
    ));
    let failover = failovers(settings, pool, plan.failovers, progress).await?;
    r.push(("failover_min_s", failover.times.percentile_fine(0.0)));
    r.push(("failover_p50_s", failover.times.percentile_fine(50.0)));
    r.push(("failover_p99_s", failover.times.percentile_fine(99.0)));
    r.push(("failover_bound_s", failover.bound.as_secs_f64()));
    r.push(("failover_tasks_lost", failover.lost as f64));
    r.push(("failover_tasks_completed_twice", failover.twice as f64));

    progress.phase(&format!(
        "rescue: kill -9 of a runtime process holding {} claims at the default TTL, {} times",
        rescue::HELD,
        plan.failovers
    ));
    let mut rescue = rescue::rescues(db, plan.failovers, progress).await?;
    progress.phase(&format!(
        "rescue: kill -9 of a worker process holding a task at the default TTL, {} times",
        plan.failovers
    ));
    rescue.workers = Some(rescue::worker_rescues(settings, db, plan.failovers, progress).await?);
    rescue.report(&mut r);

    progress.phase("ratios");
    r.push(("w16_vs_raw_ceiling", ratio(ours16, raw)));
    r.push(("w16_vs_original_design", ratio(ours16, original.per_s)));
    r.push(("w16_vs_graphile_worker", ratio(ours16, graphile_default)));
    r.push(("batched_vs_w16", ratio(batched.per_s, ours16)));
    r.push((
        "fleet_w16_vs_graphile_best",
        ratio(fleet_w16, graphile_best),
    ));
    r.push((
        "throughput_w16_vs_graphile_default",
        ratio(ours16, graphile_default),
    ));
    r.push(("fleet_w16_vs_awa_default", ratio(fleet_w16, awa_default)));
    r.push(("fleet_w16_vs_awa_best", ratio(fleet_w16, awa_best)));
    // The targets: the defaults against each peer's defaults and
    // graphile-worker's best, and the runtime's best against the faster of
    // the peers' best (`max` skips a peer that could not run).
    r.push((
        "fleet_w16_vs_graphile_default",
        ratio(fleet_w16, graphile_default),
    ));
    r.push((
        "fleet_best_vs_fastest_peer",
        ratio(fleet_best, graphile_best.max(awa_best)),
    ));
    r.push((
        "enqueue_many_vs_fastest_peer",
        ratio(bulk.ours, bulk.graphile.max(bulk.awa)),
    ));
    hub.shutdown();
    Ok((r, details))
}

/// The tables whose rows per task the suite reports one by one (the
/// others are in `rows_per_task`, the sum of every table's).
const PROFILED: [&str; 8] = [
    "tasks",
    "leases",
    "lease_fencing",
    "lease_events",
    "attempts",
    "task_counts",
    "workers",
    "instances",
];

/// The key of the rows written per task to `table` (one of [`PROFILED`]).
fn rows_key(table: &str) -> &'static str {
    match table {
        "tasks" => "rows_per_task_tasks",
        "leases" => "rows_per_task_leases",
        "lease_fencing" => "rows_per_task_lease_fencing",
        "lease_events" => "rows_per_task_lease_events",
        "attempts" => "rows_per_task_attempts",
        "task_counts" => "rows_per_task_task_counts",
        "workers" => "rows_per_task_workers",
        _ => "rows_per_task_instances",
    }
}

/// The median (the mean of the middle two for an even count); `NaN` when empty.
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => ((v[n / 2 - 1] + v[n / 2]) / 2.0).round(),
    }
}

/// The spread of `values`: max - min over the median, to two decimals;
/// `NaN` when empty.
fn spread(values: &[f64]) -> f64 {
    match (
        values.iter().copied().reduce(f64::min),
        values.iter().copied().reduce(f64::max),
    ) {
        (Some(lo), Some(hi)) => ratio(hi - lo, median(values)),
        _ => f64::NAN,
    }
}

/// A result key made at run time (per contestant), kept for the run (the
/// results' keys are static).
fn key(key: String) -> &'static str {
    Box::leak(key.into_boxed_str())
}

/// Empties the queue (tasks, their leases and history) and queues `n`
/// tasks (of the simulated kind, for the store-level loops), then vacuums
/// and checkpoints so the run starts clean.
async fn prepare(pool: &PgPool, n: i64) -> Result<()> {
    empty(pool).await?;
    add_tasks(pool, n).await?;
    settle(pool).await
}

/// [`prepare`] for the worker runtime: `n` tasks of its no-op kind, after
/// `history` rows of old history put into `lease_events` (see
/// [`seed_history`]).
async fn prepare_noop(pool: &PgPool, n: i64, history: i64) -> Result<()> {
    empty(pool).await?;
    if history > 0 {
        seed_history(pool, history).await?;
    }
    add_tasks_of(pool, NOOP, n).await?;
    settle(pool).await
}

async fn empty(pool: &PgPool) -> Result<()> {
    sqlx::query("TRUNCATE tasks, leases, lease_events")
        .execute(pool)
        .await?;
    Ok(())
}

/// The queued tasks analyzed, and a checkpoint, before a run. Not the
/// tables [`empty`] has just truncated (`leases`, `lease_events`, and with
/// its trigger `attempts`): a truncated table's size is unknown to the
/// planner until analyzed, and it plans look-ups by key in it; analyzed
/// empty, it is known to hold nothing, and a plan made early in a run (kept
/// for a prepared statement) reads all of it instead, while the run adds a
/// row per task. A deployment's tables are never empty like that.
async fn settle(pool: &PgPool) -> Result<()> {
    sqlx::query("VACUUM ANALYZE tasks, task_counts")
        .execute(pool)
        .await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    Ok(())
}

/// Queues `n` tasks of the simulated kind that sleep for no time.
async fn add_tasks(pool: &PgPool, n: i64) -> Result<()> {
    add_tasks_of(pool, leasekeeper_core::worker::simulated::KIND, n).await
}

/// Queues `n` tasks of `kind` in the default queue, in one statement.
async fn add_tasks_of(pool: &PgPool, kind: &str, n: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO tasks (kind, task_data)
         SELECT $2, '{\"sleep_duration_seconds\": 0}'::jsonb FROM generate_series(1, $1::bigint)",
    )
    .bind(n)
    .bind(kind)
    .execute(pool)
    .await?;
    Ok(())
}

/// [`add_tasks_of`] with a concurrency key each, dealt round-robin over
/// `keys` keys (`key-0` to `key-<keys - 1>`).
async fn add_keyed_tasks_of(pool: &PgPool, kind: &str, n: i64, keys: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO tasks (kind, task_data, concurrency_key)
         SELECT $2, '{\"sleep_duration_seconds\": 0}'::jsonb, 'key-' || (g % $3)
           FROM generate_series(1, $1::bigint) g",
    )
    .bind(n)
    .bind(kind)
    .bind(keys)
    .execute(pool)
    .await?;
    Ok(())
}

/// The value of `key` in `results`; `NaN` when absent.
fn value(results: &Results, key: &str) -> f64 {
    results
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(f64::NAN, |(_, v)| *v)
}

/// `scale_out.svg` (tasks/s against runtime processes) and
/// `baselines.svg` (the runtime and the store-level loop against
/// graphile-worker and pgbench's ceilings) in `dir`.
fn write_charts(dir: &Path, results: &Results) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let points: Vec<(f64, f64)> = INSTANCES
        .iter()
        .zip([
            "fleet_instances_1",
            "fleet_instances_2",
            "fleet_instances_4",
        ])
        .map(|(&n, key)| (n as f64, value(results, key)))
        .collect();
    charts::line_chart(
        &dir.join("scale_out.svg"),
        "Worker runtime scale-out on one database",
        ("runtime processes", "tasks/s"),
        "no-op runtime, 16 workers per process",
        &points,
    )?;
    let bars: Vec<(&str, f64)> = [
        ("fleet_w16", "fleet_w16"),
        ("fleet best", "fleet_best_w16"),
        ("throughput_w16", "throughput_w16_median"),
        ("graphile best", "graphile_best_w16"),
        ("graphile default", "graphile_default_w16"),
        ("awa best", "awa_best_w16"),
        ("awa default", "awa_default_w16"),
        ("minimal ceiling", "minimal_ceiling_w16"),
        ("raw ceiling", "raw_ceiling_w16"),
    ]
    .into_iter()
    .map(|(name, key)| (name, value(results, key)))
    .collect();
    charts::bar_chart(
        &dir.join("baselines.svg"),
        "Tasks/s at 16: ours against the baselines (same run)",
        "tasks/s",
        &bars,
    )?;
    println!("charts written to {}", dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0]), 3.0);
    }

    #[test]
    fn spreads() {
        assert!(spread(&[]).is_nan());
        assert_eq!(spread(&[80.0, 100.0, 120.0]), 0.4);
        assert_eq!(spread(&[5.0]), 0.0);
    }

    #[test]
    fn quick_is_shorter_and_prefill_covers_the_run() {
        let (quick, full) = (Plan::new(true), Plan::new(false));
        assert!(quick.run < full.run && quick.failovers < full.failovers);
        assert!(full.failovers >= 20, "the issue asks for at least 20 kills");
        assert!(quick.prefill(1_000.0) as f64 > 1_000.0 * (quick.run + quick.warmup).as_secs_f64());
    }
}

//! The worker runtime's own throughput: what a service embedding
//! [`Runtime`] gets, default settings, with a handler that completes at
//! once, so the figure is the runtime's and the database's cost per task.
//!
//! Completions are counted from the `task_counts` counters (committed
//! completions only, whatever the runtime batches or defers), over the
//! plan's window after its warm-up. The same measure serves the one
//! instance in this process ([`fleet`]), the instances in processes of
//! their own ([`super::scale_out`]), and the run over a long history
//! ([`seed_history`]).

use super::{BenchDb, Plan, Progress, Samples, ratio};
use anyhow::{Result, ensure};
use leasekeeper_core::queue::{DEFAULT_QUEUE, NewTask};
use leasekeeper_core::worker::batch::{Batching, Prefetch};
use leasekeeper_core::{Done, HandlerResult, Job, Runtime, TaskContext};
use sqlx::PgPool;
use std::time::{Duration, Instant};

/// The task kind of the runtime's no-op handler.
pub(crate) const NOOP: &str = "noop";
/// Workers per runtime instance.
pub(crate) const CONCURRENCY: usize = 16;

/// One runtime measured in this process.
pub(super) struct FleetRun {
    /// Tasks completed (committed) per second over the window.
    pub(super) per_s: f64,
    /// Rows written to `lease_events` from the runtime's start to its
    /// shutdown, per task it completed.
    pub(super) events_per_task: f64,
    /// Rows inserted, updated or deleted per task completed, by table
    /// (PostgreSQL's own counters), the profile of what a task costs.
    pub(super) rows_per_task: Vec<(String, f64)>,
}

/// The tables whose writes [`FleetRun::rows_per_task`] reports.
pub(super) const PROFILED: [&str; 7] = [
    "tasks",
    "leases",
    "lease_fencing",
    "lease_events",
    "task_counts",
    "workers",
    "instances",
];

/// Rows inserted, updated and deleted so far in each of [`PROFILED`], as
/// PostgreSQL's statistics count them (flushed when a backend ends, or
/// within a second).
async fn table_writes(pool: &PgPool) -> Result<Vec<i64>> {
    let mut writes = Vec::new();
    for table in PROFILED {
        let n: Option<i64> = sqlx::query_scalar(
            "SELECT (n_tup_ins + n_tup_upd + n_tup_del)::int8 FROM pg_stat_user_tables
              WHERE schemaname = current_schema() AND relname = $1",
        )
        .bind(table)
        .fetch_optional(pool)
        .await?;
        writes.push(n.unwrap_or(0));
    }
    Ok(writes)
}

/// A runtime named `id` on `pool`, serving the default queue with
/// `concurrency` workers, whose one handler ([`NOOP`]) completes at once;
/// every other setting is the runtime's default.
pub(crate) async fn noop_runtime(pool: PgPool, id: &str, concurrency: usize) -> Result<Runtime> {
    noop_runtime_batching(pool, id, concurrency, Batching::default()).await
}

/// [`noop_runtime`] with `batching` instead of the default.
async fn noop_runtime_batching(
    pool: PgPool,
    id: &str,
    concurrency: usize,
    batching: Batching,
) -> Result<Runtime> {
    noop_runtime_with(
        pool,
        id,
        concurrency,
        Settings::defaults().batching(batching),
    )
    .await
}

/// The runtime settings a fleet run uses: the defaults, or what
/// `fleet_best_w16` tries.
#[derive(Clone, Copy, Debug)]
pub(super) struct Settings {
    /// Claims waiting per worker at most ([`Prefetch::per_worker`]).
    pub(super) prefetch: usize,
    pub(super) batching: Batching,
}

impl Settings {
    /// The runtime's defaults.
    pub(super) fn defaults() -> Self {
        Settings {
            prefetch: Prefetch::default().per_worker,
            batching: Batching::default(),
        }
    }

    fn batching(self, batching: Batching) -> Self {
        Settings { batching, ..self }
    }
}

/// What `fleet_best_w16` tries, fastest kept: the defaults, prefetch depths, and the
/// completer's batches (a longer linger and bigger batches: fewer
/// commits, more delay per task).
pub(super) fn best_candidates() -> Vec<Settings> {
    let big = Batching {
        linger: Duration::from_millis(5),
        max: 500,
        ..Batching::default()
    };
    vec![
        // The defaults too: the fastest the runtime offers may be them.
        Settings::defaults(),
        Settings {
            prefetch: 8,
            batching: Batching::default(),
        },
        Settings {
            prefetch: 32,
            batching: Batching::default(),
        },
        Settings {
            prefetch: 8,
            batching: big,
        },
        Settings {
            prefetch: 32,
            batching: big,
        },
        // The deepest the runtime takes: with 16 workers one claim
        // statement asks for up to 1,000 (its most) while the queue is deep.
        Settings {
            prefetch: 100,
            batching: big,
        },
    ]
}

/// [`noop_runtime`] with `settings`.
async fn noop_runtime_with(
    pool: PgPool,
    id: &str,
    concurrency: usize,
    settings: Settings,
) -> Result<Runtime> {
    Ok(Runtime::builder(pool)
        .id(id)
        .queue(DEFAULT_QUEUE, concurrency)
        .batching(settings.batching)
        .prefetch(settings.prefetch)
        .handler(NOOP, |_job: Job, _ctx: TaskContext| async {
            HandlerResult::Ok(Done::empty())
        })
        .start()
        .await?)
}

/// Tasks completed so far, from the counters.
async fn processed(pool: &PgPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT coalesce(sum(processed), 0)::int8 FROM task_counts")
            .fetch_one(pool)
            .await?,
    )
}

/// Waits out the plan's warm-up, then counts the tasks completed over its
/// run: per second. Notes a queue that ran dry (the figure is then low).
pub(super) async fn completed_per_s(
    pool: &PgPool,
    plan: &Plan,
    progress: &Progress,
) -> Result<f64> {
    tokio::time::sleep(plan.warmup).await;
    let (from, t0) = (processed(pool).await?, Instant::now());
    tokio::time::sleep(plan.run).await;
    let (to, elapsed) = (processed(pool).await?, t0.elapsed());
    let pending: i64 =
        sqlx::query_scalar("SELECT coalesce(sum(pending), 0)::int8 FROM task_counts")
            .fetch_one(pool)
            .await?;
    if pending == 0 {
        progress.note("bench: warning: the queue ran dry during a runtime run; its figure is low");
    }
    Ok(((to - from) as f64 / elapsed.as_secs_f64()).round())
}

/// One [`noop_runtime`] of [`CONCURRENCY`] workers named `id`, in this
/// process, on a pool of its own with the library's default pool settings
/// (as a service would have), over the tasks already queued: its rate, and
/// the history rows it wrote per task, counted once it has shut down.
pub(super) async fn fleet(
    db: &BenchDb,
    id: &str,
    plan: &Plan,
    progress: &Progress,
) -> Result<FleetRun> {
    fleet_with(db, id, plan, progress, Settings::defaults()).await
}

/// [`fleet`] with the runtime's `settings`.
pub(super) async fn fleet_with(
    db: &BenchDb,
    id: &str,
    plan: &Plan,
    progress: &Progress,
    settings: Settings,
) -> Result<FleetRun> {
    let pool = &db.pool;
    let events_before: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM lease_events")
        .fetch_one(pool)
        .await?;
    let processed_before = processed(pool).await?;
    let writes_before = table_writes(pool).await?;
    let service_pool = db.service_pool().await?;
    let runtime = noop_runtime_with(service_pool.clone(), id, CONCURRENCY, settings).await?;
    let per_s = completed_per_s(pool, plan, progress).await;
    runtime.shutdown().await;
    service_pool.close().await;
    let per_s = per_s?;
    // Quiescent now: every worker has stopped and its writes are committed.
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM lease_events WHERE id > $1")
        .bind(events_before)
        .fetch_one(pool)
        .await?;
    let tasks = processed(pool).await? - processed_before;
    // The service's backends have ended (their statistics are flushed);
    // give the statistics a moment all the same.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let writes_after = table_writes(pool).await?;
    let rows_per_task = PROFILED
        .iter()
        .zip(writes_before.iter().zip(&writes_after))
        .map(|(table, (before, after))| {
            (
                table.to_string(),
                ratio((after - before) as f64, tasks as f64),
            )
        })
        .collect();
    Ok(FleetRun {
        rows_per_task,
        per_s,
        events_per_task: if tasks > 0 {
            ratio(events as f64, tasks as f64)
        } else {
            f64::NAN
        },
    })
}

/// `fleet_best_w16`: [`fleet_with`] for each of [`best_candidates`], each
/// over a fresh queue; the fastest rate and its settings.
pub(super) async fn best(
    db: &BenchDb,
    plan: &Plan,
    progress: &Progress,
) -> Result<(f64, Settings)> {
    let mut best = (f64::NAN, Settings::defaults());
    for (n, settings) in best_candidates().into_iter().enumerate() {
        super::prepare_noop(&db.pool, plan.prefill(super::RUNTIME_RATE_GUESS), 0).await?;
        // A runtime id of its own per candidate, as each would be a
        // service's own: nothing one run left under its name (workers,
        // leases) is there for the next.
        let id = format!("bench-best-{n}");
        let run = fleet_with(db, &id, plan, progress, settings).await?;
        progress.note(&format!(
            "bench: runtime with prefetch {} per worker, linger {:?}, batches of {}: {}/s",
            settings.prefetch, settings.batching.linger, settings.batching.max, run.per_s
        ));
        // The first figure, then any faster one (NaN, a run that failed, never wins).
        if best.0.is_nan() || run.per_s > best.0 {
            best = (run.per_s, settings);
        }
    }
    Ok(best)
}

/// `leasekeeper-tools bench fleet`: only the runtime's throughput, with
/// its defaults (`fleet_w16`) and with the fastest of
/// [`best_candidates`] (`fleet_best_w16`), on a fresh database: the quick
/// way to measure a change to the runtime.
pub async fn fleet_only(
    settings: leasekeeper::settings::Settings,
    options: crate::bench::Options,
) -> Result<()> {
    let plan = Plan::new(options.quick);
    let db = crate::bench::fresh_database(&settings, super::DB, 100).await?;
    let progress = Progress::new(2);
    let result = async {
        let mut r: crate::bench::Results = Vec::new();
        progress.phase("the worker runtime: one instance, 16 workers, no-op handler, defaults");
        super::prepare_noop(&db.pool, plan.prefill(super::RUNTIME_RATE_GUESS), 0).await?;
        let defaults = fleet(&db, "bench-fleet", &plan, &progress).await?;
        r.push(("fleet_w16", defaults.per_s));
        r.push(("lease_events_per_task", defaults.events_per_task));
        progress.phase("the worker runtime: the fastest settings it offers");
        let best = best(&db, &plan, &progress).await?;
        r.push(("fleet_best_w16", best.0));
        r.push(("fleet_best_prefetch", best.1.prefetch as f64));
        r.push((
            "fleet_best_linger_ms",
            best.1.batching.linger.as_secs_f64() * 1000.0,
        ));
        r.push(("fleet_best_batch_max", best.1.batching.max as f64));
        anyhow::Ok(r)
    }
    .await;
    progress.finish();
    db.close().await?;
    crate::bench::report(&result?, &options)
}

/// Puts `rows` rows of history into `lease_events`, set-based, as a
/// deployment that has run `rows / 2` tasks has them: an `acquired` and a
/// `released` row per task, on resources `task:1` to `task:<rows / 2>`,
/// spread over the past; then moves the task id sequence past them (new
/// tasks are newer than all that history, as they would be) and vacuums and
/// analyzes the table, as autovacuum has in a deployment whose history grew
/// over time (left to autovacuum here, its first pass over the ten million
/// new rows ran through the whole measured run). Call it after emptying the
/// queue and before queueing tasks.
pub(super) async fn seed_history(pool: &PgPool, rows: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO lease_events (resource, holder, fencing_token, kind, expires_at, at)
         SELECT 'task:' || (g / 2 + 1), 'history-w' || (g / 2 % 64), 1,
                CASE WHEN g % 2 = 0 THEN 'acquired' ELSE 'released' END,
                t.at + interval '15 s', t.at
           FROM generate_series(0, $1::int8 - 1) g,
                LATERAL (SELECT now() - ($1::int8 - g) * interval '10 ms' AS at) t",
    )
    .bind(rows)
    .execute(pool)
    .await?;
    sqlx::query(
        "SELECT setval(pg_get_serial_sequence('tasks', 'id'),
                       greatest(nextval(pg_get_serial_sequence('tasks', 'id')), $1::int8 / 2 + 1))",
    )
    .bind(rows)
    .execute(pool)
    .await?;
    sqlx::query("VACUUM ANALYZE lease_events")
        .execute(pool)
        .await?;
    Ok(())
}

/// What batching costs one task: `n` tasks enqueued one at a time, 25 ms
/// apart, to an idle [`noop_runtime`] of [`CONCURRENCY`] workers with
/// `batching`; each task's time from its enqueue (`created_at`) to its
/// committed completion (`processed_at`), both by the database clock, in
/// ms. The queue must be empty.
pub(super) async fn single_task_latency(
    db: &BenchDb,
    batching: Batching,
    n: usize,
) -> Result<Samples> {
    let pool = &db.pool;
    let schema = &leasekeeper_core::db::Schema::of(pool);
    let service_pool = db.service_pool().await?;
    let runtime =
        noop_runtime_batching(service_pool.clone(), "bench-latency", CONCURRENCY, batching).await?;
    let mut ids = Vec::with_capacity(n);
    let mut conn = pool.acquire().await?;
    for _ in 0..n {
        let task = leasekeeper_core::queue::store::enqueue(
            &mut conn,
            schema,
            &NewTask::new(NOOP, serde_json::json!({})),
        )
        .await?;
        ids.push(task.id);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let latencies: Vec<f64> = loop {
        let done: Vec<f64> = sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM (processed_at - created_at))::float8 * 1000
               FROM tasks WHERE id = ANY($1) AND status = 'processed'",
        )
        .bind(&ids)
        .fetch_all(pool)
        .await?;
        if done.len() == n || Instant::now() > deadline {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    runtime.shutdown().await;
    service_pool.close().await;
    ensure!(
        latencies.len() == n,
        "only {} of {n} single tasks were completed within 30 s",
        latencies.len()
    );
    Ok(Samples(latencies))
}

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

use super::{BenchDb, Plan, Progress, Samples};
use anyhow::{Context, Result, ensure};
use leasekeeper_core::queue::{DEFAULT_QUEUE, NewTask};
use leasekeeper_core::worker::batch::{Batching, Prefetch};
use leasekeeper_core::{Done, HandlerResult, Job, Runtime, TaskContext};
use sqlx::PgPool;
use std::time::{Duration, Instant};

/// The task kind of the runtime's no-op handler.
pub(crate) const NOOP: &str = "noop";
/// Workers per runtime instance.
pub(crate) const CONCURRENCY: usize = 16;
/// The task kind the rescue phase holds: its first claim runs until its
/// process dies (or the claim is lost); a later claim completes at once
/// (see [`super::rescue`]).
pub(crate) const HOLD: &str = "bench-hold";

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

/// The runtime settings a runtime run uses: the defaults, or a tuning
/// pass's candidate (see [`super::tune`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    /// Claims waiting per worker at most ([`Prefetch::per_worker`]).
    pub prefetch: usize,
    pub batching: Batching,
}

impl Settings {
    /// The runtime's defaults.
    pub fn defaults() -> Self {
        Settings {
            prefetch: Prefetch::default().per_worker,
            batching: Batching::default(),
        }
    }

    fn batching(self, batching: Batching) -> Self {
        Settings { batching, ..self }
    }

    /// The defaults with what is given instead (`bench-runtime`'s flags).
    pub fn with(prefetch: Option<usize>, linger_us: Option<u64>, batch_max: Option<u64>) -> Self {
        let d = Settings::defaults();
        Settings {
            prefetch: prefetch.unwrap_or(d.prefetch),
            batching: Batching {
                linger: linger_us.map_or(d.batching.linger, Duration::from_micros),
                max: batch_max.map_or(d.batching.max, |n| n as usize),
                ..d.batching
            },
        }
    }

    /// A short name for progress lines.
    pub(super) fn label(&self) -> String {
        format!(
            "leasekeeper runtime 1×{CONCURRENCY}, prefetch {}, linger {:?}, batches of {}",
            self.prefetch, self.batching.linger, self.batching.max
        )
    }

    /// The `bench-runtime` flags that give a process these settings.
    fn args(&self) -> Vec<String> {
        vec![
            "--runtime-prefetch".into(),
            self.prefetch.to_string(),
            "--runtime-linger-us".into(),
            self.batching.linger.as_micros().to_string(),
            "--runtime-batch-max".into(),
            self.batching.max.to_string(),
        ]
    }
}

/// Written to the JSON as `<key>_settings`: everything a reader needs to
/// build the same runtime (`RuntimeBuilder::prefetch`, `::batching`).
impl serde::Serialize for Settings {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde_json::json!({
            "processes": 1,
            "workers": CONCURRENCY,
            "prefetch_per_worker": self.prefetch,
            "linger_ms": self.batching.linger.as_secs_f64() * 1000.0,
            "batch_max": self.batching.max,
            "report_every_ms": self.batching.report_every.as_secs_f64() * 1000.0,
        })
        .serialize(s)
    }
}

/// One `leasekeeper-tools bench-runtime` process (a runtime of
/// [`CONCURRENCY`] no-op workers named `id`, with `settings`) on the bench
/// database, ready. It stops on SIGTERM (and after an hour at the latest,
/// should this process die first).
pub(super) async fn start_process(
    db: &BenchDb,
    id: &str,
    settings: &Settings,
) -> Result<tokio::process::Child> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut child = tokio::process::Command::new(&exe)
        .args(["bench-runtime", "--database-url", &db.conninfo, "--schema"])
        .arg(db.schema.as_str())
        .args(["--concurrency", &CONCURRENCY.to_string()])
        .args(["--seconds", "3600"])
        .args(["--id", id])
        .args(settings.args())
        // Quiet, unless `LEASEKEEPER_BENCH_RUNTIME_LOG` asks for more (the
        // producer's `claimed` trace says what each claim asked and got).
        .env(
            "RUST_LOG",
            std::env::var("LEASEKEEPER_BENCH_RUNTIME_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting a runtime process")?;
    super::race::wait_ready(&mut child).await?;
    Ok(child)
}

/// [`noop_runtime`] with `settings`.
pub(crate) async fn noop_runtime_with(
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
        .handler(HOLD, |job: Job, ctx: TaskContext| async move {
            if job.fencing_token == 1 {
                ctx.cancelled().await;
                return HandlerResult::Err("the first claim was lost".into());
            }
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

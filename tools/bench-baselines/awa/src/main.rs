//! The Awa baseline of `leasekeeper-tools bench`: Awa 0.6.9 (crates.io `awa`,
//! a Rust + sqlx + PostgreSQL job queue) measured through its public API on
//! the bench's database, so that leasekeeper's figures are compared with a
//! figure of the same run, not with one published elsewhere.
//!
//! Its own crate, outside leasekeeper's workspace (an empty `[workspace]`
//! table in its Cargo.toml, its own Cargo.lock): Awa's dependency versions
//! must not move ours. The bench builds it into `target/bench-awa` and runs
//! the binary once per figure; each run prints one JSON line on stdout.
//!
//! Every run starts from a fresh Awa schema: `awa` (where 0.6's queue
//! storage lives too) is dropped and Awa's own migrations install it anew,
//! as a new deployment would have it.
//!
//! - `run`: queue `JOBS` no-op jobs (COPY, untimed), then time one `Client`
//!   with `CONCURRENCY` workers on one queue from its start until every job
//!   is durably terminal (Awa's own measure: completed, not handler
//!   returns). `SETTINGS=default` is `QueueConfig::default()` with only
//!   `max_workers` set; `SETTINGS=best` adds the settings Awa's docs
//!   recommend for one hot queue (see [`Settings::best`]).
//! - `insert`: time `QueueStorage::enqueue_params_copy` of `JOBS` jobs in one
//!   call, the bulk path Awa's docs name as the fastest for queue storage
//!   ("for high-volume queue-storage producers, prefer
//!   `QueueStorage::enqueue_params_copy`").
//!
//! Environment: `DATABASE_URL`, `JOBS`, `CONCURRENCY`, `SETTINGS`; for
//! exploring other settings, `AWA_BENCH_POLL_MS`, `AWA_BENCH_CLAIMERS`,
//! `AWA_BENCH_CLAIM_BATCH`, `AWA_BENCH_ENQUEUE_SHARDS` and
//! `AWA_BENCH_DEADLINE_MS` override the chosen set (and Awa itself reads
//! `AWA_COMPLETION_BATCH_SIZE`, `AWA_COMPLETION_FLUSH_MS`,
//! `AWA_COMPLETION_SHARDS`).

use awa::{
    Client, InsertOpts, InsertParams, JobArgs, JobContext, JobError, JobResult, QueueConfig,
    QueueStorage, QueueStorageConfig,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use std::error::Error;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

const QUEUE: &str = "bench";

/// The job: no arguments, a handler that does nothing.
#[derive(Serialize, Deserialize)]
struct Noop {}

impl JobArgs for Noop {
    fn kind() -> &'static str {
        "noop"
    }
}

/// The settings a run uses, printed with its figure.
#[derive(Serialize)]
struct Settings {
    name: &'static str,
    poll_interval_ms: u64,
    claimers: u16,
    claim_batch_size: usize,
    /// `awa.queue_meta.enqueue_shards` of the queue (1: strict FIFO).
    enqueue_shards: i16,
    /// 0 turns off the per-attempt deadline (and its rescue path).
    deadline_ms: u64,
}

impl Settings {
    /// `QueueConfig::default()` (poll 200 ms, one claimer, batches of 512,
    /// a 5-minute deadline) and one enqueue shard.
    fn default() -> Self {
        let d = QueueConfig::default();
        Settings {
            name: "default",
            poll_interval_ms: d.poll_interval.as_millis() as u64,
            claimers: d.claimers,
            claim_batch_size: d.claim_batch_size,
            enqueue_shards: 1,
            deadline_ms: d.deadline_duration.as_millis() as u64,
        }
    }

    /// What Awa 0.6's docs recommend for one hot queue:
    /// - `enqueue_shards = 4` (docs/benchmarking.md: "For the hot
    ///   single-queue shape, `enqueue_shards = 4` plus larger completion
    ///   batches sustained 7.9k completed jobs/s"; configuration.md: raise
    ///   it when the queue can accept partitioned FIFO, which no-op jobs
    ///   can);
    /// - claim batches of 512 and completion batches of 512 (both already
    ///   the 0.6.9 defaults; "a larger claim batch usually helps before
    ///   extra claimers");
    /// - `deadline_duration = 0`, which skips the deadline rescue path
    ///   (configuration.md), as Awa's own throughput benchmarks run;
    /// - a 10 ms poll: the fallback poll when a NOTIFY is missed (Awa's own
    ///   benchmarks use 50 ms; shorter only helps a drained claimer).
    ///
    /// Extra claimers are not in it: the docs say to add them only when
    /// one claimer leaves permits idle, and measured here two did no better.
    fn best() -> Self {
        Settings {
            name: "best",
            poll_interval_ms: 10,
            claimers: 1,
            claim_batch_size: 512,
            enqueue_shards: 4,
            deadline_ms: 0,
        }
    }

    fn from_env(name: &str) -> Result<Self> {
        let mut s = match name {
            "default" => Settings::default(),
            "best" => Settings::best(),
            other => return Err(format!("SETTINGS must be default or best, not {other}").into()),
        };
        if let Some(v) = env_opt("AWA_BENCH_POLL_MS")? {
            s.poll_interval_ms = v;
        }
        if let Some(v) = env_opt("AWA_BENCH_CLAIMERS")? {
            s.claimers = v as u16;
        }
        if let Some(v) = env_opt("AWA_BENCH_CLAIM_BATCH")? {
            s.claim_batch_size = v as usize;
        }
        if let Some(v) = env_opt("AWA_BENCH_ENQUEUE_SHARDS")? {
            s.enqueue_shards = v as i16;
        }
        if let Some(v) = env_opt("AWA_BENCH_DEADLINE_MS")? {
            s.deadline_ms = v;
        }
        Ok(s)
    }

    fn queue_config(&self, workers: u32) -> QueueConfig {
        QueueConfig {
            max_workers: workers,
            poll_interval: Duration::from_millis(self.poll_interval_ms),
            claimers: self.claimers,
            claim_batch_size: self.claim_batch_size,
            deadline_duration: Duration::from_millis(self.deadline_ms),
            ..QueueConfig::default()
        }
    }
}

fn env_opt(name: &str) -> Result<Option<u64>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v.parse().map_err(|e| format!("{name}: {e}"))?)),
        Err(_) => Ok(None),
    }
}

fn env_num(name: &str) -> Result<u64> {
    env_opt(name)?.ok_or_else(|| format!("{name} is not set").into())
}

#[tokio::main]
async fn main() -> Result<()> {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let url = std::env::var("DATABASE_URL").map_err(|_| "DATABASE_URL is not set")?;
    let jobs = env_num("JOBS")? as i64;
    let workers = match mode.as_str() {
        "run" => env_num("CONCURRENCY")? as u32,
        _ => 1,
    };
    // The workers' claims, completions and heartbeats share it with Awa's
    // maintenance and LISTEN: room for all, as Awa's own benchmarks give.
    let pool = PgPoolOptions::new()
        .max_connections(workers + 8)
        .acquire_timeout(Duration::from_secs(60))
        .connect(&url)
        .await?;
    fresh_schema(&pool).await?;
    let out = match mode.as_str() {
        "run" => {
            let name = std::env::var("SETTINGS").unwrap_or_else(|_| "default".into());
            run(&pool, jobs, workers, Settings::from_env(&name)?).await?
        }
        "insert" => insert(&pool, jobs).await?,
        other => {
            return Err(format!("usage: leasekeeper-bench-awa run|insert, not {other:?}").into())
        }
    };
    pool.close().await;
    println!("{out}");
    Ok(())
}

/// Drops Awa's schema and installs it again with Awa's migrations (0.6
/// installs its default queue storage into the same `awa` schema).
async fn fresh_schema(pool: &PgPool) -> Result<()> {
    sqlx::query("DROP SCHEMA IF EXISTS awa CASCADE")
        .execute(pool)
        .await?;
    awa::migrations::run(pool).await?;
    Ok(())
}

fn params(jobs: i64) -> Result<Vec<InsertParams>> {
    (0..jobs)
        .map(|_| {
            Ok(awa::insert::params_with(
                &Noop {},
                InsertOpts {
                    queue: QUEUE.into(),
                    ..InsertOpts::default()
                },
            )?)
        })
        .collect()
}

/// The default queue storage, as the worker runtime's default builds it.
fn store() -> Result<QueueStorage> {
    Ok(QueueStorage::new(QueueStorageConfig::default())?)
}

async fn insert(pool: &PgPool, jobs: i64) -> Result<serde_json::Value> {
    let store = store()?;
    let batch = params(jobs)?;
    let started = Instant::now();
    let n = store.enqueue_params_copy(pool, &batch).await?;
    let seconds = started.elapsed().as_secs_f64();
    if n as i64 != jobs {
        return Err(format!("enqueue_params_copy queued {n} of {jobs}").into());
    }
    let counts = store.queue_counts(pool, QUEUE).await?;
    if counts.available != jobs {
        return Err(format!("{} jobs available after queuing {jobs}", counts.available).into());
    }
    Ok(json!({
        "mode": "insert",
        "api": "QueueStorage::enqueue_params_copy",
        "jobs": jobs,
        "seconds": seconds,
        "jobs_per_s": jobs as f64 / seconds,
    }))
}

async fn run(
    pool: &PgPool,
    jobs: i64,
    workers: u32,
    settings: Settings,
) -> Result<serde_json::Value> {
    let store = store()?;
    if settings.enqueue_shards != 1 {
        sqlx::query(
            "INSERT INTO awa.queue_meta (queue, enqueue_shards) VALUES ($1, $2)
             ON CONFLICT (queue) DO UPDATE SET enqueue_shards = EXCLUDED.enqueue_shards",
        )
        .bind(QUEUE)
        .bind(settings.enqueue_shards)
        .execute(pool)
        .await?;
    }
    // Queued before the clock starts, in chunks so no one COPY is huge.
    for chunk in params(jobs)?.chunks(10_000) {
        store.enqueue_params_copy(pool, chunk).await?;
    }
    sqlx::query("CHECKPOINT").execute(pool).await?;

    let handled = Arc::new(AtomicI64::new(0));
    let all_handled = Arc::new(Notify::new());
    let client = {
        let (handled, all_handled) = (handled.clone(), all_handled.clone());
        Client::builder(pool.clone())
            .queue(QUEUE, settings.queue_config(workers))
            .register::<Noop, _, _>(move |_args, _ctx: &JobContext| {
                let (handled, all_handled) = (handled.clone(), all_handled.clone());
                async move {
                    if handled.fetch_add(1, Ordering::Relaxed) + 1 == jobs {
                        all_handled.notify_one();
                    }
                    Ok::<_, JobError>(JobResult::Completed)
                }
            })
            .build()?
    };
    let started = Instant::now();
    client.start().await?;
    let deadline = Duration::from_secs(600);
    tokio::time::timeout(deadline, all_handled.notified())
        .await
        .map_err(|_| {
            format!(
                "{} of {jobs} jobs handled in 10 minutes",
                handled.load(Ordering::Relaxed)
            )
        })?;
    let to_last_handler = started.elapsed().as_secs_f64();
    // Completions are committed in batches after the handler returns: the
    // run ends when every job is durably terminal (polled only now, so the
    // polling costs the run nothing before its end). The end is the start
    // of the count that first saw them all: its snapshot is taken then, and
    // the count itself takes a while on a busy machine.
    let seconds = loop {
        let asked = started.elapsed();
        let counts = store.queue_counts(pool, QUEUE).await?;
        if counts.terminal >= jobs {
            break asked.as_secs_f64();
        }
        if asked > deadline {
            return Err(
                format!("{} of {jobs} jobs terminal in 10 minutes", counts.terminal).into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    client.shutdown(Duration::from_secs(10)).await;
    let counts = store.queue_counts(pool, QUEUE).await?;
    if counts.terminal != jobs || counts.available != 0 || counts.running != 0 {
        return Err(format!(
            "after the run: {} terminal, {} available, {} running of {jobs}",
            counts.terminal, counts.available, counts.running
        )
        .into());
    }
    Ok(json!({
        "mode": "run",
        "settings": settings,
        "workers": workers,
        "jobs": jobs,
        "seconds": seconds,
        "seconds_to_last_handler": to_last_handler,
        "jobs_per_s": jobs as f64 / seconds,
    }))
}

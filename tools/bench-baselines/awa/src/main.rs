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
//! - `prepare`: a fresh schema, the queue's enqueue shards set, then `JOBS`
//!   no-op jobs queued (COPY, in chunks of 10,000). Untimed: the bench then
//!   vacuums, analyzes and checkpoints, as it does for every contestant.
//! - `serve`: one `Client` with `MAX_WORKERS` permits on the queue, on the
//!   jobs queued; prints `ready` once started. The bench measures it by its
//!   protocol (`tools/src/bench/queue/race.rs`): for each `count` line on
//!   stdin it answers with one line, the queue's durably terminal jobs
//!   (the terminal part of `QueueStorage::queue_counts`, see [`terminal`],
//!   on a connection of its own so it never waits behind the workers). At
//!   the end of stdin it shuts down gracefully and checks that count
//!   against Awa's own exact one. `SETTINGS=default` is `QueueConfig::default()` with only
//!   `max_workers` set; `SETTINGS=best` starts from the settings Awa's docs
//!   recommend for one hot queue (see [`Settings::best`]).
//! - `insert`: `QueueStorage::enqueue_params_copy` of `JOBS` jobs in one
//!   call, the bulk path Awa's docs name as the fastest for queue storage
//!   ("for high-volume queue-storage producers, prefer
//!   `QueueStorage::enqueue_params_copy`"): once untimed (the warm-up), then
//!   on a fresh schema after a CHECKPOINT, timed.
//!
//! Environment: `DATABASE_URL`, `JOBS`, `MAX_WORKERS`, `SETTINGS`;
//! `AWA_BENCH_POLL_MS`, `AWA_BENCH_CLAIMERS`, `AWA_BENCH_CLAIM_BATCH`,
//! `AWA_BENCH_ENQUEUE_SHARDS` and `AWA_BENCH_DEADLINE_MS` override the
//! chosen set (and Awa itself reads `AWA_COMPLETION_BATCH_SIZE`,
//! `AWA_COMPLETION_FLUSH_MS`, `AWA_COMPLETION_SHARDS`).

use awa::{
    Client, InsertOpts, InsertParams, JobArgs, JobContext, JobError, JobResult, QueueConfig,
    QueueStorage, QueueStorageConfig,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use std::error::Error;
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

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
    /// Jobs in flight at most (`QueueConfig::max_workers`): a permit is
    /// held from the claim until the completion's batch commits.
    max_workers: u32,
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
            max_workers: d.max_workers,
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
            max_workers: 16,
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
        if let Some(v) = env_opt("MAX_WORKERS")? {
            s.max_workers = v as u32;
        }
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

    fn queue_config(&self) -> QueueConfig {
        QueueConfig {
            max_workers: self.max_workers,
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
    let settings = match std::env::var("SETTINGS") {
        Ok(name) => Settings::from_env(&name)?,
        Err(_) => Settings::from_env("default")?,
    };
    // The workers' claims, completions and heartbeats share it with Awa's
    // maintenance and LISTEN: room for all, as Awa's own benchmarks give.
    let pool = PgPoolOptions::new()
        .max_connections(settings.max_workers.min(64) + 8)
        .acquire_timeout(Duration::from_secs(60))
        .connect(&url)
        .await?;
    let out = match mode.as_str() {
        "prepare" => prepare(&pool, env_num("JOBS")? as i64, &settings).await?,
        "serve" => serve(&pool, &url, settings).await?,
        "insert" => insert(&pool, env_num("JOBS")? as i64).await?,
        other => {
            return Err(
                format!("usage: leasekeeper-bench-awa prepare|serve|insert, not {other:?}").into(),
            )
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
    // The warm-up: this process's connection, statements and code paths.
    fresh_schema(pool).await?;
    store.enqueue_params_copy(pool, &params(jobs)?).await?;
    fresh_schema(pool).await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
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

/// A fresh schema with `jobs` no-op jobs queued on it, the queue's enqueue
/// shards set first.
async fn prepare(pool: &PgPool, jobs: i64, settings: &Settings) -> Result<serde_json::Value> {
    fresh_schema(pool).await?;
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
    // In chunks, so no one COPY is huge.
    for chunk in params(jobs)?.chunks(10_000) {
        store.enqueue_params_copy(pool, chunk).await?;
    }
    let counts = store.queue_counts(pool, QUEUE).await?;
    if counts.available != jobs {
        return Err(format!("{} jobs available after queuing {jobs}", counts.available).into());
    }
    Ok(json!({"mode": "prepare", "jobs": jobs, "settings": settings}))
}

/// One client on the queued jobs until stdin ends, answering `count`.
async fn serve(pool: &PgPool, url: &str, settings: Settings) -> Result<serde_json::Value> {
    let store = store()?;
    // The counts' own connection: never behind the workers' pool.
    let counter = PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?;
    let client = Client::builder(pool.clone())
        .queue(QUEUE, settings.queue_config())
        .register::<Noop, _, _>(move |_args, _ctx: &JobContext| async move {
            Ok::<_, JobError>(JobResult::Completed)
        })
        .build()?;
    client.start().await?;
    // stdin is read on a thread of its own (std's blocking reader): one
    // message per line, `None` at its end.
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(Some(line)).is_err() {
                return;
            }
        }
        let _ = lines_tx.send(None);
    });
    say("ready")?;
    while let Some(Some(line)) = lines.recv().await {
        match line.trim() {
            "count" => say(&terminal(&counter).await?.to_string())?,
            other => return Err(format!("unknown request {other:?}").into()),
        }
    }
    client.shutdown(Duration::from_secs(10)).await;
    let counts = store.queue_counts(&counter, QUEUE).await?;
    let ours = terminal(&counter).await?;
    counter.close().await;
    if ours != counts.terminal {
        return Err(format!(
            "the bench's terminal count {ours} is not Awa's exact count {}",
            counts.terminal
        )
        .into());
    }
    Ok(json!({
        "mode": "serve",
        "settings": settings,
        "terminal": counts.terminal,
        "available": counts.available,
        "running": counts.running,
    }))
}

/// The queue's durably terminal jobs: the terminal part of
/// `QueueStorage::queue_counts` alone. That exact count also counts the
/// available and running jobs, by scans and anti-joins that took seconds a
/// call with 100,000 jobs queued, long enough to slow the client it
/// measures and to stretch the window; this part reads only counters and
/// one row per completion batch. `serve` checks it against
/// `queue_counts` at the end of every run, and fails if they differ.
///
/// Terminal jobs are those pruned from the live segment (the lanes' and
/// the rollups' counts, the larger of the two for completed ones, as Awa
/// deduplicates them) plus the live ones: while Awa trusts its terminal
/// counter, the folded live counts, the deltas not yet folded and the
/// compact completion batches less their tombstones; otherwise a count of
/// `terminal_jobs`.
async fn terminal(pool: &PgPool) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT ((
           SELECT COALESCE(sum(GREATEST(COALESCE(l.pruned_completed_count, 0),
                                        COALESCE(r.pruned_completed_count, 0))
                               + COALESCE(r.pruned_failed_count, 0)), 0)
             FROM (SELECT queue, priority, pruned_completed_count
                     FROM awa.queue_lanes WHERE queue = $1) l
             FULL JOIN (SELECT queue, priority, pruned_completed_count, pruned_failed_count
                          FROM awa.queue_terminal_rollups WHERE queue = $1) r
             USING (queue, priority)
         ) + CASE WHEN COALESCE((SELECT terminal_counter_trusted_at IS NOT NULL
                                   FROM awa.queue_ring_state WHERE singleton), false)
           THEN GREATEST(0,
                  COALESCE((SELECT sum(live_terminal_count)
                              FROM awa.queue_terminal_live_counts WHERE queue = $1), 0)
                + COALESCE((SELECT sum(terminal_delta)
                              FROM awa.queue_terminal_count_deltas WHERE queue = $1), 0)
                + COALESCE((SELECT sum(completed_count)
                              FROM awa.receipt_completion_batches WHERE queue = $1), 0)
                - (SELECT count(*) FROM awa.receipt_completion_tombstones WHERE queue = $1))
           ELSE (SELECT count(*) FROM awa.terminal_jobs WHERE queue = $1)
         END)::int8",
    )
    .bind(QUEUE)
    .fetch_one(pool)
    .await?)
}

/// One line on stdout, flushed at once (the bench is waiting for it).
fn say(line: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

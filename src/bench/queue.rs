//! `leasekeeper bench`: the queue suite. Every figure is measured in this
//! one run, on one fresh database in the embedded cluster (durable commits),
//! next to baselines measured the same way:
//!
//! 1. **Throughput**: tasks claimed and completed per second by 1, 4, 16 and
//!    64 workers (each a loop on its own connection calling
//!    [`tasks::claim_next`] then [`tasks::complete`], the worker loop's own
//!    calls), one task per claim; and with the batch API
//!    ([`tasks::claim_batch`] / [`tasks::complete_batch`]).
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
//! 6. **Baselines**: (a) the raw SQL ceiling: pgbench driving the very same
//!    claim and complete statements ([`tasks::claim_sql`],
//!    [`tasks::complete_sql`]) with no application code; (b) the original
//!    design's algorithm (`ORDER BY scheduled_at LIMIT 1 OFFSET n FOR
//!    UPDATE`, then a separate lease insert, in one transaction; `n` random
//!    below the worker count); (c) graphile-worker from npm processing no-op
//!    jobs on the same database.
//!
//! Every queue run starts from an emptied queue, prefilled with enough
//! tasks not to run dry, vacuumed and checkpointed, so no run pays for the
//! previous one's garbage.

use super::{
    BenchDb, BenchServer, Options, Progress, Results, Samples, fresh_database, ratio, report,
};
use crate::db::Schema;
use crate::lease::store as leases;
use crate::lease::{Holder, Resource};
use crate::live::LiveHub;
use crate::queue::store as tasks;
use crate::queue::wake::WorkSignal;
use crate::settings::Settings;
use crate::worker::run::WorkerConfig;
use anyhow::{Context, Result, bail};
use rand::Rng;
use serde_json::json;
use sqlx::{Connection, PgConnection, PgPool};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const DB: &str = "leasekeeper_bench_queue";
/// The lease every benchmark claim takes (long: no run should see expiry).
const TTL: Duration = Duration::from_secs(30);
/// Tasks per batch claim and completion.
const BATCH: usize = 100;
/// Workers claiming in batches.
const BATCH_WORKERS: usize = 4;
/// Lease clients.
const LEASE_CLIENTS: usize = 16;
/// The lease TTL of the failover runs (the worker processes heartbeat at a
/// quarter of it).
const FAILOVER_TTL: Duration = Duration::from_secs(2);
/// The graphile-worker release measured (the newest that runs on Node 20).
const GRAPHILE_VERSION: &str = "0.16.6";
const PHASES: u64 = 13;

/// How long and how much: full or `--quick`.
struct Plan {
    warmup: Duration,
    run: Duration,
    wakeups: usize,
    failovers: usize,
    graphile_jobs: i64,
    /// Rounds of the pairs whose ratio matters most (ours vs the raw SQL
    /// at 16 workers; 1,000 vs 1,000,000 queued), alternated so that a
    /// noisy moment of the machine does not land on one side only; the
    /// figures are the medians.
    rounds: usize,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Plan {
                warmup: Duration::from_millis(500),
                run: Duration::from_secs(3),
                wakeups: 60,
                failovers: 5,
                graphile_jobs: 10_000,
                rounds: 1,
            }
        } else {
            Plan {
                warmup: Duration::from_secs(2),
                run: Duration::from_secs(10),
                wakeups: 300,
                failovers: 20,
                graphile_jobs: 40_000,
                rounds: 3,
            }
        }
    }

    /// Tasks enough for `rate` tasks/s through warm-up and run, and then some.
    fn prefill(&self, rate: f64) -> i64 {
        ((self.warmup + self.run).as_secs_f64() * rate * 1.5) as i64 + 1_000
    }
}

/// Runs the queue suite and prints (and optionally writes) its results.
pub async fn suite(settings: Settings, options: Options) -> Result<()> {
    let plan = Plan::new(options.quick);
    let db = fresh_database(&settings, DB, 100).await?;
    let progress = Progress::new(PHASES);
    let result = run(&settings, &plan, &db, &progress).await;
    progress.finish();
    db.close().await?;
    report(&result?, &options)
}

async fn run(
    settings: &Settings,
    plan: &Plan,
    db: &BenchDb,
    progress: &Progress,
) -> Result<Results> {
    let pool = &db.pool;
    // The instance's announcer and LISTEN hub run throughout, as in a
    // server: our figures include announcing every change.
    let hub = LiveHub::start(pool.clone());
    let mut r = Results::new();
    seed_fencing_history(pool).await?;

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

    progress.phase("original design (OFFSET scan, separate lease insert), 16 workers");
    prepare(pool, plan.prefill(3_000.0)).await?;
    let original = drive(pool, Algo::Original, 16, plan, progress).await?;
    r.push(("original_design_w16", original.per_s));

    progress.phase("graphile-worker from npm, concurrency 16");
    let graphile = graphile_worker(&db.conninfo, plan.graphile_jobs, 16, progress).await;
    r.push(("graphile_worker_w16", graphile.unwrap_or(f64::NAN)));

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

    progress.phase("ratios");
    r.push(("w16_vs_raw_ceiling", ratio(ours16, raw)));
    r.push(("w16_vs_original_design", ratio(ours16, original.per_s)));
    r.push((
        "w16_vs_graphile_worker",
        graphile.map_or(f64::NAN, |g| ratio(ours16, g)),
    ));
    r.push(("batched_vs_w16", ratio(batched.per_s, ours16)));
    hub.shutdown();
    Ok(r)
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

/// Empties the queue (tasks, their leases and history) and queues `n`
/// tasks, then vacuums and checkpoints so the run starts clean.
/// `lease_fencing` is kept, as it is in production (it is never deleted).
async fn prepare(pool: &PgPool, n: i64) -> Result<()> {
    sqlx::query("TRUNCATE tasks, leases, lease_events")
        .execute(pool)
        .await?;
    add_tasks(pool, n).await?;
    sqlx::query("VACUUM ANALYZE tasks, leases, lease_events, lease_fencing, task_counts")
        .execute(pool)
        .await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    Ok(())
}

/// `lease_fencing` keeps the last token of every resource ever leased (one
/// row per task ever claimed), so in a running deployment it is large. On
/// a fresh database it is empty, and the planner plans the claim's token
/// lookup in it as a sequential scan; a prepared statement keeps that plan
/// until autovacuum's first ANALYZE of the table (within about a minute of
/// the first claims), and until then every claim reads the whole table:
/// measured here, half the throughput after a few seconds. The benchmark
/// measures the steady state: it seeds 100,000 rows of history first.
async fn seed_fencing_history(pool: &PgPool) -> Result<()> {
    sqlx::query(
        "INSERT INTO lease_fencing (resource, last_token)
         SELECT 'bench:history-' || g, 1 FROM generate_series(1, 100000) g
         ON CONFLICT (resource) DO NOTHING",
    )
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE lease_fencing").execute(pool).await?;
    Ok(())
}

async fn add_tasks(pool: &PgPool, n: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO tasks (task_data) SELECT '{\"sleep_duration_seconds\": 0}'::jsonb
           FROM generate_series(1, $1::bigint)",
    )
    .bind(n)
    .execute(pool)
    .await?;
    Ok(())
}

#[derive(Clone, Copy, PartialEq)]
enum Algo {
    /// `claim_next` + `complete`.
    Ours,
    /// `claim_batch` + `complete_batch`.
    Batched,
    /// The original design (see the module docs).
    Original,
}

struct Run {
    per_s: f64,
    /// Each claim's latency in ms, during the measured window.
    claims: Samples,
}

/// `workers` loops of `algo`, each on its own connection, for the plan's
/// warm-up and run; tasks claimed and completed per second over the run.
async fn drive(
    pool: &PgPool,
    algo: Algo,
    workers: usize,
    plan: &Plan,
    progress: &Progress,
) -> Result<Run> {
    let done = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let ran_dry = Arc::new(AtomicBool::new(false));
    let stop = CancellationToken::new();
    let mut handles = Vec::new();
    for w in 0..workers {
        let mut conn = pool.acquire().await?.detach();
        let (done, measuring, ran_dry, stop) = (
            done.clone(),
            measuring.clone(),
            ran_dry.clone(),
            stop.clone(),
        );
        let me = Holder::parse(format!("bench-w{w}"))?;
        handles.push(tokio::spawn(async move {
            let mut claims = Vec::new();
            while !stop.is_cancelled() {
                let started = Instant::now();
                let n = match algo {
                    Algo::Ours => match tasks::claim_next(&mut conn, &me, TTL).await? {
                        Some(task) => {
                            if measuring.load(Ordering::Relaxed) {
                                claims.push(started.elapsed().as_secs_f64() * 1000.0);
                            }
                            let token = task.fencing_token.context("a claim has a token")?;
                            tasks::complete(&mut conn, task.id, &me, token, None).await?;
                            1
                        }
                        None => 0,
                    },
                    Algo::Batched => {
                        let batch = tasks::claim_batch(&mut conn, &me, TTL, BATCH).await?;
                        let ids: Vec<(i32, i64)> = batch
                            .iter()
                            .map(|t| (t.id, t.fencing_token.unwrap_or_default()))
                            .collect();
                        let completed = tasks::complete_batch(&mut conn, &me, &ids, None).await?;
                        if completed.len() != ids.len() {
                            bail!("a batch completion was refused");
                        }
                        ids.len() as u64
                    }
                    Algo::Original => {
                        let offset = rand::rng().random_range(0..workers as i64);
                        match original_claim(&mut conn, &me, offset).await? {
                            Some((id, token)) => {
                                original_complete(&mut conn, &me, id, token).await?;
                                1
                            }
                            None => 0,
                        }
                    }
                };
                if n == 0 {
                    if algo != Algo::Original {
                        ran_dry.store(true, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                done.fetch_add(n, Ordering::Relaxed);
            }
            conn.close().await?;
            anyhow::Ok(claims)
        }));
    }
    tokio::time::sleep(plan.warmup).await;
    let (from, t0) = (done.load(Ordering::Relaxed), Instant::now());
    measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(plan.run).await;
    let (to, elapsed) = (done.load(Ordering::Relaxed), t0.elapsed());
    measuring.store(false, Ordering::Relaxed);
    stop.cancel();
    let mut claims = Vec::new();
    for h in handles {
        claims.extend(h.await??);
    }
    if ran_dry.load(Ordering::Relaxed) {
        progress.note("bench: warning: the queue ran dry during a run; its figure is low");
    }
    Ok(Run {
        per_s: ((to - from) as f64 / elapsed.as_secs_f64()).round(),
        claims: Samples(claims),
    })
}

/// The original design's claim: in one transaction, the `offset`-th pending
/// task by `scheduled_at`, locked and waited for (`FOR UPDATE`, no `SKIP
/// LOCKED`), then its lease in a separate statement, then the task row.
async fn original_claim(
    conn: &mut PgConnection,
    me: &Holder,
    offset: i64,
) -> Result<Option<(i32, i64)>> {
    let mut tx = conn.begin().await?;
    let id: Option<i32> = sqlx::query_scalar(
        "SELECT id FROM tasks WHERE status = 'pending' AND scheduled_at <= now()
          ORDER BY scheduled_at LIMIT 1 OFFSET $1 FOR UPDATE",
    )
    .bind(offset)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(id) = id else {
        tx.commit().await?;
        return Ok(None);
    };
    let token: Option<i64> = sqlx::query_scalar(
        "INSERT INTO leases AS l (resource, holder, expires_at, ttl_ms, fencing_token)
         VALUES ('task:' || $1, $2, now() + interval '30 s', 30000, 1)
         ON CONFLICT (resource) DO UPDATE
            SET holder = EXCLUDED.holder, acquired_at = now(), released_at = NULL,
                expires_at = EXCLUDED.expires_at, renew_count = 0,
                fencing_token = l.fencing_token + 1
          WHERE l.expires_at <= now()
         RETURNING fencing_token",
    )
    .bind(id)
    .bind(me.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(token) = token else {
        tx.rollback().await?;
        return Ok(None);
    };
    sqlx::query(
        "UPDATE tasks SET status = 'started', processor = $2, fencing_token = $3,
                started_at = now(), last_heartbeat_at = now(),
                must_heartbeat_before = now() + interval '30 s', attempts = attempts + 1
          WHERE id = $1",
    )
    .bind(id)
    .bind(me.as_str())
    .bind(token)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some((id, token)))
}

/// The original design's completion: the task row, then the lease release.
async fn original_complete(
    conn: &mut PgConnection,
    me: &Holder,
    id: i32,
    token: i64,
) -> Result<()> {
    let mut tx = conn.begin().await?;
    sqlx::query(
        "UPDATE tasks SET status = 'processed', processed_at = now(), must_heartbeat_before = NULL
          WHERE id = $1 AND processor = $2 AND fencing_token = $3 AND status = 'started'",
    )
    .bind(id)
    .bind(me.as_str())
    .bind(token)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE leases SET released_at = now(), expires_at = now()
          WHERE resource = 'task:' || $1 AND holder = $2 AND fencing_token = $3",
    )
    .bind(id)
    .bind(me.as_str())
    .bind(token)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The pgbench script: [`tasks::claim_sql`] for one task, then
/// [`tasks::complete_sql`] for it, with pgbench variables for the binds.
fn pgbench_script() -> String {
    let processor = "('raw-' || :client_id)";
    let claim = tasks::claim_sql(1)
        .replace("$1", processor)
        .replace("$2", "30000");
    let complete = tasks::complete_sql()
        .replace("$1::int4[]", "ARRAY[:id]::int4[]")
        .replace("$2::int8[]", "ARRAY[:fencing_token]::int8[]")
        .replace("$3", processor)
        .replace("$4", "NULL::jsonb");
    format!("{claim}\n\\gset\n{complete};\n")
}

fn pgbench_binary() -> Result<PathBuf> {
    let bin = crate::db::embedded::find_server_binaries()?.join("pgbench");
    if !bin.exists() {
        bail!(
            "pgbench is not installed next to the server ({})",
            bin.display()
        );
    }
    Ok(bin)
}

/// Tasks per second when pgbench drives the same statements with
/// `clients` connections (prepared statements, two threads) on the tables
/// in `schema`.
async fn raw_ceiling(conninfo: &str, schema: &Schema, clients: usize, plan: &Plan) -> Result<f64> {
    let script = std::env::temp_dir().join(format!("leasekeeper-bench-{}.sql", std::process::id()));
    std::fs::write(&script, pgbench_script())?;
    let seconds = (plan.warmup + plan.run).as_secs().max(1).to_string();
    let out = tokio::process::Command::new(pgbench_binary()?)
        .args([
            "-n",
            "-M",
            "prepared",
            "-j",
            "2",
            "-c",
            &clients.to_string(),
            "-T",
            &seconds,
            "-f",
        ])
        .arg(&script)
        .arg(conninfo)
        .env_remove("PGHOST")
        .env_remove("PGPORT")
        .env("PGOPTIONS", format!("-c search_path={}", schema.quoted()))
        .output()
        .await
        .context("running pgbench")?;
    let _ = std::fs::remove_file(&script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "pgbench failed: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let failed = stdout
        .lines()
        .find(|l| l.starts_with("number of failed transactions"))
        .is_some_and(|l| !l.contains(": 0 "));
    if failed {
        bail!("pgbench reported failed transactions: {stdout}");
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .map(f64::round)
        .with_context(|| format!("no tps in pgbench's output: {stdout}"))
}

/// graphile-worker's no-op jobs per second, or `None` (with a note) when
/// npm or node is unavailable or the install fails.
async fn graphile_worker(
    conninfo: &str,
    jobs: i64,
    concurrency: usize,
    progress: &Progress,
) -> Option<f64> {
    match try_graphile_worker(conninfo, jobs, concurrency).await {
        Ok(rate) => Some(rate.round()),
        Err(e) => {
            progress.note(&format!("bench: graphile-worker skipped: {e:#}"));
            None
        }
    }
}

async fn try_graphile_worker(conninfo: &str, jobs: i64, concurrency: usize) -> Result<f64> {
    let dir = Path::new("target/bench-graphile");
    std::fs::create_dir_all(dir)?;
    let package = json!({
        "private": true,
        "type": "module",
        "dependencies": {"graphile-worker": GRAPHILE_VERSION},
    });
    std::fs::write(
        dir.join("package.json"),
        serde_json::to_string_pretty(&package)?,
    )?;
    std::fs::write(dir.join("run.mjs"), include_str!("graphile.mjs"))?;
    let installed = dir.join("node_modules/graphile-worker/package.json");
    let have: Option<String> = std::fs::read_to_string(&installed)
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|v| v["version"].as_str().map(str::to_string));
    if have.as_deref() != Some(GRAPHILE_VERSION) {
        let status = tokio::time::timeout(
            Duration::from_secs(600),
            tokio::process::Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(dir)
                .stdout(std::process::Stdio::null())
                .status(),
        )
        .await
        .context("npm install took over 10 minutes")?
        .context("npm is not available")?;
        if !status.success() {
            bail!("npm install graphile-worker@{GRAPHILE_VERSION} failed ({status})");
        }
    }
    let out = tokio::time::timeout(
        Duration::from_secs(600),
        tokio::process::Command::new("node")
            .arg("run.mjs")
            .current_dir(dir)
            .env("DATABASE_URL", conninfo)
            .env("JOBS", jobs.to_string())
            .env("CONCURRENCY", concurrency.to_string())
            .output(),
    )
    .await
    .context("graphile-worker took over 10 minutes")?
    .context("node is not available")?;
    if !out.status.success() {
        bail!(
            "graphile-worker run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim().lines().last().unwrap_or(""))
        .with_context(|| format!("graphile-worker's output: {line}"))?;
    v["jobs_per_s"].as_f64().context("no jobs_per_s")
}

/// 16-worker throughput while a feeder keeps `depth` tasks queued.
async fn at_depth(pool: &PgPool, depth: i64, plan: &Plan, progress: &Progress) -> Result<f64> {
    prepare(pool, depth).await?;
    let stop = CancellationToken::new();
    let feeder = {
        let (pool, stop) = (pool.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let pending: i64 = sqlx::query_scalar("SELECT sum(pending)::int8 FROM task_counts")
                    .fetch_one(&pool)
                    .await?;
                if pending < depth {
                    add_tasks(&pool, (depth - pending).min(20_000)).await?;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            anyhow::Ok(())
        })
    };
    let run = drive(pool, Algo::Ours, 16, plan, progress).await;
    stop.cancel();
    feeder.await??;
    Ok(run?.per_s)
}

/// From the start of an enqueue to an idle worker's claim, `n` times; the
/// worker waits on a [`WorkSignal`] with a poll far longer than any sample.
async fn wakeups(pool: &PgPool, hub: &LiveHub, n: usize) -> Result<Wakeups> {
    prepare(pool, 0).await?;
    let (claimed_tx, mut claimed_rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let waiter = {
        let mut conn = pool.acquire().await?.detach();
        let mut signal = WorkSignal::new(hub);
        let stop = stop.clone();
        let me = Holder::parse("bench-idle")?;
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                while let Some(task) = tasks::claim_next(&mut conn, &me, TTL).await? {
                    let _ = claimed_tx.send(Instant::now());
                    let token = task.fencing_token.unwrap_or_default();
                    tasks::complete(&mut conn, task.id, &me, token, None).await?;
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = signal.wait(Duration::from_secs(60)) => {}
                }
            }
            anyhow::Ok(())
        })
    };
    let mut conn = pool.acquire().await?;
    let (mut from_commit, mut from_call) = (Vec::new(), Vec::new());
    for _ in 0..n {
        // Idle long enough to be waiting again (the completion's own
        // announcement has gone out too).
        tokio::time::sleep(Duration::from_millis(rand::rng().random_range(30..60))).await;
        while claimed_rx.try_recv().is_ok() {}
        let started = Instant::now();
        tasks::enqueue(&mut conn, &json!({"sleep_duration_seconds": 0}), 1, None).await?;
        let committed = Instant::now();
        let claimed = tokio::time::timeout(Duration::from_secs(10), claimed_rx.recv())
            .await
            .context("an idle worker did not claim a new task within 10 s")?
            .context("the waiting worker stopped")?;
        let ms = |from: Instant| claimed.saturating_duration_since(from).as_secs_f64() * 1000.0;
        from_commit.push(ms(committed));
        from_call.push(ms(started));
    }
    stop.cancel();
    waiter.await??;
    Ok(Wakeups {
        from_commit: Samples(from_commit),
        from_call: Samples(from_call),
    })
}

/// Wake-up latencies in ms: from the enqueue's commit (its call returned:
/// the task is visible) to the claim, and from the enqueue call's start
/// (its own commit included).
struct Wakeups {
    from_commit: Samples,
    from_call: Samples,
}

struct LeaseFigures {
    acquire: Samples,
    renew: Samples,
    renews_per_s: f64,
}

/// [`LEASE_CLIENTS`] clients: each acquires fresh resources for a third of
/// the run, then renews a lease of its own in a loop for the whole run.
async fn lease_ops(pool: &PgPool, plan: &Plan) -> Result<LeaseFigures> {
    sqlx::query("TRUNCATE leases, lease_events")
        .execute(pool)
        .await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    let phase = |d: Duration| {
        let stop = CancellationToken::new();
        let timer = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            timer.cancel();
        });
        stop
    };
    let acquiring = phase(plan.warmup + plan.run / 3);
    let mut handles = Vec::new();
    for c in 0..LEASE_CLIENTS {
        let mut conn = pool.acquire().await?.detach();
        let stop = acquiring.clone();
        let warmup = plan.warmup;
        handles.push(tokio::spawn(async move {
            let me = Holder::parse(format!("bench-c{c}"))?;
            let begun = Instant::now();
            let mut samples = Vec::new();
            let mut k = 0u64;
            while !stop.is_cancelled() {
                let resource = Resource::parse(format!("bench:c{c}-{k}"))?;
                k += 1;
                let t = Instant::now();
                leases::acquire(&mut conn, &resource, &me, TTL).await?;
                if begun.elapsed() >= warmup {
                    samples.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
            conn.close().await?;
            anyhow::Ok(samples)
        }));
    }
    let mut acquire = Vec::new();
    for h in handles {
        acquire.extend(h.await??);
    }

    let renewed = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = CancellationToken::new();
    let mut handles = Vec::new();
    for c in 0..LEASE_CLIENTS {
        let mut conn = pool.acquire().await?.detach();
        let (stop, renewed, measuring) = (stop.clone(), renewed.clone(), measuring.clone());
        handles.push(tokio::spawn(async move {
            let me = Holder::parse(format!("bench-c{c}"))?;
            let resource = Resource::parse(format!("bench:hold-{c}"))?;
            leases::acquire(&mut conn, &resource, &me, TTL).await?;
            let mut samples = Vec::new();
            while !stop.is_cancelled() {
                let t = Instant::now();
                leases::renew(&mut conn, &resource, &me, None, None).await?;
                if measuring.load(Ordering::Relaxed) {
                    samples.push(t.elapsed().as_secs_f64() * 1000.0);
                    renewed.fetch_add(1, Ordering::Relaxed);
                }
            }
            conn.close().await?;
            anyhow::Ok(samples)
        }));
    }
    tokio::time::sleep(plan.warmup).await;
    let t0 = Instant::now();
    measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(plan.run).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = t0.elapsed();
    stop.cancel();
    let mut renew = Vec::new();
    for h in handles {
        renew.extend(h.await??);
    }
    Ok(LeaseFigures {
        acquire: Samples(acquire),
        renew: Samples(renew),
        renews_per_s: renewed.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
    })
}

struct Failover {
    /// Seconds from each kill to the takeover.
    times: Samples,
    bound: Duration,
    lost: usize,
    twice: usize,
}

/// An HTTP server of this process, and three `leasekeeper worker`
/// processes: `rounds` times, one task is enqueued, its holder is killed
/// with SIGKILL once it holds it (at a random point of its heartbeat
/// cycle), and the time to the takeover is read from `lease_events`.
async fn failovers(
    settings: &Settings,
    pool: &PgPool,
    rounds: usize,
    progress: &Progress,
) -> Result<Failover> {
    prepare(pool, 0).await?;
    let mut settings = settings.clone();
    settings.lease_ttl = FAILOVER_TTL;
    settings.heartbeat_interval = FAILOVER_TTL / 4;
    let server = BenchServer::start(settings, pool, LiveHub::detached()).await?;
    let server_url = server.base.clone();
    let exe = std::env::current_exe()?;
    let spawn = |id: String| -> Result<tokio::process::Child> {
        tokio::process::Command::new(&exe)
            .args(["worker", "--server", &server_url, "--id", &id])
            .env(
                "LEASEKEEPER_LEASE_TTL_SECS",
                FAILOVER_TTL.as_secs_f64().to_string(),
            )
            .env(
                "LEASEKEEPER_HEARTBEAT_INTERVAL_SECS",
                (FAILOVER_TTL / 4).as_secs_f64().to_string(),
            )
            .env("LEASEKEEPER_CHAOS", "0")
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting a worker process")
    };
    let mut workers: Vec<(String, tokio::process::Child)> = Vec::new();
    for k in 0..3 {
        let id = format!("bench-fo-{k}");
        workers.push((id.clone(), spawn(id)?));
    }
    let mut conn = pool.acquire().await?;
    let mut times = Vec::new();
    let mut ids = Vec::new();
    let outcome: Result<()> = async {
        for round in 0..rounds {
            let task =
                tasks::enqueue(&mut conn, &json!({"sleep_duration_seconds": 1}), 5, None).await?;
            ids.push(task.id);
            let holder = wait_for(Duration::from_secs(20), || async {
                let t = tasks::get(&mut *pool.acquire().await?, task.id).await?;
                Ok(t.filter(|t| t.attempts == 1).and_then(|t| t.processor))
            })
            .await
            .context("no worker process claimed the task")?;
            // Somewhere in the holder's heartbeat cycle.
            let pause = rand::rng().random_range(0..(FAILOVER_TTL / 4).as_millis() as u64);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let idx = workers
                .iter()
                .position(|(id, _)| *id == holder)
                .with_context(|| format!("the holder {holder} is not one of ours"))?;
            let (_, mut victim) = workers.remove(idx);
            let killed_at: chrono::DateTime<chrono::Utc> =
                sqlx::query_scalar("SELECT clock_timestamp()")
                    .fetch_one(&mut *conn)
                    .await?;
            victim.start_kill()?;
            victim.wait().await?;
            let id = format!("bench-fo-r{round}");
            workers.push((id.clone(), spawn(id)?));
            let took: f64 = wait_for(Duration::from_secs(30), || async {
                Ok(sqlx::query_scalar(
                    "SELECT EXTRACT(EPOCH FROM (at - $2))::float8 FROM lease_events
                      WHERE resource = $1 AND kind = 'taken_over' ORDER BY id LIMIT 1",
                )
                .bind(format!("task:{}", task.id))
                .bind(killed_at)
                .fetch_optional(&mut *pool.acquire().await?)
                .await?)
            })
            .await
            .context("nobody took the killed worker's task over")?;
            times.push(took);
            wait_for(Duration::from_secs(20), || async {
                let t = tasks::get(&mut *pool.acquire().await?, task.id).await?;
                Ok(
                    t.filter(|t| t.status == crate::queue::TaskStatus::Processed)
                        .map(|_| ()),
                )
            })
            .await
            .context("the taken-over task was not completed")?;
            progress.note(&format!(
                "bench: failover {}/{rounds}: {took:.3} s",
                round + 1
            ));
        }
        Ok(())
    }
    .await;
    for (_, mut child) in workers {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    server.stop().await?;
    outcome?;
    // Lost: not processed. Twice: more than one accepted completion (a
    // 'released' event by the processor is what a completion writes).
    let (lost, twice): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE t.status <> 'processed'),
                count(*) FILTER (WHERE (SELECT count(*) FROM lease_events e
                                         WHERE e.resource = 'task:' || t.id
                                           AND e.kind = 'released') > 1)
           FROM tasks t WHERE t.id = ANY($1)",
    )
    .bind(&ids)
    .fetch_one(pool)
    .await?;
    let poll = WorkerConfig::new(FAILOVER_TTL, FAILOVER_TTL / 4).poll;
    Ok(Failover {
        times: Samples(times),
        bound: FAILOVER_TTL + *poll.end(),
        lost: lost as usize,
        twice: twice as usize,
    })
}

/// Polls `check` every 10 ms until it answers `Some`, for at most `limit`.
async fn wait_for<T, F, Fut>(limit: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            bail!("gave up after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pgbench_script_is_the_stores_sql_with_every_bind_replaced() {
        let script = pgbench_script();
        for n in 1..=4 {
            assert!(
                !script.contains(&format!("${n}")),
                "${n} left in:\n{script}"
            );
        }
        assert!(script.contains("FOR UPDATE SKIP LOCKED"));
        assert!(script.contains("\\gset"));
        assert!(script.contains("ARRAY[:id]::int4[]"));
        assert!(script.trim_end().ends_with(';'));
    }

    #[test]
    fn medians() {
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0]), 3.0);
    }

    #[test]
    fn quick_is_shorter_and_prefill_covers_the_run() {
        let (quick, full) = (Plan::new(true), Plan::new(false));
        assert!(quick.run < full.run && quick.failovers < full.failovers);
        assert!(full.failovers >= 20, "the issue asks for at least 20 kills");
        assert!(quick.prefill(1_000.0) as f64 > 1_000.0 * (quick.run + quick.warmup).as_secs_f64());
    }
}

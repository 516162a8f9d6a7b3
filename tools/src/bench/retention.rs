//! `leasekeeper-tools bench retention`: does retention keep the tables bounded
//! and the queue's speed flat while a million tasks pass through?
//!
//! Each run is a fresh database with the worker runtime a service embeds
//! (16 workers, no-op handler, default settings: [`super::queue`]'s
//! `fleet_w16`), fed by a producer that keeps about 20,000 tasks queued
//! (bulk inserts) until `tasks` were enqueued. The retention run also runs
//! the maintenance job ([`leasekeeper_core::maintenance`]) with a short
//! retention and interval; the baseline run, in the same invocation, does
//! not. Every second the completions are read from the counters (pruned
//! ones included); every 10 s the size (`pg_total_relation_size`) and the
//! rows of tasks, leases, lease_events and lease_fencing.
//!
//! Throughput is judged by tenths of the tasks: how long each tenth took
//! to complete; flat means the last tenth went about as fast as the first.

use super::queue::fleet::{CONCURRENCY, NOOP, noop_runtime};
use super::{Options, Progress, Results, fresh_database, ratio, report};
use anyhow::Result;
use leasekeeper::settings::Settings;
use leasekeeper_core::lease::Holder;
use leasekeeper_core::maintenance::{Maintenance, MaintenanceConfig};
use sqlx::PgPool;
use std::time::{Duration, Instant};

/// What to run.
#[derive(Clone, Debug)]
pub struct RetentionOptions {
    /// Tasks pushed through each run.
    pub tasks: u64,
    /// The retention of the pruning run.
    pub retention: Duration,
    /// Its maintenance interval.
    pub interval: Duration,
    /// Also run without retention, as the baseline.
    pub baseline: bool,
    /// Where to write the results as flat JSON.
    pub json: Option<std::path::PathBuf>,
}

/// The tables sampled.
const TABLES: [&str; 4] = ["tasks", "leases", "lease_events", "lease_fencing"];
/// Tasks kept queued by the producer.
const BACKLOG: i64 = 20_000;
/// Tasks per producer insert.
const CHUNK: i64 = 2_000;

/// The sizes of [`TABLES`] at one moment.
#[derive(Clone, Copy, Debug, Default)]
struct Sizes {
    at_s: f64,
    bytes: [i64; 4],
    rows: [i64; 4],
}

/// One run's figures.
struct RunFigures {
    /// Tasks completed per second in each tenth of the tasks.
    tenths: Vec<f64>,
    /// Seconds the whole run took.
    seconds: f64,
    /// Samples every 10 s, and one at the end.
    sizes: Vec<Sizes>,
}

/// Completions so far, pruned ones included (they only grow).
async fn completed(pool: &PgPool) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(sum(processed + pruned_processed + failed + pruned_failed), 0)::int8
           FROM task_counts",
    )
    .fetch_one(pool)
    .await?)
}

async fn sizes(pool: &PgPool, at_s: f64) -> Result<Sizes> {
    let mut s = Sizes {
        at_s,
        ..Sizes::default()
    };
    for (i, table) in TABLES.iter().enumerate() {
        s.bytes[i] = sqlx::query_scalar("SELECT pg_total_relation_size($1::regclass)")
            .bind(*table)
            .fetch_one(pool)
            .await?;
        s.rows[i] = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(pool)
            .await?;
    }
    Ok(s)
}

/// Enqueues `total` no-op tasks in bulk, keeping about [`BACKLOG`] queued.
async fn produce(pool: PgPool, total: i64) -> Result<()> {
    let mut enqueued = 0;
    while enqueued < total {
        let pending: i64 =
            sqlx::query_scalar("SELECT coalesce(sum(pending), 0)::int8 FROM task_counts")
                .fetch_one(&pool)
                .await?;
        if pending > BACKLOG {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let n = CHUNK.min(total - enqueued);
        sqlx::query(
            "INSERT INTO tasks (task_data, kind, queue)
             SELECT '{}'::jsonb, $1, 'default' FROM generate_series(1, $2)",
        )
        .bind(NOOP)
        .bind(n)
        .execute(&pool)
        .await?;
        enqueued += n;
    }
    Ok(())
}

/// The moments (seconds from the start) at which `target` completions were
/// reached, interpolated between one-second samples.
fn crossing(samples: &[(f64, i64)], target: i64) -> Option<f64> {
    let after = samples.iter().position(|(_, n)| *n >= target)?;
    if after == 0 {
        return Some(samples[0].0);
    }
    let ((t0, n0), (t1, n1)) = (samples[after - 1], samples[after]);
    Some(t0 + (t1 - t0) * (target - n0) as f64 / (n1 - n0).max(1) as f64)
}

/// Tasks per second in each tenth of `total` completions.
fn tenths(samples: &[(f64, i64)], total: i64) -> Vec<f64> {
    let mut rates = Vec::new();
    let mut last = 0.0;
    for k in 1..=10 {
        let Some(t) = crossing(samples, total * k / 10) else {
            break;
        };
        rates.push(((total / 10) as f64 / (t - last).max(1e-3)).round());
        last = t;
    }
    rates
}

async fn run(
    settings: &Settings,
    name: &str,
    options: &RetentionOptions,
    prune: bool,
    progress: &Progress,
) -> Result<RunFigures> {
    let db = fresh_database(settings, name, 8).await?;
    let pool = db.pool.clone();
    let total = i64::try_from(options.tasks)?;
    let service_pool = db.service_pool().await?;
    let runtime = noop_runtime(service_pool.clone(), "bench-retention", CONCURRENCY).await?;
    let maintenance = if prune {
        let mut config = MaintenanceConfig::new(options.retention, options.interval);
        config.retry = Duration::from_secs(1);
        Some(Maintenance::spawn(
            pool.clone(),
            Holder::parse("bench-maintenance")?,
            config,
        ))
    } else {
        None
    };
    let started = Instant::now();
    let producer = tokio::spawn(produce(pool.clone(), total));
    let mut counts = vec![(0.0, 0)];
    let mut samples = vec![sizes(&pool, 0.0).await?];
    let mut next_sizes = 10.0;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let at = started.elapsed().as_secs_f64();
        let done = completed(&pool).await?;
        counts.push((at, done));
        if at >= next_sizes {
            let s = sizes(&pool, at).await?;
            progress.note(&format!(
                "bench: {name} {at:>5.0} s: {done:>8} done; rows tasks {} leases {} lease_events {} lease_fencing {}; {:.1} MB",
                s.rows[0],
                s.rows[1],
                s.rows[2],
                s.rows[3],
                s.bytes.iter().sum::<i64>() as f64 / 1e6
            ));
            samples.push(s);
            next_sizes += 10.0;
        }
        if done >= total {
            break;
        }
        if producer.is_finished() && done < total && at > 3600.0 {
            anyhow::bail!("{name}: only {done} of {total} tasks completed in an hour");
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    producer.await??;
    runtime.shutdown().await;
    if let Some(m) = maintenance {
        m.shutdown().await;
    }
    samples.push(sizes(&pool, seconds).await?);
    service_pool.close().await;
    db.close().await?;
    Ok(RunFigures {
        tenths: tenths(&counts, total),
        seconds,
        sizes: samples,
    })
}

/// The names of [`summarize`]'s eight figures, for one run.
type Names = [&'static str; 8];

const RETENTION_NAMES: Names = [
    "retention_tasks_per_s",
    "retention_first_tenth_per_s",
    "retention_last_tenth_per_s",
    "retention_last_over_first",
    "retention_max_mb",
    "retention_end_mb",
    "retention_max_task_rows",
    "retention_max_event_rows",
];

const BASELINE_NAMES: Names = [
    "baseline_tasks_per_s",
    "baseline_first_tenth_per_s",
    "baseline_last_tenth_per_s",
    "baseline_last_over_first",
    "baseline_max_mb",
    "baseline_end_mb",
    "baseline_max_task_rows",
    "baseline_max_event_rows",
];

/// The run's mean rate, first and last tenth, their ratio, the largest and
/// the final size of the four tables together (MB), and the most rows of
/// tasks and of lease_events seen.
fn summarize(results: &mut Results, names: Names, run: &RunFigures) {
    let first = run.tenths.first().copied().unwrap_or(f64::NAN);
    let last = run.tenths.last().copied().unwrap_or(f64::NAN);
    let mean = run.tenths.iter().sum::<f64>() / run.tenths.len().max(1) as f64;
    let total_mb = |s: &Sizes| (s.bytes.iter().sum::<i64>() as f64 / 1e5).round() / 10.0;
    let max_mb = run.sizes.iter().map(total_mb).fold(0.0, f64::max);
    let end_mb = run.sizes.last().map(total_mb).unwrap_or(f64::NAN);
    let max_rows = |i: usize| run.sizes.iter().map(|s| s.rows[i]).max().unwrap_or(0) as f64;
    let values = [
        mean.round(),
        first,
        last,
        ratio(last, first),
        max_mb,
        end_mb,
        max_rows(0),
        max_rows(2),
    ];
    results.extend(names.into_iter().zip(values));
}

fn print_run(name: &str, run: &RunFigures) {
    println!("{name}: {:.0} s", run.seconds);
    let tenths: Vec<String> = run.tenths.iter().map(|r| format!("{r:.0}")).collect();
    println!("  tasks/s by tenth of the tasks: {}", tenths.join(" "));
    println!(
        "  {:>6} {:>12} {:>12} {:>12} {:>12}   (rows / MB)",
        "at s", TABLES[0], TABLES[1], TABLES[2], TABLES[3]
    );
    for s in &run.sizes {
        let cells: Vec<String> = (0..4)
            .map(|i| format!("{:>7}/{:<4.0}", s.rows[i], s.bytes[i] as f64 / 1e6))
            .collect();
        println!("  {:>6.0} {}", s.at_s, cells.join(" "));
    }
}

/// Runs the retention benchmark: with retention, then (unless told not to)
/// the same without, and prints and writes the figures.
pub async fn retention(settings: Settings, options: RetentionOptions) -> Result<()> {
    let progress = Progress::new(if options.baseline { 2 } else { 1 });
    let mut results = Results::new();
    progress.phase(&format!(
        "{} tasks with retention {:?}, maintenance every {:?}",
        options.tasks, options.retention, options.interval
    ));
    let with = run(&settings, "lk_bench_retention", &options, true, &progress).await?;
    summarize(&mut results, RETENTION_NAMES, &with);
    let without = if options.baseline {
        progress.phase(&format!("{} tasks without retention", options.tasks));
        let without = run(
            &settings,
            "lk_bench_retention_base",
            &options,
            false,
            &progress,
        )
        .await?;
        summarize(&mut results, BASELINE_NAMES, &without);
        Some(without)
    } else {
        None
    };
    progress.finish();
    print_run("with retention", &with);
    if let Some(without) = &without {
        print_run("without retention (baseline)", without);
    }
    report(
        &results,
        &Options {
            quick: false,
            json: options.json.clone(),
            charts: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenths_are_rates_between_crossings() {
        // 100 tasks: 10 a second for 5 s, then 5 a second.
        let mut samples = vec![(0.0, 0)];
        let mut n = 0;
        for t in 1..=15 {
            n += if t <= 5 { 10 } else { 5 };
            samples.push((t as f64, n.min(100)));
        }
        let rates = tenths(&samples, 100);
        assert_eq!(rates.len(), 10);
        assert_eq!(rates[0], 10.0);
        assert_eq!(rates[9], 5.0);
        assert_eq!(crossing(&samples, 1000), None);
    }
}

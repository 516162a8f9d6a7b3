//! Queue throughput: `workers` loops, each on its own connection, claiming
//! and completing as the worker loop does (one task per claim, or in
//! batches), or as the original design did; and at a given queue depth.

use super::baselines::{original_claim, original_complete};
use super::{BATCH, Plan, Progress, Samples, TTL, add_tasks, prepare};
use anyhow::{Context, Result, bail};
use leasekeeper_core::lease::Holder;
use leasekeeper_core::queue::store as tasks;
use rand::Rng;
use sqlx::{Connection, PgPool};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Algo {
    /// `claim_next` + `complete`.
    Ours,
    /// `claim_batch` + `complete_all_of`.
    Batched,
    /// The original design (see the module docs).
    Original,
}

pub(super) struct Run {
    /// Tasks claimed and completed per second.
    pub(super) per_s: f64,
    /// Each claim's latency in ms, during the measured window.
    pub(super) claims: Samples,
}

/// `workers` loops of `algo`, each on its own connection, for the plan's
/// warm-up and run; tasks claimed and completed per second over the run.
pub(super) async fn drive(
    pool: &PgPool,
    algo: Algo,
    workers: usize,
    plan: &Plan,
    progress: &Progress,
) -> Result<Run> {
    let schema = leasekeeper_core::db::Schema::of(pool);
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
        let schema = schema.clone();
        handles.push(tokio::spawn(async move {
            let mut claims = Vec::new();
            while !stop.is_cancelled() {
                let started = Instant::now();
                let n = match algo {
                    Algo::Ours => match tasks::claim_next(&mut conn, &schema, &me, TTL).await? {
                        Some(task) => {
                            if measuring.load(Ordering::Relaxed) {
                                claims.push(started.elapsed().as_secs_f64() * 1000.0);
                            }
                            let token = task.fencing_token.context("a claim has a token")?;
                            tasks::complete(&mut conn, &schema, task.id, &me, token, None).await?;
                            1
                        }
                        None => 0,
                    },
                    Algo::Batched => {
                        let batch = tasks::claim_batch(&mut conn, &schema, &me, TTL, BATCH).await?;
                        let ids: Vec<(i64, i64)> = batch
                            .iter()
                            .map(|t| (t.id, t.fencing_token.unwrap_or_default()))
                            .collect();
                        let completed =
                            tasks::complete_all_of(&mut conn, &schema, &me, &ids, None).await?;
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

/// 16-worker throughput while a feeder keeps `depth` tasks queued.
pub(super) async fn at_depth(
    pool: &PgPool,
    depth: i64,
    plan: &Plan,
    progress: &Progress,
) -> Result<f64> {
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

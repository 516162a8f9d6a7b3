//! The failover phase: `kill -9` of an HTTP worker process holding a task,
//! until another worker process takes it over; no task may be lost or
//! completed twice.

use super::{BenchServer, Progress, Samples, prepare};
use anyhow::{Context, Result, bail};
use leasekeeper::settings::Settings;
use leasekeeper_core::live::LiveHub;
use leasekeeper_core::queue::store as tasks;
use leasekeeper_core::worker::run::WorkerConfig;
use rand::Rng;
use serde_json::json;
use sqlx::PgPool;
use std::time::{Duration, Instant};

/// The lease TTL of the failover runs (the worker processes heartbeat at a
/// quarter of it).
const FAILOVER_TTL: Duration = Duration::from_secs(2);

pub(super) struct Failover {
    /// Seconds from each kill to the takeover.
    pub(super) times: Samples,
    pub(super) bound: Duration,
    pub(super) lost: usize,
    pub(super) twice: usize,
}

/// An HTTP server of this process, and three `leasekeeper worker`
/// processes: `rounds` times, one task is enqueued, its holder is killed
/// with SIGKILL once it holds it (at a random point of its heartbeat
/// cycle), and the time to the takeover is read from `lease_events`.
pub(super) async fn failovers(
    settings: &Settings,
    pool: &PgPool,
    rounds: usize,
    progress: &Progress,
) -> Result<Failover> {
    failovers_by(settings, pool, rounds, progress, Rule::Ttl).await
}

/// What ends a killed worker process's claim in a run of [`failovers_by`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Rule {
    /// Its lease running out: a server without liveness, a 2 s TTL.
    Ttl,
    /// Its session stream closing: a server with liveness (as `serve`),
    /// the default TTL (15 s), which never runs out here.
    Session,
}

/// [`failovers`] with the server and TTL of `rule`.
pub(super) async fn failovers_by(
    settings: &Settings,
    pool: &PgPool,
    rounds: usize,
    progress: &Progress,
    rule: Rule,
) -> Result<Failover> {
    let schema = &leasekeeper_core::db::Schema::of(pool);
    prepare(pool, 0).await?;
    let ttl = match rule {
        Rule::Ttl => FAILOVER_TTL,
        Rule::Session => leasekeeper_core::worker::runtime::DEFAULT_LEASE_TTL,
    };
    let mut settings = settings.clone();
    settings.lease_ttl = ttl;
    settings.heartbeat_interval = ttl / 4;
    let server = match rule {
        Rule::Ttl => BenchServer::start(settings, pool, LiveHub::detached()).await?,
        Rule::Session => BenchServer::start_vouched(settings, pool, LiveHub::detached()).await?,
    };
    let server_url = server.base.clone();
    let spawn = |id: String| -> Result<tokio::process::Child> {
        crate::dashboard_command()?
            .args(["worker", "--server", &server_url, "--id", &id])
            .env("LEASEKEEPER_LEASE_TTL_SECS", ttl.as_secs_f64().to_string())
            .env(
                "LEASEKEEPER_HEARTBEAT_INTERVAL_SECS",
                (ttl / 4).as_secs_f64().to_string(),
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
            let task = tasks::enqueue(
                &mut conn,
                schema,
                &leasekeeper_core::queue::NewTask::new(
                    leasekeeper_core::worker::simulated::KIND,
                    json!({"sleep_duration_seconds": 1}),
                )
                .max_attempts(5),
            )
            .await?;
            ids.push(task.id);
            let holder = wait_for(Duration::from_secs(20), || async {
                let t = tasks::get(&mut *pool.acquire().await?, schema, task.id).await?;
                Ok(t.filter(|t| t.attempts == 1).and_then(|t| t.processor))
            })
            .await
            .context("no worker process claimed the task")?;
            // Somewhere in the holder's heartbeat cycle (by the TTL), or in
            // its stream's keep-alive cycle (by the session).
            let cycle = match rule {
                Rule::Ttl => ttl / 4,
                Rule::Session => Duration::from_millis(200),
            };
            let pause = rand::rng().random_range(0..cycle.as_millis() as u64);
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
                let t = tasks::get(&mut *pool.acquire().await?, schema, task.id).await?;
                Ok(
                    t.filter(|t| t.status == leasekeeper_core::queue::TaskStatus::Processed)
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
    let (lost, twice) = lost_and_twice(pool, &ids).await?;
    let poll = WorkerConfig::new(ttl, ttl / 4).poll;
    Ok(Failover {
        times: Samples(times),
        bound: ttl + *poll.end(),
        lost,
        twice,
    })
}

/// Of tasks `ids`: how many were lost (not processed) and how many
/// completed twice (more than one accepted completion: a `released` event
/// is what a completion writes).
pub(super) async fn lost_and_twice(pool: &PgPool, ids: &[i64]) -> Result<(usize, usize)> {
    let (lost, twice): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE t.status <> 'processed'),
                count(*) FILTER (WHERE (SELECT count(*) FROM lease_events e
                                         WHERE e.resource = 'task:' || t.id
                                           AND e.kind = 'released') > 1)
           FROM tasks t WHERE t.id = ANY($1)",
    )
    .bind(ids)
    .fetch_one(pool)
    .await?;
    Ok((lost as usize, twice as usize))
}

/// Polls `check` every 10 ms until it answers `Some`, for at most `limit`.
pub(super) async fn wait_for<T, F, Fut>(limit: Duration, mut check: F) -> Result<T>
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

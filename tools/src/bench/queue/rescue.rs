//! The rescue phase: `kill -9` of a runtime process holding claims, at the
//! runtime's default lease TTL (15 s), until an idle runtime process
//! elsewhere takes each claim over: by the killed process's closed
//! liveness session ([`leasekeeper_core::liveness`]), not by its leases
//! running out. No task may be lost or completed twice.
//!
//! Each round: a victim process (`bench-runtime`, 16 workers, default
//! settings) claims [`HELD`] tasks of the kind [`HOLD`], queued one at a
//! time so each runs on a worker of its own (their first claim runs until
//! it is lost); once it holds them all, an idle rescuer process starts; at a
//! random point of the liveness checks' cycle the victim is killed with
//! SIGKILL, the database clock read just before; each task's time is from
//! then to its `taken_over` event (the rescuer's claim, by the database
//! clock). The rescuer completes each rescued task at once and stops. The
//! victim, up first, also holds `singleton:scheduler` (runtimes run the
//! scheduler): its move to the rescuer is timed the same way.

use super::failover::{Failover, Rule, failovers_by, lost_and_twice, wait_for};
use super::fleet::{HOLD, start_process};
use super::{BenchDb, Progress, Samples, prepare};
use crate::bench::{Details, Options, Results, fresh_database, report_with};
use anyhow::{Context, Result, bail};
use leasekeeper::settings::Settings;
use leasekeeper_core::queue::NewTask;
use leasekeeper_core::queue::store as tasks;
use leasekeeper_core::worker::runtime::DEFAULT_LEASE_TTL;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::Rng;
use serde_json::json;
use std::time::Duration;

/// Claims the victim holds when it is killed.
pub(super) const HELD: usize = 4;

pub(super) struct Rescue {
    /// Milliseconds from each kill to each of its claims' takeover.
    pub(super) times: Samples,
    pub(super) kills: usize,
    pub(super) lost: usize,
    pub(super) twice: usize,
    /// Milliseconds from each kill of a victim holding
    /// `singleton:scheduler` to the rescuer's term on it.
    pub(super) singleton_times: Samples,
    /// The same for `leasekeeper worker` processes, rescued by their
    /// closed session streams ([`worker_rescues`]).
    pub(super) workers: Option<Failover>,
}

impl Rescue {
    /// Its keys: the rescue times' p50, p99 and max in ms, the kills, the
    /// TTL that would have ruled without liveness, tasks lost and
    /// completed twice.
    pub(super) fn report(&self, r: &mut Results) {
        r.push(("rescue_p50_ms", self.times.percentile_fine(50.0)));
        r.push(("rescue_p99_ms", self.times.percentile_fine(99.0)));
        r.push(("rescue_max_ms", self.times.percentile_fine(100.0)));
        r.push(("rescue_kills", self.kills as f64));
        r.push(("rescue_ttl_s", DEFAULT_LEASE_TTL.as_secs_f64()));
        r.push(("rescue_tasks_lost", self.lost as f64));
        r.push(("rescue_tasks_completed_twice", self.twice as f64));
        if !self.singleton_times.0.is_empty() {
            r.push((
                "rescue_singleton_p50_ms",
                self.singleton_times.percentile_fine(50.0),
            ));
            r.push((
                "rescue_singleton_max_ms",
                self.singleton_times.percentile_fine(100.0),
            ));
            r.push((
                "rescue_singleton_moves",
                self.singleton_times.0.len() as f64,
            ));
        }
        if let Some(w) = &self.workers {
            r.push((
                "rescue_worker_p50_ms",
                w.times.percentile_fine(50.0) * 1000.0,
            ));
            r.push((
                "rescue_worker_p99_ms",
                w.times.percentile_fine(99.0) * 1000.0,
            ));
            r.push((
                "rescue_worker_max_ms",
                w.times.percentile_fine(100.0) * 1000.0,
            ));
            r.push(("rescue_worker_kills", w.times.0.len() as f64));
            r.push(("rescue_worker_tasks_lost", w.lost as f64));
            r.push(("rescue_worker_tasks_completed_twice", w.twice as f64));
        }
    }
}

/// `rounds` kills of a `leasekeeper worker` process holding a task, on a
/// server with liveness, at the default TTL: each task's time from the
/// kill to its takeover by another worker process, which comes from the
/// killed process's session stream closing (see
/// [`leasekeeper_core::liveness`]).
pub(super) async fn worker_rescues(
    settings: &Settings,
    db: &BenchDb,
    rounds: usize,
    progress: &Progress,
) -> Result<Failover> {
    failovers_by(settings, &db.pool, rounds, progress, Rule::Session).await
}

/// `bench rescue [--kills N] [--json PATH]`: the rescue phase alone, on a
/// fresh bench database, with the suite's keys.
pub async fn rescue_only(settings: Settings, kills: usize, options: Options) -> Result<()> {
    let db = fresh_database(&settings, super::DB, 40).await?;
    let progress = Progress::new(2);
    progress.phase(&format!(
        "rescue: kill -9 of a runtime process holding {HELD} claims at the default TTL, {kills} times"
    ));
    let result = async {
        let mut rescue = rescues(&db, kills, &progress).await?;
        progress.phase(&format!(
            "rescue: kill -9 of a worker process holding a task at the default TTL, {kills} times"
        ));
        rescue.workers = Some(worker_rescues(&settings, &db, kills, &progress).await?);
        anyhow::Ok(rescue)
    }
    .await;
    progress.finish();
    db.close().await?;
    let mut r = Results::new();
    result?.report(&mut r);
    report_with(&r, &Details::new(), &options)
}

/// Milliseconds from `killed_at` (database clock) to the first new term on
/// `resource` after it (a takeover, or an acquisition once it was ended),
/// waited for up to a minute.
async fn taken_over_after(
    pool: &sqlx::PgPool,
    resource: &str,
    killed_at: chrono::DateTime<chrono::Utc>,
) -> Result<f64> {
    wait_for(Duration::from_secs(60), || async {
        Ok(sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM (at - $2))::float8 * 1000 FROM lease_events
              WHERE resource = $1 AND kind IN ('acquired', 'taken_over') AND at > $2
              ORDER BY id LIMIT 1",
        )
        .bind(resource)
        .bind(killed_at)
        .fetch_optional(pool)
        .await?)
    })
    .await
}

/// `rounds` kills of a runtime process holding [`HELD`] claims.
pub(super) async fn rescues(db: &BenchDb, rounds: usize, progress: &Progress) -> Result<Rescue> {
    let pool = &db.pool;
    let schema = &leasekeeper_core::db::Schema::of(pool);
    prepare(pool, 0).await?;
    let settings = super::fleet::Settings::defaults();
    let mut conn = pool.acquire().await?;
    let mut times = Vec::new();
    let mut singleton_times = Vec::new();
    let mut ids = Vec::new();
    for round in 0..rounds {
        let victim_id = format!("rescue-victim-{round}");
        let mut victim = start_process(db, &victim_id, &settings).await?;
        // One at a time, each claimed before the next is queued: each goes
        // to an idle worker and runs (queued together, a batch could leave
        // one waiting in a worker's local queue, given back after a while
        // rather than rescued).
        let mut round_ids = Vec::new();
        for _ in 0..HELD {
            let task = tasks::enqueue(&mut conn, schema, &NewTask::new(HOLD, json!({}))).await?;
            wait_for(Duration::from_secs(20), || async {
                let held: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM tasks
                                     WHERE id = $1 AND status = 'started' AND processor LIKE $2 || '-%')",
                )
                .bind(task.id)
                .bind(&victim_id)
                .fetch_one(pool)
                .await?;
                Ok(held.then_some(()))
            })
            .await
            .context("the victim did not claim its task")?;
            round_ids.push(task.id);
        }
        let mut rescuer = start_process(db, &format!("rescue-rescuer-{round}"), &settings).await?;
        // The runtimes run the scheduler: the victim, up first, holds its
        // singleton, which must move to the rescuer as fast as the claims.
        let held_scheduler: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM leases
                             WHERE resource = $1 AND holder = $2
                               AND released_at IS NULL AND expires_at > now())",
        )
        .bind(leasekeeper_core::schedule::RESOURCE)
        .bind(&victim_id)
        .fetch_one(pool)
        .await?;
        // Somewhere in the liveness checks' cycle.
        let phase =
            rand::rng().random_range(0..leasekeeper_core::liveness::CHECK_EVERY.as_millis() as u64);
        tokio::time::sleep(Duration::from_millis(phase)).await;
        let killed_at: chrono::DateTime<chrono::Utc> =
            sqlx::query_scalar("SELECT clock_timestamp()")
                .fetch_one(&mut *conn)
                .await?;
        victim.start_kill()?;
        victim.wait().await?;
        for &task in &round_ids {
            let took = taken_over_after(pool, &format!("task:{task}"), killed_at)
                .await
                .context("nobody took the killed runtime's task over")?;
            times.push(took);
        }
        if held_scheduler {
            let took = taken_over_after(pool, leasekeeper_core::schedule::RESOURCE, killed_at)
                .await
                .context("nobody took the killed runtime's scheduler over")?;
            singleton_times.push(took);
        }
        wait_for(Duration::from_secs(20), || async {
            let done: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM tasks WHERE id = ANY($1) AND status = 'processed'",
            )
            .bind(&round_ids)
            .fetch_one(pool)
            .await?;
            Ok((done == HELD as i64).then_some(()))
        })
        .await
        .context("the rescued tasks were not completed")?;
        if let Some(pid) = rescuer.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
        let status = tokio::time::timeout(Duration::from_secs(60), rescuer.wait())
            .await
            .context("the rescuer did not stop within a minute of SIGTERM")??;
        if !status.success() {
            bail!("the rescuer failed ({status})");
        }
        let slowest = times[times.len() - HELD..]
            .iter()
            .copied()
            .fold(0.0, f64::max);
        progress.note(&format!(
            "bench: rescue {}/{rounds}: slowest of {HELD} claims {slowest:.0} ms",
            round + 1
        ));
        ids.extend(round_ids);
    }
    let (lost, twice) = lost_and_twice(pool, &ids).await?;
    Ok(Rescue {
        times: Samples(times),
        kills: rounds,
        lost,
        twice,
        singleton_times: Samples(singleton_times),
        workers: None,
    })
}

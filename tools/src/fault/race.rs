//! The task claim raced for real with barriers: in each round the old
//! processor's completion (even rounds) or heartbeat (odd rounds) is
//! released at the same instant as another worker's claim, just as the
//! claim's deadline runs out (0 to 12 ms after it is set, random per round).
//! Whatever the timing, never both: either the old processor's write is
//! accepted and the task is not taken over, or the takeover wins (with the
//! next fencing token) and the old write is refused and recorded. Every
//! takeover and every refusal must be in `lease_events`.

use anyhow::{Context, Result, bail, ensure};
use leasekeeper_core::lease::Holder;
use leasekeeper_core::queue::TaskStatus;
use leasekeeper_core::queue::store;
use rand::Rng;
use serde_json::json;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

const TTL: Duration = Duration::from_secs(30);

/// What the rounds came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaceReport {
    pub rounds: usize,
    /// The old holder's write was accepted; no takeover.
    pub old_won: usize,
    /// The takeover won; the old write was refused.
    pub new_won: usize,
    /// The write came after the deadline, the claim just before it.
    pub neither: usize,
    /// `taken_over` events recorded for these tasks (must equal `new_won`).
    pub takeovers_recorded: i64,
    /// `stale_write_refused` events recorded for these tasks, and how many
    /// refusals the rounds produced (must be equal).
    pub refusals_recorded: i64,
    pub refusals_expected: i64,
}

fn holder(name: &str) -> Result<Holder> {
    Holder::parse(name.to_string()).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Runs `rounds` rounds on `pool` (a database whose other tasks are all
/// finished: each round's claim must find its own task). Fails at the
/// first broken invariant, naming the round.
pub async fn run(pool: &PgPool, rounds: usize) -> Result<RaceReport> {
    let schema = &leasekeeper_core::db::Schema::of(pool);
    let mut report = RaceReport {
        rounds,
        ..RaceReport::default()
    };
    let mut ids = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let mut conn = pool.acquire().await?;
        let task = store::enqueue(
            &mut conn,
            schema,
            &leasekeeper_core::queue::NewTask::new(
                leasekeeper_core::worker::simulated::KIND,
                json!({"round": round}),
            )
            .max_attempts(5),
        )
        .await?;
        ids.push(task.id);
        let old = holder(&format!("race-old{round}"))?;
        let claimed = store::claim_next(&mut conn, schema, &old, TTL)
            .await?
            .context("the new task is not claimable")?;
        ensure!(
            claimed.id == task.id,
            "round {round}: claimed task {} instead of {}: other tasks are unfinished",
            claimed.id,
            task.id
        );
        let token = claimed.fencing_token.context("a claim without a token")?;
        // The claim runs out a few milliseconds from now, by the database clock.
        let offset_ms = rand::rng().random_range(0..=12);
        sqlx::query(
            "UPDATE tasks SET must_heartbeat_before = now() + make_interval(secs => $2::float8 / 1000)
              WHERE id = $1",
        )
        .bind(task.id)
        .bind(offset_ms)
        .execute(&mut *conn)
        .await?;
        drop(conn);

        let barrier = Arc::new(Barrier::new(2));
        let completing = round % 2 == 0;
        let write = {
            let (pool, barrier, old) = (pool.clone(), barrier.clone(), old.clone());
            tokio::spawn(async move {
                let mut conn = pool.acquire().await?;
                tokio::time::sleep(Duration::from_millis(2)).await;
                barrier.wait().await;
                anyhow::Ok(if completing {
                    store::complete(
                        &mut conn,
                        &leasekeeper_core::db::Schema::of(&pool),
                        task.id,
                        &old,
                        token,
                        None,
                    )
                    .await
                    .is_ok()
                } else {
                    store::heartbeat(
                        &mut conn,
                        &leasekeeper_core::db::Schema::of(&pool),
                        task.id,
                        &old,
                        token,
                        TTL,
                    )
                    .await
                    .is_ok()
                })
            })
        };
        let new = holder(&format!("race-new{round}"))?;
        let take = {
            let (pool, barrier, new) = (pool.clone(), barrier.clone(), new.clone());
            tokio::spawn(async move {
                let mut conn = pool.acquire().await?;
                tokio::time::sleep(Duration::from_millis(2)).await;
                barrier.wait().await;
                anyhow::Ok(
                    store::claim_next(
                        &mut conn,
                        &leasekeeper_core::db::Schema::of(&pool),
                        &new,
                        TTL,
                    )
                    .await?,
                )
            })
        };
        let accepted = write.await??;
        let taken = take.await??;
        let took = taken.as_ref().is_some_and(|t| t.id == task.id);
        ensure!(
            taken.is_none() || took,
            "round {round}: the claimer got another task"
        );
        ensure!(
            !(accepted && took),
            "round {round}: the old processor's write and the takeover both succeeded"
        );
        let mut conn = pool.acquire().await?;
        let now = store::get(&mut conn, schema, task.id)
            .await?
            .context("the task vanished")?;
        if took {
            report.new_won += 1;
            report.refusals_expected += 1;
            ensure!(
                now.fencing_token == Some(token + 1),
                "round {round}: the takeover has token {:?}, not {}",
                now.fencing_token,
                token + 1
            );
            ensure!(
                now.processor.as_deref() == Some(new.as_str()) && now.status == TaskStatus::Started,
                "round {round}: after the takeover the task is {:?} by {:?}",
                now.status,
                now.processor
            );
        } else if accepted {
            report.old_won += 1;
            let want = if completing {
                TaskStatus::Processed
            } else {
                TaskStatus::Started
            };
            ensure!(
                now.fencing_token == Some(token) && now.status == want,
                "round {round}: after the old write the task is {:?} with token {:?}",
                now.status,
                now.fencing_token
            );
        } else {
            report.neither += 1;
            report.refusals_expected += 1;
            ensure!(
                now.fencing_token == Some(token),
                "round {round}: nobody won, yet the token moved to {:?}",
                now.fencing_token
            );
        }
        // Finish the task by hand so the next round's claims see only its own.
        sqlx::query(
            "UPDATE tasks SET status = 'processed', processed_at = now(), must_heartbeat_before = NULL
              WHERE id = $1 AND status <> 'processed'",
        )
        .bind(task.id)
        .execute(&mut *conn)
        .await?;
    }
    let resources: Vec<String> = ids.iter().map(|id| format!("task:{id}")).collect();
    (report.takeovers_recorded, report.refusals_recorded) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE kind = 'taken_over'),
                count(*) FILTER (WHERE kind = 'stale_write_refused')
           FROM lease_events WHERE resource = ANY($1)",
    )
    .bind(&resources)
    .fetch_one(pool)
    .await?;
    if report.takeovers_recorded != report.new_won as i64 {
        bail!(
            "{} takeovers won but {} recorded in lease_events",
            report.new_won,
            report.takeovers_recorded
        );
    }
    if report.refusals_recorded != report.refusals_expected {
        bail!(
            "{} writes refused but {} recorded in lease_events",
            report.refusals_expected,
            report.refusals_recorded
        );
    }
    Ok(report)
}

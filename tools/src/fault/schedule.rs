//! The round's schedule: declared before the faults (a tick every second,
//! catch-up `all`), paused once it has caught up after the last fault,
//! its ticks read back and handed to [`check::schedule`] with the
//! allowance each fault gives.
//!
//! Its tasks are the workers' own kind (`sleep`, a fifth of a second): so
//! they go through the same exactly-once checks as every other task (a
//! tick's task lost or run twice is caught there too), and the queue drains
//! as before. A kind nobody claims would need excluding from those checks
//! and would leave its tasks pending forever.

use super::Timing;
use super::check::schedule::{Expected, Outage, ScheduleChecks, TickRow, check_ticks};
use super::inject::{Fault, FaultKind};
use anyhow::Result;
use chrono::{DateTime, Utc};
use leasekeeper_core::db::Schema;
use leasekeeper_core::schedule::{CatchUp, NewSchedule, store};
use serde_json::json;
use sqlx::PgPool;
use std::time::Duration;
use tokio::time::Instant;

/// The schedule's name.
pub(super) const NAME: &str = "chaos-every-second";
const CRON: &str = "* * * * * *";
const PERIOD: Duration = Duration::from_secs(1);
/// The work of each tick's task, in seconds.
const WORK_SECS: f64 = 0.2;

/// Declares the schedule; answers when it was declared (database clock).
pub(super) async fn declare(pool: &PgPool, schema: &Schema) -> Result<DateTime<Utc>> {
    let new = NewSchedule::new(NAME, CRON, leasekeeper_core::worker::simulated::KIND)
        .data(json!({ "sleep_duration_seconds": WORK_SECS }))
        .max_attempts(10)
        .catch_up(CatchUp::All);
    let (schedule, _) = store::upsert(&mut *pool.acquire().await?, schema, &new, "chaos").await?;
    Ok(schedule.created_at)
}

/// Waits (at most `patience`) until the schedule's newest tick is no older
/// than its period and a half, then pauses it; answers the database clock
/// after the pause committed (`None`: the database did not answer).
pub(super) async fn pause(
    pool: &PgPool,
    schema: &Schema,
    patience: Duration,
) -> Option<DateTime<Utc>> {
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        let caught_up: Option<bool> = sqlx::query_scalar(
            "SELECT last_tick_at >= now() - interval '1.5 seconds' FROM schedules WHERE name = $1",
        )
        .bind(NAME)
        .fetch_optional(pool)
        .await
        .ok()
        .flatten()
        .flatten();
        if caught_up == Some(true) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A PostgreSQL fault may still be playing out: try for a while.
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        let paused = async {
            let mut conn = pool.acquire().await?;
            store::set_paused(&mut conn, schema, NAME, true, "chaos").await?;
            let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
                .fetch_one(&mut *conn)
                .await?;
            anyhow::Ok(now)
        }
        .await;
        if let Ok(now) = paused {
            return Some(now);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// The allowance each database fault gives a tick that came due around it
/// (from the moment writes stopped, until the bound the harness holds every
/// process's recovery to): a PostgreSQL restart, until the recovery bound
/// after it was back; a failover, until the failover bound after the
/// primary's death (writes stopped with the standby's lag before it).
fn outages(faults: &[Fault], timing: &Timing) -> Vec<Outage> {
    let at = |ms: i64| DateTime::from_timestamp_millis(ms).unwrap_or_default();
    let ms = |d: Duration| d.as_millis() as i64;
    faults
        .iter()
        .filter_map(|f| match f.kind {
            FaultKind::RestartPostgres => {
                let down = f.down_ms.unwrap_or(0.0).round() as i64;
                Some(Outage {
                    from: at(f.db_at_ms() - down),
                    deadline: at(f.db_at_ms() + ms(timing.recovery_bound)),
                })
            }
            FaultKind::PgFailover | FaultKind::ClockSkew => Some(Outage {
                from: at(f.db_at_ms() - ms(super::STANDBY_LAG)),
                deadline: at(f.db_at_ms() + ms(timing.failover_bound)),
            }),
            _ => None,
        })
        .collect()
}

/// Reads the schedule's ticks and tasks and checks them. `paused` is when
/// the schedule was paused (`None`: it could not be, and ticks due up to
/// now are expected).
pub(super) async fn check(
    pool: &PgPool,
    declared: DateTime<Utc>,
    paused: Option<DateTime<Utc>>,
    faults: &[Fault],
    timing: &Timing,
) -> Result<ScheduleChecks> {
    type Row = (
        DateTime<Utc>,
        i64,
        DateTime<Utc>,
        i64,
        Option<i64>,
        Option<String>,
        Option<DateTime<Utc>>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT k.tick_at, k.fencing_token, k.fired_at, k.task_id, t.id, t.schedule, t.tick_at
           FROM schedule_ticks k LEFT JOIN tasks t ON t.id = k.task_id
          WHERE k.schedule = $1",
    )
    .bind(NAME)
    .fetch_all(pool)
    .await?;
    let ticks: Vec<TickRow> = rows
        .into_iter()
        .map(
            |(tick_at, fencing_token, fired_at, task_id, found, schedule, task_tick)| TickRow {
                tick_at,
                fencing_token,
                fired_at,
                task_id,
                task: found.map(|_| (schedule, task_tick)),
            },
        )
        .collect();
    let tasks: Vec<(i64, DateTime<Utc>)> =
        sqlx::query_as("SELECT id, tick_at FROM tasks WHERE schedule = $1 AND tick_at IS NOT NULL")
            .bind(NAME)
            .fetch_all(pool)
            .await?;
    let paused = match paused {
        Some(at) => at,
        None => sqlx::query_scalar("SELECT now()").fetch_one(pool).await?,
    };
    let expected = Expected {
        name: NAME.into(),
        period: chrono::Duration::from_std(PERIOD)?,
        declared,
        paused,
        bound: chrono::Duration::from_std(timing.schedule_bound)?,
        outages: outages(faults, timing),
    };
    Ok(check_ticks(&expected, &ticks, &tasks))
}

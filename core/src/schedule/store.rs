//! The schedule store: declaring, reading, pausing, triggering and
//! deleting schedules, their ticks, and the fenced firing of ticks.

use super::cron::{Cron, CronError};
use super::{CatchUp, Leader, NewSchedule, RESOURCE, Schedule, Tick, check_name};
use crate::db::Schema;
use crate::lease::Holder;
use crate::paging::{Cursor, Paged};
use crate::queue::store::{self as tasks, TaskError};
use crate::queue::{NewTask, Task, check_name as check_task_name};
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{Connection, FromRow, PgConnection};
use std::time::Duration;

/// Why a schedule operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// No schedule with that name.
    #[error("no schedule named {0:?}")]
    NotFound(String),
    /// A field the store cannot accept: the field and why.
    #[error("{field}: {reason}")]
    BadInput {
        /// The field (`cron`, `time_zone`, `name`, `kind`, ...).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Enqueueing the tick's task failed.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// The database failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

impl From<CronError> for ScheduleError {
    fn from(e: CronError) -> Self {
        ScheduleError::BadInput {
            field: e.field,
            reason: e.reason,
        }
    }
}

fn bad(field: &'static str) -> impl Fn(String) -> ScheduleError {
    move |reason| ScheduleError::BadInput { field, reason }
}

/// Checks everything of `new` and answers its parsed expression.
pub fn check(new: &NewSchedule) -> Result<Cron, ScheduleError> {
    check_name(&new.name).map_err(bad("name"))?;
    check_task_name("kind", &new.kind).map_err(bad("kind"))?;
    check_task_name("queue", &new.queue).map_err(bad("queue"))?;
    if !(1..=1000).contains(&new.max_attempts) {
        return Err(bad("max_attempts")(
            "max_attempts must be between 1 and 1000".into(),
        ));
    }
    crate::json::storable(&new.data, "data").map_err(bad("data"))?;
    Ok(Cron::parse(&new.cron, &new.time_zone)?)
}

/// A row of `schedules` with the lease's holder and the database clock.
#[derive(FromRow)]
struct Row {
    name: String,
    cron: String,
    time_zone: String,
    kind: String,
    queue: String,
    task_data: serde_json::Value,
    priority: i16,
    max_attempts: i32,
    catch_up: CatchUp,
    paused: bool,
    fire_after: DateTime<Utc>,
    last_tick_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    updated_by: Option<String>,
    leader: Option<String>,
    leader_token: Option<i64>,
    db_now: DateTime<Utc>,
}

/// The columns of [`Row`], with the scheduler's live lease joined in.
fn select() -> String {
    format!(
        "SELECT s.name, s.cron, s.time_zone, s.kind, s.queue, s.task_data, s.priority,
        s.max_attempts, s.catch_up, s.paused, s.fire_after, s.last_tick_at, s.created_at,
        s.updated_at, s.updated_by, l.holder AS leader, l.fencing_token AS leader_token,
        now() AS db_now
   FROM $schema.schedules s
   LEFT JOIN $schema.leases l
     ON l.resource = '{RESOURCE}' AND l.released_at IS NULL AND l.expires_at > now()"
    )
}

impl Row {
    /// The ticks fire after this: the newest fired, or when it was
    /// created, resumed or its expression changed.
    fn cursor(&self) -> DateTime<Utc> {
        self.last_tick_at
            .map_or(self.fire_after, |t| t.max(self.fire_after))
    }

    fn view(self) -> Schedule {
        let cron = Cron::parse(&self.cron, &self.time_zone);
        let cursor = self.cursor();
        let (cron_text, next_tick_at) = match &cron {
            Ok(c) => (
                c.describe(),
                (!self.paused)
                    .then(|| c.next_after(cursor.max(self.db_now)))
                    .flatten(),
            ),
            Err(e) => (format!("cannot be read: {e}"), None),
        };
        Schedule {
            name: self.name,
            cron: self.cron,
            cron_text,
            time_zone: self.time_zone,
            kind: self.kind,
            queue: self.queue,
            data: self.task_data,
            priority: self.priority,
            max_attempts: self.max_attempts,
            catch_up: self.catch_up,
            paused: self.paused,
            next_tick_at,
            next_tick_in_ms: next_tick_at.map(|n| (n - self.db_now).num_milliseconds()),
            last_tick_at: self.last_tick_at,
            created_at: self.created_at,
            updated_at: self.updated_at,
            updated_by: self.updated_by,
            leader: self
                .leader
                .zip(self.leader_token)
                .map(|(holder, fencing_token)| Leader {
                    holder,
                    fencing_token,
                }),
        }
    }
}

/// Declares `new` on behalf of `by`: adds it, or replaces the definition of
/// the schedule of that name (its paused state and its ticks stay; when its
/// cron or time zone changes, ticks of the old expression are not caught
/// up). Answers the schedule and whether it was added. A declaration equal
/// to the stored one changes nothing (so many replicas may declare the same
/// schedules at every start). Refuses bad input naming the field, and then
/// stores nothing.
pub async fn upsert(
    conn: &mut PgConnection,
    schema: &Schema,
    new: &NewSchedule,
    by: &str,
) -> Result<(Schedule, bool), ScheduleError> {
    check(new)?;
    crate::db::atomically!(conn, schema, async {
        let _announced = crate::live::announce_on_return(crate::live::Topics::SCHEDULES);
        let mut tx = conn.begin().await?;
        // Race prevented: replicas declaring the same schedule at once (a
        // deploy starts them together). ON CONFLICT makes the second wait for
        // the first's row and then update it (or, unchanged, leave it): one
        // row, never a duplicate-key error. The update takes the row lock a
        // firing holds, so a firing never sees half a definition.
        let changed: Option<bool> = schema
            .query_scalar(
                "INSERT INTO $schema.schedules AS s
                        (name, cron, time_zone, kind, queue, task_data, priority, max_attempts,
                         catch_up, updated_by)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                 ON CONFLICT (name) DO UPDATE
                    SET cron = EXCLUDED.cron, time_zone = EXCLUDED.time_zone, kind = EXCLUDED.kind,
                        queue = EXCLUDED.queue, task_data = EXCLUDED.task_data,
                        priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
                        catch_up = EXCLUDED.catch_up, updated_at = now(),
                        updated_by = EXCLUDED.updated_by,
                        fire_after = CASE WHEN (s.cron, s.time_zone) <> (EXCLUDED.cron, EXCLUDED.time_zone)
                                          THEN greatest(s.fire_after, now()) ELSE s.fire_after END
                  WHERE (s.cron, s.time_zone, s.kind, s.queue, s.task_data, s.priority,
                         s.max_attempts, s.catch_up)
                        IS DISTINCT FROM
                        (EXCLUDED.cron, EXCLUDED.time_zone, EXCLUDED.kind, EXCLUDED.queue,
                         EXCLUDED.task_data, EXCLUDED.priority, EXCLUDED.max_attempts,
                         EXCLUDED.catch_up)
                 RETURNING xmax = 0",
            )
            .bind(&new.name)
            .bind(&new.cron)
            .bind(&new.time_zone)
            .bind(&new.kind)
            .bind(&new.queue)
            .bind(&new.data)
            .bind(new.priority)
            .bind(new.max_attempts)
            .bind(new.catch_up)
            .bind(by)
            .fetch_optional(&mut *tx)
            .await?;
        let created = changed == Some(true);
        if changed.is_some() {
            crate::lease::store::record_operator_action(
                &mut tx,
                schema,
                &resource(&new.name),
                by,
                if created { "schedule_create" } else { "schedule_replace" },
                json!({"cron": new.cron, "time_zone": new.time_zone, "kind": new.kind}),
            )
            .await?;
        }
        let row: Row = schema
            .query_as(&format!("{} WHERE s.name = $1", select()))
            .bind(&new.name)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok((row.view(), created))
    }
    .await)
}

/// The lease-history resource an operator's change of a schedule is
/// recorded on: `schedule:<name>`.
pub fn resource(name: &str) -> String {
    format!("schedule:{name}")
}

/// The schedule `name`, if there is one.
pub async fn get(
    conn: &mut PgConnection,
    schema: &Schema,
    name: &str,
) -> Result<Option<Schedule>, ScheduleError> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<Schedule>, ScheduleError>,
        async {
            let row: Option<Row> = schema
                .query_as(&format!("{} WHERE s.name = $1", select()))
                .bind(name)
                .fetch_optional(&mut *conn)
                .await?;
            Ok(row.map(Row::view))
        }
        .await
    )
}

/// Every schedule, by name.
pub async fn list(
    conn: &mut PgConnection,
    schema: &Schema,
) -> Result<Vec<Schedule>, ScheduleError> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Vec<Schedule>, ScheduleError>,
        async {
            let rows: Vec<Row> = schema
                .query_as(&format!("{} ORDER BY s.name", select()))
                .fetch_all(&mut *conn)
                .await?;
            Ok(rows.into_iter().map(Row::view).collect())
        }
        .await
    )
}

/// Pauses (`paused`) or resumes schedule `name` on behalf of `by`. A paused
/// schedule fires nothing; resumed, it fires the ticks after the resume,
/// never those of the paused time. Pausing a paused schedule (or resuming
/// a running one) changes nothing.
pub async fn set_paused(
    conn: &mut PgConnection,
    schema: &Schema,
    name: &str,
    paused: bool,
    by: &str,
) -> Result<Schedule, ScheduleError> {
    crate::db::atomically!(conn, schema, async {
        let _announced = crate::live::announce_on_return(crate::live::Topics::SCHEDULES);
        let mut tx = conn.begin().await?;
        // Race prevented: a pause against a firing of the same schedule. The
        // firing holds the schedule's row lock for its whole transaction, so
        // the pause waits for it, and a firing that starts after the pause
        // committed sees `paused` (re-read under its lock) and fires nothing.
        // A resume moves fire_after to now in the same statement, so the
        // ticks of the paused time are never due.
        let changed: Option<String> = schema
            .query_scalar(
                "UPDATE $schema.schedules
                    SET paused = $2, updated_at = now(), updated_by = $3,
                        fire_after = CASE WHEN NOT $2 THEN greatest(fire_after, now()) ELSE fire_after END
                  WHERE name = $1 AND paused <> $2
                 RETURNING name",
            )
            .bind(name)
            .bind(paused)
            .bind(by)
            .fetch_optional(&mut *tx)
            .await?;
        if changed.is_some() {
            crate::lease::store::record_operator_action(
                &mut tx,
                schema,
                &resource(name),
                by,
                if paused { "schedule_pause" } else { "schedule_resume" },
                json!({}),
            )
            .await?;
        }
        let row: Option<Row> = schema
            .query_as(&format!("{} WHERE s.name = $1", select()))
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        row.map(Row::view)
            .ok_or_else(|| ScheduleError::NotFound(name.to_string()))
    }
    .await)
}

/// Deletes schedule `name` and its ticks on behalf of `by` (the tasks it
/// enqueued stay). A schedule declared in code comes back when a runtime
/// declaring it starts.
pub async fn delete(
    conn: &mut PgConnection,
    schema: &Schema,
    name: &str,
    by: &str,
) -> Result<(), ScheduleError> {
    crate::db::atomically!(
        conn,
        schema,
        async {
            let _announced = crate::live::announce_on_return(crate::live::Topics::SCHEDULES);
            let mut tx = conn.begin().await?;
            // Race prevented: a delete against a firing. The delete waits for
            // the firing's row lock; a firing after it finds no row to fire.
            let deleted = schema
                .query("DELETE FROM $schema.schedules WHERE name = $1")
                .bind(name)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if deleted == 0 {
                return Err(ScheduleError::NotFound(name.to_string()));
            }
            crate::lease::store::record_operator_action(
                &mut tx,
                schema,
                &resource(name),
                by,
                "schedule_delete",
                json!({}),
            )
            .await?;
            tx.commit().await?;
            Ok(())
        }
        .await
    )
}

/// Enqueues one task of schedule `name` now, on behalf of `by`: an extra
/// task (its `schedule` set, `tick_at` null), not a tick; the ticks go on
/// as before.
pub async fn trigger(
    conn: &mut PgConnection,
    schema: &Schema,
    name: &str,
    by: &str,
) -> Result<Task, ScheduleError> {
    crate::db::atomically!(
        conn,
        schema,
        async {
            let mut tx = conn.begin().await?;
            let row: Option<Row> = schema
                .query_as(&format!("{} WHERE s.name = $1", select()))
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
            let Some(row) = row else {
                return Err(ScheduleError::NotFound(name.to_string()));
            };
            let task = tasks::enqueue(&mut tx, schema, &task_of(&row, None)).await?;
            crate::lease::store::record_operator_action(
                &mut tx,
                schema,
                &resource(name),
                by,
                "schedule_trigger",
                json!({"task_id": task.id}),
            )
            .await?;
            tx.commit().await?;
            Ok(task)
        }
        .await
    )
}

/// The task a tick (or a trigger, `tick_at` `None`) of `row` enqueues.
fn task_of(row: &Row, tick_at: Option<DateTime<Utc>>) -> NewTask {
    let mut task = NewTask::new(row.kind.clone(), row.task_data.clone())
        .queue(row.queue.clone())
        .priority(row.priority)
        .max_attempts(row.max_attempts);
    task.scheduled_by = Some((row.name.clone(), tick_at));
    task
}

/// The ticks of schedule `name`, newest first, a page at a time (by tick
/// row id). `Ok(None)` when there is no such schedule.
pub async fn ticks(
    conn: &mut PgConnection,
    schema: &Schema,
    name: &str,
    cursor: Cursor,
) -> Result<Option<Paged<Tick>>, ScheduleError> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<Paged<Tick>>, ScheduleError>,
        async {
            let exists: bool = schema
                .query_scalar("SELECT EXISTS (SELECT 1 FROM $schema.schedules WHERE name = $1)")
                .bind(name)
                .fetch_one(&mut *conn)
                .await?;
            if !exists {
                return Ok(None);
            }
            let items: Vec<Tick> = schema
            .query_as(
                "SELECT id, schedule, tick_at, task_id, holder, fencing_token, fired_at, caught_up
                   FROM $schema.schedule_ticks
                  WHERE schedule = $1 AND id < $2
                  ORDER BY id DESC LIMIT $3",
            )
            .bind(name)
            .bind(cursor.bound())
            .bind(cursor.limit)
            .fetch_all(&mut *conn)
            .await?;
            Ok(Some(Paged::of(items, cursor, |t| t.id)))
        }
        .await
    )
}

/// How a holder fires: the catch-up cap and what counts as on time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirePolicy {
    /// The most missed ticks [`CatchUp::All`] fires at once.
    pub cap: usize,
    /// A tick fired later than this after it came due was missed (for
    /// [`CatchUp::None`]).
    pub on_time: Duration,
}

/// The most skipped ticks a firing counts (it looks no further back).
pub const SKIPPED_COUNTED: usize = 10_000;

/// What one firing of a schedule did.
#[derive(Clone, Debug, PartialEq)]
pub enum Fired {
    /// The holder no longer holds the scheduler's lease with that token:
    /// nothing inserted (recorded as `stale_write_refused`).
    Refused,
    /// The schedule is gone or paused, or no tick was due.
    Nothing,
    /// The ticks fired (oldest first), and how many due ticks the catch-up
    /// policy skipped.
    Ticks {
        /// The fired ticks, oldest first.
        ticks: Vec<Tick>,
        /// Due ticks not fired (the policy or the cap), counted up to
        /// [`SKIPPED_COUNTED`] past the cap.
        skipped: usize,
    },
}

/// A schedule the scheduler watches: its expression and where its ticks
/// resume.
#[derive(Clone, Debug, FromRow)]
pub struct Watched {
    /// The schedule.
    pub name: String,
    /// Its expression.
    pub cron: String,
    /// Its time zone.
    pub time_zone: String,
    /// Ticks after this fire.
    pub cursor: DateTime<Utc>,
}

/// The schedules not paused, with where their ticks resume, and the
/// database clock.
pub async fn watched(
    conn: &mut PgConnection,
    schema: &Schema,
) -> Result<(DateTime<Utc>, Vec<Watched>), ScheduleError> {
    crate::db::atomically!(
        conn,
        schema,
        Result<(DateTime<Utc>, Vec<Watched>), ScheduleError>,
        async {
            let now: DateTime<Utc> = schema
                .query_scalar("SELECT clock_timestamp()")
                .fetch_one(&mut *conn)
                .await?;
            let rows: Vec<Watched> = schema
                .query_as(
                    "SELECT name, cron, time_zone, greatest(fire_after, last_tick_at) AS cursor
                   FROM $schema.schedules WHERE NOT paused ORDER BY name",
                )
                .fetch_all(&mut *conn)
                .await?;
            Ok((now, rows))
        }
        .await
    )
}

/// Fires the due ticks of schedule `name` as `holder` in the term of
/// `token`, in one transaction: the fenced check
/// ([`fence`](crate::lease::store::fence) on `singleton:scheduler`), then
/// the schedule's row locked, the due ticks chosen by its catch-up policy,
/// their tasks enqueued, their tick rows inserted and `last_tick_at` moved
/// to the newest due tick (fired or skipped). Everything or nothing.
pub async fn fire(
    conn: &mut PgConnection,
    schema: &Schema,
    holder: &Holder,
    token: i64,
    name: &str,
    policy: FirePolicy,
) -> Result<Fired, ScheduleError> {
    crate::db::atomically!(conn, schema, async {
        let _announced = crate::live::announce_on_return(
            crate::live::Topics::SCHEDULES | crate::live::Topics::TASKS | crate::live::Topics::WORK,
        );
        let mut tx = conn.begin().await?;
        // Race prevented: a stale leader firing (see `fence`): every tick of
        // term N commits before term N+1 begins, and a holder whose term
        // ended inserts nothing.
        let Some(now) =
            crate::lease::store::fence(&mut tx, schema, RESOURCE, holder, token, "schedule_tick")
                .await?
        else {
            tx.commit().await?;
            return Ok(Fired::Refused);
        };
        // Race prevented: a tick fired twice. The row lock serializes firings
        // of one schedule (a holder's two passes, a stale and a new holder
        // that both passed their checks before a takeover committed cannot
        // both be here: the fence lock orders them) and pause, replace and
        // delete. The cursor is read under the lock, so a tick committed by
        // an earlier firing is never due again; the unique (schedule,
        // tick_at) row is the last line: a second insert of a tick fails
        // and rolls everything of this firing back.
        let row: Option<Row> = schema
            .query_as(&format!("{} WHERE s.name = $1 FOR UPDATE OF s", select()))
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row.filter(|r| !r.paused) else {
            tx.commit().await?;
            return Ok(Fired::Nothing);
        };
        let cron = Cron::parse(&row.cron, &row.time_zone)?;
        let keep = match row.catch_up {
            CatchUp::All => policy.cap.max(1),
            CatchUp::Latest | CatchUp::None => 1,
        };
        let (mut due, left_out) = cron.due(row.cursor(), now, keep);
        let Some(&newest) = due.last() else {
            tx.commit().await?;
            return Ok(Fired::Nothing);
        };
        // Due ticks the policy leaves out: older ones beyond `keep`.
        let mut skipped = if left_out {
            cron.due(row.cursor(), now, SKIPPED_COUNTED).0.len() - due.len()
        } else {
            0
        };
        let on_time = chrono::Duration::from_std(policy.on_time).unwrap_or(chrono::Duration::MAX);
        if row.catch_up == CatchUp::None && now - newest > on_time {
            skipped += due.len();
            due.clear();
        }
        let new_tasks: Vec<NewTask> = due.iter().map(|t| task_of(&row, Some(*t))).collect();
        let enqueued = tasks::enqueue_many(&mut tx, schema, &new_tasks).await?;
        let task_ids: Vec<i64> = enqueued.iter().map(|e| e.task().id).collect();
        let caught_up: Vec<bool> = due.iter().map(|t| *t != newest || now - *t > on_time).collect();
        let ticks: Vec<Tick> = schema
            .query_as(
                "INSERT INTO $schema.schedule_ticks
                        (schedule, tick_at, task_id, holder, fencing_token, fired_at, caught_up)
                 SELECT $1, t.tick_at, t.task_id, $2, $3, clock_timestamp(), t.caught_up
                   FROM unnest($4::timestamptz[], $5::int8[], $6::bool[]) AS t(tick_at, task_id, caught_up)
                 RETURNING id, schedule, tick_at, task_id, holder, fencing_token, fired_at, caught_up",
            )
            .bind(name)
            .bind(holder.as_str())
            .bind(token)
            .bind(&due)
            .bind(&task_ids)
            .bind(&caught_up)
            .fetch_all(&mut *tx)
            .await?;
        schema
            .query("UPDATE $schema.schedules SET last_tick_at = $2 WHERE name = $1")
            .bind(name)
            .bind(newest)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        for tick in &ticks {
            crate::metrics::schedule_tick(name, tick.lateness_ms(), tick.caught_up);
        }
        let mut ticks = ticks;
        ticks.sort_by_key(|t| t.tick_at);
        Ok(Fired::Ticks { ticks, skipped })
    }
    .await)
}

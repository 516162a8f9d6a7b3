//! The task store: every SQL statement that reads or changes `tasks`.
//!
//! A claim takes the task's lease (`task:<id>`) in the same transaction as
//! it marks the task started, so the task row and its lease never disagree.
//! Heartbeat, complete and fail are accepted only from the processor that
//! holds the current claim, with its fencing token, before its deadline; a
//! refused write changes nothing and is recorded in `lease_events` as
//! `stale_write_refused`, in the same transaction as the refusal.

use super::{Task, TaskStatus};
use crate::lease::store::{self as leases, LeaseError, Page};
use crate::lease::{Holder, Resource};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};
use std::time::Duration;

/// Columns of a [`Task`], with the time to its deadline computed by the
/// database clock. Usable after `SELECT` and after `RETURNING`.
pub(crate) const TASK_COLUMNS: &str = "id, task_data, scheduled_at, processor, last_heartbeat_at, \
    must_heartbeat_before, started_at, processed_at, task_output, status, attempts, max_attempts, \
    fencing_token, last_error, failed_at, created_at, \
    CASE WHEN status = 'started' \
         THEN (EXTRACT(EPOCH FROM (must_heartbeat_before - now())) * 1000)::bigint END AS heartbeat_in_ms";

/// How many candidates one claim looks at before giving up (a candidate is
/// passed over only when someone took its lease by hand through the API).
const CLAIM_CANDIDATES: usize = 8;

/// Why a task operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// No task with that id.
    #[error("no task with id {0}")]
    NotFound(i32),
    /// The write came from a processor that does not hold the current claim
    /// (wrong processor or token, lease expired, or task already finished).
    #[error("task {id}: {reason}")]
    Stale {
        /// The task.
        id: i32,
        /// Why it was refused, for the caller and the history.
        reason: String,
    },
    /// A value the store cannot accept.
    #[error("{0}")]
    BadInput(String),
    /// The task's lease could not be handled.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The database failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

impl From<TaskError> for crate::error::AppError {
    fn from(err: TaskError) -> Self {
        use crate::error::AppError;
        match err {
            TaskError::NotFound(_) => AppError::NotFound(err.to_string()),
            TaskError::Stale { .. } => AppError::Conflict(err.to_string()),
            TaskError::BadInput(msg) => AppError::BadRequest(msg),
            TaskError::Lease(e) => AppError::from(e),
            TaskError::Db(e) => AppError::from(e),
        }
    }
}

/// Exponential backoff between failed attempts: `base * 2^(attempts-1)`,
/// at most `max`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Delay after the first failure.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The delay before the next attempt after `attempts` attempts.
    pub fn delay(&self, attempts: i32) -> Duration {
        let exponent = attempts.saturating_sub(1).clamp(0, 30) as u32;
        self.base.saturating_mul(1 << exponent).min(self.max)
    }
}

fn task_resource(id: i32) -> Result<Resource, TaskError> {
    Resource::parse(Task::resource_name(id)).map_err(|e| TaskError::BadInput(e.to_string()))
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Adds a task. `delay` holds it back; `max_attempts` bounds its retries.
pub async fn enqueue(
    conn: &mut PgConnection,
    task_data: &Value,
    max_attempts: i32,
    delay: Option<Duration>,
) -> Result<Task, TaskError> {
    let _announced =
        crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
    if !(1..=1000).contains(&max_attempts) {
        return Err(TaskError::BadInput(
            "max_attempts must be between 1 and 1000".into(),
        ));
    }
    let delay_ms = millis(delay.unwrap_or_default());
    let task = sqlx::query_as(&format!(
        "INSERT INTO tasks (task_data, max_attempts, scheduled_at)
         VALUES ($1, $2, now() + make_interval(secs => $3::float8 / 1000))
         RETURNING {TASK_COLUMNS}"
    ))
    .bind(task_data)
    .bind(max_attempts)
    .bind(delay_ms)
    .fetch_one(&mut *conn)
    .await?;
    Ok(task)
}

/// A claim candidate: enough of the row to decide what to do with it.
#[derive(sqlx::FromRow)]
struct Candidate {
    id: i32,
    status: TaskStatus,
    attempts: i32,
    max_attempts: i32,
}

/// Claims the oldest claimable task for `processor`, taking its lease for
/// `ttl` in the same transaction. Late tasks (started, lease expired) are
/// taken over first, then pending ones in `scheduled_at` order. A late task
/// that has used up its attempts is marked failed instead. `None` when
/// nothing is claimable.
pub async fn claim_next(
    conn: &mut PgConnection,
    processor: &Holder,
    ttl: Duration,
) -> Result<Option<Task>, TaskError> {
    let _announced =
        crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
    let mut tx = conn.begin().await?;
    let mut passed_over: Vec<i32> = Vec::new();
    for _ in 0..CLAIM_CANDIDATES {
        // Race prevented: two workers claiming the same task. FOR UPDATE
        // locks the candidate row until commit, and SKIP LOCKED makes every
        // other claimer move on to the next row instead of queueing behind
        // it (claims never serialize, and no OFFSET scan is needed). The
        // WHERE is re-checked on the locked row version, so a task that a
        // committed transaction just finished or re-claimed is not taken.
        // Late claims first: they are older than anything pending.
        let late: Option<Candidate> = sqlx::query_as(
            "SELECT id, status, attempts, max_attempts FROM tasks
              WHERE status = 'started' AND must_heartbeat_before <= now() AND id <> ALL($1)
              ORDER BY must_heartbeat_before, id
              LIMIT 1 FOR UPDATE SKIP LOCKED",
        )
        .bind(&passed_over)
        .fetch_optional(&mut *tx)
        .await?;
        let candidate = match late {
            Some(c) => Some(c),
            None => {
                // Same race, same guard, for fresh work.
                sqlx::query_as(
                    "SELECT id, status, attempts, max_attempts FROM tasks
                      WHERE status = 'pending' AND scheduled_at <= now() AND id <> ALL($1)
                      ORDER BY scheduled_at, id
                      LIMIT 1 FOR UPDATE SKIP LOCKED",
                )
                .bind(&passed_over)
                .fetch_optional(&mut *tx)
                .await?
            }
        };
        let Some(candidate) = candidate else {
            tx.commit().await?;
            return Ok(None);
        };
        if candidate.status == TaskStatus::Started && candidate.attempts >= candidate.max_attempts {
            // Its processors kept dying: give up, visibly.
            sqlx::query(
                "UPDATE tasks SET status = 'failed', failed_at = now(), must_heartbeat_before = NULL,
                        last_error = format('lease expired on attempt %s of %s without completion',
                                            attempts, max_attempts)
                  WHERE id = $1",
            )
            .bind(candidate.id)
            .execute(&mut *tx)
            .await?;
            passed_over.push(candidate.id);
            continue;
        }
        let resource = task_resource(candidate.id)?;
        let lease = match leases::acquire(&mut tx, &resource, processor, ttl).await {
            Ok(acquired) => acquired.into_lease(),
            // Someone holds task:<id> by hand (through the lease API): leave it.
            Err(LeaseError::Held { .. }) => {
                passed_over.push(candidate.id);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let task: Task = sqlx::query_as(&format!(
            "UPDATE tasks
                SET status = 'started', processor = $2, fencing_token = $3,
                    started_at = now(), last_heartbeat_at = now(),
                    must_heartbeat_before = $4, attempts = attempts + 1
              WHERE id = $1
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(candidate.id)
        .bind(processor.as_str())
        .bind(lease.fencing_token)
        .bind(lease.expires_at)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        return Ok(Some(task));
    }
    tx.commit().await?;
    Ok(None)
}

/// Records a refused write and says why it was refused. Runs in the
/// caller's transaction, which must then commit.
async fn refuse(
    conn: &mut PgConnection,
    id: i32,
    processor: &Holder,
    token: i64,
    op: &str,
) -> Result<TaskError, TaskError> {
    let current: Option<Task> =
        sqlx::query_as(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1"))
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
    let Some(current) = current else {
        return Ok(TaskError::NotFound(id));
    };
    let reason = if current.status == TaskStatus::Processed {
        "already processed".to_string()
    } else if current.status != TaskStatus::Started {
        format!("not started (it is {})", current.status.as_str())
    } else if current.fencing_token != Some(token) {
        format!(
            "fencing token {token} is not current (the current claim has {})",
            current.fencing_token.unwrap_or_default()
        )
    } else if current.processor.as_deref() != Some(processor.as_str()) {
        format!(
            "claimed by {}, not {processor}",
            current.processor.as_deref().unwrap_or("nobody")
        )
    } else {
        "its lease expired".to_string()
    };
    sqlx::query(
        "INSERT INTO lease_events (resource, holder, fencing_token, kind, detail)
         VALUES ($1, $2, $3, 'stale_write_refused', $4)",
    )
    .bind(Task::resource_name(id))
    .bind(processor.as_str())
    .bind(token)
    .bind(json!({
        "op": op,
        "task_id": id,
        "reason": reason,
        "current_token": current.fencing_token,
        "current_processor": current.processor,
    }))
    .execute(&mut *conn)
    .await?;
    Ok(TaskError::Stale { id, reason })
}

/// The guard every processor write shares: the task is started, claimed by
/// `processor` with `token`, and its deadline has not passed.
const HOLDS_CLAIM: &str = "id = $1 AND processor = $2 AND fencing_token = $3 \
    AND status = 'started' AND must_heartbeat_before > now()";

/// Extends the claim on task `id` by `ttl` (task row and lease together).
/// Refused (and recorded) unless `processor` holds the current claim.
pub async fn heartbeat(
    conn: &mut PgConnection,
    id: i32,
    processor: &Holder,
    token: i64,
    ttl: Duration,
) -> Result<Task, TaskError> {
    let _announced =
        crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
    let mut tx = conn.begin().await?;
    // Race prevented: a heartbeat from a processor whose claim expired,
    // racing the takeover by another worker. The UPDATE locks the task row
    // and re-checks processor, token, status and deadline on the newest
    // version, so once the deadline passed or a takeover committed (new
    // token), the old processor's heartbeat changes nothing.
    let updated: Option<Task> = sqlx::query_as(&format!(
        "UPDATE tasks
            SET last_heartbeat_at = now(),
                must_heartbeat_before = now() + make_interval(secs => $4::float8 / 1000)
          WHERE {HOLDS_CLAIM}
         RETURNING {TASK_COLUMNS}"
    ))
    .bind(id)
    .bind(processor.as_str())
    .bind(token)
    .bind(millis(ttl))
    .fetch_optional(&mut *tx)
    .await?;
    let Some(task) = updated else {
        let err = refuse(&mut tx, id, processor, token, "heartbeat").await?;
        tx.commit().await?;
        return Err(err);
    };
    leases::renew(
        &mut tx,
        &task_resource(id)?,
        processor,
        Some(token),
        Some(ttl),
    )
    .await?;
    tx.commit().await?;
    Ok(task)
}

/// Completes task `id` with `output`. Accepted only from the processor that
/// holds the current claim with `token`, before its deadline; a task is
/// therefore completed at most once. The task's lease is released.
pub async fn complete(
    conn: &mut PgConnection,
    id: i32,
    processor: &Holder,
    token: i64,
    output: Option<&Value>,
) -> Result<Task, TaskError> {
    let _announced =
        crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
    let mut tx = conn.begin().await?;
    // Race prevented: a paused processor waking up and completing a task
    // that was taken over meanwhile (the "stale completion"). The UPDATE
    // locks the row and re-checks the claim on its newest version: a new
    // token, a finished task or a passed deadline means nothing is written.
    let updated: Option<Task> = sqlx::query_as(&format!(
        "UPDATE tasks
            SET status = 'processed', processed_at = now(), task_output = $4,
                must_heartbeat_before = NULL
          WHERE {HOLDS_CLAIM}
         RETURNING {TASK_COLUMNS}"
    ))
    .bind(id)
    .bind(processor.as_str())
    .bind(token)
    .bind(output)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(task) = updated else {
        let err = refuse(&mut tx, id, processor, token, "complete").await?;
        tx.commit().await?;
        return Err(err);
    };
    release_claim(&mut tx, id, processor, token).await?;
    tx.commit().await?;
    Ok(task)
}

/// Reports that an attempt at task `id` failed with `error`. The task goes
/// back to pending after the policy's backoff, or to failed once it has
/// used `max_attempts`. Accepted only from the current claim's holder.
pub async fn fail(
    conn: &mut PgConnection,
    id: i32,
    processor: &Holder,
    token: i64,
    error: &str,
    policy: RetryPolicy,
) -> Result<Task, TaskError> {
    let _announced =
        crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
    let mut tx = conn.begin().await?;
    // Race prevented: a late failure report from a processor that lost the
    // claim, which would otherwise reset a task another worker now holds.
    // Same guard as complete, re-checked on the locked row.
    let updated: Option<Task> = sqlx::query_as(&format!(
        "UPDATE tasks
            SET status = CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'pending' END,
                failed_at = CASE WHEN attempts >= max_attempts THEN now() END,
                scheduled_at = CASE WHEN attempts >= max_attempts THEN scheduled_at
                    ELSE now() + make_interval(secs =>
                        LEAST($5::float8, $4::float8 * power(2, GREATEST(attempts - 1, 0))) / 1000) END,
                must_heartbeat_before = NULL,
                last_error = $6
          WHERE {HOLDS_CLAIM}
         RETURNING {TASK_COLUMNS}"
    ))
    .bind(id)
    .bind(processor.as_str())
    .bind(token)
    .bind(millis(policy.base))
    .bind(millis(policy.max))
    .bind(error)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(task) = updated else {
        let err = refuse(&mut tx, id, processor, token, "fail").await?;
        tx.commit().await?;
        return Err(err);
    };
    release_claim(&mut tx, id, processor, token).await?;
    tx.commit().await?;
    Ok(task)
}

async fn release_claim(
    conn: &mut PgConnection,
    id: i32,
    processor: &Holder,
    token: i64,
) -> Result<(), TaskError> {
    match leases::release(conn, &task_resource(id)?, processor, Some(token)).await {
        // Already gone (released by hand): the task row decided; fine.
        Ok(_) | Err(LeaseError::NotFound(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Task `id`, if any.
pub async fn get(conn: &mut PgConnection, id: i32) -> Result<Option<Task>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1"))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await
}

/// The SQL of [`list`] (`$1` after id, `$2` limit) and of [`list_newest`]
/// (`$1` limit) for `status`.
///
/// The status is written into the statement as a literal (it comes from
/// the enum, never from input), one statement per status, rather than
/// bound as `($1 IS NULL OR status = $1)`: a prepared statement may get a
/// generic plan, and a generic plan cannot know that failed or pending
/// tasks are rare among a million processed ones; it walks the primary key
/// and filters by status, reading the whole table to find a page. With the
/// literal, the planner picks `tasks_status_id_idx (status, id)` when the
/// status is rare (tested with a million rows in `tests/it/overview.rs`).
pub fn list_sql(status: Option<TaskStatus>, newest_first: bool) -> String {
    let (by_status, and_status) = match status {
        Some(s) => (
            format!("WHERE status = '{}'", s.as_str()),
            format!("AND status = '{}'", s.as_str()),
        ),
        None => (String::new(), String::new()),
    };
    if newest_first {
        format!("SELECT {TASK_COLUMNS} FROM tasks {by_status} ORDER BY id DESC LIMIT $1")
    } else {
        format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id > $1 {and_status} ORDER BY id LIMIT $2")
    }
}

/// Tasks with `status` (all when `None`), ordered by id, one page at a time.
pub async fn list(
    conn: &mut PgConnection,
    status: Option<TaskStatus>,
    page: Page,
) -> Result<Vec<Task>, sqlx::Error> {
    sqlx::query_as(&list_sql(status, false))
        .bind(page.after_id)
        .bind(page.limit)
        .fetch_all(&mut *conn)
        .await
}

/// The newest `limit` tasks with `status` (all when `None`), newest first:
/// what the dashboard shows.
pub async fn list_newest(
    conn: &mut PgConnection,
    status: Option<TaskStatus>,
    limit: i64,
) -> Result<Vec<Task>, sqlx::Error> {
    sqlx::query_as(&list_sql(status, true))
        .bind(limit.clamp(1, Page::MAX_LIMIT))
        .fetch_all(&mut *conn)
        .await
}

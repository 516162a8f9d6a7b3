//! The task store: enqueueing, claiming, heartbeats, completion and
//! failure, and the task lists. (Operator cancel and retry are in
//! `queue::control`; retention deletes old tasks, `maintenance`.)
//!
//! A claim takes the task's lease (`task:<id>`) in the same transaction as
//! it marks the task started, so the task row and its lease never disagree.
//! Heartbeat, complete and fail are accepted only from the processor that
//! holds the current claim, with its fencing token, before its deadline; a
//! refused write changes nothing and is recorded in `lease_events` as
//! `stale_write_refused`, in the same transaction as the refusal.
//!
//! Enqueue a task, claim it, complete it; a second completion is refused:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pool = leasekeeper_core::db::testing::fresh_pool().await;
//! use leasekeeper_core::lease::Holder;
//! use leasekeeper_core::queue::store::{self, TaskError};
//! use leasekeeper_core::queue::{NewTask, TaskStatus};
//! use serde_json::json;
//! use std::time::Duration;
//!
//! let mut conn = pool.acquire().await?;
//! // A task of kind `email` in the default queue, up to 3 attempts, claimable at once.
//! let new = NewTask::new("email", json!({"to": "ada@example.com"})).max_attempts(3);
//! let task = store::enqueue(&mut conn, &new).await?;
//! assert_eq!((task.status, task.queue.as_str()), (TaskStatus::Pending, "default"));
//!
//! // A worker claims it: its lease on `task:<id>` for 30 s, with a fencing token.
//! let worker = Holder::parse("worker-1")?;
//! let ttl = Duration::from_secs(30);
//! let claimed = store::claim_next(&mut conn, &worker, ttl).await?.expect("a task is due");
//! assert_eq!((claimed.id, claimed.status), (task.id, TaskStatus::Started));
//! let token = claimed.fencing_token.expect("a claim has a token");
//!
//! // While the claim is live nobody else gets the task.
//! let other = Holder::parse("worker-2")?;
//! assert!(store::claim_next(&mut conn, &other, ttl).await?.is_none());
//!
//! // The holder completes it with its token; the task completes only once.
//! let output = json!({"sent": true});
//! let done = store::complete(&mut conn, task.id, &worker, token, Some(&output)).await?;
//! assert_eq!(done.status, TaskStatus::Processed);
//! assert_eq!(done.task_output, Some(output));
//! let again = store::complete(&mut conn, task.id, &worker, token, None).await;
//! assert!(matches!(again, Err(TaskError::Stale { .. })));
//! # Ok(())
//! # }
//! ```

use super::{ClaimFilter, NewTask, Task, TaskStatus, check_name};
use crate::lease::store::{self as leases, LeaseError, Page};
use crate::lease::{Holder, Resource};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};
use std::borrow::Cow;
use std::time::Duration;

/// Columns of a [`Task`], with the time to its deadline computed by the
/// database clock. Usable after `SELECT` and after `RETURNING`.
pub(crate) const TASK_COLUMNS: &str = "id, kind, queue, priority, task_data, scheduled_at, processor, last_heartbeat_at, \
    must_heartbeat_before, started_at, processed_at, task_output, status, attempts, max_attempts, \
    fencing_token, last_error, failed_at, cancelled_at, created_at, \
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

/// Adds `task` and answers it as stored. Refuses (with
/// [`TaskError::BadInput`]) an empty or over-long kind or queue and
/// `max_attempts` outside 1 to 1000. In the caller's transaction when
/// `conn` is one, so a service can enqueue together with its own writes.
pub async fn enqueue(conn: &mut PgConnection, task: &NewTask) -> Result<Task, TaskError> {
    let _announced =
        crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::WORK);
    if !(1..=1000).contains(&task.max_attempts) {
        return Err(TaskError::BadInput(
            "max_attempts must be between 1 and 1000".into(),
        ));
    }
    check_name("kind", &task.kind).map_err(TaskError::BadInput)?;
    check_name("queue", &task.queue).map_err(TaskError::BadInput)?;
    let delay_ms = millis(task.delay.unwrap_or_default());
    // scheduled_at is truncated to the column's milliseconds, not rounded:
    // rounded up, a task enqueued without delay was "not yet due" for up to
    // half a millisecond, and a worker woken by its announcement could find
    // nothing to claim and go back to sleep.
    let task = sqlx::query_as(&format!(
        "INSERT INTO tasks (task_data, max_attempts, scheduled_at, kind, queue, priority)
         VALUES ($1, $2, date_trunc('milliseconds', now() + make_interval(secs => $3::float8 / 1000)),
                 $4, $5, $6)
         RETURNING {TASK_COLUMNS}"
    ))
    .bind(&task.data)
    .bind(task.max_attempts)
    .bind(delay_ms)
    .bind(&task.kind)
    .bind(&task.queue)
    .bind(task.priority)
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
///
/// The common case is one statement, one round trip and one commit
/// ([`claim_batch`] with a limit of one). Only when that statement found a
/// candidate it could not claim (a late task out of attempts, or a task
/// whose lease someone holds by hand) does the claim go the careful way,
/// statement by statement.
pub async fn claim_next(
    conn: &mut PgConnection,
    processor: &Holder,
    ttl: Duration,
) -> Result<Option<Task>, TaskError> {
    claim_next_in(conn, processor, ttl, &ClaimFilter::default()).await
}

/// [`claim_next`] among the tasks `filter` lets through (one queue, and
/// some kinds or all): what a runtime serving that queue with handlers for
/// those kinds claims. Within the queue, late tasks first, then pending
/// ones by priority (lower first), then `scheduled_at`, then id.
pub async fn claim_next_in(
    conn: &mut PgConnection,
    processor: &Holder,
    ttl: Duration,
    filter: &ClaimFilter,
) -> Result<Option<Task>, TaskError> {
    let _announced =
        crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
    let batch = claim_up_to(conn, &[processor.as_str()], ttl, filter).await?;
    if let Some(task) = batch.claimed.into_iter().next() {
        return Ok(Some(task));
    }
    if batch.candidates == 0 {
        return Ok(None);
    }
    claim_carefully(conn, processor, ttl, filter).await
}

/// What one claim statement did: the tasks it claimed, and how many
/// candidates it locked (more than claimed means some need the careful path).
struct ClaimBatch {
    claimed: Vec<Task>,
    candidates: i64,
}

/// The most tasks one [`claim_batch`] may claim.
pub const MAX_BATCH: usize = 1000;

/// Claims up to `limit` claimable tasks for `processor` in one statement
/// (one round trip, one commit), each with its own lease and fencing token,
/// in the order [`claim_next`] would claim them. Candidates the statement
/// cannot claim (see [`claim_next`]) are left for it. Fewer than `limit`
/// (or none) when there is not that much work.
pub async fn claim_batch(
    conn: &mut PgConnection,
    processor: &Holder,
    ttl: Duration,
    limit: usize,
) -> Result<Vec<Task>, TaskError> {
    let _announced =
        crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
    if !(1..=MAX_BATCH).contains(&limit) {
        return Err(TaskError::BadInput(format!(
            "a batch claims 1 to {MAX_BATCH} tasks, not {limit}"
        )));
    }
    let holders = vec![processor.as_str(); limit];
    Ok(claim_up_to(conn, &holders, ttl, &ClaimFilter::default())
        .await?
        .claimed)
}

/// The one statement that claims up to `limit` tasks of queue `$3`, the
/// n-th task claimed for the n-th holder of the array `$1` (which has
/// `limit` names; one name repeated for a batch of one holder), with a
/// lease of `$2` milliseconds each (see [`claim_batch`] and
/// [`claim_for`]); with `by_kind`, only tasks whose kind is in the array
/// `$4`. Public so the benchmark can drive the very same SQL without
/// application code.
///
/// The limit is written into the statement, not bound: with a bound limit
/// PostgreSQL cannot tell a one-task claim from a thousand-task one when it
/// plans the prepared statement, finds its generic plan too dear, and plans
/// the statement anew on every claim (measured: 1,400 claims/s instead of
/// 2,600). One cached statement per batch size instead.
///
/// The kind filter is written in or left out, not bound as `($4 IS NULL OR
/// kind = ANY($4))`, for the same reason: a generic plan could not tell.
pub fn claim_sql(limit: usize, by_kind: bool) -> String {
    let kinds = if by_kind { "AND kind = ANY($4)" } else { "" };
    format!(
        "WITH late AS (
            SELECT id, attempts, max_attempts, true AS late, last_heartbeat_at AS last_seen FROM tasks
             WHERE status = 'started' AND must_heartbeat_before <= now()
               AND queue = $3 {kinds}
             ORDER BY must_heartbeat_before, id
             LIMIT {limit} FOR UPDATE SKIP LOCKED
         ), fresh AS (
            SELECT id, attempts, max_attempts, false AS late, NULL::timestamptz AS last_seen FROM tasks
             WHERE status = 'pending' AND scheduled_at <= now()
               AND queue = $3 {kinds}
               AND NOT EXISTS (SELECT 1 FROM late)
             ORDER BY priority, scheduled_at, id
             LIMIT {limit} FOR UPDATE SKIP LOCKED
         ), candidate AS (
            SELECT c.*, row_number() OVER () AS n
              FROM (SELECT * FROM late UNION ALL SELECT * FROM fresh) c
         ), holder AS (
            SELECT h.name, h.n FROM unnest($1::text[]) WITH ORDINALITY AS h(name, n)
         ), lease AS (
            INSERT INTO leases AS l (resource, holder, acquired_at, expires_at, ttl_ms, fencing_token)
            SELECT 'task:' || c.id, h.name, now(), now() + make_interval(secs => $2::float8 / 1000), $2,
                   COALESCE((SELECT f.last_token FROM lease_fencing f
                              WHERE f.resource = 'task:' || c.id), 0) + 1
              FROM candidate c JOIN holder h ON h.n = c.n
             WHERE NOT c.late OR c.attempts < c.max_attempts
             ORDER BY c.id
            ON CONFLICT (resource) DO UPDATE
               SET holder = EXCLUDED.holder, acquired_at = now(), renewed_at = NULL,
                   released_at = NULL, expires_at = EXCLUDED.expires_at,
                   ttl_ms = EXCLUDED.ttl_ms, renew_count = 0,
                   fencing_token = GREATEST(l.fencing_token, EXCLUDED.fencing_token - 1) + 1
             WHERE l.expires_at <= now()
            RETURNING resource, holder, fencing_token, expires_at
         ), claimed AS (
            UPDATE tasks t
               SET status = 'started', processor = lease.holder, fencing_token = lease.fencing_token,
                   started_at = now(), last_heartbeat_at = now(),
                   must_heartbeat_before = lease.expires_at, attempts = t.attempts + 1
              FROM candidate c JOIN lease ON lease.resource = 'task:' || c.id
             WHERE t.id = c.id
            RETURNING t.*, c.late AS took_over,
                      (EXTRACT(EPOCH FROM (now() - c.last_seen)) * 1000)::bigint AS silent_ms
         )
         SELECT n.candidates, claimed.*
           FROM (SELECT count(*) AS candidates FROM candidate) n
           LEFT JOIN (SELECT {TASK_COLUMNS}, took_over, silent_ms FROM claimed) claimed ON true
          ORDER BY claimed.must_heartbeat_before, claimed.id"
    )
}

/// What [`claim_for`] did: the tasks it claimed (each with its holder as
/// `processor`), and whether it passed over candidates it could not claim
/// in one statement (a late task out of attempts, or a task whose lease
/// someone holds by hand), which [`claim_next_in`] then handles.
#[derive(Debug, Default)]
pub struct Claimed {
    /// The tasks claimed, in deadline order.
    pub tasks: Vec<Task>,
    /// Candidates were left for the careful path.
    pub passed_over: bool,
}

/// Claims up to one task for each of `holders` (distinct names) among the
/// tasks `filter` lets through, in one statement (one round trip, one
/// commit), each task with its own lease and fencing token: what a
/// runtime's producer does for its free workers.
pub async fn claim_for(
    conn: &mut PgConnection,
    holders: &[Holder],
    ttl: Duration,
    filter: &ClaimFilter,
) -> Result<Claimed, TaskError> {
    let _announced =
        crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
    if !(1..=MAX_BATCH).contains(&holders.len()) {
        return Err(TaskError::BadInput(format!(
            "a claim is for 1 to {MAX_BATCH} holders, not {}",
            holders.len()
        )));
    }
    let names: Vec<&str> = holders.iter().map(Holder::as_str).collect();
    let batch = claim_up_to(conn, &names, ttl, filter).await?;
    Ok(Claimed {
        passed_over: batch.candidates > batch.claimed.len() as i64,
        tasks: batch.claimed,
    })
}

async fn claim_up_to(
    conn: &mut PgConnection,
    holders: &[&str],
    ttl: Duration,
    filter: &ClaimFilter,
) -> Result<ClaimBatch, TaskError> {
    let ttl_ms = leases::ttl_ms(ttl)?;
    // Races prevented, all in one statement:
    // - two workers claiming the same task: `FOR UPDATE SKIP LOCKED` locks
    //   each candidate row until commit and makes every other claimer move
    //   on to the next row instead of queueing behind it (claims never
    //   serialize; no OFFSET scan). PostgreSQL re-checks the WHERE on the
    //   locked row's newest version, so a task that a committed transaction
    //   just finished or re-claimed is not taken.
    // - a takeover racing the old holder's heartbeat or completion: a late
    //   task's row is locked here, and their UPDATEs re-check the deadline
    //   and token on the newest version (see `HOLDS_CLAIM`).
    // - two terms of one task lease: the lease upsert below is the lease
    //   store's acquire (`ON CONFLICT ... WHERE l.expires_at <= now()`,
    //   re-checked under the row lock), so a live lease held by hand is
    //   left alone; its candidate is counted but not claimed.
    // Late claims go first (they are older than anything pending); pending
    // tasks are looked at only when no late one is.
    let sql = claim_sql(holders.len().clamp(1, MAX_BATCH), filter.kinds.is_some());
    for attempt in 0.. {
        let mut query = sqlx::query(&sql)
            .bind(holders)
            .bind(ttl_ms)
            .bind(&filter.queue);
        if let Some(kinds) = &filter.kinds {
            query = query.bind(kinds);
        }
        let rows = query.fetch_all(&mut *conn).await;
        match rows {
            Ok(rows) => {
                use sqlx::Row;
                // Always one row at least: the count, and no task when
                // nothing was claimed.
                let candidates = match rows.first() {
                    Some(row) => row.try_get("candidates")?,
                    None => 0,
                };
                let mut claimed = Vec::with_capacity(rows.len());
                for row in &rows {
                    if row.try_get::<Option<i32>, _>("id")?.is_some() {
                        claimed.push(<Task as sqlx::FromRow<_>>::from_row(row)?);
                        if row.try_get::<Option<bool>, _>("took_over")? == Some(true) {
                            crate::metrics::took_over(
                                row.try_get::<Option<i64>, _>("silent_ms")?.unwrap_or(0),
                            );
                        }
                    }
                }
                crate::metrics::claimed(claimed.len());
                return Ok(ClaimBatch {
                    claimed,
                    candidates,
                });
            }
            // The fencing-token guard (see the leases migration) refused a
            // token computed from an old snapshot: run it again.
            Err(e) if leases::is_serialization_failure(&e) && attempt < 5 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    unreachable!("the loop only ends by returning")
}

/// The careful claim: candidate by candidate, in one transaction, failing
/// late tasks that are out of attempts and passing over tasks whose lease
/// is held by hand.
async fn claim_carefully(
    conn: &mut PgConnection,
    processor: &Holder,
    ttl: Duration,
    filter: &ClaimFilter,
) -> Result<Option<Task>, TaskError> {
    // An absent kind filter is every kind: NULL makes the condition true.
    let kinds = filter.kinds.as_deref();
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
                AND queue = $2 AND ($3::text[] IS NULL OR kind = ANY($3))
              ORDER BY must_heartbeat_before, id
              LIMIT 1 FOR UPDATE SKIP LOCKED",
        )
        .bind(&passed_over)
        .bind(&filter.queue)
        .bind(kinds)
        .fetch_optional(&mut *tx)
        .await?;
        let candidate = match late {
            Some(c) => Some(c),
            None => {
                // Same race, same guard, for fresh work.
                sqlx::query_as(
                    "SELECT id, status, attempts, max_attempts FROM tasks
                      WHERE status = 'pending' AND scheduled_at <= now() AND id <> ALL($1)
                        AND queue = $2 AND ($3::text[] IS NULL OR kind = ANY($3))
                      ORDER BY priority, scheduled_at, id
                      LIMIT 1 FOR UPDATE SKIP LOCKED",
                )
                .bind(&passed_over)
                .bind(&filter.queue)
                .bind(kinds)
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
        // (A takeover here was counted by the lease store's acquire.)
        crate::metrics::claimed(1);
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
    crate::metrics::refused();
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

/// Extends many claims at once, each `(task id, fencing token, processor)`,
/// by `ttl` (task row and lease together): one statement, one commit, what
/// a runtime's heartbeats of all its tasks cost. Answers each claim's
/// outcome, in their order: the task with its new deadline, or why it was
/// refused, each refusal recorded like a refused [`heartbeat`].
pub async fn heartbeat_each(
    conn: &mut PgConnection,
    beats: &[(i32, i64, Holder)],
    ttl: Duration,
) -> Result<Vec<Result<Task, TaskError>>, TaskError> {
    let _announced =
        crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
    if beats.len() > MAX_BATCH {
        return Err(TaskError::BadInput(format!(
            "a batch heartbeats at most {MAX_BATCH} claims, not {}",
            beats.len()
        )));
    }
    let mut ordered: Vec<&(i32, i64, Holder)> = beats.iter().collect();
    ordered.sort_unstable_by_key(|b| (b.0, b.1));
    let ids: Vec<i32> = ordered.iter().map(|b| b.0).collect();
    let tokens: Vec<i64> = ordered.iter().map(|b| b.1).collect();
    let processors: Vec<&str> = ordered.iter().map(|b| b.2.as_str()).collect();
    // Race prevented: heartbeats from processors whose claims expired,
    // racing takeovers by other workers (as `heartbeat`, for many claims).
    // The UPDATE locks each task row (in id order: two batches never
    // deadlock) and re-checks processor, token, status and deadline on its
    // newest version; the lease of a term is renewed only with its task
    // row, under the same holder and token, and only while it is live.
    let started = std::time::Instant::now();
    let renewed: Vec<Task> = sqlx::query_as(&format!(
        "WITH beat AS (
            SELECT * FROM unnest($1::int4[], $2::int8[], $3::text[]) AS b(id, token, processor)
         ), renewed AS (
            UPDATE tasks t
               SET last_heartbeat_at = now(),
                   must_heartbeat_before = now() + make_interval(secs => $4::float8 / 1000)
              FROM beat
             WHERE t.id = beat.id AND t.processor = beat.processor AND t.fencing_token = beat.token
               AND t.status = 'started' AND t.must_heartbeat_before > now()
            RETURNING t.*
         ), lease AS (
            UPDATE leases l
               SET renewed_at = now(), ttl_ms = $4,
                   expires_at = now() + make_interval(secs => $4::float8 / 1000),
                   renew_count = l.renew_count + 1
              FROM renewed
             WHERE l.resource = 'task:' || renewed.id AND l.holder = renewed.processor
               AND l.fencing_token = renewed.fencing_token
               AND l.released_at IS NULL AND l.expires_at > now()
         )
         SELECT {TASK_COLUMNS} FROM renewed ORDER BY id"
    ))
    .bind(&ids)
    .bind(&tokens)
    .bind(&processors)
    .bind(millis(ttl))
    .fetch_all(&mut *conn)
    .await?;
    crate::metrics::renewed(started.elapsed(), renewed.len());
    let mut accepted: std::collections::HashMap<(i32, i64), Task> = renewed
        .into_iter()
        .map(|t| ((t.id, t.fencing_token.unwrap_or_default()), t))
        .collect();
    let mut outcomes = Vec::with_capacity(beats.len());
    for (id, token, processor) in beats {
        outcomes.push(match accepted.remove(&(*id, *token)) {
            Some(task) => Ok(task),
            None => Err(refuse_alone(conn, *id, processor, *token, "heartbeat").await?),
        });
    }
    Ok(outcomes)
}

/// Completes task `id` with `output`. Accepted only from the processor that
/// holds the current claim with `token`, before its deadline; a task is
/// therefore completed at most once. The task's lease is released. One
/// statement (one round trip, one commit) when accepted.
pub async fn complete(
    conn: &mut PgConnection,
    id: i32,
    processor: &Holder,
    token: i64,
    output: Option<&Value>,
) -> Result<Task, TaskError> {
    let _announced =
        crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
    let done = complete_claims(
        conn,
        &[Completion::new(
            id,
            token,
            processor.clone(),
            output.cloned(),
        )],
    )
    .await?;
    if let Some(task) = done.into_iter().next() {
        return Ok(task);
    }
    Err(refuse_alone(conn, id, processor, token, "complete").await?)
}

/// Completes many claims of `processor` at once, each `(task id, fencing
/// token)`, all with `output`: one statement, one commit. Answers the
/// tasks completed; each claim that was not current is refused and
/// recorded like a refused [`complete`], and left out of the answer.
pub async fn complete_batch(
    conn: &mut PgConnection,
    processor: &Holder,
    claims: &[(i32, i64)],
    output: Option<&Value>,
) -> Result<Vec<Task>, TaskError> {
    let each: Vec<Completion> = claims
        .iter()
        .map(|&(id, token)| Completion::new(id, token, processor.clone(), output.cloned()))
        .collect();
    Ok(complete_each(conn, &each)
        .await?
        .into_iter()
        .filter_map(Result::ok)
        .collect())
}

/// One completion of [`complete_each`]: task `id` of `processor`'s claim
/// with fencing token `token`, and its output.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The task.
    pub id: i32,
    /// The claim's fencing token.
    pub token: i64,
    /// Who claimed it.
    pub processor: Holder,
    /// What the task produced (`task_output`).
    pub output: Option<Value>,
}

impl Completion {
    /// Task `id`, completed by `processor` with `token` and `output`.
    pub fn new(id: i32, token: i64, processor: Holder, output: Option<Value>) -> Self {
        Completion {
            id,
            token,
            processor,
            output,
        }
    }
}

/// Completes each of `completions` (of any processors, with outputs of
/// their own) in one statement and one commit: what a runtime's completer
/// writes. Answers each completion's outcome, in their order: the task
/// completed, or why it was refused (stale token, lost lease, finished
/// task), each refusal recorded like a refused [`complete`].
pub async fn complete_each(
    conn: &mut PgConnection,
    completions: &[Completion],
) -> Result<Vec<Result<Task, TaskError>>, TaskError> {
    let _announced =
        crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
    if completions.len() > MAX_BATCH {
        return Err(TaskError::BadInput(format!(
            "a batch completes at most {MAX_BATCH} tasks, not {}",
            completions.len()
        )));
    }
    let done = complete_claims(conn, completions).await?;
    let mut accepted: std::collections::HashMap<(i32, i64), Task> = done
        .into_iter()
        .map(|t| ((t.id, t.fencing_token.unwrap_or_default()), t))
        .collect();
    let mut outcomes = Vec::with_capacity(completions.len());
    for c in completions {
        outcomes.push(match accepted.remove(&(c.id, c.token)) {
            Some(task) => Ok(task),
            None => Err(refuse_alone(conn, c.id, &c.processor, c.token, "complete").await?),
        });
    }
    Ok(outcomes)
}

/// The one statement that completes the claims `($1 ids, $2 tokens, $3
/// processors)` with outputs `$4` (see [`complete_each`]); public so the
/// benchmark can drive the very same SQL without application code.
pub fn complete_sql() -> String {
    complete_sql_at("now()")
}

/// [`complete_sql`] judging the deadline by `clock`: `now()` (the
/// transaction's start, which for a one-statement transaction is the
/// statement's) or `statement_timestamp()` for a transaction that began
/// earlier (see [`FencedTransaction`]).
fn complete_sql_at(clock: &str) -> String {
    format!(
        "WITH claim AS (
            SELECT * FROM unnest($1::int4[], $2::int8[], $3::text[], $4::jsonb[])
                       AS c(id, token, processor, output)
         ), done AS (
            UPDATE tasks t
               SET status = 'processed', processed_at = {clock}, task_output = claim.output,
                   must_heartbeat_before = NULL
              FROM claim
             WHERE t.id = claim.id AND t.fencing_token = claim.token AND t.processor = claim.processor
               AND t.status = 'started' AND t.must_heartbeat_before > {clock}
            RETURNING t.*
         ), released AS (
            UPDATE leases l
               SET released_at = {clock}, expires_at = date_trunc('milliseconds', {clock})
              FROM done
             WHERE l.resource = 'task:' || done.id AND l.holder = done.processor
               AND l.fencing_token = done.fencing_token
               AND l.released_at IS NULL AND l.expires_at > {clock}
         )
         SELECT {TASK_COLUMNS} FROM done ORDER BY id"
    )
}

/// The columns of `completions` as the arrays [`complete_sql`] binds, in
/// task id order.
fn completion_arrays(
    completions: &[Completion],
) -> (Vec<i32>, Vec<i64>, Vec<String>, Vec<Option<Value>>) {
    let mut ordered: Vec<&Completion> = completions.iter().collect();
    ordered.sort_unstable_by_key(|c| (c.id, c.token));
    let mut arrays = (
        Vec::with_capacity(ordered.len()),
        Vec::with_capacity(ordered.len()),
        Vec::with_capacity(ordered.len()),
        Vec::with_capacity(ordered.len()),
    );
    for c in ordered {
        arrays.0.push(c.id);
        arrays.1.push(c.token);
        arrays.2.push(c.processor.as_str().to_string());
        arrays.3.push(c.output.clone());
    }
    arrays
}

async fn complete_claims(
    conn: &mut PgConnection,
    completions: &[Completion],
) -> Result<Vec<Task>, TaskError> {
    // Race prevented: a paused processor waking up and completing a task
    // that was taken over meanwhile (the "stale completion"). The UPDATE
    // locks each row and re-checks the claim (processor, token, status,
    // deadline) on its newest version: a new token, a finished task or a
    // passed deadline means nothing is written for that task. The lease is
    // released in the same statement, only for the terms just completed
    // (same holder and token), so a late release never ends a newer term.
    // Rows are locked in id order, so two batches never deadlock; one
    // batch naming a task twice completes it at most once (the second
    // row finds it processed).
    let sql = complete_sql();
    let (ids, tokens, processors, outputs) = completion_arrays(completions);
    Ok(sqlx::query_as(&sql)
        .bind(&ids)
        .bind(&tokens)
        .bind(&processors)
        .bind(&outputs)
        .fetch_all(&mut *conn)
        .await?)
}

/// The savepoint a [`FencedTransaction`] rolls back to when its completion
/// is refused: everything the handler wrote comes after it.
const FENCE_SAVEPOINT: &str = "leasekeeper_fence";

/// A transaction for a handler's own writes that commits only together
/// with the task's completion, and only if the completion is accepted:
/// exactly-once effects in the database.
///
/// It runs on a connection of the queue's pool with the host's
/// `search_path` (so the handler's SQL names its own tables as usual), and
/// a savepoint taken before the first write. [`FencedTransaction::complete`]
/// then runs the fenced completion in the same transaction: accepted, and
/// everything commits at once; refused (a stale holder: the claim was taken
/// over, or its lease ran out), and the handler's writes are rolled back to
/// the savepoint, the refusal is recorded in `lease_events`, and that alone
/// commits.
///
/// Begin it when the handler is ready to write, not at its start: the
/// transaction holds a connection of the pool while it is open.
pub struct FencedTransaction {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    /// The pool's own `search_path`, restored for the completion.
    queue_search_path: String,
}

/// Sets `search_path` for the rest of the current transaction.
async fn set_search_path(conn: &mut PgConnection, search_path: &str) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT set_config('search_path', $1, true)")
        .bind(search_path)
        .execute(conn)
        .await?;
    Ok(())
}

impl std::fmt::Debug for FencedTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedTransaction")
            .field("queue_search_path", &self.queue_search_path)
            .finish_non_exhaustive()
    }
}

impl FencedTransaction {
    /// Begins a transaction on `pool` whose statements see `search_path`
    /// (the host's, e.g. `"$user", public`).
    pub async fn begin(pool: &sqlx::PgPool, search_path: &str) -> Result<Self, sqlx::Error> {
        let mut tx = pool.begin().await?;
        let queue_search_path: String = sqlx::query_scalar("SELECT current_setting('search_path')")
            .fetch_one(&mut *tx)
            .await?;
        set_search_path(&mut tx, search_path).await?;
        sqlx::query(&format!("SAVEPOINT {FENCE_SAVEPOINT}"))
            .execute(&mut *tx)
            .await?;
        Ok(FencedTransaction {
            tx,
            queue_search_path,
        })
    }

    /// Completes task `id` of `processor`'s claim with `token` and commits
    /// the handler's writes with it; see the type's documentation. Answers
    /// [`TaskError::Stale`] when refused (nothing of the handler's stays).
    pub async fn complete(
        mut self,
        id: i32,
        processor: &Holder,
        token: i64,
        output: Option<&Value>,
    ) -> Result<Task, TaskError> {
        let _announced = crate::live::announce_on_return(
            crate::live::Topics::TASKS | crate::live::Topics::LEASES,
        );
        set_search_path(&mut self.tx, &self.queue_search_path).await?;
        // Race prevented: a stale holder's effects committing. The handler
        // wrote in this transaction; the completion below locks the task
        // row and re-checks the claim (processor, token, status, deadline)
        // on its newest version, as `complete` does. Accepted, the row
        // stays locked until the commit, so no takeover can begin between
        // the check and the commit of the handler's writes (a claim skips
        // the locked row; heartbeats and refusals wait). The deadline is
        // judged at this statement's start, not the transaction's, which
        // may have begun long before (`now()` would accept a completion
        // made after the lease ran out).
        let sql = complete_sql_at("statement_timestamp()");
        let (ids, tokens, processors, outputs) = completion_arrays(&[Completion::new(
            id,
            token,
            processor.clone(),
            output.cloned(),
        )]);
        let done: Option<Task> = sqlx::query_as(&sql)
            .bind(&ids)
            .bind(&tokens)
            .bind(&processors)
            .bind(&outputs)
            .fetch_optional(&mut *self.tx)
            .await?;
        if let Some(task) = done {
            self.tx.commit().await?;
            return Ok(task);
        }
        // Refused: undo the handler's writes, record the refusal, commit that.
        sqlx::query(&format!("ROLLBACK TO SAVEPOINT {FENCE_SAVEPOINT}"))
            .execute(&mut *self.tx)
            .await?;
        set_search_path(&mut self.tx, &self.queue_search_path).await?;
        let err = refuse(&mut self.tx, id, processor, token, "complete").await?;
        self.tx.commit().await?;
        Err(err)
    }
}

impl std::ops::Deref for FencedTransaction {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for FencedTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

/// [`refuse`] in a transaction of its own.
async fn refuse_alone(
    conn: &mut PgConnection,
    id: i32,
    processor: &Holder,
    token: i64,
    op: &str,
) -> Result<TaskError, TaskError> {
    let mut tx = conn.begin().await?;
    let err = refuse(&mut tx, id, processor, token, op).await?;
    tx.commit().await?;
    Ok(err)
}

/// The longest `last_error` kept, in characters; the tasks table's CHECK
/// holds the same limit.
pub const MAX_ERROR_CHARS: usize = 4096;

/// `error` cut to [`MAX_ERROR_CHARS`], ending in `…` when cut.
pub fn bounded_error(error: &str) -> Cow<'_, str> {
    if error.chars().nth(MAX_ERROR_CHARS).is_none() {
        return Cow::Borrowed(error);
    }
    let mut cut: String = error.chars().take(MAX_ERROR_CHARS - 1).collect();
    cut.push('…');
    Cow::Owned(cut)
}

/// Reports that an attempt at task `id` failed with `error`. The task goes
/// back to pending after the policy's backoff, or to failed once it has
/// used `max_attempts`. Accepted only from the current claim's holder.
/// An `error` past [`MAX_ERROR_CHARS`] is kept cut (a simulated worker's
/// message quotes the bad task data it got, which may be long).
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
    .bind(bounded_error(error).as_ref())
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

/// The SQL of [`list`] (`$1` after id, `$2` limit) and of [`list_page`]
/// (`$1` before id, `$2` limit) for `status`.
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
    let and_status = match status {
        Some(s) => format!("AND status = '{}'", s.as_str()),
        None => String::new(),
    };
    if newest_first {
        format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE id < $1 {and_status} ORDER BY id DESC LIMIT $2"
        )
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

/// A page of the tasks with `status` (all when `None`), newest first:
/// what the dashboard shows and `GET /api/tasks?before=` answers.
pub async fn list_page(
    conn: &mut PgConnection,
    status: Option<TaskStatus>,
    cursor: crate::paging::Cursor,
) -> Result<crate::paging::Paged<Task>, sqlx::Error> {
    let rows = sqlx::query_as(&list_sql(status, true))
        .bind(i32::try_from(cursor.bound()).unwrap_or(i32::MAX))
        .bind(cursor.limit)
        .fetch_all(&mut *conn)
        .await?;
    Ok(crate::paging::Paged::of(rows, cursor, |t: &Task| {
        i64::from(t.id)
    }))
}

/// When `lease` guards a task (resource `task:<id>`), makes that task's
/// claim under the lease's fencing token late now, so another worker may
/// take the task over at once and the old processor's heartbeat and
/// completion are refused. Call it in the transaction that ended the lease
/// early ([`leases::force_release`]), whose caller announces
/// [`Topics::TASKS`](crate::live::Topics::TASKS) after the commit. Answers
/// whether a claim was ended.
pub async fn end_claim_of(
    conn: &mut PgConnection,
    lease: &crate::lease::Lease,
) -> Result<bool, sqlx::Error> {
    let Some(task_id) = lease
        .resource
        .strip_prefix("task:")
        .and_then(|n| n.parse::<i32>().ok())
    else {
        return Ok(false);
    };
    // Race prevented: the processor heartbeating its claim while the
    // operator ends it. The token check (re-checked on the newest row
    // version) ends only the claim of the term the lease ended; after this
    // commits the claim is late, so its heartbeat and completion are refused.
    let ended = sqlx::query(
        "UPDATE tasks SET must_heartbeat_before = now() - interval '1 millisecond'
          WHERE id = $1 AND status = 'started' AND fencing_token = $2",
    )
    .bind(task_id)
    .bind(lease.fencing_token)
    .execute(&mut *conn)
    .await?;
    Ok(ended.rows_affected() == 1)
}

//! Operator controls on tasks and leases: cancel and retry, one task or
//! every task matching a filter; release of a task's claim; and
//! force-release of a lease.
//!
//! - **Cancel** takes a pending, waiting or started task out of the queue (status
//!   `cancelled`). A started task's claim ends with it (the task row is its
//!   lease), and its processor's later heartbeats,
//!   completion or failure report are refused and recorded as stale writes
//!   (the task is no longer `started`). The process running it hears of
//!   it at once ([`Topics::CANCELS`], announced after the commit): its
//!   worker heartbeats, is refused, and the handler's
//!   [`TaskContext::cancelled`](crate::worker::handler::TaskContext::cancelled)
//!   completes, usually within milliseconds.
//! - **Retry** puts a failed or cancelled task back to `pending`, runnable
//!   now, with its attempts reset to 0 (`waiting`, for a workflow task
//!   with a parent unfinished). A workflow task's retry also brings back
//!   the tasks below it that its failure or cancel cancelled (the cascade):
//!   they wait for it again, unless another of their parents stays failed
//!   or cancelled.
//! - **Release** ([`release`]) ends a started task's claim now and leaves
//!   the task to be taken over at once, with the next token: for a worker
//!   that is stuck but alive. Its processor hears of it as of a cancel.
//!
//! Every change writes one `operator` row per task to `lease_events` (on
//! resource `task:<id>`, naming the action, who took it and the claim's
//! token) in the same transaction as the change, so no task changes
//! unaudited and no audit row describes a change that rolled back.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), leasekeeper_core::queue::store::TaskError> {
//! use leasekeeper_core::queue::TaskStatus;
//! use leasekeeper_core::queue::control::{self, TaskFilter};
//! let mut conn = pool.acquire().await?;
//! let schema = leasekeeper_core::db::Schema::of(&pool);
//! // One task, by id: who did it goes to the audit trail.
//! control::cancel(&mut conn, &schema, 42, "ops@example").await?;
//! control::retry(&mut conn, &schema, 42, "ops@example").await?;
//! // Every failed task of one kind, in batches; answers how many.
//! let filter = TaskFilter { status: TaskStatus::Failed, kind: Some("email".into()), queue: None, data: None, error_group: None };
//! let n = control::retry_matching(&pool, &schema, &filter, "ops@example").await?;
//! # let _ = n; Ok(()) }
//! ```

use super::store::{TASK_COLUMNS, TaskError};
use super::{Task, TaskStatus};
use crate::db::Schema;
use crate::lease::Lease;
use crate::lease::store as lease_store;
use crate::live::{self, Topics};
use sqlx::{Connection, FromRow, PgConnection, PgPool, Row};
use std::time::Duration;

/// An operator action on tasks (the type is shared with the browser).
pub use super::TaskAction as Action;

impl Action {
    /// The `action` an audit row names: `cancel_task`, `retry_task` or
    /// `release_claim`.
    pub fn audit_name(self) -> &'static str {
        match self {
            Action::Cancel => "cancel_task",
            Action::Retry => "retry_task",
            Action::Release => "release_claim",
        }
    }

    /// The SET clause of the change.
    fn set_clause(self) -> &'static str {
        match self {
            Action::Cancel => {
                "status = 'cancelled', cancelled_at = now(), must_heartbeat_before = NULL"
            }
            Action::Retry => {
                // A workflow task with a parent still unfinished waits for
                // it again: a retry never makes a child claimable early.
                // The tasks its end cancelled come back to waiting in the
                // same statement (the trigger `tasks_parents_ended`).
                "status = CASE WHEN parents_left > 0 THEN 'waiting' ELSE 'pending' END, \
                 attempts = 0, scheduled_at = now(), failed_at = NULL, \
                 cancelled_at = NULL, must_heartbeat_before = NULL, \
                 wait_signal = NULL, wait_until = NULL, cascaded_from = NULL"
            }
            // Late now, never later than it was (a deadline moved on would
            // be a renewal).
            Action::Release => {
                "must_heartbeat_before = LEAST(must_heartbeat_before, now() - interval '1 millisecond')"
            }
        }
    }

    /// `status IN (...)` for the statuses this action applies to, as SQL
    /// literals from the enum (never from input).
    fn applies_sql(self) -> String {
        let names: Vec<String> = self
            .applies_to()
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect();
        format!("status IN ({})", names.join(", "))
    }
}

/// Which tasks a bulk action takes: every task with `status` (one the
/// action applies to), and, when given, of this `kind`, in this `queue`
/// and whose data contains `data`: the tasks a list with the same
/// [`TaskSearch`](crate::queue::TaskSearch) shows, no more.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskFilter {
    /// The status the tasks are in now.
    pub status: TaskStatus,
    /// Only tasks of this kind.
    pub kind: Option<String>,
    /// Only tasks in this queue.
    pub queue: Option<String>,
    /// Only tasks whose data contains this object (`task_data @> data`).
    pub data: Option<serde_json::Map<String, serde_json::Value>>,
    /// Only tasks whose `last_error` reads as this group
    /// ([`FailedGroup::error_group`](crate::queue::failed::FailedGroup)):
    /// "retry these" of the dead letters' summary.
    pub error_group: Option<String>,
}

impl TaskFilter {
    /// Refuses a status the action does not apply to (cancel a processed
    /// task, retry a pending one) with [`TaskError::BadInput`].
    pub fn check(&self, action: Action) -> Result<(), TaskError> {
        if let Some(group) = &self.error_group
            && (group.contains('\0') || group.chars().count() > 200)
        {
            return Err(TaskError::BadInput(
                "error_group must be at most 200 characters, none of them NUL".into(),
            ));
        }
        if action.applies_to().contains(&self.status) {
            return Ok(());
        }
        Err(TaskError::BadInput(format!(
            "{} applies to {} tasks, not {}",
            action.as_str(),
            action.applies_text(),
            self.status.as_str()
        )))
    }
}

/// Tasks one bulk statement changes at most: short transactions, so a
/// heartbeat or completion never waits long behind a bulk action.
pub const BATCH: i64 = 500;

/// Cancels task `id` (pending, waiting or started) on behalf of `by`; see the
/// module. [`TaskError::NotFound`] when there is no such task,
/// [`TaskError::Stale`] (a conflict) when it is in another status.
pub async fn cancel(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    by: &str,
) -> Result<Task, TaskError> {
    crate::db::atomically!(conn, schema, Result<Task, TaskError>, async {
        apply(conn, schema, Action::Cancel, id, by).await
    }
    .await)
}

/// Puts task `id` (failed or cancelled) back to pending with its attempts
/// reset, on behalf of `by`; see the module. Errors as [`cancel`].
pub async fn retry(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    by: &str,
) -> Result<Task, TaskError> {
    crate::db::atomically!(conn, schema, Result<Task, TaskError>, async {
        apply(conn, schema, Action::Retry, id, by).await
    }
    .await)
}

/// Ends the claim of started task `id` whose token is `token` now, on
/// behalf of `by`: the task stays started but late, so the next claim takes
/// it over with the next token, and its processor's heartbeat, completion
/// or failure is refused (it hears of it as of a cancel, and idle workers
/// are woken as by an enqueue). [`TaskError::Stale`] (a conflict) when the
/// task is not started or its claim has another token now (it was taken
/// over: the operator meant the earlier one); [`TaskError::NotFound`] when
/// there is no such task.
pub async fn release(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    token: i64,
    by: &str,
) -> Result<Task, TaskError> {
    crate::db::atomically!(conn, schema, Result<Task, TaskError>, async {
        apply_to(conn, schema, Action::Release, id, Some(token), by).await
    }
    .await)
}

/// [`cancel`], [`retry`] or release task `id`, as `action` says (a release
/// whatever its claim's token; see [`release`]).
pub async fn apply(
    conn: &mut PgConnection,
    schema: &Schema,
    action: Action,
    id: i64,
    by: &str,
) -> Result<Task, TaskError> {
    crate::db::atomically!(conn, schema, Result<Task, TaskError>, async {
        apply_to(conn, schema, action, id, None, by).await
    }
    .await)
}

/// [`apply`], only to the claim whose token is `token` when given.
async fn apply_to(
    conn: &mut PgConnection,
    schema: &Schema,
    action: Action,
    id: i64,
    token: Option<i64>,
    by: &str,
) -> Result<Task, TaskError> {
    crate::db::atomically!(conn, schema, Result<Task, TaskError>, async {
        let _announced = live::announce_on_return(Topics::TASKS | Topics::LEASES);
        let mut tx = conn.begin().await?;
        // Race prevented: the action against a claim, completion or failure
        // report of the same task. The status test is re-checked on the newest
        // row version once the row lock is ours: a completion that commits
        // first leaves the task processed and this changes nothing (a conflict,
        // said below); a claim that commits first leaves it started, and a
        // cancel or release then ends that claim (the task row is its lease).
        // Whatever commits after us sees the new status or deadline: a
        // processor's heartbeat or completion of a cancelled or released claim
        // is refused, a claim skips a cancelled task. A release names its
        // claim's token, re-checked on the newest version too, so a claim
        // that took the task over meanwhile is not the one released.
        let changed = schema.query(&format!(
            "UPDATE $schema.tasks SET {set}
               FROM (SELECT id AS pick_id, status AS was FROM $schema.tasks WHERE id = $1 FOR UPDATE) pick
              WHERE id = pick.pick_id AND {applies}
                AND ($2::int8 IS NULL OR fencing_token = $2)
             RETURNING {TASK_COLUMNS}, pick.was",
            set = action.set_clause(),
            applies = action.applies_sql(),
        ))
        .bind(id)
        .bind(token)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| key_taken(e, &format!("task {id} cannot be retried")))?;
        let Some(row) = changed else {
            let now: Option<(TaskStatus, Option<i64>)> = schema
                .query_as("SELECT status, fencing_token FROM $schema.tasks WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            return Err(match now {
                None => TaskError::NotFound(id),
                Some((TaskStatus::Started, current)) if token.is_some() && current != token => {
                    TaskError::Stale {
                        id,
                        reason: format!(
                            "its claim is token {} now, not {}; nothing changed",
                            current.unwrap_or_default(),
                            token.unwrap_or_default()
                        ),
                    }
                }
                Some((status, _)) => TaskError::Stale {
                    id,
                    reason: format!(
                        "it is {}; {} applies to {} tasks; nothing changed",
                        status.as_str(),
                        action.as_str(),
                        action.applies_text()
                    ),
                },
            });
        };
        let task = Task::from_row(&row)?;
        let was: String = row.try_get("was")?;
        let changed = Changed {
            id: task.id,
            token: task.fencing_token,
            processor: task.processor.clone(),
            was,
        };
        let ended_a_claim = action != Action::Retry && changed.was == TaskStatus::Started.as_str();
        finish(&mut tx, schema, action, &[changed], by, false).await?;
        tx.commit().await?;
        if action != Action::Cancel || task.workflow_id.is_some() {
            // Claimable now (a retried task, or a workflow child that runs
            // on its parent's cancel): wake idle workers, as an enqueue does.
            live::announce(Topics::WORK);
        }
        if ended_a_claim {
            // After the commit: the processor's heartbeat, sent on hearing
            // this, must find the claim ended.
            live::announce(Topics::CANCELS);
        }
        Ok(task)
    }
    .await)
}

/// Cancels every unfinished task (pending, waiting or started) of workflow
/// `workflow`, each with its `operator` audit row naming `by` (marked
/// bulk), in one transaction: what `POST /api/workflows/{id}/cancel` does.
/// A started task's claim ends with it and its process hears it
/// ([`Topics::CANCELS`]), as with [`cancel`]. Answers how many tasks it
/// cancelled, or [`TaskError::NotFound`] when there is no such workflow.
pub async fn cancel_workflow(
    conn: &mut PgConnection,
    schema: &Schema,
    workflow: i64,
    by: &str,
) -> Result<u64, TaskError> {
    crate::db::atomically!(conn, schema, Result<u64, TaskError>, async {
        let _announced = live::announce_on_return(Topics::TASKS | Topics::LEASES);
        let mut tx = conn.begin().await?;
        let exists: Option<i64> = schema
            .query_scalar("SELECT id FROM $schema.workflows WHERE id = $1")
            .bind(workflow)
            .fetch_optional(&mut *tx)
            .await?;
        if exists.is_none() {
            return Err(TaskError::NotFound(workflow));
        }
        // Race prevented: the cancel against claims, completions and the
        // parents' ends of the same tasks. The rows are locked in id order
        // (the order the parents' trigger locks children in, so the two
        // cannot deadlock), and the status test is re-checked on each
        // newest version: a task completed first stays processed; one
        // claimed first is cancelled with its claim; one that a parent's
        // end made pending meanwhile is cancelled as pending.
        let rows = schema
            .query(&format!(
                "UPDATE $schema.tasks SET {set}
                   FROM (SELECT id AS pick_id, status AS was FROM $schema.tasks
                          WHERE workflow_id = $1 AND {applies}
                          ORDER BY id FOR UPDATE) pick
                  WHERE id = pick.pick_id AND {applies}
                 RETURNING id, fencing_token, processor, pick.was",
                set = Action::Cancel.set_clause(),
                applies = Action::Cancel.applies_sql(),
            ))
            .bind(workflow)
            .fetch_all(&mut *tx)
            .await?;
        let mut changed = Vec::with_capacity(rows.len());
        for row in &rows {
            changed.push(Changed {
                id: row.try_get("id")?,
                token: row.try_get("fencing_token")?,
                processor: row.try_get("processor")?,
                was: row.try_get("was")?,
            });
        }
        let ended_a_claim = changed.iter().any(|c| c.was == TaskStatus::Started.as_str());
        finish(&mut tx, schema, Action::Cancel, &changed, by, true).await?;
        tx.commit().await?;
        if ended_a_claim {
            live::announce(Topics::CANCELS);
        }
        Ok(changed.len() as u64)
    }
    .await)
}

/// A retry that would give a unique key (scope active) a second pending
/// or started holder, as a conflict; any other error as it is.
fn key_taken(e: sqlx::Error, what: &str) -> TaskError {
    let taken = e
        .as_database_error()
        .and_then(|d| d.constraint())
        .is_some_and(|c| c == "tasks_unique_idx");
    if taken {
        TaskError::Conflict(format!(
            "{what}: another pending or started task of its kind holds its unique key"
        ))
    } else {
        TaskError::Db(e)
    }
}

/// Cancels every task matching `filter` (which must be pending, waiting or started
/// tasks), in batches of [`BATCH`], each its own transaction, on behalf of
/// `by`. Answers how many were cancelled.
pub async fn cancel_matching(
    pool: &PgPool,
    schema: &Schema,
    filter: &TaskFilter,
    by: &str,
) -> Result<u64, TaskError> {
    apply_matching(pool, schema, Action::Cancel, filter, by).await
}

/// Retries every task matching `filter` (which must be failed or cancelled
/// tasks), as [`cancel_matching`] does. Answers how many were retried.
pub async fn retry_matching(
    pool: &PgPool,
    schema: &Schema,
    filter: &TaskFilter,
    by: &str,
) -> Result<u64, TaskError> {
    apply_matching(pool, schema, Action::Retry, filter, by).await
}

/// How often a bulk action looks again for matching tasks that were locked
/// (by a heartbeat, a completion) when it last looked, before it stops.
const LOCKED_RETRIES: u32 = 20;

/// [`cancel_matching`] or [`retry_matching`], as `action` says.
pub async fn apply_matching(
    pool: &PgPool,
    schema: &Schema,
    action: Action,
    filter: &TaskFilter,
    by: &str,
) -> Result<u64, TaskError> {
    filter.check(action)?;
    let search = crate::queue::TaskSearch {
        status: Some(filter.status),
        kind: filter.kind.clone(),
        queue: filter.queue.clone(),
        data: filter.data.clone(),
    };
    search.check().map_err(TaskError::BadInput)?;
    // An empty object filters nothing, as in a list's search.
    let data = filter
        .data
        .clone()
        .filter(|d| !d.is_empty())
        .map(serde_json::Value::Object);
    let _announced = live::announce_on_return(Topics::TASKS | Topics::LEASES);
    // The batch: tasks matching the filter, locked; SKIP LOCKED so a bulk
    // action never waits on (or deadlocks with) a heartbeat or completion
    // holding a task's row: that task is taken at a later pass.
    let sql = format!(
        "UPDATE $schema.tasks t SET {set}
           FROM (SELECT id AS pick_id, status AS was FROM $schema.tasks
                  WHERE status = '{status}'
                    AND ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR queue = $2)
                    AND ($3::jsonb IS NULL OR task_data @> $3)
                    AND ($4::text IS NULL OR $schema.task_error_group(last_error) = $4)
                    {free_key}
                  ORDER BY id LIMIT {BATCH}
                  FOR UPDATE SKIP LOCKED) pick
          WHERE t.id = pick.pick_id AND t.{applies}
         RETURNING t.id, t.fencing_token AS token, t.processor, pick.was",
        set = action.set_clause(),
        status = filter.status.as_str(),
        applies = action.applies_sql(),
        free_key = match action {
            Action::Cancel | Action::Release => "",
            // A retried task whose unique key (scope active) another task
            // holds would break the key: left as it is. Another task holds
            // it when `tasks_unique_idx` has it: pending or started, or of
            // any status under scope `always` (one enqueued after an
            // active-scoped task failed and released the key; found by
            // Schemathesis, seed 1). Of several matching tasks sharing a
            // key, the oldest only. (One enqueued between this look and
            // the update makes the batch fail with a conflict, 409, and
            // nothing of that batch is changed.)
            Action::Retry => {
                "AND (unique_scope IS DISTINCT FROM 'active' OR NOT EXISTS (
                        SELECT 1 FROM $schema.tasks o
                         WHERE o.kind = tasks.kind AND o.unique_slot = tasks.unique_slot
                           AND o.id <> tasks.id
                           AND (o.unique_scope <> 'active'
                                OR o.status IN ('pending', 'started', 'waiting')
                                OR (o.status = tasks.status AND o.id < tasks.id))))"
            }
        },
    );
    let mut total = 0u64;
    let mut retries = 0;
    let mut conn = pool.acquire().await?;
    loop {
        let mut tx = conn.begin().await?;
        // Race prevented: as for one task (see `apply`): the batch's rows are
        // locked and their status re-checked (`t.status IN ...`) on the
        // newest version, so a task that a claim, completion or another
        // operator changed meanwhile is left as that change left it.
        let changed: Vec<Changed> = schema
            .query_as(&sql)
            .bind(filter.kind.as_deref())
            .bind(filter.queue.as_deref())
            .bind(data.as_ref())
            .bind(filter.error_group.as_deref())
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| key_taken(e, "a task of this batch cannot be retried"))?;
        if changed.is_empty() {
            tx.rollback().await?;
            let left: bool = schema
                .query_scalar(&format!(
                    "SELECT EXISTS (SELECT 1 FROM $schema.tasks WHERE status = '{}'
                                   AND ($1::text IS NULL OR kind = $1)
                                   AND ($2::text IS NULL OR queue = $2)
                                   AND ($3::jsonb IS NULL OR task_data @> $3)
                                   AND ($4::text IS NULL
                                        OR $schema.task_error_group(last_error) = $4))",
                    filter.status.as_str()
                ))
                .bind(filter.kind.as_deref())
                .bind(filter.queue.as_deref())
                .bind(data.as_ref())
                .bind(filter.error_group.as_deref())
                .fetch_one(&mut *conn)
                .await?;
            if !left || retries >= LOCKED_RETRIES {
                break;
            }
            retries += 1;
            tokio::time::sleep(Duration::from_millis(25)).await;
            continue;
        }
        let ended_a_claim = action != Action::Retry
            && changed
                .iter()
                .any(|c| c.was == TaskStatus::Started.as_str());
        finish(&mut tx, schema, action, &changed, by, true).await?;
        tx.commit().await?;
        total += changed.len() as u64;
        if action != Action::Cancel {
            live::announce(Topics::WORK);
        }
        if ended_a_claim {
            // Per batch, after its commit: its processors stop without
            // waiting for the whole bulk action.
            live::announce(Topics::CANCELS);
        }
    }
    Ok(total)
}

/// A task an action changed: its id, its (last) claim's token, and the
/// status it was in.
#[derive(sqlx::FromRow)]
struct Changed {
    id: i64,
    token: Option<i64>,
    processor: Option<String>,
    was: String,
}

/// After the tasks `changed` changed: a release records the end of each
/// claim's term; every task gets its audit row. In the transaction of the
/// change. (A cancel's end of a live claim is the task
/// row's change itself: the row is the claim's lease, and the trigger
/// records the release.)
async fn finish(
    conn: &mut PgConnection,
    schema: &Schema,
    action: Action,
    changed: &[Changed],
    by: &str,
    bulk: bool,
) -> Result<(), TaskError> {
    crate::db::atomically!(conn, schema, Result<(), TaskError>, async {
        let ids: Vec<i64> = changed.iter().map(|c| c.id).collect();
        let tokens: Vec<Option<i64>> = changed.iter().map(|c| c.token).collect();
        let was: Vec<&str> = changed.iter().map(|c| c.was.as_str()).collect();
        if action == Action::Release {
            // The term ends now in the history, as a release: a reader of
            // lease_events (the split-brain check, the timeline) ends it
            // here, not at the deadline it had, so the takeover that follows
            // at once is no overlap.
            let processors: Vec<Option<&str>> =
                changed.iter().map(|c| c.processor.as_deref()).collect();
            schema
                .query(
                    "INSERT INTO $schema.lease_events (resource, holder, fencing_token, kind, expires_at, detail)
                     SELECT 'task:' || c.id, c.processor, c.token, 'released',
                            date_trunc('milliseconds', now()), jsonb_build_object('by', $4::text)
                       FROM unnest($1::int8[], $2::int8[], $3::text[]) AS c(id, token, processor)
                      ORDER BY c.id",
                )
                .bind(&ids)
                .bind(&tokens)
                .bind(&processors)
                .bind(by)
                .execute(&mut *conn)
                .await?;
        }
        schema
            .query(
                "INSERT INTO $schema.lease_events (resource, holder, fencing_token, kind, detail)
             SELECT 'task:' || c.id, $3, c.token, 'operator',
                    jsonb_build_object('action', $4::text, 'by', $3::text, 'task_id', c.id,
                                       'fencing_token', c.token, 'previous', c.was,
                                       'bulk', $5::bool)
               FROM unnest($1::int8[], $2::int8[], $6::text[]) AS c(id, token, was)",
            )
            .bind(&ids)
            .bind(&tokens)
            .bind(by)
            .bind(action.audit_name())
            .bind(bulk)
            .bind(&was)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
    .await)
}

/// Ends the term of lease `id` whose fencing token is `token` now, whoever
/// holds it, and records that `by` did it, in one transaction. Answers the
/// ended lease, or `None` when that term is not live any more (it ended, or
/// another term began): then nothing changed. Announces [`Topics::LEASES`]
/// and [`Topics::TASKS`]. (A task's claim has no lease row: its task row is
/// its lease, ended by a cancel.)
pub async fn force_release(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    token: i64,
    by: &str,
) -> Result<Option<Lease>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<Lease>, sqlx::Error>,
        async {
            let _announced = live::announce_on_return(Topics::LEASES | Topics::TASKS);
            let mut tx = conn.begin().await?;
            // The race (an operator's release against the holder's renew or a
            // takeover) is settled in `lease_store::force_release`'s statement.
            let Some(lease) = lease_store::force_release(&mut tx, schema, id, token).await? else {
                return Ok(None);
            };
            lease_store::record_operator_action(
                &mut tx,
                schema,
                &lease.resource,
                by,
                "force_release",
                serde_json::json!({"lease_id": id, "fencing_token": token, "holder": lease.holder}),
            )
            .await?;
            tx.commit().await?;
            Ok(Some(lease))
        }
        .await
    )
}

//! The pruner's SQL: every statement that deletes what retention lets go.
//!
//! Each function deletes one batch (at most `batch` rows of the table it
//! walks) in one short transaction of its own, marked as pruning
//! (`leasekeeper.pruning`, see the migration `…_retention.sql`): the
//! deleted lease rows write no `deleted` history, and the deleted tasks are
//! counted on the pruner's own `task_counts` row. Rows are picked with
//! `FOR UPDATE SKIP LOCKED` and re-checked on their newest version, so a
//! batch never waits for a row someone is changing and never deletes a row
//! that someone changed out of retention in the meantime.
//!
//! What may be deleted, and why the rest may not:
//! - finished tasks (processed, failed, cancelled) that finished before the
//!   cutoff, with their history (`task:<id>`) and attempts. A task's claims
//!   are its own row (no lease or fencing row), and a task id comes from a
//!   sequence and is never used again: nothing of it need be remembered.
//! - lease rows of other resources (singletons, leases taken through the
//!   API) whose term ended before the cutoff, but never their
//!   `lease_fencing` row: such a resource may be acquired again, and its
//!   next token must still be above every token it ever had.
//! - any `lease_events` row older than the cutoff (history of leases that
//!   are still there, and stray rows: e.g. a stale write to a task refused
//!   while the task was being pruned).
//! - `failover_kills` older than the cutoff (the history they are timed
//!   against is gone).
//! - instances and workers last seen before the cutoff: stopped, crashed or
//!   silent for that long, so dead by any liveness window shorter than the
//!   retention.
//! - queues left without any task (their last ones pruned), unless paused:
//!   a paused queue keeps its flag for the tasks still to come. A queue
//!   used again is created again by its first task.

use crate::db::Schema;
use crate::text::text_enum;
use sqlx::{Connection, PgConnection};
use std::time::Duration;

text_enum! {
    /// The tables the pruner deletes from, as named in metrics and reports.
    pub enum Table {
        /// `tasks`.
        Tasks = "tasks",
        /// `leases`.
        Leases = "leases",
        /// `lease_events`.
        LeaseEvents = "lease_events",
        /// `failover_kills`.
        FailoverKills = "failover_kills",
        /// `instances`.
        Instances = "instances",
        /// `workers`.
        Workers = "workers",
        /// `schedule_ticks`.
        ScheduleTicks = "schedule_ticks",
        /// `queues`.
        Queues = "queues",
    }
}

/// Rows deleted, per table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Finished tasks.
    pub tasks: u64,
    /// Lease rows whose term ended before the cutoff (singletons, leases
    /// taken through the API).
    pub leases: u64,
    /// History rows.
    pub lease_events: u64,
    /// Old failover kills.
    pub failover_kills: u64,
    /// Dead instances.
    pub instances: u64,
    /// Dead workers.
    pub workers: u64,
    /// Old schedule ticks (the schedule keeps its newest tick's time).
    pub schedule_ticks: u64,
    /// Queues left without tasks (not paused).
    pub queues: u64,
}

impl Pruned {
    /// Rows deleted from `table`.
    pub fn get(&self, table: Table) -> u64 {
        match table {
            Table::Tasks => self.tasks,
            Table::Leases => self.leases,
            Table::LeaseEvents => self.lease_events,
            Table::FailoverKills => self.failover_kills,
            Table::Instances => self.instances,
            Table::Workers => self.workers,
            Table::ScheduleTicks => self.schedule_ticks,
            Table::Queues => self.queues,
        }
    }

    /// Rows deleted from every table together.
    pub fn total(&self) -> u64 {
        Table::ALL.iter().map(|t| self.get(*t)).sum()
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Pruned) {
        for table in Table::ALL {
            *self.get_mut(table) += other.get(table);
        }
    }

    fn get_mut(&mut self, table: Table) -> &mut u64 {
        match table {
            Table::Tasks => &mut self.tasks,
            Table::Leases => &mut self.leases,
            Table::LeaseEvents => &mut self.lease_events,
            Table::FailoverKills => &mut self.failover_kills,
            Table::Instances => &mut self.instances,
            Table::Workers => &mut self.workers,
            Table::ScheduleTicks => &mut self.schedule_ticks,
            Table::Queues => &mut self.queues,
        }
    }
}

/// How old a finished task must be to be pruned: `finished` for processed
/// and cancelled tasks (and every other table's rows), `failed` for failed
/// ones. A plain duration is both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Processed and cancelled tasks, history, ended leases, dead rows.
    pub finished: Duration,
    /// Failed tasks: at least `finished`.
    pub failed: Duration,
}

impl Retention {
    /// `finished`, and `failed` but never less than `finished`.
    pub fn new(finished: Duration, failed: Duration) -> Self {
        Retention {
            finished,
            failed: failed.max(finished),
        }
    }
}

impl From<Duration> for Retention {
    fn from(d: Duration) -> Self {
        Retention::new(d, d)
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Runs `statement` (binding the retention in seconds as `$1`, the batch
/// size as `$2` and `also`, when given, in seconds as `$3`) in a transaction of its own marked as pruning, and
/// answers the counts in its one row as rows deleted from `tables`, in
/// order.
async fn in_pruning_transaction(
    conn: &mut PgConnection,
    schema: &Schema,
    statement: &str,
    older_than: Duration,
    batch: usize,
    also: Option<Duration>,
    tables: &[Table],
) -> sqlx::Result<Pruned> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<Pruned>,
        async {
            use sqlx::Row;
            let mut tx = conn.begin().await?;
            // Transaction-local (the third argument): it ends with this
            // transaction, so a pooled connection never carries it elsewhere.
            schema
                .query("SELECT set_config('leasekeeper.pruning', 'on', true)")
                .execute(&mut *tx)
                .await?;
            let mut query = schema
                .query(statement)
                .bind(secs(older_than))
                .bind(i64::try_from(batch).unwrap_or(i64::MAX));
            if let Some(also) = also {
                query = query.bind(secs(also));
            }
            let row = query.fetch_one(&mut *tx).await?;
            tx.commit().await?;
            let mut pruned = Pruned::default();
            for (i, table) in tables.iter().enumerate() {
                *pruned.get_mut(*table) = u64::try_from(row.try_get::<i64, _>(i)?).unwrap_or(0);
            }
            Ok(pruned)
        }
        .await
    )
}

/// Deletes up to `batch` tasks that finished more than `retention.finished`
/// ago (processed, cancelled) and up to `batch` failed more than
/// `retention.failed` ago, oldest first, with their history; a workflow's
/// tasks only once none of its tasks is unfinished, with their edges, and
/// the workflow's row with its last task.
pub async fn prune_tasks(
    conn: &mut PgConnection,
    schema: &Schema,
    retention: impl Into<Retention>,
    batch: usize,
) -> sqlx::Result<Pruned> {
    let retention: Retention = retention.into();
    crate::db::atomically!(conn, schema, async {
        // Race prevented: an operator retrying (or anyone changing) a finished
        // task at the moment it is pruned, which must leave the task whole or
        // gone, never a pending task without its history or a history without
        // its task. `doomed` locks each task row it picks (FOR UPDATE) and
        // skips rows another transaction holds (SKIP LOCKED: the pruner never
        // waits, and a retry in flight keeps its task); a row changed and
        // committed since this statement's snapshot is re-checked on its newest
        // version, so a task retried a moment ago (pending again) is not picked.
        // A retry that comes after the lock waits for this short transaction,
        // then finds no task. A task's history is written only by who holds
        // the task row (its claims' and their ends' events by the tasks
        // trigger, a refused write's after reading it), so with the task row
        // locked it is deleted whole. A claim never waits here: it locks only
        // pending and started tasks.
        //
        // And a workflow's finished task pruned while a task of its workflow
        // is unfinished (a child's page would lose its parent): a workflow's
        // task is picked only when no task of the workflow is pending,
        // waiting or started. A child made pending by its last parent's end
        // holds its parents' outputs itself, so nothing it runs on is lost
        // either way; a retry of a finished workflow task after this check
        // may leave that task without pruned siblings, never without itself.
        //
        // The processed and cancelled tasks are read by tasks_finished_idx,
        // oldest first, stopping at the cutoff; the failed ones, kept longer,
        // by the status index.
        let keeps_workflow = "(t.workflow_id IS NULL OR NOT EXISTS (
                                SELECT 1 FROM $schema.tasks u
                                 WHERE u.workflow_id = t.workflow_id
                                   AND u.status IN ('pending', 'started', 'waiting')))";
        in_pruning_transaction(
            conn, schema,
            &format!("WITH done AS (
                SELECT id FROM $schema.tasks t
                  WHERE status IN ('processed', 'failed', 'cancelled')
                    AND greatest(processed_at, failed_at, cancelled_at)
                        < now() - make_interval(secs => $1)
                    AND status <> 'failed' AND {keeps_workflow}
                  ORDER BY greatest(processed_at, failed_at, cancelled_at), id
                  LIMIT $2
                    FOR UPDATE SKIP LOCKED
             ), dead AS (
                SELECT id FROM $schema.tasks t
                  WHERE status = 'failed'
                    AND failed_at < now() - make_interval(secs => $3)
                    AND {keeps_workflow}
                  ORDER BY failed_at, id
                  LIMIT $2
                    FOR UPDATE SKIP LOCKED
             ), doomed AS (
                SELECT id FROM done UNION ALL SELECT id FROM dead
             ), tasks_gone AS (
                DELETE FROM $schema.tasks t USING doomed d WHERE t.id = d.id
                RETURNING t.id, 'task:' || t.id AS resource, t.workflow_id
             ), events_gone AS (
                DELETE FROM $schema.lease_events e USING tasks_gone g WHERE e.resource = g.resource RETURNING 1
             ), edges_gone AS (
                DELETE FROM $schema.task_parents p USING tasks_gone g WHERE p.task_id = g.id
             ), workflows_gone AS (
                DELETE FROM $schema.workflows w
                 WHERE w.id IN (SELECT workflow_id FROM tasks_gone)
                   AND NOT EXISTS (SELECT 1 FROM $schema.tasks u
                                    WHERE u.workflow_id = w.id
                                      AND u.id NOT IN (SELECT id FROM tasks_gone))
             )
             SELECT (SELECT count(*) FROM tasks_gone), (SELECT count(*) FROM events_gone)"),
            retention.finished,
            batch,
            Some(retention.failed),
            &[Table::Tasks, Table::LeaseEvents],
        )
        .await
    }
    .await)
}

/// Deletes up to `batch` lease rows of resources other than tasks whose
/// term ended (released or expired) more than `older_than` ago. Their
/// `lease_fencing` rows stay, so the next acquisition of such a resource
/// still gets a token above every earlier one.
pub async fn prune_leases(
    conn: &mut PgConnection,
    schema: &Schema,
    older_than: Duration,
    batch: usize,
) -> sqlx::Result<Pruned> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<Pruned>,
        async {
            // Race prevented: an acquisition of the resource at the moment its
            // ended row is deleted. An acquirer that locked or renewed the row
            // first is skipped (SKIP LOCKED) or re-checked on its newest version
            // (no longer ended before the cutoff); one that comes after our lock
            // waits for this short transaction, finds no row and inserts one, with
            // the token lease_fencing remembers + 1 (the fencing guard refuses any
            // token that does not advance, and acquire retries it). A release sets
            // expires_at to its moment, so `expires_at` is when any term ended.
            in_pruning_transaction(
                conn,
                schema,
                "WITH doomed AS (
                SELECT id FROM $schema.leases
                 WHERE resource NOT LIKE 'task:%'
                   AND expires_at < now() - make_interval(secs => $1)
                 ORDER BY expires_at
                 LIMIT $2
                   FOR UPDATE SKIP LOCKED
             ), gone AS (
                DELETE FROM $schema.leases l USING doomed d WHERE l.id = d.id RETURNING 1
             )
             SELECT count(*) FROM gone",
                older_than,
                batch,
                None,
                &[Table::Leases],
            )
            .await
        }
        .await
    )
}

/// Deletes up to `batch` history rows older than `older_than`, of any
/// resource.
pub async fn prune_events(
    conn: &mut PgConnection,
    schema: &Schema,
    older_than: Duration,
    batch: usize,
) -> sqlx::Result<Pruned> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<Pruned>,
        async {
            // Read by primary key from the oldest: ids are handed out in insert
            // order and `at` is its transaction's start, so ids follow times up to
            // the length of a transaction. The batch looks at the `batch` oldest
            // rows only and deletes those before the cutoff; when none of them is,
            // the pass ends (a few rows written out of order by a long transaction
            // go in a later run). No index on `at` is needed, so the hot path (two
            // history rows per task) pays nothing for retention. History is
            // append-only: nobody else locks these rows, so this waits on no one.
            prune_oldest(conn, schema, Table::LeaseEvents, "at", older_than, batch).await
        }
        .await
    )
}

/// Deletes up to `batch` failover kills older than `older_than`.
pub async fn prune_failover_kills(
    conn: &mut PgConnection,
    schema: &Schema,
    older_than: Duration,
    batch: usize,
) -> sqlx::Result<Pruned> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<Pruned>,
        async {
            // Append-only, like lease_events (ids follow killed_at).
            prune_oldest(
                conn,
                schema,
                Table::FailoverKills,
                "killed_at",
                older_than,
                batch,
            )
            .await
        }
        .await
    )
}

/// Deletes up to `batch` schedule ticks fired more than `older_than` ago.
/// The schedule keeps `last_tick_at`, so its next tick is known however
/// few ticks stay on record.
pub async fn prune_schedule_ticks(
    conn: &mut PgConnection,
    schema: &Schema,
    older_than: Duration,
    batch: usize,
) -> sqlx::Result<Pruned> {
    // Append-only (ids follow fired_at). Race prevented: none to prevent; a
    // firing inserts new rows with new ids, never one this batch can pick.
    prune_oldest(
        conn,
        schema,
        Table::ScheduleTicks,
        "fired_at",
        older_than,
        batch,
    )
    .await
}

/// Deletes those of the `batch` oldest rows (by id) of an append-only
/// `table` whose `at` column is before the cutoff.
async fn prune_oldest(
    conn: &mut PgConnection,
    schema: &Schema,
    table: Table,
    at: &str,
    older_than: Duration,
    batch: usize,
) -> sqlx::Result<Pruned> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<Pruned>,
        async {
            let table_name = table.as_str();
            let statement = format!(
                "WITH head AS (
                SELECT id, {at} FROM $schema.{table_name} ORDER BY id LIMIT $2
             ), gone AS (
                DELETE FROM $schema.{table_name} x USING head h
                 WHERE x.id = h.id AND h.{at} < now() - make_interval(secs => $1)
                RETURNING 1
             )
             SELECT count(*) FROM gone"
            );
            in_pruning_transaction(conn, schema, &statement, older_than, batch, None, &[table])
                .await
        }
        .await
    )
}

/// Deletes up to `batch` instances and up to `batch` workers last seen
/// more than `older_than` ago.
pub async fn prune_dead(
    conn: &mut PgConnection,
    schema: &Schema,
    older_than: Duration,
    batch: usize,
) -> sqlx::Result<Pruned> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<Pruned>,
        async {
            // Race prevented: a process that reports itself at the moment its row
            // is deleted. A report (a heartbeat, a worker's upsert) that locked the
            // row first is skipped or re-checked on its newest version (seen just
            // now: not picked). One that comes after waits for this short
            // transaction: an instance's heartbeat then finds no row (as for an
            // instance never registered), a worker's report inserts its row afresh.
            // Either way no live row is deleted: a row is picked only when its
            // process has not been seen for the whole retention, longer than any
            // liveness window.
            let mut pruned = prune_unseen(conn, schema, Table::Workers, older_than, batch).await?;
            // Looked for first: the statement trigger on instances announces a
            // change to every dashboard even when a DELETE deletes nothing.
            let any_dead: bool = schema
                .query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM $schema.instances
                             WHERE last_seen_at < now() - make_interval(secs => $1))",
                )
                .bind(secs(older_than))
                .fetch_one(&mut *conn)
                .await?;
            if any_dead {
                let instances =
                    prune_unseen(conn, schema, Table::Instances, older_than, batch).await?;
                pruned.add(&instances);
            }
            Ok(pruned)
        }
        .await
    )
}

/// Deletes up to `batch` rows of `table` (workers or instances) last seen
/// before the cutoff, oldest first, skipping rows a report holds.
async fn prune_unseen(
    conn: &mut PgConnection,
    schema: &Schema,
    table: Table,
    older_than: Duration,
    batch: usize,
) -> sqlx::Result<Pruned> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<Pruned>,
        async {
            let table_name = table.as_str();
            let statement = format!(
                "WITH dead AS (
                SELECT id FROM $schema.{table_name}
                 WHERE last_seen_at < now() - make_interval(secs => $1)
                 ORDER BY last_seen_at LIMIT $2
                   FOR UPDATE SKIP LOCKED
             ), gone AS (
                DELETE FROM $schema.{table_name} x USING dead d WHERE x.id = d.id RETURNING 1
             )
             SELECT count(*) FROM gone"
            );
            in_pruning_transaction(conn, schema, &statement, older_than, batch, None, &[table])
                .await
        }
        .await
    )
}

/// The SQLSTATE of a lock not obtained within `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// How long [`prune_queues`] waits for the enqueues in flight: enqueues
/// that come meanwhile queue up behind it, so it gives up soon and tries
/// again at the next pass.
const QUEUES_LOCK_TIMEOUT_MS: u32 = 100;

/// Deletes up to `batch` queue rows whose queue has no task left, except
/// paused ones. Answers nothing deleted when enqueues kept the queues busy
/// for 100 ms (the next pass tries again).
///
/// Two steps, so that enqueues never wait for a walk over every task:
/// first, with no lock, the queues that have no task in this snapshot (the
/// tasks table has no index by queue: one scan per pass); then, in a short
/// transaction under the lock every enqueue holds in shared mode until its
/// commit (see the `queues_on_first_use` trigger), those of them still
/// without a task that could have come since, each found by an index:
/// pending, started, or finished since the first step began.
pub async fn prune_queues(
    conn: &mut PgConnection,
    schema: &Schema,
    batch: usize,
) -> sqlx::Result<Pruned> {
    use chrono::{DateTime, Utc};
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<Pruned>,
        async {
            let (since, candidates): (DateTime<Utc>, Vec<String>) = schema
                .query_as(
                    "SELECT now(), ARRAY(
                        SELECT q.name FROM $schema.queues q
                         WHERE NOT q.paused
                           AND NOT EXISTS (SELECT 1 FROM $schema.tasks t WHERE t.queue = q.name)
                         ORDER BY q.name LIMIT $1)",
                )
                .bind(i64::try_from(batch).unwrap_or(i64::MAX))
                .fetch_one(&mut *conn)
                .await?;
            if candidates.is_empty() {
                return Ok(Pruned::default());
            }
            let mut tx = conn.begin().await?;
            schema
                .query(&format!(
                    "SELECT set_config('lock_timeout', '{QUEUES_LOCK_TIMEOUT_MS}ms', true)"
                ))
                .execute(&mut *tx)
                .await?;
            // Race prevented: an enqueue into a candidate that commits after
            // the first step, or is in flight. Every enqueue holds this lock
            // in shared mode from its trigger to its commit: taken here
            // exclusively, the enqueues in flight have committed (and the
            // statement below, a new snapshot, sees their tasks), and those
            // that come next wait for this commit, then find the name gone
            // and create it again. Tasks committed since the first step are
            // pending, started or finished since it began: each is found by
            // its index (the minute is a margin for a finishing transaction
            // that began a little earlier).
            let locked = schema
                .query("SELECT pg_advisory_xact_lock(hashtext('leasekeeper queues in use'), hashtext($1))")
                .bind(schema.as_str())
                .execute(&mut *tx)
                .await;
            match locked {
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                    return Ok(Pruned::default());
                }
                locked => locked?,
            };
            let gone: i64 = schema
                .query_scalar(
                    "WITH doomed AS (
                        SELECT q.name FROM $schema.queues q
                         WHERE q.name = ANY($1) AND NOT q.paused AND NOT q.limited
                           AND NOT EXISTS (SELECT 1 FROM $schema.tasks t
                                            WHERE t.queue = q.name AND t.status = 'pending')
                           AND NOT EXISTS (SELECT 1 FROM $schema.tasks t
                                            WHERE t.status = 'started' AND t.queue = q.name)
                           AND NOT EXISTS (
                               SELECT 1 FROM $schema.tasks t
                                WHERE greatest(t.processed_at, t.failed_at, t.cancelled_at)
                                      >= $2 - interval '1 minute'
                                  AND greatest(t.processed_at, t.failed_at, t.cancelled_at)
                                      <= 'infinity'
                                  AND t.queue = q.name)
                           FOR UPDATE OF q SKIP LOCKED
                     ), gone AS (
                        DELETE FROM $schema.queues q USING doomed d WHERE q.name = d.name RETURNING 1
                     )
                     SELECT count(*) FROM gone",
                )
                .bind(&candidates)
                .bind(since)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(Pruned {
                queues: u64::try_from(gone).unwrap_or(0),
                ..Pruned::default()
            })
        }
        .await
    )
}

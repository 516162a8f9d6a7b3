//! The round's workflows and durable waits (issue 40): every few seconds
//! the enqueuer adds a diamond of simulated work (a → b, c → d, and a
//! cleanup e after d that runs on a parent's failure), one diamond in three
//! with a c that fails for good at once (bad data, one attempt), so its
//! cascade runs too; and a task that waits for the signal `go` before its
//! work. A signaller sends `go` to every task waiting for it, twice a
//! second, through the faults (a signal whose answer is lost is sent
//! again: the second finds the task no longer waiting and changes
//! nothing). After the drain, [`check`] reads the tables, not the code
//! under test: no child claimed before every parent ended; a child of a
//! failed or cancelled parent cancelled and never claimed unless it runs
//! on failure; each edge closed once (`parents_left` agrees with the open
//! edges); nothing left waiting with no parent and no signal; each waiting
//! task signalled at most once and completed once after.
//!
//! An operator pass (with the signaller) retries each failed workflow task
//! once: a failing c runs again (and fails again), and its d, which c's
//! first failure cancelled, must come back to waiting meanwhile and be
//! cancelled again by c's second failure, never claimed.

use anyhow::Result;
use leasekeeper_core::db::Schema;
use leasekeeper_core::queue::store;
use leasekeeper_core::queue::{NewTask, control};
use leasekeeper_core::worker::simulated::KIND;
use leasekeeper_core::workflow::{NewWorkflow, WorkflowTask, store as flows};
use rand::Rng;
use rand::rngs::StdRng;
use serde::Serialize;
use serde_json::json;
use sqlx::PgPool;

/// Every this many of the harness's 150 ms enqueues, a diamond; and
/// offset by half of it, a task that waits for a signal.
pub(super) const EVERY: u64 = 20;

/// The signal the round's waiting tasks wait for.
const SIGNAL: &str = "go";

/// A diamond of short simulated work; with `failing`, its c fails for good
/// at its first attempt (data the work refuses, one attempt).
pub(super) fn diamond(n: u64, failing: bool, rng: &mut StdRng) -> NewWorkflow {
    let mut step = |r: &str| {
        let secs = f64::from(rng.random_range(50..600)) / 1000.0;
        WorkflowTask::new(
            r,
            NewTask::new(KIND, json!({ "sleep_duration_seconds": secs })).max_attempts(10),
        )
    };
    let (a, b, mut c, d, e) = (step("a"), step("b"), step("c"), step("d"), step("e"));
    if failing {
        c.task = NewTask::new(KIND, json!({ "sleep_duration_seconds": "never" })).max_attempts(1);
    }
    NewWorkflow::new(format!("diamond {n}"))
        .task(a)
        .task(b.after(["a"]))
        .task(c.after(["a"]))
        .task(d.after(["b", "c"]))
        .task(e.after(["d"]).run_on_parent_failure())
}

/// A task that waits for [`SIGNAL`] (at most 30 s), then works briefly.
pub(super) fn waiting() -> NewTask {
    NewTask::new(
        KIND,
        json!({ "wait_for": SIGNAL, "wait_seconds": 30, "sleep_duration_seconds": 0.2 }),
    )
    .max_attempts(10)
}

/// Enqueues `flow`, answering its task ids (none when the answer was lost).
pub(super) async fn enqueue(pool: &PgPool, schema: &Schema, flow: &NewWorkflow) -> Vec<i64> {
    let Ok(mut conn) = pool.acquire().await else {
        return Vec::new();
    };
    match flows::enqueue_workflow(&mut conn, schema, flow).await {
        Ok(stored) => stored.tasks.iter().map(|t| t.id).collect(),
        Err(_) => Vec::new(),
    }
}

/// Sends [`SIGNAL`] to every task waiting for it; errors (the database
/// restarting) are left for the next pass.
pub(super) async fn signal_waiting(pool: &PgPool, schema: &Schema) {
    let Ok(waiting) = sqlx::query_scalar::<_, i64>(
        "SELECT id FROM tasks WHERE status = 'waiting' AND wait_signal = $1",
    )
    .bind(SIGNAL)
    .fetch_all(pool)
    .await
    else {
        return;
    };
    for id in waiting {
        if let Ok(mut conn) = pool.acquire().await {
            let _ = store::signal(&mut conn, schema, id, SIGNAL, &json!({ "task": id })).await;
        }
    }
}

/// Who the operator pass's retries are by, in the audit trail.
const OPERATOR: &str = "chaos-operator";

/// Retries, once each, the failed tasks of workflows (the failing c's), as
/// an operator would; errors (the database restarting) are left for the
/// next pass. A retry whose answer was lost committed its audit row with
/// it, so it is not retried twice.
pub(super) async fn retry_failed(pool: &PgPool, schema: &Schema) {
    let Ok(failed) = sqlx::query_scalar::<_, i64>(
        "SELECT t.id FROM tasks t
          WHERE t.status = 'failed' AND t.workflow_id IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM lease_events e
                             WHERE e.resource = 'task:' || t.id AND e.kind = 'operator'
                               AND e.detail->>'action' = 'retry_task')",
    )
    .fetch_all(pool)
    .await
    else {
        return;
    };
    for id in failed {
        if let Ok(mut conn) = pool.acquire().await {
            let _ = control::retry(&mut conn, schema, id, OPERATOR).await;
        }
    }
}

/// What the workflow check counted.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WorkflowChecks {
    /// Workflows and their edges.
    pub workflows: usize,
    pub edges: usize,
    /// Children cancelled by a parent's failure or cancel.
    pub cascaded: usize,
    /// Failed workflow tasks the operator pass retried, and the children
    /// their first failure had cancelled that came back (cancelled again
    /// after the retry, by the second failure).
    pub retried: usize,
    pub revived: usize,
    /// Tasks that waited for a signal, and those signalled.
    pub waited: usize,
    pub signalled: usize,
    /// A child's claim before one of its parents ended.
    pub early: Vec<String>,
    /// A child of a failed or cancelled parent not cancelled (or claimed)
    /// though it cancels on a parent's failure.
    pub not_cascaded: Vec<String>,
    /// `parents_left` not the number of its open edges, or a task waiting
    /// with no parent left and no signal.
    pub miscounted: Vec<String>,
    /// A task signalled more than once, or signalled and not completed
    /// once after.
    pub signals_wrong: Vec<String>,
    /// A child cancelled by its parent's failure that stayed cancelled
    /// through the parent's retry (its only failed parent).
    pub not_revived: Vec<String>,
}

impl WorkflowChecks {
    /// Every broken invariant, one line each.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (what, items) in [
            ("children claimed before a parent ended", &self.early),
            (
                "children of a failed parent not cancelled",
                &self.not_cascaded,
            ),
            ("workflow edges miscounted", &self.miscounted),
            ("signals not delivered once", &self.signals_wrong),
            (
                "children not brought back by their parent's retry",
                &self.not_revived,
            ),
        ] {
            if !items.is_empty() {
                out.push(format!(
                    "{what}: {} (first: {})",
                    items.len(),
                    items[..items.len().min(5)].join("; ")
                ));
            }
        }
        out
    }
}

/// Reads the round's workflows and waits back (see the module).
pub(super) async fn check(pool: &PgPool) -> Result<WorkflowChecks> {
    let mut c = WorkflowChecks {
        workflows: sqlx::query_scalar::<_, i64>("SELECT count(*) FROM workflows")
            .fetch_one(pool)
            .await? as usize,
        edges: sqlx::query_scalar::<_, i64>("SELECT count(*) FROM task_parents")
            .fetch_one(pool)
            .await? as usize,
        ..Default::default()
    };
    // Every claim of a child against the moment its edge from each parent
    // closed (never closed: no claim may be), and against the end of each
    // parent that was processed. (Not against a failed or cancelled
    // parent's end: the operator pass retries failed parents, whose
    // retries bring the children their failure cancelled back, and those
    // may fail or be cancelled again, later than a cleanup child that ran
    // after their first end.)
    c.early = sqlx::query_scalar(
        "SELECT format('task %s claimed at %s, parent %s (%s) ended %s, its edge closed %s',
                       a.task_id, a.claimed_at, p.parent_id, par.status,
                       coalesce(par.processed_at, par.failed_at, par.cancelled_at)::text,
                       p.ended_at::text)
           FROM task_parents p
           JOIN attempts a ON a.task_id = p.task_id
           JOIN tasks par ON par.id = p.parent_id
          WHERE a.claimed_at < coalesce(p.ended_at, 'infinity'::timestamptz)
             OR (par.status = 'processed' AND a.claimed_at < par.processed_at)
          ORDER BY a.task_id",
    )
    .fetch_all(pool)
    .await?;
    c.not_cascaded = sqlx::query_scalar(
        "SELECT format('task %s is %s with %s attempts; parent %s %s', t.id, t.status, t.attempts,
                       par.id, par.status)
           FROM task_parents p
           JOIN tasks t ON t.id = p.task_id
           JOIN tasks par ON par.id = p.parent_id
          WHERE par.status IN ('failed', 'cancelled') AND t.on_parent_failure = 'cancel'
            AND (t.status <> 'cancelled'
                 OR EXISTS (SELECT 1 FROM attempts a WHERE a.task_id = t.id))
          ORDER BY t.id",
    )
    .fetch_all(pool)
    .await?;
    c.cascaded = sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM tasks WHERE workflow_id IS NOT NULL AND status = 'cancelled'
            AND last_error LIKE 'cancelled: parent %'",
    )
    .fetch_one(pool)
    .await? as usize;
    c.miscounted = sqlx::query_scalar(
        "SELECT format('task %s: parents_left %s, open edges %s, status %s', t.id, t.parents_left,
                       (SELECT count(*) FROM task_parents p
                         WHERE p.task_id = t.id AND p.outcome IS NULL), t.status)
           FROM tasks t
          WHERE t.parents_left <> (SELECT count(*) FROM task_parents p
                                    WHERE p.task_id = t.id AND p.outcome IS NULL)
             OR (t.status = 'waiting' AND t.parents_left = 0 AND t.wait_signal IS NULL)
          ORDER BY t.id",
    )
    .fetch_all(pool)
    .await?;
    // Each retried parent's cancelling children, against the retry's
    // time: cancelled after it (brought back, then cancelled again), or
    // not at all any more; never cancelled before it and left so, unless
    // another parent of theirs stays failed or cancelled.
    let revival: Vec<(i64, Option<String>)> = sqlx::query_as(
        "WITH r AS (
            SELECT substr(resource, 6)::bigint AS id, min(at) AS at FROM lease_events
             WHERE kind = 'operator' AND detail->>'action' = 'retry_task' AND holder = $1
             GROUP BY resource
         )
         SELECT p.task_id,
                CASE WHEN t.status = 'cancelled' AND t.cancelled_at < r.at
                     THEN format('task %s cancelled at %s, its parent %s retried at %s',
                                 t.id, t.cancelled_at, r.id, r.at) END
           FROM r JOIN task_parents p ON p.parent_id = r.id
           JOIN tasks t ON t.id = p.task_id
          WHERE t.on_parent_failure = 'cancel'
            AND NOT EXISTS (SELECT 1 FROM task_parents o JOIN tasks ot ON ot.id = o.parent_id
                             WHERE o.task_id = t.id AND o.parent_id <> r.id
                               AND ot.status IN ('failed', 'cancelled'))
          ORDER BY p.task_id",
    )
    .bind(OPERATOR)
    .fetch_all(pool)
    .await?;
    c.retried = sqlx::query_scalar::<_, i64>(
        "SELECT count(DISTINCT resource) FROM lease_events
          WHERE kind = 'operator' AND detail->>'action' = 'retry_task' AND holder = $1",
    )
    .bind(OPERATOR)
    .fetch_one(pool)
    .await? as usize;
    c.revived = revival.iter().filter(|(_, wrong)| wrong.is_none()).count();
    c.not_revived = revival.into_iter().filter_map(|(_, wrong)| wrong).collect();
    c.waited = sqlx::query_scalar::<_, i64>(
        "SELECT count(DISTINCT resource) FROM lease_events WHERE kind = 'waiting'",
    )
    .fetch_one(pool)
    .await? as usize;
    c.signalled = sqlx::query_scalar::<_, i64>(
        "SELECT count(DISTINCT resource) FROM lease_events WHERE kind = 'signalled'",
    )
    .fetch_one(pool)
    .await? as usize;
    // Signalled once; then completed once, by a claim after the signal,
    // its output holding the signal.
    c.signals_wrong = sqlx::query_scalar(
        "WITH s AS (
            SELECT substr(resource, 6)::bigint AS id, count(*) AS n, max(at) AS at
              FROM lease_events WHERE kind = 'signalled' GROUP BY resource
         )
         SELECT format('task %s: signalled %s times, status %s, %s completed after, output %s',
                       s.id, s.n, t.status,
                       (SELECT count(*) FROM attempts a
                         WHERE a.task_id = s.id AND a.outcome = 'completed' AND a.claimed_at >= s.at),
                       t.task_output::text)
           FROM s JOIN tasks t ON t.id = s.id
          WHERE s.n <> 1 OR t.status <> 'processed'
             OR (SELECT count(*) FROM attempts a
                  WHERE a.task_id = s.id AND a.outcome = 'completed' AND a.claimed_at >= s.at) <> 1
             OR t.task_output->'signals'->'go' IS NULL
          ORDER BY s.id",
    )
    .fetch_all(pool)
    .await?;
    Ok(c)
}

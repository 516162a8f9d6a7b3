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

use anyhow::Result;
use leasekeeper_core::db::Schema;
use leasekeeper_core::queue::NewTask;
use leasekeeper_core::queue::store;
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

/// What the workflow check counted.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WorkflowChecks {
    /// Workflows and their edges.
    pub workflows: usize,
    pub edges: usize,
    /// Children cancelled by a parent's failure or cancel.
    pub cascaded: usize,
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
    // Every claim of a child against the moment each parent ended (never
    // ended: no claim may be).
    c.early = sqlx::query_scalar(
        "SELECT format('task %s claimed at %s, parent %s ended %s', a.task_id, a.claimed_at,
                       p.parent_id, coalesce(par.processed_at, par.failed_at, par.cancelled_at)::text)
           FROM task_parents p
           JOIN attempts a ON a.task_id = p.task_id
           JOIN tasks par ON par.id = p.parent_id
          WHERE a.claimed_at < coalesce(par.processed_at, par.failed_at, par.cancelled_at,
                                        'infinity'::timestamptz)
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

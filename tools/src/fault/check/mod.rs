//! The invariants, checked on a finished round: the database (tasks and
//! `lease_events`, the server's record) against the workers' history (what
//! the clients were told), each check counted.
//!
//! - Exactly once: every task ended `processed` or `failed` after its
//!   maximum attempts; none is unfinished or missing; no task has two
//!   accepted completions in the history, and the one accepted completion
//!   (if the answer reached the worker) is the one the database kept.
//! - No stale write accepted: every accepted completion carries the task's
//!   final fencing token; in `lease_events`, no renewal or release carries a
//!   token older than the term in force.
//! - Tokens per resource strictly increase; no term begins before the
//!   previous one ended (by release, or by the expiry of its last grant):
//!   never two live holders, for tasks and the generator alike. Every task
//!   the generator inserted was inserted inside its term.
//! - `lease_events` is complete: every claim a worker was granted is there
//!   as `acquired`/`taken_over` with its token; a term that began while the
//!   previous one was unreleased is recorded as `taken_over`; every write a
//!   worker saw refused is there as `stale_write_refused`.
//! - Nobody in without the token: every worker holding the run's token was
//!   answered (never refused its credential); every worker without it (none,
//!   or a made-up one) was refused 401 on every call, stopped by itself
//!   naming the 401, and left nothing in `lease_events`, `workers` or
//!   `tasks`.
//! - The harness's every-second schedule: every tick from the first to the
//!   last fired exactly once (no gap, no tick twice, no two tasks of one
//!   tick), fencing tokens never going backwards along the ticks, each
//!   tick's task carrying its schedule and tick, and every gap a fault left
//!   caught up within its allowance.
//! - The queue's limits (issue 39): at every claim's instant, no more of
//!   the limited queue's tasks started than its `max_started`, nor of the
//!   claim's key than its `max_started_per_key`; in every window of claims
//!   (takeovers included), no more than its bucket allows.
//!
//! `terms.rs` walks `lease_events` into terms and checks them; `clients.rs`
//! checks what the workers themselves saw; `intruders.rs` the workers
//! without the token; `schedule.rs` checks the schedule's ticks (the
//! harness reads them, as only it knows the faults); `limits.rs` the queue's
//! limits against `attempts` (the harness reads them too).

mod clients;
pub mod intruders;
pub mod limits;
pub mod schedule;
mod terms;

use anyhow::Result;
use chrono::{DateTime, Utc};
pub use clients::Revoked;
use clients::{holders_believed_at_once, tokens_seen_by_clients};
use leasekeeper::worker::history::{Op, OpKind, Outcome};
use sqlx::PgPool;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;
use terms::scan_terms;

/// What the checks counted; [`Checks::violations`] says what is wrong.
#[derive(Clone, Debug, Default)]
pub struct Checks {
    pub tasks: usize,
    pub processed: usize,
    /// Failed after using all their attempts (allowed).
    pub failed_after_max: usize,
    /// Processed, the accepted completion seen by its worker and matching
    /// the database.
    pub confirmed_by_both: usize,
    /// Processed, but the worker never saw the answer (lost answer, killed
    /// mid-call): the database's word only.
    pub confirmed_by_database_only: usize,
    /// Tasks neither processed nor failed at the end, or failed early.
    pub lost: Vec<i64>,
    /// Tasks with more than one accepted completion.
    pub duplicates: Vec<i64>,
    /// Accepted writes that carried a stale token (described).
    pub stale_accepted: Vec<String>,
    /// Writes the workers saw refused, by kind.
    pub refused_heartbeats: usize,
    pub refused_completions: usize,
    pub refused_failures: usize,
    /// `stale_write_refused` events in the database (task leases and the
    /// generator's refused inserts).
    pub refusals_recorded: usize,
    /// Refusals a worker saw that `lease_events` lacks.
    pub refusals_unrecorded: usize,
    /// Writes whose answer never arrived.
    pub unknown_outcomes: usize,
    /// Calls of the workers holding the run's token whose credential was
    /// refused (401/403): must be none.
    pub credential_refused: usize,
    /// Workers without the token that were refused and left nothing behind.
    pub intruders_refused: usize,
    /// What an intruding worker got or left that it must not, described.
    pub intrusions: Vec<String>,
    /// Grants (claims) a worker saw that `lease_events` lacks.
    pub claims_unrecorded: usize,
    pub takeovers: usize,
    /// Terms that began while the previous was unreleased yet are not
    /// recorded as `taken_over`.
    pub takeovers_misrecorded: usize,
    /// Token order and overlapping terms, described.
    pub token_order: Vec<String>,
    pub overlaps: Vec<String>,
    /// Two workers that believed they held one task at the same moment, by
    /// this machine's one real clock (the history's), described. The
    /// database's own record cannot show this when its clock jumped (a
    /// failover to a skewed standby).
    pub believed_overlaps: Vec<String>,
    pub generator_terms: usize,
    pub generated_tasks: usize,
    pub generated_outside_term: Vec<i64>,
    /// History lines that could not be read (a writer killed mid-line).
    pub torn_history_lines: usize,
    /// The every-second schedule's ticks (filled in by the harness).
    pub schedule: schedule::ScheduleChecks,
    /// The limited queue's limits (filled in by the harness).
    pub limits: limits::LimitChecks,
    /// The workflows and durable waits (filled in by the harness).
    pub workflows: crate::fault::workflows::WorkflowChecks,
}

impl Checks {
    /// Every broken invariant, one line each; empty when all hold.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut list = |what: &str, items: &[String]| {
            if !items.is_empty() {
                out.push(format!(
                    "{what}: {} (first: {})",
                    items.len(),
                    items[..items.len().min(5)].join("; ")
                ));
            }
        };
        let ids = |v: &[i64]| v.iter().map(|id| format!("task {id}")).collect::<Vec<_>>();
        list("lost tasks", &ids(&self.lost));
        list("tasks processed twice", &ids(&self.duplicates));
        list("stale writes accepted", &self.stale_accepted);
        list("tokens out of order", &self.token_order);
        list("two live holders", &self.overlaps);
        list(
            "two holders at once by the workers' own deadlines",
            &self.believed_overlaps,
        );
        list(
            "generated outside their term",
            &ids(&self.generated_outside_term),
        );
        list("workers without the token let in", &self.intrusions);
        if self.credential_refused > 0 {
            out.push(format!(
                "calls of workers holding the token refused their credential: {}",
                self.credential_refused
            ));
        }
        if self.refusals_unrecorded > 0 {
            out.push(format!(
                "refusals missing from lease_events: {}",
                self.refusals_unrecorded
            ));
        }
        if self.claims_unrecorded > 0 {
            out.push(format!(
                "claims missing from lease_events: {}",
                self.claims_unrecorded
            ));
        }
        if self.takeovers_misrecorded > 0 {
            out.push(format!(
                "takeovers not recorded as such: {}",
                self.takeovers_misrecorded
            ));
        }
        out.extend(self.schedule.violations());
        out.extend(self.limits.violations());
        out.extend(self.workflows.violations());
        out
    }
}

pub(super) type EventRow = (
    i64,
    String,
    Option<String>,
    Option<i64>,
    String,
    Option<DateTime<Utc>>,
    DateTime<Utc>,
);

type TaskRow = (
    i64,
    String,
    i32,
    i32,
    Option<String>,
    Option<i64>,
    DateTime<Utc>,
    Option<i64>,
);

/// Checks the database behind `pool` against `history`, whose workers ran
/// with lease TTL `ttl`; the workers in `trusting` ignored their local
/// deadlines (`--trust-claims`), and `revoked` says whose claims the
/// harness ended behind their backs, and when.
pub async fn check(
    pool: &PgPool,
    history: &[Op],
    torn: usize,
    ttl: Duration,
    trusting: &BTreeSet<String>,
    revoked: &Revoked,
) -> Result<Checks> {
    let mut c = Checks {
        torn_history_lines: torn,
        ..Checks::default()
    };
    let events: Vec<EventRow> = sqlx::query_as(
        "SELECT id, resource, holder, fencing_token,
                CASE WHEN kind = 'operator' AND detail->>'action' = 'retry_task'
                     THEN 'retried' ELSE kind END,
                expires_at, at
           FROM lease_events ORDER BY id",
    )
    .fetch_all(pool)
    .await?;
    let terms = scan_terms(&events, &mut c);
    // (resource, holder, token) -> refusals recorded
    let mut refusals: HashMap<(String, String, i64), usize> = HashMap::new();
    for (_, resource, holder, token, kind, _, _) in &events {
        if kind == "stale_write_refused" {
            c.refusals_recorded += 1;
            *refusals
                .entry((
                    resource.clone(),
                    holder.clone().unwrap_or_default(),
                    token.unwrap_or_default(),
                ))
                .or_default() += 1;
        }
    }

    let tasks: Vec<TaskRow> = sqlx::query_as(
        "SELECT id,
                -- A workflow's child its parent's failure cancelled: ended as
                -- it must (the workflow check says whether rightly).
                CASE WHEN status = 'cancelled' AND workflow_id IS NOT NULL
                          AND last_error LIKE 'cancelled: parent %' THEN 'cascaded'
                     ELSE status END,
                attempts, max_attempts, processor, fencing_token, created_at,
                (task_data->>'generator_token')::bigint
           FROM tasks ORDER BY id",
    )
    .fetch_all(pool)
    .await?;
    c.tasks = tasks.len();
    let mut completions: HashMap<i64, Vec<&Op>> = HashMap::new();
    for op in history {
        let (Some(task), Some(token)) = (op.task, op.token) else {
            match op.outcome {
                Outcome::Unknown => c.unknown_outcomes += 1,
                Outcome::Unauthorized => c.credential_refused += 1,
                _ => {}
            }
            continue;
        };
        let resource = format!("task:{task}");
        match (op.op, op.outcome) {
            (OpKind::Complete, Outcome::Ok) => completions.entry(task).or_default().push(op),
            (OpKind::Claim, Outcome::Ok) => {
                let granted = terms
                    .get(&resource)
                    .is_some_and(|terms| terms.get(&token).is_some_and(|t| t.holder == op.worker));
                if !granted {
                    c.claims_unrecorded += 1;
                }
            }
            (kind, Outcome::Refused) => {
                match kind {
                    OpKind::Heartbeat => c.refused_heartbeats += 1,
                    OpKind::Complete => c.refused_completions += 1,
                    _ => c.refused_failures += 1,
                }
                let key = (resource, op.worker.clone(), token);
                match refusals.get_mut(&key) {
                    Some(n) if *n > 0 => *n -= 1,
                    _ => c.refusals_unrecorded += 1,
                }
            }
            (_, Outcome::Unknown) => c.unknown_outcomes += 1,
            (_, Outcome::Unauthorized) => c.credential_refused += 1,
            _ => {}
        }
    }

    tokens_seen_by_clients(history, &mut c);
    holders_believed_at_once(history, ttl, trusting, revoked, &mut c);
    let generator = terms.get(leasekeeper_core::generator::RESOURCE);
    c.generator_terms = generator.map_or(0, BTreeMap::len);
    for (id, status, attempts, max_attempts, processor, token, created_at, generator_token) in
        &tasks
    {
        match status.as_str() {
            "processed" => {
                c.processed += 1;
                let accepted = completions.get(id).map_or(&[][..], Vec::as_slice);
                if accepted.len() > 1 {
                    c.duplicates.push(*id);
                }
                match accepted.first() {
                    None => c.confirmed_by_database_only += 1,
                    Some(op)
                        if op.token == *token && Some(op.worker.as_str()) == processor.as_deref() =>
                    {
                        c.confirmed_by_both += 1;
                    }
                    Some(op) => c.stale_accepted.push(format!(
                        "task {id}: completion by {} with token {:?} accepted, the database kept {processor:?} with {token:?}",
                        op.worker, op.token
                    )),
                }
            }
            "failed" if attempts >= max_attempts => c.failed_after_max += 1,
            // Counted and checked by `workflows::check`.
            "cascaded" => {}
            _ => c.lost.push(*id),
        }
        if let Some(gt) = generator_token {
            c.generated_tasks += 1;
            let inside = generator
                .and_then(|terms| terms.get(gt))
                .is_some_and(|term| term.start <= *created_at && *created_at <= term.end);
            if !inside {
                c.generated_outside_term.push(*id);
            }
        }
    }
    // Accepted completions of tasks the database does not show processed.
    for (id, ops) in &completions {
        if !tasks.iter().any(|t| t.0 == *id && t.1 == "processed") {
            c.stale_accepted.push(format!(
                "task {id}: {} completion(s) accepted but the task is not processed",
                ops.len()
            ));
        }
    }
    Ok(c)
}

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

use anyhow::Result;
use chrono::{DateTime, Utc};
use leasekeeper::worker::history::{Op, OpKind, Outcome};
use sqlx::PgPool;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

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
    pub lost: Vec<i32>,
    /// Tasks with more than one accepted completion.
    pub duplicates: Vec<i32>,
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
    pub generated_outside_term: Vec<i32>,
    /// History lines that could not be read (a writer killed mid-line).
    pub torn_history_lines: usize,
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
        let ids = |v: &[i32]| v.iter().map(|id| format!("task {id}")).collect::<Vec<_>>();
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
        out
    }
}

/// One term of one resource, from `lease_events`.
#[derive(Clone, Debug)]
struct Term {
    holder: String,
    token: i64,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    released: bool,
}

type EventRow = (
    i64,
    String,
    Option<String>,
    Option<i64>,
    String,
    Option<DateTime<Utc>>,
    DateTime<Utc>,
);

type TaskRow = (
    i32,
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
/// deadlines (`--trust-claims`).
pub async fn check(
    pool: &PgPool,
    history: &[Op],
    torn: usize,
    ttl: Duration,
    trusting: &BTreeSet<String>,
) -> Result<Checks> {
    let mut c = Checks {
        torn_history_lines: torn,
        ..Checks::default()
    };
    let events: Vec<EventRow> = sqlx::query_as(
        "SELECT id, resource, holder, fencing_token, kind, expires_at, at
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
        "SELECT id, status, attempts, max_attempts, processor, fencing_token, created_at,
                (task_data->>'generator_token')::bigint
           FROM tasks ORDER BY id",
    )
    .fetch_all(pool)
    .await?;
    c.tasks = tasks.len();
    let mut completions: HashMap<i32, Vec<&Op>> = HashMap::new();
    for op in history {
        let (Some(task), Some(token)) = (op.task, op.token) else {
            if op.outcome == Outcome::Unknown {
                c.unknown_outcomes += 1;
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
            _ => {}
        }
    }

    tokens_seen_by_clients(history, &mut c);
    holders_believed_at_once(history, ttl, trusting, &mut c);
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

/// The tokens the workers were granted, whatever the database says now
/// (after a failover that lost commits it cannot say): per task, a token is
/// granted once, and a claim sent after another claim's answer arrived gets
/// a higher token.
fn tokens_seen_by_clients(history: &[Op], c: &mut Checks) {
    let mut grants: HashMap<i32, Vec<&Op>> = HashMap::new();
    for op in history {
        if let (OpKind::Claim, Outcome::Ok, Some(task), Some(_)) =
            (op.op, op.outcome, op.task, op.token)
        {
            grants.entry(task).or_default().push(op);
        }
    }
    let mut tasks: Vec<_> = grants.into_iter().collect();
    tasks.sort_by_key(|(task, _)| *task);
    for (task, mut ops) in tasks {
        ops.sort_by_key(|op| op.returned_ms);
        for (i, later) in ops.iter().enumerate() {
            for earlier in &ops[..i] {
                if later.token == earlier.token {
                    c.token_order.push(format!(
                        "task:{task}: token {} granted to both {} and {} (clients' history)",
                        later.token.unwrap_or_default(),
                        earlier.worker,
                        later.worker
                    ));
                } else if later.sent_ms > earlier.returned_ms && later.token < earlier.token {
                    c.token_order.push(format!(
                        "task:{task}: token {} granted to {} after {} had been granted to {} (clients' history)",
                        later.token.unwrap_or_default(),
                        later.worker,
                        earlier.token.unwrap_or_default(),
                        earlier.worker
                    ));
                }
            }
        }
    }
}

/// Two holders at once, as the workers saw it: a worker trusts a claim
/// until its local deadline (the claim's or last accepted heartbeat's send
/// time plus nine tenths of the TTL; see the worker loop), unless a refusal
/// or its own completion ended it first. Another worker granted the task
/// (its claim answered) before that deadline means two workers believed
/// they held it at once. Workers in `trusting` ignore their deadlines on
/// purpose and are not counted as believers; send and answer times are all
/// from this machine's clock, so no database clock is involved.
fn holders_believed_at_once(
    history: &[Op],
    ttl: Duration,
    trusting: &BTreeSet<String>,
    c: &mut Checks,
) {
    let trusted_ms = (ttl.as_secs_f64() * 900.0) as i64;
    // (task, worker, token) -> (granted at, believed until)
    let mut beliefs: BTreeMap<(i32, String, i64), (i64, i64)> = BTreeMap::new();
    let mut ops: Vec<&Op> = history.iter().collect();
    ops.sort_by_key(|op| op.sent_ms);
    for op in ops {
        let (Some(task), Some(token)) = (op.task, op.token) else {
            continue;
        };
        let key = (task, op.worker.clone(), token);
        match (op.op, op.outcome) {
            (OpKind::Claim, Outcome::Ok) => {
                beliefs.insert(key, (op.returned_ms, op.sent_ms + trusted_ms));
            }
            (OpKind::Heartbeat, Outcome::Ok) => {
                if let Some(b) = beliefs.get_mut(&key) {
                    b.1 = b.1.max(op.sent_ms + trusted_ms);
                }
            }
            // A refusal, or its own completion or failure report, ends the
            // belief when its answer arrives (if before the deadline).
            (_, Outcome::Refused) | (OpKind::Complete | OpKind::Fail, Outcome::Ok) => {
                if let Some(b) = beliefs.get_mut(&key) {
                    b.1 = b.1.min(op.returned_ms);
                }
            }
            _ => {}
        }
    }
    let mut by_task: BTreeMap<i32, Vec<(&String, i64, i64, i64)>> = BTreeMap::new();
    for ((task, worker, token), (from, until)) in &beliefs {
        by_task
            .entry(*task)
            .or_default()
            .push((worker, *token, *from, *until));
    }
    for (task, claims) in by_task {
        for a in &claims {
            if trusting.contains(a.0) {
                continue;
            }
            for b in &claims {
                if b.1 > a.1 && b.2 < a.3 && b.2 > a.2 {
                    c.believed_overlaps.push(format!(
                        "task {task}: {} (token {}) trusted its claim until {} ms, but {} was granted token {} at {} ms",
                        a.0,
                        a.1,
                        a.3 % 100_000,
                        b.0,
                        b.1,
                        b.2 % 100_000
                    ));
                }
            }
        }
    }
}

/// Terms by resource, by token.
type TermsByResource = HashMap<String, BTreeMap<i64, Term>>;

/// Walks `lease_events` in order, resource by resource: tokens must rise,
/// a term may begin only once the previous ended, renewals and releases
/// must carry the token in force, and a term that began over an unreleased
/// one must be recorded as `taken_over`.
fn scan_terms(events: &[EventRow], c: &mut Checks) -> TermsByResource {
    let mut terms: TermsByResource = HashMap::new();
    // resource -> token of the term in force
    let mut current: HashMap<&str, i64> = HashMap::new();
    for (id, resource, holder, token, kind, expires_at, at) in events {
        let Some(token) = *token else { continue };
        let holder = holder.clone().unwrap_or_default();
        let by_token = terms.entry(resource.clone()).or_default();
        match kind.as_str() {
            "acquired" | "taken_over" => {
                if kind == "taken_over" {
                    c.takeovers += 1;
                }
                if let Some(previous) = current.get(resource.as_str()) {
                    let previous = &by_token[previous];
                    if token <= previous.token {
                        c.token_order.push(format!(
                            "{resource}: token {token} (event {id}) after {}",
                            previous.token
                        ));
                    }
                    if *at < previous.end {
                        c.overlaps.push(format!(
                            "{resource}: term {token} of {holder} began at {at} before term {} of {} ended at {}",
                            previous.token, previous.holder, previous.end
                        ));
                    }
                    if !previous.released && kind == "acquired" {
                        c.takeovers_misrecorded += 1;
                    }
                }
                let term = Term {
                    holder,
                    token,
                    start: *at,
                    end: expires_at.unwrap_or(*at),
                    released: false,
                };
                if by_token.insert(token, term).is_some() {
                    c.token_order
                        .push(format!("{resource}: token {token} granted twice"));
                }
                current.insert(resource, token);
            }
            "renewed" | "released" | "deleted" => {
                let in_force = current.get(resource.as_str()).copied();
                if in_force != Some(token) {
                    c.stale_accepted.push(format!(
                        "{resource}: {kind} with token {token} while {in_force:?} was in force (event {id})"
                    ));
                    continue;
                }
                let term = by_token.get_mut(&token).expect("the term in force exists");
                if kind == "renewed" {
                    if term.released || *at > term.end {
                        c.stale_accepted.push(format!(
                            "{resource}: term {token} renewed at {at} after it ended at {}",
                            term.end
                        ));
                    }
                    term.end = term.end.max(expires_at.unwrap_or(term.end));
                } else {
                    term.end = if kind == "deleted" {
                        *at
                    } else {
                        expires_at.unwrap_or(*at)
                    };
                    term.released = true;
                }
            }
            _ => {}
        }
    }
    terms
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    fn ev(id: i64, holder: &str, token: i64, kind: &str, expires: i64, at: i64) -> EventRow {
        (
            id,
            "task:1".into(),
            Some(holder.into()),
            Some(token),
            kind.into(),
            Some(t(expires)),
            t(at),
        )
    }

    fn scan(events: &[EventRow]) -> Checks {
        let mut c = Checks::default();
        scan_terms(events, &mut c);
        c
    }

    #[test]
    fn a_clean_history_passes() {
        let c = scan(&[
            ev(1, "a", 1, "acquired", 2000, 0),
            ev(2, "a", 1, "renewed", 2500, 500),
            ev(3, "b", 2, "taken_over", 4600, 2600),
            ev(4, "a", 1, "stale_write_refused", 2500, 2700),
            ev(5, "b", 2, "released", 3000, 3000),
            ev(6, "c", 3, "acquired", 5000, 3000),
        ]);
        assert!(c.violations().is_empty(), "{c:?}");
        assert_eq!(c.takeovers, 1);
    }

    #[test]
    fn a_term_beginning_before_the_last_ended_is_two_live_holders() {
        let c = scan(&[
            ev(1, "a", 1, "acquired", 2000, 0),
            ev(2, "a", 1, "renewed", 3000, 1000),
            ev(3, "b", 2, "taken_over", 4000, 2500),
        ]);
        assert_eq!(c.overlaps.len(), 1, "{c:?}");
    }

    #[test]
    fn a_renewal_or_release_with_an_old_token_is_a_stale_write_accepted() {
        let c = scan(&[
            ev(1, "a", 1, "acquired", 2000, 0),
            ev(2, "b", 2, "taken_over", 4000, 2000),
            ev(3, "a", 1, "renewed", 5000, 2100),
            ev(4, "a", 1, "released", 2200, 2200),
        ]);
        assert_eq!(c.stale_accepted.len(), 2, "{c:?}");
    }

    #[test]
    fn a_renewal_after_expiry_is_a_stale_write_accepted() {
        let c = scan(&[
            ev(1, "a", 1, "acquired", 2000, 0),
            ev(2, "a", 1, "renewed", 4500, 2500),
        ]);
        assert_eq!(c.stale_accepted.len(), 1, "{c:?}");
    }

    fn claim(worker: &str, token: i64, sent: i64, returned: i64) -> Op {
        Op {
            worker: worker.into(),
            op: OpKind::Claim,
            task: Some(7),
            token: Some(token),
            outcome: Outcome::Ok,
            sent_ms: sent,
            returned_ms: returned,
        }
    }

    #[test]
    fn a_token_granted_twice_or_lower_after_a_higher_is_caught_from_the_history() {
        let mut c = Checks::default();
        tokens_seen_by_clients(&[claim("a", 1, 0, 10), claim("b", 2, 20, 30)], &mut c);
        assert!(c.token_order.is_empty(), "{c:?}");
        // A failover lost the first grant; the new primary grants it again.
        tokens_seen_by_clients(&[claim("a", 1, 0, 10), claim("b", 1, 20, 30)], &mut c);
        assert_eq!(c.token_order.len(), 1, "{c:?}");
        let mut c = Checks::default();
        tokens_seen_by_clients(&[claim("a", 3, 0, 10), claim("b", 2, 20, 30)], &mut c);
        assert_eq!(c.token_order.len(), 1, "{c:?}");
        // Overlapping calls may come back in either order.
        let mut c = Checks::default();
        tokens_seen_by_clients(&[claim("a", 3, 0, 30), claim("b", 2, 5, 20)], &mut c);
        assert!(c.token_order.is_empty(), "{c:?}");
    }

    fn op(
        kind: OpKind,
        worker: &str,
        token: i64,
        outcome: Outcome,
        sent: i64,
        returned: i64,
    ) -> Op {
        Op {
            worker: worker.into(),
            op: kind,
            task: Some(7),
            token: Some(token),
            outcome,
            sent_ms: sent,
            returned_ms: returned,
        }
    }

    #[test]
    fn a_grant_before_the_last_holders_deadline_is_two_holders_at_once() {
        let ttl = Duration::from_secs(2);
        let none = BTreeSet::new();
        let believed = |history: &[Op], trusting: &BTreeSet<String>| {
            let mut c = Checks::default();
            holders_believed_at_once(history, ttl, trusting, &mut c);
            c.believed_overlaps.len()
        };
        let a = op(OpKind::Claim, "a", 1, Outcome::Ok, 0, 10);
        let beat = op(OpKind::Heartbeat, "a", 1, Outcome::Ok, 1000, 1010);
        // a trusts until 1000 + 1800 = 2800 ms.
        let b_late = op(OpKind::Claim, "b", 2, Outcome::Ok, 2900, 2950);
        let b_early = op(OpKind::Claim, "b", 2, Outcome::Ok, 2500, 2600);
        assert_eq!(believed(&[a.clone(), beat.clone(), b_late], &none), 0);
        assert_eq!(
            believed(&[a.clone(), beat.clone(), b_early.clone()], &none),
            1
        );
        // A refusal the holder saw first ends its belief.
        let refused = op(OpKind::Heartbeat, "a", 1, Outcome::Refused, 2000, 2100);
        assert_eq!(
            believed(&[a.clone(), beat.clone(), refused, b_early.clone()], &none),
            0
        );
        // A --trust-claims worker ignores deadlines on purpose.
        let trusting: BTreeSet<String> = ["a".to_string()].into();
        assert_eq!(believed(&[a, beat, b_early], &trusting), 0);
    }

    #[test]
    fn tokens_must_rise_and_takeovers_must_say_so() {
        let c = scan(&[
            ev(1, "a", 5, "acquired", 2000, 0),
            ev(2, "b", 4, "acquired", 5000, 3000),
        ]);
        assert_eq!(c.token_order.len(), 1, "{c:?}");
        assert_eq!(c.takeovers_misrecorded, 1, "{c:?}");
        let c = scan(&[
            ev(1, "a", 1, "acquired", 2000, 0),
            ev(2, "b", 1, "taken_over", 5000, 3000),
        ]);
        assert_eq!(c.token_order.len(), 2, "same token twice: {c:?}");
    }
}

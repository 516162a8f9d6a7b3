//! What the workers themselves saw (their `--history`): tokens granted
//! once and rising, and no two workers believing they held one task at once.

use super::Checks;
use leasekeeper::worker::history::{Op, OpKind, Outcome};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

/// The tokens the workers were granted, whatever the database says now
/// (after a failover that lost commits it cannot say): per task, a token is
/// granted once, and a claim sent after another claim's answer arrived gets
/// a higher token.
pub(super) fn tokens_seen_by_clients(history: &[Op], c: &mut Checks) {
    let mut grants: HashMap<i64, Vec<&Op>> = HashMap::new();
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
/// time plus nine tenths of the TTL; see the worker loop), unless a refusal,
/// its own completion or its giving the claim up (its session stream
/// broke) ended it first. Another worker granted the task
/// (its claim answered) before that deadline means two workers believed
/// they held it at once. Workers in `trusting` ignore their deadlines on
/// purpose and are not counted as believers. What the harness revoked
/// behind a worker's back ([`Revoked`]) ends its belief at that instant: a
/// killed worker believes nothing after; a worker whose instance's liveness
/// session was cut had its claims ended by the database at the cut, and
/// trusting one of them longer than [`NOTICE_CUT_MS`] after it is a
/// belief the protocol does not allow. Send and answer times are all from
/// this machine's clock, so no database clock is involved.
/// How long a worker may go on trusting a claim after its instance's
/// liveness session was cut: its instance's check (every 200 ms) notices,
/// the worker's session stream ends, and slack for a loaded machine.
pub(super) const NOTICE_CUT_MS: i64 = 1500;

/// Claims the harness ended behind their workers' backs, by worker, at
/// these instants (this machine's clock, as the history's).
#[derive(Debug, Default)]
pub struct Revoked {
    /// Killed -9.
    pub killed: BTreeMap<String, Vec<i64>>,
    /// Their instance's liveness session cut.
    pub cut: BTreeMap<String, Vec<i64>>,
}

pub(super) fn holders_believed_at_once(
    history: &[Op],
    ttl: Duration,
    trusting: &BTreeSet<String>,
    revoked: &Revoked,
    c: &mut Checks,
) {
    let killed = &revoked.killed;
    let trusted_ms = (ttl.as_secs_f64() * 900.0) as i64;
    // (task, worker, token) -> (granted at, believed until)
    let mut beliefs: BTreeMap<(i64, String, i64), (i64, i64)> = BTreeMap::new();
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
            // A refusal (of the claim, or of the credential: the worker
            // abandons the task and stops), or its own completion or
            // failure report, ends the belief when its answer arrives (if
            // before the deadline).
            // So does a wait for a signal, which ends the claim as a
            // completion does.
            // So does its giving up without a write (its session stream
            // broke: its instance may be ending the claim at once).
            (_, Outcome::Refused | Outcome::Unauthorized)
            | (OpKind::Complete | OpKind::Fail | OpKind::Wait | OpKind::GaveUp, Outcome::Ok) => {
                if let Some(b) = beliefs.get_mut(&key) {
                    b.1 = b.1.min(op.returned_ms);
                }
            }
            _ => {}
        }
    }
    // A killed worker believes nothing from its death on: with liveness
    // its claims are taken over within a second, long before its deadline.
    for ((_, worker, _), (from, until)) in beliefs.iter_mut() {
        for &at in killed.get(worker).map_or(&[][..], Vec::as_slice) {
            if *from <= at {
                *until = (*until).min(at);
            }
        }
    }
    for ((task, worker, token), (from, until)) in beliefs.iter_mut() {
        for &at in revoked.cut.get(worker).map_or(&[][..], Vec::as_slice) {
            if *from <= at && at < *until {
                if *until > at + NOTICE_CUT_MS && !trusting.contains(worker) {
                    c.believed_overlaps.push(format!(
                        "task {task}: {worker} (token {token}) trusted its claim {} ms after its instance's liveness session was cut (at {} ms)",
                        *until - at,
                        at % 100_000
                    ));
                }
                *until = at;
            }
        }
    }
    let mut by_task: BTreeMap<i64, Vec<(&String, i64, i64, i64)>> = BTreeMap::new();
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

#[cfg(test)]
mod tests {
    use super::*;

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
            holders_believed_at_once(history, ttl, trusting, &Revoked::default(), &mut c);
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
        // So does its giving the claim up (its session stream broke)
        // before the other's grant; not after it.
        let gave_up = op(OpKind::GaveUp, "a", 1, Outcome::Ok, 2400, 2400);
        assert_eq!(
            believed(&[a.clone(), beat.clone(), gave_up, b_early.clone()], &none),
            0
        );
        let gave_up_late = op(OpKind::GaveUp, "a", 1, Outcome::Ok, 2700, 2700);
        assert_eq!(
            believed(
                &[a.clone(), beat.clone(), gave_up_late, b_early.clone()],
                &none
            ),
            1
        );
        // A worker killed before the other's grant believes nothing after.
        let mut c = Checks::default();
        let killed = Revoked {
            killed: BTreeMap::from([("a".to_string(), vec![2400])]),
            ..Revoked::default()
        };
        holders_believed_at_once(
            &[a.clone(), beat.clone(), b_early.clone()],
            ttl,
            &none,
            &killed,
            &mut c,
        );
        assert!(c.believed_overlaps.is_empty(), "{:?}", c.believed_overlaps);
        let killed_after = Revoked {
            killed: BTreeMap::from([("a".to_string(), vec![2700])]),
            ..Revoked::default()
        };
        holders_believed_at_once(
            &[a.clone(), beat.clone(), b_early.clone()],
            ttl,
            &none,
            &killed_after,
            &mut c,
        );
        assert_eq!(c.believed_overlaps.len(), 1);
        // A cut session ends the belief at the cut, when the worker gave
        // the claim up soon after; trusting it long after is caught.
        let cut = Revoked {
            cut: BTreeMap::from([("a".to_string(), vec![2400])]),
            ..Revoked::default()
        };
        let gave_up_soon = op(OpKind::GaveUp, "a", 1, Outcome::Ok, 2650, 2650);
        let mut c = Checks::default();
        holders_believed_at_once(
            &[a.clone(), beat.clone(), gave_up_soon, b_early.clone()],
            ttl,
            &none,
            &cut,
            &mut c,
        );
        assert!(c.believed_overlaps.is_empty(), "{:?}", c.believed_overlaps);
        let cut_early = Revoked {
            cut: BTreeMap::from([("a".to_string(), vec![1050])]),
            ..Revoked::default()
        };
        let mut c = Checks::default();
        holders_believed_at_once(
            &[a.clone(), beat.clone(), b_early.clone()],
            ttl,
            &none,
            &cut_early,
            &mut c,
        );
        assert_eq!(c.believed_overlaps.len(), 1, "{:?}", c.believed_overlaps);
        assert!(c.believed_overlaps[0].contains("liveness session was cut"));
        // A --trust-claims worker ignores deadlines on purpose.
        let trusting: BTreeSet<String> = ["a".to_string()].into();
        assert_eq!(believed(&[a, beat, b_early], &trusting), 0);
    }
}

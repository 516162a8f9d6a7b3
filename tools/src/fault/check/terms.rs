//! The checker's own walk of `lease_events`, resource by resource, into
//! terms, and what it checks on the way: tokens rise, terms do not
//! overlap, renewals and releases carry the token in force, takeovers say so.

use super::{Checks, EventRow};
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, HashMap};

/// One term of one resource as the checker's own walk of `lease_events`
/// sees it: its start and the latest expiry its events gave it. (The
/// checker reads the history itself, not through the library's
/// `lease::history`: an oracle that shared that code could not catch its
/// bugs.)
#[derive(Clone, Debug)]
pub(super) struct TermSpan {
    pub(super) holder: String,
    pub(super) token: i64,
    pub(super) start: DateTime<Utc>,
    pub(super) end: DateTime<Utc>,
    pub(super) released: bool,
}

/// Terms by resource, by token.
pub(super) type TermsByResource = HashMap<String, BTreeMap<i64, TermSpan>>;

/// Walks `lease_events` in order, resource by resource: tokens must rise,
/// a term may begin only once the previous ended, renewals and releases
/// must carry the token in force, and a term that began over an unreleased
/// one must be recorded as `taken_over`.
pub(super) fn scan_terms(events: &[EventRow], c: &mut Checks) -> TermsByResource {
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
                let term = TermSpan {
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
            // A term ended by its holder's lost liveness session ends like
            // a release, at the event's expires_at (now).
            "renewed" | "released" | "deleted" | "session_ended" => {
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
            // An operator's retry of a failed or cancelled task (read as
            // 'retried' from its audit row): its last claim had ended, at
            // its deadline when the rescuer failed it late (which writes
            // no 'released'), so the next claim acquires the task anew,
            // not over a term in force.
            "retried" => {
                if let Some(term) = current
                    .get(resource.as_str())
                    .and_then(|token| by_token.get_mut(token))
                {
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

    #[test]
    fn a_claim_after_an_operator_s_retry_of_a_late_failed_task_acquires_anew() {
        // The rescuer failed the task after its term ran out (no
        // 'released'); an operator retried it; the next claim acquires.
        let late_failed = [
            ev(1, "a", 1, "acquired", 2000, 0),
            ev(2, "ops", 1, "retried", 0, 2500),
            ev(3, "b", 2, "acquired", 5000, 3000),
        ];
        let c = scan(&late_failed);
        assert_eq!(c.takeovers_misrecorded, 0, "{c:?}");
        assert!(c.overlaps.is_empty(), "{c:?}");
        // Without the retry, the same claim is a takeover recorded wrong.
        let c = scan(&[late_failed[0].clone(), late_failed[2].clone()]);
        assert_eq!(c.takeovers_misrecorded, 1, "{c:?}");
    }
}

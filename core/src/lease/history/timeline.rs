//! A resource's ownership timeline, built from its `lease_events`: one term
//! per acquisition (holder, fencing token, start, renewals, how it ended),
//! the unowned gaps between terms, and marks for refused stale writes and
//! operator actions. Pure, so the dashboard draws it and the tests check it.

use crate::lease::LeaseEvent;
use crate::text::text_enum;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

text_enum! {
    /// How a term ended.
    #[derive(Serialize, Deserialize)]
    pub enum TermEnd {
        /// Its holder (or an operator) released it.
        Released = "released",
        /// It ran out and nobody has taken it yet.
        Expired = "expired",
        /// It ran out and another holder took the resource over.
        TakenOver = "taken_over",
        /// The lease row was deleted.
        Deleted = "deleted",
        /// Still held.
        Held = "held",
    }
}

/// One holder's term.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Term {
    /// Who held it.
    pub holder: String,
    /// Its fencing token.
    pub token: i64,
    /// When it began.
    pub start: DateTime<Utc>,
    /// When it ended (for a held term: the time the timeline was built).
    pub end: DateTime<Utc>,
    /// How it ended.
    pub end_kind: TermEnd,
    /// Whether it began by taking over an expired term.
    pub took_over: bool,
    /// Each renewal.
    pub renewals: Vec<DateTime<Utc>>,
}

/// A point event on the timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Mark {
    /// When.
    pub at: DateTime<Utc>,
    /// `stale_write_refused` or `operator`.
    pub kind: String,
    /// Who (the refused writer, or the acting instance).
    pub holder: Option<String>,
    /// What happened, in words.
    pub text: String,
}

/// The whole picture between `from` and `to`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// The first event's time.
    pub from: DateTime<Utc>,
    /// When it was built (database clock).
    pub to: DateTime<Utc>,
    /// Terms, oldest first.
    pub terms: Vec<Term>,
    /// Refused writes and operator actions, oldest first.
    pub marks: Vec<Mark>,
}

impl Timeline {
    /// Stretches with nobody holding the resource, between `from` and `to`.
    pub fn gaps(&self) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
        let mut spans: Vec<_> = self.terms.iter().map(|t| (t.start, t.end)).collect();
        spans.sort();
        let mut gaps = Vec::new();
        let mut cursor = self.from;
        for (start, end) in spans {
            if start > cursor {
                gaps.push((cursor, start));
            }
            cursor = cursor.max(end);
        }
        if self.to > cursor {
            gaps.push((cursor, self.to));
        }
        gaps
    }

    /// The part of this timeline within `window` of its end: terms that
    /// ended before are left out, one that began before starts at the
    /// window's edge (its takeover mark, if any, was before it too), and so
    /// do renewals and marks before it. The whole timeline when `window` is
    /// longer than it.
    pub fn recent(&self, window: chrono::Duration) -> Timeline {
        let from = self.from.max(self.to - window);
        let terms = self
            .terms
            .iter()
            .filter(|t| t.end >= from)
            .map(|t| {
                let mut t = t.clone();
                if t.start < from {
                    t.start = from;
                    t.took_over = false;
                    t.renewals.retain(|r| *r >= from);
                }
                t
            })
            .collect();
        Timeline {
            from,
            to: self.to,
            terms,
            marks: self
                .marks
                .iter()
                .filter(|m| m.at >= from)
                .cloned()
                .collect(),
        }
    }

    /// The holders, in order of first appearance (one lane each).
    pub fn holders(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for t in &self.terms {
            if !out.contains(&t.holder) {
                out.push(t.holder.clone());
            }
        }
        out
    }
}

/// Builds the timeline from `events` (any order) as of `now`.
pub fn build(events: &[LeaseEvent], now: DateTime<Utc>) -> Timeline {
    let mut events: Vec<&LeaseEvent> = events.iter().collect();
    events.sort_by_key(|e| e.id);
    let mut terms: Vec<Term> = Vec::new();
    let mut open: Option<(Term, Option<DateTime<Utc>>)> = None;
    let mut marks = Vec::new();
    let close = |open: &mut Option<(Term, Option<DateTime<Utc>>)>,
                 terms: &mut Vec<Term>,
                 end: DateTime<Utc>,
                 kind: TermEnd| {
        if let Some((mut term, _)) = open.take() {
            term.end = end.max(term.start);
            term.end_kind = kind;
            terms.push(term);
        }
    };
    for e in events {
        match e.kind.as_str() {
            "acquired" | "taken_over" => {
                let took_over = e.kind == "taken_over";
                // The previous term ended at its expiry when taken over,
                // else (it should have been released already) right here.
                let previous_expiry = open.as_ref().and_then(|(_, exp)| *exp);
                if took_over {
                    close(
                        &mut open,
                        &mut terms,
                        previous_expiry.unwrap_or(e.at).min(e.at),
                        TermEnd::TakenOver,
                    );
                } else {
                    close(&mut open, &mut terms, e.at, TermEnd::Released);
                }
                open = Some((
                    Term {
                        holder: e.holder.clone().unwrap_or_default(),
                        token: e.fencing_token.unwrap_or_default(),
                        start: e.at,
                        end: e.at,
                        end_kind: TermEnd::Held,
                        took_over,
                        renewals: Vec::new(),
                    },
                    e.expires_at,
                ));
            }
            "renewed" => {
                if let Some((term, exp)) = open.as_mut() {
                    term.renewals.push(e.at);
                    *exp = e.expires_at;
                }
            }
            // Its holder's liveness was found gone (a crash, a killed
            // worker, a closed stream: see `crate::liveness`): the term ran
            // out then, not at its old expiry; a takeover that follows
            // closes it there, and without one it is expired from then.
            "session_ended" => {
                if let Some((term, exp)) = open.as_mut()
                    && term.token == e.fencing_token.unwrap_or_default()
                {
                    *exp = Some(exp.map_or(e.at, |x| x.min(e.at)));
                }
            }
            "released" => close(&mut open, &mut terms, e.at, TermEnd::Released),
            "deleted" => close(&mut open, &mut terms, e.at, TermEnd::Deleted),
            "stale_write_refused" | "operator" => {
                let detail = e.detail.as_ref();
                let field = |k: &str| detail.and_then(|d| d.get(k)).and_then(|v| v.as_str());
                let text = if e.kind == "operator" {
                    format!("operator: {}", field("action").unwrap_or("action"))
                } else {
                    format!("refused: {}", field("reason").unwrap_or("stale write"))
                };
                marks.push(Mark {
                    at: e.at,
                    kind: e.kind.clone(),
                    holder: e.holder.clone(),
                    text,
                });
            }
            _ => {}
        }
    }
    if let Some((_, expiry)) = open.as_ref() {
        match expiry {
            Some(exp) if *exp <= now => {
                let exp = *exp;
                close(&mut open, &mut terms, exp, TermEnd::Expired);
            }
            _ => close(&mut open, &mut terms, now, TermEnd::Held),
        }
    }
    let from = terms
        .iter()
        .map(|t| t.start)
        .chain(marks.iter().map(|m| m.at))
        .min()
        .unwrap_or(now);
    Timeline {
        from,
        to: now.max(from),
        terms,
        marks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn ev(id: i64, kind: &str, holder: &str, token: i64, at: i64, expires: i64) -> LeaseEvent {
        LeaseEvent {
            id,
            resource: "r".into(),
            holder: Some(holder.into()),
            fencing_token: Some(token),
            kind: kind.into(),
            previous_holder: None,
            expires_at: Some(t(expires)),
            detail: None,
            at: t(at),
        }
    }

    #[test]
    fn a_takeover_ends_the_old_term_at_its_expiry_and_leaves_a_gap() {
        let events = vec![
            ev(1, "acquired", "a", 1, 0, 10),
            ev(2, "renewed", "a", 1, 3, 13),
            ev(3, "renewed", "a", 1, 6, 16),
            ev(4, "taken_over", "b", 2, 20, 30),
        ];
        let tl = build(&events, t(25));
        assert_eq!(tl.terms.len(), 2);
        let (a, b) = (&tl.terms[0], &tl.terms[1]);
        assert_eq!(
            (a.holder.as_str(), a.token, a.end, a.end_kind),
            ("a", 1, t(16), TermEnd::TakenOver)
        );
        assert_eq!(a.renewals, vec![t(3), t(6)]);
        assert_eq!(
            (b.holder.as_str(), b.token, b.start, b.end, b.end_kind),
            ("b", 2, t(20), t(25), TermEnd::Held)
        );
        assert!(b.took_over && !a.took_over);
        assert_eq!(tl.gaps(), vec![(t(16), t(20))]);
        assert_eq!(tl.holders(), vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn a_recent_window_leaves_out_older_terms_and_cuts_the_one_across_its_edge() {
        let events = vec![
            ev(1, "acquired", "a", 1, 0, 10),
            ev(2, "released", "a", 1, 5, 5),
            ev(3, "acquired", "b", 2, 100, 200),
            ev(4, "renewed", "b", 2, 110, 210),
            ev(5, "renewed", "b", 2, 150, 250),
        ];
        let mut stale = ev(6, "stale_write_refused", "a", 1, 20, 20);
        stale.expires_at = None;
        let mut events = events;
        events.push(stale);
        let tl = build(&events, t(160));
        assert_eq!(tl.from, t(0));
        let recent = tl.recent(chrono::Duration::seconds(60));
        assert_eq!(recent.from, t(100), "60 s before the end");
        assert_eq!(recent.to, t(160));
        assert_eq!(recent.terms.len(), 1, "a's term ended before the window");
        assert_eq!(recent.terms[0].holder, "b");
        assert_eq!(recent.terms[0].start, t(100));
        assert_eq!(recent.terms[0].renewals, vec![t(110), t(150)]);
        assert!(recent.marks.is_empty(), "the refused write was before it");
        let narrower = tl.recent(chrono::Duration::seconds(30));
        assert_eq!(narrower.terms[0].start, t(130), "cut at the window's edge");
        assert_eq!(narrower.terms[0].renewals, vec![t(150)]);
        assert_eq!(
            tl.recent(chrono::Duration::seconds(1_000)),
            tl,
            "a longer window is the whole"
        );
    }

    #[test]
    fn a_term_ended_by_its_session_ends_there_and_the_gap_to_the_takeover_shows() {
        let events = vec![
            ev(1, "acquired", "a", 1, 0, 15),
            ev(2, "session_ended", "a", 1, 3, 3),
            ev(3, "taken_over", "b", 2, 4, 19),
            ev(4, "released", "b", 2, 9, 9),
            ev(5, "acquired", "c", 3, 30, 45),
            ev(6, "session_ended", "c", 3, 32, 32),
        ];
        let tl = build(&events, t(40));
        let ends: Vec<_> = tl
            .terms
            .iter()
            .map(|t| (t.holder.as_str(), t.end, t.end_kind))
            .collect();
        assert_eq!(
            ends,
            vec![
                ("a", t(3), TermEnd::TakenOver),
                ("b", t(9), TermEnd::Released),
                ("c", t(32), TermEnd::Expired),
            ],
            "ended when the session did, not at 15 s or 45 s"
        );
        assert_eq!(tl.gaps()[0], (t(3), t(4)));
    }

    #[test]
    fn release_then_acquire_is_not_a_takeover() {
        let events = vec![
            ev(1, "acquired", "a", 1, 0, 10),
            ev(2, "released", "a", 1, 4, 4),
            ev(3, "acquired", "b", 2, 7, 17),
            ev(4, "released", "b", 2, 9, 9),
        ];
        let tl = build(&events, t(12));
        let ends: Vec<_> = tl
            .terms
            .iter()
            .map(|t| (t.end, t.end_kind, t.took_over))
            .collect();
        assert_eq!(
            ends,
            vec![
                (t(4), TermEnd::Released, false),
                (t(9), TermEnd::Released, false)
            ]
        );
        assert_eq!(tl.gaps(), vec![(t(4), t(7)), (t(9), t(12))]);
    }

    #[test]
    fn an_unrenewed_term_past_its_expiry_shows_expired_not_held() {
        let events = vec![ev(1, "acquired", "a", 5, 0, 10)];
        let tl = build(&events, t(14));
        assert_eq!(tl.terms[0].end, t(10));
        assert_eq!(tl.terms[0].end_kind, TermEnd::Expired);
        assert_eq!(tl.gaps(), vec![(t(10), t(14))]);
        // Before expiry, held until now.
        let tl = build(&events, t(6));
        assert_eq!(
            (tl.terms[0].end, tl.terms[0].end_kind),
            (t(6), TermEnd::Held)
        );
        assert!(tl.gaps().is_empty());
    }

    #[test]
    fn refused_writes_and_operator_actions_are_marks() {
        let mut refused = ev(3, "stale_write_refused", "a", 1, 21, 21);
        refused.detail = Some(serde_json::json!({"reason": "fencing token 1 is stale"}));
        let mut op = ev(4, "operator", "i-1", 0, 22, 22);
        op.detail = Some(serde_json::json!({"action": "force_release"}));
        let events = vec![
            ev(1, "acquired", "a", 1, 0, 10),
            ev(2, "taken_over", "b", 2, 15, 25),
            refused,
            op,
        ];
        let tl = build(&events, t(23));
        assert_eq!(tl.marks.len(), 2);
        assert_eq!(tl.marks[0].text, "refused: fencing token 1 is stale");
        assert_eq!(tl.marks[0].holder.as_deref(), Some("a"));
        assert_eq!(tl.marks[1].text, "operator: force_release");
        assert_eq!(tl.terms.len(), 2);
    }

    #[test]
    fn events_out_of_order_and_an_empty_history() {
        let events = vec![
            ev(2, "renewed", "a", 1, 3, 13),
            ev(1, "acquired", "a", 1, 0, 10),
        ];
        let tl = build(&events, t(5));
        assert_eq!(tl.terms[0].renewals, vec![t(3)]);
        let empty = build(&[], t(5));
        assert!(empty.terms.is_empty());
        assert_eq!(empty.from, t(5));
        assert_eq!(empty.gaps(), Vec::<(DateTime<Utc>, DateTime<Utc>)>::new());
    }
}

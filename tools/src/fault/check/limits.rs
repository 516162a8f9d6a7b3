//! The round's queue limits (issue 39), checked on a finished round from
//! the database's history alone (`attempts` joined to `tasks`, and the
//! queue's row): the limits held at every claim, whichever instance,
//! worker or fault made it.
//!
//! - **Started at once.** At the instant of every claim (each attempt's
//!   `claimed_at`, a takeover included), the queue's tasks started then
//!   number at most `max_started`, and those of the claim's concurrency
//!   key at most `max_started_per_key`. Started is counted per task, as
//!   the claim counts it (`status = 'started'`): from the claim that
//!   started it to the end of its last attempt, across takeovers (a
//!   takeover closes one attempt and opens the next, and the task holds
//!   its slot throughout; the limited claim stamps the closed attempt's end
//!   with its transaction's start, before its turn on the queue's lock, and
//!   the new attempt with its statement's start, after it, so counting
//!   attempts would show the task gone for the wait in between). A task is
//!   started at `t` when its span began at or before `t` and has not ended
//!   by `t` (`ended_at > t`, strict: an end stamped at the instant of a
//!   claim committed before that claim's turn began, so the claim did not
//!   count it; rounding both to the millisecond keeps that order).
//! - **The bucket.** For every two claims `a <= b`, the claims stamped in
//!   `[a, b]` number at most `burst + rate × (b − a)`, plus `rate × 1 ms`:
//!   `claimed_at` is the claim statement's clock rounded to the millisecond
//!   (`timestamptz(3)`), so claims stamped within `[a, b]` happened within
//!   `b − a + 1 ms` of each other (half a millisecond either end), and the
//!   bucket, refilling at the rate from full at most, allows `burst + rate ×
//!   that`. A takeover is a claim and spends a token.
//!
//! That every task of the queue ends processed once and none is lost is
//! the round's exactly-once check ([`super::check`]), which reads every
//! task of every queue.
//!
//! Pure: the rows are read by the harness (`fault/limits.rs`), so the tests
//! below hand it made-up histories.

use chrono::{DateTime, Utc};
use leasekeeper_core::queue::queue_limits::QueueLimits;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// One attempt of one of the queue's tasks, with its task's key.
#[derive(Clone, Debug, PartialEq)]
pub struct AttemptRow {
    pub task_id: i64,
    pub number: i32,
    pub key: Option<String>,
    pub claimed_at: DateTime<Utc>,
    /// `None` while running.
    pub ended_at: Option<DateTime<Utc>>,
    pub outcome: String,
}

/// A window of claims measured against the bucket.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Window {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// Claims stamped in `[from, to]`.
    pub claims: usize,
    /// What the bucket allows over it (with the millisecond's allowance).
    pub allowed: f64,
}

impl Window {
    fn ms(&self) -> i64 {
        (self.to - self.from).num_milliseconds()
    }
}

/// What the limits check counted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LimitChecks {
    /// The queue checked and the limits its row holds.
    pub queue: String,
    pub limits: QueueLimits,
    /// The queue's tasks claimed at least once, and those with a key.
    pub tasks: usize,
    pub keyed_tasks: usize,
    /// Distinct keys among the claimed tasks.
    pub keys: usize,
    /// Claims (attempts), takeovers among them.
    pub claims: usize,
    pub takeovers: usize,
    /// The most of the queue's tasks started at any claim's instant, and
    /// the first instant it was reached.
    pub most_started: usize,
    pub most_started_at: Option<DateTime<Utc>>,
    /// The most of one key's tasks started at once, and that key.
    pub most_started_per_key: usize,
    pub busiest_key: Option<String>,
    /// Claim instants at which the queue held exactly `max_started`, or the
    /// claim's key exactly `max_started_per_key`: the limit was reached
    /// (each claim counted once, a batch's claims once per instant).
    pub instants_at_max_started: usize,
    pub instants_at_max_per_key: usize,
    /// The most claims in any second.
    pub busiest_second: usize,
    /// The window closest to the bucket's bound (most claims over its
    /// allowance, or least under it).
    pub tightest_window: Option<Window>,
    /// Claim instants closing a window within one claim of the bucket's
    /// bound: the bucket was (all but) empty.
    pub instants_at_bucket_edge: usize,
    /// The queue's row is missing or has no limits (the round set them).
    pub unlimited: bool,
    /// Instants with more started than `max_started`, described.
    pub over_max_started: Vec<String>,
    /// Instants with more of one key started than `max_started_per_key`.
    pub over_max_per_key: Vec<String>,
    /// Windows with more claims than the bucket allows.
    pub over_bucket: Vec<String>,
}

impl LimitChecks {
    /// Every broken invariant, one line each.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.unlimited {
            out.push(format!(
                "queue {}: no limits on record, though the round set them",
                self.queue
            ));
        }
        let mut list = |what: &str, items: &[String]| {
            if !items.is_empty() {
                out.push(format!(
                    "{what}: {} (first: {})",
                    items.len(),
                    items[..items.len().min(5)].join("; ")
                ));
            }
        };
        list(
            "more tasks started at once than max_started",
            &self.over_max_started,
        );
        list(
            "more tasks of a key started at once than max_started_per_key",
            &self.over_max_per_key,
        );
        list(
            "more claims than the queue's rate and burst allow",
            &self.over_bucket,
        );
        out
    }
}

/// A task's stretch as started: from the claim that started it to the end
/// of its last attempt, across takeovers (`None`: still running).
struct Span<'a> {
    task: i64,
    key: Option<&'a str>,
    start: DateTime<Utc>,
    end: Option<DateTime<Utc>>,
}

impl Span<'_> {
    fn open_at(&self, t: DateTime<Utc>) -> bool {
        self.start <= t && self.end.is_none_or(|end| end > t)
    }
}

/// Each task's spans: an attempt ended `taken_over` goes on in the next.
fn spans(rows: &[AttemptRow]) -> Vec<Span<'_>> {
    let mut by_task: BTreeMap<i64, Vec<&AttemptRow>> = BTreeMap::new();
    for row in rows {
        by_task.entry(row.task_id).or_default().push(row);
    }
    let mut out = Vec::new();
    for (task, mut attempts) in by_task {
        attempts.sort_by_key(|a| a.number);
        let mut start = None;
        for (i, a) in attempts.iter().enumerate() {
            let begun = *start.get_or_insert(a.claimed_at);
            let goes_on = a.outcome == "taken_over" && i + 1 < attempts.len();
            if !goes_on {
                out.push(Span {
                    task,
                    key: a.key.as_deref(),
                    start: begun,
                    end: a.ended_at,
                });
                start = None;
            }
        }
    }
    out
}

/// Checks `rows`, every attempt of queue `queue`'s tasks, against the
/// queue's `limits` (`None`: the queue has no row).
pub fn check_limits(queue: &str, limits: Option<&QueueLimits>, rows: &[AttemptRow]) -> LimitChecks {
    let mut c = LimitChecks {
        queue: queue.to_string(),
        limits: limits.cloned().unwrap_or_default(),
        unlimited: !limits.is_some_and(QueueLimits::any),
        claims: rows.len(),
        takeovers: rows.iter().filter(|r| r.outcome == "taken_over").count(),
        ..LimitChecks::default()
    };
    let tasks: BTreeMap<i64, Option<&str>> =
        rows.iter().map(|r| (r.task_id, r.key.as_deref())).collect();
    c.tasks = tasks.len();
    c.keyed_tasks = tasks.values().filter(|k| k.is_some()).count();
    c.keys = tasks.values().flatten().collect::<BTreeSet<_>>().len();

    started_at_once(&mut c, rows);
    bucket(&mut c, rows);
    c
}

/// The started tasks at every claim's instant, in all and per key.
fn started_at_once(c: &mut LimitChecks, rows: &[AttemptRow]) {
    let spans = spans(rows);
    // Each instant once, with the keys claimed at it.
    let mut instants: BTreeMap<DateTime<Utc>, BTreeSet<Option<&str>>> = BTreeMap::new();
    for r in rows {
        instants
            .entry(r.claimed_at)
            .or_default()
            .insert(r.key.as_deref());
    }
    let (max, per_key) = (c.limits.max_started, c.limits.max_started_per_key);
    for (&t, keys) in &instants {
        let open: Vec<&Span> = spans.iter().filter(|s| s.open_at(t)).collect();
        if open.len() > c.most_started {
            c.most_started = open.len();
            c.most_started_at = Some(t);
        }
        if let Some(max) = max {
            let max = max as usize;
            if open.len() == max {
                c.instants_at_max_started += 1;
            } else if open.len() > max {
                c.over_max_started.push(format!(
                    "at {t}: {} started (limit {max}): tasks {:?}",
                    open.len(),
                    open.iter().map(|s| s.task).collect::<Vec<_>>()
                ));
            }
        }
        for key in keys.iter().flatten() {
            let of_key: Vec<i64> = open
                .iter()
                .filter(|s| s.key == Some(key))
                .map(|s| s.task)
                .collect();
            if of_key.len() > c.most_started_per_key {
                c.most_started_per_key = of_key.len();
                c.busiest_key = Some(key.to_string());
            }
            if let Some(max) = per_key {
                let max = max as usize;
                if of_key.len() == max {
                    c.instants_at_max_per_key += 1;
                } else if of_key.len() > max {
                    c.over_max_per_key.push(format!(
                        "at {t}: {} of key {key:?} started (limit {max}): tasks {of_key:?}",
                        of_key.len()
                    ));
                }
            }
        }
    }
}

/// The claims against the bucket: for each claim instant `b` (the last
/// claim stamped then), the window `[a, b]` with the most claims over the
/// bucket's allowance, found in one pass (the allowance is linear in the
/// window's length, so the best `a` maximises `rate × a − claims before a`).
fn bucket(c: &mut LimitChecks, rows: &[AttemptRow]) {
    let mut times: Vec<DateTime<Utc>> = rows.iter().map(|r| r.claimed_at).collect();
    times.sort();
    // The busiest second, a figure whatever the limits.
    let mut from = 0;
    for (j, t) in times.iter().enumerate() {
        while *t - times[from] >= chrono::Duration::seconds(1) {
            from += 1;
        }
        c.busiest_second = c.busiest_second.max(j - from + 1);
    }
    let (Some(rate), Some(burst)) = (c.limits.rate_per_second, c.limits.burst()) else {
        return;
    };
    let burst = f64::from(burst);
    let secs = |t: DateTime<Utc>| (t - times[0]).num_milliseconds() as f64 / 1000.0;
    // Over i <= j: rate × t_i − i, its best value and index.
    let mut best: Option<(f64, usize)> = None;
    for j in 0..times.len() {
        let value = rate * secs(times[j]) - j as f64;
        if best.is_none_or(|(v, _)| value > v) {
            best = Some((value, j));
        }
        // Only the last claim of an instant closes its windows.
        if times.get(j + 1) == Some(&times[j]) {
            continue;
        }
        let Some((_, i)) = best else { continue };
        let window = Window {
            from: times[i],
            to: times[j],
            claims: j - i + 1,
            allowed: burst + rate * (secs(times[j]) - secs(times[i]) + 0.001),
        };
        let over = window.claims as f64 - window.allowed;
        if c.tightest_window
            .as_ref()
            .is_none_or(|w| over > w.claims as f64 - w.allowed)
        {
            c.tightest_window = Some(window.clone());
        }
        if over > 1e-9 {
            c.over_bucket.push(format!(
                "{} claims from {} to {} ({} ms; allowed {burst} + {rate}/s × {} ms = {:.3})",
                window.claims,
                window.from,
                window.to,
                window.ms(),
                window.ms() + 1,
                window.allowed
            ));
        } else if over > -1.0 {
            c.instants_at_bucket_edge += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ms` milliseconds into the test's day.
    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
    }

    /// Attempt `number` of task `task` (key `key`), claimed at `from` ms and
    /// ended at `to` (running when `None`), with `outcome`.
    fn attempt(
        task: i64,
        number: i32,
        key: Option<&str>,
        from: i64,
        to: Option<i64>,
        outcome: &str,
    ) -> AttemptRow {
        AttemptRow {
            task_id: task,
            number,
            key: key.map(str::to_string),
            claimed_at: at(from),
            ended_at: to.map(at),
            outcome: outcome.into(),
        }
    }

    fn done(task: i64, key: Option<&str>, from: i64, to: i64) -> AttemptRow {
        attempt(task, 1, key, from, Some(to), "completed")
    }

    /// 3 at once, 2 per key, 10 a second with a burst of 3.
    fn limits() -> QueueLimits {
        QueueLimits {
            max_started: Some(3),
            max_started_per_key: Some(2),
            rate_per_second: Some(10.0),
            rate_burst: Some(3),
        }
    }

    fn check(rows: &[AttemptRow]) -> LimitChecks {
        check_limits("limited", Some(&limits()), rows)
    }

    /// Within every limit, each reached: three claims at 0 ms spend the
    /// burst (two of key a, the cap), a fourth 100 ms later takes the token
    /// that refilled; three started at 0, 100, 300 and 595 ms. Task 6 is
    /// taken over at 600 ms, its old attempt ended at the claim
    /// transaction's start (590 ms), before its turn: the task held its
    /// slot throughout, so the claim of task 7 at 595 ms found three
    /// started, and was right to stop there.
    fn honest() -> Vec<AttemptRow> {
        vec![
            done(1, Some("a"), 0, 400),
            done(2, Some("a"), 0, 300),
            // Ends at the instant of the next claim: not started then.
            done(3, None, 0, 100),
            done(4, Some("b"), 100, 350),
            done(5, Some("a"), 300, 700),
            attempt(6, 1, Some("b"), 400, Some(590), "taken_over"),
            attempt(6, 2, Some("b"), 600, Some(900), "completed"),
            done(7, None, 595, 1000),
            attempt(8, 1, Some("b"), 900, None, "running"),
        ]
    }

    #[test]
    fn an_honest_history_passes_with_each_limit_reached() {
        let c = check(&honest());
        assert!(c.violations().is_empty(), "{c:?}");
        assert_eq!((c.tasks, c.keyed_tasks, c.keys), (8, 6, 2));
        assert_eq!((c.claims, c.takeovers), (9, 1));
        assert_eq!(c.most_started, 3, "{c:?}");
        assert_eq!(c.most_started_per_key, 2, "{c:?}");
        assert_eq!(c.instants_at_max_started, 5, "0, 100, 300, 595, 600: {c:?}");
        assert_eq!(c.instants_at_max_per_key, 2, "a at 0 and 300: {c:?}");
        // The burst at 0 ms, and the fourth claim at 100 ms (3 + 10 × 0.101).
        let w = c.tightest_window.clone().unwrap();
        assert!(w.claims as f64 - w.allowed > -0.1, "{w:?}");
        assert_eq!(c.instants_at_bucket_edge, 2, "{c:?}");
        assert_eq!(c.busiest_second, 9);
    }

    #[test]
    fn too_many_started_at_once_is_caught() {
        let mut rows = honest();
        // A fourth task started at 650 ms while 5, 6 and 7 run.
        rows.push(done(9, None, 650, 680));
        let c = check(&rows);
        assert_eq!(c.over_max_started.len(), 1, "{c:?}");
        assert!(
            c.over_max_started[0].contains("4 started (limit 3): tasks [5, 6, 7, 9]"),
            "{c:?}"
        );
        assert_eq!(c.most_started, 4);
        assert_eq!(c.violations().len(), 1, "{c:?}");
    }

    #[test]
    fn counting_attempts_instead_of_tasks_would_miss_a_takeovers_slot() {
        // Task 6's takeover: its old attempt ended at 590 ms, the new one
        // began at 600 ms. Task 9 claimed at 595 ms and done by 598 ms was a
        // fourth with 5, 6 and 7, though only three attempts were open.
        let mut rows = honest();
        rows.push(done(9, None, 595, 598));
        let c = check(&rows);
        assert_eq!(c.over_max_started.len(), 1, "{c:?}");
        assert!(
            c.over_max_started[0].contains("tasks [5, 6, 7, 9]"),
            "{c:?}"
        );
        assert_eq!(c.violations().len(), 1, "{c:?}");
    }

    #[test]
    fn too_many_of_one_key_is_caught() {
        let mut rows = honest();
        // Task 3 (keyless, 0-100 ms) carried key a instead: three of a.
        rows[2].key = Some("a".into());
        let c = check(&rows);
        assert_eq!(c.over_max_per_key.len(), 1, "{c:?}");
        assert!(
            c.over_max_per_key[0].contains("3 of key \"a\" started (limit 2)"),
            "{c:?}"
        );
        assert_eq!(c.violations().len(), 1, "{c:?}");
    }

    #[test]
    fn claims_over_the_bucket_are_caught_to_the_millisecond() {
        // Seven quick claims, each ended before the next: never two
        // started, but the burst (3) and the rate (10/s) allow 3 + 10 ×
        // (0.06 + 0.001) = 3.61 in 60 ms.
        let rows: Vec<AttemptRow> = (0..7)
            .map(|i| done(i + 1, None, i * 10, i * 10 + 5))
            .collect();
        let c = check(&rows);
        assert!(c.over_max_started.is_empty(), "{c:?}");
        assert!(
            c.over_bucket
                .iter()
                .any(|v| v.starts_with("7 claims from") && v.contains("(60 ms;")),
            "{c:?}"
        );
        // Spread out to 100 ms each, the bucket's rate keeps up.
        let rows: Vec<AttemptRow> = (0..7)
            .map(|i| done(i + 1, None, i * 100, i * 100 + 5))
            .collect();
        assert!(check(&rows).violations().is_empty());
        // Four claims in 99 ms: 3 + 10 × (0.099 + 0.001) = 4 with the
        // millisecond's allowance, so they pass; the same in 98 ms do not.
        let four = |last: i64| -> Vec<AttemptRow> {
            [0, 1, 2, last]
                .iter()
                .enumerate()
                .map(|(i, &t)| done(i as i64 + 1, None, t, t))
                .collect()
        };
        let c = check(&four(99));
        assert!(c.violations().is_empty(), "{c:?}");
        let c = check(&four(98));
        assert_eq!(c.over_bucket.len(), 1, "{c:?}");
        assert!(
            c.over_bucket[0].contains("allowed 3 + 10/s × 99 ms = 3.990"),
            "{c:?}"
        );
    }

    #[test]
    fn a_takeover_is_a_claim_against_the_bucket() {
        // Three claims at 0 ms spend the burst; task 1 taken over at 50 ms
        // is a fourth within 50 ms (allowed 3 + 10 × 0.051 = 3.51).
        let rows = vec![
            attempt(1, 1, None, 0, Some(50), "taken_over"),
            attempt(1, 2, None, 50, Some(60), "completed"),
            done(2, None, 0, 10),
            done(3, None, 0, 10),
        ];
        let c = check(&rows);
        assert_eq!(c.over_bucket.len(), 1, "{c:?}");
        assert_eq!(c.takeovers, 1);
        assert!(c.over_max_started.is_empty(), "{c:?}");
    }

    #[test]
    fn a_queue_without_limits_on_record_is_caught() {
        let c = check_limits("limited", None, &honest());
        assert!(c.unlimited);
        assert_eq!(c.violations().len(), 1, "{c:?}");
        let c = check_limits("limited", Some(&QueueLimits::default()), &honest());
        assert_eq!(c.violations().len(), 1, "{c:?}");
    }
}

//! The harness's every-second schedule, checked on a finished round: every
//! tick from the first due one to the pause fired exactly once, by terms
//! whose fencing tokens never go backwards, each with its own task, and
//! none later than its allowance (a holder's death is caught up within
//! the TTL, a renew interval and a tick; a database outage within the
//! allowance the harness gives every other recovery across it).
//!
//! Pure: the rows are read by the harness (`fault/schedule.rs`), so the
//! tests below hand it made-up ticks.

use chrono::{DateTime, Duration, DurationRound, Utc};
use std::collections::{BTreeMap, BTreeSet};

/// One row of `schedule_ticks`, with what `tasks` says of its task (`None`:
/// no such task).
#[derive(Clone, Debug, PartialEq)]
pub struct TickRow {
    pub tick_at: DateTime<Utc>,
    pub fencing_token: i64,
    pub fired_at: DateTime<Utc>,
    pub task_id: i64,
    /// The task's `schedule` and `tick_at`.
    pub task: Option<(Option<String>, Option<DateTime<Utc>>)>,
}

/// A stretch during which the database could not be written (a crash and
/// restart, a failover): a tick whose ordinary deadline falls after `from`
/// and that came due before `deadline` may fire as late as `deadline`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outage {
    pub from: DateTime<Utc>,
    pub deadline: DateTime<Utc>,
}

/// What the round's schedule was expected to do.
#[derive(Clone, Debug)]
pub struct Expected {
    /// The schedule's name.
    pub name: String,
    /// Its period (every tick is a whole multiple of it).
    pub period: Duration,
    /// When it was declared (database clock): the first tick is the first
    /// whole period after it.
    pub declared: DateTime<Utc>,
    /// When it was paused (database clock, read after the pause
    /// committed): no tick after it may fire, and every tick due before it
    /// whose deadline had passed must have.
    pub paused: DateTime<Utc>,
    /// How late a tick may fire outside outages.
    pub bound: Duration,
    pub outages: Vec<Outage>,
}

impl Expected {
    /// The latest a tick due at `t` may fire.
    pub fn deadline(&self, t: DateTime<Utc>) -> DateTime<Utc> {
        let ordinary = t + self.bound;
        self.outages
            .iter()
            .filter(|o| o.from <= ordinary && t <= o.deadline)
            .map(|o| o.deadline)
            .fold(ordinary, DateTime::max)
    }
}

/// What the schedule check counted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScheduleChecks {
    /// Ticks fired.
    pub ticks: usize,
    /// Ticks due (between the first due one and the last fired, or before
    /// the pause and past their deadline) that never fired.
    pub missing: Vec<DateTime<Utc>>,
    /// Ticks fired more than once, or whose time two tasks carry.
    pub doubled: Vec<DateTime<Utc>>,
    /// A tick fired under a lower fencing token than an earlier tick,
    /// described.
    pub tokens_backwards: Vec<String>,
    /// Ticks whose task is missing or names another schedule or tick, and
    /// tasks of the schedule no tick names, described.
    pub task_mismatches: Vec<String>,
    /// Ticks at a time the schedule does not produce (not a whole period,
    /// before the declaration, after the pause), described.
    pub unexpected: Vec<String>,
    /// Ticks fired after their deadline, described.
    pub late: Vec<String>,
    /// The worst `fired_at - tick_at`, in ms.
    pub worst_lateness_ms: Option<i64>,
    /// The same over the ticks no outage's allowance covers.
    pub worst_lateness_outside_outages_ms: Option<i64>,
    /// The bound outside outages, in ms.
    pub bound_ms: i64,
}

impl ScheduleChecks {
    /// Every broken invariant, one line each.
    pub fn violations(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut list = |what: &str, items: Vec<String>| {
            if !items.is_empty() {
                out.push(format!(
                    "{what}: {} (first: {})",
                    items.len(),
                    items[..items.len().min(5)].join("; ")
                ));
            }
        };
        let times = |v: &[DateTime<Utc>]| v.iter().map(|t| t.to_rfc3339()).collect::<Vec<_>>();
        list("schedule ticks missing", times(&self.missing));
        list("schedule ticks fired twice", times(&self.doubled));
        list(
            "schedule fencing tokens going backwards",
            self.tokens_backwards.clone(),
        );
        list(
            "schedule ticks and tasks not matching",
            self.task_mismatches.clone(),
        );
        list("schedule ticks never due", self.unexpected.clone());
        list("schedule ticks caught up too late", self.late.clone());
        out
    }
}

/// Checks `ticks` (any order) and `tasks` (`(id, tick_at)` of every task
/// whose `schedule` is the expected one and whose `tick_at` is set)
/// against `expected`.
pub fn check_ticks(
    expected: &Expected,
    ticks: &[TickRow],
    tasks: &[(i64, DateTime<Utc>)],
) -> ScheduleChecks {
    let mut c = ScheduleChecks {
        ticks: ticks.len(),
        bound_ms: expected.bound.num_milliseconds(),
        ..ScheduleChecks::default()
    };
    let mut ticks: Vec<&TickRow> = ticks.iter().collect();
    ticks.sort_by_key(|t| (t.tick_at, t.fired_at));

    // Doubled: a tick time fired twice, or carried by two tasks.
    let mut fired: BTreeMap<DateTime<Utc>, usize> = BTreeMap::new();
    for t in &ticks {
        *fired.entry(t.tick_at).or_default() += 1;
    }
    let mut carried: BTreeMap<DateTime<Utc>, usize> = BTreeMap::new();
    for (_, at) in tasks {
        *carried.entry(*at).or_default() += 1;
    }
    let doubled: BTreeSet<DateTime<Utc>> = fired
        .iter()
        .chain(carried.iter())
        .filter(|(_, n)| **n > 1)
        .map(|(at, _)| *at)
        .collect();
    c.doubled = doubled.into_iter().collect();

    // Missing: every whole period after the declaration up to the last
    // tick fired, and, after it, up to the pause those already past their
    // deadline (a scheduler that stopped for good shows here).
    let period = expected.period;
    let first = expected
        .declared
        .duration_trunc(period)
        .map_or(expected.declared, |t| t + period);
    let last = ticks.last().map(|t| t.tick_at);
    let mut due = first;
    while due <= expected.paused {
        let required =
            last.is_some_and(|last| due <= last) || expected.deadline(due) < expected.paused;
        if required && !fired.contains_key(&due) {
            c.missing.push(due);
        }
        due += period;
    }

    for t in &ticks {
        let on_period = t
            .tick_at
            .duration_trunc(period)
            .is_ok_and(|whole| whole == t.tick_at);
        if !on_period || t.tick_at < first || t.tick_at > expected.paused {
            c.unexpected.push(format!(
                "tick at {} fired at {} (declared {}, paused {})",
                t.tick_at, t.fired_at, expected.declared, expected.paused
            ));
        }
    }

    // Tokens along the ticks, in tick order: a later tick fired under a
    // lower token means an older term fired after a newer one.
    for pair in ticks.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.fencing_token < a.fencing_token {
            c.tokens_backwards.push(format!(
                "tick at {} under token {} after tick at {} under token {}",
                b.tick_at, b.fencing_token, a.tick_at, a.fencing_token
            ));
        }
    }

    // Each tick's task carries the tick; each task of a tick is named by one.
    for t in &ticks {
        match &t.task {
            None => c.task_mismatches.push(format!(
                "tick at {}: its task {} does not exist",
                t.tick_at, t.task_id
            )),
            Some((schedule, at))
                if schedule.as_deref() != Some(expected.name.as_str())
                    || *at != Some(t.tick_at) =>
            {
                c.task_mismatches.push(format!(
                    "tick at {}: its task {} carries schedule {schedule:?} and tick {at:?}",
                    t.tick_at, t.task_id
                ));
            }
            Some(_) => {}
        }
    }
    let named: BTreeSet<i64> = ticks.iter().map(|t| t.task_id).collect();
    for (id, at) in tasks {
        if !named.contains(id) {
            c.task_mismatches.push(format!(
                "task {id} of the tick at {at}: no tick row names it"
            ));
        }
    }

    // Lateness.
    for t in &ticks {
        let late = t.fired_at - t.tick_at;
        let worse = |w: Option<i64>| {
            Some(w.map_or(late.num_milliseconds(), |w| w.max(late.num_milliseconds())))
        };
        c.worst_lateness_ms = worse(c.worst_lateness_ms);
        let deadline = expected.deadline(t.tick_at);
        if deadline == t.tick_at + expected.bound {
            c.worst_lateness_outside_outages_ms = worse(c.worst_lateness_outside_outages_ms);
        }
        if t.fired_at > deadline {
            c.late.push(format!(
                "tick at {} fired {} ms late, {} ms past its deadline",
                t.tick_at,
                late.num_milliseconds(),
                (t.fired_at - deadline).num_milliseconds()
            ));
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "every-second";

    /// `s` seconds (and `ms` milliseconds) into the test's day.
    fn at(s: i64, ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + s * 1000 + ms).unwrap()
    }

    fn tick(s: i64, token: i64, late_ms: i64) -> TickRow {
        TickRow {
            tick_at: at(s, 0),
            fencing_token: token,
            fired_at: at(s, late_ms),
            task_id: 100 + s,
            task: Some((Some(NAME.into()), Some(at(s, 0)))),
        }
    }

    fn tasks_of(ticks: &[TickRow]) -> Vec<(i64, DateTime<Utc>)> {
        ticks.iter().map(|t| (t.task_id, t.tick_at)).collect()
    }

    /// Declared at 0.4 s, paused at 10.5 s; 3 s bound.
    fn expected() -> Expected {
        Expected {
            name: NAME.into(),
            period: Duration::seconds(1),
            declared: at(0, 400),
            paused: at(10, 500),
            bound: Duration::seconds(3),
            outages: Vec::new(),
        }
    }

    /// Ticks 1..=10, token 1 up to 5, then 2; each 5 ms late.
    fn honest() -> Vec<TickRow> {
        (1..=10)
            .map(|s| tick(s, if s <= 5 { 1 } else { 2 }, 5))
            .collect()
    }

    #[test]
    fn an_honest_schedule_passes() {
        let ticks = honest();
        let c = check_ticks(&expected(), &ticks, &tasks_of(&ticks));
        assert!(c.violations().is_empty(), "{c:?}");
        assert_eq!(c.ticks, 10);
        assert_eq!(c.worst_lateness_ms, Some(5));
    }

    #[test]
    fn a_gap_caught_up_within_the_bound_passes() {
        // Ticks 4-6 fired together at 6.9 s by the next term.
        let mut ticks = honest();
        for t in &mut ticks[3..6] {
            t.fired_at = at(6, 900);
        }
        let c = check_ticks(&expected(), &ticks, &tasks_of(&ticks));
        assert!(c.violations().is_empty(), "{c:?}");
        assert_eq!(c.worst_lateness_ms, Some(2900));
    }

    #[test]
    fn a_missing_tick_is_caught() {
        let mut ticks = honest();
        ticks.remove(4); // the tick at 5 s
        let c = check_ticks(&expected(), &ticks, &tasks_of(&ticks));
        assert_eq!(c.missing, vec![at(5, 0)], "{c:?}");
        assert_eq!(c.violations().len(), 1, "{c:?}");
    }

    #[test]
    fn a_scheduler_that_stopped_for_good_misses_the_ticks_past_their_deadline() {
        // Nothing after 5 s; paused at 10.5 s with a 3 s bound: ticks 6 and
        // 7 are overdue, 8-10 not yet.
        let ticks: Vec<TickRow> = honest().into_iter().take(5).collect();
        let c = check_ticks(&expected(), &ticks, &tasks_of(&ticks));
        assert_eq!(c.missing, vec![at(6, 0), at(7, 0)], "{c:?}");
        // And one that never fired at all.
        let c = check_ticks(&expected(), &[], &[]);
        assert_eq!(c.missing.len(), 7, "{c:?}");
    }

    #[test]
    fn a_doubled_tick_is_caught_in_the_ticks_or_in_the_tasks() {
        let mut ticks = honest();
        let mut again = tick(3, 2, 2000);
        again.task_id = 999;
        again.task = Some((Some(NAME.into()), Some(at(3, 0))));
        ticks.push(again);
        let c = check_ticks(&expected(), &ticks, &tasks_of(&ticks));
        assert_eq!(c.doubled, vec![at(3, 0)], "{c:?}");

        // One tick row, but two tasks carrying its time.
        let ticks = honest();
        let mut tasks = tasks_of(&ticks);
        tasks.push((999, at(3, 0)));
        let c = check_ticks(&expected(), &ticks, &tasks);
        assert_eq!(c.doubled, vec![at(3, 0)], "{c:?}");
        assert_eq!(c.task_mismatches.len(), 1, "the stray task: {c:?}");
    }

    #[test]
    fn a_token_going_backwards_is_caught() {
        let mut ticks = honest();
        ticks[7].fencing_token = 1; // tick 8 under term 1, after 6 and 7 under 2
        let c = check_ticks(&expected(), &ticks, &tasks_of(&ticks));
        assert_eq!(c.tokens_backwards.len(), 1, "{c:?}");
        assert_eq!(c.violations().len(), 1, "{c:?}");
    }

    #[test]
    fn a_tick_caught_up_too_late_is_caught_unless_an_outage_allows_it() {
        let mut ticks = honest();
        ticks[3].fired_at = at(7, 200); // the tick at 4 s, 3.2 s late
        let c = check_ticks(&expected(), &ticks, &tasks_of(&ticks));
        assert_eq!(c.late.len(), 1, "{c:?}");
        assert_eq!(c.worst_lateness_ms, Some(3200));
        // The database was down from 3.5 s and every process had to work
        // again by 12 s: the tick at 4 s may fire until then.
        let mut e = expected();
        e.outages.push(Outage {
            from: at(3, 500),
            deadline: at(12, 0),
        });
        let c = check_ticks(&e, &ticks, &tasks_of(&ticks));
        assert!(c.violations().is_empty(), "{c:?}");
        assert_eq!(c.worst_lateness_ms, Some(3200));
        assert_eq!(c.worst_lateness_outside_outages_ms, Some(5), "{c:?}");
        // An outage long before the tick allows nothing.
        e.outages[0] = Outage {
            from: at(-20, 0),
            deadline: at(-10, 0),
        };
        assert_eq!(check_ticks(&e, &ticks, &tasks_of(&ticks)).late.len(), 1);
    }

    #[test]
    fn a_tick_whose_task_is_missing_or_another_is_caught() {
        let mut ticks = honest();
        ticks[1].task = None;
        ticks[2].task = Some((Some("other".into()), Some(at(3, 0))));
        ticks[3].task = Some((Some(NAME.into()), Some(at(5, 0))));
        let tasks: Vec<_> = tasks_of(&ticks).into_iter().skip(1).collect();
        let c = check_ticks(&expected(), &ticks, &tasks);
        assert_eq!(c.task_mismatches.len(), 3, "{c:?}");
    }

    #[test]
    fn a_tick_the_schedule_never_produces_is_caught() {
        let mut ticks = honest();
        ticks.push(tick(11, 2, 5)); // after the pause
        let mut off = tick(2, 1, 5);
        off.tick_at = at(2, 250);
        off.task = Some((Some(NAME.into()), Some(off.tick_at)));
        ticks.push(off);
        let c = check_ticks(&expected(), &ticks, &tasks_of(&ticks));
        assert_eq!(c.unexpected.len(), 2, "{c:?}");
    }
}

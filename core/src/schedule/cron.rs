//! Cron expressions in a time zone, parsed by `croner` (5 fields, or 6 with
//! seconds first; `@daily` and the other nicknames too) and read in an IANA
//! time zone from `chrono-tz`: the next tick after a moment, the ticks due
//! in a span, and the expression in words.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};

/// A parsed expression and its time zone.
#[derive(Clone, Debug)]
pub struct Cron {
    expr: croner::Cron,
    tz: Tz,
}

/// Why an expression or time zone was refused: the field and the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct CronError {
    /// `cron` or `time_zone`.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

/// The most ticks [`Cron::due`] looks back over.
const MAX_LOOK_BACK: usize = 100_000;

impl Cron {
    /// Parses `cron` (5 fields, or 6 with seconds first) read in `time_zone`.
    ///
    /// ```
    /// use leasekeeper_core::schedule::cron::Cron;
    /// assert!(Cron::parse("*/5 * * * * *", "UTC").is_ok());
    /// assert_eq!(Cron::parse("0 2 * * *", "Mars/Olympus").unwrap_err().field, "time_zone");
    /// assert_eq!(Cron::parse("61 * * * *", "UTC").unwrap_err().field, "cron");
    /// ```
    pub fn parse(cron: &str, time_zone: &str) -> Result<Cron, CronError> {
        let tz: Tz = time_zone.parse().map_err(|_| CronError {
            field: "time_zone",
            reason: format!("{time_zone:?} is not an IANA time zone (e.g. UTC, Europe/Berlin)"),
        })?;
        let expr = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(cron)
            .map_err(|e| CronError {
                field: "cron",
                reason: format!(
                    "{cron:?} is not a cron expression of 5 fields, or 6 with seconds first: {e}"
                ),
            })?;
        // An expression that never fires (30 February) is refused too.
        let cron = Cron { expr, tz };
        if cron.next_after(Utc::now()).is_none() {
            return Err(CronError {
                field: "cron",
                reason: format!("{:?} never fires", cron.expr.pattern.to_string()),
            });
        }
        Ok(cron)
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.expr
            .find_next_occurrence(&t.with_timezone(&self.tz), false)
            .ok()
            .map(|n| n.with_timezone(&Utc))
    }

    /// The last tick at or before `t`.
    pub fn at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.expr
            .find_previous_occurrence(&t.with_timezone(&self.tz), true)
            .ok()
            .map(|n| n.with_timezone(&Utc))
    }

    /// The ticks after `after` and at or before `now`: at most `keep` of
    /// them, the newest, oldest first; and whether older ones were left out.
    pub fn due(
        &self,
        after: DateTime<Utc>,
        now: DateTime<Utc>,
        keep: usize,
    ) -> (Vec<DateTime<Utc>>, bool) {
        let mut ticks = Vec::new();
        let mut at = now;
        let mut left_out = false;
        while let Some(tick) = self.at_or_before(at) {
            if tick <= after {
                break;
            }
            if ticks.len() >= keep.min(MAX_LOOK_BACK) {
                left_out = true;
                break;
            }
            ticks.push(tick);
            // The previous tick is strictly before this one.
            at = tick - chrono::Duration::milliseconds(1);
        }
        ticks.reverse();
        (ticks, left_out)
    }

    /// The expression in words, with its time zone: `At 02:00 (UTC)`.
    pub fn describe(&self) -> String {
        let words = self.expr.describe();
        format!("{} ({})", words.trim_end_matches('.'), self.tz.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 25, h, m, s).unwrap()
    }

    #[test]
    fn five_and_six_fields_and_nicknames_parse_seven_do_not() {
        for ok in [
            "0 2 * * *",
            "*/5 * * * * *",
            "@daily",
            "*/15 9-17 * * MON-FRI",
        ] {
            Cron::parse(ok, "UTC").unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "",
            "* * * *",
            "1 2 3 4 5 6 7",
            "61 * * * *",
            "nonsense",
            "0 0 30 2 *",
        ] {
            let e = Cron::parse(bad, "UTC").unwrap_err();
            assert_eq!(e.field, "cron", "{bad}");
        }
    }

    #[test]
    fn a_time_zone_moves_the_ticks() {
        let utc = Cron::parse("0 2 * * *", "UTC").unwrap();
        let berlin = Cron::parse("0 2 * * *", "Europe/Berlin").unwrap();
        assert_eq!(utc.next_after(at(0, 0, 0)), Some(at(2, 0, 0)));
        // 02:00 in Berlin (UTC+1 in November) is 01:00 UTC.
        assert_eq!(berlin.next_after(at(0, 0, 0)), Some(at(1, 0, 0)));
        assert_eq!(berlin.describe(), "At 02:00 (Europe/Berlin)");
    }

    #[test]
    fn due_ticks_are_after_the_cursor_up_to_now_newest_kept() {
        let every_second = Cron::parse("* * * * * *", "UTC").unwrap();
        let (ticks, left_out) = every_second.due(at(10, 0, 0), at(10, 0, 5), 100);
        assert_eq!(ticks, (1..=5).map(|s| at(10, 0, s)).collect::<Vec<_>>());
        assert!(!left_out);
        let (ticks, left_out) = every_second.due(at(10, 0, 0), at(10, 0, 5), 2);
        assert_eq!(ticks, vec![at(10, 0, 4), at(10, 0, 5)]);
        assert!(left_out);
        // Not yet due, and nothing after the cursor.
        let (ticks, _) = every_second.due(at(10, 0, 5), at(10, 0, 5), 100);
        assert!(ticks.is_empty());
        // A fraction of a second: the tick at the whole second is due once.
        let now = at(10, 0, 5) + chrono::Duration::milliseconds(400);
        assert_eq!(
            every_second.due(at(10, 0, 4), now, 100).0,
            vec![at(10, 0, 5)]
        );
    }
}

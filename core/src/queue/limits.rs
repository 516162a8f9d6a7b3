//! The limits of a task's fields, and the one check of a [`NewTask`]
//! against them ([`NewTask::validate`]).
//!
//! Every path that enqueues runs it (`store::enqueue` and `enqueue_many`,
//! so the REST API, the scheduler and a service embedding the library
//! alike), and the REST bodies ([`EnqueueBody`](super::EnqueueBody),
//! [`SnoozeBody`](super::SnoozeBody)) read their seconds against the same
//! constants. An error names the field as the REST body spells it
//! (`delay_seconds`), the one spelling both kinds of caller see.

use super::{NewTask, TaskName};
use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

/// The most claims a task may allow before it is marked failed.
pub const MAX_ATTEMPTS: i32 = 1000;

/// The longest delay before a new task may be claimed: 24 hours.
pub const MAX_DELAY: Duration = Duration::from_secs(86_400);

/// The shortest and longest time limit of one attempt ([`NewTask::timeout`]):
/// 1 ms to 24 hours.
pub const TIMEOUTS: RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(86_400);

/// The most tasks one batch enqueues (`enqueue_many`, `POST
/// /api/tasks/batch`).
pub const MAX_ENQUEUE_BATCH: usize = 10_000;

/// The longest concurrency key, in characters.
pub const MAX_CONCURRENCY_KEY_CHARS: usize = 256;

/// The longest unique key, in characters.
pub const MAX_UNIQUE_KEY_CHARS: usize = 256;

/// The shortest and longest period of [`NewTask::unique_for`]: 1 s to 366
/// days.
pub const UNIQUE_PERIODS: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(366 * 24 * 3600));

/// The longest a task may wait for a signal
/// ([`Done::wait_for`](crate::worker::handler::Done::wait_for)): 366 days.
pub const MAX_WAIT: Duration = Duration::from_secs(366 * 24 * 3600);

/// The longest a handler may snooze a task: 366 days.
pub const MAX_SNOOZE: Duration = Duration::from_secs(366 * 24 * 3600);

/// The longest `last_error` kept, in characters; the tasks table's CHECK
/// holds the same limit.
pub const MAX_ERROR_CHARS: usize = 4096;

/// A field of a task to enqueue, by the name its REST body gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskField {
    /// `kind`.
    Kind,
    /// `queue`.
    Queue,
    /// `task_data`.
    Data,
    /// `max_attempts`.
    MaxAttempts,
    /// `delay_seconds` ([`NewTask::delay`]).
    Delay,
    /// `timeout_seconds` ([`NewTask::timeout`]).
    Timeout,
    /// `unique_key`.
    UniqueKey,
    /// `unique_scope`.
    UniqueScope,
    /// `unique_period_seconds` ([`Unique::period`](super::Unique::period)).
    UniquePeriod,
    /// `concurrency_key` ([`NewTask::concurrency_key`]).
    ConcurrencyKey,
    /// `seconds` of a snooze.
    Snooze,
    /// `error` of a failed attempt.
    Error,
}

impl TaskField {
    /// The field's name in a REST body.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskField::Kind => "kind",
            TaskField::Queue => "queue",
            TaskField::Data => "task_data",
            TaskField::MaxAttempts => "max_attempts",
            TaskField::Delay => "delay_seconds",
            TaskField::Timeout => "timeout_seconds",
            TaskField::UniqueKey => "unique_key",
            TaskField::UniqueScope => "unique_scope",
            TaskField::UniquePeriod => "unique_period_seconds",
            TaskField::ConcurrencyKey => "concurrency_key",
            TaskField::Snooze => "seconds",
            TaskField::Error => "error",
        }
    }
}

impl fmt::Display for TaskField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a task (or a worker's body about one) was refused: the field, and
/// what is wrong with it in words that name the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct InvalidTask {
    /// The field refused.
    pub field: TaskField,
    /// What is wrong, naming the field: `delay_seconds must be between 0 and 86400`.
    pub reason: String,
}

impl InvalidTask {
    /// `field` refused for `reason` (which names it).
    pub fn new(field: TaskField, reason: impl Into<String>) -> Self {
        InvalidTask {
            field,
            reason: reason.into(),
        }
    }

    /// `field` outside `range`, said in seconds.
    fn out_of_range(field: TaskField, range: &RangeInclusive<Duration>) -> Self {
        InvalidTask::new(
            field,
            format!(
                "{field} must be between {} and {}",
                range.start().as_secs_f64(),
                range.end().as_secs_f64()
            ),
        )
    }
}

/// The durations `field` may take, from its constant (an empty range for
/// a field that is not a duration: nothing fits).
fn range_of(field: TaskField) -> RangeInclusive<Duration> {
    match field {
        TaskField::Delay => Duration::ZERO..=MAX_DELAY,
        TaskField::Timeout => TIMEOUTS,
        TaskField::UniquePeriod => UNIQUE_PERIODS.0..=UNIQUE_PERIODS.1,
        TaskField::Snooze => Duration::ZERO..=MAX_SNOOZE,
        // Not a duration: nothing fits.
        _ => Duration::MAX..=Duration::ZERO,
    }
}

/// A duration field's `value`, if within its limits.
fn check_duration(field: TaskField, value: Duration) -> Result<Duration, InvalidTask> {
    let range = range_of(field);
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(InvalidTask::out_of_range(field, &range))
    }
}

/// A duration field sent as seconds (`delay_seconds: 2.5`), read against
/// the same limits [`NewTask::validate`] checks: refused when not finite
/// or out of range, which also keeps [`Duration::from_secs_f64`] from
/// panicking.
pub(crate) fn seconds(field: TaskField, secs: f64) -> Result<Duration, InvalidTask> {
    let range = range_of(field);
    let (low, high) = (range.start().as_secs_f64(), range.end().as_secs_f64());
    if !(secs.is_finite() && (low..=high).contains(&secs)) {
        return Err(InvalidTask::out_of_range(field, &range));
    }
    // Clamped: a number at a bound must not read as a hair past it.
    Ok(Duration::from_secs_f64(secs).clamp(*range.start(), *range.end()))
}

/// A failed attempt's `error`: at most [`MAX_ERROR_CHARS`] characters,
/// no NUL (PostgreSQL's text cannot hold one).
pub(crate) fn check_error(error: &str) -> Result<(), InvalidTask> {
    if error.chars().count() > MAX_ERROR_CHARS {
        return Err(InvalidTask::new(
            TaskField::Error,
            format!("error must be at most {MAX_ERROR_CHARS} characters"),
        ));
    }
    if error.contains('\0') {
        return Err(InvalidTask::new(
            TaskField::Error,
            "error must not contain the NUL character",
        ));
    }
    Ok(())
}

/// A key field (`unique_key`, `concurrency_key`): 1 to `max` characters,
/// no NUL.
fn check_key(field: TaskField, key: &str, max: usize) -> Result<(), InvalidTask> {
    let chars = key.chars().count();
    if chars == 0 || chars > max {
        return Err(InvalidTask::new(
            field,
            format!("{field} must be 1 to {max} characters, got {chars}"),
        ));
    }
    if key.contains('\0') {
        return Err(InvalidTask::new(
            field,
            format!("{field} must not contain NUL"),
        ));
    }
    Ok(())
}

impl NewTask {
    /// Checks every field against its limit: a kind and queue name
    /// ([`TaskName`]), `max_attempts` 1 to [`MAX_ATTEMPTS`], data that
    /// PostgreSQL stores and gives back, a delay up to [`MAX_DELAY`], a
    /// timeout within [`TIMEOUTS`], a unique key of 1 to
    /// [`MAX_UNIQUE_KEY_CHARS`] characters without NUL and a period within
    /// [`UNIQUE_PERIODS`]. The enqueue paths run it before anything is
    /// written; the error names the first field refused.
    ///
    /// ```
    /// use leasekeeper_core::queue::{NewTask, TaskField};
    /// use std::time::Duration;
    ///
    /// let late = NewTask::new("email", serde_json::json!({})).delay(Duration::from_secs(90_000));
    /// let err = late.validate().unwrap_err();
    /// assert_eq!(err.field, TaskField::Delay);
    /// assert_eq!(err.to_string(), "delay_seconds must be between 0 and 86400");
    /// ```
    pub fn validate(&self) -> Result<(), InvalidTask> {
        if !(1..=MAX_ATTEMPTS).contains(&self.max_attempts) {
            return Err(InvalidTask::new(
                TaskField::MaxAttempts,
                format!("max_attempts must be between 1 and {MAX_ATTEMPTS}"),
            ));
        }
        TaskName::check("kind", &self.kind).map_err(|e| InvalidTask::new(TaskField::Kind, e))?;
        TaskName::check("queue", &self.queue).map_err(|e| InvalidTask::new(TaskField::Queue, e))?;
        crate::json::storable(&self.data, TaskField::Data.as_str())
            .map_err(|e| InvalidTask::new(TaskField::Data, e))?;
        if let Some(delay) = self.delay {
            check_duration(TaskField::Delay, delay)?;
        }
        if let Some(timeout) = self.timeout {
            check_duration(TaskField::Timeout, timeout)?;
        }
        if let Some(key) = &self.concurrency_key {
            check_key(TaskField::ConcurrencyKey, key, MAX_CONCURRENCY_KEY_CHARS)?;
        }
        if let Some(unique) = &self.unique {
            check_key(TaskField::UniqueKey, &unique.key, MAX_UNIQUE_KEY_CHARS)?;
            if let Some(period) = unique.period {
                check_duration(TaskField::UniquePeriod, period)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn task() -> NewTask {
        NewTask::new("email", json!({}))
    }

    fn refused(task: NewTask) -> InvalidTask {
        task.validate().expect_err("refused")
    }

    #[test]
    fn each_limit_is_taken_at_its_bound_and_refused_past_it() {
        assert_eq!(task().delay(MAX_DELAY).validate(), Ok(()));
        let err = refused(task().delay(MAX_DELAY + Duration::from_millis(1)));
        assert_eq!(err.field, TaskField::Delay);
        assert_eq!(err.reason, "delay_seconds must be between 0 and 86400");

        assert_eq!(task().timeout(*TIMEOUTS.start()).validate(), Ok(()));
        let err = refused(task().timeout(Duration::from_micros(999)));
        assert_eq!(
            err.reason,
            "timeout_seconds must be between 0.001 and 86400"
        );

        assert_eq!(task().unique_for("k", UNIQUE_PERIODS.1).validate(), Ok(()));
        let err = refused(task().unique_for("k", Duration::from_millis(999)));
        assert_eq!(err.field, TaskField::UniquePeriod);
        assert_eq!(
            err.reason,
            "unique_period_seconds must be between 1 and 31622400"
        );

        assert_eq!(
            refused(task().max_attempts(0)).field,
            TaskField::MaxAttempts
        );
        assert_eq!(
            refused(task().max_attempts(MAX_ATTEMPTS + 1)).field,
            TaskField::MaxAttempts
        );
        assert_eq!(refused(task().queue("")).field, TaskField::Queue);
        assert_eq!(
            refused(NewTask::new("a\u{7}", json!({}))).reason,
            "kind must not contain control characters"
        );
        assert_eq!(
            refused(task().unique("k".repeat(MAX_UNIQUE_KEY_CHARS + 1))).field,
            TaskField::UniqueKey
        );
        assert_eq!(
            refused(NewTask::new("k", json!({"a": "\u{0}"}))).field,
            TaskField::Data
        );
    }

    #[test]
    fn seconds_read_against_the_same_limits() {
        assert_eq!(
            seconds(TaskField::Delay, 86_400.0),
            Ok(Duration::from_secs(86_400))
        );
        for bad in [-1.0, 86_400.001, f64::NAN, f64::INFINITY] {
            assert_eq!(
                seconds(TaskField::Delay, bad).unwrap_err().reason,
                "delay_seconds must be between 0 and 86400",
                "{bad}"
            );
        }
        assert_eq!(
            seconds(TaskField::Timeout, 0.001),
            Ok(Duration::from_millis(1))
        );
        assert_eq!(
            seconds(TaskField::Snooze, 31_622_401.0).unwrap_err().reason,
            "seconds must be between 0 and 31622400"
        );
        assert_eq!(
            seconds(TaskField::UniquePeriod, 0.5).unwrap_err().reason,
            "unique_period_seconds must be between 1 and 31622400"
        );
    }

    #[test]
    fn an_error_is_bounded_and_without_nul() {
        assert_eq!(check_error(&"é".repeat(MAX_ERROR_CHARS)), Ok(()));
        assert_eq!(
            check_error(&"é".repeat(MAX_ERROR_CHARS + 1))
                .unwrap_err()
                .reason,
            "error must be at most 4096 characters"
        );
        assert_eq!(
            check_error("a\0").unwrap_err().reason,
            "error must not contain the NUL character"
        );
    }
}

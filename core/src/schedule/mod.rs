//! Schedules: cron-declared periodic tasks, each tick fired exactly once by
//! the holder of the lease `singleton:scheduler`, fenced like the generator.
//!
//! A schedule is a unique name, a cron expression (5 fields, or 6 with
//! seconds first: `*/5 * * * * *`), a time zone (UTC unless given), the
//! task each tick enqueues (kind, queue, data, priority, max attempts), a
//! catch-up policy ([`CatchUp`]) and a paused flag. Schedules live in the
//! library's table `schedules`: declared in code
//! ([`RuntimeBuilder::schedule`](crate::worker::runtime::RuntimeBuilder::schedule),
//! upserted at start, safe from many replicas at once) or through the
//! dashboard's REST API, the same rows either way.
//!
//! Every replica runs a [`Scheduler`](runtime::Scheduler); only the holder
//! of `singleton:scheduler` fires. Each firing is one transaction
//! ([`store::fire`]) that checks the lease row still names this holder
//! with this term's fencing token, unexpired by the database clock, and
//! locks it; inserts the tick's task (carrying `schedule` and `tick_at`),
//! a row of `schedule_ticks` unique per (schedule, tick time) naming the
//! holder and token, and moves the schedule's `last_tick_at` on. So:
//!
//! - a tick fires at most once (the unique row, and the cursor moved in the
//!   same transaction);
//! - a stale leader (paused past its TTL, partitioned) inserts nothing: its
//!   check fails, or, if it got there first, the takeover waits for its
//!   commit and the new leader starts after the ticks it fired;
//! - ticks nobody fired while no one led are fired by the new leader as
//!   the schedule's [`CatchUp`] policy says.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pool = leasekeeper_core::db::testing::fresh_pool().await;
//! use leasekeeper_core::schedule::{CatchUp, NewSchedule, store};
//! use serde_json::json;
//!
//! let nightly = NewSchedule::new("nightly-report", "0 2 * * *", "report")
//!     .data(json!({"format": "pdf"}))
//!     .time_zone("Europe/Berlin")
//!     .catch_up(CatchUp::Latest);
//! let schema = leasekeeper_core::db::Schema::default();
//! let mut conn = pool.acquire().await?;
//! let (schedule, created) = store::upsert(&mut conn, &schema, &nightly, "docs").await?;
//! assert!(created);
//! assert_eq!(schedule.cron_text, "At 02:00 (Europe/Berlin)");
//! assert!(schedule.next_tick_at.is_some());
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "postgres")]
pub mod cron;
#[cfg(feature = "postgres")]
pub mod runtime;
#[cfg(feature = "postgres")]
pub mod store;

use crate::text::text_enum;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The lease whose holder fires every schedule's ticks.
pub const RESOURCE: &str = "singleton:scheduler";

/// The longest schedule name, in characters.
pub const MAX_NAME_CHARS: usize = 128;

/// A schedule name's rules as a regular expression (for the OpenAPI
/// document): letters, digits, `.`, `_`, `-` and `:`, starting with a
/// letter or digit, 1 to 128 characters. They are safe in a URL path.
pub const NAME_PATTERN: &str = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$";

text_enum! {
    stored;
    /// What a schedule does with ticks that came due while no replica led
    /// (the scheduler's holder died or was cut off, the database was down).
    pub enum CatchUp {
        /// Fire every missed tick, oldest first, up to the scheduler's cap
        /// ([`SchedulerConfig::catch_up_cap`](runtime::SchedulerConfig),
        /// 100 unless set); older ones beyond it are skipped.
        All = "all",
        /// Fire only the newest missed tick. The default.
        Latest = "latest",
        /// Fire no missed tick: only a tick fired on time (less than the
        /// scheduler's `on_time` after it came due, 5 s unless set).
        None = "none",
    }
}

/// Checks a schedule name (see [`NAME_PATTERN`]).
pub fn check_name(name: &str) -> Result<(), String> {
    let chars = name.chars().count();
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':');
    if chars == 0 || chars > MAX_NAME_CHARS {
        return Err(format!(
            "name must be 1 to {MAX_NAME_CHARS} characters, got {chars}"
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) || !name.chars().all(ok_char) {
        return Err(
            "name must be letters, digits, '.', '_', '-' and ':', starting with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

/// A schedule to declare: what fires when, and what each tick enqueues.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewSchedule {
    /// Its unique name.
    pub name: String,
    /// The cron expression: 5 fields, or 6 with seconds first.
    pub cron: String,
    /// An IANA time zone the expression is read in (`UTC` unless set).
    pub time_zone: String,
    /// The kind of the task each tick enqueues.
    pub kind: String,
    /// The queue it waits in (`default` unless set).
    pub queue: String,
    /// The task's data (`{}` unless set).
    pub data: serde_json::Value,
    /// The task's priority (0 unless set).
    pub priority: i16,
    /// The task's attempts (5 unless set).
    pub max_attempts: i32,
    /// What happens to ticks missed while nobody led.
    pub catch_up: CatchUp,
}

impl NewSchedule {
    /// `name` firing `cron` (UTC), each tick enqueuing a task of `kind`
    /// with data `{}` in the default queue, catch-up [`CatchUp::Latest`].
    pub fn new(name: impl Into<String>, cron: impl Into<String>, kind: impl Into<String>) -> Self {
        NewSchedule {
            name: name.into(),
            cron: cron.into(),
            time_zone: "UTC".into(),
            kind: kind.into(),
            queue: crate::queue::DEFAULT_QUEUE.into(),
            data: serde_json::json!({}),
            priority: 0,
            max_attempts: 5,
            catch_up: CatchUp::Latest,
        }
    }

    /// The task's data.
    pub fn data(mut self, data: serde_json::Value) -> Self {
        self.data = data;
        self
    }

    /// The task's queue.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// The task's priority.
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// The task's attempts.
    pub fn max_attempts(mut self, max_attempts: i32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// The catch-up policy.
    pub fn catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// The IANA time zone the expression is read in (`Europe/Berlin`).
    pub fn time_zone(mut self, time_zone: impl Into<String>) -> Self {
        self.time_zone = time_zone.into();
        self
    }
}

/// Who holds `singleton:scheduler` now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Leader {
    /// The replica (instance or runtime id).
    pub holder: String,
    /// Its term's fencing token.
    pub fencing_token: i64,
}

/// A schedule as stored, with its next and last tick.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Schedule {
    /// Its unique name.
    pub name: String,
    /// The cron expression.
    pub cron: String,
    /// The expression in words, with its time zone ("At 02:00 (UTC)").
    pub cron_text: String,
    /// The IANA time zone the expression is read in.
    pub time_zone: String,
    /// The kind of the task each tick enqueues.
    pub kind: String,
    /// Its queue.
    pub queue: String,
    /// Its data.
    pub data: serde_json::Value,
    /// Its priority.
    pub priority: i16,
    /// Its attempts.
    pub max_attempts: i32,
    /// What happens to ticks missed while nobody led.
    pub catch_up: CatchUp,
    /// Paused: fires nothing, and does not catch up the paused time.
    pub paused: bool,
    /// The next tick that will fire (null while paused).
    pub next_tick_at: Option<DateTime<Utc>>,
    /// Milliseconds until then, by the database clock at read time.
    pub next_tick_in_ms: Option<i64>,
    /// The newest tick fired (or skipped by the catch-up policy).
    pub last_tick_at: Option<DateTime<Utc>>,
    /// When it was first declared.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// Who changed it last (an operator, a runtime's id).
    pub updated_by: Option<String>,
    /// Who fires the ticks now (null while nobody holds the lease).
    pub leader: Option<Leader>,
}

/// One fired tick: when it was due, the task it enqueued, who fired it
/// under which token, and when.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Tick {
    /// The tick's row id (for paging).
    pub id: i64,
    /// The schedule.
    pub schedule: String,
    /// When the tick was due.
    pub tick_at: DateTime<Utc>,
    /// The task it enqueued.
    pub task_id: i64,
    /// The replica that fired it.
    pub holder: String,
    /// Its term's fencing token.
    pub fencing_token: i64,
    /// When it was fired (the database clock).
    pub fired_at: DateTime<Utc>,
    /// Fired late, to catch up a gap nobody led through.
    pub caught_up: bool,
}

impl Tick {
    /// `fired_at - tick_at`, in milliseconds.
    pub fn lateness_ms(&self) -> i64 {
        (self.fired_at - self.tick_at).num_milliseconds()
    }
}

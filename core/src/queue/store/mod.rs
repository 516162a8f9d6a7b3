//! The task store: enqueueing, claiming, heartbeats, completion and
//! failure, the fenced transaction, and the task lists. (Operator cancel,
//! retry and force-release are in `queue::control`; retention deletes old
//! tasks, `maintenance`.)
//!
//! One file per idea, one path per item (`queue::store::…`): `enqueue.rs`;
//! `claim.rs` (one statement for many claims); `guard.rs` (the
//! claim guard every processor write shares, and the record of a refused
//! write); `heartbeat.rs`; `complete.rs`; `fail.rs`; `give_back.rs` (claims a
//! runtime prefetched and never started, given back without using an
//! attempt); `fenced.rs` (a
//! handler's writes committed with its completion); `read.rs` (one task,
//! the lists); `attempts.rs` (a task's attempts on record); [`sql`] (the
//! hot statements as text).
//!
//! A claim's lease is its task row: the claim writes its holder
//! (`processor`), a new fencing token and its deadline
//! (`must_heartbeat_before`) there, and its history goes to `lease_events`
//! under `task:<id>` (the tasks trigger). Heartbeat, complete and fail are accepted only from the processor that
//! holds the current claim, with its fencing token, before its deadline; a
//! refused write changes nothing and is recorded in `lease_events` as
//! `stale_write_refused`, in the same transaction as the refusal.
//!
//! Enqueue a task, claim it, complete it; a second completion is refused:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pool = leasekeeper_core::db::testing::fresh_pool().await;
//! use leasekeeper_core::lease::Holder;
//! use leasekeeper_core::queue::store::{self, TaskError};
//! use leasekeeper_core::queue::{NewTask, TaskStatus};
//! use serde_json::json;
//! use std::time::Duration;
//!
//! let mut conn = pool.acquire().await?;
//! let schema = leasekeeper_core::db::Schema::default(); // where the tables are
//! // A task of kind `email` in the default queue, up to 3 attempts, claimable at once.
//! let new = NewTask::new("email", json!({"to": "ada@example.com"})).max_attempts(3);
//! let task = store::enqueue(&mut conn, &schema, &new).await?;
//! assert_eq!((task.status, task.queue.as_str()), (TaskStatus::Pending, "default"));
//!
//! // A worker claims it for 30 s, with a fencing token.
//! let worker = Holder::parse("worker-1")?;
//! let ttl = Duration::from_secs(30);
//! let claimed = store::claim_next(&mut conn, &schema, &worker, ttl).await?.expect("a task is due");
//! assert_eq!((claimed.id, claimed.status), (task.id, TaskStatus::Started));
//! let token = claimed.fencing_token.expect("a claim has a token");
//!
//! // While the claim is live nobody else gets the task.
//! let other = Holder::parse("worker-2")?;
//! assert!(store::claim_next(&mut conn, &schema, &other, ttl).await?.is_none());
//!
//! // The holder completes it with its token; the task completes only once.
//! let output = json!({"sent": true});
//! let done = store::complete(&mut conn, &schema, task.id, &worker, token, Some(&output)).await?;
//! assert_eq!(done.status, TaskStatus::Processed);
//! assert_eq!(done.task_output, Some(output));
//! let again = store::complete(&mut conn, &schema, task.id, &worker, token, None).await;
//! assert!(matches!(again, Err(TaskError::Stale { .. })));
//! # Ok(())
//! # }
//! ```

mod attempts;
mod claim;
mod complete;
mod enqueue;
mod fail;
mod fenced;
mod give_back;
mod guard;
mod heartbeat;
mod read;
pub mod sql;
mod wait;

pub use attempts::attempts;
pub use claim::{Claimed, claim_batch, claim_for, claim_next, claim_next_in};
pub use complete::{Completion, complete, complete_all_of, complete_each};
pub use enqueue::{
    Enqueued, MAX_ENQUEUE_BATCH, MAX_UNIQUE_KEY_CHARS, UNIQUE_PERIODS, enqueue, enqueue_many,
    enqueue_outcome,
};
pub(crate) use enqueue::{insert_workflow_tasks, queue_cap};
pub use fail::{MAX_ERROR_CHARS, MAX_SNOOZE, bounded_error, fail, fail_as, snooze};
pub use fenced::FencedTransaction;
pub use give_back::give_back_each;
pub use heartbeat::{heartbeat, heartbeat_each};
pub use read::{get, list, list_page};
pub use wait::{MAX_WAIT, resume_timed_out, signal, wait_for};

use crate::lease::store::LeaseError;
use std::time::Duration;

/// Columns of a [`Task`], with the time to its deadline computed by the
/// database clock. Usable after `SELECT` and after `RETURNING`.
pub(crate) const TASK_COLUMNS: &str = "id, kind, queue, priority, task_data, scheduled_at, processor, last_heartbeat_at, \
    must_heartbeat_before, started_at, processed_at, task_output, status, attempts, max_attempts, \
    fencing_token, last_error, failed_at, cancelled_at, created_at, \
    CASE WHEN status = 'started' \
         THEN (EXTRACT(EPOCH FROM (must_heartbeat_before - now())) * 1000)::bigint END AS heartbeat_in_ms, \
    unique_key, unique_scope, schedule, tick_at, timeout_ms, concurrency_key, \
    workflow_id, workflow_ref, parents_left, on_parent_failure, parent_outputs, \
    wait_signal, wait_until, signals";

/// Why a task operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// No task with that id.
    #[error("no task with id {0}")]
    NotFound(i64),
    /// The write came from a processor that does not hold the current claim
    /// (wrong processor or token, lease expired, or task already finished).
    #[error("task {id}: {reason}")]
    Stale {
        /// The task.
        id: i64,
        /// Why it was refused, for the caller and the history.
        reason: String,
    },
    /// A value the store cannot accept.
    #[error("{0}")]
    BadInput(String),
    /// The change would break a rule another task's state decides (a
    /// unique key another task holds).
    #[error("{0}")]
    Conflict(String),
    /// The enqueue names queues not seen before, and with them there would
    /// be more queues than the cap allows
    /// ([`queues::MAX_QUEUES_SETTING`](crate::queue::queues::MAX_QUEUES_SETTING));
    /// nothing was inserted. The words say how many exist, the cap and the
    /// new names.
    #[error("{0}")]
    QueueCap(String),
    /// The task's lease could not be handled.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The database failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

/// What happens after a failed attempt (a handler's error or panic, a
/// timeout, a graceful stop mid-task): when the task is tried again, and
/// when it is failed for good.
///
/// - **Backoff**: exponential, `base * 2^(attempts-1)`, at most `max`
///   (a constant delay is `base == max`).
/// - **Jitter**: a fraction from 0 to 1 of that delay taken off at random,
///   so tasks that failed together do not all come back together: the
///   delay is drawn from `[delay * (1 - jitter), delay]` (by the database,
///   at the failing write).
/// - **Max attempts**: `None` keeps each task's own
///   ([`NewTask::max_attempts`](crate::queue::NewTask::max_attempts), 5
///   unless the enqueue said otherwise); `Some(n)` (1 to 1000) replaces it
///   at the task's first failed attempt (the task row then says `n`).
///
/// The default, and what every kind without a policy of its own gets, is
/// what the queue always did: 1 s doubling up to 60 s, no jitter, the
/// task's own max attempts.
///
/// ```
/// use leasekeeper_core::RetryPolicy;
/// use std::time::Duration;
/// let policy = RetryPolicy::exponential(Duration::from_millis(200), Duration::from_secs(5))
///     .max_attempts(8)
///     .jitter(0.2);
/// assert_eq!(policy.delay(1), Duration::from_millis(200));
/// assert_eq!(policy.delay(3), Duration::from_millis(800));
/// assert_eq!(policy.delay(20), Duration::from_secs(5));
/// assert_eq!(RetryPolicy::default().delay(2), Duration::from_secs(2));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Delay after the first failure.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
    /// The task's attempts in all, replacing its own (`None`: its own).
    pub max_attempts: Option<i32>,
    /// The fraction of the delay (0 to 1) taken off at random.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
            max_attempts: None,
            jitter: 0.0,
        }
    }
}

impl RetryPolicy {
    /// `base` doubling per failed attempt up to `max`; no jitter, each
    /// task's own max attempts.
    pub fn exponential(base: Duration, max: Duration) -> Self {
        RetryPolicy {
            base,
            max,
            ..RetryPolicy::default()
        }
    }

    /// The same `delay` after every failed attempt.
    pub fn constant(delay: Duration) -> Self {
        RetryPolicy::exponential(delay, delay)
    }

    /// At most `attempts` attempts in all (1 to 1000), whatever the task
    /// was enqueued with.
    pub fn max_attempts(mut self, attempts: i32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Takes up to `fraction` (0 to 1) of each delay off at random.
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = fraction;
        self
    }

    /// The delay before the next attempt after `attempts` attempts,
    /// before jitter.
    pub fn delay(&self, attempts: i32) -> Duration {
        let exponent = attempts.saturating_sub(1).clamp(0, 30) as u32;
        self.base.saturating_mul(1 << exponent).min(self.max)
    }

    /// Refuses max attempts outside 1 to 1000, a jitter outside 0 to 1, and
    /// a `max` below `base`, saying which.
    pub fn check(&self) -> Result<(), String> {
        if let Some(n) = self.max_attempts
            && !(1..=1000).contains(&n)
        {
            return Err(format!("max_attempts must be between 1 and 1000, got {n}"));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(format!(
                "jitter must be a fraction from 0 to 1, got {}",
                self.jitter
            ));
        }
        if self.max < self.base {
            return Err(format!(
                "the longest delay ({:?}) is shorter than the first ({:?})",
                self.max, self.base
            ));
        }
        Ok(())
    }
}

/// The retry policy of each task kind: one of its own, or the default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RetryPolicies {
    default: RetryPolicy,
    by_kind: std::sync::Arc<std::collections::HashMap<String, RetryPolicy>>,
}

impl RetryPolicies {
    /// `default` for every kind.
    pub fn new(default: RetryPolicy) -> Self {
        RetryPolicies {
            default,
            by_kind: Default::default(),
        }
    }

    /// Kind `kind` gets `policy`.
    pub fn with(mut self, kind: impl Into<String>, policy: RetryPolicy) -> Self {
        std::sync::Arc::make_mut(&mut self.by_kind).insert(kind.into(), policy);
        self
    }

    /// The default, for a kind without its own.
    pub fn with_default(mut self, default: RetryPolicy) -> Self {
        self.default = default;
        self
    }

    /// The policy of `kind`.
    pub fn of(&self, kind: &str) -> RetryPolicy {
        self.by_kind.get(kind).copied().unwrap_or(self.default)
    }

    /// Every policy checked ([`RetryPolicy::check`]), the kind named.
    pub fn check(&self) -> Result<(), String> {
        self.default
            .check()
            .map_err(|e| format!("retry policy: {e}"))?;
        for (kind, policy) in self.by_kind.iter() {
            policy
                .check()
                .map_err(|e| format!("retry policy of kind {kind:?}: {e}"))?;
        }
        Ok(())
    }
}

/// The most tasks one batch statement ([`claim_batch`], [`claim_for`],
/// [`heartbeat_each`], [`complete_each`]) may name.
pub const MAX_BATCH: usize = 1000;

pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

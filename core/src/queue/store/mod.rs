//! The task store: enqueueing, claiming, heartbeats, completion and
//! failure, the fenced transaction, and the task lists. (Operator cancel,
//! retry and force-release are in `queue::control`; retention deletes old
//! tasks, `maintenance`.)
//!
//! One file per idea, one path per item (`queue::store::…`): `enqueue.rs`;
//! `claim.rs` (a lease per claim, one statement for many); `guard.rs` (the
//! claim guard every processor write shares, and the record of a refused
//! write); `heartbeat.rs`; `complete.rs`; `fail.rs`; `fenced.rs` (a
//! handler's writes committed with its completion); `read.rs` (one task,
//! the lists); `attempts.rs` (a task's attempts on record); [`sql`] (the
//! hot statements as text).
//!
//! A claim takes the task's lease (`task:<id>`) in the same transaction as
//! it marks the task started, so the task row and its lease never disagree.
//! Heartbeat, complete and fail are accepted only from the processor that
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
//! // A worker claims it: its lease on `task:<id>` for 30 s, with a fencing token.
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
mod guard;
mod heartbeat;
mod read;
pub mod sql;

pub use attempts::attempts;
pub use claim::{Claimed, claim_batch, claim_for, claim_next, claim_next_in};
pub use complete::{Completion, complete, complete_all_of, complete_each};
pub use enqueue::{
    Enqueued, MAX_ENQUEUE_BATCH, MAX_UNIQUE_KEY_CHARS, check as check_new, enqueue, enqueue_many,
    enqueue_outcome,
};
pub use fail::{MAX_ERROR_CHARS, MAX_SNOOZE, bounded_error, fail, fail_as, snooze};
pub use fenced::FencedTransaction;
pub use heartbeat::{heartbeat, heartbeat_each};
pub use read::{get, list, list_page};

use super::Task;
use crate::lease::Resource;
use crate::lease::store::LeaseError;
use std::time::Duration;

/// Columns of a [`Task`], with the time to its deadline computed by the
/// database clock. Usable after `SELECT` and after `RETURNING`.
pub(crate) const TASK_COLUMNS: &str = "id, kind, queue, priority, task_data, scheduled_at, processor, last_heartbeat_at, \
    must_heartbeat_before, started_at, processed_at, task_output, status, attempts, max_attempts, \
    fencing_token, last_error, failed_at, cancelled_at, created_at, \
    CASE WHEN status = 'started' \
         THEN (EXTRACT(EPOCH FROM (must_heartbeat_before - now())) * 1000)::bigint END AS heartbeat_in_ms, \
    unique_key, unique_scope, schedule, tick_at, timeout_ms";

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
    /// The task's lease could not be handled.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The database failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

/// Exponential backoff between failed attempts: `base * 2^(attempts-1)`,
/// at most `max`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Delay after the first failure.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The delay before the next attempt after `attempts` attempts.
    pub fn delay(&self, attempts: i32) -> Duration {
        let exponent = attempts.saturating_sub(1).clamp(0, 30) as u32;
        self.base.saturating_mul(1 << exponent).min(self.max)
    }
}

/// The most tasks one batch statement ([`claim_batch`], [`claim_for`],
/// [`heartbeat_each`], [`complete_each`]) may name.
pub const MAX_BATCH: usize = 1000;

pub(super) fn task_resource(id: i64) -> Result<Resource, TaskError> {
    Resource::parse(Task::resource_name(id)).map_err(|e| TaskError::BadInput(e.to_string()))
}

pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

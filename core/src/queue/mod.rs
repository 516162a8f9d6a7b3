//! The task queue: tasks whose every claim is a lease on `task:<id>`.
//!
//! This module holds the types the server and the browser share. The
//! server-only parts are the SQL store ([`store`]).

mod attempt;
#[cfg(feature = "postgres")]
pub mod control;
pub mod failed;
pub mod queue_limits;
pub mod queues;
#[cfg(feature = "postgres")]
pub mod rescuer;
#[cfg(feature = "postgres")]
pub mod store;
#[cfg(feature = "postgres")]
pub mod wake;

mod limits;
mod name;
mod search;
mod wire;
pub use attempt::{Attempt, AttemptOutcome};
pub use limits::{
    InvalidTask, MAX_ATTEMPTS, MAX_DELAY, MAX_ENQUEUE_BATCH, MAX_ERROR_CHARS, MAX_SNOOZE,
    MAX_UNIQUE_KEY_CHARS, MAX_WAIT, TIMEOUTS, TaskField, UNIQUE_PERIODS,
};
pub use name::{MAX_NAME_CHARS, NAME_PATTERN, TaskName};
pub use search::{DATA_NOT_AN_OBJECT, MAX_DATA_FILTER_CHARS, TaskSearch};
pub use wire::{
    ClaimRequest, CompleteBody, EnqueueBatch, EnqueueBody, FailBody, HeartbeatBody,
    MAX_CLAIM_KINDS, SignalBody, SnoozeBody, WaitBody,
};

use crate::text::text_enum;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

text_enum! {
    stored;
    /// Where a task is in its life (see the tasks migration for the full story).
    pub enum TaskStatus {
        /// Waiting to be claimed (not before `scheduled_at`).
        Pending = "pending",
        /// Claimed; its processor holds the lease until `must_heartbeat_before`.
        Started = "started",
        /// Completed exactly once.
        Processed = "processed",
        /// Gave up after `max_attempts`.
        Failed = "failed",
        /// Taken out of the queue by an operator (a retry puts it back), or
        /// by its parent's failure in a workflow.
        Cancelled = "cancelled",
        /// Not claimable until something else happens: its parents in a
        /// workflow end (`parents_left`), or the signal it waits for comes
        /// (`wait_signal`, until `wait_until`). Then pending.
        Waiting = "waiting",
    }
}

/// An operator's action on tasks (see `queue::control` for what each does in
/// the database). Shared with the browser: the dashboard offers the action
/// that applies to a task's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskAction {
    /// Pending, waiting or started → cancelled.
    Cancel,
    /// Failed or cancelled → pending, attempts reset.
    Retry,
    /// Started → still started, its claim ended now: another worker may
    /// take the task over at once (with the next token), and its
    /// processor's writes are refused. What a force-release of a task's
    /// lease did before the task row became the lease (issue 41).
    Release,
}

impl TaskAction {
    /// The statuses a task may be in for this action to apply to it.
    pub fn applies_to(self) -> &'static [TaskStatus] {
        match self {
            TaskAction::Cancel => &[
                TaskStatus::Pending,
                TaskStatus::Waiting,
                TaskStatus::Started,
            ],
            TaskAction::Retry => &[TaskStatus::Failed, TaskStatus::Cancelled],
            TaskAction::Release => &[TaskStatus::Started],
        }
    }

    /// Those statuses in words: `pending, waiting or started`.
    pub fn applies_text(self) -> String {
        let names: Vec<&str> = self.applies_to().iter().map(|s| s.as_str()).collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        }
    }

    /// The action that applies to a task in `status`, if any (none for a
    /// processed task): cancel or retry ([`TaskAction::Release`] is the
    /// started task's second action).
    pub fn for_status(status: TaskStatus) -> Option<TaskAction> {
        [TaskAction::Cancel, TaskAction::Retry]
            .into_iter()
            .find(|a| a.applies_to().contains(&status))
    }

    /// `cancel`, `retry` or `release`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskAction::Cancel => "cancel",
            TaskAction::Retry => "retry",
            TaskAction::Release => "release",
        }
    }

    /// Parses `cancel`, `retry` or `release`, else says what it takes.
    pub fn parse(raw: &str) -> Result<TaskAction, String> {
        match raw {
            "cancel" => Ok(TaskAction::Cancel),
            "retry" => Ok(TaskAction::Retry),
            "release" => Ok(TaskAction::Release),
            other => Err(format!(
                "action must be cancel, retry or release, got {other:?}"
            )),
        }
    }
}

/// One task as the API and the dashboard show it. `heartbeat_in_ms` is
/// computed by the database at read time: milliseconds until the claim's
/// lease runs out (negative when late), `None` unless started.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Task {
    /// Row id; the task's lease is on resource `task:<id>`.
    pub id: i64,
    /// Which handler runs it.
    pub kind: String,
    /// The queue it waits in (`default` unless enqueued elsewhere).
    pub queue: String,
    /// Lower runs first (0 by default).
    pub priority: i16,
    /// What to do, e.g. `{"sleep_duration_seconds": 5}`.
    pub task_data: serde_json::Value,
    /// Not claimed before this moment.
    pub scheduled_at: DateTime<Utc>,
    /// Who claimed it last.
    pub processor: Option<String>,
    /// The last accepted heartbeat.
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// When the current claim's lease runs out.
    pub must_heartbeat_before: Option<DateTime<Utc>>,
    /// When the current claim began.
    pub started_at: Option<DateTime<Utc>>,
    /// When it was completed.
    pub processed_at: Option<DateTime<Utc>>,
    /// What the processor returned.
    pub task_output: Option<serde_json::Value>,
    /// Lifecycle state.
    pub status: TaskStatus,
    /// Claims so far (a takeover after a crash counts as one).
    pub attempts: i32,
    /// Claims allowed before the task is marked failed.
    pub max_attempts: i32,
    /// Fencing token of the current (or last) claim.
    pub fencing_token: Option<i64>,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
    /// When it was marked failed.
    pub failed_at: Option<DateTime<Utc>>,
    /// When an operator cancelled it.
    pub cancelled_at: Option<DateTime<Utc>>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// Milliseconds until the claim's deadline at read time (negative when late).
    pub heartbeat_in_ms: Option<i64>,
    /// The key that keeps it unique among tasks of its kind, if it has one
    /// ([`NewTask::unique`]).
    pub unique_key: Option<String>,
    /// Among which tasks the key is unique, when it has one.
    pub unique_scope: Option<UniqueScope>,
    /// The schedule that enqueued it, if one did (a tick or a trigger).
    pub schedule: Option<String>,
    /// The schedule's tick it fired for (null for a trigger and for tasks
    /// no schedule enqueued).
    pub tick_at: Option<DateTime<Utc>>,
    /// Its own time limit per attempt, in milliseconds (null: the runtime's
    /// default for its kind, if any).
    pub timeout_ms: Option<i32>,
    /// The key its queue's limits count it under, if it has one
    /// ([`NewTask::concurrency_key`]).
    pub concurrency_key: Option<String>,
    /// The workflow it belongs to, if any ([`crate::workflow`]).
    #[serde(default)]
    pub workflow_id: Option<i64>,
    /// Its ref in its workflow (unique there).
    #[serde(default)]
    pub workflow_ref: Option<String>,
    /// Its parents in the workflow that have not ended yet; it is waiting
    /// while this is above 0.
    #[serde(default)]
    pub parents_left: i32,
    /// What a parent's failure or cancel does to it: `cancel` or `run`
    /// (null: it has no parents).
    #[serde(default)]
    pub on_parent_failure: Option<String>,
    /// Its processed parents' outputs, by their refs (null: it has no
    /// processed parent).
    #[serde(default)]
    pub parent_outputs: Option<serde_json::Value>,
    /// The signal it waits for, when its handler asked to wait for one
    /// ([`crate::worker::handler::Done::wait_for`]); on a task no longer
    /// waiting, the one its last wait timed out waiting for (a signal
    /// clears it).
    #[serde(default)]
    pub wait_signal: Option<String>,
    /// When its wait ends without the signal (it is pending again then).
    #[serde(default)]
    pub wait_until: Option<DateTime<Utc>>,
    /// The signals it got, by name, with their payloads.
    #[serde(default)]
    pub signals: Option<serde_json::Value>,
}

impl Task {
    /// The lease resource guarding this task.
    pub fn resource_name(id: i64) -> String {
        format!("task:{id}")
    }

    /// True when started and past its heartbeat deadline: anyone may take it over.
    pub fn is_late(&self) -> bool {
        self.status == TaskStatus::Started && self.heartbeat_in_ms.is_some_and(|ms| ms <= 0)
    }
}

/// The queue a task waits in when its enqueue names none.
pub const DEFAULT_QUEUE: &str = "default";

/// Checks a task kind or queue name: 1 to [`MAX_NAME_CHARS`] characters,
/// none of them a control character. `what` names it in the error
/// ([`TaskName::check`], the one rule).
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    TaskName::check(what, name)
}

/// A task to enqueue: what to do (`kind` and `data`), where it waits
/// (`queue`), how urgent it is (`priority`), and how often it may be tried.
///
/// ```
/// use leasekeeper_core::queue::NewTask;
/// use serde_json::json;
/// use std::time::Duration;
///
/// let task = NewTask::new("email", json!({"to": "ada@example.org"}))
///     .queue("mail")
///     .priority(-1)
///     .max_attempts(3)
///     .delay(Duration::from_secs(10));
/// assert_eq!(task.kind, "email");
/// assert_eq!(task.queue, "mail");
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewTask {
    /// Which handler runs it.
    pub kind: String,
    /// What the handler gets.
    pub data: serde_json::Value,
    /// The queue it waits in ([`DEFAULT_QUEUE`] unless set).
    pub queue: String,
    /// Lower runs first; 0 unless set.
    pub priority: i16,
    /// Claims allowed before it is marked failed (1 to 1000; 5 unless set).
    pub max_attempts: i32,
    /// Not claimed before this much time has passed (by the database clock;
    /// at most [`MAX_DELAY`]).
    pub delay: Option<std::time::Duration>,
    /// A key that keeps it unique among tasks of its kind ([`NewTask::unique`]).
    #[serde(default)]
    pub unique: Option<Unique>,
    /// Its time limit per attempt ([`NewTask::timeout`]).
    #[serde(default)]
    pub timeout: Option<std::time::Duration>,
    /// The key its queue's limits count it under
    /// ([`NewTask::concurrency_key`]).
    #[serde(default)]
    pub concurrency_key: Option<String>,
    /// The schedule enqueuing it, and the tick (set by the scheduler).
    #[serde(skip)]
    pub(crate) scheduled_by: Option<(String, Option<DateTime<Utc>>)>,
}

text_enum! {
    stored;
    /// Among which tasks of its kind a unique key is unique (within its
    /// period, when it has one).
    pub enum UniqueScope {
        /// The pending and started ones: once the task is processed, failed
        /// or cancelled, its key is free again. The default.
        Active = "active",
        /// Every one still on record, whatever its state (until retention
        /// deletes it).
        Always = "always",
    }
}

/// A unique key, its scope and its period; see [`NewTask::unique`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unique {
    /// The key: 1 to 256 characters.
    pub key: String,
    /// Among which tasks it is unique.
    pub scope: UniqueScope,
    /// When set, unique only among the tasks enqueued in the same period
    /// (1 s to 366 days; fixed periods counted from the Unix epoch by the
    /// database clock: with an hour, 10:00 to 10:59:59).
    pub period: Option<std::time::Duration>,
}

impl NewTask {
    /// A task of `kind` with `data`, in the default queue, priority 0, five attempts.
    pub fn new(kind: impl Into<String>, data: serde_json::Value) -> Self {
        NewTask {
            kind: kind.into(),
            data,
            queue: DEFAULT_QUEUE.to_string(),
            priority: 0,
            max_attempts: 5,
            delay: None,
            unique: None,
            timeout: None,
            concurrency_key: None,
            scheduled_by: None,
        }
    }

    /// Counts it under `key` (1 to 256 characters: a tenant, an account,
    /// an API) for its queue's limits: at most
    /// [`max_started_per_key`](crate::queue::queue_limits::QueueLimits::max_started_per_key)
    /// tasks of one key are started at once, and a limited queue serves its
    /// keys fairly, so one key's backlog does not hold up another's task.
    /// Without a key, a task counts toward the queue's `max_started` only.
    pub fn concurrency_key(mut self, key: impl Into<String>) -> Self {
        self.concurrency_key = Some(key.into());
        self
    }

    /// Each attempt may run at most `timeout` (1 ms to 24 h): then the
    /// worker cancels the handler's context
    /// ([`TaskContext::cancelled`](crate::worker::handler::TaskContext::cancelled)),
    /// gives it its lost grace to return, and fails the attempt with
    /// "timed out after …" (retried as any failed attempt). Without one, the
    /// runtime's default for the kind applies
    /// ([`RuntimeBuilder::timeout`](crate::worker::runtime::RuntimeBuilder::timeout)), if any.
    pub fn timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Unique among the pending and started tasks of its kind: enqueueing
    /// it while another such task has the same key enqueues nothing and
    /// answers that task ([`Enqueued::Existing`](store::Enqueued)). Once that
    /// task is processed, failed or cancelled, the key is free again. The
    /// database enforces it (a unique index), so concurrent enqueues of one
    /// key make one task.
    ///
    /// ```
    /// use leasekeeper_core::queue::{NewTask, UniqueScope};
    /// use serde_json::json;
    /// let sync = NewTask::new("sync", json!({"customer": 7})).unique("customer-7");
    /// assert_eq!(sync.unique.unwrap().scope, UniqueScope::Active);
    /// ```
    pub fn unique(mut self, key: impl Into<String>) -> Self {
        self.unique = Some(Unique {
            key: key.into(),
            scope: UniqueScope::Active,
            period: None,
        });
        self
    }

    /// Unique among the tasks of its kind enqueued in the same `period`
    /// (periods are fixed, counted from the Unix epoch: with an hour, one
    /// task per key from 10:00 to 10:59:59), whatever their state. (Any
    /// [`Unique`] may be set as `task.unique`: active tasks of one period,
    /// say.)
    pub fn unique_for(mut self, key: impl Into<String>, period: std::time::Duration) -> Self {
        self.unique = Some(Unique {
            key: key.into(),
            scope: UniqueScope::Always,
            period: Some(period),
        });
        self
    }

    /// Unique among every task of its kind still on record, whatever its
    /// state (a processed task keeps its key until retention deletes it).
    pub fn unique_always(mut self, key: impl Into<String>) -> Self {
        self.unique = Some(Unique {
            key: key.into(),
            scope: UniqueScope::Always,
            period: None,
        });
        self
    }

    /// Waits in `queue`.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// Runs before tasks with a higher number (lower runs first).
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// May be claimed at most `max_attempts` times.
    pub fn max_attempts(mut self, max_attempts: i32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Is not claimed before `delay` has passed.
    pub fn delay(mut self, delay: std::time::Duration) -> Self {
        self.delay = Some(delay);
        self
    }
}

/// Which tasks a claim may take: those of one queue, and of the given kinds
/// only (every kind when `kinds` is `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimFilter {
    /// The queue claimed from.
    pub queue: String,
    /// The kinds claimed; `None` for all.
    pub kinds: Option<Vec<String>>,
}

impl ClaimFilter {
    /// Every kind in `queue`.
    pub fn queue(queue: impl Into<String>) -> Self {
        ClaimFilter {
            queue: queue.into(),
            kinds: None,
        }
    }

    /// Only these kinds.
    pub fn kinds<I, S>(mut self, kinds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.kinds = Some(kinds.into_iter().map(Into::into).collect());
        self
    }
}

impl Default for ClaimFilter {
    /// Every kind in the default queue: the original one-queue contract.
    fn default() -> Self {
        ClaimFilter::queue(DEFAULT_QUEUE)
    }
}

/// A task with the history of its lease, for the detail view.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskDetail {
    /// The task itself.
    pub task: Task,
    /// Recent events of its lease `task:<id>`, newest first.
    pub history: Vec<crate::lease::LeaseEvent>,
    /// Its attempts on record, oldest first.
    pub attempts: Vec<Attempt>,
}

/// A page of tasks with the TTL their deadlines are measured against.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskPage {
    /// The tasks, newest first.
    pub tasks: Vec<Task>,
    /// The cursor of the next (older) page; `None` on the last.
    pub next: Option<i64>,
    /// The lease TTL in milliseconds, for the heartbeat countdown's colour.
    pub ttl_ms: i64,
}

#[cfg(test)]
mod action_tests {
    use super::{TaskAction, TaskStatus};

    #[test]
    fn each_status_but_processed_has_its_cancel_or_retry_and_a_started_one_a_release() {
        assert_eq!(
            TaskAction::for_status(TaskStatus::Pending),
            Some(TaskAction::Cancel)
        );
        assert_eq!(
            TaskAction::for_status(TaskStatus::Started),
            Some(TaskAction::Cancel)
        );
        assert_eq!(
            TaskAction::for_status(TaskStatus::Failed),
            Some(TaskAction::Retry)
        );
        assert_eq!(
            TaskAction::for_status(TaskStatus::Cancelled),
            Some(TaskAction::Retry)
        );
        assert_eq!(TaskAction::for_status(TaskStatus::Processed), None);
        assert_eq!(TaskAction::parse("retry"), Ok(TaskAction::Retry));
        assert_eq!(TaskAction::parse("release"), Ok(TaskAction::Release));
        assert!(
            TaskAction::parse("delete")
                .unwrap_err()
                .contains("cancel, retry or release")
        );
        assert_eq!(
            TaskAction::for_status(TaskStatus::Waiting),
            Some(TaskAction::Cancel)
        );
        assert_eq!(
            TaskAction::Cancel.applies_text(),
            "pending, waiting or started"
        );
        // A started task's second action: its claim released.
        assert_eq!(TaskAction::Release.applies_text(), "started");
    }
}

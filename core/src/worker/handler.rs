//! Handlers: the work a runtime does for each task `kind`.
//!
//! A handler is an async function of the claimed [`Job`] and its
//! [`TaskContext`]. It answers [`Done`] (the task is completed with its
//! output, by the holder of the claim's fencing token only) or an error (a
//! failed attempt: the queue retries it after a backoff, then marks it
//! failed). A panic inside a handler is a failed attempt too: the worker
//! catches it and carries on.
//!
//! While a handler runs, its worker heartbeats the claim's lease. The
//! moment the claim is lost (a refused heartbeat, or the local deadline
//! passing before the database could consider the lease expired), the
//! context's [`TaskContext::lease_lost`] signal fires; the handler's result
//! after that is discarded, and whatever it had written through a
//! [`FencedTransaction`] is rolled back.
//!
//! An operator's cancel of a started task (one, or in bulk) ends the claim
//! in the database and is announced; the worker running it, hearing that, heartbeats at once, is
//! refused, and [`TaskContext::cancelled`] completes within a second
//! (within milliseconds, usually). Stopping on it is the handler's part:
//! one that ignores it runs on, but it is fenced all the same: its
//! completion, failure report and fenced transaction are refused.
//!
//! ```
//! use leasekeeper_core::{Done, HandlerResult, Job, TaskContext};
//! async fn export(job: Job, ctx: TaskContext) -> HandlerResult {
//!     for _chunk in 0..100 {
//!         tokio::select! {
//!             // Cancelled by an operator, the claim lost, or timed out.
//!             () = ctx.cancelled() => return Err("stopped: cancelled or lost".into()),
//!             () = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
//!         }
//!     }
//!     Ok(Done::output(serde_json::json!({ "task": job.id })))
//! }
//! ```

use crate::lease::Holder;
use crate::queue::store::FencedTransaction;
use serde_json::Value;
use sqlx::PgPool;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// A claimed task, as its handler gets it.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// The task's id (its lease is on `task:<id>`).
    pub id: i64,
    /// Which handler runs it.
    pub kind: String,
    /// The queue it came from.
    pub queue: String,
    /// What the enqueue asked for.
    pub data: Value,
    /// This attempt's number, from 1.
    pub attempt: i32,
    /// The claim's fencing token: every write of this attempt carries it.
    pub fencing_token: i64,
    /// In a workflow ([`crate::workflow`]): the outputs of its parents
    /// that were processed, by their refs (empty otherwise).
    pub parent_outputs: serde_json::Map<String, Value>,
    /// The signals it got while it waited ([`Done::wait_for`]), by name,
    /// with their payloads (empty when none came: its wait timed out, or it
    /// never waited).
    pub signals: serde_json::Map<String, Value>,
    /// The signal its last wait timed out waiting for, when it did: then
    /// the signal is not in [`signals`](Self::signals) and the handler
    /// decides without it.
    pub wait_timed_out: Option<String>,
}

impl Job {
    /// The name of this claim's term, `task:<id>` (its lease is the task
    /// row itself): with
    /// [`fencing_token`](Self::fencing_token), what a write outside the
    /// completion is fenced by ([`crate::lease::fence`]).
    pub fn resource(&self) -> String {
        crate::queue::Task::resource_name(self.id)
    }
}

/// What a handler failed with. Anything that is an error converts with `?`;
/// the message becomes the task's `last_error`.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a handler answers.
pub type HandlerResult = Result<Done, HandlerError>;

/// A finished handler's result: the output to complete the task with, and
/// optionally the transaction holding the handler's own writes, which then
/// commits with the completion or not at all.
#[derive(Debug)]
pub struct Done {
    pub(crate) output: Value,
    pub(crate) transaction: Option<FencedTransaction>,
    pub(crate) later: Option<Later>,
}

/// An end of the attempt that gives the attempt back: not now.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Later {
    /// Pending again after the delay ([`Done::snooze`]).
    Snooze(std::time::Duration),
    /// Waiting for the signal, at most the timeout ([`Done::wait_for`]).
    Wait(String, std::time::Duration),
}

impl Done {
    /// Completes the task with `output` (stored as the task's `task_output`).
    pub fn output(output: Value) -> Self {
        Done {
            output,
            transaction: None,
            later: None,
        }
    }

    /// Completes the task with `output` in `transaction`: the handler's
    /// writes in it commit only if this completion is accepted (see
    /// [`FencedTransaction`]).
    pub fn in_transaction(output: Value, transaction: FencedTransaction) -> Self {
        Done {
            output,
            transaction: Some(transaction),
            later: None,
        }
    }

    /// Completes the task with no output.
    pub fn empty() -> Self {
        Done::output(Value::Null)
    }

    /// Not now: puts the task back to pending, due again in `delay` (at
    /// most 366 days), without using up an attempt; its claim's lease is
    /// released and its history records the snooze. The task's next claim
    /// gets the same attempt number.
    pub fn snooze(delay: std::time::Duration) -> Self {
        Done {
            output: Value::Null,
            transaction: None,
            later: Some(Later::Snooze(delay)),
        }
    }

    /// Waits for a signal: ends this attempt with the task `waiting` for
    /// the signal named `signal` (1 to 128 characters), for at most
    /// `timeout` (1 ms to 366 days), without using up an attempt; its
    /// claim is released and nothing runs it meanwhile. A producer's `POST
    /// /api/tasks/{id}/signal` (or [`signal`](crate::queue::store::signal))
    /// with that name makes it pending at once, and its next claim's
    /// [`Job::signals`] holds the payload under the name; at the timeout it
    /// becomes pending without it (within the rescuer's interval, 5 s by
    /// default), so the handler, finding the signal missing, decides. A
    /// waiting task is only a row: it survives restarts and failovers.
    ///
    /// ```
    /// use leasekeeper_core::{Done, HandlerResult, Job, TaskContext};
    /// use std::time::Duration;
    ///
    /// async fn publish(job: Job, _ctx: TaskContext) -> HandlerResult {
    ///     match job.signals.get("approval") {
    ///         Some(answer) if answer["approved"] == true => Ok(Done::empty()),
    ///         Some(_) => Err("a person said no".into()),
    ///         None if job.wait_timed_out.is_some() => Err("nobody approved it within a day".into()),
    ///         None => Ok(Done::wait_for("approval", Duration::from_secs(24 * 3600))),
    ///     }
    /// }
    /// ```
    pub fn wait_for(signal: impl Into<String>, timeout: std::time::Duration) -> Self {
        Done {
            output: Value::Null,
            transaction: None,
            later: Some(Later::Wait(signal.into(), timeout)),
        }
    }
}

/// What a running handler can ask of its worker.
#[derive(Clone, Debug)]
pub struct TaskContext {
    pub(crate) worker: Holder,
    pub(crate) lost: CancellationToken,
    pub(crate) cancelled: CancellationToken,
    pub(crate) database: Option<HostDatabase>,
}

/// Where a handler's fenced transactions run: the host service's database,
/// through the queue's pool. (Not [`crate::db::Database`], the library's own
/// migrated pool.)
#[derive(Clone, Debug)]
pub struct HostDatabase {
    /// The queue's pool.
    pub pool: PgPool,
    /// The `search_path` a handler's transaction sees (the host's tables).
    pub search_path: Arc<str>,
}

impl TaskContext {
    /// The worker running this task (the holder of its lease).
    pub fn worker(&self) -> &Holder {
        &self.worker
    }

    /// Completes when the claim is lost: stop working, nothing more of
    /// this attempt will be accepted. Use it in a `select!` around long
    /// work, or check [`TaskContext::is_lost`] between steps.
    pub async fn lease_lost(&self) {
        self.lost.cancelled().await;
    }

    /// Whether the claim has been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Completes when the handler should stop:
    ///
    /// - an operator cancelled the task: within
    ///   1 s of the action (the worker hears the announcement, heartbeats at
    ///   once and is refused). A worker over the REST API hears no
    ///   announcements and finds out at its next heartbeat instead (a third
    ///   of the lease at most);
    /// - its claim was otherwise lost (a refused heartbeat, or its local
    ///   deadline passed), the moment the worker knows it;
    /// - the attempt ran past its time limit ([`NewTask::timeout`](crate::queue::NewTask::timeout)).
    ///
    /// Whatever the handler answers after that is discarded; it has the
    /// worker's lost grace (1 s by default) to return. A handler that
    /// ignores it is still fenced: its completion is refused and recorded as
    /// a stale write.
    pub async fn cancelled(&self) {
        self.cancelled.cancelled().await;
    }

    /// Whether [`TaskContext::cancelled`] has completed.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.is_cancelled()
    }

    /// Begins a transaction for the handler's own writes, to be handed back
    /// in [`Done::in_transaction`]: it commits with the completion, and
    /// only if the completion is accepted. Its statements see the host's
    /// `search_path`. Fails when the worker has no database of its own
    /// (a worker over the REST API).
    pub async fn transaction(&self) -> Result<FencedTransaction, HandlerError> {
        let Some(db) = &self.database else {
            return Err(
                "this worker reaches the queue over HTTP and has no database \
                        for a fenced transaction"
                    .into(),
            );
        };
        Ok(FencedTransaction::begin(&db.pool, &db.search_path).await?)
    }
}

/// The future a handler returns.
pub type HandlerFuture = Pin<Box<dyn Future<Output = HandlerResult> + Send + 'static>>;

/// The work for one task kind. Implemented for every
/// `Fn(Job, TaskContext) -> impl Future<Output = HandlerResult>`, so an
/// async closure or function is a handler.
pub trait Handler: Send + Sync + 'static {
    /// Works on `job`.
    fn handle(&self, job: Job, ctx: TaskContext) -> HandlerFuture;
}

impl<F, Fut> Handler for F
where
    F: Fn(Job, TaskContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    fn handle(&self, job: Job, ctx: TaskContext) -> HandlerFuture {
        Box::pin(self(job, ctx))
    }
}

/// Handlers by task kind.
#[derive(Clone, Default)]
pub struct Handlers {
    by_kind: HashMap<String, Arc<dyn Handler>>,
    timeouts: HashMap<String, std::time::Duration>,
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.kinds()).finish()
    }
}

impl Handlers {
    /// No handlers.
    pub fn new() -> Self {
        Handlers::default()
    }

    /// Registers `handler` for tasks of `kind` (replacing any earlier one).
    pub fn register(mut self, kind: impl Into<String>, handler: impl Handler) -> Self {
        self.by_kind.insert(kind.into(), Arc::new(handler));
        self
    }

    /// The handler for `kind`.
    pub fn get(&self, kind: &str) -> Option<&Arc<dyn Handler>> {
        self.by_kind.get(kind)
    }

    /// Attempts of tasks of `kind` that set no timeout of their own run at
    /// most `timeout`.
    pub fn timeout(mut self, kind: impl Into<String>, timeout: std::time::Duration) -> Self {
        self.timeouts.insert(kind.into(), timeout);
        self
    }

    /// The default time limit of an attempt of `kind`, if one was set.
    pub fn timeout_of(&self, kind: &str) -> Option<std::time::Duration> {
        self.timeouts.get(kind).copied()
    }

    /// The kinds with a handler, sorted.
    pub fn kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = self.by_kind.keys().cloned().collect();
        kinds.sort();
        kinds
    }
}

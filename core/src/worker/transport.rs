//! How a worker reaches the task queue: in-process over a [`PgPool`](sqlx::PgPool), or
//! over the REST API. The worker loop sees only [`Transport`], so both kinds
//! of worker run the very same code.
//!
//! Every call answers `Ok`, [`TransportError::Lost`] (the queue refused the
//! write because the claim is no longer this worker's: HTTP 409/404, the
//! store's `Stale`/`NotFound`), [`TransportError::Transient`] (the queue
//! could not be asked: network, database or server trouble; worth retrying
//! while the local deadline allows), or [`TransportError::Unauthorized`]
//! (the queue refused this worker's credential: HTTP 401/403; no retry can
//! help, and the worker stops).

use super::Report;
use super::handler::{HostDatabase, Job};
use crate::lease::Holder;
use crate::queue::store::TaskError;
use crate::queue::{AttemptOutcome, Task};
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// Why a transport call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The claim is lost: the write was refused (stale token, expired lease,
    /// finished or unknown task). Stop working on it.
    #[error("claim lost: {0}")]
    Lost(String),
    /// The queue could not be reached or failed; the claim may still be held.
    #[error("transient failure: {0}")]
    Transient(String),
    /// The queue refused this worker's credential (HTTP 401 or 403: no
    /// token, or not the one the server expects); it acted on nothing.
    /// Retrying cannot help, so the worker loop stops with
    /// [`Exit::Unauthorized`](super::run::Exit::Unauthorized).
    #[error("credential refused: {0}")]
    Unauthorized(String),
}

/// A claimed task, as much of it as a worker needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// The task.
    pub task_id: i64,
    /// The claim's fencing token; every later write carries it.
    pub token: i64,
    /// Which handler runs it.
    pub kind: String,
    /// The queue it came from.
    pub queue: String,
    /// This attempt's number, from 1.
    pub attempt: i32,
    /// What to do.
    pub task_data: Value,
    /// What is left of the lease by the database clock when it answered
    /// (`None` if the answer did not say; the worker then assumes its TTL).
    pub remaining: Option<Duration>,
    /// The task's own time limit per attempt, if it has one.
    pub timeout: Option<Duration>,
    /// Its workflow parents' outputs, by ref (empty outside a workflow).
    pub parent_outputs: serde_json::Map<String, Value>,
    /// The signals it got while waiting, by name (empty when none).
    pub signals: serde_json::Map<String, Value>,
    /// The signal its last wait timed out waiting for, if it did.
    pub wait_timed_out: Option<String>,
}

/// The claim a write to a claimed task presents: whose it is, and which
/// term of the task's lease (its fencing token).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimRef<'a> {
    /// The processor holding the claim.
    pub worker: &'a Holder,
    /// The task.
    pub task_id: i64,
    /// The claim's fencing token.
    pub token: i64,
    /// The task's kind (a failure report backs off by its kind's policy).
    pub kind: &'a str,
}

/// The operations a worker needs from the queue.
pub trait Transport: Send + Sync + 'static {
    /// Claims the next task for `worker`, or `None` when nothing is claimable.
    fn claim(
        &self,
        worker: &Holder,
    ) -> impl Future<Output = Result<Option<Claim>, TransportError>> + Send;

    /// Extends the claim; answers what is left of the lease.
    fn heartbeat(
        &self,
        claim: ClaimRef<'_>,
    ) -> impl Future<Output = Result<Option<Duration>, TransportError>> + Send;

    /// Completes the task with `output`.
    fn complete(
        &self,
        claim: ClaimRef<'_>,
        output: &Value,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// Reports a failed attempt; the queue retries it after a backoff.
    fn fail(
        &self,
        claim: ClaimRef<'_>,
        error: &str,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// [`Transport::fail`], with the attempt's record ending as `outcome`
    /// (`Failed`, `TimedOut` or `Interrupted`; see
    /// [`store::fail_as`](crate::queue::store::fail_as)). The default
    /// forgets the outcome and calls [`Transport::fail`].
    fn fail_as(
        &self,
        claim: ClaimRef<'_>,
        error: &str,
        outcome: AttemptOutcome,
    ) -> impl Future<Output = Result<(), TransportError>> + Send {
        let _ = outcome;
        self.fail(claim, error)
    }

    /// Puts the task back to pending, due in `delay`, without using up an
    /// attempt (the handler answered [`Done::snooze`](super::handler::Done::snooze)).
    fn snooze(
        &self,
        claim: ClaimRef<'_>,
        delay: Duration,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// Ends the claim with the task waiting for the signal `signal`, at
    /// most `timeout`, without using up an attempt (the handler answered
    /// [`Done::wait_for`](super::handler::Done::wait_for)). The default
    /// refuses: a transport that cannot wait fails the attempt instead.
    fn wait_for(
        &self,
        claim: ClaimRef<'_>,
        signal: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<(), TransportError>> + Send {
        let _ = (claim, signal, timeout);
        std::future::ready(Err(TransportError::Transient(
            "this transport cannot wait for a signal".into(),
        )))
    }

    /// Records what the worker is doing in the `workers` table.
    fn report(
        &self,
        worker: &Holder,
        report: &Report,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// Hands the completion of `claim` with `output` to the transport's
    /// completer and answers true at once: the completer writes it with
    /// others (fenced like [`Transport::complete`], retrying transient
    /// failures until `deadline`) and counts it in `tally`, as done or, when
    /// refused, abandoned. False (the default) for a transport that does
    /// not batch: the worker then calls [`Transport::complete`] and waits.
    fn complete_later(
        &self,
        worker: &Holder,
        claim: &Claim,
        output: Value,
        deadline: Instant,
        tally: &Arc<Tally>,
    ) -> impl Future<Output = bool> + Send {
        let _ = (worker, claim, output, deadline, tally);
        std::future::ready(false)
    }

    /// `worker` stopped trusting `claim` without writing anything (its
    /// local deadline passed, or its liveness was lost): a hook for a
    /// transport that records what its worker believed (the fault
    /// harness's history); the default does nothing.
    fn gave_up(&self, worker: &Holder, claim: &Claim) {
        let _ = (worker, claim);
    }

    /// `worker` stopped gracefully: a transport that claims ahead gives
    /// back what waits for it (the default does nothing).
    fn forget(&self, worker: &Holder) {
        let _ = worker;
    }

    /// The database a handler's fenced transactions run on; `None` (the
    /// default) for a transport that reaches the queue from afar.
    fn database(&self) -> Option<HostDatabase> {
        None
    }
}

/// A JSON object's entries; none for anything else (null: no parents).
fn object(value: Option<Value>) -> serde_json::Map<String, Value> {
    match value {
        Some(Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}

impl Claim {
    /// This claim, as `worker` presents it in a write.
    pub fn by<'a>(&'a self, worker: &'a Holder) -> ClaimRef<'a> {
        ClaimRef {
            worker,
            task_id: self.task_id,
            token: self.token,
            kind: &self.kind,
        }
    }

    /// The claim as the task's [`Job`].
    pub fn job(&self) -> Job {
        Job {
            id: self.task_id,
            kind: self.kind.clone(),
            queue: self.queue.clone(),
            data: self.task_data.clone(),
            attempt: self.attempt,
            fencing_token: self.token,
            parent_outputs: self.parent_outputs.clone(),
            signals: self.signals.clone(),
            wait_timed_out: self.wait_timed_out.clone(),
        }
    }

    /// The claim of `task` as the queue answered it.
    pub fn of(task: Task) -> Self {
        Claim {
            task_id: task.id,
            token: task.fencing_token.unwrap_or_default(),
            kind: task.kind,
            queue: task.queue,
            attempt: task.attempts,
            remaining: ms(task.heartbeat_in_ms),
            task_data: task.task_data,
            timeout: ms(task.timeout_ms.map(i64::from)),
            parent_outputs: object(task.parent_outputs),
            signals: object(task.signals),
            // A claimed task's `wait_signal` is left only by a wait that
            // timed out (a signal clears it).
            wait_timed_out: task.wait_signal,
        }
    }
}

pub(crate) fn ms(ms: Option<i64>) -> Option<Duration> {
    ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

impl From<TaskError> for TransportError {
    fn from(err: TaskError) -> Self {
        match err {
            TaskError::Stale { .. } | TaskError::NotFound(_) => {
                TransportError::Lost(err.to_string())
            }
            other => TransportError::Transient(other.to_string()),
        }
    }
}

/// A worker's count of tasks completed and abandoned, shared with the
/// transport's completer, which counts the completions handed to it once
/// they are written.
#[derive(Debug, Default)]
pub struct Tally {
    /// Tasks completed.
    pub done: AtomicI64,
    /// Tasks given up because the claim was lost.
    pub abandoned: AtomicI64,
}

impl Tally {
    pub(crate) fn done(&self) -> i64 {
        self.done.load(Ordering::Relaxed)
    }

    pub(crate) fn abandoned(&self) -> i64 {
        self.abandoned.load(Ordering::Relaxed)
    }
}

//! How a worker reaches the task queue: in-process over a [`PgPool`], or
//! over the REST API. The worker loop sees only [`Transport`], so both kinds
//! of worker run the very same code.
//!
//! Every call answers `Ok`, [`TransportError::Lost`] (the queue refused the
//! write because the claim is no longer this worker's: HTTP 409/404, the
//! store's `Stale`/`NotFound`), or [`TransportError::Transient`] (the queue
//! could not be asked: network, database or server trouble; worth retrying
//! while the local deadline allows).

pub use super::Report;
use super::WorkerKind;
use super::batch::{Batcher, Batching, Finish, Setup};
use super::handler::{Database, Job};
use super::run::Tally;
use crate::lease::Holder;
use crate::queue::store::{self, RetryPolicy, TaskError};
use crate::queue::{ClaimFilter, Task};
use serde_json::Value;
use sqlx::PgPool;
use std::future::Future;
use std::sync::Arc;
use std::sync::OnceLock;
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
}

/// A claimed task, as much of it as a worker needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// The task.
    pub task_id: i32,
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
        worker: &Holder,
        task_id: i32,
        token: i64,
    ) -> impl Future<Output = Result<Option<Duration>, TransportError>> + Send;

    /// Completes the task with `output`.
    fn complete(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
        output: &Value,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// Reports a failed attempt; the queue retries it after a backoff.
    fn fail(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
        error: &str,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;

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

    /// The database a handler's fenced transactions run on; `None` (the
    /// default) for a transport that reaches the queue from afar.
    fn database(&self) -> Option<Database> {
        None
    }
}

impl Claim {
    /// The claim as the task's [`Job`].
    pub fn job(&self) -> Job {
        Job {
            id: self.task_id,
            kind: self.kind.clone(),
            queue: self.queue.clone(),
            data: self.task_data.clone(),
            attempt: self.attempt,
            fencing_token: self.token,
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
        }
    }
}

pub(crate) fn ms(ms: Option<i64>) -> Option<Duration> {
    ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// The in-process transport: calls [`crate::queue::store`] directly, with
/// its workers' claims, completions, heartbeats and reports batched (see
/// [`super::batch`]). Clones share one batcher; each builder method starts
/// a new one.
#[derive(Clone, Debug)]
pub struct InProcess {
    pool: PgPool,
    ttl: Duration,
    retry: RetryPolicy,
    instance_id: Arc<str>,
    filter: ClaimFilter,
    kind: WorkerKind,
    host_search_path: Arc<str>,
    batching: Batching,
    batcher: Arc<OnceLock<Batcher>>,
}

/// The `search_path` a handler's fenced transaction sees unless told
/// otherwise: PostgreSQL's own default.
pub const DEFAULT_HOST_SEARCH_PATH: &str = "\"$user\", public";

impl InProcess {
    /// Claims and heartbeats ask for `ttl`; reports name `instance_id`.
    /// Claims take every kind in the default queue, and the workers are
    /// recorded as simulated (see [`InProcess::serving`] and
    /// [`InProcess::recorded_as`]).
    pub fn new(pool: PgPool, ttl: Duration, instance_id: Arc<str>) -> Self {
        InProcess {
            pool,
            ttl,
            retry: RetryPolicy::default(),
            instance_id,
            filter: ClaimFilter::default(),
            kind: WorkerKind::Simulated,
            host_search_path: Arc::from(DEFAULT_HOST_SEARCH_PATH),
            batching: Batching::default(),
            batcher: Arc::new(OnceLock::new()),
        }
    }

    /// Claims only what `filter` lets through.
    pub fn serving(mut self, filter: ClaimFilter) -> Self {
        self.filter = filter;
        self.batcher = Arc::new(OnceLock::new());
        self
    }

    /// Records its workers in the `workers` table as `kind`.
    pub fn recorded_as(mut self, kind: WorkerKind) -> Self {
        self.kind = kind;
        self.batcher = Arc::new(OnceLock::new());
        self
    }

    /// Failed attempts are retried after `retry`'s backoff.
    pub fn retrying(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self.batcher = Arc::new(OnceLock::new());
        self
    }

    /// Handlers' fenced transactions see `search_path` (the host's tables).
    pub fn host_search_path(mut self, search_path: &str) -> Self {
        self.host_search_path = Arc::from(search_path);
        self
    }

    /// Batches its workers' writes with `batching` (default: see [`Batching`]).
    pub fn batching(mut self, batching: Batching) -> Self {
        self.batching = batching;
        self.batcher = Arc::new(OnceLock::new());
        self
    }

    /// The batcher shared by this transport's clones, started on first use.
    fn batcher(&self) -> &Batcher {
        self.batcher.get_or_init(|| {
            Batcher::start(Setup {
                pool: self.pool.clone(),
                ttl: self.ttl,
                retry: self.retry,
                filter: self.filter.clone(),
                kind: self.kind,
                instance_id: self.instance_id.clone(),
                batching: self.batching,
            })
        })
    }

    /// Waits until every completion and worker report handed to this
    /// transport so far is written: before a runtime says it stopped.
    pub async fn flush(&self) {
        if let Some(batcher) = self.batcher.get() {
            batcher.flush().await;
        }
    }

    async fn conn(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, TransportError> {
        self.pool
            .acquire()
            .await
            .map_err(|e| TransportError::Transient(format!("database: {e}")))
    }
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

impl Transport for InProcess {
    async fn claim(&self, worker: &Holder) -> Result<Option<Claim>, TransportError> {
        self.batcher().claim(worker).await
    }

    async fn heartbeat(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
    ) -> Result<Option<Duration>, TransportError> {
        self.batcher().heartbeat(worker, task_id, token).await
    }

    async fn complete(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
        output: &Value,
    ) -> Result<(), TransportError> {
        store::complete(
            &mut *self.conn().await?,
            task_id,
            worker,
            token,
            Some(output),
        )
        .await?;
        Ok(())
    }

    async fn fail(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
        error: &str,
    ) -> Result<(), TransportError> {
        store::fail(
            &mut *self.conn().await?,
            task_id,
            worker,
            token,
            error,
            self.retry,
        )
        .await?;
        Ok(())
    }

    async fn complete_later(
        &self,
        worker: &Holder,
        claim: &Claim,
        output: Value,
        deadline: Instant,
        tally: &Arc<Tally>,
    ) -> bool {
        self.batcher()
            .complete(Finish {
                worker: worker.clone(),
                task_id: claim.task_id,
                token: claim.token,
                output,
                deadline,
                tally: tally.clone(),
            })
            .await
    }

    async fn report(&self, worker: &Holder, report: &Report) -> Result<(), TransportError> {
        self.batcher().report(worker, report.clone())
    }

    fn database(&self) -> Option<Database> {
        Some(Database {
            pool: self.pool.clone(),
            search_path: self.host_search_path.clone(),
        })
    }
}

#[cfg(feature = "http-client")]
pub use super::http::Http;

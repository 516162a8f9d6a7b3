//! How a worker reaches the task queue: in-process over a [`PgPool`], or
//! over the REST API. The worker loop sees only [`Transport`], so both kinds
//! of worker run the very same code.
//!
//! Every call answers `Ok`, [`TransportError::Lost`] (the queue refused the
//! write because the claim is no longer this worker's: HTTP 409/404, the
//! store's `Stale`/`NotFound`), or [`TransportError::Transient`] (the queue
//! could not be asked: network, database or server trouble; worth retrying
//! while the local deadline allows).

use super::{WorkerKind, WorkerState};
use crate::lease::Holder;
use crate::queue::store::{self, RetryPolicy, TaskError};
use crate::worker::registry;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

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
    /// What to do.
    pub task_data: Value,
    /// What is left of the lease by the database clock when it answered
    /// (`None` if the answer did not say; the worker then assumes its TTL).
    pub remaining: Option<Duration>,
}

/// What a worker tells the `workers` table about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// What it is doing.
    pub state: WorkerState,
    /// The task it holds, if any.
    pub task_id: Option<i32>,
    /// That claim's fencing token.
    pub fencing_token: Option<i64>,
    /// True when this report follows an accepted claim or heartbeat.
    #[serde(default)]
    pub heartbeat: bool,
    /// Tasks completed so far by this run.
    #[serde(default)]
    pub tasks_done: i32,
    /// Tasks abandoned so far by this run.
    #[serde(default)]
    pub tasks_abandoned: i32,
    /// True for the first report of a run: it replaces whatever an earlier
    /// run under the same id left (even `crashed` or `stopped`).
    #[serde(default)]
    pub fresh: bool,
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
}

pub(crate) fn ms(ms: Option<i64>) -> Option<Duration> {
    ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// The in-process transport: calls [`crate::queue::store`] directly.
#[derive(Clone, Debug)]
pub struct InProcess {
    pool: PgPool,
    ttl: Duration,
    retry: RetryPolicy,
    instance_id: Arc<str>,
}

impl InProcess {
    /// Claims and heartbeats ask for `ttl`; reports name `instance_id`.
    pub fn new(pool: PgPool, ttl: Duration, instance_id: Arc<str>) -> Self {
        InProcess {
            pool,
            ttl,
            retry: RetryPolicy::default(),
            instance_id,
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
        let task = store::claim_next(&mut *self.conn().await?, worker, self.ttl).await?;
        Ok(task.map(|task| Claim {
            task_id: task.id,
            token: task.fencing_token.unwrap_or_default(),
            remaining: ms(task.heartbeat_in_ms),
            task_data: task.task_data,
        }))
    }

    async fn heartbeat(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
    ) -> Result<Option<Duration>, TransportError> {
        let task =
            store::heartbeat(&mut *self.conn().await?, task_id, worker, token, self.ttl).await?;
        Ok(ms(task.heartbeat_in_ms))
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

    async fn report(&self, worker: &Holder, report: &Report) -> Result<(), TransportError> {
        let recorded = registry::record(
            &mut *self.conn().await?,
            worker,
            WorkerKind::Simulated,
            Some(&self.instance_id),
            report,
            self.ttl,
        )
        .await
        .map_err(|e| TransportError::Transient(format!("database: {e}")))?;
        match recorded {
            Some(_) => Ok(()),
            None => Err(TransportError::Lost(format!(
                "the workers table refused the report of {worker}"
            ))),
        }
    }
}

#[cfg(feature = "http-client")]
pub use super::http::Http;

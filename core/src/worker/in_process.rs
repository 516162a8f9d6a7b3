//! The in-process transport: a worker of this process reaching the task
//! queue over a [`PgPool`], its claims, completions, heartbeats and reports
//! batched (see [`super::batch`]).

use super::Report;
use super::WorkerKind;
use super::batch::{Batcher, Batching, Finish, Prefetch, Setup};
use super::handler::HostDatabase;
use super::transport::{Claim, ClaimRef, Tally, Transport, TransportError};
use crate::db::Schema;
use crate::lease::Holder;
use crate::queue::store::{self, RetryPolicies, RetryPolicy};
use crate::queue::{AttemptOutcome, ClaimFilter};
use serde_json::Value;
use sqlx::PgPool;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::time::Instant;

/// The in-process transport: calls [`crate::queue::store`] directly, with
/// its workers' claims, completions, heartbeats and reports batched (see
/// [`super::batch`]). Clones share one batcher; each builder method starts
/// a new one.
#[derive(Clone, Debug)]
pub struct InProcess {
    pool: PgPool,
    /// The pool's schema ([`Schema::of`]).
    schema: Schema,
    ttl: Duration,
    retry: RetryPolicies,
    instance_id: Arc<str>,
    filter: ClaimFilter,
    kind: WorkerKind,
    host_search_path: Arc<str>,
    batching: Batching,
    prefetch: Prefetch,
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
            schema: Schema::of(&pool),
            pool,
            ttl,
            retry: RetryPolicies::default(),
            instance_id,
            filter: ClaimFilter::default(),
            kind: WorkerKind::Simulated,
            host_search_path: Arc::from(DEFAULT_HOST_SEARCH_PATH),
            batching: Batching::default(),
            prefetch: Prefetch::default(),
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

    /// Failed attempts of kinds without a policy of their own are retried
    /// as `retry` says (default: [`RetryPolicy::default`]).
    pub fn retrying(mut self, retry: RetryPolicy) -> Self {
        self.retry = self.retry.with_default(retry);
        self.batcher = Arc::new(OnceLock::new());
        self
    }

    /// Failed attempts of each kind are retried as `retry` says.
    pub fn retrying_by_kind(mut self, retry: RetryPolicies) -> Self {
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

    /// Claims ahead of its free workers into their local queues as
    /// `prefetch` says (default: [`Prefetch::default`], off; see
    /// [`super::batch`]).
    pub fn prefetch(mut self, prefetch: Prefetch) -> Self {
        self.prefetch = prefetch;
        self.batcher = Arc::new(OnceLock::new());
        self
    }

    /// Gives back every claim waiting in its workers' local queues and
    /// claims nothing more ahead: the start of a graceful stop.
    pub async fn give_back_waiting(&self) {
        if let Some(batcher) = self.batcher.get() {
            batcher.give_back_waiting().await;
        }
    }

    /// The batcher shared by this transport's clones, started on first use.
    fn batcher(&self) -> &Batcher {
        self.batcher.get_or_init(|| {
            Batcher::start(Setup {
                pool: self.pool.clone(),
                schema: self.schema.clone(),
                ttl: self.ttl,
                filter: self.filter.clone(),
                kind: self.kind,
                instance_id: self.instance_id.clone(),
                batching: self.batching,
                prefetch: self.prefetch,
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

impl Transport for InProcess {
    async fn claim(&self, worker: &Holder) -> Result<Option<Claim>, TransportError> {
        self.batcher().claim(worker).await
    }

    async fn heartbeat(&self, claim: ClaimRef<'_>) -> Result<Option<Duration>, TransportError> {
        self.batcher()
            .heartbeat(claim.worker, claim.task_id, claim.token)
            .await
    }

    async fn complete(&self, claim: ClaimRef<'_>, output: &Value) -> Result<(), TransportError> {
        store::complete(
            &mut *self.conn().await?,
            &self.schema,
            claim.task_id,
            claim.worker,
            claim.token,
            Some(output),
        )
        .await?;
        Ok(())
    }

    async fn fail(&self, claim: ClaimRef<'_>, error: &str) -> Result<(), TransportError> {
        self.fail_as(claim, error, AttemptOutcome::Failed).await
    }

    async fn fail_as(
        &self,
        claim: ClaimRef<'_>,
        error: &str,
        outcome: AttemptOutcome,
    ) -> Result<(), TransportError> {
        store::fail_as(
            &mut *self.conn().await?,
            &self.schema,
            claim.task_id,
            claim.worker,
            claim.token,
            error,
            self.retry.of(claim.kind),
            outcome,
        )
        .await?;
        Ok(())
    }

    async fn wait_for(
        &self,
        claim: ClaimRef<'_>,
        signal: &str,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        store::wait_for(
            &mut *self.conn().await?,
            &self.schema,
            claim.task_id,
            claim.worker,
            claim.token,
            signal,
            timeout,
        )
        .await?;
        Ok(())
    }

    async fn snooze(&self, claim: ClaimRef<'_>, delay: Duration) -> Result<(), TransportError> {
        store::snooze(
            &mut *self.conn().await?,
            &self.schema,
            claim.task_id,
            claim.worker,
            claim.token,
            delay,
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

    fn forget(&self, worker: &Holder) {
        if let Some(batcher) = self.batcher.get() {
            batcher.forget(worker);
        }
    }

    fn database(&self) -> Option<HostDatabase> {
        Some(HostDatabase {
            pool: self.pool.clone(),
            search_path: self.host_search_path.clone(),
        })
    }
}

/// Gives back the claims waiting in `transports`' local queues each time
/// the liveness session is lost: they were claimed under it, and a
/// rescuer may take them (the give-back is fenced: refused for a claim
/// already taken over). Runs until aborted.
pub async fn give_back_on_loss(
    mut signal: crate::liveness::LivenessSignal,
    transports: Vec<InProcess>,
) {
    loop {
        let session = signal.up().await;
        signal.ended(session).await;
        for transport in &transports {
            transport.give_back_waiting().await;
        }
    }
}

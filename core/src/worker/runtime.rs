//! The worker runtime a service embeds: handlers by task kind, a set of
//! queues each with its own concurrency, and workers that claim, heartbeat
//! and complete on the service's own pool.
//!
//! ```
//! use leasekeeper_core::queue::{TaskStatus, store};
//! use leasekeeper_core::{Done, Job, NewTask, Runtime, TaskContext, enqueue};
//! use serde_json::json;
//! use std::time::Duration;
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! # let pool = leasekeeper_core::db::testing::fresh_pool().await;
//! let runtime = Runtime::builder(pool.clone())
//!     .queue("default", 8)
//!     .handler("resize", |job: Job, _ctx: TaskContext| async move {
//!         let width = job.data["width"].as_i64().ok_or("resize needs a width")?;
//!         Ok(Done::output(json!({ "resized_to": width / 2, "attempt": job.attempt })))
//!     })
//!     .start()
//!     .await?;
//!
//! let mut conn = pool.acquire().await?;
//! let schema = leasekeeper_core::db::Schema::of(&pool);
//! let task = enqueue(&mut conn, &schema, &NewTask::new("resize", json!({ "width": 640 }))).await?;
//! // Woken by the enqueue's NOTIFY, a worker claims, runs and completes it.
//! let done = loop {
//!     let now = store::get(&mut conn, &schema, task.id).await?.expect("the task");
//!     if now.status == TaskStatus::Processed {
//!         break now;
//!     }
//!     tokio::time::sleep(Duration::from_millis(20)).await;
//! };
//! assert_eq!(done.task_output, Some(json!({ "resized_to": 320, "attempt": 1 })));
//! assert!(done.processor.unwrap().starts_with(runtime.id()));
//! runtime.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Each worker is one loop ([`super::run::Worker`]) over the in-process
//! transport, claiming only from its queue and only the kinds the runtime
//! has handlers for, woken by the queue's `NOTIFY` on every enqueue
//! instead of polling. The workers of a queue share one batcher
//! ([`super::batch`]): one claim statement for every worker free at the
//! moment (each task with its own lease and fencing token), completions
//! written in batches while the workers go on to their next task,
//! heartbeats of all due claims in one statement, and the workers' reports
//! every 100 ms. Each worker also keeps a local queue of claims taken
//! ahead ([`RuntimeBuilder::prefetch`], on by default; see
//! [`super::batch`]): a worker
//! finishing a task starts the next at once, and one claim statement
//! claims many. The runtime registers itself as an instance and its
//! workers in the `workers` table (kind `embedded`), so the dashboard
//! shows them.

use super::WorkerKind;
use super::batch::{Batching, Prefetch};
use super::chaos::{Chaos, ChaosSettings};
use super::handler::{Handler, Handlers};
use super::in_process::{DEFAULT_HOST_SEARCH_PATH, InProcess};
use super::run::{Controls, Exit, Worker, WorkerConfig};
use crate::instance::Registration;
use crate::lease::Holder;
use crate::live::LiveHub;
use crate::liveness::{Liveness, LivenessSignal};
use crate::queue::queue_limits::QueueLimits;
use crate::queue::store::{RetryPolicies, RetryPolicy};
use crate::queue::wake::{CancelSignal, WorkSignal};
use crate::queue::{ClaimFilter, DEFAULT_QUEUE, check_name};
use crate::schedule::NewSchedule;
use crate::schedule::runtime::{Scheduler, SchedulerConfig};
use crate::schedule::store::ScheduleError;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Why a runtime did not start.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The configuration cannot work (no handler, a bad queue name, ...).
    #[error("{0}")]
    Config(String),
    /// The database failed while registering.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

/// Configures a [`Runtime`]; see the module documentation.
pub struct RuntimeBuilder {
    pool: PgPool,
    handlers: Handlers,
    queues: Vec<(String, usize)>,
    id: Option<String>,
    address: String,
    worker: WorkerConfig,
    retry: RetryPolicies,
    host_search_path: String,
    shutdown_grace: Duration,
    batching: Batching,
    prefetch: Prefetch,
    schedules: Vec<NewSchedule>,
    limits: Vec<(String, QueueLimits)>,
    scheduler: Option<SchedulerConfig>,
    direct: Option<sqlx::postgres::PgConnectOptions>,
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("handlers", &self.handlers)
            .field("queues", &self.queues)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    /// Registers `handler` for tasks of `kind`.
    pub fn handler(mut self, kind: impl Into<String>, handler: impl Handler) -> Self {
        self.handlers = self.handlers.register(kind, handler);
        self
    }

    /// Attempts of tasks of `kind` that set no timeout of their own
    /// ([`NewTask::timeout`](crate::queue::NewTask::timeout)) run at most
    /// `timeout`: then the handler's context is cancelled and the attempt
    /// fails with "timed out after …". Default: no limit (the lease and its
    /// heartbeats keep a long attempt alive as long as its process is).
    pub fn timeout(mut self, kind: impl Into<String>, timeout: Duration) -> Self {
        self.handlers = self.handlers.timeout(kind, timeout);
        self
    }

    /// Serves `queue` with `concurrency` workers (tasks at once). Without
    /// any, the runtime serves the default queue with 10.
    pub fn queue(mut self, queue: impl Into<String>, concurrency: usize) -> Self {
        self.queues.push((queue.into(), concurrency));
        self
    }

    /// Names the runtime: its instance id, and the prefix of its workers'
    /// ids (`<id>-<queue>-<n>`). Default: `rt-<4 random hex digits>`.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The address the instance row shows (e.g. the service's own
    /// `host:port`); `embedded` by default.
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.address = address.into();
        self
    }

    /// How long each claim's lease lasts, and how often it is heartbeated
    /// (at most a third of it). Default: 15 s and 5 s.
    pub fn lease(mut self, ttl: Duration, heartbeat_interval: Duration) -> Self {
        self.worker = WorkerConfig {
            lost_grace: self.worker.lost_grace,
            ..WorkerConfig::new(ttl, heartbeat_interval)
        };
        self
    }

    /// What follows a failed attempt of a kind without a policy of its own
    /// ([`RuntimeBuilder::retry_kind`]): backoff, jitter, max attempts (see
    /// [`RetryPolicy`]). Default: [`RetryPolicy::default`], 1 s doubling up
    /// to 60 s, no jitter, each task's own max attempts (5 unless its
    /// enqueue said otherwise).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = self.retry.with_default(retry);
        self
    }

    /// What follows a failed attempt of a task of `kind` (a handler's
    /// error or panic, a timeout): its backoff, jitter and max attempts
    /// (see [`RetryPolicy`]), instead of the runtime's
    /// [default](RuntimeBuilder::retry).
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool, send: impl leasekeeper_core::worker::handler::Handler) -> Result<(), Box<dyn std::error::Error>> {
    /// use leasekeeper_core::{RetryPolicy, Runtime};
    /// use std::time::Duration;
    /// let runtime = Runtime::builder(pool)
    ///     .handler("email", send)
    ///     // 10 attempts, 5 s doubling up to 10 min, up to a quarter off at random.
    ///     .retry_kind(
    ///         "email",
    ///         RetryPolicy::exponential(Duration::from_secs(5), Duration::from_secs(600))
    ///             .max_attempts(10)
    ///             .jitter(0.25),
    ///     )
    ///     .start()
    ///     .await?;
    /// # let _ = runtime; Ok(()) }
    /// ```
    pub fn retry_kind(mut self, kind: impl Into<String>, retry: RetryPolicy) -> Self {
        self.retry = self.retry.with(kind, retry);
        self
    }

    /// The `search_path` handlers' fenced transactions see (where the
    /// service's own tables are). Default: `"$user", public`.
    pub fn host_search_path(mut self, search_path: impl Into<String>) -> Self {
        self.host_search_path = search_path.into();
        self
    }

    /// How long [`Runtime::shutdown`] lets the tasks at hand finish before
    /// giving the rest back. Default: 10 s.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// How the workers' claims, completions, heartbeats and reports are
    /// batched (see [`Batching`]; the completer's linger is the one delay
    /// it adds to a task). Default: [`Batching::default`].
    pub fn batching(mut self, batching: Batching) -> Self {
        self.batching = batching;
        self
    }

    /// Lets each worker have up to `per_worker` claims waiting in its
    /// local queue besides the task it runs: a worker that finishes a task
    /// starts the next at once, and one claim statement claims for many
    /// tasks, each with its own lease and fencing token (see
    /// [`super::batch`] for how, and what it costs in fairness between
    /// replicas). How far ahead a claim asks adapts up to `per_worker`
    /// with the depth of the queue. 0 turns it off. Default: see
    /// [`Prefetch::default`].
    pub fn prefetch(mut self, per_worker: usize) -> Self {
        self.prefetch.per_worker = per_worker;
        self
    }

    /// The longest a prefetched claim waits in a local queue before it is
    /// given back (pending again at its old place, its attempt not
    /// counted). Default: see [`Prefetch::default`].
    pub fn prefetch_wait(mut self, max_wait: Duration) -> Self {
        self.prefetch.max_wait = max_wait;
        self
    }

    /// How long a handler may run on after its claim was lost (its answer
    /// is discarded). Default: 1 s.
    pub fn lost_grace(mut self, grace: Duration) -> Self {
        self.worker.lost_grace = grace;
        self
    }

    /// Declares `schedule`: upserted when the runtime starts (safe from many
    /// replicas at once; an unchanged declaration changes nothing, and an
    /// operator's pause stays), then fired by whichever replica holds
    /// `singleton:scheduler` (see [`crate::schedule`]).
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool, report: impl leasekeeper_core::worker::handler::Handler) -> Result<(), Box<dyn std::error::Error>> {
    /// use leasekeeper_core::schedule::NewSchedule;
    /// use leasekeeper_core::Runtime;
    /// let runtime = Runtime::builder(pool)
    ///     .handler("report", report)
    ///     .schedule(NewSchedule::new("nightly-report", "0 2 * * *", "report"))
    ///     .start()
    ///     .await?;
    /// # let _ = runtime; Ok(()) }
    /// ```
    pub fn schedule(mut self, schedule: NewSchedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Declares queue `queue`'s limits (see [`crate::queue::queue_limits`]):
    /// set when the runtime starts (an unchanged declaration changes
    /// nothing and keeps the rate's bucket as it is; a changed one is
    /// audited under this runtime's id), then enforced by every claim of
    /// the queue across the fleet. The last declaration of a queue wins;
    /// an operator's later change stands until a runtime starts with
    /// another declaration.
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool, sync: impl leasekeeper_core::worker::handler::Handler) -> Result<(), Box<dyn std::error::Error>> {
    /// use leasekeeper_core::queue::queue_limits::QueueLimits;
    /// use leasekeeper_core::Runtime;
    /// let runtime = Runtime::builder(pool)
    ///     .queue("sync", 20)
    ///     .handler("sync", sync)
    ///     .queue_limits("sync", QueueLimits { max_started_per_key: Some(2), ..QueueLimits::default() })
    ///     .start()
    ///     .await?;
    /// # let _ = runtime; Ok(()) }
    /// ```
    pub fn queue_limits(mut self, queue: impl Into<String>, limits: QueueLimits) -> Self {
        self.limits.push((queue.into(), limits));
        self
    }

    /// How this runtime's scheduler competes for `singleton:scheduler` and
    /// fires; `None` runs no scheduler here (another replica, or the
    /// dashboard, fires the schedules). Default:
    /// [`SchedulerConfig::default`].
    pub fn scheduler(mut self, config: Option<SchedulerConfig>) -> Self {
        self.scheduler = config;
        self
    }

    /// Behind a transaction pooler ([`crate::Schema::behind_transaction_pooler`]),
    /// a direct connection to the same database, bypassing the pooler, for
    /// the two connections that need a session of their own: the liveness
    /// session (a crash of this process rescued within a second) and
    /// `LISTEN` (idle workers woken at once). Without it, behind such a
    /// pooler, liveness is off (a crashed runtime's claims wait out their
    /// TTL) and idle workers poll. [`start`](RuntimeBuilder::start) refuses
    /// options that reach another database. Unused when the pool is
    /// directly connected.
    pub fn direct(mut self, options: sqlx::postgres::PgConnectOptions) -> Self {
        self.direct = Some(options);
        self
    }

    /// Registers the instance and its workers and starts them, declares
    /// the schedules and starts the scheduler. Refuses a runtime without
    /// handlers, a bad queue name, a concurrency of 0 or over 1,000, a bad
    /// id, a bad retry policy and a bad schedule (naming it and the field).
    pub async fn start(self) -> Result<Runtime, RuntimeError> {
        let kinds = self.handlers.kinds();
        if kinds.is_empty() {
            return Err(RuntimeError::Config(
                "a runtime needs at least one handler".into(),
            ));
        }
        self.retry.check().map_err(RuntimeError::Config)?;
        if self.prefetch.per_worker > 100 {
            return Err(RuntimeError::Config(format!(
                "prefetch must be 0 to 100 claims per worker, got {}",
                self.prefetch.per_worker
            )));
        }
        if self.prefetch.max_wait.is_zero() {
            return Err(RuntimeError::Config(
                "a prefetched claim must be allowed to wait a while (prefetch_wait > 0)".into(),
            ));
        }
        let mut queues = self.queues;
        if queues.is_empty() {
            queues.push((DEFAULT_QUEUE.to_string(), 10));
        }
        for (queue, concurrency) in &queues {
            check_name("queue", queue).map_err(RuntimeError::Config)?;
            if !(1..=1000).contains(concurrency) {
                return Err(RuntimeError::Config(format!(
                    "queue {queue:?}: concurrency must be 1 to 1000, got {concurrency}"
                )));
            }
        }
        // Every (queue, kind) this runtime serves is exported at 0 from the
        // first scrape.
        crate::metrics::register_work(
            queues
                .iter()
                .flat_map(|(q, _)| kinds.iter().map(move |k| (q.as_str(), k.as_str()))),
        );
        let id = self
            .id
            .unwrap_or_else(|| format!("rt-{:04x}", rand::random::<u16>()));
        Holder::parse(format!("{id}-x-1")).map_err(|e| RuntimeError::Config(e.to_string()))?;
        let id: Arc<str> = Arc::from(id);
        for schedule in &self.schedules {
            crate::schedule::store::check(schedule)
                .map_err(|e| RuntimeError::Config(format!("schedule {:?}: {e}", schedule.name)))?;
        }
        for (queue, limits) in &self.limits {
            check_name("queue", queue).map_err(RuntimeError::Config)?;
            limits
                .validate()
                .map_err(|e| RuntimeError::Config(format!("queue {queue:?}: {e}")))?;
        }
        {
            let schema = crate::db::Schema::of(&self.pool);
            let mut conn = self.pool.acquire().await?;
            for (queue, limits) in &self.limits {
                crate::queue::queues::set_limits(&mut conn, &schema, queue, limits, &id)
                    .await
                    .map_err(|e| match e {
                        crate::queue::queues::QueueError::Db(e) => RuntimeError::Db(e),
                        other => RuntimeError::Config(format!("queue {queue:?}: {other}")),
                    })?;
            }
            for schedule in &self.schedules {
                crate::schedule::store::upsert(&mut conn, &schema, schedule, &id)
                    .await
                    .map_err(|e| match e {
                        ScheduleError::Db(e) => RuntimeError::Db(e),
                        other => {
                            RuntimeError::Config(format!("schedule {:?}: {other}", schedule.name))
                        }
                    })?;
            }
        }
        // Every holder name this runtime will use, vouched for by its
        // liveness session before the first claim.
        let mut holders = vec![id.to_string()];
        for (queue, concurrency) in &queues {
            for n in 1..=*concurrency {
                holders.push(format!("{id}-{queue}-{n}"));
            }
        }
        let sessions = crate::db::Sessions::of(&self.pool, self.direct.clone())
            .await
            .map_err(|e| RuntimeError::Config(format!("{e:#}")))?;
        let liveness = match &sessions {
            None => {
                tracing::warn!(runtime = %id,
                    "liveness off behind a transaction pooler without a direct connection \
                     (RuntimeBuilder::direct): a crashed runtime's claims wait out their TTL");
                None
            }
            Some(sessions) => Some(Liveness::start_in(sessions, id.clone(), holders).await?),
        };
        let signal = liveness
            .as_ref()
            .map_or_else(LivenessSignal::none, Liveness::signal);
        let registration = Registration::start(
            self.pool.clone(),
            id.clone(),
            &self.address,
            self.worker.heartbeat_interval,
        )
        .await?;
        let live = LiveHub::start_for(&self.pool, sessions.as_ref());
        let mut workers = Vec::new();
        let mut transports = Vec::new();
        for (queue, concurrency) in &queues {
            let transport = InProcess::new(self.pool.clone(), self.worker.lease_ttl, id.clone())
                .serving(ClaimFilter::queue(queue.clone()).kinds(kinds.clone()))
                .recorded_as(WorkerKind::Embedded)
                .retrying_by_kind(self.retry.clone())
                .host_search_path(&self.host_search_path)
                .batching(self.batching)
                .prefetch(self.prefetch);
            transports.push(transport.clone());
            for n in 1..=*concurrency {
                let name = Holder::parse(format!("{id}-{queue}-{n}"))
                    .map_err(|e| RuntimeError::Config(e.to_string()))?;
                let (worker, controls) = Worker::new(
                    name,
                    transport.clone(),
                    self.handlers.clone(),
                    self.worker.clone(),
                    Chaos::from_os(ChaosSettings::off()),
                );
                let worker = worker
                    .waking_on(WorkSignal::new(&live))
                    .hearing_cancels(CancelSignal::new(&live))
                    .vouched_by(signal.clone());
                workers.push((controls, tokio::spawn(worker.run())));
            }
        }
        // Last: nothing after it can fail, so a runtime that did not start
        // leaves no scheduler behind.
        let scheduler = match self.scheduler {
            Some(config) => Some(Scheduler::spawn(
                self.pool.clone(),
                Holder::parse(id.as_ref()).map_err(|e| RuntimeError::Config(e.to_string()))?,
                config,
            )),
            None => None,
        };
        // Claims waiting in the local queues were made under the session in
        // force: when it is lost, they go back (fenced: refused if a
        // rescuer took them already).
        let give_back = tokio::spawn(super::in_process::give_back_on_loss(
            signal,
            transports.clone(),
        ));
        tracing::info!(runtime = %id, queues = ?queues, kinds = ?kinds, "runtime started");
        Ok(Runtime {
            id,
            scheduler,
            registration,
            liveness,
            give_back,
            live,
            workers,
            transports,
            shutdown_grace: self.shutdown_grace,
        })
    }
}

/// The lease TTL of a runtime's claims unless [`RuntimeBuilder::lease`]
/// says otherwise (heartbeats every third of it).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(15);

/// A running set of workers; see the module documentation. Dropping it
/// without [`Runtime::shutdown`] leaves the workers running until the
/// process ends.
#[derive(Debug)]
pub struct Runtime {
    id: Arc<str>,
    scheduler: Option<Scheduler>,
    registration: Registration,
    liveness: Option<Liveness>,
    give_back: JoinHandle<()>,
    live: LiveHub,
    workers: Vec<(Controls, JoinHandle<Exit>)>,
    transports: Vec<InProcess>,
    shutdown_grace: Duration,
}

impl Runtime {
    /// A runtime on `pool` (a pool of the queue's schema, see
    /// [`crate::db`]); add handlers and queues, then
    /// [`start`](RuntimeBuilder::start) it.
    pub fn builder(pool: PgPool) -> RuntimeBuilder {
        RuntimeBuilder {
            pool,
            handlers: Handlers::new(),
            queues: Vec::new(),
            id: None,
            address: "embedded".to_string(),
            worker: WorkerConfig::new(DEFAULT_LEASE_TTL, DEFAULT_LEASE_TTL / 3),
            retry: RetryPolicies::default(),
            host_search_path: DEFAULT_HOST_SEARCH_PATH.to_string(),
            shutdown_grace: Duration::from_secs(10),
            batching: Batching::default(),
            prefetch: Prefetch::default(),
            schedules: Vec::new(),
            limits: Vec::new(),
            scheduler: Some(SchedulerConfig::default()),
            direct: None,
        }
    }

    /// The runtime's instance id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// How many workers it runs (the sum of its queues' concurrency).
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// Stops gracefully: the workers claim nothing more and finish the
    /// tasks at hand, for up to the [shutdown
    /// grace](RuntimeBuilder::shutdown_grace); a task still running then is
    /// given back (a failed attempt, retried after the backoff, so a
    /// deploy never waits out a lease). Claims waiting in the workers'
    /// local queues ([`RuntimeBuilder::prefetch`]) are given back first,
    /// unstarted and without using an attempt. Then the instance is marked
    /// stopped.
    pub async fn shutdown(self) {
        // The scheduler first: it releases its lease so another replica
        // fires the next tick without waiting out the TTL.
        if let Some(scheduler) = self.scheduler {
            scheduler.shutdown().await;
        }
        for (controls, _) in &self.workers {
            controls.drain();
        }
        // What waits in the local queues will not be started here: back to
        // the queue at once, for other replicas, without using an attempt.
        for transport in &self.transports {
            transport.give_back_waiting().await;
        }
        let deadline = tokio::time::Instant::now() + self.shutdown_grace;
        for (controls, mut task) in self.workers {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                controls.stop();
                let _ = task.await;
            }
        }
        // The completions handed over and the workers' last reports.
        for transport in &self.transports {
            transport.flush().await;
        }
        self.live.shutdown();
        if let Err(e) = self.registration.shutdown().await {
            tracing::warn!(runtime = %self.id, error = %e, "could not mark the instance stopped");
        }
        self.give_back.abort();
        // Last: nothing is held any more, and a registration left behind
        // would be judged (harmlessly) as a crash.
        if let Some(liveness) = self.liveness {
            liveness.shutdown().await;
        }
    }
}

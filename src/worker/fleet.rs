//! The simulated workers inside one instance: spawn, pause, kill, list,
//! and stop them all on shutdown.
//!
//! Each runs the worker loop over the in-process transport as its own tokio
//! task, named `{instance_id}-w{n}`. A kill aborts that task on the spot:
//! nothing is completed, released or failed, so the task's lease must run
//! out before another worker takes it over (the fleet only records the
//! crash in the `workers` table, as an observer would). A chaos crash is the
//! same, except that the fleet starts a replacement after a delay, as a
//! process supervisor would; an operator's kill is not replaced.

use crate::settings::Settings;
use leasekeeper_core::db::Schema;
use leasekeeper_core::lease::Holder;
use leasekeeper_core::lease::store::record_operator_action;
use leasekeeper_core::live::LiveHub;
use leasekeeper_core::liveness::{Liveness, LivenessSignal, Voucher};
use leasekeeper_core::queue::ClaimFilter;
use leasekeeper_core::queue::wake::{CancelSignal, WorkSignal};
use leasekeeper_core::worker::Report;
use leasekeeper_core::worker::chaos::{Chaos, ChaosSettings};
use leasekeeper_core::worker::in_process::{InProcess, give_back_on_loss};
use leasekeeper_core::worker::registry;
use leasekeeper_core::worker::run::{Controls, Exit, Worker, WorkerConfig};
use leasekeeper_core::worker::simulated;
use leasekeeper_core::worker::{WorkerInfo, WorkerKind, WorkerState};
use sqlx::{Connection, PgPool};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How the fleet runs its workers.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetConfig {
    /// Timing of every worker.
    pub worker: WorkerConfig,
    /// Chaos of every worker.
    pub chaos: ChaosSettings,
    /// Start a replacement this long after a chaos crash (`None`: never).
    pub respawn_after: Option<Duration>,
    /// Seed for the workers' chaos (worker `n` uses `seed + n`); `None`
    /// seeds each from the operating system.
    pub seed: Option<u64>,
    /// How far the workers claim ahead (see
    /// [`Prefetch`](leasekeeper_core::worker::batch::Prefetch)).
    pub prefetch: leasekeeper_core::worker::batch::Prefetch,
}

impl FleetConfig {
    /// The program's settings; crashed workers are replaced after one TTL.
    pub fn from_settings(settings: &Settings) -> Self {
        FleetConfig {
            worker: settings.worker_config(),
            chaos: settings.chaos_settings(),
            respawn_after: Some(settings.lease_ttl),
            seed: None,
            prefetch: leasekeeper_core::worker::batch::Prefetch::per_worker(
                settings.prefetch as usize,
            )
            .max_wait(settings.prefetch_wait),
        }
    }
}

/// Why a fleet operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// No running simulated worker of this instance has that id.
    #[error(
        "worker {id} is not a running simulated worker of this instance ({instance_id}); \
         only the instance that runs a worker can pause or kill it"
    )]
    NotHere {
        /// The worker asked for.
        id: String,
        /// This instance.
        instance_id: String,
    },
    /// The fleet is shutting down.
    #[error("the workers of this instance are shutting down")]
    ShuttingDown,
    /// A worker id could not be formed (instance id too long).
    #[error("invalid worker id: {0}")]
    BadId(String),
    /// The database failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// This instance's liveness session is down (or it has none): it
    /// cannot vouch for a worker process's stream now.
    #[error(
        "this instance's liveness session is not registered now; \
         try again in a moment, or on another instance"
    )]
    NoSession,
}

/// A worker process's open session stream (see [`Fleet::open_stream`]).
/// Dropped (the connection closed), the worker is taken for dead and its
/// live claims are ended (after a graceful exit it holds none), unless a
/// newer stream of the same worker was opened on this instance since (a
/// reconnection: the newer stream's adoption already ended what the old
/// one held).
#[derive(Debug)]
pub struct StreamGuard {
    fleet: Fleet,
    holder: String,
    n: u64,
    /// The instance's liveness, and the term the stream was vouched in;
    /// `None` on an instance without liveness (its drop ends nothing).
    term: Option<(LivenessSignal, u64)>,
}

impl StreamGuard {
    /// Resolves when this instance's liveness session that vouched for the
    /// stream is lost (while its server runs, so others may be ending the
    /// worker's claims): the stream must end then, so that the worker
    /// stops trusting its claims at once, as this instance's own workers
    /// do. Never without liveness.
    pub async fn ended(&mut self) {
        match &mut self.term {
            Some((signal, term)) => signal.ended(*term).await,
            None => std::future::pending().await,
        }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.term.is_none() {
            return;
        }
        {
            let mut streams = self.fleet.streams();
            if streams.get(&self.holder) != Some(&self.n) {
                return;
            }
            streams.remove(&self.holder);
        }
        let fleet = self.fleet.clone();
        let holder = std::mem::take(&mut self.holder);
        tracing::info!(worker = %holder,
            "the session stream of a worker process closed: its live claims, if any, are ended now");
        tokio::spawn(async move { fleet.disown(&holder, true).await });
    }
}

/// A worker named and recorded, not yet running.
struct Prepared {
    n: u64,
    id: Holder,
    info: WorkerInfo,
}

/// One running worker.
struct Slot {
    controls: Controls,
    handle: JoinHandle<()>,
}

/// How long starting a worker waits for the liveness session to vouch
/// for it.
const VOUCH_WITHIN: Duration = Duration::from_secs(2);

struct Inner {
    pool: PgPool,
    /// The pool's schema.
    schema: Schema,
    live: Option<LiveHub>,
    instance_id: Arc<str>,
    config: FleetConfig,
    next: AtomicU64,
    slots: Mutex<BTreeMap<String, Slot>>,
    shutdown: CancellationToken,
    /// One transport for every worker, so their claims, completions,
    /// heartbeats and reports are batched together.
    transport: InProcess,
    /// The instance's liveness session, which vouches for each worker
    /// before it runs (see [`Fleet::vouched_by`]).
    liveness: Option<(LivenessSignal, Voucher)>,
    /// The session streams of worker processes open to this instance: the
    /// newest stream's number per worker (see [`Fleet::open_stream`]).
    streams: Mutex<HashMap<String, u64>>,
    /// The number of the next session stream.
    next_stream: AtomicU64,
}

/// The simulated workers of this instance. Cheap to clone.
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("instance_id", &self.inner.instance_id)
            .field("workers", &self.running())
            .finish()
    }
}

impl Fleet {
    /// An empty fleet for instance `instance_id`.
    /// Its workers wake on new work announced through `live` (when given)
    /// rather than only at their next poll, and stop the task at hand
    /// within a second of an operator cancelling it.
    pub fn new(
        pool: PgPool,
        instance_id: Arc<str>,
        config: FleetConfig,
        live: Option<LiveHub>,
    ) -> Self {
        let kinds = simulated::handlers(&config.chaos).kinds();
        let serving = ClaimFilter::default().kinds(kinds.clone());
        // What the fleet works on is exported at 0 from the first scrape.
        leasekeeper_core::metrics::register_work(
            kinds.iter().map(|k| (serving.queue.as_str(), k.as_str())),
        );
        let transport = InProcess::new(pool.clone(), config.worker.lease_ttl, instance_id.clone())
            .serving(serving)
            .prefetch(config.prefetch);
        Fleet {
            inner: Arc::new(Inner {
                schema: Schema::of(&pool),
                pool,
                live,
                instance_id,
                config,
                transport,
                next: AtomicU64::new(1),
                slots: Mutex::new(BTreeMap::new()),
                shutdown: CancellationToken::new(),
                liveness: None,
                streams: Mutex::new(HashMap::new()),
                next_stream: AtomicU64::new(1),
            }),
        }
    }

    /// Each worker is vouched for by `liveness` (the instance's session,
    /// see [`leasekeeper_core::liveness`]) before it runs, claims only
    /// while that session is in force, and gives its claim up the moment
    /// it is lost: a crash of this process is rescued within a second.
    /// Call it before the fleet is shared.
    pub fn vouched_by(mut self, liveness: &Liveness) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.liveness = Some((liveness.signal(), liveness.voucher()));
            // Claims waiting in the local queue go back when it is lost.
            tokio::spawn(give_back_on_loss(
                liveness.signal(),
                vec![inner.transport.clone()],
            ));
        }
        self
    }

    /// This fleet's instance.
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Slot>> {
        // A panic while holding the lock cannot leave the map half-changed
        // (every change is one insert or remove), so a poisoned lock is safe.
        self.inner
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts one more worker and answers its row in the `workers` table.
    pub async fn spawn(&self) -> Result<WorkerInfo, FleetError> {
        let prepared = self.prepare(None).await?;
        self.start(prepared)
    }

    /// [`spawn`](Self::spawn) on behalf of operator `by`: the audit row
    /// (`spawn_worker`) is written in the transaction that records the
    /// worker's row, so neither exists without the other.
    pub async fn spawn_by(&self, by: &str) -> Result<WorkerInfo, FleetError> {
        let prepared = self.prepare(Some(by)).await?;
        let id = prepared.id.as_str().to_string();
        match self.start(prepared) {
            Ok(info) => Ok(info),
            Err(e) => {
                // Shutting down between the two: the recorded worker never
                // runs; say so on its row.
                let _ = self.mark(&id, WorkerState::Stopped).await;
                Err(e)
            }
        }
    }

    /// Names the next worker and records it (with `by`'s audit row, in the
    /// same transaction, when an operator asked); the row exists before the
    /// worker runs, so the caller can show it at once.
    async fn prepare(&self, by: Option<&str>) -> Result<Prepared, FleetError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(FleetError::ShuttingDown);
        }
        let n = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}-w{n}", self.inner.instance_id);
        let id = Holder::parse(name.clone()).map_err(|e| FleetError::BadId(e.to_string()))?;
        let config = &self.inner.config;
        let report = Report {
            state: WorkerState::Idle,
            task_id: None,
            fencing_token: None,
            heartbeat: false,
            tasks_done: 0,
            tasks_abandoned: 0,
            fresh: true,
        };
        let mut conn = self.inner.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let info = registry::record(
            &mut tx,
            &self.inner.schema,
            &id,
            WorkerKind::Simulated,
            Some(&self.inner.instance_id),
            &report,
            config.worker.lease_ttl,
        )
        .await?
        .ok_or_else(|| FleetError::BadId(format!("{name} is taken by an http worker")))?;
        if let Some(by) = by {
            record_operator_action(
                &mut tx,
                &self.inner.schema,
                &format!("worker:{name}"),
                by,
                "spawn_worker",
                serde_json::json!({}),
            )
            .await?;
        }
        tx.commit().await?;
        if let Some((_, voucher)) = &self.inner.liveness
            && !voucher.vouch(&name, VOUCH_WITHIN).await
        {
            tracing::warn!(worker = %name,
                "the liveness session is down: until it is back, this worker's claims wait out their TTL if the process dies");
        }
        Ok(Prepared { n, id, info })
    }

    /// Runs a prepared worker as a task of its own. Not async on purpose:
    /// the worker's task may start a replacement, and a future that awaited
    /// its own kind of task could not be proven `Send`.
    fn start(&self, prepared: Prepared) -> Result<WorkerInfo, FleetError> {
        let Prepared { n, id, info } = prepared;
        let config = &self.inner.config;
        let chaos = match config.seed {
            Some(seed) => Chaos::seeded(config.chaos.clone(), seed.wrapping_add(n)),
            None => Chaos::from_os(config.chaos.clone()),
        };
        let handlers = simulated::handlers(&config.chaos);
        let transport = self.inner.transport.clone();
        let name = id.as_str().to_string();
        let (worker, controls) = Worker::new(id, transport, handlers, config.worker.clone(), chaos);
        let worker = match &self.inner.live {
            Some(live) => worker
                .waking_on(WorkSignal::new(live))
                .hearing_cancels(CancelSignal::new(live)),
            None => worker,
        };
        let worker = match &self.inner.liveness {
            Some((signal, _)) => worker.vouched_by(signal.clone()),
            None => worker,
        };
        let mut slots = self.slots();
        // Checked under the lock: shutdown drains the map under it.
        if self.inner.shutdown.is_cancelled() {
            return Err(FleetError::ShuttingDown);
        }
        let fleet = self.clone();
        let task_name = name.clone();
        let handle = tokio::spawn(async move {
            let exit = worker.run().await;
            fleet.exited(&task_name, exit).await;
        });
        slots.insert(name, Slot { controls, handle });
        Ok(info)
    }

    /// Bookkeeping after a worker's loop returned by itself.
    async fn exited(&self, name: &str, exit: Exit) {
        self.slots().remove(name);
        if exit != Exit::Crashed {
            // It gave its claims back or completed them: nothing to end.
            self.disown(name, false).await;
            return;
        }
        if let Err(e) = self.mark(name, WorkerState::Crashed).await {
            tracing::warn!(worker = name, error = %e, "cannot record the crash");
        }
        // A crashed worker is certainly dead: its claims go now, not at
        // the end of their TTL, as a crashed process's would.
        self.disown(name, true).await;
        let Some(delay) = self.inner.config.respawn_after else {
            return;
        };
        tokio::select! {
            () = self.inner.shutdown.cancelled() => {}
            () = tokio::time::sleep(delay) => {
                match self.prepare(None).await.and_then(|prepared| self.start(prepared)) {
                    Ok(info) => tracing::info!(crashed = name, replacement = info.id, "replaced a crashed worker"),
                    Err(e) => tracing::warn!(crashed = name, error = %e, "cannot replace a crashed worker"),
                }
            }
        }
    }

    /// Stops vouching for worker `name`; with `end` (it was killed or
    /// crashed), its live claims are ended now, so an idle worker takes
    /// them over within a second (see [`Voucher::disown`]). Without a
    /// liveness session, or with the session down, its claims wait out
    /// their TTL, as before.
    async fn disown(&self, name: &str, end: bool) {
        if let Some((_, voucher)) = &self.inner.liveness
            && !voucher.disown(name, end, VOUCH_WITHIN).await
            && end
        {
            tracing::warn!(
                worker = name,
                "the liveness session is down: this worker's claims wait out their TTL"
            );
        }
    }

    async fn mark(&self, name: &str, state: WorkerState) -> Result<(), sqlx::Error> {
        registry::mark(
            &mut *self.inner.pool.acquire().await?,
            &self.inner.schema,
            name,
            state,
        )
        .await
    }

    fn not_here(&self, id: &str) -> FleetError {
        FleetError::NotHere {
            id: id.to_string(),
            instance_id: self.inner.instance_id.to_string(),
        }
    }

    /// Freezes worker `id` for the configured pause (TTL + 2 s): no ticks,
    /// no heartbeats. It then tries to complete its task, which the fencing
    /// token refuses if another worker took the task over meanwhile.
    pub fn pause(&self, id: &str) -> Result<Duration, FleetError> {
        let duration = self.inner.config.worker.pause_for;
        let slots = self.slots();
        let slot = slots.get(id).ok_or_else(|| self.not_here(id))?;
        if slot.controls.pause(duration) {
            Ok(duration)
        } else {
            Err(self.not_here(id))
        }
    }

    /// Kills worker `id` abruptly: its task is aborted mid-step, nothing is
    /// completed or released, and it is recorded as crashed. Its claims
    /// are then ended by the instance's liveness session, as a crashed
    /// process's would be: another worker takes them over within a second.
    pub async fn kill(&self, id: &str) -> Result<(), FleetError> {
        self.abort(id).await?;
        self.mark(id, WorkerState::Crashed).await?;
        self.disown(id, true).await;
        Ok(())
    }

    /// [`kill`](Self::kill) on behalf of operator `by`, in one transaction:
    /// the audit row (`kill_worker`) is written first, so a kill that
    /// cannot be audited does not happen; then the worker dies, its row
    /// says crashed, and the failover stopwatch starts on the leases it
    /// left live; all commit together.
    pub async fn kill_by(&self, id: &str, by: &str) -> Result<(), FleetError> {
        let mut conn = self.inner.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        record_operator_action(
            &mut tx,
            &self.inner.schema,
            &format!("worker:{id}"),
            by,
            "kill_worker",
            serde_json::json!({}),
        )
        .await?;
        self.abort(id).await?;
        registry::mark(&mut tx, &self.inner.schema, id, WorkerState::Crashed).await?;
        // Its leases stay live (a kill releases nothing): the stopwatch
        // runs until another worker takes them over.
        leasekeeper_core::lease::stopwatch::record_kill(
            &mut tx,
            &self.inner.schema,
            "worker",
            id,
            &[id.to_string()],
        )
        .await?;
        tx.commit().await?;
        // Dead for certain: its claims end now and the stopwatch stops at
        // the takeover, within a second; a paused worker still waits out
        // its TTL.
        self.disown(id, true).await;
        Ok(())
    }

    /// Stops worker `id`'s task dead, and waits until it is gone.
    async fn abort(&self, id: &str) -> Result<(), FleetError> {
        let slot = self.slots().remove(id).ok_or_else(|| self.not_here(id))?;
        slot.handle.abort();
        // Wait until it is really gone, so nothing it sends lands later;
        // what it had reported before (its claim, batched by the shared
        // transport) is written first, so its row says what it held.
        let _ = slot.handle.await;
        self.inner.transport.flush().await;
        tracing::warn!(worker = id, "killed (no completion, no release)");
        Ok(())
    }

    /// Opens the session stream of worker process `holder`: this
    /// instance's liveness session vouches for it as a new term (its
    /// earlier claims, made through an earlier stream here or elsewhere,
    /// are ended: it gave them up when that stream broke), until the
    /// answered [`StreamGuard`] is dropped. Dropped (the connection
    /// closed: the process died, or its network did), the worker's live
    /// claims are ended at once,
    /// so an idle worker takes them over within a second. On an instance
    /// without liveness the stream opens but promises nothing (the TTL
    /// rules); with its liveness session down, `Err(NoSession)` (the worker
    /// tries again).
    pub async fn open_stream(&self, holder: &Holder) -> Result<StreamGuard, FleetError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(FleetError::ShuttingDown);
        }
        let name = holder.as_str().to_string();
        let Some((signal, voucher)) = &self.inner.liveness else {
            // No liveness here at all (behind a transaction pooler, or a
            // test's instance): the stream promises nothing, the TTL rules.
            return Ok(StreamGuard {
                fleet: self.clone(),
                holder: name,
                n: 0,
                term: None,
            });
        };
        let n = self.inner.next_stream.fetch_add(1, Ordering::Relaxed);
        self.streams().insert(name.clone(), n);
        // The term is read before the adoption: if the session is lost in
        // between, the stream ends at once and the worker tries again.
        let term = signal.session();
        if term.is_none() || !voucher.adopt(&name, VOUCH_WITHIN).await {
            self.streams().remove(&name);
            return Err(FleetError::NoSession);
        }
        Ok(StreamGuard {
            fleet: self.clone(),
            holder: name,
            n,
            term: term.map(|t| (signal.clone(), t)),
        })
    }

    fn streams(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        // Every change is one insert or remove: a poisoned map is whole.
        self.inner
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The ids of the workers running now, in id order.
    pub fn running(&self) -> Vec<String> {
        self.slots().keys().cloned().collect()
    }

    /// Stops every worker gracefully (each gives back its task) and waits
    /// up to `grace` for them; those still running then are aborted.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.shutdown.cancel();
        let slots: Vec<(String, Slot)> = std::mem::take(&mut *self.slots()).into_iter().collect();
        for (_, slot) in &slots {
            slot.controls.stop();
        }
        for (name, slot) in slots {
            let abort = slot.handle.abort_handle();
            if tokio::time::timeout(grace, slot.handle).await.is_err() {
                abort.abort();
                tracing::warn!(worker = name, "did not stop in time; aborted");
                if let Err(e) = self.mark(&name, WorkerState::Stopped).await {
                    tracing::warn!(worker = name, error = %e, "cannot record the stop");
                }
            }
        }
        // Whatever still waits in a local queue goes back to the queue.
        self.inner.transport.give_back_waiting().await;
        // The completions handed over and the workers' last reports.
        self.inner.transport.flush().await;
    }
}

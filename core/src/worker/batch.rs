//! Batching for the in-process transport: what lets a runtime's workers
//! share a handful of statements instead of each making its own.
//!
//! One `Batcher` serves every worker of one transport (a runtime's queue,
//! an instance's simulated fleet) with four background loops, each on a
//! connection of the pool only while it writes:
//!
//! - the **producer** gathers the claims of every worker that is free at
//!   that moment and makes one statement of them
//!   ([`store::claim_for`]): each task claimed gets its own lease and
//!   fencing token, held by the worker it is handed to. Free workers only:
//!   nothing is fetched ahead of a worker that could run it, so no lease
//!   ticks away in a local buffer;
//! - the **completer** writes completions in batches
//!   ([`store::complete_each`]): it waits up to [`Batching::linger`] after
//!   the first for more, or until [`Batching::max`] are waiting. Each is
//!   still fenced on its own, and each refused one is recorded. A worker
//!   hands its completion over and claims its next task at once;
//! - the **heartbeater** renews the claims of every worker whose heartbeat
//!   is due at that moment in one statement ([`store::heartbeat_each`]);
//! - the **reporter** writes what the workers are doing to the `workers`
//!   table every [`Batching::report_every`], the newest report of each
//!   worker in one statement ([`registry::record_each`]).
//!
//! Claims and heartbeats are batched by arrival (whatever is waiting when
//! the previous statement returns goes in the next), so a lone claim or
//! heartbeat waits for nothing. The completer's linger is the one delay
//! batching adds to a task (the benchmark measures it: `fleet_single_task`
//! keys of `leasekeeper-tools bench`).

use super::registry;
use super::transport::Tally;
use super::transport::{Claim, TransportError, ms};
use super::{Report, WorkerKind};
use crate::db::Schema;
use crate::lease::Holder;
use crate::queue::ClaimFilter;
use crate::queue::store::{self, Completion, MAX_BATCH, RetryPolicies};
use serde_json::Value;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// How the in-process transport batches its workers' writes; see the
/// module documentation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Batching {
    /// How long the completer waits after a completion for more before it
    /// writes (unless `max` are waiting). Default: 2 ms.
    pub linger: Duration,
    /// The most completions or heartbeats one statement writes. Default: 100.
    pub max: usize,
    /// How often the workers' reports are written. Default: 100 ms.
    pub report_every: Duration,
}

impl Default for Batching {
    fn default() -> Self {
        Batching {
            linger: Duration::from_millis(2),
            max: 100,
            report_every: Duration::from_millis(100),
        }
    }
}

/// What the loops need to write.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) pool: PgPool,
    /// The pool's schema.
    pub(crate) schema: Schema,
    pub(crate) ttl: Duration,
    pub(crate) retry: RetryPolicies,
    pub(crate) filter: ClaimFilter,
    pub(crate) kind: WorkerKind,
    pub(crate) instance_id: Arc<str>,
    pub(crate) batching: Batching,
}

type Answer<T> = oneshot::Sender<Result<T, TransportError>>;

/// A free worker asking for a task.
struct Want {
    worker: Holder,
    reply: Answer<Option<Claim>>,
}

/// A heartbeat of one claim.
struct Beat {
    worker: Holder,
    task_id: i64,
    token: i64,
    reply: Answer<Option<Duration>>,
}

/// A completion handed over by a worker.
pub(crate) struct Finish {
    pub(crate) worker: Holder,
    pub(crate) task_id: i64,
    pub(crate) token: i64,
    pub(crate) output: Value,
    /// The worker's local deadline for the claim: transient failures are
    /// retried until it passes.
    pub(crate) deadline: Instant,
    /// Where the worker counts its completed and abandoned tasks.
    pub(crate) tally: Arc<Tally>,
}

enum ToCompleter {
    Finish(Finish),
    Flush(oneshot::Sender<()>),
}

enum ToReporter {
    Report(Holder, Report),
    Flush(oneshot::Sender<()>),
}

/// The handles of one transport's four loops (see the module
/// documentation). The loops end, after writing what they were given,
/// when the last handle is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Batcher {
    claims: mpsc::UnboundedSender<Want>,
    beats: mpsc::UnboundedSender<Beat>,
    completions: mpsc::Sender<ToCompleter>,
    reports: mpsc::UnboundedSender<ToReporter>,
}

fn gone() -> TransportError {
    TransportError::Transient("the transport's batching has stopped".into())
}

impl Batcher {
    /// Starts the loops (on the current tokio runtime).
    pub(crate) fn start(setup: Setup) -> Self {
        let setup = Arc::new(setup);
        let (claims, claims_rx) = mpsc::unbounded_channel();
        let (beats, beats_rx) = mpsc::unbounded_channel();
        let (completions, completions_rx) = mpsc::channel(setup.batching.max.clamp(1, MAX_BATCH));
        let (reports, reports_rx) = mpsc::unbounded_channel();
        tokio::spawn(produce(setup.clone(), claims_rx));
        tokio::spawn(heartbeat(setup.clone(), beats_rx));
        tokio::spawn(complete(setup.clone(), completions_rx));
        tokio::spawn(report(setup, reports_rx));
        Batcher {
            claims,
            beats,
            completions,
            reports,
        }
    }

    /// Claims a task for `worker` with the other free workers' claims.
    pub(crate) async fn claim(&self, worker: &Holder) -> Result<Option<Claim>, TransportError> {
        let (reply, answer) = oneshot::channel();
        self.claims
            .send(Want {
                worker: worker.clone(),
                reply,
            })
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// Heartbeats a claim with the other heartbeats due.
    pub(crate) async fn heartbeat(
        &self,
        worker: &Holder,
        task_id: i64,
        token: i64,
    ) -> Result<Option<Duration>, TransportError> {
        let (reply, answer) = oneshot::channel();
        self.beats
            .send(Beat {
                worker: worker.clone(),
                task_id,
                token,
                reply,
            })
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// Hands a completion to the completer; waits only while it has
    /// [`Batching::max`] completions waiting already (back-pressure).
    /// False when the completer is gone.
    pub(crate) async fn complete(&self, finish: Finish) -> bool {
        self.completions
            .send(ToCompleter::Finish(finish))
            .await
            .is_ok()
    }

    /// Queues `report` of `worker` for the reporter's next write.
    pub(crate) fn report(&self, worker: &Holder, report: Report) -> Result<(), TransportError> {
        self.reports
            .send(ToReporter::Report(worker.clone(), report))
            .map_err(|_| gone())
    }

    /// Waits until every completion and report handed over so far is
    /// written (or given up).
    pub(crate) async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self
            .completions
            .send(ToCompleter::Flush(done))
            .await
            .is_ok()
        {
            let _ = written.await;
        }
        let (done, written) = oneshot::channel();
        if self.reports.send(ToReporter::Flush(done)).is_ok() {
            let _ = written.await;
        }
    }
}

/// Takes whatever else is waiting in `rx` right now, up to `max` in all.
fn drain<T>(rx: &mut mpsc::UnboundedReceiver<T>, batch: &mut Vec<T>, max: usize) {
    while batch.len() < max {
        match rx.try_recv() {
            Ok(item) => batch.push(item),
            Err(_) => break,
        }
    }
}

/// How long a loop keeps its connection after its last statement: while
/// busy it keeps one (no round trip to check a pooled connection before
/// every statement); idle, it gives it back to the pool.
const HOLD_IDLE: Duration = Duration::from_millis(100);

/// A loop's connection, taken from the pool when needed and kept while
/// the loop is busy.
#[derive(Default)]
struct Held(Option<sqlx::pool::PoolConnection<sqlx::Postgres>>);

/// A channel a loop waits on.
trait Inbox<T> {
    fn recv(&mut self) -> impl std::future::Future<Output = Option<T>> + Send;
}

impl<T: Send> Inbox<T> for mpsc::UnboundedReceiver<T> {
    fn recv(&mut self) -> impl std::future::Future<Output = Option<T>> + Send {
        mpsc::UnboundedReceiver::recv(self)
    }
}

impl<T: Send> Inbox<T> for mpsc::Receiver<T> {
    fn recv(&mut self) -> impl std::future::Future<Output = Option<T>> + Send {
        mpsc::Receiver::recv(self)
    }
}

impl Held {
    /// The next message; the connection goes back to the pool if none
    /// comes within [`HOLD_IDLE`].
    async fn next<T>(&mut self, rx: &mut impl Inbox<T>) -> Option<T> {
        if self.0.is_some() {
            match tokio::time::timeout(HOLD_IDLE, rx.recv()).await {
                Ok(msg) => return msg,
                Err(_) => self.0 = None,
            }
        }
        rx.recv().await
    }

    async fn conn(&mut self, setup: &Setup) -> Result<&mut sqlx::PgConnection, TransportError> {
        if self.0.is_none() {
            let conn = setup
                .pool
                .acquire()
                .await
                .map_err(|e| TransportError::Transient(format!("database: {e}")))?;
            self.0 = Some(conn);
        }
        Ok(self.0.as_deref_mut().expect("just set"))
    }

    /// After a failed statement the connection may be broken: take a
    /// fresh one (checked by the pool) next time.
    fn failed(&mut self, e: &TransportError) {
        if matches!(e, TransportError::Transient(_)) {
            self.0 = None;
        }
    }
}

/// The producer: one claim statement for every worker free at the moment.
async fn produce(setup: Arc<Setup>, mut rx: mpsc::UnboundedReceiver<Want>) {
    let mut held = Held::default();
    while let Some(first) = held.next(&mut rx).await {
        let mut wants = vec![first];
        drain(&mut rx, &mut wants, MAX_BATCH);
        // A worker whose loop ended while it waited wants nothing now; and
        // one name twice (a worker restarted under its id) is served once.
        wants.retain(|w| !w.reply.is_closed());
        let mut seen = std::collections::HashSet::new();
        wants.reverse();
        wants.retain(|w| seen.insert(w.worker.clone()));
        if !wants.is_empty() {
            serve(&setup, &mut held, wants).await;
        }
    }
}

async fn serve(setup: &Setup, held: &mut Held, wants: Vec<Want>) {
    let holders: Vec<Holder> = wants.iter().map(|w| w.worker.clone()).collect();
    let claimed = async {
        let conn = held.conn(setup).await?;
        Ok::<_, TransportError>(
            store::claim_for(conn, &setup.schema, &holders, setup.ttl, &setup.filter).await?,
        )
    }
    .await;
    let claimed = match claimed {
        Ok(c) => c,
        Err(e) => {
            held.failed(&e);
            for want in wants {
                let _ = want.reply.send(Err(e.clone()));
            }
            return;
        }
    };
    let Ok(conn) = held.conn(setup).await else {
        return;
    };
    let mut by_holder: HashMap<String, crate::queue::Task> = claimed
        .tasks
        .into_iter()
        .map(|t| (t.processor.clone().unwrap_or_default(), t))
        .collect();
    // Candidates the statement passed over (a late task out of attempts, a
    // task lease held by hand) are the careful path's, one worker at a time.
    let mut careful = claimed.passed_over;
    for want in wants {
        let task = match by_holder.remove(want.worker.as_str()) {
            Some(task) => Some(task),
            None if careful => {
                match store::claim_next_in(
                    conn,
                    &setup.schema,
                    &want.worker,
                    setup.ttl,
                    &setup.filter,
                )
                .await
                {
                    Ok(Some(task)) => Some(task),
                    Ok(None) => {
                        careful = false;
                        None
                    }
                    Err(e) => {
                        let _ = want.reply.send(Err(e.into()));
                        continue;
                    }
                }
            }
            None => None,
        };
        let Some(task) = task else {
            let _ = want.reply.send(Ok(None));
            continue;
        };
        if let Err(Ok(Some(claim))) = want.reply.send(Ok(Some(Claim::of(task)))) {
            // The worker's loop ended while its claim was in flight: give
            // the task back rather than let it wait out its lease.
            let why = format!("worker {} stopped before its claim reached it", want.worker);
            if let Err(e) = store::fail_as(
                conn,
                &setup.schema,
                claim.task_id,
                &want.worker,
                claim.token,
                &why,
                setup.retry.of(&claim.kind),
                crate::queue::AttemptOutcome::GivenBack,
            )
            .await
            {
                tracing::warn!(worker = %want.worker, task_id = claim.task_id, error = %e,
                    "could not give back a claim nobody took; its lease will run out");
            }
        }
    }
}

/// The heartbeater: one statement for every heartbeat due at the moment.
async fn heartbeat(setup: Arc<Setup>, mut rx: mpsc::UnboundedReceiver<Beat>) {
    let mut held = Held::default();
    while let Some(first) = held.next(&mut rx).await {
        let mut beats = vec![first];
        drain(&mut rx, &mut beats, setup.batching.max.clamp(1, MAX_BATCH));
        // A worker killed while its heartbeat waited must not extend its
        // lease afterwards: its claim should run out.
        beats.retain(|b| !b.reply.is_closed());
        if beats.is_empty() {
            continue;
        }
        let claims: Vec<(i64, i64, Holder)> = beats
            .iter()
            .map(|b| (b.task_id, b.token, b.worker.clone()))
            .collect();
        let outcomes = async {
            let conn = held.conn(&setup).await?;
            Ok::<_, TransportError>(
                store::heartbeat_each(conn, &setup.schema, &claims, setup.ttl).await?,
            )
        }
        .await;
        if let Err(e) = &outcomes {
            held.failed(e);
        }
        match outcomes {
            Ok(outcomes) => {
                for (beat, outcome) in beats.into_iter().zip(outcomes) {
                    let answer = outcome
                        .map(|task| ms(task.heartbeat_in_ms))
                        .map_err(TransportError::from);
                    let _ = beat.reply.send(answer);
                }
            }
            Err(e) => {
                for beat in beats {
                    let _ = beat.reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// The completer: batches of completions, each fenced on its own.
async fn complete(setup: Arc<Setup>, mut rx: mpsc::Receiver<ToCompleter>) {
    let max = setup.batching.max.clamp(1, MAX_BATCH);
    let mut flushes = Vec::new();
    let mut held = Held::default();
    while let Some(first) = held.next(&mut rx).await {
        let mut batch = Vec::new();
        let mut take = |msg, batch: &mut Vec<Finish>| match msg {
            ToCompleter::Finish(f) => batch.push(f),
            ToCompleter::Flush(done) => flushes.push(done),
        };
        take(first, &mut batch);
        let until = Instant::now() + setup.batching.linger;
        while batch.len() < max {
            match rx.try_recv() {
                Ok(msg) => take(msg, &mut batch),
                Err(_) => match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(msg)) => take(msg, &mut batch),
                    Ok(None) | Err(_) => break,
                },
            }
        }
        if !batch.is_empty() {
            write_completions(&setup, &mut held, batch).await;
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

async fn write_completions(setup: &Setup, held: &mut Held, mut batch: Vec<Finish>) {
    let retry = Duration::from_millis(250);
    loop {
        let completions: Vec<Completion> = batch
            .iter()
            .map(|f| Completion::new(f.task_id, f.token, f.worker.clone(), Some(f.output.clone())))
            .collect();
        let outcomes = async {
            let conn = held.conn(setup).await?;
            Ok::<_, TransportError>(store::complete_each(conn, &setup.schema, &completions).await?)
        }
        .await;
        if let Err(e) = &outcomes {
            held.failed(e);
        }
        let why = match outcomes {
            Ok(outcomes) => {
                for (f, outcome) in batch.iter().zip(outcomes) {
                    match outcome {
                        Ok(_) => {
                            f.tally.done.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(worker = %f.worker, task_id = f.task_id, token = f.token,
                                "completed a task");
                        }
                        Err(e) => {
                            f.tally.abandoned.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(worker = %f.worker, task_id = f.task_id, token = f.token,
                                reason = %e, "abandoning the task: completion refused");
                        }
                    }
                }
                return;
            }
            Err(e) => e,
        };
        // The database could not be asked: retry each while its claim's
        // local deadline allows; the lease of the others runs out.
        let now = Instant::now();
        batch.retain(|f| {
            let keep = now + retry < f.deadline;
            if !keep {
                f.tally.abandoned.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(worker = %f.worker, task_id = f.task_id, error = %why,
                    "abandoning the task: completion failed and the deadline passed");
            }
            keep
        });
        if batch.is_empty() {
            return;
        }
        tracing::warn!(tasks = batch.len(), error = %why, "completions failed; retrying");
        tokio::time::sleep(retry).await;
    }
}

/// The reporter: the newest report of each worker, every `report_every`.
async fn report(setup: Arc<Setup>, mut rx: mpsc::UnboundedReceiver<ToReporter>) {
    let mut pending: HashMap<Holder, Report> = HashMap::new();
    let mut tick = tokio::time::interval(setup.batching.report_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(ToReporter::Report(worker, mut report)) => {
                    // A newer report replaces an unwritten one, keeping
                    // what the older one had to say once: a fresh run, an
                    // accepted heartbeat.
                    if let Some(older) = pending.remove(&worker) {
                        report.fresh |= older.fresh;
                        report.heartbeat |= older.heartbeat;
                    }
                    pending.insert(worker, report);
                }
                Some(ToReporter::Flush(done)) => {
                    write_reports(&setup, &mut pending).await;
                    let _ = done.send(());
                }
                None => {
                    write_reports(&setup, &mut pending).await;
                    return;
                }
            },
            _ = tick.tick() => write_reports(&setup, &mut pending).await,
        }
    }
}

async fn write_reports(setup: &Setup, pending: &mut HashMap<Holder, Report>) {
    if pending.is_empty() {
        return;
    }
    let reports: Vec<(Holder, Report)> = pending.drain().collect();
    let written = async {
        let mut conn = setup
            .pool
            .acquire()
            .await
            .map_err(|e| TransportError::Transient(format!("database: {e}")))?;
        registry::record_each(
            &mut conn,
            &setup.schema,
            setup.kind,
            Some(&setup.instance_id),
            &reports,
        )
        .await
        .map_err(|e| TransportError::Transient(format!("database: {e}")))
    }
    .await;
    if let Err(e) = written {
        tracing::debug!(workers = reports.len(), error = %e, "could not record the workers' states");
    }
}

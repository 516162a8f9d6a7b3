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
//!   fencing token, held by the worker it is handed to. Without
//!   [`Prefetch`] only free workers are served: nothing is fetched ahead;
//!   with it, the same statement also fills the workers' local queues
//!   (below);
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
//! ## Prefetch: a local queue per worker
//!
//! With [`Prefetch::per_worker`] above 0, a worker may have claims waiting
//! in a local queue besides the task it runs. A worker that finishes a
//! task takes the next from its local queue at once, without a round trip
//! (the producer then tops the queue up, in its next statement, with every
//! other top-up and free worker's claim: one commit claims many tasks).
//! How far ahead the producer claims adapts: it doubles while a claim gets
//! all it asked for, and halves when it gets fewer (the queue drains) or a
//! claim waited past its bound, so an idle or shallow queue is claimed one
//! task per free worker, as without prefetch.
//!
//! Each prefetched task is claimed **in the name of the worker that will
//! run it**, with its own lease and fencing token, by the one claim
//! statement (a name repeated in [`store::claim_for`]'s holders gets that
//! many claims). So the database says at every moment who holds what: the
//! dashboard's "worker holds task" stays true, and handing a task over is
//! free (no write: the claim is already the worker's). The alternative, a
//! local queue shared by a runtime's workers under one runtime holder,
//! would let any idle worker take any waiting task, but either every
//! hand-over re-writes the claim (a commit per task, the cost prefetch is
//! there to save) or workers run claims held under another name (a
//! kill of that name would not end them). The cost of the choice: a
//! waiting claim is its worker's. When another worker of the runtime finds
//! nothing to claim while claims wait behind a busy worker's task, the
//! producer gives the claims next in line back at once (one statement) and
//! their announcement wakes the idle worker to claim them: two statements,
//! paid only when the queue has drained, instead of a wait for the bound.
//!
//! How deep a local queue gets is also capped by its worker's pace: the
//! producer keeps a moving average of the time from a task handed over to
//! its worker's next ask, and fills a local queue only as far as its worker
//! is expected to start within half of [`Prefetch::max_wait`] (tasks of
//! 100 ms: 5 with the default 1 s; tasks longer than half a second: none, a
//! worker claims only when free). So a runtime of slow handlers does not
//! claim ahead only to give back, and its tasks stay claimable by other
//! replicas.
//!
//! While they wait, the claims are the producer's to look after:
//! - **renewed in bulk**: once a third of a waiting claim's lease has
//!   gone, one [`store::heartbeat_each`] renews all such claims of the
//!   transport; a refused renewal (the claim ran out and was taken over)
//!   drops the claim. A worker is handed a waiting claim only with a third
//!   of its lease left, and its deadline counts from the claim's (or
//!   renewal's) statement, not from the worker's request;
//! - **given back** ([`store::give_back_each`], one statement for many:
//!   pending again at its old place in the queue, its attempt not counted,
//!   `given_back` in its attempts and its lease's history) when it waited
//!   longer than [`Prefetch::max_wait`], when its worker stops, and all of
//!   them at the start of a graceful stop
//!   ([`InProcess::give_back_waiting`](super::in_process::InProcess::give_back_waiting));
//! - after a kill (the process dies, nothing is written) they are claims
//!   like any other: their leases run out and other workers take them
//!   over, each with a new token that fences off the dead holder.
//!
//! A worker that is killed in-process (its loop aborted, the transport
//! alive) leaves its waiting claims to the bound: they are given back at
//! [`Prefetch::max_wait`], sooner than its running task, which is taken
//! over when its lease runs out.
//!
//! What prefetch costs: a task claimed ahead waits behind the task its
//! worker is running; with a no-op handler that is microseconds, behind a
//! task slower than its worker's pace it is up to the bound, while another
//! replica may be idle (an idle worker of the same replica gets it at
//! once, above). That is unfairness between replicas, bounded by
//! [`Prefetch::max_wait`]. An idle fleet's pickup latency is unchanged:
//! the adaptive depth is 0 when claims come back short, so a lone task is
//! claimed by the first free worker as without prefetch.
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
use crate::queue::store::{self, Completion, MAX_BATCH};
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

/// How far ahead a transport's workers claim: each worker may have claims
/// waiting in its local queue besides the task it runs, so that when it
/// finishes one it starts the next at once, and one claim statement
/// claims for many tasks (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prefetch {
    /// The most claims waiting in one worker's local queue; 0 turns
    /// prefetching off (a worker claims only when it is free). How many a
    /// claim asks for adapts between 0 and this: it doubles while claims
    /// get all they ask for, and halves when they get fewer (the queue is
    /// draining); and it is never more than the worker is expected to
    /// start within half of [`Prefetch::max_wait`] (its pace measured as it
    /// runs). Default: 32, chosen by measurement (`leasekeeper-tools bench
    /// fleet`, no-op handler, 16 workers: 32 gave 2.5 to 3 × the throughput
    /// of no prefetch and more than 8 did; see docs/BENCHMARKS.md). The
    /// pace cap keeps slow handlers from claiming ahead at all, so the
    /// count matters only for fast ones. What it costs: a task claimed
    /// ahead shows `started` while it waits, and waits behind its worker's
    /// task while another replica may be idle (up to the bound).
    pub per_worker: usize,
    /// The longest a claim waits in a local queue before it is given back
    /// (pending again at its old place, its attempt not counted), so that
    /// a worker busy with a long task does not sit on work another worker
    /// could run. Default: 1 s.
    pub max_wait: Duration,
}

impl Default for Prefetch {
    fn default() -> Self {
        Prefetch {
            per_worker: 32,
            max_wait: Duration::from_secs(1),
        }
    }
}

impl Prefetch {
    /// Up to `per_worker` claims waiting per worker, each for at most the
    /// default [`Prefetch::max_wait`].
    pub fn per_worker(per_worker: usize) -> Self {
        Prefetch {
            per_worker,
            ..Prefetch::default()
        }
    }

    /// Claims wait at most `max_wait` before they are given back.
    pub fn max_wait(self, max_wait: Duration) -> Self {
        Prefetch { max_wait, ..self }
    }
}

/// What the loops need to write.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) pool: PgPool,
    /// The pool's schema.
    pub(crate) schema: Schema,
    pub(crate) ttl: Duration,
    pub(crate) filter: ClaimFilter,
    pub(crate) kind: WorkerKind,
    pub(crate) instance_id: Arc<str>,
    pub(crate) batching: Batching,
    pub(crate) prefetch: Prefetch,
}

type Answer<T> = oneshot::Sender<Result<T, TransportError>>;

/// A free worker asking for a task.
struct Want {
    worker: Holder,
    reply: Answer<Option<Claim>>,
}

/// A claim waiting in a worker's local queue.
#[derive(Debug)]
struct Waiting {
    claim: Claim,
    /// The monotonic instant just before the statement that last set the
    /// lease (the claim or a renewal) was sent.
    sent: Instant,
    /// What the database said was left of the lease then.
    remaining: Duration,
    /// When it was claimed: it waits at most [`Prefetch::max_wait`].
    since: Instant,
}

impl Waiting {
    /// A claim a worker's reply could not reach (its loop ended), to be
    /// given back: its lease as the claim last said (`ttl` if unknown).
    fn unsent(claim: Claim, ttl: Duration) -> Self {
        let now = Instant::now();
        Waiting {
            remaining: claim.remaining.unwrap_or(ttl),
            claim,
            sent: now,
            since: now,
        }
    }

    /// What is surely left of its lease now, by the local clock: the
    /// database's remainder, less the time since the statement was sent.
    fn left(&self) -> Duration {
        self.remaining.saturating_sub(self.sent.elapsed())
    }
}

/// The workers' local queues, shared by the workers (who take from them
/// without waiting for the producer) and the producer (who fills them,
/// renews them and gives back what waited too long).
#[derive(Debug, Default)]
struct Local {
    queues: HashMap<Holder, std::collections::VecDeque<Waiting>>,
    /// Set by [`Batcher::give_back_waiting`]: nothing more is prefetched.
    closed: bool,
    /// When each worker that runs a task was handed it.
    handed: HashMap<Holder, Instant>,
    /// How long a worker takes from one task to the next (a moving
    /// average of the time from a task handed over to its worker's next
    /// ask): what the depth of a local queue is capped by (see
    /// [`Local::depth_cap`]). Time a worker spent idle is no sample.
    cycle: Option<Duration>,
}

impl Local {
    /// `worker` was handed a task to run.
    fn handed(&mut self, worker: &Holder) {
        self.handed.insert(worker.clone(), Instant::now());
    }

    /// `worker` asks for a task: if it was running one, the time since it
    /// was handed that task is one sample of the cycle.
    fn asked(&mut self, worker: &Holder) {
        if let Some(before) = self.handed.remove(worker) {
            let sample = before.elapsed();
            self.cycle = Some(match self.cycle {
                // A new sample weighs one eighth: a few tasks of a new
                // length move it, one outlier does not.
                Some(c) => (c * 7 + sample) / 8,
                None => sample,
            });
        }
    }

    /// The deepest a local queue may be so that its last claim is
    /// expected to start within half of `max_wait`: a worker whose tasks
    /// take 100 ms keeps at most 5 waiting with the default 1 s bound, one
    /// whose tasks take longer than half a second keeps none (it claims only when
    /// free, as without prefetch), so slow handlers do not claim ahead
    /// only to give back. Unknown (no worker has finished a task yet):
    /// no cap.
    fn depth_cap(&self, max_wait: Duration) -> usize {
        match self.cycle {
            None => usize::MAX,
            Some(c) if c.is_zero() => usize::MAX,
            Some(c) => (max_wait.as_secs_f64() / 2.0 / c.as_secs_f64()) as usize,
        }
    }

    /// How long a worker must have run its current task before the claims
    /// waiting behind it count as stuck: four of the runtime's expected
    /// paces, and at least [`STUCK_AFTER`]. A worker running fast tasks is
    /// never stuck (it runs its waiting claims within moments: moving one
    /// would cost two statements and gain nothing); one on a slow task is.
    fn stuck_after(&self) -> Duration {
        self.cycle.map_or(STUCK_AFTER, |c| (c * 4).max(STUCK_AFTER))
    }

    /// For each worker with claims waiting, when it becomes stuck on the
    /// task it runs (`None` for one between tasks: it takes its next
    /// claim at once).
    fn stuck_at(&self) -> impl Iterator<Item = (&Holder, Instant)> {
        let stuck_after = self.stuck_after();
        self.queues
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .filter_map(move |(w, _)| self.handed.get(w).map(|h| (w, *h + stuck_after)))
    }

    /// When the first worker with claims waiting becomes stuck (now if one
    /// is), if any.
    fn next_stuck_at(&self) -> Option<Instant> {
        self.stuck_at().map(|(_, at)| at).min()
    }

    /// Takes out up to `n` claims, each the next in line of a worker that
    /// is stuck on its task (see [`Local::stuck_after`]), longest stuck
    /// first: to be given back for idle workers to claim.
    fn steal(&mut self, n: usize) -> Vec<(Holder, Waiting)> {
        let mut taken = Vec::new();
        while taken.len() < n {
            let now = Instant::now();
            let Some(worker) = self
                .stuck_at()
                .filter(|(_, at)| *at <= now)
                .min_by_key(|(_, at)| *at)
                .map(|(w, _)| w.clone())
            else {
                break;
            };
            let waiting = self
                .queues
                .get_mut(&worker)
                .and_then(|q| q.pop_front())
                .expect("a front was seen");
            taken.push((worker, waiting));
        }
        taken
    }

    /// The first claim of `worker`'s local queue with at least `min_left`
    /// of its lease left, its remainder as the worker may trust it (less
    /// the time it waited); and the claims before it that had too little
    /// left (to be given back).
    fn take(&mut self, worker: &Holder, min_left: Duration) -> (Option<Claim>, Vec<Waiting>) {
        let mut too_late = Vec::new();
        let Some(queue) = self.queues.get_mut(worker) else {
            return (None, too_late);
        };
        while let Some(waiting) = queue.pop_front() {
            let left = waiting.left();
            if left >= min_left {
                let mut claim = waiting.claim;
                claim.remaining = Some(left);
                return (Some(claim), too_late);
            }
            too_late.push(waiting);
        }
        (None, too_late)
    }
}

/// The least a worker runs one task before the claims waiting behind it
/// may go to an idle worker of the runtime (see [`Local::stuck_after`]).
const STUCK_AFTER: Duration = Duration::from_millis(100);

/// What the producer is asked to do.
enum ToProducer {
    /// A free worker with nothing in its local queue wants a task.
    Want(Want),
    /// A worker took a claim from its local queue: fill it up again.
    TopUp(Holder),
    /// Claims taken out of a local queue that must go back (too little
    /// left of the lease to hand to a worker).
    GiveBack(Holder, Vec<Waiting>),
    /// A worker stopped: give back what waits in its local queue.
    Forget(Holder),
    /// Give back every waiting claim and prefetch nothing more (a graceful
    /// stop); answered once written.
    Close(oneshot::Sender<()>),
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
    claims: mpsc::UnboundedSender<ToProducer>,
    local: Arc<std::sync::Mutex<Local>>,
    /// The least that must be left of a waiting claim's lease to hand it
    /// to a worker.
    min_left: Duration,
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
        let local = Arc::new(std::sync::Mutex::new(Local::default()));
        let min_left = setup.ttl / 3;
        tokio::spawn(produce(setup.clone(), local.clone(), claims_rx));
        tokio::spawn(heartbeat(setup.clone(), beats_rx));
        tokio::spawn(complete(setup.clone(), completions_rx));
        tokio::spawn(report(setup, reports_rx));
        Batcher {
            claims,
            local,
            min_left,
            beats,
            completions,
            reports,
        }
    }

    /// Claims a task for `worker`: the first in its local queue, at once
    /// (the producer then tops the queue up), else with the other free
    /// workers' claims.
    pub(crate) async fn claim(&self, worker: &Holder) -> Result<Option<Claim>, TransportError> {
        self.local
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .asked(worker);
        let claim = match self.take_waiting(worker) {
            Some(claim) => Some(claim),
            None => {
                let (reply, answer) = oneshot::channel();
                self.claims
                    .send(ToProducer::Want(Want {
                        worker: worker.clone(),
                        reply,
                    }))
                    .map_err(|_| gone())?;
                answer.await.map_err(|_| gone())??
            }
        };
        if claim.is_some() {
            self.local
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .handed(worker);
        }
        Ok(claim)
    }

    /// The first claim of `worker`'s local queue with enough of its lease
    /// left, its remainder as the worker may trust it (less the time it
    /// waited: the worker times its deadline from its own request, which
    /// came later than the claim's statement).
    fn take_waiting(&self, worker: &Holder) -> Option<Claim> {
        let (taken, too_late) = self
            .local
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(worker, self.min_left);
        if !too_late.is_empty() {
            let _ = self
                .claims
                .send(ToProducer::GiveBack(worker.clone(), too_late));
        }
        if taken.is_some() {
            let _ = self.claims.send(ToProducer::TopUp(worker.clone()));
        }
        taken
    }

    /// `worker` stopped: what waits in its local queue is given back.
    pub(crate) fn forget(&self, worker: &Holder) {
        let _ = self.claims.send(ToProducer::Forget(worker.clone()));
    }

    /// Gives back every claim waiting in a local queue, in one statement,
    /// and prefetches nothing more: a graceful stop.
    pub(crate) async fn give_back_waiting(&self) {
        let (done, written) = oneshot::channel();
        if self.claims.send(ToProducer::Close(done)).is_ok() {
            let _ = written.await;
        }
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

/// The producer: one claim statement for every worker free at the moment
/// and every local queue to fill; and, while claims wait in local queues,
/// their renewal and give-back.
async fn produce(
    setup: Arc<Setup>,
    local: Arc<std::sync::Mutex<Local>>,
    mut rx: mpsc::UnboundedReceiver<ToProducer>,
) {
    let mut held = Held::default();
    let prefetch = setup.prefetch;
    let prefetching = prefetch.per_worker > 0;
    // How many claims a local queue is filled to: adapts between 0 and the
    // setting (see `Prefetch::per_worker`).
    let mut ahead = prefetch.per_worker.min(1);
    // Waiting claims are looked at often enough that none waits much past
    // its bound or comes near the end of its lease unrenewed.
    let every = (prefetch.max_wait.min(setup.ttl / 3) / 4).max(Duration::from_millis(5));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Workers that were answered "nothing to claim" and have not asked
    // since: what waits behind a busy worker's task may go to them.
    let mut idle: std::collections::HashSet<Holder> = std::collections::HashSet::new();
    loop {
        let stuck_at = if prefetching && !idle.is_empty() {
            local
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .next_stuck_at()
        } else {
            None
        };
        let first = tokio::select! {
            msg = held.next(&mut rx) => match msg {
                Some(msg) => Some(msg),
                None => break,
            },
            _ = tick.tick(), if prefetching => None,
            // A claim waiting behind a busy worker becomes stuck while a
            // worker of this runtime is idle.
            _ = tokio::time::sleep_until(stuck_at.unwrap_or_else(Instant::now)), if stuck_at.is_some() => None,
        };
        let mut msgs: Vec<ToProducer> = first.into_iter().collect();
        while msgs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(msg) => msgs.push(msg),
                Err(_) => break,
            }
        }
        let mut wants = Vec::new();
        let mut top_up: Vec<Holder> = Vec::new();
        let mut back: Vec<(Holder, Waiting)> = Vec::new();
        let mut closes = Vec::new();
        for msg in msgs {
            match msg {
                ToProducer::Want(want) => {
                    idle.remove(&want.worker);
                    wants.push(want);
                }
                ToProducer::TopUp(worker) => {
                    idle.remove(&worker);
                    top_up.push(worker);
                }
                ToProducer::GiveBack(worker, waiting) => {
                    back.extend(waiting.into_iter().map(|w| (worker.clone(), w)));
                }
                ToProducer::Forget(worker) => {
                    idle.remove(&worker);
                    let mut local = local.lock().unwrap_or_else(|e| e.into_inner());
                    local.handed.remove(&worker);
                    if let Some(queue) = local.queues.remove(&worker) {
                        back.extend(queue.into_iter().map(|w| (worker.clone(), w)));
                    }
                }
                ToProducer::Close(done) => {
                    let mut local = local.lock().unwrap_or_else(|e| e.into_inner());
                    local.closed = true;
                    for (worker, queue) in local.queues.drain() {
                        back.extend(queue.into_iter().map(|w| (worker.clone(), w)));
                    }
                    closes.push(done);
                }
            }
        }
        if prefetching {
            // Claims that waited past their bound go back; the others are
            // renewed once a third of their lease is gone.
            let mut renew = Vec::new();
            {
                let mut local = local.lock().unwrap_or_else(|e| e.into_inner());
                for (worker, queue) in local.queues.iter_mut() {
                    let (stay, late): (Vec<Waiting>, Vec<Waiting>) = queue
                        .drain(..)
                        .partition(|w| w.since.elapsed() < prefetch.max_wait);
                    back.extend(late.into_iter().map(|w| (worker.clone(), w)));
                    for w in &stay {
                        if w.sent.elapsed() >= setup.ttl / 3 {
                            renew.push((w.claim.task_id, w.claim.token, worker.clone()));
                        }
                    }
                    queue.extend(stay);
                }
            }
            if !back.is_empty() {
                // The bound was hit: claim less far ahead.
                ahead /= 2;
            }
            renew_waiting(&setup, &mut held, &local, renew).await;
        }
        give_back(&setup, &mut held, std::mem::take(&mut back)).await;
        for done in closes {
            let _ = done.send(());
        }
        // A worker whose loop ended while it waited wants nothing now; and
        // one name twice (a worker restarted under its id) is served once.
        wants.retain(|w| !w.reply.is_closed());
        let mut seen = std::collections::HashSet::new();
        wants.reverse();
        wants.retain(|w| seen.insert(w.worker.clone()));
        top_up.retain(|w| seen.insert(w.clone()));
        if prefetching {
            // Race prevented: a worker found its local queue empty and
            // asked, while the statement of an earlier top-up was filling
            // it. Serving the ask with a new claim would run that task
            // before the ones already waiting (out of the queue's order):
            // the ask takes the first waiting claim instead, and the local
            // queue is topped up.
            let min_left = setup.ttl / 3;
            let mut asked = Vec::with_capacity(wants.len());
            for want in wants {
                let (taken, too_late) = local
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take(&want.worker, min_left);
                back.extend(too_late.into_iter().map(|w| (want.worker.clone(), w)));
                let Some(claim) = taken else {
                    asked.push(want);
                    continue;
                };
                top_up.push(want.worker.clone());
                if let Err(Ok(Some(claim))) = want.reply.send(Ok(Some(claim))) {
                    // Its loop ended meanwhile: the claim goes back.
                    back.push((want.worker.clone(), Waiting::unsent(claim, setup.ttl)));
                }
            }
            wants = asked;
            give_back(&setup, &mut held, std::mem::take(&mut back)).await;
        }
        if !prefetching || local.lock().unwrap_or_else(|e| e.into_inner()).closed {
            top_up.clear();
        }
        if wants.is_empty() && top_up.is_empty() {
            if prefetching {
                steal_for_idle(&setup, &mut held, &local, &mut idle).await;
            }
            continue;
        }
        let depth = if prefetching {
            let cap = local
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .depth_cap(prefetch.max_wait);
            ahead.min(cap)
        } else {
            ahead
        };
        let (asking, topping) = (wants.len(), top_up.len());
        let started = Instant::now();
        let served = serve(&setup, &mut held, &local, wants, top_up, depth).await;
        // What a runtime's throughput is made of, claim by claim, for
        // whoever must tell why a runtime runs slower than it should.
        tracing::trace!(
            asking,
            topping,
            depth,
            asked = served.asked,
            got = served.got,
            ms = started.elapsed().as_secs_f64() * 1000.0,
            "claimed"
        );
        if prefetching {
            ahead = if served.got >= served.asked {
                (ahead * 2).clamp(1, prefetch.per_worker)
            } else {
                ahead / 2
            };
            idle.extend(served.unserved);
            steal_for_idle(&setup, &mut held, &local, &mut idle).await;
        }
    }
    // Every handle is gone (the workers ended): nothing will take what
    // still waits.
    let rest: Vec<(Holder, Waiting)> = {
        let mut local = local.lock().unwrap_or_else(|e| e.into_inner());
        local
            .queues
            .drain()
            .flat_map(|(worker, queue)| queue.into_iter().map(move |w| (worker.clone(), w)))
            .collect()
    };
    give_back(&setup, &mut held, rest).await;
}

/// Workers of this runtime found nothing to claim (`idle`) while others
/// have claims stuck behind the task they run (the queue drained while a
/// slow task held its worker, see [`Local::stuck_after`]): the claims next
/// in line go back, one per idle worker, and their announcement wakes the
/// idle workers to claim them, rather than have them wait out the bound.
async fn steal_for_idle(
    setup: &Setup,
    held: &mut Held,
    local: &std::sync::Mutex<Local>,
    idle: &mut std::collections::HashSet<Holder>,
) {
    if idle.is_empty() {
        return;
    }
    let stolen = local
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .steal(idle.len());
    if stolen.is_empty() {
        return;
    }
    // Each woken worker asks again (and leaves `idle` then); until it does
    // it is not counted twice.
    let woken: Vec<Holder> = idle.iter().take(stolen.len()).cloned().collect();
    for worker in woken {
        idle.remove(&worker);
    }
    give_back(setup, held, stolen).await;
}

/// Renews the waiting claims `renew` in one statement per [`MAX_BATCH`],
/// and updates what the local queues know of their leases. A refused
/// renewal (the claim is no longer this runtime's) drops the claim.
async fn renew_waiting(
    setup: &Setup,
    held: &mut Held,
    local: &std::sync::Mutex<Local>,
    renew: Vec<(i64, i64, Holder)>,
) {
    for chunk in renew.chunks(MAX_BATCH) {
        let sent = Instant::now();
        let outcomes = async {
            let conn = held.conn(setup).await?;
            Ok::<_, TransportError>(
                store::heartbeat_each(conn, &setup.schema, chunk, setup.ttl).await?,
            )
        }
        .await;
        let outcomes = match outcomes {
            Ok(outcomes) => outcomes,
            Err(e) => {
                // Tried again at the next tick; a claim whose lease runs low
                // meanwhile is not handed out (see `Batcher::take_waiting`).
                held.failed(&e);
                tracing::warn!(claims = chunk.len(), error = %e, "could not renew the waiting claims");
                continue;
            }
        };
        let mut local = local.lock().unwrap_or_else(|e| e.into_inner());
        for ((task_id, token, worker), outcome) in chunk.iter().zip(outcomes) {
            let Some(queue) = local.queues.get_mut(worker) else {
                continue;
            };
            // Taken by its worker meanwhile: the worker heartbeats it now.
            let Some(at) = queue
                .iter()
                .position(|w| w.claim.task_id == *task_id && w.claim.token == *token)
            else {
                continue;
            };
            match outcome {
                Ok(task) => {
                    queue[at].sent = sent;
                    queue[at].remaining = ms(task.heartbeat_in_ms).unwrap_or_default();
                }
                Err(e) => {
                    queue.remove(at);
                    tracing::warn!(worker = %worker, task_id, token, error = %e,
                        "a waiting claim was lost before its worker took it");
                }
            }
        }
    }
}

/// Gives back `claims` that no worker started on, in one statement per
/// [`MAX_BATCH`] (see [`store::give_back_each`]). One that cannot be given
/// back (the database failed) waits out its lease and is taken over.
async fn give_back(setup: &Setup, held: &mut Held, claims: Vec<(Holder, Waiting)>) {
    let claims: Vec<(i64, i64, Holder)> = claims
        .into_iter()
        .map(|(worker, w)| (w.claim.task_id, w.claim.token, worker))
        .collect();
    for chunk in claims.chunks(MAX_BATCH) {
        let why = "claimed ahead and not started: given back unstarted";
        let outcomes = async {
            let conn = held.conn(setup).await?;
            Ok::<_, TransportError>(store::give_back_each(conn, &setup.schema, chunk, why).await?)
        }
        .await;
        match outcomes {
            Ok(outcomes) => {
                let refused = outcomes.iter().filter(|o| o.is_err()).count();
                tracing::debug!(claims = chunk.len(), refused, "gave back waiting claims");
            }
            Err(e) => {
                held.failed(&e);
                tracing::warn!(claims = chunk.len(), error = %e,
                    "could not give back waiting claims; their leases will run out");
            }
        }
    }
}

/// What one [`serve`] did.
struct Served {
    /// Tasks asked for.
    asked: usize,
    /// Tasks claimed.
    got: usize,
    /// Wanting workers answered with nothing to run.
    unserved: Vec<Holder>,
}

/// One claim statement for `wants` (one task each, to hand over now) and
/// for the local queues of `top_up` and of the wanting workers (filled to
/// `ahead`).
async fn serve(
    setup: &Setup,
    held: &mut Held,
    local: &std::sync::Mutex<Local>,
    wants: Vec<Want>,
    top_up: Vec<Holder>,
    ahead: usize,
) -> Served {
    // Each wanting worker first (one each, in the statement's first rows,
    // which get the work when there is less than asked), then the room in
    // the local queues.
    let mut holders: Vec<Holder> = wants.iter().map(|w| w.worker.clone()).collect();
    {
        let local = local.lock().unwrap_or_else(|e| e.into_inner());
        let room = |worker: &Holder| {
            if local.closed {
                return 0;
            }
            ahead.saturating_sub(local.queues.get(worker).map_or(0, |q| q.len()))
        };
        for worker in wants.iter().map(|w| &w.worker).chain(top_up.iter()) {
            let n = room(worker).min(MAX_BATCH - holders.len());
            holders.extend(std::iter::repeat_n(worker.clone(), n));
        }
    }
    let asked = holders.len();
    if asked == 0 {
        return Served {
            asked,
            got: 0,
            unserved: Vec::new(),
        };
    }
    let sent = Instant::now();
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
            return Served {
                asked,
                got: 0,
                unserved: Vec::new(),
            };
        }
    };
    let got = claimed.tasks.len();
    let mut by_holder: HashMap<String, std::collections::VecDeque<crate::queue::Task>> =
        HashMap::new();
    for task in claimed.tasks {
        by_holder
            .entry(task.processor.clone().unwrap_or_default())
            .or_default()
            .push_back(task);
    }
    // The claims no worker will take go back at once.
    let mut back: Vec<(Holder, Waiting)> = Vec::new();
    let waiting = |task: crate::queue::Task| {
        let claim = Claim::of(task);
        Waiting {
            remaining: claim.remaining.unwrap_or(setup.ttl),
            claim,
            sent,
            since: sent,
        }
    };
    let Ok(conn) = held.conn(setup).await else {
        return Served {
            asked,
            got,
            unserved: Vec::new(),
        };
    };
    let mut unserved = Vec::new();
    // Candidates the statement passed over (a late task out of attempts, a
    // task lease held by hand) are the careful path's, one worker at a time.
    let mut careful = claimed.passed_over;
    for want in wants {
        let mut mine = by_holder.remove(want.worker.as_str()).unwrap_or_default();
        let task = match mine.pop_front() {
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
            unserved.push(want.worker.clone());
            let _ = want.reply.send(Ok(None));
            continue;
        };
        // Queued before the reply, so that the worker's next claim finds them.
        let rest: Vec<Waiting> = mine.into_iter().map(waiting).collect();
        let queued = rest.len();
        if queued > 0 {
            let mut local = local.lock().unwrap_or_else(|e| e.into_inner());
            local
                .queues
                .entry(want.worker.clone())
                .or_default()
                .extend(rest);
        }
        if let Err(Ok(Some(claim))) = want.reply.send(Ok(Some(Claim::of(task)))) {
            // The worker's loop ended while its claim was in flight: give
            // the task back (and what was queued for it) rather than let
            // them wait out their leases.
            back.push((want.worker.clone(), Waiting::unsent(claim, setup.ttl)));
            let mut local = local.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(queue) = local.queues.remove(&want.worker) {
                back.extend(queue.into_iter().map(|w| (want.worker.clone(), w)));
            }
        }
    }
    {
        let mut local = local.lock().unwrap_or_else(|e| e.into_inner());
        for (worker, tasks) in by_holder {
            let Ok(worker) = Holder::parse(worker) else {
                continue;
            };
            local
                .queues
                .entry(worker)
                .or_default()
                .extend(tasks.into_iter().map(waiting));
        }
    }
    give_back(setup, held, back).await;
    Served {
        asked,
        got,
        unserved,
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
        let started = Instant::now();
        let outcomes = async {
            let conn = held.conn(setup).await?;
            Ok::<_, TransportError>(store::complete_each(conn, &setup.schema, &completions).await?)
        }
        .await;
        tracing::trace!(
            tasks = completions.len(),
            ms = started.elapsed().as_secs_f64() * 1000.0,
            "completed"
        );
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

//! Batching for the in-process transport: what lets a runtime's workers
//! share a handful of statements instead of each making its own.
//!
//! One `Batcher` serves every worker of one transport (a runtime's
//! queue, an instance's simulated fleet) with four background loops, each
//! on a connection of the pool only while it writes, each in its own room:
//!
//! - the **producer** (`producer`) gathers the claims of every worker
//!   that is free at that moment into one statement. Without [`Prefetch`]
//!   only free workers are served: nothing is fetched ahead; with it, the
//!   same statement also fills the workers' local queues, which the
//!   producer looks after while claims wait in them (`prefetch`: the
//!   local queues, renewal, and every way a waiting claim leaves; its
//!   documentation in `worker/batch/prefetch.rs` says why each prefetched
//!   claim is its worker's own, and what prefetch costs);
//! - the **completer** (`completer`) writes completions in batches;
//! - the **heartbeater** (`heartbeater`) renews the due claims of every
//!   worker in one statement;
//! - the **reporter** (`reporter`) writes what the workers are doing.
//!
//! The wiring: a worker talks to the loops through the `Batcher`'s
//! channels (and takes a waiting claim from its local queue itself, under
//! the lock it shares with the producer); each loop ends, after writing
//! what it was given, when the last handle is dropped.
//!
//! Claims and heartbeats are batched by arrival (whatever is waiting when
//! the previous statement returns goes in the next), so a lone claim or
//! heartbeat waits for nothing. The completer's linger is the one delay
//! batching adds to a task (the benchmark measures it: `fleet_single_task`
//! keys of `leasekeeper-tools bench`).

mod completer;
mod heartbeater;
mod held;
mod prefetch;
mod producer;
mod reporter;

pub(crate) use completer::Finish;

use super::Report;
use super::WorkerKind;
use super::transport::{Claim, TransportError};
use crate::db::Schema;
use crate::lease::Holder;
use crate::queue::ClaimFilter;
use crate::queue::store::MAX_BATCH;
use completer::ToCompleter;
use heartbeater::Beat;
use held::Shared;
use prefetch::Local;
use producer::{ToProducer, Want};
use reporter::ToReporter;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

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

/// Where a loop answers a worker's request.
type Answer<T> = oneshot::Sender<Result<T, TransportError>>;

/// The handles of one transport's four loops (see the module
/// documentation). The loops end, after writing what they were given,
/// when the last handle is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Batcher {
    claims: mpsc::UnboundedSender<ToProducer>,
    local: Arc<Shared<Local>>,
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
        let local = Arc::new(Shared::default());
        let min_left = setup.ttl / 3;
        tokio::spawn(producer::produce(setup.clone(), local.clone(), claims_rx));
        tokio::spawn(heartbeater::heartbeat(setup.clone(), beats_rx));
        tokio::spawn(completer::complete(setup.clone(), completions_rx));
        tokio::spawn(reporter::report(setup, reports_rx));
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
        self.local.lock().asked(worker);
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
            self.local.lock().handed(worker);
        }
        Ok(claim)
    }

    /// The first claim of `worker`'s local queue with enough of its lease
    /// left, its remainder as the worker may trust it (less the time it
    /// waited: the worker times its deadline from its own request, which
    /// came later than the claim's statement).
    fn take_waiting(&self, worker: &Holder) -> Option<Claim> {
        let (taken, too_late) = self.local.lock().take(worker, self.min_left);
        if !too_late.is_empty() {
            let _ = self.claims.send(ToProducer::Left(too_late));
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

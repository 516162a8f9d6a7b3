//! The worker loop: claim, work in ticks while heartbeating, complete with
//! the claim's fencing token; abandon the work the moment the claim is lost.
//!
//! Lease rules, as this loop applies them:
//! - Trust a claim only until its *local deadline*: the monotonic instant
//!   taken just before the claim (or the last accepted heartbeat) was sent,
//!   plus what the database said was left of the lease, minus a tenth of it.
//!   The database computed that remainder from its own `now()`, later than
//!   the send, so the local deadline passes first. Process wall clocks are
//!   never consulted.
//! - Heartbeat on a timer of its own (every `heartbeat_interval`, and at
//!   least three times per lease), independent of the work ticks, so a slow
//!   heartbeat (a chaos stall) delays nothing but itself.
//! - A refused heartbeat or completion (the queue says the claim is stale)
//!   or a passed local deadline means: stop at once, write nothing more for
//!   that claim, and go back to claiming. The lease runs out by itself.
//! - A crash (chaos, or the fleet aborting the task) writes nothing at all.
//! - A pause freezes everything (no ticks, no heartbeats) and then resumes
//!   *at the completion write*, as a process frozen by a long GC pause would:
//!   it still believes it holds the claim. The fencing token is what stops
//!   that late write when another worker took the task over meanwhile.
//! - A graceful stop gives the task back at once as a failed attempt (it is
//!   retried after a short backoff) instead of making it wait out the lease.
//!
//! The work itself is the [`Handler`] registered
//! for the task's kind. It runs inside the loop (polled, not spawned), so a
//! pause freezes it too; a panic in it is caught and reported as a failed
//! attempt. When the claim is lost, the handler's
//! [`lease_lost`](super::handler::TaskContext::lease_lost) and
//! [`cancelled`](super::handler::TaskContext::cancelled) signals fire and
//! it gets [`WorkerConfig::lost_grace`] to return; whatever it answers then
//! is discarded. A task whose kind has no handler fails its attempt.
//!
//! An operator's cancel (or force-release) ends the claim in the database;
//! a worker [hearing cancels](Worker::hearing_cancels) heartbeats at once
//! on the announcement, is refused, and so loses the claim within moments
//! instead of at its next heartbeat.

use super::Report;
use super::WorkerState;
use super::chaos::Chaos;
use super::handler::{Handler, Handlers, SimulatedCrash, TaskContext};
use super::transport::{Claim, ClaimRef, Tally, Transport, TransportError};
use crate::lease::Holder;
use crate::queue::AttemptOutcome;
use crate::queue::store::FencedTransaction;
use crate::queue::wake::{CancelSignal, WorkSignal};
use futures::FutureExt;
use serde_json::Value;
use std::future::Future;
use std::ops::RangeInclusive;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

/// Timing of a worker.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerConfig {
    /// The TTL assumed when the queue's answer does not say what is left
    /// of the lease (claims themselves ask the queue's own TTL).
    pub lease_ttl: Duration,
    /// How often the claim is heartbeated (at most a third of the lease).
    pub heartbeat_interval: Duration,
    /// One tick of work.
    pub tick: Duration,
    /// How long an idle worker waits between claims, chosen in this range.
    pub poll: RangeInclusive<Duration>,
    /// Wait after a failed claim (times the failures in a row, up to five).
    pub claim_retry: Duration,
    /// How long a pause freezes a worker: past the TTL, so the claim is lost.
    pub pause_for: Duration,
    /// The longest a report to the `workers` table may hold the loop up.
    pub report_timeout: Duration,
    /// Fault injection only (`leasekeeper worker --trust-claims`, used by
    /// `leasekeeper-tools chaos`): never give a claim up on this side. The local
    /// deadline is ignored and a refused heartbeat does not stop the work,
    /// so a worker frozen past its lease (SIGSTOP) resumes and sends its
    /// completion with the old token, as a process paused just after its
    /// last deadline check would. Only the queue's fencing stands between
    /// that write and a task done twice.
    pub trust_claims: bool,
    /// How long a handler may take to return after its claim was lost
    /// (its result is discarded either way; the worker then claims anew).
    pub lost_grace: Duration,
}

impl WorkerConfig {
    /// One-second ticks, polls every 250-500 ms, pauses of TTL + 2 s.
    pub fn new(lease_ttl: Duration, heartbeat_interval: Duration) -> Self {
        WorkerConfig {
            lease_ttl,
            heartbeat_interval,
            tick: Duration::from_secs(1),
            poll: Duration::from_millis(250)..=Duration::from_millis(500),
            claim_retry: Duration::from_secs(1),
            pause_for: lease_ttl + Duration::from_secs(2),
            report_timeout: Duration::from_secs(2),
            trust_claims: false,
            lost_grace: Duration::from_secs(1),
        }
    }
}

/// How long a claim may be trusted after its request was sent, given what
/// the database said was left of the lease: a tenth less.
fn trusted(remaining: Duration) -> Duration {
    remaining - remaining / 10
}

/// An order for a running worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Freeze for this long (no ticks, no heartbeats), then resume.
    Pause(Duration),
}

/// The handle that stops or pauses a running [`Worker`].
#[derive(Clone, Debug)]
pub struct Controls {
    stop: CancellationToken,
    drain: CancellationToken,
    commands: mpsc::UnboundedSender<Command>,
}

impl Controls {
    /// Asks the worker to stop gracefully (it gives back its task).
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Asks the worker to claim nothing more and stop once the task at
    /// hand is finished (completed, failed or lost); [`Controls::stop`]
    /// still stops it at once.
    pub fn drain(&self) {
        self.drain.cancel();
    }

    /// Freezes the worker for `duration`. False when the worker is gone.
    pub fn pause(&self, duration: Duration) -> bool {
        self.commands.send(Command::Pause(duration)).is_ok()
    }

    /// The token that [`stop`](Self::stop) cancels.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }
}

/// Why [`Worker::run`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Stopped gracefully.
    Stopped,
    /// Crashed (chaos): stopped dead, nothing completed or released.
    Crashed,
}

/// What to do after working on one claim.
enum Flow {
    /// Go back to claiming.
    Claim,
    /// Leave the loop.
    Exit(Exit),
}

/// A heartbeat in flight: the instant its request was sent, and the answer.
type Beat =
    Pin<Box<dyn Future<Output = (Instant, Result<Option<Duration>, TransportError>)> + Send>>;

fn beat<T: Transport>(
    transport: Arc<T>,
    worker: Holder,
    claim: &Claim,
    stall: Option<Duration>,
) -> Beat {
    let (task_id, token, kind) = (claim.task_id, claim.token, claim.kind.clone());
    Box::pin(async move {
        let claim = ClaimRef {
            worker: &worker,
            task_id,
            token,
            kind: &kind,
        };
        if let Some(stall) = stall {
            tracing::warn!(worker = %worker, task_id, stall_ms = stall.as_millis() as u64,
                "chaos: stalling before a heartbeat (latency spike)");
            sleep(stall).await;
        }
        let sent = Instant::now();
        let answer = transport.heartbeat(claim).await;
        (sent, answer)
    })
}

/// The in-flight heartbeat's answer; never ready when there is none.
async fn answer(beat: &mut Option<Beat>) -> (Instant, Result<Option<Duration>, TransportError>) {
    match beat {
        Some(beat) => beat.as_mut().await,
        None => std::future::pending().await,
    }
}

/// A handler at work on one claim, polled by the loop (so a pause freezes
/// it too), its panics caught.
struct Running(futures::future::CatchUnwind<AssertUnwindSafe<super::handler::HandlerFuture>>);

impl Running {
    fn start(handler: &dyn Handler, claim: &Claim, ctx: TaskContext) -> Self {
        Running(AssertUnwindSafe(handler.handle(claim.job(), ctx)).catch_unwind())
    }
}

/// The message of a caught panic.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// One worker: the loop and its state.
pub struct Worker<T> {
    id: Holder,
    transport: Arc<T>,
    handlers: Handlers,
    config: WorkerConfig,
    chaos: Chaos,
    wake: WorkSignal,
    cancels: CancelSignal,
    stop: CancellationToken,
    drain: CancellationToken,
    commands: mpsc::UnboundedReceiver<Command>,
    tally: Arc<Tally>,
    last_report: Instant,
}

impl<T: Transport> Worker<T> {
    /// A worker named `id` (its holder name in every claim) that runs
    /// `handlers`, and the controls that stop or pause it. `chaos` stalls
    /// its heartbeats and jitters its polls (see [`Chaos`]).
    pub fn new(
        id: Holder,
        transport: T,
        handlers: Handlers,
        config: WorkerConfig,
        chaos: Chaos,
    ) -> (Self, Controls) {
        let stop = CancellationToken::new();
        let drain = CancellationToken::new();
        let (tx, rx) = mpsc::unbounded_channel();
        let worker = Worker {
            id,
            transport: Arc::new(transport),
            handlers,
            config,
            chaos,
            wake: WorkSignal::deaf(),
            cancels: CancelSignal::deaf(),
            stop: stop.clone(),
            drain: drain.clone(),
            commands: rx,
            tally: Arc::new(Tally::default()),
            last_report: Instant::now(),
        };
        (
            worker,
            Controls {
                stop,
                drain,
                commands: tx,
            },
        )
    }

    /// Wakes this worker from its idle wait when `wake` hears of new work
    /// (without one it only polls).
    pub fn waking_on(mut self, wake: WorkSignal) -> Self {
        self.wake = wake;
        self
    }

    /// Heartbeats at once, rather than at the next interval, when `cancels`
    /// hears that an operator ended a claim somewhere: if it was this
    /// worker's, the refused heartbeat stops the handler within moments
    /// (see [`CancelSignal`]). Without one, a cancel is found out at the
    /// next heartbeat.
    pub fn hearing_cancels(mut self, cancels: CancelSignal) -> Self {
        self.cancels = cancels;
        self
    }

    /// Runs until stopped or crashed.
    pub async fn run(mut self) -> Exit {
        tracing::info!(worker = %self.id, "worker started");
        self.report(WorkerState::Idle, None, false, true).await;
        let mut failures: u32 = 0;
        loop {
            if self.stop.is_cancelled() || self.drain.is_cancelled() {
                return self.stopped().await;
            }
            // Cancels announced before this claim's request are not about it.
            self.cancels.forget();
            // Not raced against stop: a claim the queue granted must be
            // known here, so that stopping can give it back.
            let sent = Instant::now();
            let wait = match self.transport.claim(&self.id).await {
                Ok(Some(claim)) => {
                    failures = 0;
                    match self.work(claim, sent).await {
                        Flow::Claim => continue,
                        Flow::Exit(exit) => return exit,
                    }
                }
                Ok(None) => {
                    failures = 0;
                    self.chaos.jitter(self.config.poll.clone())
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(worker = %self.id, error = %e, "cannot claim a task; retrying");
                    self.config.claim_retry * failures.min(5)
                }
            };
            if let Some(exit) = self.idle(wait).await {
                return exit;
            }
        }
    }

    /// Waits `wait` between claims, obeying stop and pause.
    async fn idle(&mut self, wait: Duration) -> Option<Exit> {
        if self.last_report.elapsed() >= self.config.heartbeat_interval {
            // Idle workers report now and then, so the table can tell they live.
            self.report(WorkerState::Idle, None, false, false).await;
        }
        tokio::select! {
            biased;
            () = self.stop.cancelled() => Some(self.stopped().await),
            () = self.drain.cancelled() => Some(self.stopped().await),
            Some(Command::Pause(duration)) = self.commands.recv() => {
                if self.freeze(duration, None).await {
                    return Some(self.stopped().await);
                }
                self.report(WorkerState::Idle, None, false, false).await;
                None
            }
            _ = self.wake.wait(wait) => None,
        }
    }

    /// Works on `claim`, whose request was sent at `sent`.
    async fn work(&mut self, claim: Claim, sent: Instant) -> Flow {
        let remaining = claim.remaining.unwrap_or(self.config.lease_ttl);
        let mut deadline = sent + trusted(remaining);
        let mut interval = self.config.heartbeat_interval.min(remaining / 3);
        tracing::debug!(worker = %self.id, task_id = claim.task_id, token = claim.token,
            kind = %claim.kind, "claimed a task");
        self.report(WorkerState::Working, Some(&claim), true, false)
            .await;
        let Some(handler) = self.handlers.get(&claim.kind).cloned() else {
            let why = format!(
                "no handler for task kind {:?} on worker {}",
                claim.kind, self.id
            );
            self.give_back(&claim, &why, AttemptOutcome::GivenBack)
                .await;
            return Flow::Claim;
        };
        let lost = CancellationToken::new();
        // Cancelled with `lost`, and at the attempt's time limit.
        let cancelled = lost.child_token();
        let ctx = TaskContext {
            worker: self.id.clone(),
            lost: lost.clone(),
            cancelled: cancelled.clone(),
            database: self.transport.database(),
        };
        let limit = claim
            .timeout
            .or_else(|| self.handlers.timeout_of(&claim.kind));
        // From the claim's send, like the deadline: the attempt began then.
        let time_up = limit.map(|l| sent + l);
        let mut running = Running::start(handler.as_ref(), &claim, ctx);
        let mut next_beat = sent + interval;
        let mut in_flight: Option<Beat> = None;
        // A cancel was announced: heartbeat now (or again, once the beat in
        // flight, perhaps sent before the cancel, is answered).
        let mut beat_now = false;
        let (result, paused) = loop {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => {
                    drop(in_flight.take());
                    lost.cancel();
                    drop(running);
                    self.give_back(&claim, &format!("worker {} stopped before finishing", self.id),
                        AttemptOutcome::GivenBack).await;
                    return Flow::Exit(self.stopped().await);
                }
                () = sleep_until(deadline), if !self.config.trust_claims => {
                    return self.lose(&claim, &lost, running,
                        "its local deadline passed without an accepted heartbeat").await;
                }
                () = sleep_until(time_up.unwrap_or(deadline)), if time_up.is_some() => {
                    drop(in_flight.take());
                    let limit = limit.unwrap_or_default();
                    return self.time_out(&claim, &cancelled, running, limit).await;
                }
                Some(Command::Pause(duration)) = self.commands.recv() => {
                    drop(in_flight.take());
                    if self.freeze(duration, Some(&claim)).await {
                        return Flow::Exit(self.stopped().await);
                    }
                    // Resumed, as a process after a long GC pause: it still
                    // believes it holds the claim, so no heartbeat and no
                    // deadline; it finishes and writes its completion, which
                    // the fencing token refuses if the task was taken over.
                    tokio::select! {
                        biased;
                        () = self.stop.cancelled() => {
                            lost.cancel();
                            drop(running);
                            return Flow::Exit(self.stopped().await);
                        }
                        result = &mut running.0 => break (result, true),
                    }
                }
                (beat_sent, answer) = answer(&mut in_flight) => {
                    in_flight = None;
                    match answer {
                        Ok(remaining) => {
                            let remaining = remaining.unwrap_or(self.config.lease_ttl);
                            deadline = beat_sent + trusted(remaining);
                            interval = self.config.heartbeat_interval.min(remaining / 3);
                            next_beat = beat_sent + interval;
                            self.report(WorkerState::Working, Some(&claim), true, false).await;
                        }
                        Err(TransportError::Lost(why)) if !self.config.trust_claims => {
                            return self.lose(&claim, &lost, running,
                                &format!("heartbeat refused: {why}")).await;
                        }
                        Err(TransportError::Lost(why)) => {
                            tracing::warn!(worker = %self.id, task_id = claim.task_id, error = %why,
                                "heartbeat refused; working on regardless (--trust-claims)");
                            next_beat = Instant::now() + interval;
                        }
                        Err(TransportError::Transient(why)) => {
                            tracing::warn!(worker = %self.id, task_id = claim.task_id, error = %why,
                                "heartbeat failed; retrying while the deadline allows");
                            next_beat = Instant::now() + interval.min(Duration::from_secs(1));
                        }
                    }
                }
                result = &mut running.0 => break (result, false),
                () = self.cancels.heard() => beat_now = true,
                () = sleep_until(if beat_now { Instant::now() } else { next_beat }), if in_flight.is_none() => {
                    beat_now = false;
                    let stall = self.chaos.stall_before_heartbeat();
                    in_flight = Some(beat(self.transport.clone(), self.id.clone(), &claim, stall));
                }
            }
        };
        drop(in_flight);
        if !paused && !self.config.trust_claims && Instant::now() >= deadline {
            self.abandon(&claim, "its local deadline passed before completion")
                .await;
            return Flow::Claim;
        }
        match result {
            Err(panic) => {
                let why = format!("the handler panicked: {}", panic_message(&*panic));
                tracing::error!(worker = %self.id, task_id = claim.task_id, error = %why, "handler panicked");
                self.give_back(&claim, &why, AttemptOutcome::Failed).await;
                Flow::Claim
            }
            Ok(Err(e)) if e.is::<SimulatedCrash>() => Flow::Exit(Exit::Crashed),
            Ok(Err(e)) => {
                self.give_back(&claim, &e.to_string(), AttemptOutcome::Failed)
                    .await;
                Flow::Claim
            }
            Ok(Ok(done)) if let Err(why) = crate::json::storable(&done.output, "its output") => {
                // Stored, it could not be read back (and the task with it):
                // a failed attempt, and the handler's writes roll back with
                // its transaction.
                let why = format!("the handler's answer cannot be stored: {why}");
                self.give_back(&claim, &why, AttemptOutcome::Failed).await;
                Flow::Claim
            }
            Ok(Ok(done)) if let Some(delay) = done.snooze => {
                match self.transport.snooze(claim.by(&self.id), delay).await {
                    Ok(()) => {
                        tracing::debug!(worker = %self.id, task_id = claim.task_id,
                            delay_ms = delay.as_millis() as u64, "snoozed a task");
                    }
                    Err(TransportError::Lost(why)) => {
                        self.abandon(&claim, &format!("snooze refused: {why}"))
                            .await;
                        return Flow::Claim;
                    }
                    Err(TransportError::Transient(why)) => {
                        // Not snoozed: the attempt fails instead (retried
                        // after the backoff), rather than waiting out the lease.
                        self.give_back(
                            &claim,
                            &format!("could not snooze: {why}"),
                            AttemptOutcome::Failed,
                        )
                        .await;
                        return Flow::Claim;
                    }
                }
                self.report(WorkerState::Idle, None, false, false).await;
                Flow::Claim
            }
            Ok(Ok(done)) => match done.transaction {
                None => {
                    // A batching transport takes the completion over (and
                    // counts it when written); the worker is free at once.
                    let handed = self
                        .transport
                        .complete_later(
                            &self.id,
                            &claim,
                            done.output.clone(),
                            deadline,
                            &self.tally,
                        )
                        .await;
                    if handed {
                        self.report(WorkerState::Idle, None, false, false).await;
                        Flow::Claim
                    } else {
                        self.complete(&claim, &done.output, deadline).await
                    }
                }
                Some(tx) => self.complete_in(tx, &claim, &done.output).await,
            },
        }
    }

    /// The claim is lost: signals the handler, gives it
    /// [`WorkerConfig::lost_grace`] to return (discarding what it answers),
    /// and abandons the task.
    async fn lose(
        &mut self,
        claim: &Claim,
        lost: &CancellationToken,
        mut running: Running,
        why: &str,
    ) -> Flow {
        lost.cancel();
        let _ = tokio::time::timeout(self.config.lost_grace, &mut running.0).await;
        drop(running);
        self.abandon(claim, why).await;
        Flow::Claim
    }

    /// The attempt ran past its time limit `limit`: cancels the handler's
    /// context, gives it [`WorkerConfig::lost_grace`] to return (discarding
    /// what it answers; its fenced transaction rolls back), and fails the
    /// attempt ("timed out after …").
    async fn time_out(
        &mut self,
        claim: &Claim,
        cancelled: &CancellationToken,
        mut running: Running,
        limit: Duration,
    ) -> Flow {
        cancelled.cancel();
        let _ = tokio::time::timeout(self.config.lost_grace, &mut running.0).await;
        drop(running);
        self.give_back(
            claim,
            &format!("timed out after {limit:?}"),
            AttemptOutcome::TimedOut,
        )
        .await;
        Flow::Claim
    }

    /// Completes `claim` in the handler's transaction `tx`: its writes
    /// commit with the completion or not at all. Not retried: a failed
    /// commit leaves nothing behind, and the lease runs out.
    async fn complete_in(&mut self, tx: FencedTransaction, claim: &Claim, output: &Value) -> Flow {
        match tx
            .complete(claim.task_id, &self.id, claim.token, Some(output))
            .await
        {
            Ok(_) => {
                self.tally.done.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(worker = %self.id, task_id = claim.task_id, token = claim.token,
                    "completed a task with its transaction");
                self.report(WorkerState::Idle, None, false, false).await;
            }
            Err(crate::queue::store::TaskError::Stale { reason, .. }) => {
                self.abandon(
                    claim,
                    &format!("completion refused, its writes rolled back: {reason}"),
                )
                .await;
            }
            Err(e) => {
                self.abandon(
                    claim,
                    &format!("completion with its transaction failed: {e}"),
                )
                .await;
            }
        }
        Flow::Claim
    }

    /// Sends the completion, retrying transient failures until the deadline.
    async fn complete(&mut self, claim: &Claim, output: &Value, deadline: Instant) -> Flow {
        loop {
            match self.transport.complete(claim.by(&self.id), output).await {
                Ok(()) => {
                    self.tally.done.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(worker = %self.id, task_id = claim.task_id, token = claim.token, "completed a task");
                    self.report(WorkerState::Idle, None, false, false).await;
                    return Flow::Claim;
                }
                Err(TransportError::Lost(why)) => {
                    self.abandon(claim, &format!("completion refused: {why}"))
                        .await;
                    return Flow::Claim;
                }
                Err(TransportError::Transient(why)) => {
                    let retry = Duration::from_millis(250);
                    if Instant::now() + retry >= deadline && !self.config.trust_claims {
                        self.abandon(
                            claim,
                            &format!("completion failed and the deadline passed: {why}"),
                        )
                        .await;
                        return Flow::Claim;
                    }
                    tracing::warn!(worker = %self.id, task_id = claim.task_id, error = %why, "completion failed; retrying");
                    tokio::select! {
                        biased;
                        () = self.stop.cancelled() => return Flow::Exit(self.stopped().await),
                        () = sleep(retry) => {}
                    }
                }
            }
        }
    }

    /// Freezes for `duration`; true when stopped meanwhile.
    async fn freeze(&mut self, duration: Duration, claim: Option<&Claim>) -> bool {
        tracing::warn!(worker = %self.id, pause_ms = duration.as_millis() as u64,
            task_id = claim.map(|c| c.task_id), "paused: no ticks, no heartbeats");
        self.report(WorkerState::Paused, claim, false, false).await;
        tokio::select! {
            biased;
            () = self.stop.cancelled() => true,
            () = sleep(duration) => false,
        }
    }

    /// Gives up `claim` without writing anything: the lease runs out.
    async fn abandon(&mut self, claim: &Claim, why: &str) {
        self.tally.abandoned.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(worker = %self.id, task_id = claim.task_id, token = claim.token, reason = why,
            "abandoning the task: the claim is lost");
        self.report(WorkerState::Idle, None, false, false).await;
    }

    /// Reports the attempt at `claim` as failed with `why` (the queue
    /// retries it after a backoff, or marks it failed after its attempts),
    /// its record ending as `outcome`.
    async fn give_back(&mut self, claim: &Claim, why: &str, outcome: AttemptOutcome) {
        // Cut here too: over REST a longer message would be refused (400)
        // and the task would wait out its lease instead of being retried.
        let why = &*crate::queue::store::bounded_error(why);
        match self
            .transport
            .fail_as(claim.by(&self.id), why, outcome)
            .await
        {
            Ok(()) => {
                tracing::warn!(worker = %self.id, task_id = claim.task_id, reason = why, "gave the task back as failed");
            }
            Err(e) => {
                tracing::warn!(worker = %self.id, task_id = claim.task_id, error = %e,
                    "could not give the task back; its lease will run out");
            }
        }
        self.report(WorkerState::Idle, None, false, false).await;
    }

    async fn stopped(&mut self) -> Exit {
        // Claims taken ahead for this worker go back now, not at their bound.
        self.transport.forget(&self.id);
        tracing::info!(worker = %self.id, done = self.tally.done(), abandoned = self.tally.abandoned(),
            "worker stopped");
        self.report(WorkerState::Stopped, None, false, false).await;
        Exit::Stopped
    }

    /// Records what the worker does; a failure is logged, never fatal.
    async fn report(
        &mut self,
        state: WorkerState,
        claim: Option<&Claim>,
        heartbeat: bool,
        fresh: bool,
    ) {
        self.last_report = Instant::now();
        let report = Report {
            state,
            task_id: claim.map(|c| c.task_id),
            fencing_token: claim.map(|c| c.token),
            heartbeat,
            tasks_done: self.tally.done(),
            tasks_abandoned: self.tally.abandoned(),
            fresh,
        };
        let sent = tokio::time::timeout(
            self.config.report_timeout,
            self.transport.report(&self.id, &report),
        )
        .await;
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(worker = %self.id, error = %e, "could not record the worker's state");
            }
            Err(_) => {
                tracing::debug!(worker = %self.id, "recording the worker's state timed out");
            }
        }
    }
}

#[cfg(test)]
mod tests;

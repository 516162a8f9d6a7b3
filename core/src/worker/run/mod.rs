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
//! - A graceful stop fails the attempt at once, as `interrupted` (the task
//!   is retried after a short backoff), instead of making it wait out the
//!   lease.
//! - A refused credential ([`TransportError::Unauthorized`], HTTP 401/403)
//!   stops the worker with [`Exit::Unauthorized`] instead of retrying
//!   forever. The queue acted on nothing it refused: a refused claim
//!   claimed nothing, and a claim whose heartbeat or completion was refused
//!   is abandoned like a lost one, its lease left to run out so that
//!   another worker takes the task over.
//!
//! The demo's faults (chaos stalls, pauses, trusting claims, a simulated
//! crash) reach the loop through one seam, `chaos::Faults`: in production each
//! of its answers leaves the loop to the rules above.
//!
//! The work itself is the [`Handler`](super::handler::Handler) registered
//! for the task's kind. It runs inside the loop (polled, not spawned), so a
//! pause freezes it too; a panic in it is caught and reported as a failed
//! attempt. When the claim is lost, the handler's
//! [`lease_lost`](super::handler::TaskContext::lease_lost) and
//! [`cancelled`](super::handler::TaskContext::cancelled) signals fire and
//! it gets [`WorkerConfig::lost_grace`] to return; whatever it answers then
//! is discarded. A task whose kind has no handler fails its attempt.
//!
//! An operator's cancel ends the claim in the database;
//! a worker [hearing cancels](Worker::hearing_cancels) heartbeats at once
//! on the announcement, is refused, and so loses the claim within moments
//! instead of at its next heartbeat.

mod heartbeat;
mod pause;
mod running;
mod status;

use super::chaos::{Chaos, Command, Faults};
use super::handler::{Handlers, Later, TaskContext};
use super::transport::{Claim, Tally, Transport, TransportError};
use crate::lease::Holder;
use crate::liveness::LivenessSignal;
use crate::queue::AttemptOutcome;
use crate::queue::store::FencedTransaction;
use crate::queue::wake::{CancelSignal, WorkSignal};
use heartbeat::{Beat, answer, beat};
use running::{Running, panic_message};
use serde_json::Value;
use status::Status;
use std::ops::RangeInclusive;
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Stopped gracefully.
    Stopped,
    /// Crashed (chaos): stopped dead, nothing completed or released.
    Crashed,
    /// The queue refused the worker's credential (HTTP 401 or 403, with the
    /// server's reason): no retry could succeed. A claim in hand was
    /// abandoned; its lease runs out and another worker takes it over.
    Unauthorized(String),
}

/// What to do after working on one claim.
enum Flow {
    /// Go back to claiming.
    Claim,
    /// Leave the loop.
    Exit(Exit),
}

/// Sleeps until `at`; never wakes when there is no such instant.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One worker: the loop and its state.
pub struct Worker<T> {
    id: Holder,
    transport: Arc<T>,
    handlers: Handlers,
    config: WorkerConfig,
    /// The demo's fault injection; nothing happens through it in production.
    faults: Faults,
    wake: WorkSignal,
    cancels: CancelSignal,
    /// The process's liveness session: claims are made only while it is
    /// in force, and given up the moment it is lost.
    liveness: LivenessSignal,
    stop: CancellationToken,
    drain: CancellationToken,
    tally: Arc<Tally>,
    last_report: Instant,
    /// Set when any call was answered [`TransportError::Unauthorized`]: the
    /// loop stops at the next turn, with this reason.
    refused: Option<String>,
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
            faults: Faults::new(chaos, config.trust_claims, rx),
            config,
            wake: WorkSignal::deaf(),
            cancels: CancelSignal::deaf(),
            liveness: LivenessSignal::none(),
            stop: stop.clone(),
            drain: drain.clone(),
            tally: Arc::new(Tally::default()),
            last_report: Instant::now(),
            refused: None,
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

    /// Claims only while `liveness` (its process's liveness session, see
    /// [`crate::liveness`]) is in force, and gives a claim up the moment
    /// the session under which it was made is lost: another process may
    /// already be rescuing it. Without one, the TTL alone rules.
    pub fn vouched_by(mut self, liveness: LivenessSignal) -> Self {
        self.liveness = liveness;
        self
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

    /// Runs until stopped, crashed, or refused its credential.
    pub async fn run(mut self) -> Exit {
        tracing::info!(worker = %self.id, "worker started");
        self.report(Status::idle().first_of_run()).await;
        let mut failures: u32 = 0;
        loop {
            if let Some(why) = self.refused.take() {
                return self.unauthorized(why);
            }
            if self.stop.is_cancelled() || self.drain.is_cancelled() {
                return self.stopped().await;
            }
            // No claim without a liveness session in force: one made while
            // it is down could be rescued from under the handler.
            let Some(session) = self.liveness.session() else {
                tokio::select! {
                    biased;
                    () = self.stop.cancelled() => return self.stopped().await,
                    () = self.drain.cancelled() => return self.stopped().await,
                    _ = self.liveness.up() => continue,
                }
            };
            // Cancels announced before this claim's request are not about it.
            self.cancels.forget();
            // Not raced against stop: a claim the queue granted must be
            // known here, so that stopping can give it back.
            let sent = Instant::now();
            let wait = match self.transport.claim(&self.id).await {
                Ok(Some(claim)) => {
                    failures = 0;
                    match self.work(claim, sent, session).await {
                        Flow::Claim => continue,
                        Flow::Exit(exit) => return exit,
                    }
                }
                Ok(None) => {
                    failures = 0;
                    self.faults.poll_wait(self.config.poll.clone())
                }
                Err(TransportError::Unauthorized(why)) => return self.unauthorized(why),
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
            self.report(Status::idle()).await;
        }
        tokio::select! {
            biased;
            () = self.stop.cancelled() => Some(self.stopped().await),
            () = self.drain.cancelled() => Some(self.stopped().await),
            duration = self.faults.pause_ordered() => {
                if self.freeze(duration, None).await {
                    return Some(self.stopped().await);
                }
                self.report(Status::idle()).await;
                None
            }
            _ = self.wake.wait(wait) => None,
        }
    }

    /// Works on `claim`, whose request was sent at `sent` under liveness
    /// session `session`.
    async fn work(&mut self, claim: Claim, sent: Instant, session: u64) -> Flow {
        let remaining = claim.remaining.unwrap_or(self.config.lease_ttl);
        let mut deadline = sent + trusted(remaining);
        let mut interval = self.config.heartbeat_interval.min(remaining / 3);
        tracing::debug!(worker = %self.id, task_id = claim.task_id, token = claim.token,
            kind = %claim.kind, "claimed a task");
        self.report(Status::working(&claim).just_accepted()).await;
        let Some(handler) = self.handlers.get(&claim.kind).cloned() else {
            let why = format!(
                "no handler for task kind {:?} on worker {}",
                claim.kind, self.id
            );
            self.fail_attempt(&claim, &why, AttemptOutcome::Interrupted)
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
        // The handler's answer, and when the claim stops being trusted for
        // its completion (never once a pause made the worker believe it
        // still holds the claim, or when it trusts its claims).
        let (result, gives_up_at) = loop {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => {
                    drop(in_flight.take());
                    lost.cancel();
                    drop(running);
                    self.fail_attempt(&claim, &format!("worker {} stopped before finishing", self.id),
                        AttemptOutcome::Interrupted).await;
                    return Flow::Exit(self.stopped().await);
                }
                () = until(self.faults.gives_up_at(deadline)) => {
                    return self.lose(&claim, &lost, running,
                        "its local deadline passed without an accepted heartbeat").await;
                }
                () = self.liveness.ended(session) => {
                    drop(in_flight.take());
                    return self.lose(&claim, &lost, running,
                        "its liveness (its process's session, or its stream to the instance) was lost").await;
                }
                () = sleep_until(time_up.unwrap_or(deadline)), if time_up.is_some() => {
                    drop(in_flight.take());
                    let limit = limit.unwrap_or_default();
                    return self.time_out(&claim, &cancelled, running, limit).await;
                }
                duration = self.faults.pause_ordered() => {
                    drop(in_flight.take());
                    match self.pause_mid_task(duration, &claim, &mut running).await {
                        Some(result) => break (result, None),
                        None => {
                            lost.cancel();
                            drop(running);
                            return Flow::Exit(self.stopped().await);
                        }
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
                            self.report(Status::working(&claim).just_accepted()).await;
                        }
                        Err(TransportError::Unauthorized(why)) => {
                            let lost_because = format!("heartbeat refused the credential: {why}");
                            self.refused = Some(why);
                            return self.lose(&claim, &lost, running, &lost_because).await;
                        }
                        Err(TransportError::Lost(why)) if !self.faults.works_on_when_refused() => {
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
                result = &mut running.0 => break (result, self.faults.gives_up_at(deadline)),
                () = self.cancels.heard() => beat_now = true,
                () = sleep_until(if beat_now { Instant::now() } else { next_beat }), if in_flight.is_none() => {
                    beat_now = false;
                    let stall = self.faults.stall_before_heartbeat();
                    in_flight = Some(beat(self.transport.clone(), self.id.clone(), &claim, stall));
                }
            }
        };
        drop(in_flight);
        if gives_up_at.is_some_and(|at| Instant::now() >= at) {
            self.abandon(&claim, "its local deadline passed before completion")
                .await;
            return Flow::Claim;
        }
        match result {
            Err(panic) => {
                let why = format!("the handler panicked: {}", panic_message(&*panic));
                tracing::error!(worker = %self.id, task_id = claim.task_id, error = %why, "handler panicked");
                self.fail_attempt(&claim, &why, AttemptOutcome::Failed)
                    .await;
                Flow::Claim
            }
            Ok(Err(e)) if Faults::crashes_on(&e) => Flow::Exit(Exit::Crashed),
            Ok(Err(e)) => {
                self.fail_attempt(&claim, &e.to_string(), AttemptOutcome::Failed)
                    .await;
                Flow::Claim
            }
            Ok(Ok(done)) if let Err(why) = crate::json::storable(&done.output, "its output") => {
                // Stored, it could not be read back (and the task with it):
                // a failed attempt, and the handler's writes roll back with
                // its transaction.
                let why = format!("the handler's answer cannot be stored: {why}");
                self.fail_attempt(&claim, &why, AttemptOutcome::Failed)
                    .await;
                Flow::Claim
            }
            Ok(Ok(done)) if let Some(later) = done.later.clone() => {
                let (what, sent) = match &later {
                    Later::Snooze(delay) => (
                        "snooze",
                        self.transport.snooze(claim.by(&self.id), *delay).await,
                    ),
                    Later::Wait(signal, timeout) => (
                        "wait",
                        self.transport
                            .wait_for(claim.by(&self.id), signal, *timeout)
                            .await,
                    ),
                };
                match sent {
                    Ok(()) => {
                        tracing::debug!(worker = %self.id, task_id = claim.task_id, ?later,
                            "a task's attempt ended for later");
                    }
                    Err(TransportError::Lost(why)) => {
                        self.abandon(&claim, &format!("{what} refused: {why}"))
                            .await;
                        return Flow::Claim;
                    }
                    Err(TransportError::Unauthorized(why)) => {
                        self.abandon(&claim, &format!("{what} refused the credential: {why}"))
                            .await;
                        self.refused = Some(why);
                        return Flow::Claim;
                    }
                    Err(TransportError::Transient(why)) => {
                        // Not done: the attempt fails instead (retried
                        // after the backoff), rather than waiting out the lease.
                        self.fail_attempt(
                            &claim,
                            &format!("could not {what}: {why}"),
                            AttemptOutcome::Failed,
                        )
                        .await;
                        return Flow::Claim;
                    }
                }
                self.report(Status::idle()).await;
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
                        self.report(Status::idle()).await;
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
        self.transport.gave_up(&self.id, claim);
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
        self.fail_attempt(
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
                self.report(Status::idle()).await;
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
                    self.report(Status::idle()).await;
                    return Flow::Claim;
                }
                Err(TransportError::Lost(why)) => {
                    self.abandon(claim, &format!("completion refused: {why}"))
                        .await;
                    return Flow::Claim;
                }
                Err(TransportError::Unauthorized(why)) => {
                    self.abandon(claim, &format!("completion refused the credential: {why}"))
                        .await;
                    self.refused = Some(why);
                    return Flow::Claim;
                }
                Err(TransportError::Transient(why)) => {
                    let retry = Duration::from_millis(250);
                    let gives_up_at = self.faults.gives_up_at(deadline);
                    if gives_up_at.is_some_and(|at| Instant::now() + retry >= at) {
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

    /// Gives up `claim` without writing anything: the lease runs out.
    async fn abandon(&mut self, claim: &Claim, why: &str) {
        self.tally.abandoned.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(worker = %self.id, task_id = claim.task_id, token = claim.token, reason = why,
            "abandoning the task: the claim is lost");
        self.report(Status::idle()).await;
    }

    /// Fails the attempt at `claim` with `why`, its record ending as
    /// `outcome`: the attempt is spent, and the queue retries the task after
    /// a backoff, or marks it failed after its attempts.
    async fn fail_attempt(&mut self, claim: &Claim, why: &str, outcome: AttemptOutcome) {
        // Cut here too: over REST a longer message would be refused (400)
        // and the task would wait out its lease instead of being retried.
        let why = &*crate::queue::store::bounded_error(why);
        match self
            .transport
            .fail_as(claim.by(&self.id), why, outcome)
            .await
        {
            Ok(()) => {
                tracing::warn!(worker = %self.id, task_id = claim.task_id, reason = why, "failed the attempt (spent; retried after a backoff or failed for good)");
            }
            Err(e) => {
                tracing::warn!(worker = %self.id, task_id = claim.task_id, error = %e,
                    "could not fail the attempt; its lease will run out");
                if let TransportError::Unauthorized(why) = e {
                    self.refused = Some(why);
                }
            }
        }
        self.report(Status::idle()).await;
    }

    /// The queue refused this worker's credential: it stops (claims taken
    /// ahead go back; nothing else is written, as it would be refused too).
    fn unauthorized(&mut self, why: String) -> Exit {
        self.transport.forget(&self.id);
        tracing::error!(worker = %self.id, error = %why,
            "the queue refused this worker's credential; stopping");
        Exit::Unauthorized(why)
    }

    async fn stopped(&mut self) -> Exit {
        // Claims taken ahead for this worker go back now, not at their bound.
        self.transport.forget(&self.id);
        tracing::info!(worker = %self.id, done = self.tally.done(), abandoned = self.tally.abandoned(),
            "worker stopped");
        self.report(Status::stopped()).await;
        Exit::Stopped
    }
}

#[cfg(test)]
mod tests;

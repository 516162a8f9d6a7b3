//! Prefetch: the workers' local queues of claims waiting behind the task
//! each runs, and every way a waiting claim leaves its queue.
//!
//! With [`Prefetch::per_worker`] above 0, a worker may have claims waiting
//! in a local queue besides the task it runs. A worker that finishes a
//! task takes the next from its local queue at once, without a round trip
//! (the producer then tops the queue up, in its next statement, with every
//! other top-up and free worker's claim: one commit claims many tasks).
//! How far ahead the producer claims adapts ([`Depth`]): it doubles while
//! a claim gets all it asked for, and halves when it gets fewer (the queue
//! drains) or a claim waited past its bound, so an idle or shallow queue
//! is claimed one task per free worker, as without prefetch. Only a claim
//! that waited past its bound says the producer claims too far ahead: one
//! given back because its worker stopped, the runtime closed, or its lease
//! ran low says nothing of the depth.
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
//!   `given_back` in its attempts and its lease's history) for each reason
//!   of [`Leave`] but a refused renewal: when it waited longer than
//!   [`Prefetch::max_wait`], when its worker stops, and all of them at the
//!   start of a graceful stop
//!   ([`InProcess::give_back_waiting`](crate::worker::in_process::InProcess::give_back_waiting));
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

#[cfg(doc)]
use super::Prefetch;
use super::held::Held;
use super::{Answer, Setup};
use crate::lease::Holder;
use crate::queue::store::{self, MAX_BATCH};
use crate::worker::transport::{Claim, TransportError, ms};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

/// A claim waiting in a worker's local queue.
#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) claim: Claim,
    /// The monotonic instant just before the statement that last set the
    /// lease (the claim or a renewal) was sent.
    pub(super) sent: Instant,
    /// What the database said was left of the lease then.
    pub(super) remaining: Duration,
    /// When it was claimed: it waits at most [`Prefetch::max_wait`].
    pub(super) since: Instant,
}

impl Waiting {
    /// A claim just made by the statement sent at `sent`; its lease as the
    /// database said (`ttl` if unknown).
    pub(super) fn claimed(claim: Claim, sent: Instant, ttl: Duration) -> Self {
        Waiting {
            remaining: claim.remaining.unwrap_or(ttl),
            claim,
            sent,
            since: sent,
        }
    }

    /// What is surely left of its lease now, by the local clock: the
    /// database's remainder, less the time since the statement was sent.
    fn left(&self) -> Duration {
        self.remaining.saturating_sub(self.sent.elapsed())
    }
}

/// Why a claim left its worker's local queue without being run. The two
/// other fates of a waiting claim are not leaves: **taken** by its worker
/// ([`Local::take`], the claim already the worker's: nothing to write) and
/// **renewed** (it stays, with a fresh lease). Each reason's consequence
/// is decided in one place, [`sort`]: a new reason is a new variant there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Leave {
    /// Its worker came for it with less than a third of its lease left:
    /// too little to hand over.
    TooLate,
    /// It waited past [`Prefetch::max_wait`] behind its worker's task: the
    /// one reason that says the producer claims too far ahead.
    TimedOut,
    /// Its worker was stuck on a slow task while another worker of the
    /// runtime was idle: given back for the idle worker to claim.
    Stolen,
    /// Its renewal was refused (the lease ran out and the task was taken
    /// over, or cancelled): it is no longer this runtime's, nothing to
    /// write.
    RenewalRefused(String),
    /// Its worker stopped.
    Forgotten,
    /// A graceful stop gives back every waiting claim.
    Closed,
    /// The reply that carried it could not reach its worker (the worker's
    /// loop ended while it asked), or it was queued for such a worker.
    Unsent,
    /// Every handle of the batcher is gone: nothing will take it.
    Ended,
}

/// A claim out of its worker's local queue, and why.
#[derive(Debug)]
pub(super) struct Left {
    pub(super) worker: Holder,
    pub(super) waiting: Waiting,
    pub(super) why: Leave,
}

impl Left {
    fn all(
        why: Leave,
        worker: Holder,
        queue: impl IntoIterator<Item = Waiting>,
    ) -> impl Iterator<Item = Left> {
        queue.into_iter().map(move |waiting| Left {
            worker: worker.clone(),
            waiting,
            why: why.clone(),
        })
    }
}

/// How many claims a local queue is filled to: adapts between 0 and
/// [`Prefetch::per_worker`] (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Depth {
    ahead: usize,
    most: usize,
}

impl Depth {
    /// Starts at one claim ahead (none when prefetch is off).
    pub(super) fn new(per_worker: usize) -> Self {
        Depth {
            ahead: per_worker.min(1),
            most: per_worker,
        }
    }

    /// How many claims a local queue is filled to now.
    pub(super) fn ahead(&self) -> usize {
        self.ahead
    }

    /// A claim asked for `asked` tasks and got `got`: all of them, claim
    /// further ahead; fewer (the queue drains), less far.
    pub(super) fn claimed(&mut self, asked: usize, got: usize) {
        self.ahead = if got >= asked {
            (self.ahead * 2).clamp(1, self.most)
        } else {
            self.ahead / 2
        };
    }

    /// A claim waited past its bound: claim less far ahead.
    fn waited_too_long(&mut self) {
        self.ahead /= 2;
    }
}

/// The one place that decides what follows each way a claim leaves its
/// local queue: which claims go back to the queue (the answer), which are
/// dropped, and whether the depth shortens.
pub(super) fn sort(left: Vec<Left>, depth: &mut Depth) -> Vec<(i64, i64, Holder)> {
    let mut back = Vec::with_capacity(left.len());
    let mut shorten = false;
    for Left {
        worker,
        waiting,
        why,
    } in left
    {
        let claim = (waiting.claim.task_id, waiting.claim.token, worker);
        match why {
            Leave::TimedOut => {
                shorten = true;
                back.push(claim);
            }
            // Not a sign of claiming too far ahead: one worker stopping
            // must not make every other worker claim less.
            Leave::TooLate
            | Leave::Stolen
            | Leave::Forgotten
            | Leave::Closed
            | Leave::Unsent
            | Leave::Ended => back.push(claim),
            Leave::RenewalRefused(error) => {
                let (task_id, token, worker) = claim;
                tracing::warn!(worker = %worker, task_id, token, error = %error,
                    "a waiting claim was lost before its worker took it");
            }
        }
    }
    if shorten {
        depth.waited_too_long();
    }
    back
}

/// Settles claims that left their local queues: [`sort`], then gives back
/// what goes back.
pub(super) async fn settle(setup: &Setup, held: &mut Held, left: Vec<Left>, depth: &mut Depth) {
    let back = sort(left, depth);
    give_back(setup, held, back).await;
}

/// Hands `claim` to the worker waiting on `reply`; if the worker's loop
/// ended meanwhile, the claim comes back as [`Leave::Unsent`].
pub(super) fn hand_over(
    worker: &Holder,
    reply: Answer<Option<Claim>>,
    claim: Claim,
    ttl: Duration,
) -> Option<Left> {
    match reply.send(Ok(Some(claim))) {
        Ok(()) => None,
        Err(Ok(Some(claim))) => {
            let now = Instant::now();
            Some(Left {
                worker: worker.clone(),
                waiting: Waiting::claimed(claim, now, ttl),
                why: Leave::Unsent,
            })
        }
        // What was sent comes back as it was.
        Err(_) => None,
    }
}

/// The workers' local queues, shared by the workers (who take from them
/// without waiting for the producer) and the producer (who fills them,
/// renews them and takes out what must leave).
#[derive(Debug, Default)]
pub(super) struct Local {
    queues: HashMap<Holder, VecDeque<Waiting>>,
    /// Set by [`Local::close`]: nothing more is prefetched.
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
    pub(super) fn handed(&mut self, worker: &Holder) {
        self.handed.insert(worker.clone(), Instant::now());
    }

    /// `worker` asks for a task: if it was running one, the time since it
    /// was handed that task is one sample of the cycle.
    pub(super) fn asked(&mut self, worker: &Holder) {
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

    /// Whether a graceful stop closed the queues (nothing more is
    /// prefetched).
    pub(super) fn closed(&self) -> bool {
        self.closed
    }

    /// How many claims wait in `worker`'s local queue.
    pub(super) fn len(&self, worker: &Holder) -> usize {
        self.queues.get(worker).map_or(0, VecDeque::len)
    }

    /// Queues `claims` for `worker`, behind what waits already.
    pub(super) fn queue(&mut self, worker: Holder, claims: impl IntoIterator<Item = Waiting>) {
        let mut claims = claims.into_iter().peekable();
        if claims.peek().is_some() {
            self.queues.entry(worker).or_default().extend(claims);
        }
    }

    /// The deepest a local queue may be so that its last claim is
    /// expected to start within half of `max_wait`: a worker whose tasks
    /// take 100 ms keeps at most 5 waiting with the default 1 s bound, one
    /// whose tasks take longer than half a second keeps none (it claims only when
    /// free, as without prefetch), so slow handlers do not claim ahead
    /// only to give back. Unknown (no worker has finished a task yet):
    /// no cap.
    pub(super) fn depth_cap(&self, max_wait: Duration) -> usize {
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
    pub(super) fn next_stuck_at(&self) -> Option<Instant> {
        self.stuck_at().map(|(_, at)| at).min()
    }

    /// Takes out up to `n` claims, each the next in line of a worker that
    /// is stuck on its task (see [`Local::stuck_after`]), longest stuck
    /// first: to be given back for idle workers to claim.
    pub(super) fn steal(&mut self, n: usize) -> Vec<Left> {
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
            // A stuck worker has a claim waiting (`stuck_at` looks only at
            // those).
            let Some(waiting) = self.queues.get_mut(&worker).and_then(VecDeque::pop_front) else {
                break;
            };
            taken.push(Left {
                worker,
                waiting,
                why: Leave::Stolen,
            });
        }
        taken
    }

    /// The first claim of `worker`'s local queue with at least `min_left`
    /// of its lease left, its remainder as the worker may trust it (less
    /// the time it waited); and the claims before it that had too little
    /// left ([`Leave::TooLate`]).
    pub(super) fn take(
        &mut self,
        worker: &Holder,
        min_left: Duration,
    ) -> (Option<Claim>, Vec<Left>) {
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
            too_late.push(Left {
                worker: worker.clone(),
                waiting,
                why: Leave::TooLate,
            });
        }
        (None, too_late)
    }

    /// `worker` stopped: everything in its local queue leaves
    /// ([`Leave::Forgotten`]), and its pace is no longer timed.
    pub(super) fn forget(&mut self, worker: &Holder) -> Vec<Left> {
        self.handed.remove(worker);
        let queue = self.queues.remove(worker).unwrap_or_default();
        Left::all(Leave::Forgotten, worker.clone(), queue).collect()
    }

    /// `worker`'s loop ended while a claim was in flight to it: what was
    /// queued for it leaves ([`Leave::Unsent`]).
    pub(super) fn unsent(&mut self, worker: &Holder) -> Vec<Left> {
        let queue = self.queues.remove(worker).unwrap_or_default();
        Left::all(Leave::Unsent, worker.clone(), queue).collect()
    }

    /// A graceful stop: every waiting claim leaves ([`Leave::Closed`]) and
    /// nothing more is prefetched.
    pub(super) fn close(&mut self) -> Vec<Left> {
        self.closed = true;
        self.drain(Leave::Closed)
    }

    /// Every handle is gone: every waiting claim leaves ([`Leave::Ended`]).
    pub(super) fn end(&mut self) -> Vec<Left> {
        self.drain(Leave::Ended)
    }

    fn drain(&mut self, why: Leave) -> Vec<Left> {
        self.queues
            .drain()
            .flat_map(|(worker, queue)| Left::all(why.clone(), worker, queue))
            .collect()
    }

    /// The claims that waited `max_wait` or longer leave
    /// ([`Leave::TimedOut`]); of the others, those whose lease was last set
    /// `renew_after` or longer ago are to be renewed.
    pub(super) fn sweep(
        &mut self,
        max_wait: Duration,
        renew_after: Duration,
    ) -> (Vec<Left>, Vec<(i64, i64, Holder)>) {
        let mut late = Vec::new();
        let mut renew = Vec::new();
        for (worker, queue) in self.queues.iter_mut() {
            let (stay, gone): (VecDeque<Waiting>, VecDeque<Waiting>) =
                queue.drain(..).partition(|w| w.since.elapsed() < max_wait);
            late.extend(Left::all(Leave::TimedOut, worker.clone(), gone));
            for w in &stay {
                if w.sent.elapsed() >= renew_after {
                    renew.push((w.claim.task_id, w.claim.token, worker.clone()));
                }
            }
            *queue = stay;
        }
        (late, renew)
    }

    /// What the renewal of `chunk`, sent at `sent`, answered: each renewed
    /// claim still waiting gets its new lease; each refused one leaves
    /// ([`Leave::RenewalRefused`]). One its worker took meanwhile is the
    /// worker's to heartbeat now.
    fn renewed(
        &mut self,
        sent: Instant,
        chunk: &[(i64, i64, Holder)],
        outcomes: Vec<Result<Option<Duration>, String>>,
    ) -> Vec<Left> {
        let mut refused = Vec::new();
        for ((task_id, token, worker), outcome) in chunk.iter().zip(outcomes) {
            let Some(queue) = self.queues.get_mut(worker) else {
                continue;
            };
            let Some(at) = queue
                .iter()
                .position(|w| w.claim.task_id == *task_id && w.claim.token == *token)
            else {
                continue;
            };
            match outcome {
                Ok(remaining) => {
                    queue[at].sent = sent;
                    queue[at].remaining = remaining.unwrap_or_default();
                }
                Err(error) => {
                    if let Some(waiting) = queue.remove(at) {
                        refused.push(Left {
                            worker: worker.clone(),
                            waiting,
                            why: Leave::RenewalRefused(error),
                        });
                    }
                }
            }
        }
        refused
    }
}

/// The least a worker runs one task before the claims waiting behind it
/// may go to an idle worker of the runtime (see [`Local::stuck_after`]).
const STUCK_AFTER: Duration = Duration::from_millis(100);

/// Renews the waiting claims `renew` in one statement per [`MAX_BATCH`],
/// and updates what the local queues know of their leases. A refused
/// renewal (the claim is no longer this runtime's) drops the claim.
pub(super) async fn renew_waiting(
    setup: &Setup,
    held: &mut Held,
    local: &super::held::Shared<Local>,
    renew: Vec<(i64, i64, Holder)>,
    depth: &mut Depth,
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
                // meanwhile is not handed out (see `Local::take`).
                held.failed(&e);
                tracing::warn!(claims = chunk.len(), error = %e, "could not renew the waiting claims");
                continue;
            }
        };
        let outcomes = outcomes
            .into_iter()
            .map(|o| {
                o.map(|task| ms(task.heartbeat_in_ms))
                    .map_err(|e| e.to_string())
            })
            .collect();
        let refused = local.lock().renewed(sent, chunk, outcomes);
        settle(setup, held, refused, depth).await;
    }
}

/// Gives back `claims` that no worker started on, in one statement per
/// [`MAX_BATCH`] (see [`store::give_back_each`]). One that cannot be given
/// back (the database failed) waits out its lease and is taken over.
async fn give_back(setup: &Setup, held: &mut Held, claims: Vec<(i64, i64, Holder)>) {
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

#[cfg(test)]
mod tests {
    //! Each way a waiting claim leaves its local queue, on the paused
    //! tokio clock (the queues time their claims with it); what the
    //! database then does with a give-back is raced in `tests/it/prefetch.rs`.

    use super::*;
    use tokio::time::advance;

    fn worker(name: &str) -> Holder {
        Holder::parse(name).unwrap()
    }

    /// A claim of task `task_id` made now, with `lease` left of its lease.
    fn waiting(task_id: i64, lease: Duration) -> Waiting {
        let claim = Claim {
            task_id,
            token: task_id * 10,
            kind: "k".into(),
            queue: "q".into(),
            attempt: 1,
            task_data: serde_json::Value::Null,
            remaining: Some(lease),
            timeout: None,
            parent_outputs: Default::default(),
            signals: Default::default(),
            wait_timed_out: None,
        };
        Waiting::claimed(claim, Instant::now(), Duration::from_secs(30))
    }

    fn ids(left: &[Left]) -> Vec<(i64, &str, Leave)> {
        let mut ids: Vec<_> = left
            .iter()
            .map(|l| (l.waiting.claim.task_id, l.worker.as_str(), l.why.clone()))
            .collect();
        ids.sort_by_key(|(id, _, _)| *id);
        ids
    }

    /// A depth grown to 8 (of at most 32), as a busy runtime's is.
    fn grown() -> Depth {
        let mut depth = Depth::new(32);
        for _ in 0..3 {
            depth.claimed(1, 1);
        }
        assert_eq!(depth.ahead(), 8);
        depth
    }

    /// Two workers with claims waiting: `a` with tasks 1 and 2, `b` with 3.
    fn two_queues() -> Local {
        let mut local = Local::default();
        let lease = Duration::from_secs(30);
        local.queue(worker("a"), [waiting(1, lease), waiting(2, lease)]);
        local.queue(worker("b"), [waiting(3, lease)]);
        local
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_with_too_little_lease_left_leaves_and_the_next_is_taken() {
        let mut local = Local::default();
        local.queue(
            worker("a"),
            [
                waiting(1, Duration::from_secs(1)),
                waiting(2, Duration::from_secs(30)),
            ],
        );
        advance(Duration::from_millis(900)).await;
        let (taken, left) = local.take(&worker("a"), Duration::from_millis(200));
        let taken = taken.unwrap();
        assert_eq!(taken.task_id, 2);
        // The worker may trust what is left by the local clock, no more.
        assert_eq!(taken.remaining, Some(Duration::from_millis(29_100)));
        assert_eq!(ids(&left), [(1, "a", Leave::TooLate)]);
        let mut depth = grown();
        assert_eq!(sort(left, &mut depth), [(1, 10, worker("a"))]);
        assert_eq!(
            depth.ahead(),
            8,
            "a lease run low says nothing of the depth"
        );
        assert_eq!(local.len(&worker("a")), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_past_its_bound_times_out_and_shortens_the_depth_the_rest_are_renewed() {
        let max_wait = Duration::from_secs(1);
        let mut local = Local::default();
        local.queue(worker("a"), [waiting(1, Duration::from_secs(30))]);
        advance(Duration::from_millis(600)).await;
        local.queue(worker("b"), [waiting(2, Duration::from_secs(30))]);
        advance(Duration::from_millis(500)).await;
        let (late, renew) = local.sweep(max_wait, Duration::from_millis(400));
        assert_eq!(ids(&late), [(1, "a", Leave::TimedOut)]);
        assert_eq!(renew, [(2, 20, worker("b"))]);
        let mut depth = grown();
        assert_eq!(sort(late, &mut depth), [(1, 10, worker("a"))]);
        assert_eq!(depth.ahead(), 4);

        // Renewed: it stays, its lease counted from the renewal's statement.
        let sent = Instant::now();
        let refused = local.renewed(sent, &renew, vec![Ok(Some(Duration::from_secs(30)))]);
        assert!(refused.is_empty());
        advance(Duration::from_secs(10)).await;
        let (taken, _) = local.take(&worker("b"), Duration::from_secs(10));
        assert_eq!(taken.unwrap().remaining, Some(Duration::from_secs(20)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_renewal_drops_the_claim_without_giving_it_back() {
        let mut local = two_queues();
        let renew = [(2, 20, worker("a")), (3, 30, worker("b"))];
        let refused = local.renewed(
            Instant::now(),
            &renew,
            vec![Ok(Some(Duration::from_secs(30))), Err("taken over".into())],
        );
        assert_eq!(
            ids(&refused),
            [(3, "b", Leave::RenewalRefused("taken over".into()))]
        );
        let mut depth = grown();
        assert!(
            sort(refused, &mut depth).is_empty(),
            "no longer ours to give back"
        );
        assert_eq!(depth.ahead(), 8);
        assert_eq!(local.len(&worker("a")), 2);
        assert_eq!(local.len(&worker("b")), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_behind_a_stuck_worker_is_stolen_for_an_idle_one() {
        let mut local = two_queues();
        local.handed(&worker("a"));
        assert!(local.steal(1).is_empty(), "not stuck yet");
        advance(STUCK_AFTER).await;
        let stolen = local.steal(1);
        assert_eq!(ids(&stolen), [(1, "a", Leave::Stolen)]);
        let mut depth = grown();
        assert_eq!(sort(stolen, &mut depth), [(1, 10, worker("a"))]);
        assert_eq!(depth.ahead(), 8);
        // `b` is between tasks (it takes its next at once): not stuck.
        assert_eq!(local.len(&worker("b")), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn one_worker_stopping_does_not_halve_the_others_depth() {
        let mut local = two_queues();
        let mut depth = grown();
        let forgotten = local.forget(&worker("a"));
        assert_eq!(
            ids(&forgotten),
            [(1, "a", Leave::Forgotten), (2, "a", Leave::Forgotten)]
        );
        assert_eq!(
            sort(forgotten, &mut depth),
            [(1, 10, worker("a")), (2, 20, worker("a"))]
        );
        assert_eq!(depth.ahead(), 8, "b still claims 8 ahead");
        assert_eq!(local.len(&worker("b")), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_graceful_stop_gives_back_every_waiting_claim_without_shortening() {
        let mut local = two_queues();
        let mut depth = grown();
        let closed = local.close();
        assert!(local.closed());
        assert_eq!(
            ids(&closed),
            [
                (1, "a", Leave::Closed),
                (2, "a", Leave::Closed),
                (3, "b", Leave::Closed)
            ]
        );
        assert_eq!(sort(closed, &mut depth).len(), 3);
        assert_eq!(depth.ahead(), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_its_worker_can_no_longer_receive_is_unsent() {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let claim = waiting(7, Duration::from_secs(30)).claim;
        assert!(hand_over(&worker("a"), reply, claim.clone(), Duration::from_secs(30)).is_none());
        assert_eq!(answer.await.unwrap().unwrap().unwrap().task_id, 7);

        let (reply, answer) = tokio::sync::oneshot::channel();
        drop(answer);
        let unsent = hand_over(&worker("a"), reply, claim, Duration::from_secs(30));
        let mut local = two_queues();
        let mut left: Vec<Left> = unsent.into_iter().collect();
        left.extend(local.unsent(&worker("a")));
        assert_eq!(
            ids(&left),
            [
                (1, "a", Leave::Unsent),
                (2, "a", Leave::Unsent),
                (7, "a", Leave::Unsent)
            ]
        );
        let mut depth = grown();
        assert_eq!(sort(left, &mut depth).len(), 3);
        assert_eq!(depth.ahead(), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn when_the_batcher_ends_every_waiting_claim_goes_back() {
        let mut local = two_queues();
        let ended = local.end();
        assert_eq!(ended.len(), 3);
        assert!(ended.iter().all(|l| l.why == Leave::Ended));
        let mut depth = grown();
        assert_eq!(sort(ended, &mut depth).len(), 3);
        assert_eq!(depth.ahead(), 8);
    }
}

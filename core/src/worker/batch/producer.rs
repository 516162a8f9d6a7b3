//! The producer: the loop that claims. It gathers the claims of every
//! worker that is free at that moment, and every local queue to fill, into
//! one statement ([`store::claim_for`]): each task claimed gets its own
//! lease and fencing token, held by the worker it is handed to. While
//! claims wait in local queues it also looks after them (see
//! [`super::prefetch`]): renews them, and settles every claim that leaves.

use super::held::{Held, Shared};
use super::prefetch::{self, Depth, Left, Local, Waiting, hand_over, settle};
use super::{Answer, Setup};
use crate::lease::Holder;
use crate::queue::store::{self, MAX_BATCH};
use crate::worker::transport::{Claim, TransportError};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// A free worker asking for a task.
pub(super) struct Want {
    pub(super) worker: Holder,
    pub(super) reply: Answer<Option<Claim>>,
}

/// What the producer is asked to do.
pub(super) enum ToProducer {
    /// A free worker with nothing in its local queue wants a task.
    Want(Want),
    /// A worker took a claim from its local queue: fill it up again.
    TopUp(Holder),
    /// Claims that left a local queue on the worker's side (too little
    /// left of the lease to hand to it), to settle.
    Left(Vec<Left>),
    /// A worker stopped: give back what waits in its local queue.
    Forget(Holder),
    /// Give back every waiting claim and prefetch nothing more (a graceful
    /// stop); answered once written.
    Close(oneshot::Sender<()>),
}

/// The producer: one claim statement for every worker free at the moment
/// and every local queue to fill; and, while claims wait in local queues,
/// their renewal and give-back.
pub(super) async fn produce(
    setup: Arc<Setup>,
    local: Arc<Shared<Local>>,
    mut rx: mpsc::UnboundedReceiver<ToProducer>,
) {
    let mut held = Held::default();
    let prefetch = setup.prefetch;
    let prefetching = prefetch.per_worker > 0;
    let mut depth = Depth::new(prefetch.per_worker);
    // Waiting claims are looked at often enough that none waits much past
    // its bound or comes near the end of its lease unrenewed.
    let every = (prefetch.max_wait.min(setup.ttl / 3) / 4).max(Duration::from_millis(5));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Workers that were answered "nothing to claim" and have not asked
    // since: what waits behind a busy worker's task may go to them.
    let mut idle: HashSet<Holder> = HashSet::new();
    let mut deferred = Deferred::default();
    loop {
        let stuck_at = if prefetching && !idle.is_empty() {
            local.lock().next_stuck_at()
        } else {
            None
        };
        let retry_at = deferred.retry_at();
        let first = tokio::select! {
            msg = held.next(&mut rx) => match msg {
                Some(msg) => Some(msg),
                None => break,
            },
            _ = tick.tick(), if prefetching => None,
            _ = tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now)), if retry_at.is_some() => None,
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
        // Workers whose claim the limits held back ask again now, or, held
        // for as long as a poll, are answered with nothing.
        let mut wants = deferred.due(&mut idle);
        let mut top_up: Vec<Holder> = Vec::new();
        let mut left: Vec<Left> = Vec::new();
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
                ToProducer::Left(those) => left.extend(those),
                ToProducer::Forget(worker) => {
                    idle.remove(&worker);
                    left.extend(local.lock().forget(&worker));
                }
                ToProducer::Close(done) => {
                    left.extend(local.lock().close());
                    for want in wants.drain(..).chain(deferred.drain()) {
                        let _ = want.reply.send(Ok(None));
                    }
                    closes.push(done);
                }
            }
        }
        if prefetching {
            // Claims that waited past their bound go back; the others are
            // renewed once a third of their lease is gone.
            let (late, renew) = local.lock().sweep(prefetch.max_wait, setup.ttl / 3);
            left.extend(late);
            prefetch::renew_waiting(&setup, &mut held, &local, renew, &mut depth).await;
        }
        settle(&setup, &mut held, std::mem::take(&mut left), &mut depth).await;
        for done in closes {
            let _ = done.send(());
        }
        // A worker whose loop ended while it waited wants nothing now; and
        // one name twice (a worker restarted under its id) is served once.
        wants.retain(|w| !w.reply.is_closed());
        let mut seen = HashSet::new();
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
                let (taken, too_late) = local.lock().take(&want.worker, min_left);
                left.extend(too_late);
                let Some(claim) = taken else {
                    asked.push(want);
                    continue;
                };
                top_up.push(want.worker.clone());
                left.extend(hand_over(&want.worker, want.reply, claim, setup.ttl));
            }
            wants = asked;
            settle(&setup, &mut held, std::mem::take(&mut left), &mut depth).await;
        }
        if !prefetching || local.lock().closed() {
            top_up.clear();
        }
        if wants.is_empty() && top_up.is_empty() {
            if prefetching {
                steal_for_idle(&setup, &mut held, &local, &mut idle, &mut depth).await;
            }
            continue;
        }
        let ahead = if prefetching {
            let cap = local.lock().depth_cap(prefetch.max_wait);
            depth.ahead().min(cap)
        } else {
            depth.ahead()
        };
        let (asking, topping) = (wants.len(), top_up.len());
        let started = Instant::now();
        let served = serve(&setup, &mut held, &local, wants, top_up, ahead).await;
        settle(&setup, &mut held, served.left, &mut depth).await;
        // What a runtime's throughput is made of, claim by claim, for
        // whoever must tell why a runtime runs slower than it should.
        tracing::trace!(
            asking,
            topping,
            depth = ahead,
            asked = served.asked,
            got = served.got,
            ms = started.elapsed().as_secs_f64() * 1000.0,
            "claimed"
        );
        deferred.hold(served.deferred, served.got);
        if prefetching {
            // A claim the limits held back says nothing of how much the
            // queue holds (due tasks waited): the depth stays.
            if !served.held_back {
                depth.claimed(served.asked, served.got);
            }
            idle.extend(served.unserved);
            steal_for_idle(&setup, &mut held, &local, &mut idle, &mut depth).await;
        }
    }
    // Every handle is gone (the workers ended): nothing will take what
    // still waits.
    let rest = local.lock().end();
    settle(&setup, &mut held, rest, &mut depth).await;
}

/// Wants whose claim a queue's limits held back while due tasks waited
/// (a slot taken, the rate's bucket empty): not answered "nothing" at once,
/// which would leave the worker idle until its next poll (250-500 ms) while
/// a slot or a token frees in milliseconds, but asked for again after a
/// short wait, doubling from [`Deferred::FIRST`] to [`Deferred::MOST`]
/// while claims keep coming back empty, and back to the first once one
/// gets a task. A want held for [`Deferred::HOLD`] is answered with
/// nothing, and its worker polls as usual. So a runtime on a limited queue
/// claims again at most every 2-50 ms while it is held back: a few
/// statements a second, each of one claim's cost, never a busy loop.
#[derive(Default)]
struct Deferred {
    /// The wants held, each with when it was first held.
    held: Vec<(Want, Instant)>,
    /// When they are asked for again.
    at: Option<Instant>,
    /// The wait before the next ask.
    wait: Duration,
}

impl Deferred {
    const FIRST: Duration = Duration::from_millis(2);
    const MOST: Duration = Duration::from_millis(50);
    /// The longest a want is held: the shortest poll of a worker.
    const HOLD: Duration = Duration::from_millis(250);

    fn retry_at(&self) -> Option<Instant> {
        self.at
    }

    /// Holds `wants` (the limits held their claims back; `got` tasks came
    /// of the statement) for another ask.
    fn hold(&mut self, wants: Vec<Want>, got: usize) {
        self.wait = if got > 0 || self.wait.is_zero() {
            Self::FIRST
        } else {
            (self.wait * 2).min(Self::MOST)
        };
        if wants.is_empty() {
            return;
        }
        let now = Instant::now();
        self.held.extend(wants.into_iter().map(|w| (w, now)));
        self.at = Some(now + self.wait);
    }

    /// The held wants, to ask for again, once their time came; those held
    /// past [`Deferred::HOLD`] are answered with nothing (and join `idle`).
    fn due(&mut self, idle: &mut HashSet<Holder>) -> Vec<Want> {
        match self.at {
            Some(at) if at <= Instant::now() => {}
            _ => return Vec::new(),
        }
        self.at = None;
        let mut again = Vec::new();
        for (want, since) in self.held.drain(..) {
            if since.elapsed() >= Self::HOLD {
                idle.insert(want.worker.clone());
                let _ = want.reply.send(Ok(None));
            } else {
                again.push(want);
            }
        }
        again
    }

    /// Every held want, to answer now (a graceful stop).
    fn drain(&mut self) -> Vec<Want> {
        self.at = None;
        self.held.drain(..).map(|(w, _)| w).collect()
    }
}

/// Workers of this runtime found nothing to claim (`idle`) while others
/// have claims stuck behind the task they run (the queue drained while a
/// slow task held its worker): the claims next in line go back, one per
/// idle worker, and their announcement wakes the idle workers to claim
/// them, rather than have them wait out the bound.
async fn steal_for_idle(
    setup: &Setup,
    held: &mut Held,
    local: &Shared<Local>,
    idle: &mut HashSet<Holder>,
    depth: &mut Depth,
) {
    if idle.is_empty() {
        return;
    }
    let stolen = local.lock().steal(idle.len());
    if stolen.is_empty() {
        return;
    }
    // Each woken worker asks again (and leaves `idle` then); until it does
    // it is not counted twice.
    let woken: Vec<Holder> = idle.iter().take(stolen.len()).cloned().collect();
    for worker in woken {
        idle.remove(&worker);
    }
    settle(setup, held, stolen, depth).await;
}

/// What one [`serve`] did.
struct Served {
    /// Tasks asked for.
    asked: usize,
    /// Tasks claimed.
    got: usize,
    /// Wanting workers answered with nothing to run.
    unserved: Vec<Holder>,
    /// Wanting workers not answered yet: the queue's limits held back what
    /// they asked for while due tasks waited, so they are asked for again
    /// shortly (see [`Deferred`]).
    deferred: Vec<Want>,
    /// Claims no worker will take (their worker's loop ended), to settle.
    left: Vec<Left>,
    /// The queue's limits held back some of what was asked while due
    /// tasks waited.
    held_back: bool,
}

/// One claim statement for `wants` (one task each, to hand over now) and
/// for the local queues of `top_up` and of the wanting workers (filled to
/// `ahead`). Every want is answered, and every task claimed is handed
/// over, queued, or returned in [`Served::left`]: no path leaves a worker
/// waiting or a claim to run out its lease.
async fn serve(
    setup: &Setup,
    held: &mut Held,
    local: &Shared<Local>,
    wants: Vec<Want>,
    top_up: Vec<Holder>,
    ahead: usize,
) -> Served {
    // Each wanting worker first (one each, in the statement's first rows,
    // which get the work when there is less than asked), then the room in
    // the local queues.
    let mut holders: Vec<Holder> = wants.iter().map(|w| w.worker.clone()).collect();
    {
        let local = local.lock();
        let room = |worker: &Holder| {
            if local.closed() {
                return 0;
            }
            ahead.saturating_sub(local.len(worker))
        };
        for worker in wants.iter().map(|w| &w.worker).chain(top_up.iter()) {
            let n = room(worker).min(MAX_BATCH - holders.len());
            holders.extend(std::iter::repeat_n(worker.clone(), n));
        }
    }
    let asked = holders.len();
    let mut served = Served {
        asked,
        got: 0,
        unserved: Vec::new(),
        deferred: Vec::new(),
        left: Vec::new(),
        held_back: false,
    };
    if asked == 0 {
        return served;
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
            return served;
        }
    };
    served.got = claimed.tasks.len();
    let deferred = claimed.deferred;
    served.held_back = deferred;
    let mut by_holder: HashMap<String, VecDeque<crate::queue::Task>> = HashMap::new();
    for task in claimed.tasks {
        by_holder
            .entry(task.processor.clone().unwrap_or_default())
            .or_default()
            .push_back(task);
    }
    let waiting = |task: crate::queue::Task| Waiting::claimed(Claim::of(task), sent, setup.ttl);
    for want in wants {
        let mut mine = by_holder.remove(want.worker.as_str()).unwrap_or_default();
        let task = mine.pop_front();
        let Some(task) = task else {
            if deferred {
                served.deferred.push(want);
            } else {
                served.unserved.push(want.worker.clone());
                let _ = want.reply.send(Ok(None));
            }
            continue;
        };
        // Queued before the reply, so that the worker's next claim finds them.
        local
            .lock()
            .queue(want.worker.clone(), mine.into_iter().map(waiting));
        if let Some(unsent) = hand_over(&want.worker, want.reply, Claim::of(task), setup.ttl) {
            // The worker's loop ended while its claim was in flight: give
            // the task back (and what was queued for it) rather than let
            // them wait out their leases.
            served.left.push(unsent);
            served.left.extend(local.lock().unsent(&want.worker));
        }
    }
    {
        let mut local = local.lock();
        for (worker, tasks) in by_holder {
            let Ok(worker) = Holder::parse(worker) else {
                continue;
            };
            local.queue(worker, tasks.into_iter().map(waiting));
        }
    }
    served
}

//! The singleton lock: run one piece of work on exactly one instance, guarded
//! by a lease, and hand it over when that instance dies.
//!
//! The states, and why each exists:
//!
//! - `Idle`: not wanted; holds nothing.
//! - `Acquiring`: asking the database for the lease.
//! - `Working`: holds the lease; the work runs with the term's fencing token.
//! - `Renewing`: a renewal is in flight; the work keeps running on the
//!   previous trust deadline.
//! - `Pausing`: the lease is lost (renewal refused or the trust deadline
//!   passed); the work is being stopped before anything else happens, so two
//!   instances never work at once.
//! - `Waiting`: someone else holds it; try again after a pause.
//! - `Releasing`: asked to stop while holding; the work is stopped, then the
//!   lease released so another instance need not wait for the expiry.
//!
//! [`transition`] is the whole table and is pure; [`Singleton`] drives it
//! with the lease client.
//!
//! The same singleton on two replicas: one works, the other waits, and takes
//! over (in a new term, with a higher fencing token) when the first stops:
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pool = leasekeeper_core::db::testing::fresh_pool().await;
//! use leasekeeper_core::lease::client::{LeaseClient, LeaseTiming};
//! use leasekeeper_core::lease::singleton::{Singleton, State, Work};
//! use leasekeeper_core::lease::{Holder, Resource};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tokio::sync::mpsc;
//! use tokio::time::timeout;
//!
//! // The work: tells which term it runs in, then runs until told to stop.
//! // Its writes would carry the term's fencing token.
//! let (started, mut terms) = mpsc::unbounded_channel();
//! let work: Work = Arc::new(move |token, stop| {
//!     let started = started.clone();
//!     Box::pin(async move {
//!         let _ = started.send(token);
//!         stop.cancelled().await;
//!     })
//! });
//!
//! let resource = Resource::parse("singleton:nightly-report")?;
//! let timing = LeaseTiming::from_ttl(Duration::from_secs(2));
//! let retry = Duration::from_millis(100);
//! let replica = |name: &str| -> Result<Singleton, Box<dyn std::error::Error>> {
//!     let client = LeaseClient::new(pool.clone(), resource.clone(), Holder::parse(name)?, timing);
//!     Ok(Singleton::spawn(client, retry, work.clone()))
//! };
//! let (a, b) = (replica("replica-a")?, replica("replica-b")?);
//! let patience = Duration::from_secs(10);
//!
//! a.start();
//! let first = timeout(patience, terms.recv()).await?.expect("a's term");
//! assert_eq!(a.token(), Some(first));
//!
//! b.start();
//! timeout(patience, b.watch_state().wait_for(|s| *s == State::Waiting)).await??;
//!
//! // a stops its work and releases the lease; b takes over.
//! a.shutdown().await;
//! let second = timeout(patience, terms.recv()).await?.expect("b's term");
//! assert!(second > first);
//! assert_eq!(b.token(), Some(second));
//! b.shutdown().await;
//! # Ok(())
//! # }
//! ```

use super::client::{HeldLease, LeaseClient, LeaseStatus};
use crate::text::text_enum;
use serde::Serialize;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

text_enum! {
    /// Where a singleton lock stands.
    #[derive(Serialize)]
    #[serde(rename_all = "lowercase")]
    pub enum State {
        /// Not wanted; holds nothing.
        Idle = "idle",
        /// Asking the database for the lease.
        Acquiring = "acquiring",
        /// Holding the lease; the work runs.
        Working = "working",
        /// A renewal is in flight.
        Renewing = "renewing",
        /// Lease lost; stopping the work.
        Pausing = "pausing",
        /// Someone else holds it; waiting to retry.
        Waiting = "waiting",
        /// Asked to stop; stopping the work and releasing.
        Releasing = "releasing",
    }
}

/// What happens to a singleton lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The work is wanted.
    Start,
    /// The work is no longer wanted.
    Stop,
    /// The lease was acquired.
    Acquired,
    /// Another holder has it (or the database failed).
    NotAcquired,
    /// A renewal was sent.
    RenewSent,
    /// The renewal succeeded.
    Renewed,
    /// The lease was lost: renewal refused or the trust deadline passed.
    Lost,
    /// The work has stopped after a loss.
    Paused,
    /// The retry pause is over.
    RetryDue,
    /// The lease was released.
    Released,
}

/// The state after `event` in `state`, or `None` when the event does not
/// apply there (the driver then ignores it).
pub fn transition(state: State, event: Event) -> Option<State> {
    use Event as E;
    use State as S;
    Some(match (state, event) {
        (S::Idle, E::Start) => S::Acquiring,
        (S::Acquiring, E::Acquired) => S::Working,
        (S::Acquiring, E::NotAcquired) => S::Waiting,
        (S::Working, E::RenewSent) => S::Renewing,
        (S::Renewing, E::Renewed) => S::Working,
        (S::Working | S::Renewing, E::Lost) => S::Pausing,
        (S::Pausing, E::Paused) => S::Waiting,
        (S::Waiting, E::RetryDue) => S::Acquiring,
        (S::Waiting, E::Stop) => S::Idle,
        (S::Acquiring | S::Working | S::Renewing, E::Stop) => S::Releasing,
        (S::Releasing, E::Released) => S::Idle,
        _ => return None,
    })
}

/// The work a singleton runs while it holds the lease. It gets the term's
/// fencing token and must return promptly once `stop` is cancelled.
pub type Work =
    Arc<dyn Fn(i64, CancellationToken) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// What the work of one term gets: the term's fencing token, the signal to
/// stop, and a live "still mine" check for guarding each protected write.
#[derive(Clone, Debug)]
pub struct HeldTerm {
    token: i64,
    stop: CancellationToken,
    status: watch::Receiver<LeaseStatus>,
}

impl HeldTerm {
    /// The term's fencing token; protected writes must carry it.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// Cancelled when the work must stop (lease lost, stop asked, shutdown).
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// True while the work may act: not told to stop, and the lease is still
    /// trusted locally ([`LeaseStatus::is_trusted`]). It turns false before
    /// the database could consider the lease expired, even if the driver has
    /// not yet noticed the loss and stopped the work.
    pub fn is_held(&self) -> bool {
        !self.stop.is_cancelled() && self.status.borrow().is_trusted()
    }
}

/// Like [`Work`], but given the whole [`HeldTerm`], for work that must check it
/// still holds the lease before each write.
pub type TermWork = Arc<dyn Fn(HeldTerm) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A clonable remote that starts and stops a [`Singleton`] from other tasks
/// (e.g. one that watches a desired state in the database).
#[derive(Clone, Debug)]
pub struct Switch(Arc<watch::Sender<bool>>);

impl Switch {
    /// Asks for the work to run; see [`Singleton::start`].
    pub fn start(&self) {
        self.0.send_replace(true);
    }

    /// Asks for the work to stop; see [`Singleton::stop`].
    pub fn stop(&self) {
        self.0.send_replace(false);
    }
}

/// A running singleton lock: a task that drives [`transition`].
pub struct Singleton {
    wanted: Arc<watch::Sender<bool>>,
    state: watch::Receiver<State>,
    token: watch::Receiver<Option<i64>>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Singleton {
    /// Starts the driver in the `Idle` state. `retry` is how long `Waiting` lasts.
    pub fn spawn(client: LeaseClient, retry: Duration, work: Work) -> Self {
        Self::spawn_with_term(
            client,
            retry,
            Arc::new(move |term: HeldTerm| work(term.token, term.stop)),
        )
    }

    /// Like [`Singleton::spawn`], for work that gets the whole [`HeldTerm`].
    pub fn spawn_with_term(client: LeaseClient, retry: Duration, work: TermWork) -> Self {
        let (wanted_tx, wanted_rx) = watch::channel(false);
        let (state_tx, state_rx) = watch::channel(State::Idle);
        let (token_tx, token_rx) = watch::channel(None);
        let shutdown = CancellationToken::new();
        let driver = Driver {
            client,
            retry,
            work,
            wanted: wanted_rx,
            state: state_tx,
            token: token_tx,
            shutdown: shutdown.clone(),
        };
        let task = tokio::spawn(driver.run());
        Singleton {
            wanted: Arc::new(wanted_tx),
            state: state_rx,
            token: token_rx,
            shutdown,
            task,
        }
    }

    /// A singleton job: `work` on the lease `resource`, competed for as
    /// `holder`, idle until started. The library's maintenance and the
    /// demo's generator are each one; a new job is built the same way.
    ///
    /// # Panics
    ///
    /// When `resource` is not a valid resource name (it is a constant of the
    /// job's own).
    pub fn spawn_job(
        pool: sqlx::PgPool,
        resource: &str,
        holder: super::Holder,
        timing: super::client::LeaseTiming,
        retry: Duration,
        work: TermWork,
    ) -> Self {
        let resource = super::Resource::parse(resource)
            .unwrap_or_else(|e| panic!("the job's resource {resource:?} is invalid: {e}"));
        Self::spawn_with_term(
            LeaseClient::new(pool, resource, holder, timing),
            retry,
            work,
        )
    }

    /// Asks for the work to run (acquire, then work while holding).
    pub fn start(&self) {
        self.wanted.send_replace(true);
    }

    /// Asks for the work to stop (stop the work, then release).
    pub fn stop(&self) {
        self.wanted.send_replace(false);
    }

    /// A remote for starting and stopping it from elsewhere.
    pub fn switch(&self) -> Switch {
        Switch(self.wanted.clone())
    }

    /// The current state.
    pub fn state(&self) -> State {
        *self.state.borrow()
    }

    /// A watch on the state, for waiting on changes.
    pub fn watch_state(&self) -> watch::Receiver<State> {
        self.state.clone()
    }

    /// The fencing token of the current term while working.
    pub fn token(&self) -> Option<i64> {
        *self.token.borrow()
    }

    /// Stops the driver as a crash would: no release, the lease just expires.
    pub fn abort(self) {
        self.task.abort();
    }

    /// Stops the work, releases the lease if held, and ends the driver.
    pub async fn shutdown(self) {
        self.wanted.send_replace(false);
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

struct Driver {
    client: LeaseClient,
    retry: Duration,
    work: TermWork,
    wanted: watch::Receiver<bool>,
    state: watch::Sender<State>,
    token: watch::Sender<Option<i64>>,
    shutdown: CancellationToken,
}

/// The work running for one term, and the lease it runs under.
struct Running {
    held: HeldLease,
    /// The process's liveness session (when one vouches for the holder)
    /// and the term of it the lease was acquired in: its loss ends the
    /// term at once.
    liveness: (crate::liveness::LivenessSignal, u64),
    status: watch::Receiver<LeaseStatus>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop_work(self) -> HeldLease {
        self.stop.cancel();
        if let Err(e) = self.task.await
            && e.is_panic()
        {
            tracing::error!(error = %e, "singleton work panicked");
        }
        self.held
    }
}

impl Driver {
    fn apply(&self, event: Event) -> State {
        let current = *self.state.borrow();
        match transition(current, event) {
            Some(next) => {
                if next != current {
                    tracing::debug!(resource = %self.client.resource(), ?current, ?event, ?next, "singleton transition");
                    self.state.send_replace(next);
                }
                next
            }
            None => current,
        }
    }

    fn wanted(&self) -> bool {
        *self.wanted.borrow()
    }

    async fn run(mut self) {
        let mut term: Option<Running> = None;
        loop {
            let state = *self.state.borrow();
            let shutting_down = self.shutdown.is_cancelled();
            match state {
                State::Idle => {
                    if shutting_down {
                        return;
                    }
                    if self.wanted() {
                        self.apply(Event::Start);
                        continue;
                    }
                    tokio::select! {
                        _ = self.wanted.changed() => {}
                        _ = self.shutdown.cancelled() => {}
                    }
                }
                State::Acquiring => {
                    if !self.wanted() || shutting_down {
                        self.apply(Event::Stop);
                        continue;
                    }
                    // No term while the liveness session vouching for this
                    // holder is down: a crash then would wait out the TTL.
                    let mut liveness =
                        crate::liveness::LivenessSignal::of(self.client.holder().as_str());
                    let Some(session) = liveness.session() else {
                        tokio::select! {
                            _ = liveness.up() => {}
                            _ = self.wanted.changed() => {}
                            _ = self.shutdown.cancelled() => {}
                        }
                        continue;
                    };
                    match self.client.acquire().await {
                        Ok(Some(held)) => {
                            let stop = CancellationToken::new();
                            let work = (self.work)(HeldTerm {
                                token: held.token(),
                                stop: stop.clone(),
                                status: held.status(),
                            });
                            self.token.send_replace(Some(held.token()));
                            term = Some(Running {
                                status: held.status(),
                                held,
                                liveness: (liveness, session),
                                stop,
                                task: tokio::spawn(work),
                            });
                            self.apply(Event::Acquired);
                        }
                        Ok(None) => {
                            self.apply(Event::NotAcquired);
                        }
                        Err(e) => {
                            tracing::warn!(resource = %self.client.resource(), error = %e, "singleton acquire failed");
                            self.apply(Event::NotAcquired);
                        }
                    }
                }
                State::Working | State::Renewing => {
                    let Some(current) = term.as_mut() else {
                        self.apply(Event::Lost);
                        continue;
                    };
                    if !self.wanted() || shutting_down {
                        self.apply(Event::Stop);
                        continue;
                    }
                    let lost = current.held.lost_token();
                    let (liveness, session) = &mut current.liveness;
                    let event = tokio::select! {
                        _ = lost.cancelled() => Some(Event::Lost),
                        () = liveness.ended(*session) => {
                            tracing::warn!(resource = %self.client.resource(),
                                "the liveness session was lost: the term ends now");
                            Some(Event::Lost)
                        }
                        _ = self.wanted.changed() => None,
                        _ = self.shutdown.cancelled() => None,
                        changed = current.status.changed() => match changed {
                            Err(_) => Some(Event::Lost),
                            Ok(()) => Some(match *current.status.borrow_and_update() {
                                LeaseStatus::Renewing { .. } => Event::RenewSent,
                                LeaseStatus::Held { .. } => Event::Renewed,
                                LeaseStatus::Lost => Event::Lost,
                            }),
                        },
                    };
                    if let Some(event) = event {
                        self.apply(event);
                    }
                }
                State::Pausing => {
                    if let Some(t) = term.take() {
                        drop(t.stop_work().await);
                    }
                    self.token.send_replace(None);
                    self.apply(Event::Paused);
                }
                State::Waiting => {
                    if !self.wanted() || shutting_down {
                        self.apply(Event::Stop);
                        continue;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(self.retry) => { self.apply(Event::RetryDue); }
                        // A dead holder's leases were just ended here: the
                        // lease may be free now, not a retry pause from now.
                        _ = crate::liveness::freed().notified() => { self.apply(Event::RetryDue); }
                        _ = self.wanted.changed() => {}
                        _ = self.shutdown.cancelled() => {}
                    }
                }
                State::Releasing => {
                    if let Some(t) = term.take() {
                        let held = t.stop_work().await;
                        if let Err(e) = held.release().await {
                            tracing::warn!(resource = %self.client.resource(), error = %e,
                                "singleton release failed; the lease will expire instead");
                        }
                    }
                    self.token.send_replace(None);
                    self.apply(Event::Released);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Event as E;
    use State as S;

    const STATES: [State; 7] = [
        S::Idle,
        S::Acquiring,
        S::Working,
        S::Renewing,
        S::Pausing,
        S::Waiting,
        S::Releasing,
    ];
    const EVENTS: [Event; 10] = [
        E::Start,
        E::Stop,
        E::Acquired,
        E::NotAcquired,
        E::RenewSent,
        E::Renewed,
        E::Lost,
        E::Paused,
        E::RetryDue,
        E::Released,
    ];

    /// Every allowed transition, and nothing else: the full table.
    #[test]
    fn the_transition_table_is_exactly_the_specified_one() {
        let allowed = [
            (S::Idle, E::Start, S::Acquiring),
            (S::Acquiring, E::Acquired, S::Working),
            (S::Acquiring, E::NotAcquired, S::Waiting),
            (S::Acquiring, E::Stop, S::Releasing),
            (S::Working, E::RenewSent, S::Renewing),
            (S::Working, E::Lost, S::Pausing),
            (S::Working, E::Stop, S::Releasing),
            (S::Renewing, E::Renewed, S::Working),
            (S::Renewing, E::Lost, S::Pausing),
            (S::Renewing, E::Stop, S::Releasing),
            (S::Pausing, E::Paused, S::Waiting),
            (S::Waiting, E::RetryDue, S::Acquiring),
            (S::Waiting, E::Stop, S::Idle),
            (S::Releasing, E::Released, S::Idle),
        ];
        for state in STATES {
            for event in EVENTS {
                let expected = allowed
                    .iter()
                    .find(|(s, e, _)| *s == state && *e == event)
                    .map(|(_, _, next)| *next);
                assert_eq!(transition(state, event), expected, "{state:?} + {event:?}");
            }
        }
    }

    #[test]
    fn a_lost_lease_always_pauses_the_work_before_retrying() {
        // Working -> lost -> the only way back to Acquiring goes through
        // Pausing (work stopped) and Waiting.
        let mut state = S::Working;
        for event in [E::Lost, E::Paused, E::RetryDue] {
            state = transition(state, event).unwrap();
        }
        assert_eq!(state, S::Acquiring);
        assert_eq!(transition(S::Pausing, E::RetryDue), None);
        assert_eq!(transition(S::Pausing, E::Acquired), None);
    }

    #[test]
    fn stop_releases_when_holding_and_goes_idle_when_not() {
        assert_eq!(transition(S::Working, E::Stop), Some(S::Releasing));
        assert_eq!(transition(S::Releasing, E::Released), Some(S::Idle));
        assert_eq!(transition(S::Waiting, E::Stop), Some(S::Idle));
        assert_eq!(transition(S::Idle, E::Stop), None);
    }
}

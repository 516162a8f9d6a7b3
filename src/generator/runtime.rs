//! The generator on one instance: a watcher that follows the desired state
//! in the database, the singleton lock it switches on and off, and the work
//! that inserts a task every interval while this instance holds the lease.

use crate::settings::Settings;
use leasekeeper_core::generator::{Desired, RESOURCE, store};
use leasekeeper_core::lease::client::{LeaseClient, LeaseTiming};
use leasekeeper_core::lease::singleton::{Singleton, State, Switch, Term, TermWork};
use leasekeeper_core::lease::{Holder, Resource};
use leasekeeper_core::queue::NewTask;
use rand::Rng;
use serde_json::json;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

/// Timing and limits of a [`Generator`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GeneratorConfig {
    /// The lease on `singleton:generator`: TTL, renewal, safety margin.
    pub timing: LeaseTiming,
    /// How often the holder inserts a task.
    pub interval: Duration,
    /// How often the desired state is read from the database.
    pub poll: Duration,
    /// How long a non-holder waits before trying to acquire again.
    pub retry: Duration,
    /// `max_attempts` of generated tasks.
    pub max_attempts: i32,
    /// Generated tasks sleep 1 to this many seconds.
    pub max_sleep: u32,
}

impl GeneratorConfig {
    /// The generator's timing from the program's settings. The desired state
    /// is polled twice per renew interval (at most every second), so a stop
    /// through any instance reaches the holder within one renew interval; a
    /// non-holder retries once per renew interval, so it takes over at most
    /// one renew interval after the lease runs out.
    pub fn from_settings(settings: &Settings) -> Self {
        GeneratorConfig {
            timing: LeaseTiming {
                ttl: settings.lease_ttl,
                renew_interval: settings.renew_interval,
                safety_margin: settings.lease_ttl / 10,
            },
            interval: settings.generator_interval,
            poll: (settings.renew_interval / 2).min(Duration::from_secs(1)),
            retry: settings.renew_interval,
            max_attempts: i32::try_from(settings.max_attempts)
                .unwrap_or(1000)
                .clamp(1, 1000),
            max_sleep: settings.generator_max_sleep.max(1),
        }
    }
}

/// What request handlers need of the local generator: its state, and a way
/// to make it re-read the desired state at once.
#[derive(Clone, Debug)]
pub struct GeneratorHandle {
    state: watch::Receiver<State>,
    nudge: Arc<Notify>,
}

impl GeneratorHandle {
    /// This instance's singleton state.
    pub fn state(&self) -> State {
        *self.state.borrow()
    }

    /// Makes the watcher read the desired state now rather than at its next
    /// poll (after a start or stop through this instance).
    pub fn nudge(&self) {
        self.nudge.notify_one();
    }
}

/// The generator runtime of one instance.
pub struct Generator {
    singleton: Singleton,
    watcher: JoinHandle<()>,
    stop_watcher: CancellationToken,
    crashed: CancellationToken,
    nudge: Arc<Notify>,
}

impl Generator {
    /// Starts watching the desired state; the singleton for
    /// `singleton:generator` runs as holder `instance` while it is `running`.
    pub fn spawn(pool: PgPool, instance: Holder, config: GeneratorConfig) -> Self {
        let resource = Resource::parse(RESOURCE).expect("the generator resource name is valid");
        let client = LeaseClient::new(pool.clone(), resource, instance.clone(), config.timing);
        let crashed = CancellationToken::new();
        let work: TermWork = {
            let pool = pool.clone();
            let crashed = crashed.clone();
            Arc::new(move |term| {
                Box::pin(generate(
                    pool.clone(),
                    instance.clone(),
                    config,
                    term,
                    crashed.clone(),
                ))
            })
        };
        let singleton = Singleton::spawn_with_term(client, config.retry, work);
        let nudge = Arc::new(Notify::new());
        let stop_watcher = CancellationToken::new();
        let watcher = tokio::spawn(follow_desired(
            pool,
            singleton.switch(),
            config.poll,
            nudge.clone(),
            stop_watcher.clone(),
        ));
        Generator {
            singleton,
            watcher,
            stop_watcher,
            crashed,
            nudge,
        }
    }

    /// A handle for request handlers.
    pub fn handle(&self) -> GeneratorHandle {
        GeneratorHandle {
            state: self.singleton.watch_state(),
            nudge: self.nudge.clone(),
        }
    }

    /// This instance's singleton state.
    pub fn state(&self) -> State {
        self.singleton.state()
    }

    /// A watch on the state, for waiting on changes.
    pub fn watch_state(&self) -> watch::Receiver<State> {
        self.singleton.watch_state()
    }

    /// The fencing token of this instance's term, while it holds the lease.
    pub fn token(&self) -> Option<i64> {
        self.singleton.token()
    }

    /// Stops following the desired state, stops generating and releases the
    /// lease if held, so another instance can take over at once. The
    /// desired state is left as it is: it belongs to the whole fleet.
    pub async fn shutdown(self) {
        self.stop_watcher.cancel();
        let _ = self.watcher.await;
        self.singleton.shutdown().await;
    }

    /// Stops everything as a crash would: no release; the lease expires.
    pub fn abort(self) {
        self.crashed.cancel();
        self.watcher.abort();
        self.singleton.abort();
    }
}

/// Switches the singleton on and off as `generator_state.desired` says.
async fn follow_desired(
    pool: PgPool,
    switch: Switch,
    poll: Duration,
    nudge: Arc<Notify>,
    stop: CancellationToken,
) {
    let mut last: Option<Desired> = None;
    loop {
        let read = async { store::desired(&mut *pool.acquire().await?).await }.await;
        match read {
            Ok(desired) if Some(desired) != last => {
                tracing::info!(desired = desired.as_str(), "generator desired state");
                match desired {
                    Desired::Running => switch.start(),
                    Desired::Stopped => switch.stop(),
                }
                last = Some(desired);
            }
            Ok(_) => {}
            // Keep doing what we did: a database hiccup is no reason to
            // stop, and if it lasts, the lease is lost anyway.
            Err(e) => tracing::warn!(error = %e, "cannot read the generator's desired state"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = nudge.notified() => {}
            _ = tokio::time::sleep(poll) => {}
        }
    }
}

/// The work of one term: a task every `interval` while the lease is held.
async fn generate(
    pool: PgPool,
    me: Holder,
    config: GeneratorConfig,
    term: Term,
    crashed: CancellationToken,
) {
    let token = term.token();
    tracing::info!(instance = %me, token, "generator running on this instance");
    let mut ticks = tokio::time::interval_at(
        tokio::time::Instant::now() + config.interval,
        config.interval,
    );
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = term.stop().cancelled() => break,
            _ = crashed.cancelled() => return,
            _ = ticks.tick() => {}
        }
        // Local fence: the lease may be about to run out while the driver
        // has not yet stopped us; then skip, the database would refuse.
        if !term.is_held() {
            continue;
        }
        let sleep = rand::rng().random_range(1..=config.max_sleep.max(1));
        let task = NewTask::new(
            leasekeeper_core::worker::simulated::KIND,
            json!({ "sleep_duration_seconds": sleep }),
        )
        .max_attempts(config.max_attempts);
        // Not raced against `stop`: a stop waits for the insert in flight,
        // so the lease is released only after it committed.
        let inserted = async {
            let mut conn = pool.acquire().await?;
            store::insert_task(&mut conn, &me, token, task).await
        }
        .await;
        match inserted {
            Ok(Some(task)) => {
                tracing::debug!(instance = %me, token, task = task.id, "generated a task");
            }
            Ok(None) => {
                tracing::warn!(instance = %me, token,
                    "generated task refused: this instance no longer holds the generator lease");
            }
            Err(e) => {
                tracing::warn!(instance = %me, token, error = %e, "cannot insert a generated task")
            }
        }
    }
    tracing::info!(instance = %me, token, "generator stopped on this instance");
}

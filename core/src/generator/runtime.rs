//! The generator on one instance: a watcher that follows the desired state
//! in the database, the singleton job it switches on and off, and the work
//! that inserts a task every interval while this instance holds the lease.

use super::{Desired, GeneratorStatus, RESOURCE, store};
use crate::db::Schema;
use crate::lease::Holder;
use crate::lease::client::LeaseTiming;
use crate::lease::singleton::{HeldTerm, Singleton, State, Switch, TermWork};
use crate::queue::NewTask;
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
    /// The kind of the generated tasks: work that sleeps
    /// `sleep_duration_seconds` (the demo's simulated work).
    pub kind: &'static str,
}

impl GeneratorConfig {
    /// The generator's timing from its lease's and its own. The desired
    /// state is polled twice per renew interval (at most every second), so a
    /// stop through any instance reaches the holder within one renew
    /// interval; a non-holder retries once per renew interval, so it takes
    /// over at most one renew interval after the lease runs out.
    /// `max_attempts` is clamped to 1..=1000, `max_sleep` to at least 1.
    pub fn new(
        timing: LeaseTiming,
        interval: Duration,
        max_attempts: u32,
        max_sleep: u32,
        kind: &'static str,
    ) -> Self {
        GeneratorConfig {
            timing,
            interval,
            poll: (timing.renew_interval / 2).min(Duration::from_secs(1)),
            retry: timing.renew_interval,
            max_attempts: i32::try_from(max_attempts).unwrap_or(1000).clamp(1, 1000),
            max_sleep: max_sleep.max(1),
            kind,
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
        let crashed = CancellationToken::new();
        let work: TermWork = {
            let pool = pool.clone();
            let instance = instance.clone();
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
        let singleton = Singleton::spawn_job(
            pool.clone(),
            RESOURCE,
            instance,
            config.timing,
            config.retry,
            work,
        );
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

    /// The singleton job: this instance's state and term.
    pub fn singleton(&self) -> &Singleton {
        &self.singleton
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
    let schema = Schema::of(&pool);
    let mut last: Option<Desired> = None;
    loop {
        let read = async { store::desired(&mut *pool.acquire().await?, &schema).await }.await;
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
    term: HeldTerm,
    crashed: CancellationToken,
) {
    let token = term.token();
    let schema = Schema::of(&pool);
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
        let task = NewTask::new(config.kind, json!({ "sleep_duration_seconds": sleep }))
            .max_attempts(config.max_attempts);
        // Not raced against `stop`: a stop waits for the insert in flight,
        // so the lease is released only after it committed.
        let inserted = async {
            let mut conn = pool.acquire().await?;
            store::insert_task(&mut conn, &schema, &me, token, task).await
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

/// The status as `answered_by` this instance, with its local singleton
/// state when it runs a generator: what the REST route and the dashboard show.
pub async fn report(
    conn: &mut sqlx::PgConnection,
    schema: &Schema,
    instance_id: &str,
    local: Option<&GeneratorHandle>,
) -> sqlx::Result<GeneratorStatus> {
    let mut status = store::status(conn, schema).await?;
    status.answered_by = Some(instance_id.to_string());
    status.local_state = local.map(|g| g.state().as_str().to_string());
    Ok(status)
}

/// Records the operator's wish through this instance, wakes the local
/// generator so it acts at once, and reports the new status.
pub async fn request(
    conn: &mut sqlx::PgConnection,
    schema: &Schema,
    desired: Desired,
    instance_id: &str,
    local: Option<&GeneratorHandle>,
) -> sqlx::Result<GeneratorStatus> {
    store::set_desired(&mut *conn, schema, desired, instance_id).await?;
    if let Some(generator) = local {
        generator.nudge();
    }
    report(conn, schema, instance_id, local).await
}

//! Retention and rescue: a maintenance job, on exactly one replica, that
//! deletes what is older than the retention so the tables stay bounded
//! however many tasks pass through, and fails the late tasks that used
//! their attempts ([`crate::queue::rescuer`], every `rescue_interval`).
//!
//! Every replica runs a [`Maintenance`]; only the holder of the lease
//! `singleton:maintenance` (the library's own [`Singleton`]) works: every
//! `interval` it runs a pass ([`prune_once`]) that deletes, in batches of
//! at most `batch` rows, each batch its own short transaction:
//!
//! - tasks that finished (processed or cancelled) more than `retention`
//!   ago, and failed tasks more than `failed_retention` ago (30 days by
//!   default, and never less than `retention`: failed tasks are the ones
//!   someone acts on), with their history; a workflow's tasks only once
//!   every task of it finished, their edges with them, and the workflow's
//!   row with its last task;
//! - lease rows of other resources whose term ended before then (their
//!   fencing rows stay, so tokens keep rising when such a resource is
//!   acquired again);
//! - history (`lease_events`), failover kills and schedule ticks older
//!   than that;
//! - instances and workers not seen for that long.
//!
//! The SQL, and the race each statement prevents, is in [`store`]. A batch
//! locks only finished tasks, ended leases and dead rows, skipping any row
//! someone else holds, so a claim never waits on the pruner. The job is
//! idempotent: two pruners at once (a holder that lost the lease without
//! noticing yet) would only skip each other's rows, so it is fenced
//! locally ([`HeldTerm::is_held`] before each batch), not in the database.
//!
//! One pass by hand, without the singleton:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pool = leasekeeper_core::db::testing::fresh_pool().await;
//! use leasekeeper_core::maintenance::prune_once;
//! use std::time::Duration;
//!
//! let week = Duration::from_secs(7 * 24 * 3600);
//! let pruned = prune_once(&pool, week, 1000, || true).await?;
//! assert_eq!(pruned.total(), 0); // nothing is a week old yet
//! # Ok(())
//! # }
//! ```

pub mod store;

pub use store::{Pruned, Retention, Table};

use crate::db::Schema;
use crate::lease::Holder;
use crate::lease::client::LeaseTiming;
use crate::lease::singleton::{HeldTerm, Singleton, TermWork};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The lease whose holder runs the maintenance job.
pub const RESOURCE: &str = "singleton:maintenance";

/// How old a processed or cancelled task, a history row or a dead instance
/// must be to be deleted, unless configured: 7 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long failed tasks are kept by default: 30 days.
pub const DEFAULT_FAILED_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// How often the holder runs a pass, unless configured: every 60 s.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// How often the holder runs a rescue pass ([`crate::queue::rescuer`]),
/// unless configured: every 5 s. It bounds how long a late task that used
/// its attempts stays started after its deadline.
pub const DEFAULT_RESCUE_INTERVAL: Duration = Duration::from_secs(5);

/// The most rows one batch (one transaction) deletes from the table it
/// walks, unless configured. Small enough that a batch takes milliseconds
/// (a task batch also deletes each task's lease, history and fencing rows).
pub const DEFAULT_BATCH: usize = 500;

/// Timing and limits of a [`Maintenance`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MaintenanceConfig {
    /// The lease on `singleton:maintenance`: TTL, renewal, safety margin.
    pub timing: LeaseTiming,
    /// How long a non-holder waits before trying to acquire again.
    pub retry: Duration,
    /// How often the holder runs a pass.
    pub interval: Duration,
    /// How old what is deleted must be.
    pub retention: Duration,
    /// How old a failed task must be to be deleted (at least `retention`).
    pub failed_retention: Duration,
    /// The most rows one batch deletes (and the most tasks one rescue
    /// batch fails).
    pub batch: usize,
    /// How often the holder runs a rescue pass
    /// ([`crate::queue::rescuer`]): how long, at most, a late task that
    /// used its attempts stays started after its deadline.
    pub rescue_interval: Duration,
}

impl MaintenanceConfig {
    /// `retention` and `interval` with the defaults for the rest: a 15 s
    /// lease renewed every 5 s, a non-holder retrying every 5 s, batches of
    /// [`DEFAULT_BATCH`], a rescue every [`DEFAULT_RESCUE_INTERVAL`].
    pub fn new(retention: Duration, interval: Duration) -> Self {
        let timing = LeaseTiming::from_ttl(Duration::from_secs(15));
        MaintenanceConfig {
            timing,
            retry: timing.renew_interval,
            interval,
            retention,
            failed_retention: DEFAULT_FAILED_RETENTION.max(retention),
            batch: DEFAULT_BATCH,
            rescue_interval: DEFAULT_RESCUE_INTERVAL,
        }
    }
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        Self::new(DEFAULT_RETENTION, DEFAULT_INTERVAL)
    }
}

/// What this replica's maintenance has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Passes completed on this replica.
    pub passes: u64,
    /// Rows deleted by them.
    pub pruned: Pruned,
    /// Late tasks out of attempts failed by the rescue passes.
    pub rescued: u64,
}

/// One pass: deletes every batch there is to delete, table after table,
/// while `keep_going()` answers true (asked before each batch). Answers
/// what it deleted. Each batch is one short transaction of its own
/// ([`store`]); an error ends the pass, keeping what earlier batches did.
pub async fn prune_once(
    pool: &PgPool,
    retention: impl Into<Retention>,
    batch: usize,
    keep_going: impl Fn() -> bool,
) -> sqlx::Result<Pruned> {
    let kept: Retention = retention.into();
    let retention = kept.finished;
    // Tasks first: their history goes with them, by index, before the walk
    // over the oldest history has to step over it. Workers stands for the
    // dead rows of workers and instances together.
    let walks = [
        Table::Tasks,
        Table::Leases,
        Table::LeaseEvents,
        Table::FailoverKills,
        Table::ScheduleTicks,
        Table::Workers,
        Table::Queues,
    ];
    let batch = batch.max(1);
    let mut total = Pruned::default();
    let schema = Schema::of(pool);
    let schema = &schema;
    let mut conn = pool.acquire().await?;
    for walked in walks {
        loop {
            if !keep_going() {
                return Ok(total);
            }
            let pruned = match walked {
                Table::Tasks => store::prune_tasks(&mut conn, schema, kept, batch).await?,
                Table::Leases => store::prune_leases(&mut conn, schema, retention, batch).await?,
                Table::LeaseEvents => {
                    store::prune_events(&mut conn, schema, retention, batch).await?
                }
                Table::FailoverKills => {
                    store::prune_failover_kills(&mut conn, schema, retention, batch).await?
                }
                Table::ScheduleTicks => {
                    store::prune_schedule_ticks(&mut conn, schema, retention, batch).await?
                }
                Table::Queues => store::prune_queues(&mut conn, schema, batch).await?,
                _ => store::prune_dead(&mut conn, schema, retention, batch).await?,
            };
            for table in Table::ALL {
                crate::metrics::pruned(table.as_str(), pruned.get(table));
            }
            total.add(&pruned);
            // A batch short of full found the end of what is old enough.
            let full = pruned.get(walked) as usize >= batch
                || (walked == Table::Workers && pruned.instances as usize >= batch);
            if !full {
                break;
            }
        }
    }
    Ok(total)
}

/// The maintenance job of one replica: a singleton on
/// `singleton:maintenance` that runs a pass every `interval` while this
/// replica holds the lease.
pub struct Maintenance {
    singleton: Singleton,
    progress: watch::Receiver<Progress>,
}

impl Maintenance {
    /// Starts it: this replica competes for `singleton:maintenance` as
    /// `holder`, and runs the job whenever it holds the lease.
    pub fn spawn(pool: PgPool, holder: Holder, config: MaintenanceConfig) -> Self {
        let (progress_tx, progress) = watch::channel(Progress::default());
        let progress_tx = Arc::new(progress_tx);
        let work: TermWork = {
            let pool = pool.clone();
            let holder = holder.clone();
            Arc::new(move |term| {
                Box::pin(run_term(
                    pool.clone(),
                    config,
                    holder.clone(),
                    term,
                    progress_tx.clone(),
                ))
            })
        };
        let singleton =
            Singleton::spawn_job(pool, RESOURCE, holder, config.timing, config.retry, work);
        singleton.start();
        Maintenance {
            singleton,
            progress,
        }
    }

    /// The singleton job: this replica's state (`Working` while it holds
    /// the lease) and term.
    pub fn singleton(&self) -> &Singleton {
        &self.singleton
    }

    /// A watch on what this replica's passes have done.
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.progress.clone()
    }

    /// Stops the job (after the batch in flight) and releases the lease if
    /// held, so another replica takes over at once.
    pub async fn shutdown(self) {
        self.singleton.shutdown().await;
    }

    /// Stops as a crash would: no release; the lease runs out.
    pub fn abort(self) {
        self.singleton.abort();
    }
}

/// The work of one term: a pass at once, then one every `interval`, and
/// beside it a rescue pass every `rescue_interval`, until the term ends.
async fn run_term(
    pool: PgPool,
    config: MaintenanceConfig,
    holder: Holder,
    term: HeldTerm,
    progress: Arc<watch::Sender<Progress>>,
) {
    tracing::info!(token = term.token(), "maintenance running on this replica");
    let rescue = crate::queue::rescuer::run_term(
        &pool,
        RESOURCE,
        &holder,
        &term,
        config.rescue_interval,
        config.batch,
        |rescued| progress.send_modify(|p| p.rescued += rescued.failed),
    );
    let prune = async {
        loop {
            let started = tokio::time::Instant::now();
            match prune_once(
                &pool,
                Retention::new(config.retention, config.failed_retention),
                config.batch,
                || term.is_held(),
            )
            .await
            {
                Ok(pruned) => {
                    if pruned.total() > 0 {
                        tracing::info!(
                            tasks = pruned.tasks,
                            leases = pruned.leases,
                            lease_events = pruned.lease_events,
                            failover_kills = pruned.failover_kills,
                            schedule_ticks = pruned.schedule_ticks,
                            instances = pruned.instances,
                            workers = pruned.workers,
                            took_ms = started.elapsed().as_millis() as u64,
                            "pruned what retention let go"
                        );
                    }
                    progress.send_modify(|p| {
                        p.passes += 1;
                        p.pruned.add(&pruned);
                    });
                }
                // Tried again next interval; the rows stay until then.
                Err(e) => tracing::warn!(error = %e, "maintenance pass failed"),
            }
            tokio::select! {
                _ = term.stop().cancelled() => break,
                _ = tokio::time::sleep(config.interval) => {}
            }
        }
    };
    tokio::join!(prune, rescue);
    tracing::info!(token = term.token(), "maintenance stopped on this replica");
}

//! The scheduler of one replica: a singleton on `singleton:scheduler`
//! whose holder wakes at each schedule's next tick and fires the due ticks
//! ([`store::fire`], fenced), and re-reads the schedules at least every
//! `poll` (a schedule added, paused or resumed through another replica).

use super::RESOURCE;
use super::cron::Cron;
use super::store::{self, FirePolicy, Fired};
use crate::db::Schema;
use crate::lease::Holder;
use crate::lease::client::LeaseTiming;
use crate::lease::singleton::{HeldTerm, Singleton, TermWork};
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// The most missed ticks [`CatchUp::All`](super::CatchUp::All) fires at
/// once, unless configured.
pub const DEFAULT_CATCH_UP_CAP: usize = 100;

/// How late a tick may fire and still be on time, unless configured: 5 s.
pub const DEFAULT_ON_TIME: Duration = Duration::from_secs(5);

/// Timing and limits of a [`Scheduler`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// The lease on `singleton:scheduler`: TTL, renewal, safety margin.
    pub timing: LeaseTiming,
    /// How long a non-holder waits before trying to acquire again.
    pub retry: Duration,
    /// How often the holder re-reads the schedules at the latest.
    pub poll: Duration,
    /// The catch-up cap and what counts as on time.
    pub policy: FirePolicy,
}

impl SchedulerConfig {
    /// A scheduler on a lease of `ttl` (renewed every third of it; a
    /// non-holder retries as often), re-reading the schedules every second,
    /// with the default cap and on-time bound.
    pub fn from_ttl(ttl: Duration) -> Self {
        let timing = LeaseTiming::from_ttl(ttl);
        SchedulerConfig {
            timing,
            retry: timing.renew_interval,
            poll: Duration::from_secs(1),
            policy: FirePolicy {
                cap: DEFAULT_CATCH_UP_CAP,
                on_time: DEFAULT_ON_TIME,
            },
        }
    }
}

impl Default for SchedulerConfig {
    /// A 15 s lease: a dead leader's ticks are fired by another replica
    /// within about 20 s (TTL, then one retry interval).
    fn default() -> Self {
        Self::from_ttl(Duration::from_secs(15))
    }
}

/// What this replica's scheduler has fired so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Ticks fired.
    pub fired: u64,
    /// Due ticks skipped by a catch-up policy.
    pub skipped: u64,
    /// Firings refused by the fence (this replica's term had ended).
    pub refused: u64,
}

/// The scheduler of one replica.
pub struct Scheduler {
    singleton: Singleton,
    nudge: Arc<Notify>,
    progress: watch::Receiver<Progress>,
}

/// Makes the local scheduler re-read the schedules now (after a change
/// through this replica).
#[derive(Clone, Debug)]
pub struct SchedulerHandle {
    nudge: Arc<Notify>,
}

impl SchedulerHandle {
    /// Re-read the schedules now rather than at the next poll.
    pub fn nudge(&self) {
        self.nudge.notify_one();
    }
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("state", &self.singleton.state())
            .field("token", &self.singleton.token())
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    /// Starts it: this replica competes for `singleton:scheduler` as
    /// `holder` and fires the ticks whenever it holds the lease.
    pub fn spawn(pool: PgPool, holder: Holder, config: SchedulerConfig) -> Self {
        let nudge = Arc::new(Notify::new());
        let (progress_tx, progress) = watch::channel(Progress::default());
        let progress_tx = Arc::new(progress_tx);
        let work: TermWork = {
            let pool = pool.clone();
            let holder = holder.clone();
            let nudge = nudge.clone();
            Arc::new(move |term| {
                Box::pin(run_term(
                    pool.clone(),
                    holder.clone(),
                    config,
                    term,
                    nudge.clone(),
                    progress_tx.clone(),
                ))
            })
        };
        let singleton =
            Singleton::spawn_job(pool, RESOURCE, holder, config.timing, config.retry, work);
        singleton.start();
        Scheduler {
            singleton,
            nudge,
            progress,
        }
    }

    /// A handle for request handlers.
    pub fn handle(&self) -> SchedulerHandle {
        SchedulerHandle {
            nudge: self.nudge.clone(),
        }
    }

    /// The singleton job: this replica's state and term.
    pub fn singleton(&self) -> &Singleton {
        &self.singleton
    }

    /// A watch on what this replica has fired.
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.progress.clone()
    }

    /// Stops firing (after the firing in flight commits) and releases the
    /// lease if held, so another replica takes over at once.
    pub async fn shutdown(self) {
        self.singleton.shutdown().await;
    }

    /// Stops as a crash would: no release; the lease runs out.
    pub fn abort(self) {
        self.singleton.abort();
    }
}

/// Parsed expressions by (cron, time zone), so a pass parses each once.
type Parsed = HashMap<(String, String), Option<Cron>>;

/// The work of one term: fire what is due, sleep until the next tick (or
/// the poll, or a nudge), again, until the term ends.
async fn run_term(
    pool: PgPool,
    me: Holder,
    config: SchedulerConfig,
    term: HeldTerm,
    nudge: Arc<Notify>,
    progress: Arc<watch::Sender<Progress>>,
) {
    let token = term.token();
    let schema = Schema::of(&pool);
    tracing::info!(holder = %me, token, "scheduler running on this replica");
    let mut parsed = Parsed::new();
    loop {
        if term.stop().is_cancelled() {
            break;
        }
        let wait = if term.is_held() {
            match pass(
                &pool,
                &schema,
                &me,
                token,
                config.policy,
                &mut parsed,
                &progress,
            )
            .await
            {
                Ok(next) => next.map_or(config.poll, |d| d.min(config.poll)),
                Err(e) => {
                    tracing::warn!(error = %e, "scheduler pass failed; trying again");
                    config.poll.min(Duration::from_millis(250))
                }
            }
        } else {
            // The lease may be about to run out; the driver stops us soon.
            Duration::from_millis(50)
        };
        // Not raced against `stop` while firing: a stop waits for the firing
        // in flight, so the lease is released only after it committed.
        tokio::select! {
            _ = term.stop().cancelled() => break,
            _ = nudge.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
    tracing::info!(holder = %me, token, "scheduler stopped on this replica");
}

/// One pass: fires every schedule with a due tick; answers how long until
/// the next tick of any schedule (by the database clock read at the pass).
async fn pass(
    pool: &PgPool,
    schema: &Schema,
    me: &Holder,
    token: i64,
    policy: FirePolicy,
    parsed: &mut Parsed,
    progress: &watch::Sender<Progress>,
) -> Result<Option<Duration>, store::ScheduleError> {
    let mut conn = pool.acquire().await?;
    let read_at = tokio::time::Instant::now();
    let (now, watched) = store::watched(&mut conn, schema).await?;
    let mut next: Option<DateTime<Utc>> = None;
    for w in &watched {
        let key = (w.cron.clone(), w.time_zone.clone());
        let cron = parsed
            .entry(key)
            .or_insert_with(|| match Cron::parse(&w.cron, &w.time_zone) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(schedule = %w.name, error = %e, "a schedule cannot be read; skipped");
                    None
                }
            });
        let Some(cron) = cron else { continue };
        let Some(first) = cron.next_after(w.cursor) else {
            continue;
        };
        if first <= now {
            match store::fire(&mut conn, schema, me, token, &w.name, policy).await? {
                Fired::Refused => {
                    progress.send_modify(|p| p.refused += 1);
                    tracing::warn!(holder = %me, token, "tick refused: this replica no longer holds the scheduler lease");
                    return Ok(None);
                }
                Fired::Nothing => {}
                Fired::Ticks { ticks, skipped } => {
                    progress.send_modify(|p| {
                        p.fired += ticks.len() as u64;
                        p.skipped += skipped as u64;
                    });
                    if skipped > 0 {
                        tracing::info!(schedule = %w.name, skipped, fired = ticks.len(), "missed ticks skipped by the catch-up policy");
                    }
                }
            }
        }
        if let Some(after) = cron.next_after(now.max(w.cursor)) {
            next = Some(next.map_or(after, |n| n.min(after)));
        }
    }
    if parsed.len() > 1000 {
        parsed.clear();
    }
    // Until the next tick by the database clock, less the time since it was
    // read; a millisecond more, so the tick is due when we look.
    Ok(next.map(|n| {
        let until = (n - now).to_std().unwrap_or_default() + Duration::from_millis(1);
        until.saturating_sub(read_at.elapsed())
    }))
}

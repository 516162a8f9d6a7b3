//! The faults: what each kind does, whom it picks (a worker holding a task,
//! the generator's or the scheduler's holder, PostgreSQL, a request whose
//! answer is lost), and the record of each one injected.

use super::db::Database;
use super::rig::{Rig, signal};
use super::{STANDBY_LAG, Setup, Timing, proxy};
use anyhow::{Result, bail};
use leasekeeper::worker::history::now_ms;
use leasekeeper_core::generator::RESOURCE;
use leasekeeper_core::queue::store;
use leasekeeper_core::schedule::RESOURCE as SCHEDULER;
use nix::sys::signal::{Signal, kill};
use rand::Rng;
use rand::rngs::StdRng;
use serde::Serialize;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

/// The kinds of fault, in report order. On the command line
/// (`--faults`) and in the report's `faults` list they are named in
/// snake case (`kill_worker`, `pg_failover`); the report's `per_fault` table
/// keys them by `FaultKind::key` (`killworker`, `pgfailover`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum FaultKind {
    KillWorker,
    PauseWorker,
    KillGeneratorHolder,
    RestartPostgres,
    LoseAnswer,
    /// kill -9 of the primary database node; the orchestrator promotes the
    /// standby.
    PgFailover,
    /// One instance cut off from the database for longer than the TTL.
    Partition,
    /// The standby's clock set off by `--skew-ms`, then a failover to it.
    ClockSkew,
    /// kill -9 of the instance holding `singleton:scheduler`.
    KillSchedulerHolder,
    /// SIGSTOP of the instance holding `singleton:scheduler` past the TTL.
    PauseSchedulerHolder,
    /// The liveness session of a live instance terminated
    /// (`pg_terminate_backend`): the database counts its holders dead, so
    /// their claims and terms end at once; the instance, alive, must stop
    /// trusting them, register again and go on serving.
    CutLiveness,
    /// A claim left uncommitted: a connection runs the claim statement and
    /// freezes before its commit, past the TTL, then commits. Its row and
    /// whatever else its transaction wrote stay locked meanwhile; the rest
    /// of the fleet must go on, and the late claim, expired when it lands,
    /// is taken over.
    FreezeMidClaim,
}

impl FaultKind {
    pub(super) const ALL: [FaultKind; 12] = [
        FaultKind::KillWorker,
        FaultKind::PauseWorker,
        FaultKind::KillGeneratorHolder,
        FaultKind::RestartPostgres,
        FaultKind::LoseAnswer,
        FaultKind::PgFailover,
        FaultKind::Partition,
        FaultKind::ClockSkew,
        FaultKind::KillSchedulerHolder,
        FaultKind::PauseSchedulerHolder,
        FaultKind::CutLiveness,
        FaultKind::FreezeMidClaim,
    ];

    /// What a run injects when `--faults` is not given: the kinds that need
    /// no highly available cluster.
    pub(super) const DEFAULT: [FaultKind; 9] = [
        FaultKind::KillWorker,
        FaultKind::PauseWorker,
        FaultKind::KillGeneratorHolder,
        FaultKind::RestartPostgres,
        FaultKind::LoseAnswer,
        FaultKind::KillSchedulerHolder,
        FaultKind::PauseSchedulerHolder,
        FaultKind::CutLiveness,
        FaultKind::FreezeMidClaim,
    ];

    /// Whether it needs the highly available cluster.
    pub(super) fn needs_ha(self) -> bool {
        matches!(self, FaultKind::PgFailover | FaultKind::ClockSkew)
    }

    /// Its key in the JSON report, e.g. `killworker`.
    pub(super) fn key(self) -> String {
        format!("{self:?}").to_lowercase()
    }

    pub(super) fn describe(self) -> &'static str {
        match self {
            FaultKind::KillWorker => "kill -9 worker",
            FaultKind::PauseWorker => "SIGSTOP worker past TTL",
            FaultKind::KillGeneratorHolder => "kill -9 generator holder",
            FaultKind::RestartPostgres => "PostgreSQL crash restart",
            FaultKind::LoseAnswer => "answer lost after commit",
            FaultKind::PgFailover => "primary killed, failover",
            FaultKind::Partition => "instance cut off from db",
            FaultKind::ClockSkew => "failover to a skewed clock",
            FaultKind::KillSchedulerHolder => "kill -9 scheduler holder",
            FaultKind::PauseSchedulerHolder => "SIGSTOP scheduler holder",
            FaultKind::CutLiveness => "liveness session cut",
            FaultKind::FreezeMidClaim => "claim frozen before commit",
        }
    }
}

/// One injected fault.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Fault {
    pub(super) kind: FaultKind,
    pub(super) at_ms: i64,
    /// Whom it hit (worker, instance, or the claim/complete whose answer was lost).
    pub(super) target: String,
    /// Tasks it caught in flight.
    pub(super) tasks: Vec<i64>,
    /// How long until the system had recovered, in ms (see the report).
    pub(super) recovery_ms: Option<f64>,
    /// For a PostgreSQL restart: how long it was down, and each process's
    /// recovery once it was back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) down_ms: Option<f64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) recoveries: BTreeMap<String, Option<f64>>,
    /// For a failover: how long the orchestrator took to promote the
    /// standby (its own detection and promotion), in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) promoted_ms: Option<f64>,
    /// For a clock_skew failover: the promoted standby's clock offset, as
    /// set and as measured just before the failover, in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) skew_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) skew_measured_ms: Option<f64>,
    /// For a partition of the generator's holder: when it stopped believing
    /// it held the generator (its own state, read from `/healthz`), and when
    /// another instance's term began (also for a cut liveness session of
    /// the generator's holder), in ms from the cut; and its writes that
    /// reached the database after the heal and were refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) stepped_down_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) taken_over_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) late_writes_refused: Option<i64>,
    /// For a claim frozen before its commit: tasks the rest of the fleet
    /// completed while it was frozen (none would mean it stalled them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) completed_while_frozen: Option<i64>,
    /// The generator holder a partition cut off.
    #[serde(skip)]
    pub(super) holder: Option<String>,
    /// The holder of `singleton:scheduler`, when the instance the fault
    /// hit (killed, paused, cut off) held it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) scheduler_holder: Option<String>,
    /// For a failover: two instances found running the generator at once
    /// (by their own state, polled as A, B, A: A running at both ends and B
    /// in between), described.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) two_generators: Option<String>,
    /// How far the database clock in force after the fault runs from the
    /// real one, in ms (the primary's libfaketime offset): `lease_events`
    /// times are read back through it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) db_clock_offset_ms: Option<f64>,
    /// For a failover: the last `lease_events` id before the primary's
    /// WAL sender stopped. Whatever the old primary wrote after it never
    /// reached the standby, so a later id was written by the new primary.
    #[serde(skip)]
    pub(super) events_before: Option<i64>,
    /// The worker killed or paused.
    #[serde(skip)]
    pub(super) worker: Option<String>,
    /// For a cut liveness session: the instance's id; the workers it
    /// vouched for (its own, and the worker processes streaming to it) are
    /// this id's and those in `cut_workers`.
    #[serde(skip)]
    pub(super) instance: Option<String>,
    #[serde(skip)]
    pub(super) cut_workers: Vec<String>,
    /// The request whose answer was lost.
    #[serde(skip)]
    pub(super) lost: Option<proxy::Target>,
}

impl Fault {
    /// The moment of the fault as the database clock in force read it.
    pub(super) fn db_at_ms(&self) -> i64 {
        self.at_ms + self.db_clock_offset_ms.unwrap_or(0.0).round() as i64
    }

    /// The bound its recovery is held to; `None` when it left nothing to
    /// recover (a lost completion stands; a kill or pause that caught no
    /// task, or a lost claim that granted none, leaves no lease behind).
    pub(super) fn bound(&self, t: &Timing) -> Option<Duration> {
        match self.kind {
            FaultKind::RestartPostgres => Some(t.recovery_bound),
            FaultKind::PgFailover | FaultKind::ClockSkew => Some(t.failover_bound),
            // The tasks its workers held are taken over (when it held the
            // generator, that too) within the takeover bound of the cut.
            FaultKind::Partition if self.tasks.is_empty() && self.holder.is_none() => None,
            FaultKind::Partition => Some(t.takeover_bound),
            FaultKind::KillGeneratorHolder
            | FaultKind::KillSchedulerHolder
            | FaultKind::PauseSchedulerHolder => Some(t.takeover_bound),
            // Its claims and terms are ended by the database at once: they
            // are taken over within a second or so, far inside the TTL.
            FaultKind::CutLiveness if self.tasks.is_empty() && self.holder.is_none() => None,
            FaultKind::CutLiveness => Some(t.takeover_bound.min(CUT_RESCUE_BOUND)),
            FaultKind::LoseAnswer if self.lost != Some(proxy::Target::Claim) => None,
            _ if self.tasks.is_empty() => None,
            _ => Some(t.takeover_bound),
        }
    }
}

/// A cut liveness session's holders are taken over within this long: the
/// others' check (every 200 ms), the ending statement, an idle claimer's
/// wake-up, and slack for a loaded two-core machine.
const CUT_RESCUE_BOUND: Duration = Duration::from_millis(2500);

/// The holder whose claim [`FaultKind::FreezeMidClaim`] freezes.
const FROZEN_CLAIMER: &str = "chaos-frozen-claimer";

/// Tasks completed so far, by their `released` events (`None`: the
/// database did not answer).
async fn completions(pool: &PgPool) -> Option<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM lease_events WHERE kind = 'released' AND resource LIKE 'task:%'",
    )
    .fetch_one(pool)
    .await
    .ok()
}

/// Tasks held right now (live claims), with their processors.
async fn held(pool: &PgPool) -> Vec<(i64, String)> {
    sqlx::query_as(
        "SELECT id, processor FROM tasks
          WHERE status = 'started' AND must_heartbeat_before > now() ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_default()
}

/// The instance holding the generator's live lease, and the holder's id.
async fn generator_holder(rig: &Rig, pool: &PgPool) -> Option<(usize, String)> {
    singleton_holder(rig, pool, RESOURCE).await
}

/// The instance holding the live lease on singleton `resource`, and the
/// holder's id.
async fn singleton_holder(rig: &Rig, pool: &PgPool, resource: &str) -> Option<(usize, String)> {
    let holder: String = sqlx::query_scalar(
        "SELECT holder FROM leases
          WHERE resource = $1 AND released_at IS NULL AND expires_at > now()",
    )
    .bind(resource)
    .fetch_optional(pool)
    .await
    .ok()
    .flatten()?;
    // Instance ids are `i-<port>-<hex>`.
    let port = holder.split('-').nth(1)?.parse::<u16>().ok()?;
    let slot = rig.instances.iter().position(|i| i.port == port)?;
    Some((slot, holder))
}

/// The holder of `singleton:scheduler` when it is instance `slot`.
async fn scheduler_holder_at(rig: &Rig, pool: &PgPool, slot: usize) -> Option<String> {
    singleton_holder(rig, pool, SCHEDULER)
        .await
        .filter(|(s, _)| *s == slot)
        .map(|(_, holder)| holder)
}

/// How long each instance took to answer a database-backed request again
/// (`None`: not within `patience`), keyed `instance :<port>`, counted from
/// `from` or, for an instance still cut off or paused by an earlier fault,
/// from the moment that fault is due to end. Every instance is asked at
/// each poll, so a slow one does not add to the others' times, and due
/// heals and resumes are applied while waiting (a partition that began
/// before a failover ends on time, not after this wait).
async fn serving_again(
    rig: &mut Rig,
    from: Instant,
    patience: Duration,
) -> BTreeMap<String, Option<f64>> {
    let starts: Vec<Instant> = rig
        .instances
        .iter()
        .map(|i| {
            [i.heal_at, i.resume_at]
                .into_iter()
                .flatten()
                .fold(from, Instant::max)
        })
        .collect();
    let mut took: Vec<Option<Option<f64>>> = vec![None; starts.len()];
    while took.iter().any(Option::is_none) {
        rig.resume_due(false);
        let now = Instant::now();
        let asked: Vec<usize> = (0..starts.len())
            .filter(|&i| took[i].is_none() && rig.instances[i].heal_at.is_none())
            .filter(|&i| rig.instances[i].resume_at.is_none())
            .collect();
        let answers =
            futures::future::join_all(asked.iter().map(|&i| rig.answers(rig.instances[i].port)))
                .await;
        for (&i, answered) in asked.iter().zip(answers) {
            if answered {
                took[i] = Some(Some(now.duration_since(starts[i]).as_secs_f64() * 1000.0));
            }
        }
        for (i, start) in starts.iter().enumerate() {
            if took[i].is_none() && start.elapsed() > patience {
                took[i] = Some(None);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rig.instances
        .iter()
        .zip(took)
        .map(|(i, t)| (format!("instance :{}", i.port), t.flatten()))
        .collect()
}

/// Watches the instances' own generator states (`/healthz`, from memory)
/// for `span`: an instance running it at two polls with another running it
/// at a poll in between means two instances ran it at once. Answers the
/// first such moment, described.
async fn two_generators(rig: &Rig, span: Duration) -> Option<String> {
    let running = |state: Option<String>| matches!(state.as_deref(), Some("working" | "renewing"));
    let start = Instant::now();
    let ports: Vec<u16> = rig.instances.iter().map(|i| i.port).collect();
    while start.elapsed() < span {
        for &a in &ports {
            for &b in ports.iter().filter(|&&b| b != a) {
                if running(rig.local_generator(a).await)
                    && running(rig.local_generator(b).await)
                    && running(rig.local_generator(a).await)
                {
                    return Some(format!(
                        "instances :{a} and :{b} both ran the generator {} ms into the watch",
                        start.elapsed().as_millis()
                    ));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Tasks held right now by the workers of instance `slot`.
async fn held_by_instance(rig: &Rig, pool: &PgPool, slot: usize) -> Vec<i64> {
    held(pool)
        .await
        .into_iter()
        .filter(|(_, p)| rig.workers.iter().any(|w| w.slot == slot && w.id == *p))
        .map(|(t, _)| t)
        .collect()
}

/// A live worker (not paused) holding a task, preferring `--trust-claims`
/// ones when `trusting`; else any live worker.
async fn pick_holder(
    rig: &Rig,
    pool: &PgPool,
    trusting: bool,
    rng: &mut StdRng,
) -> Option<(usize, Vec<i64>)> {
    let held = held(pool).await;
    let live: Vec<usize> = (0..rig.workers.len())
        .filter(|&i| rig.workers[i].resume_at.is_none())
        .collect();
    let holding: Vec<usize> = live
        .iter()
        .copied()
        .filter(|&i| held.iter().any(|(_, p)| *p == rig.workers[i].id))
        .collect();
    let preferred: Vec<usize> = holding
        .iter()
        .copied()
        .filter(|&i| !trusting || rig.workers[i].trust)
        .collect();
    let pool_of = [preferred, holding, live]
        .into_iter()
        .find(|v| !v.is_empty())?;
    let i = pool_of[rng.random_range(0..pool_of.len())];
    let tasks = held
        .iter()
        .filter(|(_, p)| *p == rig.workers[i].id)
        .map(|(t, _)| *t)
        .collect();
    Some((i, tasks))
}

/// A live `--trust-claims` worker holding a task of 2 s or more with less
/// than 0.4 s of work left, looked for during at most 3 s.
async fn about_to_complete(rig: &Rig, pool: &PgPool) -> Option<(usize, Vec<i64>)> {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let near: Vec<(i64, String)> = sqlx::query_as(
            "SELECT id, processor FROM tasks
              WHERE status = 'started' AND must_heartbeat_before > now()
                AND (task_data->>'sleep_duration_seconds')::float8 >= 2
                AND (task_data->>'sleep_duration_seconds')::float8
                    - EXTRACT(EPOCH FROM now() - started_at)::float8 BETWEEN 0.05 AND 0.4",
        )
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        for (task, processor) in near {
            if let Some(i) = rig
                .workers
                .iter()
                .position(|w| w.trust && w.resume_at.is_none() && w.id == processor)
            {
                return Some((i, vec![task]));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

pub(super) async fn inject(
    kind: FaultKind,
    cluster: &mut Database,
    rig: &mut Rig,
    pool: &PgPool,
    setup: &Setup,
    rng: &mut StdRng,
) -> Result<Option<Fault>> {
    let mut fault = Fault {
        kind,
        at_ms: now_ms(),
        target: String::new(),
        tasks: Vec::new(),
        recovery_ms: None,
        down_ms: None,
        recoveries: BTreeMap::new(),
        promoted_ms: None,
        skew_ms: None,
        skew_measured_ms: None,
        stepped_down_ms: None,
        taken_over_ms: None,
        late_writes_refused: None,
        holder: None,
        scheduler_holder: None,
        events_before: None,
        db_clock_offset_ms: None,
        two_generators: None,
        worker: None,
        instance: None,
        cut_workers: Vec::new(),
        completed_while_frozen: None,
        lost: None,
    };
    if let Database::Ha(ha) = cluster
        && let Some(primary) = ha.primary().await
    {
        fault.db_clock_offset_ms = Some(ha.skew_ms(primary) as f64);
    }
    match kind {
        FaultKind::KillWorker => {
            let Some((i, tasks)) = pick_holder(rig, pool, false, rng).await else {
                return Ok(None);
            };
            let mut w = rig.workers.remove(i);
            fault.at_ms = now_ms();
            signal(&w.child, Signal::SIGKILL);
            let _ = w.child.wait().await;
            rig.spawn_worker(w.slot)?;
            fault.worker = Some(w.id.clone());
            (fault.target, fault.tasks) = (w.id, tasks);
        }
        FaultKind::PauseWorker => {
            // Best: a `--trust-claims` holder of a long task about to send
            // its completion (the pause a stale write comes from: after the
            // last look at the deadline, before the write). Whoever takes
            // the task over is then still at work when the paused holder
            // wakes and writes, so only the token refuses that write.
            let found = match about_to_complete(rig, pool).await {
                Some(found) => Some(found),
                None => pick_holder(rig, pool, true, rng).await,
            };
            let Some((i, tasks)) = found else {
                return Ok(None);
            };
            let w = &mut rig.workers[i];
            fault.at_ms = now_ms();
            signal(&w.child, Signal::SIGSTOP);
            w.resume_at = Some(Instant::now() + setup.timing.pause);
            fault.target = format!("{}{}", w.id, if w.trust { " (--trust-claims)" } else { "" });
            fault.worker = Some(w.id.clone());
            fault.tasks = tasks;
        }
        FaultKind::KillGeneratorHolder | FaultKind::KillSchedulerHolder => {
            let resource = if kind == FaultKind::KillGeneratorHolder {
                RESOURCE
            } else {
                SCHEDULER
            };
            let Some((slot, holder)) = singleton_holder(rig, pool, resource).await else {
                return Ok(None);
            };
            fault.scheduler_holder = scheduler_holder_at(rig, pool, slot).await;
            let tasks = held_by_instance(rig, pool, slot).await;
            fault.at_ms = now_ms();
            signal(&rig.instances[slot].child, Signal::SIGKILL);
            let _ = rig.instances[slot].child.wait().await;
            let (port, link) = (rig.instances[slot].port, rig.instances[slot].link.port);
            rig.instances[slot].child = rig.spawn_instance(port, link)?;
            fault.target = holder;
            fault.tasks = tasks;
        }
        FaultKind::PauseSchedulerHolder => {
            let Some((slot, holder)) = singleton_holder(rig, pool, SCHEDULER).await else {
                return Ok(None);
            };
            fault.tasks = held_by_instance(rig, pool, slot).await;
            fault.at_ms = now_ms();
            signal(&rig.instances[slot].child, Signal::SIGSTOP);
            let resume_at = Instant::now() + setup.timing.pause;
            rig.instances[slot].resume_at = Some(resume_at);
            // The pause plays out here, not alongside the next fault: a
            // frozen instance would stall that fault's own measurements
            // (an instance answering again, a holder's takeover).
            while rig.instances[slot].resume_at.is_some() {
                rig.resume_due(false);
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            fault.target = format!("instance :{}, {holder}", rig.instances[slot].port);
            fault.scheduler_holder = Some(holder);
        }
        FaultKind::CutLiveness => {
            // The instance whose workers hold the most tasks (the
            // generator's holder on a tie), neither cut off nor paused.
            let generator = generator_holder(rig, pool).await;
            let mut best: Option<(usize, Vec<i64>)> = None;
            for slot in 0..rig.instances.len() {
                let i = &rig.instances[slot];
                if i.heal_at.is_some() || i.resume_at.is_some() {
                    continue;
                }
                let tasks = held_by_instance(rig, pool, slot).await;
                let holds_generator = generator.as_ref().is_some_and(|(g, _)| *g == slot);
                let better = match &best {
                    None => true,
                    Some((_, t)) => {
                        tasks.len() > t.len() || (tasks.len() == t.len() && holds_generator)
                    }
                };
                if better {
                    best = Some((slot, tasks));
                }
            }
            let Some((slot, tasks)) = best else {
                return Ok(None);
            };
            let port = rig.instances[slot].port;
            // Its liveness session, by the name it connects with.
            let session: Option<(i32, String)> = sqlx::query_as(
                "SELECT pid, substr(application_name, length('leasekeeper liveness ') + 1)
                   FROM pg_stat_activity
                  WHERE application_name LIKE 'leasekeeper liveness i-' || $1 || '-%'
                  ORDER BY backend_start DESC LIMIT 1",
            )
            .bind(port.to_string())
            .fetch_optional(pool)
            .await
            .ok()
            .flatten();
            let Some((pid, instance)) = session else {
                return Ok(None);
            };
            fault.holder = generator
                .filter(|(g, _)| *g == slot)
                .map(|(_, holder)| holder);
            fault.scheduler_holder = scheduler_holder_at(rig, pool, slot).await;
            fault.cut_workers = rig
                .workers
                .iter()
                .filter(|w| w.slot == slot)
                .map(|w| w.id.clone())
                .collect();
            fault.at_ms = now_ms();
            let cut: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .fetch_one(pool)
                .await
                .unwrap_or(false);
            if !cut {
                return Ok(None);
            }
            fault.target = format!("instance :{port} ({instance})");
            fault.instance = Some(instance);
            fault.tasks = tasks;
        }
        FaultKind::FreezeMidClaim => {
            // The claim statement, as a worker's instance runs it, in a
            // transaction this connection then leaves open past the TTL.
            let schema = leasekeeper_core::db::Schema::of(pool);
            let frozen_holder = leasekeeper_core::lease::Holder::parse(FROZEN_CLAIMER)?;
            let mut tx = pool.begin().await?;
            let started = now_ms();
            let claimed =
                store::claim_next(&mut tx, &schema, &frozen_holder, setup.timing.ttl).await;
            let task = match claimed {
                Ok(Some(task)) => task,
                _ => {
                    let _ = tx.rollback().await;
                    return Ok(None);
                }
            };
            let done_before = completions(pool).await;
            let frozen = Instant::now();
            while frozen.elapsed() < setup.timing.pause {
                rig.resume_due(false);
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            fault.completed_while_frozen = match (done_before, completions(pool).await) {
                (Some(before), Some(after)) => Some(after - before),
                _ => None,
            };
            // Late: the claim lands already expired, and is taken over.
            if tx.commit().await.is_err() {
                return Ok(None);
            }
            fault.at_ms = now_ms();
            fault.target = format!(
                "task {} claimed by {FROZEN_CLAIMER}, committed {} ms later",
                task.id,
                fault.at_ms - started
            );
            fault.tasks = vec![task.id];
        }
        FaultKind::Partition => {
            // The generator's holder when there is one (the case that tests
            // stepping down), else the scheduler's, else any instance (its
            // workers' tasks).
            let (slot, holder) = match generator_holder(rig, pool).await {
                Some((slot, holder)) => (slot, Some(holder)),
                None => match singleton_holder(rig, pool, SCHEDULER).await {
                    Some((slot, _)) => (slot, None),
                    None => (rng.random_range(0..rig.instances.len()), None),
                },
            };
            if rig.instances[slot].heal_at.is_some() {
                return Ok(None);
            }
            fault.tasks = held_by_instance(rig, pool, slot).await;
            fault.scheduler_holder = scheduler_holder_at(rig, pool, slot).await;
            fault.at_ms = now_ms();
            let cut = Instant::now();
            rig.instances[slot].link.cut();
            rig.instances[slot].heal_at = Some(cut + setup.timing.partition);
            let port = rig.instances[slot].port;
            fault.target = match &holder {
                Some(h) => format!("instance :{port}, generator holder {h}"),
                None => format!("instance :{port}"),
            };
            if holder.is_some() {
                // Watch it step down by its own clock: it cannot reach the
                // database, so only its trust deadline can tell it to stop.
                while cut.elapsed() < setup.timing.partition {
                    rig.resume_due(false);
                    let state = rig.local_generator(port).await;
                    if !matches!(state.as_deref(), Some("working" | "renewing")) {
                        fault.stepped_down_ms = Some(cut.elapsed().as_secs_f64() * 1000.0);
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
            fault.holder = holder;
        }
        FaultKind::PgFailover | FaultKind::ClockSkew => {
            let Database::Ha(ha) = cluster else {
                bail!("{} needs the highly available cluster", kind.describe());
            };
            let Some(primary) = ha.primary().await else {
                return Ok(None);
            };
            let standby = 1 - primary;
            // Not before the last failover's old primary is back as a
            // streaming standby: one node alone has nowhere to fail over to.
            if ha.wait_standby(standby, Instant::now()).await.is_err() {
                return Ok(None);
            }
            if kind == FaultKind::ClockSkew {
                // Ahead or behind by the configured amount, at random.
                let skew = if rng.random_bool(0.5) {
                    setup.skew_ms
                } else {
                    -setup.skew_ms
                };
                ha.set_skew(standby, skew)?;
                // libfaketime re-reads the offset once a second.
                tokio::time::sleep(Duration::from_millis(1300)).await;
                fault.skew_ms = Some(skew);
                fault.skew_measured_ms = ha.clock_offset_ms(standby).await;
            }
            fault.tasks = held(pool).await.into_iter().map(|(t, _)| t).collect();
            // The standby falls behind first, as under load or on a slow
            // link: the primary's WAL sender to it stops for a moment (what
            // it has not sent dies with the primary). With synchronous
            // replication, commits wait meanwhile and are never
            // acknowledged; with asynchronous, the primary acknowledges
            // commits the standby never receives.
            if let Some(pid) = ha.wal_sender_to(standby).await {
                let _ = kill(pid, Signal::SIGSTOP);
            }
            // Read after the stop: every id the standby has is at most this
            // (a read does not wait for the standby).
            fault.events_before = sqlx::query_scalar("SELECT max(id) FROM lease_events")
                .fetch_one(pool)
                .await
                .ok()
                .flatten();
            tokio::time::sleep(STANDBY_LAG).await;
            fault.at_ms = now_ms();
            let died = Instant::now();
            ha.kill_node(primary).await;
            fault.target = format!(
                "primary {} killed, {} promoted{}",
                ha.node_name(primary),
                ha.node_name(standby),
                match fault.skew_ms {
                    Some(ms) => format!(" with its clock {ms:+} ms off"),
                    None => String::new(),
                }
            );
            // From now on the promoted standby's clock is the database's.
            fault.db_clock_offset_ms = Some(fault.skew_measured_ms.unwrap_or(0.0));
            fault.promoted_ms = ha
                .wait_primary(standby, setup.timing.failover_bound * 2)
                .await
                .map(|at| (at - died).as_secs_f64() * 1000.0);
            fault.recoveries = serving_again(rig, died, setup.timing.failover_bound * 2).await;
            // Until every lease of the old primary has run out: does any
            // moment find two instances both running the generator?
            fault.two_generators = two_generators(rig, setup.timing.ttl).await;
            // The dead node comes back as the new standby (Patroni rewinds
            // it); its clock is the real one again.
            ha.set_skew(primary, 0)?;
            ha.start_node(primary)?;
        }
        FaultKind::RestartPostgres => {
            let Database::Single(cluster) = cluster else {
                bail!("restart_postgres needs the single embedded server");
            };
            fault.tasks = held(pool).await.into_iter().map(|(t, _)| t).collect();
            fault.at_ms = now_ms();
            cluster.crash_restart().await?;
            let up = now_ms();
            fault.down_ms = Some((up - fault.at_ms) as f64);
            fault.target = "postgres".into();
            // The instances must answer database-backed requests again.
            fault.recoveries =
                serving_again(rig, Instant::now(), setup.timing.recovery_bound * 2).await;
            // Workers and the generator are measured after the round, from
            // the history and lease_events (see `measure`); `at_ms` moves to
            // the moment PostgreSQL was back.
            fault.at_ms = up;
        }
        FaultKind::LoseAnswer => {
            let target = if rng.random_bool(0.5) {
                proxy::Target::Claim
            } else {
                proxy::Target::Complete
            };
            let slot = rng.random_range(0..rig.instances.len());
            let proxy = &rig.instances[slot].proxy;
            proxy.arm(target);
            let armed_at = Instant::now();
            while proxy.is_armed() && armed_at.elapsed() < Duration::from_secs(3) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            proxy.disarm();
            let Some(dropped) = proxy.take_dropped().pop() else {
                return Ok(None);
            };
            fault.at_ms = dropped.at_ms;
            fault.target = format!("{target:?} on :{}", rig.instances[slot].port).to_lowercase();
            fault.lost = Some(target);
            fault.tasks = dropped.task.into_iter().collect();
        }
    }
    Ok(Some(fault))
}

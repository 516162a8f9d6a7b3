//! The faults: what each kind does, whom it picks (a worker holding a task,
//! the generator's holder, PostgreSQL, a request whose answer is lost), and
//! the record of each one injected.

use super::rig::{Rig, signal};
use super::{PAUSE, RECOVERY_BOUND, TAKEOVER_BOUND, proxy};
use crate::db::embedded::EmbeddedPostgres;
use crate::generator::RESOURCE;
use crate::worker::history::now_ms;
use anyhow::Result;
use nix::sys::signal::Signal;
use rand::Rng;
use rand::rngs::StdRng;
use serde::Serialize;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

/// The kinds of fault, in report order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    KillWorker,
    PauseWorker,
    KillGeneratorHolder,
    RestartPostgres,
    LoseAnswer,
}

impl FaultKind {
    pub(super) const ALL: [FaultKind; 5] = [
        FaultKind::KillWorker,
        FaultKind::PauseWorker,
        FaultKind::KillGeneratorHolder,
        FaultKind::RestartPostgres,
        FaultKind::LoseAnswer,
    ];

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
    pub(super) tasks: Vec<i32>,
    /// How long until the system had recovered, in ms (see the report).
    pub(super) recovery_ms: Option<f64>,
    /// For a PostgreSQL restart: how long it was down, and each process's
    /// recovery once it was back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) down_ms: Option<f64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) recoveries: BTreeMap<String, Option<f64>>,
    /// The worker killed or paused.
    #[serde(skip)]
    pub(super) worker: Option<String>,
    /// The request whose answer was lost.
    #[serde(skip)]
    pub(super) lost: Option<proxy::Target>,
}

impl Fault {
    /// The bound its recovery is held to; `None` when it left nothing to
    /// recover (a lost completion stands; a kill or pause that caught no
    /// task, or a lost claim that granted none, leaves no lease behind).
    pub(super) fn bound(&self) -> Option<Duration> {
        match self.kind {
            FaultKind::RestartPostgres => Some(RECOVERY_BOUND),
            FaultKind::KillGeneratorHolder => Some(TAKEOVER_BOUND),
            FaultKind::LoseAnswer if self.lost != Some(proxy::Target::Claim) => None,
            _ if self.tasks.is_empty() => None,
            _ => Some(TAKEOVER_BOUND),
        }
    }
}

/// Tasks held right now (live claims), with their processors.
async fn held(pool: &PgPool) -> Vec<(i32, String)> {
    sqlx::query_as(
        "SELECT id, processor FROM tasks
          WHERE status = 'started' AND must_heartbeat_before > now() ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap_or_default()
}

/// A live worker (not paused) holding a task, preferring `--trust-claims`
/// ones when `trusting`; else any live worker.
async fn pick_holder(
    rig: &Rig,
    pool: &PgPool,
    trusting: bool,
    rng: &mut StdRng,
) -> Option<(usize, Vec<i32>)> {
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
async fn about_to_complete(rig: &Rig, pool: &PgPool) -> Option<(usize, Vec<i32>)> {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let near: Vec<(i32, String)> = sqlx::query_as(
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
    cluster: &mut EmbeddedPostgres,
    rig: &mut Rig,
    pool: &PgPool,
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
        worker: None,
        lost: None,
    };
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
            w.resume_at = Some(Instant::now() + PAUSE);
            fault.target = format!("{}{}", w.id, if w.trust { " (--trust-claims)" } else { "" });
            fault.worker = Some(w.id.clone());
            fault.tasks = tasks;
        }
        FaultKind::KillGeneratorHolder => {
            let holder: Option<String> = sqlx::query_scalar(
                "SELECT holder FROM leases
                  WHERE resource = $1 AND released_at IS NULL AND expires_at > now()",
            )
            .bind(RESOURCE)
            .fetch_optional(pool)
            .await
            .ok()
            .flatten();
            // Instance ids are `i-<port>-<hex>`.
            let port = holder
                .as_deref()
                .and_then(|h| h.split('-').nth(1))
                .and_then(|p| p.parse::<u16>().ok());
            let Some(slot) = rig.instances.iter().position(|i| Some(i.port) == port) else {
                return Ok(None);
            };
            let tasks: Vec<i32> = held(pool)
                .await
                .into_iter()
                .filter(|(_, p)| rig.workers.iter().any(|w| w.slot == slot && w.id == *p))
                .map(|(t, _)| t)
                .collect();
            fault.at_ms = now_ms();
            signal(&rig.instances[slot].child, Signal::SIGKILL);
            let _ = rig.instances[slot].child.wait().await;
            let port = rig.instances[slot].port;
            rig.instances[slot].child = rig.spawn_instance(port)?;
            fault.target = holder.unwrap_or_default();
            fault.tasks = tasks;
        }
        FaultKind::RestartPostgres => {
            fault.tasks = held(pool).await.into_iter().map(|(t, _)| t).collect();
            fault.at_ms = now_ms();
            cluster.crash_restart().await?;
            let up = now_ms();
            fault.down_ms = Some((up - fault.at_ms) as f64);
            fault.target = "postgres".into();
            // The instances must answer database-backed requests again.
            let start = Instant::now();
            for instance in &rig.instances {
                let port = instance.port;
                let took = loop {
                    if rig.answers(port).await {
                        break Some(start.elapsed().as_secs_f64() * 1000.0);
                    }
                    if start.elapsed() > RECOVERY_BOUND * 2 {
                        break None;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                fault.recoveries.insert(format!("instance :{port}"), took);
            }
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

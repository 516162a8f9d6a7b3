//! `leasekeeper chaos`: the fault harness.
//!
//! Each round runs on a fresh database of a private PostgreSQL cluster the
//! harness controls (`target/leasekeeper-chaos-db`): two `leasekeeper serve`
//! instances (the generator running, 2 s TTL) and six `leasekeeper worker`
//! processes reaching them through [`proxy::Proxy`], while the harness
//! enqueues a task every 150 ms. Every 5-10 s (3-5 s with `--quick`) it
//! injects the next fault of a shuffled cycle:
//!
//! 1. `kill -9` of a worker process holding a task (a new one replaces it);
//! 2. `SIGSTOP` of a worker holding a task for the TTL + 1.5 s, then
//!    `SIGCONT`: the even-numbered workers run with `--trust-claims`, so the
//!    paused holder really sends its stale completion;
//! 3. `kill -9` of the instance holding the generator lease (restarted on
//!    its port at once, with a new id);
//! 4. a PostgreSQL crash (`pg_ctl stop -m immediate`) and restart;
//! 5. an answer lost after the server committed: the proxy lets the next
//!    claim or completion through and swallows the answer.
//!
//! Then the round drains (faults stop, the generator is stopped, the queue
//! runs empty), the processes stop, and [`check::check`] compares the
//! database with the workers' history ([`history`]). Once per run, 500
//! barrier races ([`race`]) run on a database of their own. The report
//! gives, per fault kind, faults injected, tasks affected and how they
//! ended, stale writes refused and recovery times; the run fails when any
//! invariant is broken or any recovery took longer than its bound.

pub mod check;
pub mod history;
pub mod proxy;
pub mod race;

use crate::cli::ChaosArgs;
use crate::db::embedded::EmbeddedPostgres;
use crate::db::{Schema, connect_options, migrate, pool_options};
use crate::generator::{Desired, RESOURCE};
use crate::queue::store;
use crate::settings::Settings;
use anyhow::{Context, Result, bail};
use chrono::{DateTime, Utc};
use history::{Op, OpKind, Outcome, now_ms};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::PgPool;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The lease TTL of every process in the harness.
const TTL: Duration = Duration::from_secs(2);
/// How long a paused worker stays frozen: past its lease.
const PAUSE: Duration = Duration::from_millis(3500);
/// Every process must work again within this long after PostgreSQL is back.
const RECOVERY_BOUND: Duration = Duration::from_secs(10);
/// A takeover must happen within this long of a holder's death: the TTL,
/// plus the claimers' idle poll (at most 0.5 s) and slack for a loaded
/// two-core machine.
const TAKEOVER_BOUND: Duration = Duration::from_secs(5);
/// The end of a round without new faults (TTL + poll + slack).
const QUIET: Duration = Duration::from_secs(4);
const WORKERS: usize = 6;
const INSTANCES: usize = 2;
const BARRIER_ROUNDS: usize = 500;

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
    const ALL: [FaultKind; 5] = [
        FaultKind::KillWorker,
        FaultKind::PauseWorker,
        FaultKind::KillGeneratorHolder,
        FaultKind::RestartPostgres,
        FaultKind::LoseAnswer,
    ];

    /// Its key in the JSON report, e.g. `killworker`.
    fn key(self) -> String {
        format!("{self:?}").to_lowercase()
    }

    fn describe(self) -> &'static str {
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
struct Fault {
    kind: FaultKind,
    at_ms: i64,
    /// Whom it hit (worker, instance, or the claim/complete whose answer was lost).
    target: String,
    /// Tasks it caught in flight.
    tasks: Vec<i32>,
    /// How long until the system had recovered, in ms (see the report).
    recovery_ms: Option<f64>,
    /// For a PostgreSQL restart: how long it was down, and each process's
    /// recovery once it was back.
    #[serde(skip_serializing_if = "Option::is_none")]
    down_ms: Option<f64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    recoveries: BTreeMap<String, Option<f64>>,
    /// The worker killed or paused.
    #[serde(skip)]
    worker: Option<String>,
    /// The request whose answer was lost.
    #[serde(skip)]
    lost: Option<proxy::Target>,
}

impl Fault {
    /// The bound its recovery is held to; `None` when it left nothing to
    /// recover (a lost completion stands; a kill or pause that caught no
    /// task, or a lost claim that granted none, leaves no lease behind).
    fn bound(&self) -> Option<Duration> {
        match self.kind {
            FaultKind::RestartPostgres => Some(RECOVERY_BOUND),
            FaultKind::KillGeneratorHolder => Some(TAKEOVER_BOUND),
            FaultKind::LoseAnswer if self.lost != Some(proxy::Target::Claim) => None,
            _ if self.tasks.is_empty() => None,
            _ => Some(TAKEOVER_BOUND),
        }
    }
}

struct Instance {
    port: u16,
    proxy: proxy::Proxy,
    child: Child,
}

struct WorkerProc {
    id: String,
    child: Child,
    /// The instance it works for.
    slot: usize,
    trust: bool,
    /// When a paused worker is to be continued.
    resume_at: Option<Instant>,
}

/// The processes of one round.
struct Rig {
    exe: PathBuf,
    dir: PathBuf,
    url: String,
    /// The schema of the round's tables, the harness's and its servers'.
    schema: Schema,
    config: PathBuf,
    instances: Vec<Instance>,
    workers: Vec<WorkerProc>,
    /// Worker processes started so far (names them).
    spawned: usize,
    instance_starts: usize,
    http: reqwest::Client,
}

fn pid(child: &Child) -> Option<Pid> {
    child.id().map(|id| Pid::from_raw(id as i32))
}

fn signal(child: &Child, sig: Signal) {
    if let Some(pid) = pid(child) {
        let _ = kill(pid, sig);
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Rig {
    fn base_command(&self, log: &str) -> Result<Command> {
        let mut cmd = Command::new(&self.exe);
        cmd.env("LEASEKEEPER_CONFIG", &self.config)
            .env("LEASEKEEPER_SCHEMA", self.schema.as_str())
            .env("LEASEKEEPER_LEASE_TTL_SECS", TTL.as_secs_f64().to_string())
            .env("LEASEKEEPER_CHAOS", "0")
            .env("LEASEKEEPER_WORKERS", "0")
            .env("LEASEKEEPER_MAX_ATTEMPTS", "10")
            .env("LEASEKEEPER_GENERATOR_INTERVAL_SECS", "0.5")
            .env("LEASEKEEPER_GENERATOR_MAX_SLEEP_SECS", "1")
            .env_remove("LEASEKEEPER_RENEW_INTERVAL_SECS")
            .env_remove("LEASEKEEPER_HEARTBEAT_INTERVAL_SECS")
            .env_remove("LEASEKEEPER_ADMIN_TOKEN")
            .env("RUST_LOG", "warn,sqlx=error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join(log))?)
            .kill_on_drop(true);
        Ok(cmd)
    }

    /// Starts `leasekeeper serve` on `port` (each start logs to a file of its own).
    fn spawn_instance(&mut self, port: u16) -> Result<Child> {
        self.instance_starts += 1;
        self.base_command(&format!("instance-{port}-{}.log", self.instance_starts))?
            .args(["serve", "--addr", &format!("127.0.0.1:{port}")])
            .env("DATABASE_URL", &self.url)
            .spawn()
            .context("starting leasekeeper serve")
    }

    fn spawn_worker(&mut self, slot: usize) -> Result<()> {
        let n = self.spawned;
        self.spawned += 1;
        let id = format!("chaos-w{n}");
        let trust = n.is_multiple_of(2);
        let server = format!("http://127.0.0.1:{}", self.instances[slot].proxy.port);
        let history = self.dir.join(format!("{id}.jsonl"));
        let mut cmd = self.base_command(&format!("{id}.log"))?;
        cmd.args(["worker", "--server", &server, "--id", &id, "--history"])
            .arg(&history);
        if trust {
            cmd.arg("--trust-claims");
        }
        let child = cmd.spawn().context("starting leasekeeper worker")?;
        self.workers.push(WorkerProc {
            id,
            child,
            slot,
            trust,
            resume_at: None,
        });
        Ok(())
    }

    /// Whether instance `port` answers a database-backed request.
    async fn answers(&self, port: u16) -> bool {
        let url = format!("http://127.0.0.1:{port}/api/generator/status");
        matches!(
            self.http.get(&url).timeout(Duration::from_secs(2)).send().await,
            Ok(r) if r.status().is_success()
        )
    }

    async fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for instance in &self.instances {
            while !self.answers(instance.port).await {
                if Instant::now() > deadline {
                    bail!(
                        "instance on port {} did not start; see {}",
                        instance.port,
                        self.dir.display()
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Continues every paused worker whose pause is over (all with `force`).
    fn resume_due(&mut self, force: bool) {
        let now = Instant::now();
        for w in &mut self.workers {
            if w.resume_at.is_some_and(|at| force || at <= now) {
                signal(&w.child, Signal::SIGCONT);
                w.resume_at = None;
            }
        }
    }

    /// Stops every process: SIGTERM, then SIGKILL after 10 s.
    async fn shutdown(&mut self) {
        self.resume_due(true);
        let mut children: Vec<&mut Child> = self
            .workers
            .iter_mut()
            .map(|w| &mut w.child)
            .chain(self.instances.iter_mut().map(|i| &mut i.child))
            .collect();
        for child in &children {
            signal(child, Signal::SIGTERM);
        }
        for child in &mut children {
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
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

fn at(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// Milliseconds from `from_ms` to the first grant (acquired/taken_over) of
/// `resource` after it, from `lease_events`.
async fn next_grant(pool: &PgPool, resource: &str, from_ms: i64) -> Result<Option<f64>> {
    Ok(sqlx::query_scalar(
        "SELECT (EXTRACT(EPOCH FROM (at - $2)) * 1000)::float8 FROM lease_events
          WHERE resource = $1 AND kind IN ('acquired', 'taken_over') AND at > $2
          ORDER BY id LIMIT 1",
    )
    .bind(resource)
    .bind(at(from_ms))
    .fetch_optional(pool)
    .await?)
}

/// What a round came to.
struct RoundResult {
    faults: Vec<Fault>,
    checks: check::Checks,
    history: Vec<Op>,
    enqueued: usize,
    late: Vec<String>,
}

/// Runs the harness; fails when an invariant is broken. Of the program's own
/// settings only the schema is used: every process of the harness gets the
/// harness's (2 s TTL, no simulated workers, chaos off) through its
/// environment.
pub async fn run(settings: Settings, args: ChaosArgs) -> Result<()> {
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 5 }) as usize;
    let seconds = args.seconds.unwrap_or(if args.quick { 45 } else { 120 });
    let gaps = if args.quick {
        (3000, 5000)
    } else {
        (5000, 10000)
    };
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    eprintln!(
        "chaos: {rounds} round(s) of {seconds} s, a fault every {}-{} s, seed {seed}",
        gaps.0 / 1000,
        gaps.1 / 1000
    );
    let work = PathBuf::from("target/leasekeeper-chaos-run");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let work = work.canonicalize()?;
    let config = work.join("settings.toml");
    std::fs::write(&config, "")?;
    let mut cluster = EmbeddedPostgres::start(&args.cluster_dir)
        .await
        .context("starting the harness's PostgreSQL cluster")?;

    let outcome = async {
        let mut results = Vec::new();
        for round in 0..rounds {
            let dir = work.join(format!("round-{round}"));
            std::fs::create_dir_all(&dir)?;
            let result = one_round(
                &mut cluster,
                &settings.schema,
                &config,
                &dir,
                round,
                Duration::from_secs(seconds),
                gaps,
                &mut rng,
            )
            .await
            .with_context(|| format!("round {round}"))?;
            eprintln!(
                "chaos: round {} done: {} faults, {} tasks, violations: {}",
                round + 1,
                result.faults.len(),
                result.checks.tasks,
                result.checks.violations().len() + result.late.len()
            );
            results.push(result);
        }
        eprintln!("chaos: {BARRIER_ROUNDS} barrier races …");
        let pool = fresh_database(&cluster, "chaos_race", &settings.schema).await?;
        let races = race::run(&pool, BARRIER_ROUNDS).await;
        pool.close().await;
        anyhow::Ok((results, races))
    }
    .await;
    cluster.stop_if_started_here().await?;
    let (results, races) = outcome?;
    let report = report(seed, rounds, seconds, &results, &races);
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("report written to {}", path.display());
    }
    let violations = report["violations"].as_array().map_or(0, Vec::len);
    if violations > 0 {
        bail!(
            "{violations} invariant(s) broken; see the report above and the logs in {}",
            work.display()
        );
    }
    Ok(())
}

async fn fresh_database(cluster: &EmbeddedPostgres, name: &str, schema: &Schema) -> Result<PgPool> {
    cluster.recreate_database(name).await?;
    let pool = pool_options()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(connect_options(cluster.connect_options(name), schema))
        .await?;
    migrate(&pool, schema).await?;
    Ok(pool)
}

#[allow(clippy::too_many_arguments)]
async fn one_round(
    cluster: &mut EmbeddedPostgres,
    schema: &Schema,
    config: &Path,
    dir: &Path,
    round: usize,
    length: Duration,
    gaps: (u64, u64),
    rng: &mut StdRng,
) -> Result<RoundResult> {
    let name = format!("chaos_r{round}");
    let pool = fresh_database(cluster, &name, schema).await?;
    let mut rig = Rig {
        exe: std::env::current_exe()?,
        dir: dir.to_path_buf(),
        url: cluster.url(&name),
        schema: schema.clone(),
        config: config.to_path_buf(),
        instances: Vec::new(),
        workers: Vec::new(),
        spawned: 0,
        instance_starts: 0,
        http: reqwest::Client::new(),
    };
    for _ in 0..INSTANCES {
        let port = free_port()?;
        let child = rig.spawn_instance(port)?;
        let proxy = proxy::Proxy::start(port).await?;
        rig.instances.push(Instance { port, proxy, child });
    }
    let result = async {
        rig.wait_ready().await?;
        for k in 0..WORKERS {
            rig.spawn_worker(k % INSTANCES)?;
        }
        crate::generator::store::set_desired(
            &mut *pool.acquire().await?,
            Desired::Running,
            "chaos",
        )
        .await?;
        let (enqueued, faults) = faults_phase(cluster, &mut rig, &pool, length, gaps, rng).await?;
        drain(&mut rig, &pool).await;
        rig.shutdown().await;
        let (history, torn) = history::read_dir(dir)?;
        let mut checks = check::check(&pool, &history, torn).await?;
        let known: BTreeSet<i32> = sqlx::query_scalar("SELECT id FROM tasks")
            .fetch_all(&pool)
            .await?
            .into_iter()
            .collect();
        checks
            .lost
            .extend(enqueued.iter().filter(|id| !known.contains(id)));
        let faults = measure(&pool, faults, &history).await?;
        let late = late(&faults);
        anyhow::Ok(RoundResult {
            faults,
            checks,
            history,
            enqueued: enqueued.len(),
            late,
        })
    }
    .await;
    rig.shutdown().await;
    pool.close().await;
    result
}

/// Enqueues and injects faults for `length`; answers the ids of the tasks
/// whose enqueue was confirmed, and the faults.
async fn faults_phase(
    cluster: &mut EmbeddedPostgres,
    rig: &mut Rig,
    pool: &PgPool,
    length: Duration,
    gaps: (u64, u64),
    rng: &mut StdRng,
) -> Result<(Vec<i32>, Vec<Fault>)> {
    let stop = tokio_util::sync::CancellationToken::new();
    let enqueuer = {
        let (pool, stop) = (pool.clone(), stop.clone());
        let mut rng = StdRng::seed_from_u64(rng.random());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(150));
            while !stop.is_cancelled() {
                tick.tick().await;
                // Mostly short work; one task in five long enough that a
                // holder paused near its end is still being worked on by
                // the worker that took it over when the paused one wakes.
                let ms = if rng.random_bool(0.2) {
                    rng.random_range(2000..3000)
                } else {
                    rng.random_range(50..800)
                };
                let secs = f64::from(ms) / 1000.0;
                let data = json!({ "sleep_duration_seconds": secs });
                // An enqueue whose answer is lost (PostgreSQL crashing) is
                // not counted; the task, if it exists, is checked anyway.
                let enqueued = async {
                    let mut conn = pool.acquire().await?;
                    anyhow::Ok(store::enqueue(&mut conn, &data, 10, None).await?)
                }
                .await;
                if let Ok(task) = enqueued {
                    ids.push(task.id);
                }
            }
            ids
        })
    };
    let mut faults = Vec::new();
    let mut cycle = FaultKind::ALL;
    cycle.shuffle(rng);
    let end = Instant::now() + length;
    let mut next = Instant::now() + Duration::from_millis(rng.random_range(gaps.0..=gaps.1));
    let mut n = 0;
    while Instant::now() < end {
        rig.resume_due(false);
        reap(rig)?;
        // No new fault in the last seconds of a round: the last one must
        // play out (a lease run out, a term taken over) before the drain
        // stops the generator and continues paused workers.
        if Instant::now() >= next && Instant::now() + QUIET < end {
            let kind = cycle[n % cycle.len()];
            match inject(kind, cluster, rig, pool, rng).await? {
                Some(fault) => {
                    eprintln!(
                        "chaos: {} ({}; tasks {:?})",
                        kind.describe(),
                        fault.target,
                        fault.tasks
                    );
                    faults.push(fault);
                    n += 1;
                    if n % cycle.len() == 0 {
                        cycle.shuffle(rng);
                    }
                    next =
                        Instant::now() + Duration::from_millis(rng.random_range(gaps.0..=gaps.1));
                }
                // Nothing to hit right now (no generator holder, no request
                // to lose): the same kind again shortly.
                None => next = Instant::now() + Duration::from_millis(500),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let ids = enqueuer.await?;
    Ok((ids, faults))
}

/// Replaces worker processes that died on their own (none should).
fn reap(rig: &mut Rig) -> Result<()> {
    let mut dead = Vec::new();
    for (i, w) in rig.workers.iter_mut().enumerate() {
        if let Ok(Some(status)) = w.child.try_wait() {
            tracing::warn!(worker = %w.id, %status, "a worker process exited by itself");
            dead.push(i);
        }
    }
    for i in dead.into_iter().rev() {
        let w = rig.workers.remove(i);
        rig.spawn_worker(w.slot)?;
    }
    Ok(())
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

async fn inject(
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

/// Stops the faults' effects and waits until the queue is empty (at most
/// two minutes).
async fn drain(rig: &mut Rig, pool: &PgPool) {
    // A pause injected just before the end runs its full length: continued
    // early, its holder would still hold a live lease and complete
    // normally, and the fault would not be the one reported.
    while rig.workers.iter().any(|w| w.resume_at.is_some()) {
        rig.resume_due(false);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Ok(mut conn) = pool.acquire().await {
        let _ = crate::generator::store::set_desired(&mut conn, Desired::Stopped, "chaos").await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let open: Option<i64> =
            sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status IN ('pending', 'started')")
                .fetch_one(pool)
                .await
                .ok();
        let generator_live: Option<bool> = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM leases WHERE resource = $1
                             AND released_at IS NULL AND expires_at > now())",
        )
        .bind(RESOURCE)
        .fetch_one(pool)
        .await
        .ok();
        if open == Some(0) && generator_live == Some(false) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Fills in each fault's recovery time from `lease_events` and the history.
async fn measure(pool: &PgPool, mut faults: Vec<Fault>, history: &[Op]) -> Result<Vec<Fault>> {
    for fault in &mut faults {
        match fault.kind {
            // Until the task it held was taken over (the slowest, if several).
            FaultKind::KillWorker | FaultKind::PauseWorker if !fault.tasks.is_empty() => {
                let mut worst: Option<f64> = Some(0.0);
                for task in &fault.tasks {
                    let took = next_grant(pool, &format!("task:{task}"), fault.at_ms).await?;
                    worst = match (worst, took) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        _ => None,
                    };
                }
                fault.recovery_ms = worst;
            }
            // Until another term of the generator began.
            FaultKind::KillGeneratorHolder => {
                fault.recovery_ms = next_grant(pool, RESOURCE, fault.at_ms).await?;
            }
            FaultKind::RestartPostgres => {
                // Each worker's first accepted call sent after PostgreSQL
                // was back, and the generator's first renewal or grant.
                let workers: BTreeSet<&str> = history
                    .iter()
                    .filter(|op| op.sent_ms < fault.at_ms)
                    .map(|op| op.worker.as_str())
                    .collect();
                for worker in workers {
                    let first = history
                        .iter()
                        .filter(|op| {
                            op.worker == worker
                                && op.outcome == Outcome::Ok
                                && op.sent_ms >= fault.at_ms
                        })
                        .map(|op| (op.returned_ms - fault.at_ms) as f64)
                        .next();
                    // A worker killed by a later fault before it got going
                    // again proves nothing either way.
                    let later = history
                        .iter()
                        .any(|op| op.worker == worker && op.sent_ms >= fault.at_ms);
                    if later {
                        fault.recoveries.insert(worker.to_string(), first);
                    }
                }
                let generator: Option<f64> = sqlx::query_scalar(
                    "SELECT (EXTRACT(EPOCH FROM (at - $2)) * 1000)::float8 FROM lease_events
                      WHERE resource = $1 AND kind IN ('acquired', 'taken_over', 'renewed')
                        AND at > $2 ORDER BY id LIMIT 1",
                )
                .bind(RESOURCE)
                .bind(at(fault.at_ms))
                .fetch_optional(pool)
                .await?;
                fault.recoveries.insert("generator".into(), generator);
                fault.recovery_ms = fault
                    .recoveries
                    .values()
                    .try_fold(0.0f64, |worst, r| r.map(|r| worst.max(r)));
            }
            // A lost claim: until the task was taken over. A lost
            // completion: it stood (the task is processed), nothing to recover.
            FaultKind::LoseAnswer => {
                if fault.lost == Some(proxy::Target::Claim) {
                    if let Some(task) = fault.tasks.first() {
                        fault.recovery_ms =
                            next_grant(pool, &format!("task:{task}"), fault.at_ms).await?;
                    }
                } else {
                    fault.recovery_ms = Some(0.0);
                }
            }
            _ => {}
        }
    }
    Ok(faults)
}

/// Recoveries over their bound, described.
fn late(faults: &[Fault]) -> Vec<String> {
    let mut out = Vec::new();
    for f in faults {
        let Some(bound) = f.bound() else { continue };
        match f.recovery_ms {
            Some(ms) if ms <= bound.as_secs_f64() * 1000.0 => {}
            other => out.push(format!(
                "{} ({}, tasks {:?}): recovered after {} (bound {} s){}",
                f.kind.describe(),
                f.target,
                f.tasks,
                other.map_or("never".to_string(), |ms| format!("{:.0} ms", ms)),
                bound.as_secs(),
                if f.recoveries.is_empty() {
                    String::new()
                } else {
                    format!("; per process: {:?}", f.recoveries)
                }
            )),
        }
    }
    out
}

/// The whole run's report as JSON: per fault kind, the totals, the races,
/// and every violation.
fn report(
    seed: u64,
    rounds: usize,
    seconds: u64,
    results: &[RoundResult],
    races: &Result<race::RaceReport>,
) -> Value {
    let mut per_kind = serde_json::Map::new();
    for kind in FaultKind::ALL {
        let faults: Vec<(&RoundResult, &Fault)> = results
            .iter()
            .flat_map(|r| {
                r.faults
                    .iter()
                    .filter(|f| f.kind == kind)
                    .map(move |f| (r, f))
            })
            .collect();
        let (mut affected, mut processed, mut duplicates, mut lost, mut refused) = (0, 0, 0, 0, 0);
        let mut recoveries = crate::bench::Samples(Vec::new());
        let mut unrecovered = 0;
        for (r, f) in &faults {
            for task in &f.tasks {
                affected += 1;
                if r.checks.duplicates.contains(task) {
                    duplicates += 1;
                }
                if r.checks.lost.contains(task) {
                    lost += 1;
                } else {
                    processed += 1;
                }
            }
            refused += r
                .history
                .iter()
                .filter(|op| {
                    op.outcome == Outcome::Refused
                        && op.sent_ms >= f.at_ms
                        && op.task.is_some_and(|t| f.tasks.contains(&t))
                })
                .count();
            match f.recovery_ms {
                Some(ms) => recoveries.0.push(ms),
                None if f.bound().is_some() => unrecovered += 1,
                None => {}
            }
        }
        let stale_completions = if kind == FaultKind::PauseWorker {
            // The paused holders' own completions after SIGCONT, refused.
            json!(
                faults
                    .iter()
                    .map(|(r, f)| {
                        let worker = f.worker.as_deref().unwrap_or_default();
                        r.history
                            .iter()
                            .filter(|op| {
                                op.worker == worker
                                    && op.op == OpKind::Complete
                                    && op.outcome == Outcome::Refused
                                    && op.task.is_some_and(|t| f.tasks.contains(&t))
                            })
                            .count()
                    })
                    .sum::<usize>()
            )
        } else {
            Value::Null
        };
        per_kind.insert(
            kind.key(),
            json!({
                "name": kind.describe(),
                "faults": faults.len(),
                "tasks_caught": affected,
                "tasks_finished": processed,
                "duplicates": duplicates,
                "lost": lost,
                "stale_writes_refused": refused,
                "paused_holders_completions_refused": stale_completions,
                "recovery_ms_p50": recoveries.percentile(50.0),
                "recovery_ms_max": recoveries.percentile(100.0),
                "not_recovered": unrecovered,
            }),
        );
    }
    let sum = |f: &dyn Fn(&check::Checks) -> usize| -> usize {
        results.iter().map(|r| f(&r.checks)).sum()
    };
    let mut violations: Vec<String> = Vec::new();
    for (i, r) in results.iter().enumerate() {
        for v in r
            .checks
            .violations()
            .into_iter()
            .chain(r.late.iter().cloned())
        {
            violations.push(format!("round {}: {v}", i + 1));
        }
    }
    let races = match races {
        Ok(r) => {
            if r.old_won == 0 || r.new_won == 0 {
                violations.push(format!(
                    "barrier races: only one outcome ever happened ({r:?}): the race was not real"
                ));
            }
            json!({
                "rounds": r.rounds, "old_holder_won": r.old_won, "takeover_won": r.new_won,
                "neither": r.neither, "both": 0,
                "takeovers_recorded": r.takeovers_recorded,
                "refusals_recorded": r.refusals_recorded, "refusals_expected": r.refusals_expected,
            })
        }
        Err(e) => {
            violations.push(format!("barrier races: {e:#}"));
            json!({ "error": format!("{e:#}") })
        }
    };
    json!({
        "seed": seed,
        "rounds": rounds,
        "seconds_per_round": seconds,
        "per_fault": per_kind,
        "totals": {
            "tasks": sum(&|c| c.tasks),
            "enqueued_confirmed": results.iter().map(|r| r.enqueued).sum::<usize>(),
            "generated": sum(&|c| c.generated_tasks),
            "processed": sum(&|c| c.processed),
            "failed_after_max_attempts": sum(&|c| c.failed_after_max),
            "processed_confirmed_by_db_and_history": sum(&|c| c.confirmed_by_both),
            "processed_confirmed_by_db_only": sum(&|c| c.confirmed_by_database_only),
            "duplicates": sum(&|c| c.duplicates.len()),
            "lost": sum(&|c| c.lost.len()),
            "stale_writes_accepted": sum(&|c| c.stale_accepted.len()),
            "refused_heartbeats": sum(&|c| c.refused_heartbeats),
            "refused_completions": sum(&|c| c.refused_completions),
            "refused_failures": sum(&|c| c.refused_failures),
            "refusals_in_lease_events": sum(&|c| c.refusals_recorded),
            "refusals_missing_from_lease_events": sum(&|c| c.refusals_unrecorded),
            "claims_missing_from_lease_events": sum(&|c| c.claims_unrecorded),
            "takeovers": sum(&|c| c.takeovers),
            "takeovers_misrecorded": sum(&|c| c.takeovers_misrecorded),
            "unknown_outcomes": sum(&|c| c.unknown_outcomes),
            "token_order_violations": sum(&|c| c.token_order.len()),
            "two_live_holders": sum(&|c| c.overlaps.len()),
            "generator_terms": sum(&|c| c.generator_terms),
            "generated_outside_term": sum(&|c| c.generated_outside_term.len()),
            "history_ops": results.iter().map(|r| r.history.len()).sum::<usize>(),
            "torn_history_lines": sum(&|c| c.torn_history_lines),
        },
        "barrier_races": races,
        "faults": results.iter().flat_map(|r| r.faults.iter()).collect::<Vec<_>>(),
        "violations": violations,
    })
}

fn print_report(report: &Value) {
    println!(
        "\n{:<28} {:>6} {:>7} {:>8} {:>5} {:>4} {:>8} {:>9} {:>9}",
        "fault", "faults", "caught", "finished", "dups", "lost", "refused", "rec p50", "rec max"
    );
    let ms = |v: &Value| v.as_f64().map_or("-".to_string(), |v| format!("{v:.0} ms"));
    for kind in FaultKind::ALL {
        let row = &report["per_fault"][kind.key()];
        let n = |key: &str| row[key].to_string();
        println!(
            "{:<28} {:>6} {:>7} {:>8} {:>5} {:>4} {:>8} {:>9} {:>9}",
            kind.describe(),
            n("faults"),
            n("tasks_caught"),
            n("tasks_finished"),
            n("duplicates"),
            n("lost"),
            n("stale_writes_refused"),
            ms(&row["recovery_ms_p50"]),
            ms(&row["recovery_ms_max"]),
        );
    }
    println!("\ntotals:");
    if let Some(totals) = report["totals"].as_object() {
        for (k, v) in totals {
            println!("  {k:<40} {v}");
        }
    }
    println!("barrier races: {}", report["barrier_races"]);
    match report["violations"].as_array() {
        Some(v) if !v.is_empty() => {
            println!("\nVIOLATIONS:");
            for line in v {
                println!("  {}", line.as_str().unwrap_or_default());
            }
        }
        _ => println!("\nall invariants hold"),
    }
}

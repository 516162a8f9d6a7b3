//! `leasekeeper-tools chaos`: the fault harness.
//!
//! Each round runs on a fresh database of a private PostgreSQL cluster the
//! harness controls: the single embedded server
//! (`target/leasekeeper-chaos-db`), or, when `pg_failover` or `clock_skew`
//! is among the `--faults`, a highly available cluster of two nodes under
//! Patroni behind HAProxy (`ha.rs`, `target/leasekeeper-ha-db`). Two
//! `leasekeeper serve` instances (the generator running, 2 s TTL unless
//! `--ttl-secs`), each with one simulated worker that prefetches (claims
//! two tasks ahead into its local queue), reach it through links a
//! partition can cut (`cut.rs`); six
//! `leasekeeper worker` processes reach the instances through
//! [`proxy::Proxy`], while the harness enqueues a task every 150 ms (and
//! every 6 s a burst of keyed ones) and a schedule ticks every second
//! (catch-up `all`, `schedule.rs`). The queue they all serve is limited
//! before any process starts (issue 39: at most so many started, per key,
//! and claims a second, `limits.rs`). Every
//! 5-10 s (3-5 s with `--quick`) it injects the next fault of a shuffled
//! cycle of the chosen kinds:
//!
//! 1. `kill -9` of a worker process holding a task (a new one replaces it);
//! 2. `SIGSTOP` of a worker holding a task for the TTL + 1.5 s, then
//!    `SIGCONT`: the even-numbered workers run with `--trust-claims`, so the
//!    paused holder really sends its stale completion;
//! 3. `kill -9` of the instance holding the generator lease (restarted on
//!    its port at once, with a new id);
//! 4. a PostgreSQL crash (`pg_ctl stop -m immediate`) and restart;
//! 5. an answer lost after the server committed: the proxy lets the next
//!    claim or completion through and swallows the answer;
//! 6. `pg_failover`: the standby falls 1 s behind, the primary node dies,
//!    Patroni promotes the standby, the dead node rejoins as standby;
//! 7. `partition`: the generator holder's link to the database is cut for
//!    the TTL + 2.5 s, then healed;
//! 8. `clock_skew`: a failover to a standby whose clock is `--skew-ms` off;
//! 9. `kill -9` of the instance holding `singleton:scheduler` (restarted at
//!    once);
//! 10. `SIGSTOP` of the instance holding `singleton:scheduler` for the TTL +
//!     1.5 s, then `SIGCONT`.
//!
//! Every run is locked: the instances get an admin token and a worker
//! token drawn for the run, every worker presents the worker token, and
//! each round two workers without it (none, and a made-up one) must be
//! refused and stop by themselves, leaving nothing behind
//! ([`check::intruders`]).
//!
//! Then the round drains (faults stop, the schedule is paused once it has
//! caught up, the generator is stopped, the queue runs empty), the
//! processes stop, [`check::check`] compares the database with the
//! workers' history ([`history`]), the schedule's ticks are checked
//! ([`check::schedule`]), and the queue's claims against its limits
//! ([`check::limits`]). Once per run, 500
//! barrier races ([`race`]) run on a database of their own. The report
//! gives, per fault kind, faults injected, tasks affected and how they
//! ended, stale writes refused and recovery times; the run fails when any
//! invariant is broken or any recovery took longer than its bound.
//!
//! One file per idea: `rig.rs` (the processes of a round), `inject.rs` (the
//! faults), `report.rs` (recoveries and the report), `db.rs` (which
//! database), `ha.rs` (the highly available one), `cut.rs` (the links),
//! `schedule.rs` (the round's schedule), `limits.rs` (the round's queue
//! limits); this one runs the rounds.

pub mod check;
mod cut;
mod db;
mod ha;
mod inject;
mod limits;
pub mod proxy;
pub mod race;
mod report;
mod rig;
mod schedule;
pub mod workflows;

pub use ha::Replication;
pub use inject::FaultKind;

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Utc};
use db::Database;
use inject::{Fault, inject};
use leasekeeper::settings::Settings;
use leasekeeper::worker::history::{self, Op};
use leasekeeper_core::db::{Schema, connect_options, migrate, pool_options};
use leasekeeper_core::generator::{Desired, RESOURCE};
use leasekeeper_core::queue::store;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use report::{late, measure, print_report, report};
use rig::{Instance, Intruder, Rig, Tokens, free_port, reap};
use serde_json::json;
use sqlx::PgPool;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

/// The lease TTL of every process in the harness unless `--ttl-secs` says
/// otherwise; the other durations follow from it ([`Timing`]).
const TTL: Duration = Duration::from_secs(2);
/// Every process must work again within this long after PostgreSQL is back
/// (or the TTL and 3 s, when longer).
const RECOVERY_BOUND: Duration = Duration::from_secs(10);
/// What every bound on a holder's replacement allows on top of the protocol's
/// own waits, for a loaded two-core machine.
const SLACK: Duration = Duration::from_millis(2500);
/// The longest a claimer waits between claims when idle.
const CLAIM_POLL: Duration = Duration::from_millis(500);
/// The schedule's period (it ticks every second).
const TICK: Duration = Duration::from_secs(1);

/// The durations of a run, from its lease TTL.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timing {
    pub(super) ttl: Duration,
    /// How long a paused worker stays frozen: past its lease.
    pub(super) pause: Duration,
    /// How long a partition lasts: past the lease, so the cut-off holder's
    /// lease runs out and another instance takes over before it heals.
    pub(super) partition: Duration,
    /// A takeover must happen within this long of a holder's death: the
    /// TTL, plus the claimers' idle poll (at most 0.5 s) and slack for a
    /// loaded two-core machine.
    pub(super) takeover_bound: Duration,
    /// A schedule's tick must fire within this long of coming due, outside
    /// database outages: a dead or paused scheduler holder's lease runs out
    /// (the TTL), another instance tries again within a renew interval
    /// (TTL/3, the harness's default), the tick may have come due just
    /// before the death (a tick), and the same slack as a takeover's.
    pub(super) schedule_bound: Duration,
    /// After a primary's death, every instance must serve again, claims
    /// resume and the generator runs within this long: Patroni's leader key
    /// TTL (5 s) and its loop, HAProxy's checks, and the lease TTL on top,
    /// with slack for a loaded two-core machine.
    pub(super) failover_bound: Duration,
    pub(super) recovery_bound: Duration,
    /// The end of a round without new faults (TTL + poll + slack).
    pub(super) quiet: Duration,
}

impl Timing {
    pub(super) fn from_ttl(ttl: Duration) -> Self {
        let s = Duration::from_secs;
        Timing {
            ttl,
            pause: ttl + Duration::from_millis(1500),
            partition: ttl + Duration::from_millis(2500),
            takeover_bound: ttl + CLAIM_POLL + SLACK,
            schedule_bound: ttl + ttl / 3 + TICK + SLACK,
            failover_bound: ttl + s(18),
            recovery_bound: RECOVERY_BOUND.max(ttl + s(3)),
            quiet: ttl + s(2),
        }
    }
}

/// How long the primary's WAL sender to the standby is stopped before the
/// primary dies (the standby falling behind, as under load).
const STANDBY_LAG: Duration = Duration::from_millis(1000);
const WORKERS: usize = 6;
const INSTANCES: usize = 2;
const BARRIER_ROUNDS: usize = 500;

/// What a round came to.
struct RoundResult {
    faults: Vec<Fault>,
    checks: check::Checks,
    history: Vec<Op>,
    enqueued: usize,
    late: Vec<String>,
}

/// The fault harness's runs.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct ChaosArgs {
    /// One 60-second round with a fault every 3-5 s (command 2 runs this).
    #[arg(long)]
    pub quick: bool,
    /// Rounds (each on a fresh database); default 5, or 1 with --quick.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: Option<u32>,
    /// Seconds of faults per round; default 120, or 60 with --quick.
    #[arg(long, value_parser = clap::value_parser!(u64).range(5..=3600))]
    pub seconds: Option<u64>,
    /// Where the harness's own PostgreSQL cluster lives (it restarts it).
    #[arg(long, default_value = "target/leasekeeper-chaos-db")]
    pub cluster_dir: std::path::PathBuf,
    /// Also write the report to this file as JSON.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Seed for the fault schedule (random when omitted; printed either way).
    #[arg(long)]
    pub seed: Option<u64>,
    /// The fault kinds to inject, in a shuffled cycle (default: the five
    /// kinds of the single-server harness). `pg_failover` and `clock_skew`
    /// run the round on a highly available cluster (Patroni, etcd and
    /// HAProxy) instead of the single embedded server.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub faults: Vec<FaultKind>,
    /// Replication of the highly available cluster: `sync` (the supported
    /// configuration) or `async` (to show what it breaks).
    #[arg(long, value_enum, default_value_t = Replication::Sync)]
    pub replication: Replication,
    /// How far the promoted standby's clock runs from the real one in a
    /// `clock_skew` fault, in milliseconds: ahead or behind at random (a
    /// negative value swaps the two, nothing more). At most 5 s
    /// either way: the checks compare `lease_events` times written by both
    /// clocks, which holds only while the skew is shorter than the failover.
    #[arg(long, default_value_t = 150, allow_hyphen_values = true,
          value_parser = clap::value_parser!(i64).range(-5_000..=5_000))]
    pub skew_ms: i64,
    /// The lease TTL of every process of the harness, in seconds (default
    /// 2); pauses, partitions and recovery bounds follow it. A TTL longer
    /// than a failover (about 5 s) keeps leases alive across it, so the
    /// promoted standby's clock judges leases the old primary granted.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=60))]
    pub ttl_secs: Option<u64>,
    /// Where the highly available cluster lives (etcd, two PostgreSQL nodes).
    #[arg(long, default_value = "target/leasekeeper-ha-db")]
    pub ha_dir: std::path::PathBuf,
}

/// Runs the harness; fails when an invariant is broken. Of the program's own
/// settings only the schema is used: every process of the harness gets the
/// harness's (2 s TTL, one prefetching simulated worker per instance, chaos off) through its
/// environment.
pub async fn run(settings: Settings, args: ChaosArgs) -> Result<()> {
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 5 }) as usize;
    // Long enough with --quick for every default kind at least once: seven
    // kinds, a fault every 3-5 s, some taking seconds themselves.
    let seconds = args.seconds.unwrap_or(if args.quick { 60 } else { 120 });
    let gaps = if args.quick {
        (3000, 5000)
    } else {
        (5000, 10000)
    };
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut kinds: Vec<FaultKind> = if args.faults.is_empty() {
        FaultKind::DEFAULT.to_vec()
    } else {
        args.faults.clone()
    };
    kinds.sort();
    kinds.dedup();
    let ha = kinds.iter().any(|k| k.needs_ha());
    if ha && kinds.contains(&FaultKind::RestartPostgres) {
        bail!(
            "restart_postgres crashes the single embedded server; with pg_failover or clock_skew \
             the run uses the highly available cluster, whose primary pg_failover kills instead"
        );
    }
    let ttl = args.ttl_secs.map_or(TTL, Duration::from_secs);
    let work = PathBuf::from("target/leasekeeper-chaos-run");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let work = work.canonicalize()?;
    let setup = Setup {
        timing: Timing::from_ttl(ttl),
        kinds: kinds.clone(),
        skew_ms: args.skew_ms,
        gaps,
        tokens: Tokens::draw(&work)?,
    };
    eprintln!(
        "chaos: {rounds} round(s) of {seconds} s, a fault every {}-{} s, seed {seed}; faults: {}; database: {}",
        gaps.0 / 1000,
        gaps.1 / 1000,
        kinds.iter().map(|k| k.key()).collect::<Vec<_>>().join(", "),
        if ha {
            format!("highly available ({:?} replication)", args.replication).to_lowercase()
        } else {
            "single server".to_string()
        }
    );
    let config = work.join("settings.toml");
    std::fs::write(&config, "")?;
    let mut cluster =
        Database::start(ha, &args.cluster_dir, &args.ha_dir, args.replication).await?;

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
                &setup,
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
    cluster.stop().await?;
    let (results, races) = outcome?;
    let replication = ha.then_some(args.replication);
    let report = report(seed, rounds, seconds, &setup, replication, &results, &races);
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

/// What every round of a run shares.
pub(super) struct Setup {
    timing: Timing,
    kinds: Vec<FaultKind>,
    skew_ms: i64,
    gaps: (u64, u64),
    /// The run's credentials.
    tokens: Tokens,
}

async fn fresh_database(cluster: &Database, name: &str, schema: &Schema) -> Result<PgPool> {
    cluster.recreate_database(name).await?;
    let pool = pool_options()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(connect_options(cluster.connect_options(name), schema))
        .await?;
    migrate(&pool, schema).await?;
    Ok(pool)
}

#[expect(
    clippy::too_many_arguments,
    reason = "one round's whole set-up, passed once from run()"
)]
async fn one_round(
    cluster: &mut Database,
    schema: &Schema,
    config: &Path,
    dir: &Path,
    round: usize,
    length: Duration,
    setup: &Setup,
    rng: &mut StdRng,
) -> Result<RoundResult> {
    let name = format!("chaos_r{round}");
    let pool = fresh_database(cluster, &name, schema).await?;
    // Before any process starts: every claim of the round is a limited one.
    limits::set(&pool, schema).await?;
    let mut rig = Rig {
        dir: dir.to_path_buf(),
        database: name.clone(),
        schema: schema.clone(),
        config: config.to_path_buf(),
        instances: Vec::new(),
        workers: Vec::new(),
        spawned: 0,
        all_workers: Vec::new(),
        ttl: setup.timing.ttl,
        instance_starts: 0,
        http: setup.tokens.client()?,
        tokens: setup.tokens.clone(),
    };
    for _ in 0..INSTANCES {
        let port = free_port()?;
        let link = cut::Cut::start(cluster.upstream()).await?;
        let child = rig.spawn_instance(port, link.port)?;
        let proxy = proxy::Proxy::start(port).await?;
        rig.instances.push(Instance {
            port,
            proxy,
            link,
            child,
            heal_at: None,
            resume_at: None,
        });
    }
    let result = async {
        rig.wait_ready().await?;
        for k in 0..WORKERS {
            rig.spawn_worker(k % INSTANCES)?;
        }
        leasekeeper_core::generator::store::set_desired(
            &mut *pool.acquire().await?,
            schema,
            Desired::Running,
            "chaos",
        )
        .await?;
        let declared = schedule::declare(&pool, schema).await?;
        let intruders = intrude(&mut rig).await?;
        let (enqueued, faults) = faults_phase(cluster, &mut rig, &pool, length, setup, rng).await?;
        let paused = drain(&mut rig, &pool, &setup.timing).await;
        rig.shutdown().await;
        let (history, torn) = history::read_dir(dir)?;
        let trusting: BTreeSet<String> = rig
            .all_workers
            .iter()
            .filter(|(_, trust)| *trust)
            .map(|(id, _)| id.clone())
            .collect();
        let mut revoked = check::Revoked::default();
        for fault in &faults {
            match fault.kind {
                FaultKind::KillWorker => {
                    if let Some(worker) = &fault.worker {
                        revoked
                            .killed
                            .entry(worker.clone())
                            .or_default()
                            .push(fault.at_ms);
                    }
                }
                FaultKind::CutLiveness => {
                    for worker in &fault.cut_workers {
                        revoked
                            .cut
                            .entry(worker.clone())
                            .or_default()
                            .push(fault.at_ms);
                    }
                }
                _ => {}
            }
        }
        let mut checks =
            check::check(&pool, &history, torn, setup.timing.ttl, &trusting, &revoked).await?;
        check::intruders::intruders(&pool, &intruders, &mut checks).await?;
        let known: BTreeSet<i64> = sqlx::query_scalar("SELECT id FROM tasks")
            .fetch_all(&pool)
            .await?
            .into_iter()
            .collect();
        checks
            .lost
            .extend(enqueued.iter().filter(|id| !known.contains(id)));
        let faults = measure(&pool, faults, &history).await?;
        checks.schedule = schedule::check(&pool, declared, paused, &faults, &setup.timing).await?;
        checks.limits = limits::check(&pool).await?;
        checks.workflows = workflows::check(&pool).await?;
        let late = late(&faults, &setup.timing);
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

/// Starts two workers without the run's token, one presenting none and one
/// a made-up token, while tasks wait to be claimed; gives each 15 s to be
/// refused and stop by itself (killed otherwise), and answers what they
/// did, for [`check::intruders`].
async fn intrude(rig: &mut Rig) -> Result<Vec<check::intruders::Intruder>> {
    let made_up = format!("chaos-worker-{}", "x".repeat(32));
    let mut started: Vec<Intruder> = vec![
        rig.spawn_intruder(0, "chaos-intruder-none", None)?,
        rig.spawn_intruder(INSTANCES - 1, "chaos-intruder-forged", Some(&made_up))?,
    ];
    let mut seen = Vec::new();
    for intruder in &mut started {
        let exit = match tokio::time::timeout(Duration::from_secs(15), intruder.child.wait()).await
        {
            Ok(status) => Some(status?),
            Err(_) => {
                let _ = intruder.child.start_kill();
                let _ = intruder.child.wait().await;
                None
            }
        };
        let ops = std::fs::read_to_string(&intruder.history)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        seen.push(check::intruders::Intruder {
            id: intruder.id.clone(),
            exit,
            log: std::fs::read_to_string(&intruder.log).unwrap_or_default(),
            ops,
        });
    }
    Ok(seen)
}

/// Enqueues and injects faults for `length`; answers the ids of the tasks
/// whose enqueue was confirmed, and the faults.
async fn faults_phase(
    cluster: &mut Database,
    rig: &mut Rig,
    pool: &PgPool,
    length: Duration,
    setup: &Setup,
    rng: &mut StdRng,
) -> Result<(Vec<i64>, Vec<Fault>)> {
    let gaps = setup.gaps;
    let stop = tokio_util::sync::CancellationToken::new();
    let enqueuer = {
        let (pool, stop) = (pool.clone(), stop.clone());
        let schema = leasekeeper_core::db::Schema::of(&pool);
        let mut rng = StdRng::seed_from_u64(rng.random());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(150));
            let mut n: u64 = 0;
            while !stop.is_cancelled() {
                tick.tick().await;
                n += 1;
                // Every 6 s, a burst of keyed tasks: the queue's limit per
                // key binds, and its fairness puts them before the keyless
                // bulk (see `limits.rs`).
                let burst = if n.is_multiple_of(limits::BURST_EVERY) {
                    limits::burst(n / limits::BURST_EVERY, &mut rng)
                } else {
                    Vec::new()
                };
                // Every 3 s a diamond, one in three with a branch that
                // fails for good; between them a task that waits for a
                // signal (see `workflows.rs`).
                if n.is_multiple_of(workflows::EVERY) {
                    let k = n / workflows::EVERY;
                    let flow = workflows::diamond(k, k % 3 == 2, &mut rng);
                    ids.extend(workflows::enqueue(&pool, &schema, &flow).await);
                } else if n % workflows::EVERY == workflows::EVERY / 2
                    && let Ok(mut conn) = pool.acquire().await
                    && let Ok(task) =
                        store::enqueue(&mut conn, &schema, &workflows::waiting()).await
                {
                    ids.push(task.id);
                }
                // Twice a second, `go` to every task waiting for it, and
                // each failed workflow task retried once, as by an operator.
                if n.is_multiple_of(3) {
                    workflows::signal_waiting(&pool, &schema).await;
                    workflows::retry_failed(&pool, &schema).await;
                }
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
                    anyhow::Ok(
                        store::enqueue(
                            &mut conn,
                            &schema,
                            &leasekeeper_core::queue::NewTask::new(
                                leasekeeper_core::worker::simulated::KIND,
                                data,
                            )
                            .max_attempts(10),
                        )
                        .await?,
                    )
                }
                .await;
                if let Ok(task) = enqueued {
                    ids.push(task.id);
                }
                for task in &burst {
                    let enqueued = async {
                        let mut conn = pool.acquire().await?;
                        anyhow::Ok(store::enqueue(&mut conn, &schema, task).await?)
                    }
                    .await;
                    if let Ok(task) = enqueued {
                        ids.push(task.id);
                    }
                }
            }
            ids
        })
    };
    let mut faults = Vec::new();
    let mut cycle = setup.kinds.clone();
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
        if Instant::now() >= next && Instant::now() + setup.timing.quiet < end {
            let kind = cycle[n % cycle.len()];
            match inject(kind, cluster, rig, pool, setup, rng).await? {
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

/// Whether someone holds the generator's lease now (`None`: no answer).
async fn generator_live(pool: &PgPool) -> Option<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM leases WHERE resource = $1
                         AND released_at IS NULL AND expires_at > now())",
    )
    .bind(RESOURCE)
    .fetch_one(pool)
    .await
    .ok()
}

/// Stops the faults' effects, pauses the schedule once it has caught up,
/// stops the generator and waits until the queue is empty (at most two
/// minutes). Answers when the schedule was paused (database clock; `None`:
/// it could not be).
async fn drain(rig: &mut Rig, pool: &PgPool, timing: &Timing) -> Option<DateTime<Utc>> {
    let schema = &leasekeeper_core::db::Schema::of(pool);
    // A pause injected just before the end runs its full length: continued
    // early, its holder would still hold a live lease and complete
    // normally, and the fault would not be the one reported.
    while rig.workers.iter().any(|w| w.resume_at.is_some())
        || rig.instances.iter().any(|i| i.heal_at.is_some())
    {
        rig.resume_due(false);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A fault in the round's last seconds (a failover takes several) may
    // have left the generator between terms: let it run again before it is
    // stopped, or its recovery could never be seen.
    let deadline = Instant::now() + timing.failover_bound;
    while Instant::now() < deadline && generator_live(pool).await != Some(true) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The same for the schedule: a gap the last fault left is caught up
    // before the pause, or its lateness could never be seen.
    let paused = schedule::pause(pool, schema, timing.failover_bound).await;
    if let Ok(mut conn) = pool.acquire().await {
        let _ = leasekeeper_core::generator::store::set_desired(
            &mut conn,
            schema,
            Desired::Stopped,
            "chaos",
        )
        .await;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        // The tasks still waiting for their signal get it (and a workflow's
        // children wait for their parents, who are among the open tasks).
        workflows::signal_waiting(pool, schema).await;
        workflows::retry_failed(pool, schema).await;
        let open: Option<i64> = sqlx::query_scalar(
            "SELECT count(*) FROM tasks WHERE status IN ('pending', 'started', 'waiting')",
        )
        .fetch_one(pool)
        .await
        .ok();
        if open == Some(0) && generator_live(pool).await == Some(false) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    paused
}

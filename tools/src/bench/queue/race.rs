//! The race: one protocol for every contestant's throughput figure, ours
//! and the peers' alike (issue 41), so a peer's maintainer can accept how
//! each figure was taken.
//!
//! **Each round of a contestant**, in this order:
//!
//! 1. *Preparation*, untimed: its queue emptied and [`Protocol::depth`]
//!    no-op jobs queued (each through its own bulk path), then `VACUUM
//!    ANALYZE` of every table of its schema that holds rows, then a
//!    `CHECKPOINT` ([`settle`]). The same depth for all: graphile-worker's
//!    rate falls with the jobs queued at its start, so a contestant sized a
//!    smaller queue would be helped.
//! 2. *Start-up*, untimed: its processes started (each contestant is OS
//!    processes of its own, ours included: `leasekeeper-tools
//!    bench-runtime`), until each has said it is ready.
//! 3. *The clock*, the same for all, kept by this process from outside:
//!    completions are read from the database (committed only: ours from
//!    `task_counts`, graphile-worker's as the jobs it deleted, Awa's
//!    `queue_counts` terminal count through its program, on a connection
//!    of its own). The clock waits for the first completion, then the
//!    warm-up ([`Protocol::warmup`]); the window opens with a count and
//!    closes with the first count at or after [`Protocol::window`], or
//!    earlier when fewer than a tenth of the jobs are left, so the drain's
//!    tail is never in it. Counts are taken every [`Protocol::poll`] for
//!    every contestant alike. The figure: completions in the window per
//!    second, each count timed at the moment it was asked.
//! 4. *Shut-down*, untimed; then what it wrote per completed job over the
//!    round: rows, from PostgreSQL's statistics of its schema (ins + upd +
//!    del), and WAL bytes, from the cluster's WAL position.
//!
//! **Rounds**: [`Protocol::rounds`] (3; 2 with `--quick`), alternating: in round `r`
//! the contestants run in the order rotated by `r`, so a noisy moment of
//! the machine does not land on one contestant only. The figure is the
//! median of the rounds; every round's figure is kept (`<key>_rounds`).
//!
//! **Durability**: one cluster, `fsync` and `synchronous_commit` on, for
//! all; no contestant changes it for its sessions.
//!
//! **Settings**: each contestant runs fixed settings, written to the JSON
//! (`<key>_settings`): its defaults, or the winner of the tuning pass
//! (`bench tune`, [`super::tune`]), a sweep run apart from these rounds for
//! every contestant alike.

use super::{BenchDb, awa, fleet, graphile, key, median, spread};
use crate::bench::{Details, Progress, Results};
use anyhow::{Context, Result, bail};
use leasekeeper_core::queue::queue_limits::QueueLimits;
use serde_json::{Value, json};
use sqlx::PgPool;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

/// How long and how much: the same for every contestant of a run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Protocol {
    /// Rounds per contestant (alternating); the figure is their median.
    pub rounds: usize,
    /// No-op jobs queued before each round.
    pub depth: i64,
    /// From the first completion to the window's opening.
    pub warmup: Duration,
    /// The window's length at most.
    pub window: Duration,
    /// How often the clock counts during the window.
    pub poll: Duration,
}

/// The window closes early when fewer than `depth / DRY_FRACTION` jobs are
/// left (so the drain's tail, when a contestant's last local queues empty,
/// is never in it).
const DRY_FRACTION: i64 = 10;
/// How long a contestant may take from its start to its first completion.
const START_PATIENCE: Duration = Duration::from_secs(60);

impl Protocol {
    /// The measured rounds: full, or `--quick` (shorter, not for the targets).
    pub(super) fn new(quick: bool) -> Self {
        if quick {
            // Two rounds (still alternating) of a shallower queue:
            // `--quick` keeps under four minutes, and is not for the
            // targets (the fastest peer's window closes early, at a tenth
            // left).
            Protocol {
                rounds: 2,
                depth: 60_000,
                warmup: Duration::from_millis(300),
                window: Duration::from_millis(1500),
                poll: Duration::from_millis(250),
            }
        } else {
            // graphile-worker's own performance test queues 200,000 jobs;
            // its fastest here needs more for warm-up and window.
            Protocol {
                rounds: 3,
                depth: 250_000,
                warmup: Duration::from_secs(1),
                window: Duration::from_secs(5),
                poll: Duration::from_millis(500),
            }
        }
    }

    /// The tuning pass's: one round per candidate, a shorter window.
    pub(super) fn tuning(quick: bool) -> Self {
        Protocol {
            rounds: 1,
            window: if quick {
                Duration::from_millis(1500)
            } else {
                Duration::from_secs(3)
            },
            depth: if quick { 90_000 } else { 150_000 },
            ..Protocol::new(quick)
        }
    }

    /// The protocol as written to the JSON (`protocol`).
    pub(super) fn describe(&self) -> Value {
        json!({
            "preparation": "queue emptied, `depth` no-op jobs queued by the contestant's own bulk path, VACUUM ANALYZE of every table of its schema holding rows, CHECKPOINT; untimed",
            "start_up": "the contestant's processes started until each says ready; untimed",
            "clock": "kept outside every contestant: committed completions read from the database; wait for the first, then `warmup_s`; the window opens with a count and closes at the first count at or after `window_s`, or when fewer than a tenth of `depth` are left; counts every `poll_s`",
            "figure": "completions in the window per second; the median of `rounds` rounds, every round kept in <key>_rounds",
            "order": "rounds alternate: round r runs the contestants rotated by r",
            "durability": "one cluster, fsync and synchronous_commit on for every contestant",
            "settings": "each contestant's defaults, or the winner of `bench tune` (the same kind of sweep for every contestant, apart from these rounds), in <key>_settings",
            "rounds": self.rounds,
            "depth": self.depth,
            "warmup_s": self.warmup.as_secs_f64(),
            "window_s": self.window.as_secs_f64(),
            "poll_s": self.poll.as_secs_f64(),
        })
    }
}

/// Who runs, with which settings.
#[derive(Clone, Debug)]
pub(super) enum Contestant {
    /// Our worker runtime, one process of 16 workers.
    Ours(fleet::Settings),
    /// The same over this many rows of old history in `lease_events`
    /// (put there in the preparation; see [`super::fleet::seed_history`]).
    OursOverHistory(fleet::Settings, i64),
    /// The same with one trigger of the tasks table turned off for its
    /// rounds: `bench floor`'s measure of what it costs. Every other
    /// contestant of ours turns both back on in its preparation, and the
    /// race turns them on at its end.
    OursWithout(fleet::Settings, Ablated),
    /// The same on a queue with limits (issue 39; `bench limits`): set in
    /// its preparation, cleared in every other contestant's of ours.
    OursLimited(fleet::Settings, Limited),
    Graphile(graphile::Settings),
    Awa(awa::Settings),
}

/// The trigger a [`Contestant::OursWithout`] runs without.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ablated {
    /// `tasks_record_attempts`: the attempt and history rows.
    History,
    /// `tasks_parents_ended` (issue 40): a workflow parent's end reaching
    /// its children, on every UPDATE of the tasks table.
    Parents,
}

impl Ablated {
    const ALL: [Ablated; 2] = [Ablated::History, Ablated::Parents];

    /// The trigger's name on the tasks table.
    fn trigger(self) -> &'static str {
        match self {
            Ablated::History => "tasks_record_attempts",
            Ablated::Parents => "tasks_parents_ended",
        }
    }
}

/// The limits of a [`Contestant::OursLimited`] on the default queue.
#[derive(Clone, Copy, Debug)]
pub(super) enum Limited {
    /// `max_started_per_key` `per_key`, the tasks dealt round-robin over
    /// `keys` keys, so every key is busy.
    Keyed { keys: i64, per_key: i32 },
    /// A fleet-wide rate (`rate_per_second`, `rate_burst`).
    Rate { per_second: f64, burst: i32 },
}

impl Limited {
    /// The queue's limits.
    fn limits(&self) -> QueueLimits {
        match *self {
            Limited::Keyed { per_key, .. } => QueueLimits {
                max_started_per_key: Some(per_key),
                ..QueueLimits::default()
            },
            Limited::Rate { per_second, burst } => QueueLimits {
                rate_per_second: Some(per_second),
                rate_burst: Some(burst),
                ..QueueLimits::default()
            },
        }
    }

    fn label(&self) -> String {
        match self {
            Limited::Keyed { keys, per_key } => {
                format!("max_started_per_key {per_key} over {keys} keys")
            }
            Limited::Rate { per_second, burst } => {
                format!("held to {per_second}/s (burst {burst})")
            }
        }
    }
}

impl Contestant {
    /// A peer's (graphile-worker or Awa), not our runtime.
    fn is_peer(&self) -> bool {
        matches!(self, Contestant::Graphile(_) | Contestant::Awa(_))
    }

    pub(super) fn label(&self) -> String {
        match self {
            Contestant::Ours(s) => s.label(),
            Contestant::OursOverHistory(s, rows) => {
                format!("{} over {rows} rows of history", s.label())
            }
            Contestant::OursWithout(s, ablated) => {
                format!("{} with the trigger {} off", s.label(), ablated.trigger())
            }
            Contestant::OursLimited(s, limited) => format!("{}, {}", s.label(), limited.label()),
            Contestant::Graphile(s) => s.label(),
            Contestant::Awa(s) => s.label(),
        }
    }

    /// Its settings, as written to the JSON.
    pub(super) fn settings(&self) -> Value {
        let mut v = match self {
            Contestant::Graphile(s) => serde_json::to_value(s),
            Contestant::Awa(s) => serde_json::to_value(s),
            Contestant::Ours(s)
            | Contestant::OursOverHistory(s, _)
            | Contestant::OursWithout(s, _)
            | Contestant::OursLimited(s, _) => serde_json::to_value(s),
        }
        .unwrap_or(Value::Null);
        if let (Contestant::OursLimited(_, limited), Value::Object(map)) = (self, &mut v) {
            map.insert("limits".into(), json!(limited.limits()));
            if let Limited::Keyed { keys, .. } = limited {
                map.insert("keys".into(), json!(keys));
            }
        }
        let who = match self {
            Contestant::Ours(_) | Contestant::OursOverHistory(..) | Contestant::OursLimited(..) => {
                "leasekeeper (this commit)".to_string()
            }
            Contestant::OursWithout(_, ablated) => {
                format!(
                    "leasekeeper (this commit), trigger {} off",
                    ablated.trigger()
                )
            }
            Contestant::Graphile(_) => format!("graphile-worker {}", graphile::GRAPHILE_VERSION),
            Contestant::Awa(_) => "awa 0.6.9".to_string(),
        };
        if let Value::Object(map) = &mut v {
            map.insert("contestant".into(), json!(who));
        }
        v
    }

    /// The schema of its tables (whose statistics give its rows per task).
    fn schema(&self, db: &BenchDb) -> String {
        match self {
            Contestant::Graphile(_) => "graphile_worker".into(),
            Contestant::Awa(_) => "awa".into(),
            _ => db.schema.as_str().to_string(),
        }
    }

    /// Step 1: its queue emptied, `depth` jobs queued, settled.
    async fn prepare(&self, db: &BenchDb, depth: i64) -> Result<()> {
        match self {
            Contestant::Graphile(_) => graphile::prepare(&db.conninfo, depth).await?,
            Contestant::Awa(s) => awa::prepare(&db.conninfo, depth, s).await?,
            _ => {
                for trigger in Ablated::ALL {
                    let off = matches!(self, Contestant::OursWithout(_, a) if *a == trigger);
                    set_trigger(&db.pool, trigger, !off).await?;
                }
                // On a connection of its own, closed when done: a backend's
                // table statistics reach `pg_stat_user_tables` when it
                // ends, while an idle pooled one's come up to seconds
                // later and would land in the round's count of rows per
                // task (the peers prepare in processes that end).
                let own = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect_with((*db.pool.connect_options()).clone())
                    .await
                    .context("connecting to prepare a round")?;
                super::empty(&own).await?;
                if let Contestant::OursOverHistory(_, rows) = self {
                    fleet::seed_history(&own, *rows).await?;
                }
                let limited = match self {
                    Contestant::OursLimited(_, limited) => Some(*limited),
                    _ => None,
                };
                set_limits(&own, limited.map(|l| l.limits()).unwrap_or_default()).await?;
                match limited {
                    Some(Limited::Keyed { keys, .. }) => {
                        super::add_keyed_tasks_of(&own, fleet::NOOP, depth, keys).await?
                    }
                    _ => super::add_tasks_of(&own, fleet::NOOP, depth).await?,
                }
                own.close().await;
            }
        }
        settle(&db.pool, &self.schema(db)).await
    }

    /// Step 2: its processes, ready.
    async fn start(&self, db: &BenchDb, depth: i64, id: &str) -> Result<Running> {
        Ok(match self {
            Contestant::Graphile(s) => Running::Processes {
                children: graphile::start(&db.conninfo, s).await?,
                completed: graphile::completed_sql(depth),
            },
            Contestant::Awa(s) => Running::Awa(Box::new(awa::start(&db.conninfo, s).await?)),
            Contestant::Ours(s)
            | Contestant::OursOverHistory(s, _)
            | Contestant::OursWithout(s, _)
            | Contestant::OursLimited(s, _) => Running::Processes {
                children: vec![fleet::start_process(db, id, s).await?],
                completed: "SELECT coalesce(sum(processed), 0)::int8 FROM task_counts".into(),
            },
        })
    }
}

/// Sets the default queue's limits to `limits` (none: cleared).
async fn set_limits(pool: &PgPool, limits: QueueLimits) -> Result<()> {
    let schema = leasekeeper_core::db::Schema::of(pool);
    leasekeeper_core::queue::queues::set_limits(
        &mut *pool.acquire().await?,
        &schema,
        leasekeeper_core::queue::DEFAULT_QUEUE,
        &limits,
        "bench",
    )
    .await
    .context("setting the default queue's limits")?;
    Ok(())
}

/// Turns a trigger of the tasks table on or off (off for
/// [`Contestant::OursWithout`] only).
async fn set_trigger(pool: &PgPool, ablated: Ablated, on: bool) -> Result<()> {
    let verb = if on { "ENABLE" } else { "DISABLE" };
    let trigger = ablated.trigger();
    sqlx::query(&format!("ALTER TABLE tasks {verb} TRIGGER {trigger}"))
        .execute(pool)
        .await
        .with_context(|| format!("{verb} TRIGGER {trigger}"))?;
    Ok(())
}

/// A contestant at work.
enum Running {
    /// Processes stopped by SIGTERM; completions counted by a statement.
    Processes {
        children: Vec<Child>,
        completed: String,
    },
    /// The Awa program, asked over stdin.
    Awa(Box<awa::Serving>),
}

impl Running {
    /// Completions committed so far.
    async fn completed(&mut self, pool: &PgPool) -> Result<i64> {
        match self {
            Running::Processes { completed, .. } => Ok(sqlx::query_scalar(completed.as_str())
                .fetch_one(pool)
                .await?),
            Running::Awa(serving) => serving.completed().await,
        }
    }

    /// The statement that counts this contestant's completions in the
    /// database (none for Awa, whose program answers its count).
    fn count_sql(&self) -> Option<String> {
        match self {
            Running::Processes { completed, .. } => Some(completed.clone()),
            Running::Awa(_) => None,
        }
    }

    /// Step 4: a graceful shut-down, waited for.
    async fn stop(self) -> Result<()> {
        match self {
            Running::Processes { mut children, .. } => {
                for child in &children {
                    if let Some(pid) = child.id() {
                        nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid as i32),
                            nix::sys::signal::Signal::SIGTERM,
                        )
                        .context("stopping a contestant's process")?;
                    }
                }
                for child in &mut children {
                    wait_stopped(child, "a contestant's process").await?;
                }
                Ok(())
            }
            Running::Awa(serving) => (*serving).stop().await,
        }
    }
}

/// What one round measured.
#[derive(Clone, Copy, Debug)]
pub(super) struct Round {
    /// Completions per second in the window.
    pub per_s: f64,
    /// The window's length, seconds (shorter than the protocol's when the
    /// queue ran low).
    pub window_s: f64,
    /// Rows written to the contestant's tables per completed job over the
    /// whole round (start to shut-down).
    pub rows_per_task: f64,
    /// WAL written per completed job over the whole round, bytes: the
    /// durable work, whatever shape a contestant gives its rows (Awa
    /// writes one row per batch of completions). The cluster's, so it
    /// counts the clock's reads too, the same for every contestant (and
    /// next to nothing).
    pub wal_per_task: f64,
}

/// One round of `contestant`: prepared, started, clocked, stopped.
pub(super) async fn round(
    db: &BenchDb,
    protocol: &Protocol,
    contestant: &Contestant,
    id: &str,
) -> Result<(Round, Vec<(String, f64)>)> {
    let schema = contestant.schema(db);
    contestant.prepare(db, protocol.depth).await?;
    let writes_before = table_writes(&db.pool, &schema).await?;
    let wal_before = wal_lsn(&db.pool).await?;
    let mut running = contestant.start(db, protocol.depth, id).await?;
    let clocked = clock(&db.pool, &mut running, protocol).await;
    let counted = running.completed(&db.pool).await;
    let count_again = running.count_sql();
    let stopped = running.stop().await;
    let (per_s, window_s) = clocked?;
    stopped?;
    // Every completion the round made, committed by the shut-down: ours and
    // graphile-worker's counted again from the database after it (they go
    // on completing until they stop, and flush their batches then: a count
    // taken before the stop left those out while their rows were in); Awa's
    // is its program's, read before its stop, whose last batch is not in it:
    // a hair more rows per task for Awa, never fewer.
    let total = match count_again {
        Some(sql) => {
            sqlx::query_scalar::<_, i64>(&sql)
                .fetch_one(&db.pool)
                .await?
        }
        None => counted?,
    };
    let wal_per_task =
        ((wal_lsn(&db.pool).await? - wal_before) as f64 / total.max(1) as f64).round();
    // Their backends have ended, so their statistics are flushed as they
    // exit (as the preparation's were); a moment for the last to exit.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let writes_after = table_writes(&db.pool, &schema).await?;
    let by_table: Vec<(String, f64)> = writes_after
        .iter()
        .map(|(table, after)| {
            let before = writes_before
                .iter()
                .find(|(t, _)| t == table)
                .map_or(0, |(_, n)| *n);
            (
                table.clone(),
                ((after - before) as f64) / total.max(1) as f64,
            )
        })
        .collect();
    let rows_per_task = by_table.iter().map(|(_, rows)| rows).sum::<f64>();
    Ok((
        Round {
            per_s,
            window_s,
            rows_per_task: (rows_per_task * 100.0).round() / 100.0,
            wal_per_task,
        },
        by_table,
    ))
}

/// Step 3, the clock: tasks per second in the window, and its length.
async fn clock(pool: &PgPool, running: &mut Running, protocol: &Protocol) -> Result<(f64, f64)> {
    let started = Instant::now();
    while running.completed(pool).await? == 0 {
        if started.elapsed() > START_PATIENCE {
            bail!("no job completed within {START_PATIENCE:?} of the start");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(protocol.warmup).await;
    let t0 = Instant::now();
    let c0 = running.completed(pool).await?;
    let floor = protocol.depth / DRY_FRACTION;
    loop {
        tokio::time::sleep(protocol.poll).await;
        let t = Instant::now();
        let c = running.completed(pool).await?;
        let elapsed = t.duration_since(t0);
        if elapsed >= protocol.window || protocol.depth - c < floor {
            let seconds = elapsed.as_secs_f64();
            return Ok((((c - c0) as f64 / seconds).round(), seconds));
        }
    }
}

/// The cluster's WAL position, bytes from its start.
async fn wal_lsn(pool: &PgPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8")
            .fetch_one(pool)
            .await?,
    )
}

/// Rows inserted, updated and deleted so far in each table of `schema`,
/// as PostgreSQL's statistics count them.
async fn table_writes(pool: &PgPool, schema: &str) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT relname::text, (n_tup_ins + n_tup_upd + n_tup_del)::int8
           FROM pg_stat_user_tables WHERE schemaname = $1 ORDER BY relname",
    )
    .bind(schema)
    .fetch_all(pool)
    .await?)
}

/// The preparation's end, one rule for every contestant: `VACUUM ANALYZE`
/// of every table of `schema` that holds rows, then a `CHECKPOINT`. Tables
/// just emptied (ours: `leases`, `lease_events`, `attempts`) are left to
/// autovacuum: analyzed empty, a plan made early in the round (and kept
/// by a prepared statement) would read all of a table the round fills,
/// which no deployment's tables ever are.
pub(super) async fn settle(pool: &PgPool, schema: &str) -> Result<()> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables
          WHERE schemaname = $1 ORDER BY relname",
    )
    .bind(schema)
    .fetch_all(pool)
    .await?;
    let mut holding = Vec::new();
    for table in tables {
        let any: bool = sqlx::query_scalar(&format!("SELECT EXISTS (SELECT 1 FROM {table})"))
            .fetch_one(pool)
            .await?;
        if any {
            holding.push(table);
        }
    }
    if !holding.is_empty() {
        sqlx::query(&format!("VACUUM ANALYZE {}", holding.join(", ")))
            .execute(pool)
            .await?;
    }
    sqlx::query("CHECKPOINT").execute(pool).await?;
    Ok(())
}

/// Waits up to a minute for `child` (`who`) to end, which must be a success.
pub(super) async fn wait_stopped(child: &mut Child, who: &str) -> Result<()> {
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .with_context(|| format!("{who} did not stop within a minute"))??;
    if !status.success() {
        bail!("{who} failed ({status})");
    }
    Ok(())
}

/// Waits for `child` to print `ready` (every contestant's process says it
/// once it runs).
pub(super) async fn wait_ready(child: &mut Child) -> Result<()> {
    let stdout = child.stdout.take().context("the child's stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(START_PATIENCE, lines.next_line())
        .await
        .context("a contestant's process did not start within a minute")??;
    match line.as_deref() {
        Some("ready") => {
            // Keep reading its stdout, so it never blocks on a full pipe.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            Ok(())
        }
        other => bail!("a contestant's process did not start: {other:?} (its stderr is above)"),
    }
}

/// One contestant's standing after every round.
pub(super) struct Standing {
    pub key: &'static str,
    pub contestant: Contestant,
    pub rounds: Vec<Round>,
    /// Rows per task by table, of its first round.
    pub by_table: Vec<(String, f64)>,
}

impl Standing {
    /// The median rate; `NaN` when it could not run.
    pub(super) fn per_s(&self) -> f64 {
        self.median_of(|r| r.per_s)
    }

    /// The median over its rounds of what `figure` reads of each.
    fn median_of(&self, figure: fn(&Round) -> f64) -> f64 {
        median(&self.rounds.iter().map(figure).collect::<Vec<_>>())
    }

    /// Its figures: `<key>` (the median), `<key>_rows_per_task`,
    /// `<key>_wal_bytes_per_task`, `<key>_spread` (max - min over the
    /// median); and its details:
    /// `<key>_rounds`, `<key>_windows_s`, `<key>_settings`.
    pub(super) fn report(&self, r: &mut Results, details: &mut Details) {
        let per_s = self.per_s();
        r.push((self.key, per_s));
        r.push((
            key(format!("{}_rows_per_task", self.key)),
            self.median_of(|r| r.rows_per_task),
        ));
        r.push((
            key(format!("{}_wal_bytes_per_task", self.key)),
            self.median_of(|r| r.wal_per_task),
        ));
        let rates: Vec<f64> = self.rounds.iter().map(|r| r.per_s).collect();
        r.push((key(format!("{}_spread", self.key)), spread(&rates)));
        details.push((format!("{}_rounds", self.key), json!(rates)));
        details.push((
            format!("{}_windows_s", self.key),
            json!(
                self.rounds
                    .iter()
                    .map(|r| (r.window_s * 100.0).round() / 100.0)
                    .collect::<Vec<_>>()
            ),
        ));
        details.push((format!("{}_settings", self.key), self.contestant.settings()));
    }
}

/// The order of `n` contestants in round `r`: rotated by `r`, so that over
/// `n` rounds each runs once in each position.
fn order(r: usize, n: usize) -> Vec<usize> {
    (0..n).map(|i| (i + r) % n.max(1)).collect()
}

/// Every contestant through [`Protocol::rounds`] alternating rounds. A
/// peer that cannot run (no node, no cargo) is noted and left out of the
/// later rounds, its figure `NaN`; ours failing fails the race.
pub(super) async fn race(
    db: &BenchDb,
    protocol: &Protocol,
    contestants: Vec<(&'static str, Contestant)>,
    progress: &Progress,
) -> Result<Vec<Standing>> {
    let ablated = contestants
        .iter()
        .any(|(_, c)| matches!(c, Contestant::OursWithout(..)));
    let limited = contestants
        .iter()
        .any(|(_, c)| matches!(c, Contestant::OursLimited(..)));
    let raced = race_rounds(db, protocol, contestants, progress).await;
    if ablated {
        // Whatever happened: the schema as the code keeps it.
        for trigger in Ablated::ALL {
            set_trigger(&db.pool, trigger, true).await?;
        }
    }
    if limited {
        set_limits(&db.pool, QueueLimits::default()).await?;
    }
    raced
}

async fn race_rounds(
    db: &BenchDb,
    protocol: &Protocol,
    contestants: Vec<(&'static str, Contestant)>,
    progress: &Progress,
) -> Result<Vec<Standing>> {
    let mut standings: Vec<Standing> = contestants
        .into_iter()
        .map(|(key, contestant)| Standing {
            key,
            contestant,
            rounds: Vec::new(),
            by_table: Vec::new(),
        })
        .collect();
    let mut out = vec![false; standings.len()];
    for r in 0..protocol.rounds {
        for k in order(r, standings.len()) {
            if out[k] {
                continue;
            }
            let standing = &mut standings[k];
            let id = format!("bench-{}-{r}", standing.key);
            match round(db, protocol, &standing.contestant, &id).await {
                Ok((result, by_table)) => {
                    progress.note(&format!(
                        "bench: round {} of {}: {}: {}/s over {:.1} s, {} rows and {} bytes of WAL a task",
                        r + 1,
                        protocol.rounds,
                        standing.contestant.label(),
                        result.per_s,
                        result.window_s,
                        result.rows_per_task,
                        result.wal_per_task
                    ));
                    if standing.by_table.is_empty() {
                        standing.by_table = by_table;
                    }
                    standing.rounds.push(result);
                }
                Err(e) if standing.contestant.is_peer() => {
                    let who = match standing.contestant {
                        Contestant::Graphile(_) => "graphile-worker",
                        _ => "awa",
                    };
                    progress.note(&format!("bench: {who} skipped: {e:#}"));
                    out[k] = true;
                    standing.rounds.clear();
                }
                Err(e) => return Err(e.context(standing.contestant.label())),
            }
        }
    }
    Ok(standings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_alternate_each_contestant_through_every_position() {
        assert_eq!(order(0, 3), vec![0, 1, 2]);
        assert_eq!(order(1, 3), vec![1, 2, 0]);
        for position in 0..6 {
            let mut firsts: Vec<usize> = (0..6).map(|r| order(r, 6)[position]).collect();
            firsts.sort();
            assert_eq!(firsts, (0..6).collect::<Vec<_>>(), "position {position}");
        }
    }

    #[test]
    fn the_protocol_takes_three_rounds_and_no_window_runs_the_queue_dry() {
        // The issue asks for at least three rounds; `--quick`, not for the
        // targets, takes two, still alternating.
        assert!(Protocol::new(false).rounds >= 3);
        assert!(Protocol::new(true).rounds >= 2);
        // Warm-up and window must leave more than the part of the queue at
        // which the window closes early for a contestant of 35,000 jobs a
        // second (graphile-worker's best, run A; a faster one's window
        // closes early, as the protocol says), and of 25,000 in a quick run.
        for (quick, rate) in [(false, 35_000.0), (true, 25_000.0)] {
            let p = Protocol::new(quick);
            let used = rate * (p.warmup + p.window).as_secs_f64();
            assert!(
                used < (p.depth - p.depth / DRY_FRACTION) as f64,
                "quick {quick}: {used}"
            );
            assert!(p.poll < p.window);
        }
        let tuning = Protocol::tuning(false);
        assert_eq!(tuning.rounds, 1);
        assert!(tuning.window < Protocol::new(false).window);
    }

    #[test]
    fn the_protocol_is_written_to_the_json() {
        let v = Protocol::new(false).describe();
        for key in [
            "clock",
            "preparation",
            "durability",
            "order",
            "rounds",
            "depth",
            "window_s",
        ] {
            assert!(!v[key].is_null(), "{key} missing: {v}");
        }
        assert_eq!(v["rounds"], 3);
    }
}

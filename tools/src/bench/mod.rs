//! `leasekeeper-tools bench`: speed targets, each measured next to a baseline run
//! in the same invocation (these machines are noisy; ratios travel, absolute
//! numbers less so).
//!
//! - `leasekeeper-tools bench [--quick] [--json PATH] [--charts DIR]`: the queue
//!   suite ([`queue`]): throughput, the worker runtime's own rate and its
//!   scale-out over processes, claim and wake-up latency, depth, history,
//!   lease operations, failover, against pgbench's ceilings, the original
//!   design, graphile-worker and Awa; bulk insert against both peers; SVG
//!   charts of it ([`charts`]).
//! - `leasekeeper-tools bench peers [--quick] [--json PATH]`: only the peers'
//!   phases of that suite ([`queue::peers`]); `bench fleet`: only the
//!   worker runtime's.
//! - `leasekeeper-tools bench dashboard [--quick] [--pixel-only] [--json PATH]`:
//!   push latency, push to pixel in Chromium ([`pixel`]) and server-side
//!   rendering ([`dashboard`]).
//! - `leasekeeper-tools bench retention [--tasks N] [--prune-older-than-secs S]
//!   [--prune-every-secs I] [--no-baseline] [--json PATH]`: a million tasks
//!   through the runtime with the maintenance job pruning, against the same
//!   without: table sizes and throughput over time ([`retention`]).
//!
//! Both start their own embedded PostgreSQL cluster
//! (`target/leasekeeper-bench-db`, durable commits: `fsync` and
//! `synchronous_commit` on) with a fresh database, unless `DATABASE_URL` is
//! set. Build with `--release` for figures worth comparing.

pub mod charts;
pub mod dashboard;
pub mod pixel;
pub mod queue;
pub mod retention;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use leasekeeper::server::{leptos_options, router};
use leasekeeper::settings::Settings;
use leasekeeper::state::AppState;
use leasekeeper::worker::fleet::{Fleet, FleetConfig};
use leasekeeper_core::db::embedded::EmbeddedPostgres;
use leasekeeper_core::db::{Schema, connect_options, migrate, pool_options};
use leasekeeper_core::live::LiveHub;
use serde_json::{Value, json};
use sqlx::PgPool;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Fewer and shorter samples (the queue suite: under four minutes).
    pub quick: bool,
    /// Where to write the results as a flat JSON object.
    pub json: Option<PathBuf>,
    /// Where to write SVG charts of the results (the queue suite only).
    pub charts: Option<PathBuf>,
}

impl Options {
    /// `quick`, the results written to `json` (when given), no charts.
    pub fn without_charts(quick: bool, json: Option<PathBuf>) -> Self {
        Options {
            quick,
            json,
            charts: None,
        }
    }
}

/// Named results in the order measured; `NaN` means "could not run" and is
/// written as JSON `null`.
pub(crate) type Results = Vec<(&'static str, f64)>;

/// What is not one number, written to the JSON beside [`Results`]: every
/// round's figure (`<key>_rounds`), a contestant's settings
/// (`<key>_settings`), the protocol the figures were taken by.
pub(crate) type Details = Vec<(String, Value)>;

/// A fresh benchmark database and the cluster it lives in.
pub(crate) struct BenchDb {
    pub pool: PgPool,
    /// A libpq connection string for the same database (for pgbench, psql
    /// and node), e.g. `postgres://leasekeeper@localhost:5433/db?host=/sock`.
    pub conninfo: String,
    /// The schema of leasekeeper's tables in it (`conninfo` does not set
    /// it: graphile-worker gets the database as a host would give it).
    pub schema: Schema,
    cluster: Option<EmbeddedPostgres>,
}

impl BenchDb {
    /// A new pool on the same database and schema with the library's
    /// default pool settings ([`pool_options`]): what a service embedding
    /// the worker runtime would have.
    pub async fn service_pool(&self) -> Result<PgPool> {
        pool_options()
            .connect_with(connect_options(
                (*self.pool.connect_options()).clone(),
                &self.schema,
            ))
            .await
            .context("connecting a service pool to the benchmark database")
    }

    /// Closes the pool and stops the cluster if this run started it.
    pub async fn close(self) -> Result<()> {
        self.pool.close().await;
        if let Some(cluster) = self.cluster {
            cluster.stop_if_started_here().await?;
        }
        Ok(())
    }
}

/// Database `name`, dropped and made anew, migrated, in the embedded bench
/// cluster (or on the server of `DATABASE_URL`, used as is).
pub(crate) async fn fresh_database(
    settings: &Settings,
    name: &str,
    connections: u32,
) -> Result<BenchDb> {
    let (options, conninfo, cluster) = match &settings.database_url {
        Some(url) => (
            url.expose()
                .parse()
                .context("DATABASE_URL is not a valid URL")?,
            url.expose().to_string(),
            None,
        ),
        None => {
            let dir = PathBuf::from("target/leasekeeper-bench-db");
            let cluster = EmbeddedPostgres::start(&dir).await?;
            cluster.recreate_database(name).await?;
            (
                cluster.connect_options(name),
                cluster.url(name),
                Some(cluster),
            )
        }
    };
    let pool = pool_options()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(60))
        .connect_with(connect_options(options, &settings.schema))
        .await
        .context("connecting to the benchmark database")?;
    migrate(&pool, &settings.schema).await?;
    Ok(BenchDb {
        pool,
        conninfo,
        schema: settings.schema.clone(),
        cluster,
    })
}

/// A server of this process on a free loopback port: the whole router over
/// `pool`, with no admin token, no generator and no simulated workers.
pub(crate) struct BenchServer {
    /// Its address, e.g. `http://127.0.0.1:41234`.
    pub base: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    sampler: leasekeeper::overview::sampler::Sampler,
    /// Its liveness session, when it keeps one ([`BenchServer::start_vouched`]).
    liveness: Option<leasekeeper_core::liveness::Liveness>,
}

impl BenchServer {
    /// Starts it with `settings` (its address is replaced) and `live`.
    pub async fn start(settings: Settings, pool: &PgPool, live: LiveHub) -> Result<Self> {
        Self::open(settings, pool, live, None).await
    }

    /// [`start`](Self::start) keeping a liveness session, as `serve` does:
    /// the worker processes' session streams are vouched for, so a killed
    /// worker process is rescued by its closed stream.
    pub async fn start_vouched(settings: Settings, pool: &PgPool, live: LiveHub) -> Result<Self> {
        let liveness = leasekeeper_core::liveness::Liveness::start(
            (*pool.connect_options()).clone(),
            leasekeeper_core::db::Schema::of(pool),
            Arc::from("i-bench"),
            vec!["i-bench".to_string()],
        )
        .await?;
        Self::open(settings, pool, live, Some(liveness)).await
    }

    async fn open(
        mut settings: Settings,
        pool: &PgPool,
        live: LiveHub,
        liveness: Option<leasekeeper_core::liveness::Liveness>,
    ) -> Result<Self> {
        settings.admin_token = None;
        settings.worker_token = None;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        settings.site_addr = addr;
        let instance_id: Arc<str> = Arc::from("i-bench");
        let sampler = leasekeeper::overview::sampler::Sampler::spawn(pool.clone());
        let state = AppState {
            leptos_options: leptos_options(&settings),
            pool: pool.clone(),
            read_pool: leasekeeper::reads::read_pool(pool),
            fleet: {
                let fleet = Fleet::new(
                    pool.clone(),
                    instance_id.clone(),
                    FleetConfig::from_settings(&settings),
                    None,
                );
                match &liveness {
                    Some(liveness) => fleet.vouched_by(liveness),
                    None => fleet,
                }
            },
            settings: Arc::new(settings),
            instance_id,
            generator: None,
            scheduler: None,
            live,
            overview: sampler.clone(),
        };
        let stop = CancellationToken::new();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                axum::serve(listener, router(state))
                    .with_graceful_shutdown(async move { stop.cancelled().await })
                    .await
            })
        };
        Ok(BenchServer {
            base: format!("http://{addr}"),
            stop,
            task,
            sampler,
            liveness,
        })
    }

    /// Stops it and waits until it has.
    pub async fn stop(self) -> Result<()> {
        self.sampler.stop();
        self.stop.cancel();
        self.task.await??;
        if let Some(liveness) = self.liveness {
            liveness.shutdown().await;
        }
        Ok(())
    }
}

/// A phase message on stderr (for the dashboard suite's plain log).
pub(crate) fn step(what: &str) {
    eprintln!("bench: {what} …");
}

/// A progress bar over the suite's phases: drawn on a terminal, one line
/// per phase on stderr otherwise (CI logs).
pub(crate) struct Progress {
    bar: ProgressBar,
    drawn: bool,
}

impl Progress {
    pub fn new(phases: u64) -> Self {
        let drawn = std::io::stderr().is_terminal();
        let bar = if drawn {
            ProgressBar::new(phases)
        } else {
            ProgressBar::with_draw_target(Some(phases), ProgressDrawTarget::hidden())
        };
        bar.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress { bar, drawn }
    }

    /// Starts the next phase.
    pub fn phase(&self, what: &str) {
        if self.bar.position() > 0 || !self.bar.message().is_empty() {
            self.bar.inc(1);
        }
        self.bar.set_message(what.to_string());
        if !self.drawn {
            eprintln!(
                "bench [{}/{}]: {what} …",
                self.bar.position() + 1,
                self.bar.length().unwrap_or(0)
            );
        }
    }

    /// Prints a line above the bar.
    pub fn note(&self, line: &str) {
        self.bar.suspend(|| eprintln!("{line}"));
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// `a / b`, to two decimals.
pub(crate) fn ratio(a: f64, b: f64) -> f64 {
    ((a / b) * 100.0).round() / 100.0
}

/// Milliseconds (or any unit), sorted on demand.
pub(crate) struct Samples(pub Vec<f64>);

impl Samples {
    /// The `p`th percentile (nearest rank), to one decimal; `NaN` when empty.
    pub fn percentile(&self, p: f64) -> f64 {
        self.percentile_raw(p)
            .map_or(f64::NAN, |v| (v * 10.0).round() / 10.0)
    }

    /// The same, to three decimals (for values that are small in their unit).
    pub fn percentile_fine(&self, p: f64) -> f64 {
        self.percentile_raw(p)
            .map_or(f64::NAN, |v| (v * 1000.0).round() / 1000.0)
    }

    fn percentile_raw(&self, p: f64) -> Option<f64> {
        let mut v = self.0.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() {
            return None;
        }
        let idx = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
        Some(v[idx.min(v.len() - 1)])
    }
}

/// Prints the results as a table and writes them as flat JSON when asked.
pub(crate) fn report(results: &Results, options: &Options) -> Result<()> {
    report_with(results, &Details::new(), options)
}

/// [`report`], with `details` printed after the table and written to the
/// JSON beside the figures.
pub(crate) fn report_with(results: &Results, details: &Details, options: &Options) -> Result<()> {
    println!("{:<32} {:>14}", "measure", "value");
    for (k, v) in results {
        if v.is_nan() {
            println!("{k:<32} {:>14}", "n/a");
        } else {
            println!("{k:<32} {v:>14}");
        }
    }
    for (k, v) in details {
        println!("{k}: {v}");
    }
    if let Some(path) = &options.json {
        let flat: serde_json::Map<String, Value> = results
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .chain(details.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect();
        std::fs::write(path, serde_json::to_string_pretty(&Value::Object(flat))?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("results written to {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_ratios() {
        let s = Samples((1..=100).map(f64::from).collect());
        assert_eq!(s.percentile(50.0), 51.0);
        assert_eq!(s.percentile(99.0), 99.0);
        assert!(Samples(vec![]).percentile(50.0).is_nan());
        assert_eq!(ratio(1.0, 3.0), 0.33);
    }

    #[test]
    fn not_run_is_written_as_null() {
        let dir = std::env::temp_dir().join(format!("lk-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.json");
        let options = Options {
            quick: true,
            json: Some(path.clone()),
            charts: None,
        };
        report(&vec![("a", 1.5), ("b", f64::NAN)], &options).unwrap();
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v, json!({"a": 1.5, "b": null}));
        std::fs::remove_dir_all(dir).unwrap();
    }
}

//! The graphile-worker contestant: graphile-worker from npm, installed by
//! the bench into `target/bench-graphile`, processing no-op jobs on the
//! bench database (its own schema, `graphile_worker`) in one or more Node
//! processes (`graphile.mjs`), measured by the race's protocol
//! ([`super::race`]); and its bulk insert.

use super::Progress;
use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::json;
use std::path::Path;
use std::time::Duration;
use tokio::process::{Child, Command};

/// The graphile-worker release measured (declares Node >= 14; runs on the
/// Node 20 here). 0.17 is the first with the local queue and batched
/// completions.
pub(super) const GRAPHILE_VERSION: &str = "0.17.3";
/// Where the bench installs it (relative to the working directory).
const DIR: &str = "target/bench-graphile";

/// How graphile-worker runs: the settings a reader needs to run it again
/// (written to the JSON as `<key>_settings`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(super) struct Settings {
    /// Node processes, each one runner.
    pub processes: usize,
    /// Jobs at once per process (`concurrency`); the pool of each is this
    /// plus 2 (`maxPoolSize`), so no job waits for a connection.
    pub concurrency: usize,
    /// `localQueue.size`, or `None` for no local queue (its default).
    pub local_queue: Option<usize>,
    /// `completeJobBatchDelay` and `failJobBatchDelay` in ms, or `None` for
    /// one statement per completion (its default).
    pub batch_delay_ms: Option<u64>,
    /// `NO_LOG_SUCCESS=1`: no log line per completed job (on in every run:
    /// graphile-worker's own performance test sets it, and no contestant
    /// logs per task).
    pub no_log_success: bool,
}

impl Settings {
    /// Its defaults at 16 jobs at once in one process.
    pub(super) fn defaults() -> Self {
        Settings {
            processes: 1,
            concurrency: 16,
            local_queue: None,
            batch_delay_ms: None,
            no_log_success: true,
        }
    }

    /// A short name for progress lines.
    pub(super) fn label(&self) -> String {
        format!(
            "graphile-worker {}×{}, local queue {}, batch delay {}",
            self.processes,
            self.concurrency,
            self.local_queue.map_or("off".into(), |n| n.to_string()),
            self.batch_delay_ms
                .map_or("off".into(), |ms| format!("{ms} ms")),
        )
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("MODE", "serve".to_string()),
            ("CONCURRENCY", self.concurrency.to_string()),
        ];
        if let Some(size) = self.local_queue {
            env.push(("LOCAL_QUEUE", size.to_string()));
        }
        if let Some(ms) = self.batch_delay_ms {
            env.push(("BATCH_DELAY", ms.to_string()));
        }
        if self.no_log_success {
            env.push(("NO_LOG_SUCCESS", "1".into()));
        }
        env
    }
}

/// Installs graphile-worker if needed, installs its schema, empties its
/// queue and queues `jobs` no-op jobs (untimed).
pub(super) async fn prepare(conninfo: &str, jobs: i64) -> Result<()> {
    run_node(
        conninfo,
        &[("MODE", "prepare".into()), ("JOBS", jobs.to_string())],
    )
    .await
    .map(drop)
}

/// Starts `settings.processes` runners on the queued jobs; each has said
/// it is ready when this returns.
pub(super) async fn start(conninfo: &str, settings: &Settings) -> Result<Vec<Child>> {
    let mut children = Vec::new();
    for _ in 0..settings.processes {
        let mut command = node(conninfo);
        for (k, v) in settings.env() {
            command.env(k, v);
        }
        children.push(
            command
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .context("node is not available")?,
        );
    }
    for child in &mut children {
        super::race::wait_ready(child).await?;
    }
    Ok(children)
}

/// The SQL that counts graphile-worker's completed jobs of a round that
/// queued `jobs`: it deletes a job when it completes it.
pub(super) fn completed_sql(jobs: i64) -> String {
    format!("SELECT ({jobs} - count(*))::int8 FROM graphile_worker._private_jobs")
}

/// graphile-worker's bulk insert: one untimed `addJobs` call of `jobs`
/// no-op jobs, then, after a checkpoint, one timed: jobs per second.
pub(super) async fn add_jobs(conninfo: &str, jobs: i64) -> Result<f64> {
    let v = run_node(
        conninfo,
        &[("MODE", "add_jobs".into()), ("JOBS", jobs.to_string())],
    )
    .await?;
    v["jobs_per_s"].as_f64().context("no jobs_per_s")
}

/// `node run.mjs` in [`DIR`] on `conninfo`.
fn node(conninfo: &str) -> Command {
    let mut command = Command::new("node");
    command
        .arg("run.mjs")
        .current_dir(DIR)
        .env("DATABASE_URL", conninfo)
        .env_remove("NO_LOG_SUCCESS");
    command
}

/// Installs graphile-worker if needed and runs `graphile.mjs` with `env`
/// to its end; its last JSON line.
async fn run_node(conninfo: &str, env: &[(&str, String)]) -> Result<serde_json::Value> {
    install(Path::new(DIR)).await?;
    let mut command = node(conninfo);
    for (k, v) in env {
        command.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(600), command.output())
        .await
        .context("graphile-worker took over 10 minutes")?
        .context("node is not available")?;
    if !out.status.success() {
        bail!(
            "graphile-worker failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let line = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(line.trim().lines().last().unwrap_or(""))
        .with_context(|| format!("graphile-worker's output: {line}"))
}

/// Writes the runner script and installs [`GRAPHILE_VERSION`] into `dir`
/// unless it is there already.
async fn install(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let package = json!({
        "private": true,
        "type": "module",
        "dependencies": {"graphile-worker": GRAPHILE_VERSION},
    });
    std::fs::write(
        dir.join("package.json"),
        serde_json::to_string_pretty(&package)?,
    )?;
    std::fs::write(dir.join("run.mjs"), include_str!("graphile.mjs"))?;
    let installed = dir.join("node_modules/graphile-worker/package.json");
    let have: Option<String> = std::fs::read_to_string(&installed)
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|v| v["version"].as_str().map(str::to_string));
    if have.as_deref() == Some(GRAPHILE_VERSION) {
        return Ok(());
    }
    let status = tokio::time::timeout(
        Duration::from_secs(600),
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .status(),
    )
    .await
    .context("npm install took over 10 minutes")?
    .context("npm is not available")?;
    if !status.success() {
        bail!("npm install graphile-worker@{GRAPHILE_VERSION} failed ({status})");
    }
    Ok(())
}

/// Notes why graphile-worker could not run (no node, no npm) and gives
/// `None`, so the suite goes on without it.
pub(super) fn skipped<T>(result: Result<T>, progress: &Progress) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(e) => {
            progress.note(&format!("bench: graphile-worker skipped: {e:#}"));
            None
        }
    }
}

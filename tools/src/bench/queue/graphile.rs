//! The graphile-worker baseline: graphile-worker from npm, installed by the
//! bench into `target/bench-graphile`, processing no-op jobs on the bench
//! database (its own schema, `graphile_worker`), with its default settings
//! and with its documented fast path (see `graphile.mjs`).

use super::Progress;
use anyhow::{Context, Result, bail};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

/// The graphile-worker release measured (declares Node >= 14; runs on the
/// Node 20 here). 0.17 is the first with the local queue and batched
/// completions.
const GRAPHILE_VERSION: &str = "0.17.3";

/// How graphile-worker is configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Config {
    /// Its defaults: each worker fetches its own job, one completion per job.
    Default,
    /// Its documented fast path, through `preset.worker`: `localQueue:
    /// {size: 500}`, `completeJobBatchDelay: 0`, `failJobBatchDelay: 0`.
    Best,
}

/// graphile-worker's no-op jobs per second with `config`, or `None` (with
/// a note) when npm or node is unavailable or the install fails.
pub(super) async fn graphile_worker(
    conninfo: &str,
    jobs: i64,
    concurrency: usize,
    config: Config,
    progress: &Progress,
) -> Option<f64> {
    match try_graphile_worker(conninfo, jobs, concurrency, config).await {
        Ok(rate) => Some(rate.round()),
        Err(e) => {
            progress.note(&format!("bench: graphile-worker skipped: {e:#}"));
            None
        }
    }
}

/// graphile-worker's bulk insert: one `addJobs` call of `jobs` no-op jobs
/// on its emptied queue, jobs per second; `None` (with a note) as
/// [`graphile_worker`].
pub(super) async fn graphile_add_jobs(
    conninfo: &str,
    jobs: i64,
    progress: &Progress,
) -> Option<f64> {
    let env = [("MODE", "add_jobs".to_string()), ("JOBS", jobs.to_string())];
    match run_node(conninfo, &env).await {
        Ok(rate) => Some(rate.round()),
        Err(e) => {
            progress.note(&format!("bench: graphile-worker skipped: {e:#}"));
            None
        }
    }
}

async fn try_graphile_worker(
    conninfo: &str,
    jobs: i64,
    concurrency: usize,
    config: Config,
) -> Result<f64> {
    run_node(
        conninfo,
        &[
            ("JOBS", jobs.to_string()),
            ("CONCURRENCY", concurrency.to_string()),
            (
                "FAST",
                if config == Config::Best { "1" } else { "0" }.into(),
            ),
        ],
    )
    .await
}

/// Installs graphile-worker if needed and runs `graphile.mjs` with `env`;
/// the `jobs_per_s` of its JSON line.
async fn run_node(conninfo: &str, env: &[(&str, String)]) -> Result<f64> {
    let dir = Path::new("target/bench-graphile");
    install(dir).await?;
    let mut command = tokio::process::Command::new("node");
    command
        .arg("run.mjs")
        .current_dir(dir)
        .env("DATABASE_URL", conninfo);
    for (k, v) in env {
        command.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(600), command.output())
        .await
        .context("graphile-worker took over 10 minutes")?
        .context("node is not available")?;
    if !out.status.success() {
        bail!(
            "graphile-worker run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim().lines().last().unwrap_or(""))
        .with_context(|| format!("graphile-worker's output: {line}"))?;
    v["jobs_per_s"].as_f64().context("no jobs_per_s")
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
        tokio::process::Command::new("npm")
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

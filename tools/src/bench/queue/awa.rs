//! The Awa baseline: Awa 0.6.9 (crates.io `awa`, a Rust + sqlx + PostgreSQL
//! job queue, the closest peer there is) processing no-op jobs on the bench
//! database, and its bulk insert. The program is the crate
//! `tools/bench-baselines/awa` (outside the workspace, so Awa's dependency
//! versions never touch ours), built by the bench into `target/bench-awa`
//! unless already built (`.ci/setup` builds it beforehand, so a test run
//! does not pay the compile); see its `src/main.rs` for what it times.

use super::Progress;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the bench builds it (relative to the working directory, like
/// graphile-worker's `target/bench-graphile`).
const TARGET_DIR: &str = "target/bench-awa";

/// How Awa is configured for a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Config {
    /// `QueueConfig::default()` with `max_workers` set: poll 200 ms, one
    /// claimer, claim batches of 512, a 5-minute deadline, one enqueue shard.
    Default,
    /// The settings Awa's docs recommend for one hot queue: 4 enqueue
    /// shards, claim batches of 512, no per-attempt deadline, a 10 ms poll.
    Best,
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Default => "default",
            Config::Best => "best",
        }
    }
}

/// The Awa baseline crate's manifest (found from this crate's sources, so
/// it does not depend on the working directory).
fn manifest() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-baselines/awa/Cargo.toml")
}

fn binary() -> PathBuf {
    Path::new(TARGET_DIR).join("release/leasekeeper-bench-awa")
}

/// Awa's completed no-op jobs per second (all `jobs` durably terminal,
/// timed from the client's start) with `workers` workers and `config`, or
/// `None` (with a note) when it could not be built or run.
pub(super) async fn awa_worker(
    conninfo: &str,
    jobs: i64,
    workers: usize,
    config: Config,
    progress: &Progress,
) -> Option<f64> {
    let run = async {
        build().await?;
        run_awa(
            conninfo,
            "run",
            &[
                ("JOBS", jobs.to_string()),
                ("CONCURRENCY", workers.to_string()),
                ("SETTINGS", config.name().to_string()),
            ],
        )
        .await
    };
    note_failure(run.await, progress)
}

/// Awa's bulk insert, `QueueStorage::enqueue_params_copy` of `jobs` jobs
/// in one call, into a fresh Awa schema: jobs per second.
pub(super) async fn awa_insert_many(conninfo: &str, jobs: i64, progress: &Progress) -> Option<f64> {
    let run = async {
        build().await?;
        run_awa(conninfo, "insert", &[("JOBS", jobs.to_string())]).await
    };
    note_failure(run.await, progress)
}

fn note_failure(result: Result<f64>, progress: &Progress) -> Option<f64> {
    match result {
        Ok(rate) => Some(rate.round()),
        Err(e) => {
            progress.note(&format!("bench: awa skipped: {e:#}"));
            None
        }
    }
}

async fn run_awa(conninfo: &str, mode: &str, env: &[(&str, String)]) -> Result<f64> {
    let mut command = tokio::process::Command::new(binary());
    command
        .arg(mode)
        .env("DATABASE_URL", conninfo)
        // Awa logs through `tracing`; nothing here installs a subscriber,
        // and its own tuning variables must come from this run only.
        .env_remove("AWA_COMPLETION_BATCH_SIZE")
        .env_remove("AWA_COMPLETION_FLUSH_MS")
        .env_remove("AWA_COMPLETION_SHARDS")
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(900), command.output())
        .await
        .context("the Awa baseline took over 15 minutes")?
        .with_context(|| format!("running {}", binary().display()))?;
    if !out.status.success() {
        bail!(
            "the Awa baseline ({mode}) failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .with_context(|| format!("the Awa baseline's output: {stdout}"))?;
    v["jobs_per_s"].as_f64().context("no jobs_per_s")
}

/// Builds the baseline (release, its own committed lock file) into
/// [`TARGET_DIR`]. Cargo makes this a no-op when it is built already: about
/// a second, against minutes from clean (see docs/BENCHMARKS.md).
pub(super) async fn build() -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = tokio::time::timeout(
        Duration::from_secs(3600),
        tokio::process::Command::new(cargo)
            .args([
                "build",
                "--release",
                "--locked",
                "--quiet",
                "--manifest-path",
            ])
            .arg(manifest())
            .arg("--target-dir")
            .arg(TARGET_DIR)
            // Not this process's own build settings (when run from `cargo
            // test`): the baseline is a crate of its own.
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("CARGO_BUILD_TARGET_DIR")
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .status(),
    )
    .await
    .context("building the Awa baseline took over an hour")?
    .context("cargo is not available")?;
    if !status.success() {
        bail!(
            "building the Awa baseline ({}) failed ({status})",
            manifest().display()
        );
    }
    Ok(())
}

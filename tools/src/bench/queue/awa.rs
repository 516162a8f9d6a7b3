//! The Awa contestant: Awa 0.6.9 (crates.io `awa`, a Rust + sqlx +
//! PostgreSQL job queue, the closest peer there is) processing no-op jobs
//! on the bench database, measured by the race's protocol
//! ([`super::race`]); and its bulk insert. The program is the crate
//! `tools/bench-baselines/awa` (outside the workspace, so Awa's dependency
//! versions never touch ours), built by the bench into `target/bench-awa`
//! unless already built (`.ci/setup` builds it beforehand, so a test run
//! does not pay the compile); see its `src/main.rs` for its modes.

use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// Where the bench builds it (relative to the working directory, like
/// graphile-worker's `target/bench-graphile`).
const TARGET_DIR: &str = "target/bench-awa";

/// How Awa runs: every setting the program takes, so a reader can run it
/// again (written to the JSON as `<key>_settings`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(super) struct Settings {
    /// The program's base set: `default` (`QueueConfig::default()`) or
    /// `best` (Awa's documented hot-queue settings); the fields below
    /// override it.
    pub base: &'static str,
    /// `QueueConfig::max_workers`: jobs in flight at most. A permit is
    /// held from the claim until the completion's batch commits, so it
    /// bounds what Awa claims ahead as our prefetch bounds ours.
    pub max_workers: u32,
    /// `awa.queue_meta.enqueue_shards` (1: strict FIFO), or `None` for the
    /// base set's.
    pub enqueue_shards: Option<u16>,
    /// `AWA_COMPLETION_BATCH_SIZE` (Awa's own variable; 512 by default), or
    /// `None` for Awa's default.
    pub completion_batch: Option<u32>,
}

impl Settings {
    /// `QueueConfig::default()` with 16 permits (16 jobs at once).
    pub(super) fn defaults() -> Self {
        Settings {
            base: "default",
            max_workers: 16,
            enqueue_shards: None,
            completion_batch: None,
        }
    }

    /// Awa's documented settings for one hot queue (poll 10 ms, 4 enqueue
    /// shards, claim batches of 512, no per-attempt deadline) with
    /// `max_workers` permits.
    pub(super) fn hot(max_workers: u32) -> Self {
        Settings {
            base: "best",
            max_workers,
            ..Settings::defaults()
        }
    }

    /// A short name for progress lines.
    pub(super) fn label(&self) -> String {
        format!(
            "Awa {} set, max_workers {}, shards {}, completion batch {}",
            self.base,
            self.max_workers,
            self.enqueue_shards
                .map_or("as set".into(), |n| n.to_string()),
            self.completion_batch
                .map_or("512".into(), |n| n.to_string()),
        )
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("SETTINGS", self.base.to_string()),
            ("MAX_WORKERS", self.max_workers.to_string()),
        ];
        let optional = [
            (
                "AWA_BENCH_ENQUEUE_SHARDS",
                self.enqueue_shards.map(u64::from),
            ),
            (
                "AWA_COMPLETION_BATCH_SIZE",
                self.completion_batch.map(u64::from),
            ),
        ];
        for (k, v) in optional {
            if let Some(v) = v {
                env.push((k, v.to_string()));
            }
        }
        env
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

/// The program in `mode` on `conninfo`, with only the environment given
/// here (Awa's own tuning variables come from `settings` or not at all).
fn awa(conninfo: &str, mode: &str, settings: &Settings) -> Command {
    let mut command = Command::new(binary());
    command
        .arg(mode)
        .env("DATABASE_URL", conninfo)
        .env_remove("AWA_COMPLETION_BATCH_SIZE")
        .env_remove("AWA_COMPLETION_FLUSH_MS")
        .env_remove("AWA_COMPLETION_SHARDS")
        .kill_on_drop(true);
    for (k, v) in settings.env() {
        command.env(k, v);
    }
    command
}

/// Builds the program if needed, then a fresh Awa schema with `jobs` no-op
/// jobs queued (untimed).
pub(super) async fn prepare(conninfo: &str, jobs: i64, settings: &Settings) -> Result<()> {
    build().await?;
    let mut command = awa(conninfo, "prepare", settings);
    command.env("JOBS", jobs.to_string());
    run_to_end(command).await.map(drop)
}

/// A started Awa client: asked for its count over stdin.
pub(super) struct Serving {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Serving {
    /// Jobs durably terminal so far (Awa's exact count, on a connection of
    /// the program's own).
    pub(super) async fn completed(&mut self) -> Result<i64> {
        self.stdin.write_all(b"count\n").await?;
        self.stdin.flush().await?;
        let line = self
            .lines
            .next_line()
            .await?
            .context("the Awa program ended")?;
        line.trim()
            .parse()
            .with_context(|| format!("the Awa program's count: {line}"))
    }

    /// Ends stdin: the client shuts down gracefully.
    pub(super) async fn stop(self) -> Result<()> {
        let Serving {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        super::race::wait_stopped(&mut child, "the Awa program").await
    }
}

/// Starts one client on the queued jobs; it has said it is ready.
pub(super) async fn start(conninfo: &str, settings: &Settings) -> Result<Serving> {
    let mut child = awa(conninfo, "serve", settings)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", binary().display()))?;
    let stdin = child.stdin.take().context("the program's stdin")?;
    let stdout = child.stdout.take().context("the program's stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .context("the Awa program did not start within a minute")??;
    if line.as_deref() != Some("ready") {
        bail!("the Awa program did not start: {line:?}");
    }
    Ok(Serving {
        child,
        stdin,
        lines,
    })
}

/// Awa's bulk insert, `QueueStorage::enqueue_params_copy` of `jobs` jobs
/// in one call after an untimed one and a checkpoint: jobs per second.
pub(super) async fn insert_many(conninfo: &str, jobs: i64) -> Result<f64> {
    build().await?;
    let mut command = awa(conninfo, "insert", &Settings::defaults());
    command.env("JOBS", jobs.to_string());
    let v = run_to_end(command).await?;
    v["jobs_per_s"].as_f64().context("no jobs_per_s")
}

/// Runs `command` to its end; its last line, as JSON.
async fn run_to_end(mut command: Command) -> Result<serde_json::Value> {
    let out = tokio::time::timeout(Duration::from_secs(900), command.output())
        .await
        .context("the Awa program took over 15 minutes")?
        .with_context(|| format!("running {}", binary().display()))?;
    if !out.status.success() {
        bail!(
            "the Awa program failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .with_context(|| format!("the Awa program's output: {stdout}"))
}

/// Builds the baseline (release, its own committed lock file) into
/// [`TARGET_DIR`], once per process: cargo makes a build of a built
/// baseline a no-op, but a no-op of about a second, paid in every round.
pub(super) async fn build() -> Result<()> {
    static BUILT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    BUILT.get_or_try_init(build_now).await.map(drop)
}

/// The build itself: minutes from clean (see docs/BENCHMARKS.md).
async fn build_now() -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = tokio::time::timeout(
        Duration::from_secs(3600),
        Command::new(cargo)
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

//! Scale-out: the no-op runtime of [`super::fleet`] in 1, 2 and 4 separate
//! OS processes on the one bench database, each `leasekeeper-tools bench-runtime`
//! (a hidden subcommand, [`runtime_process`]), counted the same way.

use super::fleet::{CONCURRENCY, completed_per_s, noop_runtime};
use super::{BenchDb, Plan, Progress};
use anyhow::{Context, Result, bail};
use leasekeeper::settings::Settings;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::io::Write;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

/// What a runtime process prints once its runtime has started.
const READY: &str = "ready";
/// How long a runtime process may take to start, and to stop once asked.
const PATIENCE: Duration = Duration::from_secs(60);

/// Tasks completed per second by `instances` runtime processes of
/// [`CONCURRENCY`] workers each, over the tasks already queued. The window
/// opens once every process has said it is ready (plus the warm-up); then
/// each is sent SIGTERM and shuts down gracefully.
pub(super) async fn instances(
    db: &BenchDb,
    instances: usize,
    plan: &Plan,
    progress: &Progress,
) -> Result<f64> {
    let exe = std::env::current_exe().context("finding this executable")?;
    // A bound in case this process dies before stopping them.
    let seconds = (plan.warmup + plan.run + PATIENCE).as_secs();
    let mut children = Vec::new();
    for k in 0..instances {
        let child = Command::new(&exe)
            .args(["bench-runtime", "--database-url", &db.conninfo, "--schema"])
            .arg(db.schema.as_str())
            .args(["--concurrency", &CONCURRENCY.to_string()])
            .args(["--seconds", &seconds.to_string()])
            .args(["--id", &format!("bench-scale{instances}-{k}")])
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting a runtime process")?;
        children.push(child);
    }
    for child in &mut children {
        wait_ready(child).await?;
    }
    let per_s = completed_per_s(&db.pool, plan, progress).await;
    for child in &children {
        if let Some(pid) = child.id() {
            kill(Pid::from_raw(pid as i32), Signal::SIGTERM)
                .context("stopping a runtime process")?;
        }
    }
    for child in &mut children {
        let status = tokio::time::timeout(PATIENCE, child.wait())
            .await
            .context("a runtime process did not stop within a minute of SIGTERM")??;
        if !status.success() {
            bail!("a runtime process failed ({status})");
        }
    }
    per_s
}

/// Waits for `child` to print [`READY`].
async fn wait_ready(child: &mut Child) -> Result<()> {
    let stdout = child.stdout.take().context("the child's stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .context("a runtime process did not start within a minute")??;
    match line.as_deref() {
        Some(READY) => Ok(()),
        other => bail!("a runtime process did not start: {other:?} (its stderr is above)"),
    }
}

/// `leasekeeper-tools bench-runtime`: one no-op runtime named `id` with
/// `concurrency` workers, on the database and schema of `settings` (a
/// pool with the library's defaults), until SIGTERM or SIGINT or for
/// `seconds` at most; then a graceful shutdown. Prints [`READY`] once it
/// has started.
pub async fn runtime_process(
    settings: &Settings,
    concurrency: usize,
    seconds: u64,
    id: &str,
) -> Result<()> {
    let url = settings
        .database_url
        .as_ref()
        .map(|u| u.expose())
        .context("bench-runtime needs --database-url")?;
    let pool = leasekeeper_core::db::connect(url, &settings.schema).await?;
    let runtime = noop_runtime(pool.clone(), id, concurrency).await?;
    // Listening before saying ready: the parent's SIGTERM may follow soon.
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{READY}")?;
        out.flush()?;
    }
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(seconds)) => {}
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    runtime.shutdown().await;
    pool.close().await;
    Ok(())
}

//! Scale-out: the no-op runtime of [`super::fleet`] in 1, 2 and 4 separate
//! OS processes on the one bench database, each `leasekeeper-tools bench-runtime`
//! (a hidden subcommand, [`runtime_process`]), counted the same way.

use super::fleet::{self, completed_per_s, noop_runtime_with, start_process};
use super::{BenchDb, Plan, Progress};
use anyhow::{Context, Result, bail};
use leasekeeper::settings::Settings;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::io::Write;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};

/// What a runtime process prints once its runtime has started.
const READY: &str = "ready";
/// How long a runtime process may take to stop once asked.
const PATIENCE: Duration = Duration::from_secs(60);

/// Tasks completed per second by `instances` runtime processes of
/// [`fleet::CONCURRENCY`] workers each, over the tasks already queued. The window
/// opens once every process has said it is ready (plus the warm-up); then
/// each is sent SIGTERM and shuts down gracefully.
pub(super) async fn instances(
    db: &BenchDb,
    instances: usize,
    plan: &Plan,
    progress: &Progress,
) -> Result<f64> {
    let mut children = Vec::new();
    for k in 0..instances {
        let id = format!("bench-scale{instances}-{k}");
        children.push(start_process(db, &id, &fleet::Settings::defaults()).await?);
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

/// `leasekeeper-tools bench-runtime`: one no-op runtime named `id` with
/// `concurrency` workers and the runtime settings `runtime`, on the
/// database and schema of `settings` (a pool with the library's
/// defaults), until SIGTERM or SIGINT or for `seconds` at most; then a
/// graceful shutdown. Prints `ready` once it has started.
pub async fn runtime_process(
    settings: &Settings,
    concurrency: usize,
    runtime: fleet::Settings,
    seconds: u64,
    id: &str,
) -> Result<()> {
    let url = settings
        .database_url
        .as_ref()
        .map(|u| u.expose())
        .context("bench-runtime needs --database-url")?;
    let pool = leasekeeper_core::db::connect(url, &settings.schema).await?;
    let runtime = noop_runtime_with(pool.clone(), id, concurrency, runtime).await?;
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

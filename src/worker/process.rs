//! `leasekeeper worker --server URL`: the worker loop as a separate process,
//! over the REST API of an instance, until SIGINT or SIGTERM.
//!
//! A graceful stop gives the current task back (as a failed attempt, soon
//! retried). `kill -9` is the real crash: nothing is given back, the task's
//! lease runs out and another worker takes the task over. A chaos crash
//! imitates that: the process exits at once with status 1, writing nothing.

use crate::settings::Settings;
use anyhow::{Context, anyhow, bail};
use leasekeeper_core::lease::Holder;
use leasekeeper_core::queue::ClaimFilter;
use leasekeeper_core::worker::chaos::Chaos;
use leasekeeper_core::worker::http::Http;
use leasekeeper_core::worker::run::{Exit, Worker};
use rand::Rng;

/// A worker id for a process started without `--id`: `worker-<pid>-<hex>`.
pub fn generated_id() -> String {
    let suffix: u16 = rand::rng().random();
    format!("worker-{}-{suffix:04x}", std::process::id())
}

/// Fault-injection options of a worker process (`leasekeeper-tools chaos` uses them).
#[derive(Clone, Debug, Default)]
pub struct FaultOptions {
    /// Append every claim, heartbeat, completion and failure report, with
    /// its outcome, to this file (see [`super::history`]).
    pub history: Option<std::path::PathBuf>,
    /// Never give a claim up on this side (see [`WorkerConfig::trust_claims`]).
    pub trust_claims: bool,
}

/// Runs one worker named `id` (or a generated name) against the instance at
/// `server` until a signal stops it.
pub async fn run(
    settings: Settings,
    server: &str,
    id: Option<String>,
    faults: FaultOptions,
) -> anyhow::Result<()> {
    let id = Holder::parse(id.unwrap_or_else(generated_id)).context("--id")?;
    let handlers = leasekeeper_core::worker::simulated::handlers(&settings.chaos_settings());
    let transport = Http::new(server)
        .map_err(|e| anyhow!(e))?
        .serving(ClaimFilter::default().kinds(handlers.kinds()));
    let transport =
        super::history::Recorded::new(transport, faults.history.as_deref()).context("--history")?;
    let mut config = settings.worker_config();
    config.trust_claims = faults.trust_claims;
    let (worker, controls) = Worker::new(
        id.clone(),
        transport,
        handlers,
        config,
        Chaos::from_os(settings.chaos_settings()),
    );
    tracing::info!(worker = %id, server, chaos = settings.chaos, "worker process started");
    let stop = controls.stop_token();
    tokio::spawn(async move {
        crate::signals::shutdown_signal().await;
        stop.cancel();
    });
    match worker.run().await {
        Exit::Stopped => Ok(()),
        Exit::Crashed => {
            bail!("worker {id} crashed (chaos; set LEASEKEEPER_CHAOS=0 to turn it off)")
        }
    }
}

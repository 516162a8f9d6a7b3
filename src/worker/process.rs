//! `leasekeeper worker --server URL`: the worker loop as a separate process,
//! over the REST API of an instance, until SIGINT or SIGTERM.
//!
//! A graceful stop gives the current task back (as a failed attempt, soon
//! retried). `kill -9` is the real crash: nothing is given back, the task's
//! lease runs out and another worker takes the task over. A chaos crash
//! imitates that: the process exits at once with status 1, writing nothing.

use super::chaos::{Chaos, ChaosSettings};
use super::run::{Exit, Worker, WorkerConfig};
use super::transport::Http;
use crate::lease::Holder;
use crate::settings::Settings;
use anyhow::{Context, anyhow, bail};
use rand::Rng;

/// A worker id for a process started without `--id`: `worker-<pid>-<hex>`.
pub fn generated_id() -> String {
    let suffix: u16 = rand::rng().random();
    format!("worker-{}-{suffix:04x}", std::process::id())
}

/// Runs one worker named `id` (or a generated name) against the instance at
/// `server` until a signal stops it.
pub async fn run(settings: Settings, server: &str, id: Option<String>) -> anyhow::Result<()> {
    let id = Holder::parse(id.unwrap_or_else(generated_id)).context("--id")?;
    let transport = Http::new(server).map_err(|e| anyhow!(e))?;
    let (worker, controls) = Worker::new(
        id.clone(),
        transport,
        WorkerConfig::from_settings(&settings),
        Chaos::from_os(ChaosSettings::from_settings(&settings)),
    );
    tracing::info!(worker = %id, server, chaos = settings.chaos, "worker process started");
    let stop = controls.stop_token();
    tokio::spawn(async move {
        crate::server::shutdown_signal().await;
        stop.cancel();
    });
    match worker.run().await {
        Exit::Stopped => Ok(()),
        Exit::Crashed => {
            bail!("worker {id} crashed (chaos; set LEASEKEEPER_CHAOS=0 to turn it off)")
        }
    }
}

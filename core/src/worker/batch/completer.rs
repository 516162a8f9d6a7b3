//! The completer: the loop that writes the workers' completions in
//! batches ([`store::complete_each`]). It waits up to [`Batching::linger`]
//! after the first for more, or until [`Batching::max`] are waiting. Each
//! is still fenced on its own, and each refused one is recorded. A worker
//! hands its completion over and claims its next task at once.

#[cfg(doc)]
use super::Batching;
use super::Setup;
use super::held::Held;
use crate::lease::Holder;
use crate::queue::store::{self, Completion, MAX_BATCH};
use crate::worker::transport::{Tally, TransportError};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// A completion handed over by a worker.
pub(crate) struct Finish {
    pub(crate) worker: Holder,
    pub(crate) task_id: i64,
    pub(crate) token: i64,
    pub(crate) output: Value,
    /// The worker's local deadline for the claim: transient failures are
    /// retried until it passes.
    pub(crate) deadline: Instant,
    /// Where the worker counts its completed and abandoned tasks.
    pub(crate) tally: Arc<Tally>,
}

pub(super) enum ToCompleter {
    Finish(Finish),
    Flush(oneshot::Sender<()>),
}

/// The completer: batches of completions, each fenced on its own.
pub(super) async fn complete(setup: Arc<Setup>, mut rx: mpsc::Receiver<ToCompleter>) {
    let max = setup.batching.max.clamp(1, MAX_BATCH);
    let mut flushes = Vec::new();
    let mut held = Held::default();
    while let Some(first) = held.next(&mut rx).await {
        let mut batch = Vec::new();
        let mut take = |msg, batch: &mut Vec<Finish>| match msg {
            ToCompleter::Finish(f) => batch.push(f),
            ToCompleter::Flush(done) => flushes.push(done),
        };
        take(first, &mut batch);
        let until = Instant::now() + setup.batching.linger;
        while batch.len() < max {
            match rx.try_recv() {
                Ok(msg) => take(msg, &mut batch),
                Err(_) => match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(msg)) => take(msg, &mut batch),
                    Ok(None) | Err(_) => break,
                },
            }
        }
        if !batch.is_empty() {
            write_completions(&setup, &mut held, batch).await;
        }
        for done in flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

async fn write_completions(setup: &Setup, held: &mut Held, mut batch: Vec<Finish>) {
    let retry = Duration::from_millis(250);
    loop {
        let completions: Vec<Completion> = batch
            .iter()
            .map(|f| Completion::new(f.task_id, f.token, f.worker.clone(), Some(f.output.clone())))
            .collect();
        let started = Instant::now();
        let outcomes = async {
            let conn = held.conn(setup).await?;
            Ok::<_, TransportError>(store::complete_each(conn, &setup.schema, &completions).await?)
        }
        .await;
        tracing::trace!(
            tasks = completions.len(),
            ms = started.elapsed().as_secs_f64() * 1000.0,
            "completed"
        );
        if let Err(e) = &outcomes {
            held.failed(e);
        }
        let why = match outcomes {
            Ok(outcomes) => {
                for (f, outcome) in batch.iter().zip(outcomes) {
                    match outcome {
                        Ok(_) => {
                            f.tally.done.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(worker = %f.worker, task_id = f.task_id, token = f.token,
                                "completed a task");
                        }
                        Err(e) => {
                            f.tally.abandoned.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(worker = %f.worker, task_id = f.task_id, token = f.token,
                                reason = %e, "abandoning the task: completion refused");
                        }
                    }
                }
                return;
            }
            Err(e) => e,
        };
        // The database could not be asked: retry each while its claim's
        // local deadline allows; the lease of the others runs out.
        let now = Instant::now();
        batch.retain(|f| {
            let keep = now + retry < f.deadline;
            if !keep {
                f.tally.abandoned.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(worker = %f.worker, task_id = f.task_id, error = %why,
                    "abandoning the task: completion failed and the deadline passed");
            }
            keep
        });
        if batch.is_empty() {
            return;
        }
        tracing::warn!(tasks = batch.len(), error = %why, "completions failed; retrying");
        tokio::time::sleep(retry).await;
    }
}

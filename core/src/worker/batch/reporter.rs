//! The reporter: the loop that writes what the workers are doing to the
//! `workers` table every [`Batching::report_every`], the newest report of
//! each worker in one statement ([`registry::record_each`]).

#[cfg(doc)]
use super::Batching;
use super::Setup;
use crate::lease::Holder;
use crate::worker::Report;
use crate::worker::registry;
use crate::worker::transport::TransportError;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// What the reporter is asked to do.
pub(super) enum ToReporter {
    Report(Holder, Report),
    Flush(oneshot::Sender<()>),
}

/// The reporter: the newest report of each worker, every `report_every`.
pub(super) async fn report(setup: Arc<Setup>, mut rx: mpsc::UnboundedReceiver<ToReporter>) {
    let mut pending: HashMap<Holder, Report> = HashMap::new();
    let mut tick = tokio::time::interval(setup.batching.report_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(ToReporter::Report(worker, mut report)) => {
                    // A newer report replaces an unwritten one, keeping
                    // what the older one had to say once: a fresh run, an
                    // accepted heartbeat.
                    if let Some(older) = pending.remove(&worker) {
                        report.fresh |= older.fresh;
                        report.heartbeat |= older.heartbeat;
                    }
                    pending.insert(worker, report);
                }
                Some(ToReporter::Flush(done)) => {
                    write_reports(&setup, &mut pending).await;
                    let _ = done.send(());
                }
                None => {
                    write_reports(&setup, &mut pending).await;
                    return;
                }
            },
            _ = tick.tick() => write_reports(&setup, &mut pending).await,
        }
    }
}

async fn write_reports(setup: &Setup, pending: &mut HashMap<Holder, Report>) {
    if pending.is_empty() {
        return;
    }
    let reports: Vec<(Holder, Report)> = pending.drain().collect();
    let written = async {
        let mut conn = setup
            .pool
            .acquire()
            .await
            .map_err(|e| TransportError::Transient(format!("database: {e}")))?;
        registry::record_each(
            &mut conn,
            &setup.schema,
            setup.kind,
            Some(&setup.instance_id),
            &reports,
        )
        .await
        .map_err(|e| TransportError::Transient(format!("database: {e}")))
    }
    .await;
    if let Err(e) = written {
        tracing::debug!(workers = reports.len(), error = %e, "could not record the workers' states");
    }
}

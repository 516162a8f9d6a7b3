//! `GET /metrics`: Prometheus text, rendered by `metrics-exporter-prometheus`
//! from what the library counts through the `metrics` facade
//! ([`crate::metrics`](leasekeeper_core::metrics): claims, takeovers,
//! refused stale writes, renewal and failover times, per process) and the
//! task counts by status, read from the database at each scrape.

use crate::state::AppState;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use leasekeeper_core::metrics::{
    FAILOVER_SECONDS, LEASE_RENEW_SECONDS, QUEUE_DEPTH, QUEUE_OLDEST_PENDING_SECONDS, TASKS,
    describe,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

/// Bucket bounds of the renewal-time histogram, in seconds: a statement's
/// round trip, up to the slowest that still beats a renew interval.
const RENEW_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
];
/// Bucket bounds of the failover-time histogram, in seconds: around the
/// TTLs people run (a few seconds to a minute).
const FAILOVER_BUCKETS: &[f64] = &[0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 60.0, 120.0];

/// The process's recorder, installed on first use (`serve` installs it at
/// start-up, before anything is counted). `None` when another recorder was
/// installed first.
pub fn install() -> Option<&'static PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let installed = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(LEASE_RENEW_SECONDS.into()), RENEW_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(FAILOVER_SECONDS.into()),
                        FAILOVER_BUCKETS,
                    )
                })
                .and_then(|b| b.install_recorder());
            match installed {
                Ok(handle) => {
                    describe();
                    Some(handle)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics recorder not installed: /metrics answers 503");
                    None
                }
            }
        })
        .as_ref()
}

/// The queues this process last set gauges for, so that a queue pruned
/// since has its gauges set to zero rather than left at their last values.
static GAUGED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The per-queue gauges, from one reading of every queue (at most the
/// queue cap of them); a queue pruned since the last scrape reads zero.
async fn set_queue_gauges(s: &AppState) {
    let read = crate::reads::read!(s, |c| leasekeeper_core::queue::queues::list(c, s.schema())
        .await);
    match read {
        Ok(queues) => {
            let names: Vec<String> = queues.iter().map(|q| q.name.clone()).collect();
            let gone: Vec<String> = match GAUGED.lock() {
                Ok(mut gauged) => {
                    let before = std::mem::replace(&mut *gauged, names.clone());
                    let now: std::collections::HashSet<&String> = names.iter().collect();
                    before.into_iter().filter(|n| !now.contains(n)).collect()
                }
                Err(_) => Vec::new(),
            };
            for name in gone {
                for status in ["pending", "started", "failed"] {
                    metrics::gauge!(QUEUE_DEPTH, "queue" => name.clone(), "status" => status)
                        .set(0.0);
                }
                metrics::gauge!(QUEUE_OLDEST_PENDING_SECONDS, "queue" => name).set(0.0);
            }
            for q in queues {
                for (status, n) in [
                    ("pending", q.pending),
                    ("started", q.started),
                    ("failed", q.failed),
                ] {
                    metrics::gauge!(QUEUE_DEPTH, "queue" => q.name.clone(), "status" => status)
                        .set(n as f64);
                }
                metrics::gauge!(QUEUE_OLDEST_PENDING_SECONDS, "queue" => q.name)
                    .set(q.oldest_pending_age_ms.unwrap_or(0) as f64 / 1000.0);
            }
        }
        Err(e) => tracing::warn!(error = %e, "metrics: cannot read the queues"),
    }
}

/// `GET /metrics`.
pub fn route() -> axum::Router<AppState> {
    axum::Router::new().route("/metrics", get(render))
}

#[utoipa::path(
    get,
    path = "/metrics",
    tag = "metrics",
    summary = "Prometheus metrics",
    description = "Task counts by status and per queue (`leasekeeper_queue_depth`, `leasekeeper_queue_oldest_pending_seconds`; read from the database at each scrape, the whole cluster) and this process's counters and histograms: claims, takeovers, refused stale writes, renewal and failover times.",
    responses(
        (status = 200, description = "Prometheus text format 0.0.4", content_type = "text/plain; version=0.0.4; charset=utf-8", body = String),
        (status = 503, description = "Another metrics recorder was installed first", content_type = "text/plain", body = String),
    )
)]
async fn render(State(s): State<AppState>) -> Response {
    let Some(handle) = install() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "no metrics recorder\n").into_response();
    };
    // Counts from one snapshot; a scrape while the database is away still
    // answers with the process's own counters (the gauges keep their last
    // values).
    let counted: Result<_, crate::error::AppError> =
        crate::reads::read!(s, |c| leasekeeper_core::counts::counts(c, s.schema()).await);
    match counted {
        Ok(c) => {
            for (status, n) in [
                ("pending", c.tasks_pending),
                ("started", c.tasks_started),
                ("processed", c.tasks_processed),
                ("failed", c.tasks_failed),
                ("cancelled", c.tasks_cancelled),
                ("waiting", c.tasks_waiting),
            ] {
                metrics::gauge!(TASKS, "status" => status).set(n as f64);
            }
        }
        Err(e) => tracing::warn!(error = %e, "metrics: cannot read the task counts"),
    }
    set_queue_gauges(&s).await;
    handle.run_upkeep();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        handle.render(),
    )
        .into_response()
}

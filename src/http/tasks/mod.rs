//! `/api/tasks`: the task queue's REST contract (docs/rest-api.md),
//! a file per idea: enqueueing ([`enqueue`]), the worker's writes
//! ([`work`]), the reads ([`reads`]) and the operator's controls
//! ([`controls`]). The bodies and their checks are core's; a handler
//! parses, calls core and maps the error.

pub mod controls;
pub mod enqueue;
pub mod reads;
pub mod work;

use crate::state::AppState;
use axum::Router;
use axum::routing::{get, post, put};

/// The task routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/tasks", get(reads::list_all).post(enqueue::enqueue))
        .route(
            "/api/tasks/batch",
            post(enqueue::enqueue_batch).layer(axum::extract::DefaultBodyLimit::max(
                enqueue::MAX_BATCH_BODY_BYTES,
            )),
        )
        .route("/api/tasks/pending", get(reads::list_pending))
        .route("/api/tasks/started", get(reads::list_started))
        .route("/api/tasks/processed", get(reads::list_processed))
        .route("/api/tasks/failed", get(reads::list_failed))
        .route("/api/tasks/failed/summary", get(reads::failed_summary))
        .route("/api/tasks/next", post(work::claim_next))
        .route("/api/tasks/{id}", get(reads::get_one))
        .route("/api/tasks/{id}/heartbeat", put(work::heartbeat))
        .route("/api/tasks/{id}/complete", put(work::complete))
        .route("/api/tasks/{id}/fail", put(work::fail))
        .route("/api/tasks/{id}/snooze", put(work::snooze))
        .route("/api/tasks/{id}/wait", put(work::wait))
        .route("/api/tasks/{id}/signal", post(work::signal))
        .route("/api/tasks/{id}/events", get(reads::events))
        .route("/api/tasks/{id}/attempts", get(reads::attempts))
        .route("/api/tasks/{id}/cancel", post(controls::cancel_one))
        .route("/api/tasks/{id}/retry", post(controls::retry_one))
        .route("/api/tasks/{id}/release", post(controls::release_one))
        .route("/api/tasks/cancel", post(controls::cancel_matching))
        .route("/api/tasks/retry", post(controls::retry_matching))
}

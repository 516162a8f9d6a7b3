//! The REST API: thin handlers that parse the request, call the domain
//! modules, and map their errors to [`AppError`](crate::error::AppError).

pub mod audit;
pub mod events;
pub mod extract;
pub mod generator;
pub mod headers;
pub mod health;
pub mod instances;
pub mod leases;
pub mod metrics;
pub mod openapi;
pub mod origin;
pub mod overview;
pub mod paging;
pub mod params;
pub mod perimeter;
pub mod queues;
pub mod responses;
pub mod schedules;
pub mod server_fns;
pub mod tasks;
pub mod workers;
pub mod workflows;

use crate::error::AppError;
use crate::state::AppState;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::any;

/// The largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// An answer that is only words: `{"message": "..."}`.
#[derive(serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Message {
    /// What happened.
    pub message: String,
}

/// Every `/api` route, with JSON errors for unknown paths and methods and a
/// body limit that answers 413 past [`MAX_BODY_BYTES`].
pub fn api_router() -> Router<AppState> {
    Router::new()
        .merge(leases::routes())
        .merge(tasks::routes())
        .merge(workers::routes())
        .merge(generator::routes())
        .merge(schedules::routes())
        .merge(queues::routes())
        .merge(workflows::routes())
        .merge(instances::routes())
        .merge(overview::routes())
        .merge(audit::routes())
        .merge(openapi::routes())
        .route("/api", any(no_such_route))
        .route("/api/{*rest}", any(no_such_route))
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

async fn no_such_route() -> AppError {
    AppError::NotFound("no such API route".into())
}

async fn method_not_allowed() -> axum::response::Response {
    use axum::response::IntoResponse;
    let body = crate::error::ErrorBody {
        error: "method not allowed on this route".into(),
    };
    (axum::http::StatusCode::METHOD_NOT_ALLOWED, axum::Json(body)).into_response()
}

/// Middleware: every request's handler runs to its end, even when the
/// client goes away half-way.
///
/// Without it, a client that dies mid-request (a worker process killed with
/// SIGKILL during a heartbeat) makes the server drop the handler's future
/// wherever it stands: inside a transaction, its connection went back to
/// the pool with the transaction still open and its row locks held until
/// that connection was next used. A task row locked that way is skipped by
/// every claim (`SKIP LOCKED`), so the takeover came late; measured by
/// `leasekeeper-tools bench` (failover), and the cause of the "there is already a
/// transaction in progress" warnings. Spawned, the handler commits or rolls
/// back as it would have; only the answer is lost, which is the ambiguity
/// any client must live with anyway.
///
/// Reads (`GET` and `HEAD`) are the exception: they change nothing, so
/// they are not spawned, and a client that goes away drops its read, whose
/// statement [`crate::reads`] then cancels in the database instead of
/// letting it run on for nobody.
pub async fn run_to_completion(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if is_read(request.method()) {
        return next.run(request).await;
    }
    match tokio::spawn(next.run(request)).await {
        Ok(response) => response,
        Err(e) => {
            tracing::error!(error = %e, "a request handler panicked");
            AppError::Internal.into_response()
        }
    }
}

/// Whether a request of `method` only reads: `GET` and `HEAD` routes
/// change nothing (every change is a `POST`, `PUT` or `DELETE`).
pub fn is_read(method: &axum::http::Method) -> bool {
    method == axum::http::Method::GET || method == axum::http::Method::HEAD
}

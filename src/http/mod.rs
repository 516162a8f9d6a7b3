//! The REST API: thin handlers that parse the request, call the domain
//! modules, and map their errors to [`AppError`](crate::error::AppError).

pub mod extract;
pub mod generator;
pub mod instances;
pub mod leases;
pub mod origin;
pub mod overview;
pub mod tasks;
pub mod workers;

use crate::error::AppError;
use crate::server::AppState;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::any;

/// The largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Every `/api` route, with JSON errors for unknown paths and methods and a
/// body limit that answers 413 past [`MAX_BODY_BYTES`].
pub fn api_router() -> Router<AppState> {
    Router::new()
        .merge(leases::routes())
        .merge(tasks::routes())
        .merge(workers::routes())
        .merge(generator::routes())
        .merge(instances::routes())
        .merge(overview::routes())
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
    let body = serde_json::json!({ "error": "method not allowed on this route" });
    (axum::http::StatusCode::METHOD_NOT_ALLOWED, axum::Json(body)).into_response()
}

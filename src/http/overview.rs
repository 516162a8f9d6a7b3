//! `/api/overview`: counts, throughput and the split-brain check as JSON.

use crate::error::AppError;
use crate::error::ErrorBody;
use crate::overview::{Overview, store};
use crate::state::AppState;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};

/// The overview route.
pub fn routes() -> Router<AppState> {
    Router::new().route("/api/overview", get(overview))
}

#[utoipa::path(
    get,
    path = "/api/overview",
    tag = "overview",
    summary = "Counts, throughput and the split-brain check",
    responses(
        (status = 200, description = "The overview", body = Overview),
        (status = 500, description = "The database could not be read", body = ErrorBody),
    )
)]
async fn overview(State(s): State<AppState>) -> Result<Json<Overview>, AppError> {
    Ok(Json(crate::reads::read!(s, |c| store::read(
        c,
        s.viewpoint()
    )
    .await)?))
}

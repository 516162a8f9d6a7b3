//! `/api/instances`: the leasekeeper processes sharing this database, and
//! the operator's kill (any instance can kill any other, through it).

use super::extract::WorkerId as NameSegment;
use crate::error::AppError;
use crate::instance::{Instance, alive_window, store};
use crate::ops::{self, Operator};
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

/// The instance routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/instances", get(list))
        .route("/api/instances/{id}/kill", post(kill))
}

async fn list(State(s): State<AppState>) -> Result<Json<Vec<Instance>>, AppError> {
    let window = alive_window(s.settings.renew_interval);
    Ok(Json(
        store::list(&mut *s.pool.acquire().await?, window).await?,
    ))
}

/// `POST /api/instances/{id}/kill`: 202, then the instance exits like a crash.
async fn kill(
    State(s): State<AppState>,
    _: Operator,
    NameSegment(id): NameSegment,
) -> Result<(StatusCode, Json<Value>), AppError> {
    let message = ops::kill_instance(&s, &id).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "message": message }))))
}

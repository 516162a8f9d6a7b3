//! `/api/generator`: the generator's status, and start/stop from any
//! instance (operator actions: the admin token when one is set).

use crate::error::AppError;
use crate::generator::{self, Desired, GeneratorStatus};
use crate::ops::Operator;
use crate::state::AppState;
use axum::extract::State;
use axum::routing::{delete, get, post};
use axum::{Json, Router};

/// The generator routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/generator/status", get(status))
        .route("/api/generator/start", post(start))
        .route("/api/generator/stop", delete(stop))
}

/// The fleet-wide status, plus who answered and its local singleton state.
async fn status(State(s): State<AppState>) -> Result<Json<GeneratorStatus>, AppError> {
    let mut conn = s.pool.acquire().await?;
    Ok(Json(
        generator::report(&mut conn, &s.instance_id, s.generator.as_ref()).await?,
    ))
}

async fn set(s: &AppState, desired: Desired) -> Result<Json<GeneratorStatus>, AppError> {
    let mut conn = s.pool.acquire().await?;
    let status =
        generator::request(&mut conn, desired, &s.instance_id, s.generator.as_ref()).await?;
    Ok(Json(status))
}

async fn start(State(s): State<AppState>, _: Operator) -> Result<Json<GeneratorStatus>, AppError> {
    set(&s, Desired::Running).await
}

async fn stop(State(s): State<AppState>, _: Operator) -> Result<Json<GeneratorStatus>, AppError> {
    set(&s, Desired::Stopped).await
}

//! `/api/generator`: the generator's status, and start/stop from any instance.

use crate::error::AppError;
use crate::generator::{Desired, GeneratorStatus, store};
use crate::server::AppState;
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
async fn current(s: &AppState) -> Result<GeneratorStatus, AppError> {
    let mut status = store::status(&mut *s.pool.acquire().await?).await?;
    status.answered_by = Some(s.instance_id.to_string());
    status.local_state = s.generator.as_ref().map(|g| g.state().as_str().to_string());
    Ok(status)
}

async fn status(State(s): State<AppState>) -> Result<Json<GeneratorStatus>, AppError> {
    Ok(Json(current(&s).await?))
}

async fn set(s: &AppState, desired: Desired) -> Result<Json<GeneratorStatus>, AppError> {
    store::set_desired(&mut *s.pool.acquire().await?, desired, &s.instance_id).await?;
    if let Some(generator) = &s.generator {
        generator.nudge();
    }
    Ok(Json(current(s).await?))
}

async fn start(State(s): State<AppState>) -> Result<Json<GeneratorStatus>, AppError> {
    set(&s, Desired::Running).await
}

async fn stop(State(s): State<AppState>) -> Result<Json<GeneratorStatus>, AppError> {
    set(&s, Desired::Stopped).await
}

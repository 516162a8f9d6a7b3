//! `/api/generator`: the generator's status, and start/stop from any
//! instance (operator actions: the admin token when one is set).

use super::responses::Unauthorized;
use crate::auth::Operator;
use crate::error::AppError;
use crate::state::AppState;
use axum::extract::State;
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use leasekeeper_core::generator::runtime as generator;
use leasekeeper_core::generator::{Desired, GeneratorStatus};

/// The generator routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/generator/status", get(status))
        .route("/api/generator/start", post(start))
        .route("/api/generator/stop", delete(stop))
}

/// The fleet-wide status, plus who answered and its local singleton state.
#[utoipa::path(
    get,
    path = "/api/generator/status",
    tag = "generator",
    summary = "The generator's status",
    description = "The same from every instance except `answered_by` and `local_state`; the lease fields are null while nobody holds it.",
    responses((status = 200, description = "The status", body = GeneratorStatus))
)]
async fn status(State(s): State<AppState>) -> Result<Json<GeneratorStatus>, AppError> {
    Ok(Json(crate::reads::read!(s, |c| {
        generator::report(c, s.schema(), &s.instance_id, s.generator.as_ref()).await
    })?))
}

async fn set(s: &AppState, desired: Desired) -> Result<Json<GeneratorStatus>, AppError> {
    let mut conn = s.pool.acquire().await?;
    let status = generator::request(
        &mut conn,
        s.schema(),
        desired,
        &s.instance_id,
        s.generator.as_ref(),
    )
    .await?;
    Ok(Json(status))
}

#[utoipa::path(
    post,
    path = "/api/generator/start",
    tag = "generator",
    summary = "Start the generator (operator)",
    description = "Sets the desired state `running`, recorded in `lease_events` as an `operator` event; some instance takes the `singleton:generator` lease.",
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "The status", body = GeneratorStatus),
        Unauthorized,
    )
)]
async fn start(State(s): State<AppState>, _: Operator) -> Result<Json<GeneratorStatus>, AppError> {
    set(&s, Desired::Running).await
}

#[utoipa::path(
    delete,
    path = "/api/generator/stop",
    tag = "generator",
    summary = "Stop the generator (operator)",
    description = "Sets the desired state `stopped`; the holder releases within one renew interval.",
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "The status", body = GeneratorStatus),
        Unauthorized,
    )
)]
async fn stop(State(s): State<AppState>, _: Operator) -> Result<Json<GeneratorStatus>, AppError> {
    set(&s, Desired::Stopped).await
}

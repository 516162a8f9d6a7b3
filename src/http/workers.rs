//! `/api/workers`: who works, what each holds, and the operator's levers on
//! this instance's simulated workers (spawn, pause, kill). Worker processes
//! (`leasekeeper worker`) report themselves here too.

use super::extract::{JsonBody, WorkerId};
use crate::error::AppError;
use crate::lease::Holder;
use crate::ops::{self, Operator, WorkerAction};
use crate::state::AppState;
use crate::worker::transport::Report;
use crate::worker::{WorkerInfo, WorkerKind, registry};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;

/// The worker routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/workers", get(list).post(spawn))
        .route("/api/workers/{id}", get(get_one).put(report))
        .route("/api/workers/{id}/pause", post(pause))
        .route("/api/workers/{id}/kill", post(kill))
}

async fn list(State(s): State<AppState>) -> Result<Json<Vec<WorkerInfo>>, AppError> {
    Ok(Json(
        registry::list(&mut *s.pool.acquire().await?, s.settings.lease_ttl).await?,
    ))
}

async fn fetch(s: &AppState, id: &str) -> Result<WorkerInfo, AppError> {
    registry::get(&mut *s.pool.acquire().await?, id, s.settings.lease_ttl)
        .await?
        .ok_or_else(|| AppError::NotFound(format!("no worker with id {id}")))
}

async fn get_one(
    State(s): State<AppState>,
    WorkerId(id): WorkerId,
) -> Result<Json<WorkerInfo>, AppError> {
    Ok(Json(fetch(&s, id.as_str()).await?))
}

async fn spawn(
    State(s): State<AppState>,
    _: Operator,
) -> Result<(StatusCode, Json<WorkerInfo>), AppError> {
    Ok((StatusCode::CREATED, Json(ops::spawn_worker(&s).await?)))
}

/// The answer to pause and kill: what was done, and the worker's row as the
/// answer is sent (a pause takes effect at the worker's next step, within
/// milliseconds, so the row may still show its previous state).
#[derive(Serialize)]
pub struct Done {
    message: String,
    worker: WorkerInfo,
}

async fn pause(
    State(s): State<AppState>,
    _: Operator,
    WorkerId(id): WorkerId,
) -> Result<Json<Done>, AppError> {
    control(&s, &id, WorkerAction::Pause).await
}

async fn kill(
    State(s): State<AppState>,
    _: Operator,
    WorkerId(id): WorkerId,
) -> Result<Json<Done>, AppError> {
    control(&s, &id, WorkerAction::Kill).await
}

async fn control(s: &AppState, id: &Holder, action: WorkerAction) -> Result<Json<Done>, AppError> {
    let message = ops::control_worker(s, id, action).await?;
    Ok(Json(Done {
        message,
        worker: fetch(s, id.as_str()).await?,
    }))
}

/// `PUT /api/workers/{id}`: a worker process reports what it is doing.
async fn report(
    State(s): State<AppState>,
    WorkerId(id): WorkerId,
    JsonBody(body): JsonBody<Report>,
) -> Result<Json<WorkerInfo>, AppError> {
    if body.tasks_done < 0 || body.tasks_abandoned < 0 {
        return Err(AppError::BadRequest(
            "tasks_done and tasks_abandoned must not be negative".into(),
        ));
    }
    registry::record(
        &mut *s.pool.acquire().await?,
        &id,
        WorkerKind::Http,
        None,
        &body,
        s.settings.lease_ttl,
    )
    .await?
    .map(Json)
    .ok_or_else(|| {
        AppError::Conflict(format!(
            "worker {id} is a simulated worker, or was marked crashed or stopped; \
             a new run must send fresh: true first"
        ))
    })
}

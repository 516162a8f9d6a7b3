//! `/api/tasks`: the task queue's REST contract (SPEC §3).

use super::extract::{ApiQuery, Id, JsonBody};
use crate::error::AppError;
use crate::lease::Holder;
use crate::lease::store::Page;
use crate::queue::store::{self, RetryPolicy};
use crate::queue::{ClaimRequest, NewTask, Task, TaskStatus};
use crate::state::AppState;
use crate::worker::simulated;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;
use std::time::Duration;

/// The task routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/tasks", get(list_all).post(enqueue))
        .route("/api/tasks/pending", get(list_pending))
        .route("/api/tasks/started", get(list_started))
        .route("/api/tasks/processed", get(list_processed))
        .route("/api/tasks/failed", get(list_failed))
        .route("/api/tasks/next", post(claim_next))
        .route("/api/tasks/{id}", get(get_one))
        .route("/api/tasks/{id}/heartbeat", put(heartbeat))
        .route("/api/tasks/{id}/complete", put(complete))
        .route("/api/tasks/{id}/fail", put(fail))
}

/// `?status=...&after=ID&limit=N` on list routes.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    status: Option<String>,
    after: Option<i32>,
    limit: Option<i64>,
}

async fn list(
    s: &AppState,
    status: Option<TaskStatus>,
    q: ListQuery,
) -> Result<Json<Vec<Task>>, AppError> {
    let status = match (status, q.status.as_deref()) {
        (Some(s), _) => Some(s),
        (None, None | Some("all")) => None,
        (None, Some(name)) => Some(TaskStatus::parse(name).ok_or_else(|| {
            AppError::BadRequest(format!(
                "status must be one of all, pending, started, processed, failed; got {name:?}"
            ))
        })?),
    };
    let page = Page::new(q.after, q.limit);
    Ok(Json(
        store::list(&mut *s.pool.acquire().await?, status, page).await?,
    ))
}

async fn list_all(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Vec<Task>>, AppError> {
    list(&s, None, q).await
}

async fn list_pending(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Vec<Task>>, AppError> {
    list(&s, Some(TaskStatus::Pending), q).await
}

async fn list_started(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Vec<Task>>, AppError> {
    list(&s, Some(TaskStatus::Started), q).await
}

async fn list_processed(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Vec<Task>>, AppError> {
    list(&s, Some(TaskStatus::Processed), q).await
}

async fn list_failed(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Vec<Task>>, AppError> {
    list(&s, Some(TaskStatus::Failed), q).await
}

async fn get_one(State(s): State<AppState>, Id(id): Id) -> Result<Json<Task>, AppError> {
    store::get(&mut *s.pool.acquire().await?, id)
        .await?
        .map(Json)
        .ok_or_else(|| AppError::NotFound(format!("no task with id {id}")))
}

/// PostgreSQL cannot store the NUL character in `text` or `jsonb`; refuse
/// it here as bad input rather than fail in the database.
fn no_nul(value: &Value, field: &str) -> Result<(), AppError> {
    if value.to_string().contains("\\u0000") {
        return Err(AppError::BadRequest(format!(
            "{field} must not contain the NUL character"
        )));
    }
    Ok(())
}

/// Body of `POST /api/tasks`. `kind` defaults to the simulated work
/// (`sleep`), `queue` to `default`, `priority` to 0 (lower runs first).
#[derive(Deserialize)]
pub struct EnqueueBody {
    task_data: Value,
    max_attempts: Option<i32>,
    delay_seconds: Option<f64>,
    kind: Option<String>,
    queue: Option<String>,
    priority: Option<i16>,
}

async fn enqueue(
    State(s): State<AppState>,
    JsonBody(body): JsonBody<EnqueueBody>,
) -> Result<(StatusCode, Json<Task>), AppError> {
    if body.task_data.is_null() {
        return Err(AppError::BadRequest("task_data must not be null".into()));
    }
    no_nul(&body.task_data, "task_data")?;
    let delay = match body.delay_seconds {
        None => None,
        Some(secs) if secs.is_finite() && (0.0..=86_400.0).contains(&secs) => {
            Some(Duration::from_secs_f64(secs))
        }
        Some(_) => {
            return Err(AppError::BadRequest(
                "delay_seconds must be between 0 and 86400".into(),
            ));
        }
    };
    let max_attempts = body
        .max_attempts
        .unwrap_or(i32::try_from(s.settings.max_attempts).unwrap_or(5));
    let mut task = NewTask::new(
        body.kind.unwrap_or_else(|| simulated::KIND.to_string()),
        body.task_data,
    )
    .max_attempts(max_attempts)
    .priority(body.priority.unwrap_or(0));
    task.delay = delay;
    if let Some(queue) = body.queue {
        task = task.queue(queue);
    }
    let task = store::enqueue(&mut *s.pool.acquire().await?, &task).await?;
    Ok((StatusCode::CREATED, Json(task)))
}

async fn claim_next(
    State(s): State<AppState>,
    JsonBody(body): JsonBody<ClaimRequest>,
) -> Result<Response, AppError> {
    let filter = body.filter().map_err(AppError::BadRequest)?;
    let claimed = store::claim_next_in(
        &mut *s.pool.acquire().await?,
        &body.processor,
        s.settings.lease_ttl,
        &filter,
    )
    .await?;
    Ok(match claimed {
        Some(task) => (StatusCode::ACCEPTED, Json(task)).into_response(),
        None => (
            StatusCode::OK,
            Json(serde_json::json!({ "message": "no task available" })),
        )
            .into_response(),
    })
}

/// Body of `PUT /api/tasks/{id}/heartbeat`.
#[derive(Deserialize)]
pub struct HeartbeatBody {
    processor: Holder,
    fencing_token: i64,
}

async fn heartbeat(
    State(s): State<AppState>,
    Id(id): Id,
    JsonBody(body): JsonBody<HeartbeatBody>,
) -> Result<(StatusCode, Json<Task>), AppError> {
    let task = store::heartbeat(
        &mut *s.pool.acquire().await?,
        id,
        &body.processor,
        body.fencing_token,
        s.settings.lease_ttl,
    )
    .await?;
    Ok((StatusCode::ACCEPTED, Json(task)))
}

/// Body of `PUT /api/tasks/{id}/complete`.
#[derive(Deserialize)]
pub struct CompleteBody {
    processor: Holder,
    fencing_token: i64,
    task_output: Option<Value>,
}

async fn complete(
    State(s): State<AppState>,
    Id(id): Id,
    JsonBody(body): JsonBody<CompleteBody>,
) -> Result<(StatusCode, Json<Task>), AppError> {
    if let Some(output) = &body.task_output {
        no_nul(output, "task_output")?;
    }
    let task = store::complete(
        &mut *s.pool.acquire().await?,
        id,
        &body.processor,
        body.fencing_token,
        body.task_output.as_ref(),
    )
    .await?;
    // 202 Accepted, as heartbeat answers: the contract of the original
    // design's clients.
    Ok((StatusCode::ACCEPTED, Json(task)))
}

/// Body of `PUT /api/tasks/{id}/fail`.
#[derive(Deserialize)]
pub struct FailBody {
    processor: Holder,
    fencing_token: i64,
    error: String,
}

async fn fail(
    State(s): State<AppState>,
    Id(id): Id,
    JsonBody(body): JsonBody<FailBody>,
) -> Result<Json<Task>, AppError> {
    if body.error.chars().count() > store::MAX_ERROR_CHARS {
        return Err(AppError::BadRequest(format!(
            "error must be at most {} characters",
            store::MAX_ERROR_CHARS
        )));
    }
    if body.error.contains('\0') {
        return Err(AppError::BadRequest(
            "error must not contain the NUL character".into(),
        ));
    }
    let task = store::fail(
        &mut *s.pool.acquire().await?,
        id,
        &body.processor,
        body.fencing_token,
        &body.error,
        RetryPolicy::default(),
    )
    .await?;
    Ok(Json(task))
}

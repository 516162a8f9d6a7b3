//! `POST /api/tasks` and `POST /api/tasks/batch`: enqueueing, one task or
//! many in one transaction. The body is core's
//! [`EnqueueBody`](leasekeeper_core::queue::EnqueueBody), read into a
//! checked task by core, so a bad body is refused with core's words.

use crate::error::{AppError, ErrorBody};
use crate::http::extract::JsonBody;
use crate::http::responses::{NotJson, TooLarge};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use leasekeeper_core::queue::store::{self, Enqueued};
use leasekeeper_core::queue::{EnqueueBody, NewTask, Task};
use leasekeeper_core::worker::simulated;
use serde_json::Value;

/// The largest body of `POST /api/tasks/batch`: 10,000 tasks of about
/// 1.5 KiB each.
pub const MAX_BATCH_BODY_BYTES: usize = 16 * 1024 * 1024;

/// The task `body` asks for, with this server's defaults (the simulated
/// work's kind, the `max_attempts` setting); else what is wrong with it.
fn task_of(body: EnqueueBody, s: &AppState) -> Result<NewTask, String> {
    let default_attempts = i32::try_from(s.settings.max_attempts).unwrap_or(5);
    body.task(simulated::KIND, default_attempts)
        .map_err(|e| e.to_string())
}

#[utoipa::path(
    post,
    path = "/api/tasks",
    tag = "tasks",
    summary = "Enqueue a task",
    request_body = EnqueueBody,
    responses(
        (status = 201, description = "The new task, pending", body = Task),
        (status = 200, description = "A task of its kind already holds its `unique_key`: that task (nothing added)", body = Task),
        (status = 400, description = "Bad JSON, null `task_data`, a bad delay, kind, queue or unique key", body = ErrorBody),
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn enqueue(
    State(s): State<AppState>,
    JsonBody(body): JsonBody<EnqueueBody>,
) -> Result<(StatusCode, Json<Task>), AppError> {
    let task = task_of(body, &s).map_err(AppError::BadRequest)?;
    Ok(
        match store::enqueue_outcome(&mut *s.pool.acquire().await?, s.schema(), &task).await? {
            Enqueued::New(task) => (StatusCode::CREATED, Json(task)),
            Enqueued::Existing(task) => (StatusCode::OK, Json(task)),
        },
    )
}

#[utoipa::path(
    post,
    path = "/api/tasks/batch",
    tag = "tasks",
    summary = "Enqueue many tasks at once",
    description = "Each body as for `POST /api/tasks`, at most 10,000 (and 16 MiB), all in one transaction and one statement: one bad body answers 400 naming its index, and nothing is added. The answer lists one task per body, in order; a body whose `unique_key` a task of its kind already holds (or an earlier body of the batch) answers that task.",
    request_body(content = Vec<EnqueueBody>, description = "The tasks"),
    responses(
        (status = 201, description = "The tasks, in the order of the bodies", body = Vec<Task>),
        (status = 400, description = "Bad JSON, not an array, more than 10,000 bodies, or a bad body (its index named: `tasks[3]: …`)", body = ErrorBody),
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn enqueue_batch(
    State(s): State<AppState>,
    _json: crate::http::extract::JsonContentType,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Vec<Task>>), AppError> {
    let items: Vec<Value> = serde_json::from_slice(&body).map_err(|e| {
        AppError::BadRequest(format!("the body must be a JSON array of tasks: {e}"))
    })?;
    if items.len() > store::MAX_ENQUEUE_BATCH {
        return Err(AppError::BadRequest(format!(
            "at most {} tasks at once, got {}",
            store::MAX_ENQUEUE_BATCH,
            items.len()
        )));
    }
    let mut tasks = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let body: EnqueueBody = serde_json::from_value(item)
            .map_err(|e| AppError::BadRequest(format!("tasks[{i}]: {e}")))?;
        tasks
            .push(task_of(body, &s).map_err(|e| AppError::BadRequest(format!("tasks[{i}]: {e}")))?);
    }
    let mut conn = s.pool.acquire().await?;
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let enqueued = store::enqueue_many(&mut tx, s.schema(), &tasks).await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(enqueued.into_iter().map(Enqueued::into_task).collect()),
    ))
}

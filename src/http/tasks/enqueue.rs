//! `POST /api/tasks` and `POST /api/tasks/batch`: enqueueing, one task or
//! many in one transaction. The body is core's
//! [`EnqueueBody`](leasekeeper_core::queue::EnqueueBody), read into a
//! checked task by core, so a bad body is refused with core's words.

use crate::error::{AppError, ErrorBody};
use crate::http::extract::JsonBody;
use crate::http::responses::{NeedsCredential, NotJson, TooLarge};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use leasekeeper_core::queue::store::{self, Enqueued};
use leasekeeper_core::queue::{EnqueueBatch, EnqueueBody, NewTask, Task};
use leasekeeper_core::worker::simulated;

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

/// Enqueues `tasks` in one transaction under this server's cap on queues
/// (the `max_queues` setting): a batch naming new queues past it is refused
/// whole (409), and one naming only known queues pays nothing for the cap.
async fn enqueue_capped(s: &AppState, tasks: &[NewTask]) -> Result<Vec<Enqueued>, AppError> {
    let mut conn = s.pool.acquire().await?;
    let mut tx = capped(s, &mut conn).await?;
    let enqueued = store::enqueue_many(&mut tx, s.schema(), tasks).await?;
    tx.commit().await?;
    Ok(enqueued)
}

/// A transaction on `conn` under this server's cap on queues: the cap and
/// the `BEGIN` in one round trip (`SET LOCAL`: it ends with the
/// transaction, so the pooled connection never carries it on). Every
/// enqueue of the REST API runs in one.
pub(crate) async fn capped<'c>(
    s: &AppState,
    conn: &'c mut sqlx::PgConnection,
) -> Result<sqlx::Transaction<'c, sqlx::Postgres>, sqlx::Error> {
    sqlx::Connection::begin_with(
        conn,
        format!(
            "BEGIN; SET LOCAL {} = {}",
            leasekeeper_core::queue::queues::MAX_QUEUES_SETTING,
            s.settings.max_queues
        ),
    )
    .await
}

#[utoipa::path(
    post,
    path = "/api/tasks",
    tag = "tasks",
    summary = "Enqueue a task",
    request_body = EnqueueBody,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 201, description = "The new task, pending", body = Task),
        (status = 200, description = "A task of its kind already holds its `unique_key`: that task (nothing added)", body = Task),
        (status = 400, description = "Bad JSON, null `task_data`, a bad delay, kind, queue or unique key", body = ErrorBody),
        (status = 409, description = "The task names a queue not seen before and the queues are at their cap (`LEASEKEEPER_MAX_QUEUES`, default 1,000): nothing added", body = ErrorBody),
        NeedsCredential,
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn enqueue(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    JsonBody(body): JsonBody<EnqueueBody>,
) -> Result<(StatusCode, Json<Task>), AppError> {
    let task = task_of(body, &s).map_err(AppError::BadRequest)?;
    let mut outcome = enqueue_capped(&s, std::slice::from_ref(&task)).await?;
    Ok(match outcome.pop() {
        Some(Enqueued::New(task)) => (StatusCode::CREATED, Json(task)),
        Some(Enqueued::Existing(task)) => (StatusCode::OK, Json(task)),
        None => return Err(AppError::internal("an enqueue of one task answered none")),
    })
}

#[utoipa::path(
    post,
    path = "/api/tasks/batch",
    tag = "tasks",
    summary = "Enqueue many tasks at once",
    description = "Each body as for `POST /api/tasks`, at most 10,000 (and 16 MiB), all in one transaction and one statement: one bad body answers 400 naming its index, and nothing is added. The answer lists one task per body, in order; a body whose `unique_key` a task of its kind already holds (or an earlier body of the batch) answers that task.",
    request_body(content = Vec<EnqueueBody>, description = "The tasks"),
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 201, description = "The tasks, in the order of the bodies", body = Vec<Task>),
        (status = 400, description = "Bad JSON, not an array, more than 10,000 bodies, or a bad body (its index named: `tasks[3]: …`)", body = ErrorBody),
        (status = 409, description = "The bodies name queues not seen before, past the cap on queues (`LEASEKEEPER_MAX_QUEUES`, default 1,000): nothing added", body = ErrorBody),
        NeedsCredential,
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn enqueue_batch(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    _json: crate::http::extract::JsonContentType,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Vec<Task>>), AppError> {
    // Read element by element: an array past the cap is refused while it
    // is read, without becoming millions of values (see EnqueueBatch).
    let batch: EnqueueBatch = serde_json::from_slice(&body).map_err(|e| {
        AppError::BadRequest(format!("the body must be a JSON array of tasks: {e}"))
    })?;
    let bodies = batch.bodies().map_err(AppError::BadRequest)?;
    let mut tasks = Vec::with_capacity(bodies.len());
    for (i, body) in bodies.into_iter().enumerate() {
        tasks
            .push(task_of(body, &s).map_err(|e| AppError::BadRequest(format!("tasks[{i}]: {e}")))?);
    }
    let enqueued = enqueue_capped(&s, &tasks).await?;
    Ok((
        StatusCode::CREATED,
        Json(enqueued.into_iter().map(Enqueued::into_task).collect()),
    ))
}

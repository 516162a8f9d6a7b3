//! The worker's writes over REST: claim the next task, heartbeat,
//! complete, snooze, fail. Each body is core's wire type (the HTTP worker
//! transport sends the same), checked by core; every write but the claim
//! carries the claim's fencing token.

use crate::error::{AppError, ErrorBody};
use crate::http::Message;
use crate::http::extract::{Id, JsonBody};
use crate::http::params::TaskIdPath;
use crate::http::responses::{NeedsCredential, NotJson, StaleWrite, TaskNotFound, TooLarge};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use leasekeeper_core::queue::store::{self, RetryPolicy};
use leasekeeper_core::queue::{
    AttemptOutcome, ClaimRequest, CompleteBody, FailBody, HeartbeatBody, SignalBody, SnoozeBody,
    Task, WaitBody,
};

#[utoipa::path(
    post,
    path = "/api/tasks/next",
    tag = "tasks",
    summary = "Claim the next task",
    description = "Late tasks (started, lease expired) first, then pending ones by `priority` and `scheduled_at`, within one queue; nothing from a paused queue. The claim is a lease on `task:<id>`; its `fencing_token` must accompany every heartbeat, completion and failure.",
    request_body = ClaimRequest,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 202, description = "The claimed task, with its fencing token", body = Task),
        (status = 200, description = "Nothing claimable: `{\"message\": \"no task available\"}`", body = Message),
        (status = 400, description = "Bad JSON, a bad processor, queue or kinds", body = ErrorBody),
        NeedsCredential,
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn claim_next(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    JsonBody(body): JsonBody<ClaimRequest>,
) -> Result<Response, AppError> {
    let filter = body.filter().map_err(AppError::BadRequest)?;
    let claimed = store::claim_next_in(
        &mut *s.pool.acquire().await?,
        s.schema(),
        &body.processor,
        s.settings.lease_ttl,
        &filter,
    )
    .await?;
    Ok(match claimed {
        Some(task) => (StatusCode::ACCEPTED, Json(task)).into_response(),
        None => (
            StatusCode::OK,
            Json(Message {
                message: "no task available".into(),
            }),
        )
            .into_response(),
    })
}

#[utoipa::path(
    put,
    path = "/api/tasks/{id}/heartbeat",
    tag = "tasks",
    summary = "Extend a claim",
    params(TaskIdPath),
    request_body = HeartbeatBody,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 202, description = "Extended: the task with its new `must_heartbeat_before`", body = Task),
        (status = 400, description = "Bad JSON, a bad id or processor", body = ErrorBody),
        TaskNotFound,
        StaleWrite,
        NeedsCredential,
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn heartbeat(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    Id(id): Id,
    JsonBody(body): JsonBody<HeartbeatBody>,
) -> Result<(StatusCode, Json<Task>), AppError> {
    let task = store::heartbeat(
        &mut *s.pool.acquire().await?,
        s.schema(),
        id,
        &body.processor,
        body.fencing_token,
        s.settings.lease_ttl,
    )
    .await?;
    Ok((StatusCode::ACCEPTED, Json(task)))
}

#[utoipa::path(
    put,
    path = "/api/tasks/{id}/complete",
    tag = "tasks",
    summary = "Complete a claimed task",
    params(TaskIdPath),
    request_body = CompleteBody,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 202, description = "Processed: the task", body = Task),
        (status = 400, description = "Bad JSON, a bad id or processor", body = ErrorBody),
        TaskNotFound,
        StaleWrite,
        NeedsCredential,
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn complete(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    Id(id): Id,
    JsonBody(body): JsonBody<CompleteBody>,
) -> Result<(StatusCode, Json<Task>), AppError> {
    if let Some(output) = &body.task_output {
        leasekeeper_core::json::storable(output, "task_output").map_err(AppError::BadRequest)?;
    }
    let task = store::complete(
        &mut *s.pool.acquire().await?,
        s.schema(),
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

#[utoipa::path(
    put,
    path = "/api/tasks/{id}/snooze",
    tag = "tasks",
    summary = "Snooze a claimed task",
    description = "Back to pending, due in `seconds`, without using up an attempt; the claim's lease is released and the task's history records `snoozed`. Only from the claim's holder with its token, as complete and fail.",
    params(TaskIdPath),
    request_body = SnoozeBody,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 200, description = "The task, pending again", body = Task),
        (status = 400, description = "Bad JSON, a bad id, processor or delay", body = ErrorBody),
        TaskNotFound,
        StaleWrite,
        NeedsCredential,
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn snooze(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    Id(id): Id,
    JsonBody(body): JsonBody<SnoozeBody>,
) -> Result<Json<Task>, AppError> {
    let delay = body
        .delay()
        .map_err(|e| AppError::BadRequest(e.to_string()))?;
    let task = store::snooze(
        &mut *s.pool.acquire().await?,
        s.schema(),
        id,
        &body.processor,
        body.fencing_token,
        delay,
    )
    .await?;
    Ok(Json(task))
}

#[utoipa::path(
    put,
    path = "/api/tasks/{id}/wait",
    tag = "tasks",
    summary = "End an attempt waiting for a signal",
    description = "A durable wait: the task becomes `waiting` (never claimed) until `POST /api/tasks/{id}/signal` names `signal` (then pending at once, the payload in its claim's `signals`) or `timeout_seconds` pass (then pending without it, within the rescuer's interval, 5 s by default). No attempt is used and the claim is released; the history records `waiting`. Only from the claim's holder with its token, as complete and fail.",
    params(TaskIdPath),
    request_body = WaitBody,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 200, description = "The task, waiting", body = Task),
        (status = 400, description = "Bad JSON, a bad id, processor, signal or timeout", body = ErrorBody),
        TaskNotFound,
        StaleWrite,
        NeedsCredential,
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn wait(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    Id(id): Id,
    JsonBody(body): JsonBody<WaitBody>,
) -> Result<Json<Task>, AppError> {
    let timeout = body.timeout().map_err(AppError::BadRequest)?;
    let task = store::wait_for(
        &mut *s.pool.acquire().await?,
        s.schema(),
        id,
        &body.processor,
        body.fencing_token,
        &body.signal,
        timeout,
    )
    .await?;
    Ok(Json(task))
}

#[utoipa::path(
    post,
    path = "/api/tasks/{id}/signal",
    tag = "tasks",
    summary = "Signal a waiting task",
    description = "A task waiting for the signal `name` becomes pending at once, with `payload` under `name` in its `signals` (its next claim and its handler's `Job` carry them), and idle workers are woken; the history records `signalled`. A task not waiting for `name` (waiting for another signal or for its workflow's parents, started, finished, or its wait already timed out) answers 409 and nothing changes.",
    params(TaskIdPath),
    request_body = SignalBody,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 200, description = "The task, pending again", body = Task),
        (status = 400, description = "Bad JSON, a bad id or signal name", body = ErrorBody),
        TaskNotFound,
        (status = 409, description = "The task is not waiting for this signal: what it is doing instead", body = ErrorBody),
        NeedsCredential,
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn signal(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    Id(id): Id,
    JsonBody(body): JsonBody<SignalBody>,
) -> Result<Json<Task>, AppError> {
    let task = store::signal(
        &mut *s.pool.acquire().await?,
        s.schema(),
        id,
        &body.name,
        &body.payload,
    )
    .await?;
    Ok(Json(task))
}

#[utoipa::path(
    put,
    path = "/api/tasks/{id}/fail",
    tag = "tasks",
    summary = "Fail an attempt",
    description = "Back to pending after an exponential backoff (1 s, 2 s, 4 s ... up to 60 s), or failed after `max_attempts`.",
    params(TaskIdPath),
    request_body = FailBody,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 200, description = "The task, pending again or failed", body = Task),
        (status = 400, description = "Bad JSON, a bad id, processor or error", body = ErrorBody),
        TaskNotFound,
        StaleWrite,
        NeedsCredential,
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn fail(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    Id(id): Id,
    JsonBody(body): JsonBody<FailBody>,
) -> Result<Json<Task>, AppError> {
    body.check()
        .map_err(|e| AppError::BadRequest(e.to_string()))?;
    let task = store::fail_as(
        &mut *s.pool.acquire().await?,
        s.schema(),
        id,
        &body.processor,
        body.fencing_token,
        &body.error,
        RetryPolicy::default(),
        body.outcome.unwrap_or(AttemptOutcome::Failed),
    )
    .await?;
    Ok(Json(task))
}

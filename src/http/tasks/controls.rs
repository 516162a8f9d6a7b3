//! The operator's controls on tasks: cancel, retry or release (the claim
//! of) one task, cancel or retry every
//! task matching the list's filters (in batches, each audited in its own
//! transaction; see [`leasekeeper_core::queue::control`]).

use crate::error::{AppError, ErrorBody};
use crate::http::extract::{Id, JsonBody};
use crate::http::params::TaskIdPath;
use crate::http::responses::{BadId, NotJson, TaskNotFound, TooLarge, Unauthorized};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use leasekeeper_core::queue::control::{self, TaskFilter};
use leasekeeper_core::queue::{Task, TaskName, TaskStatus};
use serde::Deserialize;
use serde_json::Value;

/// `POST /api/tasks/{id}/cancel`: a pending, waiting or started task becomes
/// cancelled (a started one's claim ends with it). 409 when it is in
/// another status.
#[utoipa::path(
    post,
    path = "/api/tasks/{id}/cancel",
    tag = "tasks",
    summary = "Cancel a task (operator)",
    description = "A pending task is never claimed; a started one's claim ends with it (its processor's later writes are refused). Audited in the same transaction.",
    params(TaskIdPath),
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "The task, now cancelled", body = Task),
        BadId,
        Unauthorized,
        TaskNotFound,
        (status = 409, description = "The task is processed, failed or already cancelled", body = ErrorBody),
    )
)]
pub(super) async fn cancel_one(
    State(s): State<AppState>,
    _: crate::auth::Operator,
    Id(id): Id,
) -> Result<Json<Task>, AppError> {
    Ok(Json(
        control::cancel(
            &mut *s.pool.acquire().await?,
            s.schema(),
            id,
            &s.instance_id,
        )
        .await?,
    ))
}

/// `POST /api/tasks/{id}/retry`: a failed or cancelled task goes back to
/// pending with its attempts reset. 409 when it is in another status.
#[utoipa::path(
    post,
    path = "/api/tasks/{id}/retry",
    tag = "tasks",
    summary = "Retry a task (operator)",
    description = "A failed or cancelled task goes back to pending, runnable now, `attempts` 0. Audited in the same transaction.",
    params(TaskIdPath),
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "The task, pending again", body = Task),
        BadId,
        Unauthorized,
        TaskNotFound,
        (status = 409, description = "The task is neither failed nor cancelled", body = ErrorBody),
    )
)]
pub(super) async fn retry_one(
    State(s): State<AppState>,
    _: crate::auth::Operator,
    Id(id): Id,
) -> Result<Json<Task>, AppError> {
    Ok(Json(
        control::retry(
            &mut *s.pool.acquire().await?,
            s.schema(),
            id,
            &s.instance_id,
        )
        .await?,
    ))
}

/// The body of a release: the claim the operator means to end.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The token of the claim to end (a claim that took the task over
    /// since has another, and is left alone).
    #[serde(deserialize_with = "leasekeeper_core::json::int")]
    fencing_token: i64,
}

/// `POST /api/tasks/{id}/release {"fencing_token": N}`: an operator ends
/// claim N of a started task now; the task is taken over at once with the
/// next token. 409 when the task is not started or its claim has another
/// token now.
#[utoipa::path(
    post,
    path = "/api/tasks/{id}/release",
    tag = "tasks",
    summary = "Release a task's claim (operator)",
    description = "Ends that claim now, whoever holds it: the task stays started but late, so the next claim takes it over with the next token (idle workers are woken), and the old processor's heartbeat, completion or failure is refused (a runtime's handler hears it as a cancel). The claim's end (`released`) and the action (`operator`) go to the task's history in the same transaction. For a worker stuck but alive; cancel takes the task out of the queue instead.",
    params(TaskIdPath),
    request_body = ReleaseBody,
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "The task, its claim ended", body = Task),
        BadId,
        Unauthorized,
        TaskNotFound,
        (status = 409, description = "The task is not started, or its claim has another token now", body = ErrorBody),
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn release_one(
    State(s): State<AppState>,
    _: crate::auth::Operator,
    Id(id): Id,
    JsonBody(body): JsonBody<ReleaseBody>,
) -> Result<Json<Task>, AppError> {
    Ok(Json(
        control::release(
            &mut *s.pool.acquire().await?,
            s.schema(),
            id,
            body.fencing_token,
            &s.instance_id,
        )
        .await?,
    ))
}

/// The statuses `POST /api/tasks/cancel` applies to.
#[derive(Clone, Copy, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CancelStatus {
    /// Not yet claimed.
    Pending,
    /// Claimed: the claim ends too.
    Started,
    /// Waiting for its workflow's parents or for a signal.
    Waiting,
}

impl From<CancelStatus> for TaskStatus {
    fn from(status: CancelStatus) -> TaskStatus {
        match status {
            CancelStatus::Pending => TaskStatus::Pending,
            CancelStatus::Started => TaskStatus::Started,
            CancelStatus::Waiting => TaskStatus::Waiting,
        }
    }
}

/// The statuses `POST /api/tasks/retry` applies to.
#[derive(Clone, Copy, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RetryStatus {
    /// Out of attempts.
    Failed,
    /// Cancelled by an operator.
    Cancelled,
}

impl From<RetryStatus> for TaskStatus {
    fn from(status: RetryStatus) -> TaskStatus {
        match status {
            RetryStatus::Failed => TaskStatus::Failed,
            RetryStatus::Cancelled => TaskStatus::Cancelled,
        }
    }
}

/// Body of the bulk `POST /api/tasks/cancel` and `POST /api/tasks/retry`:
/// the tasks list's filters, with `S` the statuses the action applies to
/// (so a status it does not apply to is refused while the body is read,
/// naming the ones it takes). `status` is required, so a bulk action never
/// means "everything" by omission.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FilterBody<S> {
    /// Tasks in this status.
    status: S,
    /// Only tasks of this kind.
    #[schema(value_type = Option<TaskName>)]
    kind: Option<String>,
    /// Only tasks in this queue.
    #[schema(value_type = Option<TaskName>)]
    queue: Option<String>,
    /// Only tasks whose data contains this object (as the list's `data`):
    /// what `jsonb` stores, so no NUL character in a key or a string and
    /// numbers within ±1e300 (refused with 400 naming `data` otherwise).
    #[schema(schema_with = data_filter)]
    data: Option<serde_json::Map<String, Value>>,
    /// Only tasks whose error reads as this group: an `error_group` of
    /// `GET /api/tasks/failed/summary` (at most 200 characters, no NUL).
    #[schema(max_length = 200, pattern = "^[^\\x00]*$")]
    error_group: Option<String>,
}

/// The schema of [`FilterBody`]'s `data`: an object whose keys hold no NUL
/// and whose values are the stored-JSON component, so the ±1e300 limit and
/// the NUL rule are in the document as they are for task data; `null`
/// (no filter) as before.
fn data_filter() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, SchemaType, Type};
    use utoipa::openapi::{Ref, RefOr};
    // `null` is no filter, as leaving it out is.
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .description(Some(
            "Only tasks whose data contains this object: keys without NUL, values as stored task data (no NUL, numbers within ±1e300)",
        ))
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[^\\x00]*$")),
        ))
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::Ref(
            Ref::from_schema_name(leasekeeper_core::json::STORABLE_JSON),
        ))))
        .into()
}

impl<S: Into<TaskStatus>> FilterBody<S> {
    fn filter(self) -> TaskFilter {
        TaskFilter {
            status: self.status.into(),
            kind: self.kind,
            queue: self.queue,
            data: self.data,
            error_group: self.error_group,
        }
    }
}

/// How many tasks a bulk action changed.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Count {
    /// Tasks changed.
    count: u64,
}

#[utoipa::path(
    post,
    path = "/api/tasks/cancel",
    tag = "tasks",
    summary = "Cancel every matching task (operator)",
    description = "Cancels every task matching the filter, in batches of 500, each its own transaction with one audit row per task.",
    request_body = FilterBody<CancelStatus>,
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "How many tasks changed", body = Count),
        (status = 400, description = "Bad JSON, or a status the action does not apply to", body = ErrorBody),
        Unauthorized,
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn cancel_matching(
    State(s): State<AppState>,
    _: crate::auth::Operator,
    JsonBody(body): JsonBody<FilterBody<CancelStatus>>,
) -> Result<Json<Count>, AppError> {
    let count =
        control::cancel_matching(&s.pool, s.schema(), &body.filter(), &s.instance_id).await?;
    Ok(Json(Count { count }))
}

#[utoipa::path(
    post,
    path = "/api/tasks/retry",
    tag = "tasks",
    summary = "Retry every matching task (operator)",
    description = "Retries every task matching the filter, in batches of 500, each its own transaction with one audit row per task.",
    request_body = FilterBody<RetryStatus>,
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "How many tasks changed", body = Count),
        (status = 400, description = "Bad JSON, or a status the action does not apply to", body = ErrorBody),
        (status = 409, description = "A task was enqueued meanwhile with the unique key of a task of a batch: that batch is left unchanged (the batches before it stay retried); tasks whose key another task already holds are skipped, not refused", body = ErrorBody),
        Unauthorized,
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn retry_matching(
    State(s): State<AppState>,
    _: crate::auth::Operator,
    JsonBody(body): JsonBody<FilterBody<RetryStatus>>,
) -> Result<Json<Count>, AppError> {
    let count =
        control::retry_matching(&s.pool, s.schema(), &body.filter(), &s.instance_id).await?;
    Ok(Json(Count { count }))
}

//! `/api/tasks`: the task queue's REST contract (the README's "REST API").

use super::Message;
use super::extract::{ApiQuery, Id, JsonBody};
use super::paging::{CursorQuery, Direction, answer_to};
use super::params::TaskIdPath;
use super::responses::{
    BadId, BadTaskQuery, StaleWrite, TaskNotFound, TaskPage, TooLarge, Unauthorized,
};
use crate::error::{AppError, ErrorBody};
use crate::state::AppState;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use leasekeeper_core::lease::LeaseEvent;
use leasekeeper_core::queue::control::{self, TaskFilter};
use leasekeeper_core::queue::store::{self, Enqueued, RetryPolicy};
use leasekeeper_core::queue::{
    Attempt, AttemptOutcome, ClaimRequest, CompleteBody, FailBody, HeartbeatBody, NewTask,
    SnoozeBody, Task, TaskSearch, TaskStatus, Unique, UniqueScope,
};
use leasekeeper_core::worker::simulated;
use serde::Deserialize;
use serde_json::Value;
use std::time::Duration;

/// The task routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/tasks", get(list_all).post(enqueue))
        .route(
            "/api/tasks/batch",
            post(enqueue_batch).layer(axum::extract::DefaultBodyLimit::max(MAX_BATCH_BODY_BYTES)),
        )
        .route("/api/tasks/pending", get(list_pending))
        .route("/api/tasks/started", get(list_started))
        .route("/api/tasks/processed", get(list_processed))
        .route("/api/tasks/failed", get(list_failed))
        .route("/api/tasks/next", post(claim_next))
        .route("/api/tasks/{id}", get(get_one))
        .route("/api/tasks/{id}/heartbeat", put(heartbeat))
        .route("/api/tasks/{id}/complete", put(complete))
        .route("/api/tasks/{id}/fail", put(fail))
        .route("/api/tasks/{id}/snooze", put(snooze))
        .route("/api/tasks/{id}/events", get(events))
        .route("/api/tasks/{id}/attempts", get(attempts))
        .route("/api/tasks/{id}/cancel", post(cancel_one))
        .route("/api/tasks/{id}/retry", post(retry_one))
        .route("/api/tasks/cancel", post(cancel_matching))
        .route("/api/tasks/retry", post(retry_matching))
}

/// `?status=...&kind=...&queue=...&data=...&before=ID&limit=N` on list
/// routes: the tasks matching every filter given, newest first, the next
/// page named by a `Link` header (which keeps the filters). `after=ID` instead pages oldest first
/// (ids above it), for a client that follows new tasks as they come.
#[derive(Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// `all` (the default; empty is the same), `pending`, `started`,
    /// `processed`, `failed` or `cancelled`; ignored by the routes that name
    /// a status in their path.
    #[param(pattern = "^(|all|pending|started|processed|failed|cancelled)$")]
    status: Option<String>,
    /// Only tasks of this kind (empty: any).
    #[param(max_length = 128, pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$")]
    kind: Option<String>,
    /// Only tasks in this queue (empty: any).
    #[param(max_length = 128, pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$")]
    queue: Option<String>,
    /// Only tasks whose data contains this JSON object (PostgreSQL's `@>`),
    /// URL-encoded: `?data={"customer":7}` finds the tasks whose data has
    /// `"customer": 7` among its fields. At most 8192 characters; `{}`
    /// filters nothing. Found through an index, so a filter that matches
    /// few tasks stays fast among millions.
    #[param(value_type = Option<Object>)]
    data: Option<String>,
    /// Newest first, tasks with an id below this (the cursor of the
    /// `Link: rel="next"` header).
    before: Option<i64>,
    /// Oldest first instead, tasks with an id above this, for a client that
    /// follows new tasks (no `Link` header); with `before` too, only tasks
    /// between the two.
    after: Option<i64>,
    /// At most this many (default 100, 1 to 1000).
    limit: Option<i64>,
}

async fn list(
    s: &AppState,
    status: Option<TaskStatus>,
    uri: Uri,
    q: ListQuery,
) -> Result<Response, AppError> {
    // A bad `status` is refused even where the path names the status and
    // the parameter is ignored: the document allows only these words.
    let mut search = TaskSearch::parse(
        q.status.as_deref(),
        q.kind.as_deref(),
        q.queue.as_deref(),
        q.data.as_deref(),
    )
    .map_err(AppError::BadRequest)?;
    search.status = status.or(search.status);
    let direction = Direction::of(q.before, q.after, q.limit);
    let mut conn = s.pool.acquire().await?;
    Ok(match direction {
        Direction::Oldest(page, before) => {
            let rows = store::list(&mut conn, s.schema(), search, page).await?;
            Json(super::paging::below(rows, before, |r| r.id)).into_response()
        }
        Direction::Newest(cursor) => answer_to(
            &uri,
            cursor,
            store::list_page(&mut conn, s.schema(), search, cursor).await?,
        ),
    })
}

super::paging::list_routes! {
    tag = "tasks", responses(TaskPage, BadTaskQuery);
    list_all: "/api/tasks", "Tasks, optionally by status", None;
    list_pending: "/api/tasks/pending", "Pending tasks", Some(TaskStatus::Pending);
    list_started: "/api/tasks/started", "Started tasks", Some(TaskStatus::Started);
    list_processed: "/api/tasks/processed", "Processed tasks", Some(TaskStatus::Processed);
    list_failed: "/api/tasks/failed", "Failed tasks", Some(TaskStatus::Failed);
}

#[utoipa::path(
    get,
    path = "/api/tasks/{id}",
    tag = "tasks",
    summary = "One task",
    params(TaskIdPath),
    responses(
        (status = 200, description = "The task", body = Task),
        BadId,
        TaskNotFound,
    )
)]
async fn get_one(State(s): State<AppState>, Id(id): Id) -> Result<Json<Task>, AppError> {
    store::get(&mut *s.pool.acquire().await?, s.schema(), id)
        .await?
        .map(Json)
        .ok_or_else(|| AppError::NotFound(format!("no task with id {id}")))
}

/// A JSON value PostgreSQL can store and give back ([`leasekeeper_core::json::storable`]),
/// refused here as bad input rather than failing in the database or on the
/// way back.
fn storable(value: &Value, field: &str) -> Result<(), AppError> {
    leasekeeper_core::json::storable(value, field).map_err(AppError::BadRequest)
}

/// Any JSON value but `null` that PostgreSQL's `jsonb` stores and gives
/// back, for the document: [`super::openapi::STORABLE_JSON`] without null
/// at the top.
pub fn any_but_null() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
    super::openapi::storable_json(false)
}

/// Body of `POST /api/tasks`. `kind` defaults to the simulated work
/// (`sleep`), `queue` to `default`, `priority` to 0 (lower runs first).
#[derive(Deserialize, utoipa::ToSchema)]
pub struct EnqueueBody {
    /// What to do (any JSON but null), e.g. `{"sleep_duration_seconds": 5}`
    /// for the simulated work.
    #[schema(schema_with = any_but_null)]
    task_data: Value,
    /// Claims allowed before the task is marked failed (the server's
    /// `max_attempts` setting when absent).
    #[schema(minimum = 1, maximum = 1000)]
    #[serde(default, deserialize_with = "leasekeeper_core::json::opt_int")]
    max_attempts: Option<i32>,
    /// Not claimed before this many seconds from now (0 to 86400).
    #[schema(minimum = 0, maximum = 86400)]
    delay_seconds: Option<f64>,
    /// Which handler runs it, 1 to 128 characters (`sleep` when absent).
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    kind: Option<String>,
    /// The queue it waits in, 1 to 128 characters (`default` when absent).
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    queue: Option<String>,
    /// Lower runs first (0 when absent).
    #[serde(default, deserialize_with = "leasekeeper_core::json::opt_int")]
    #[schema(minimum = -32768, maximum = 32767)]
    priority: Option<i16>,
    /// A key that keeps the task unique among tasks of its kind (1 to 256
    /// characters): while a task of the kind holds it (see `unique_scope`),
    /// the enqueue adds nothing and answers that task with 200.
    #[schema(min_length = 1, max_length = 256, pattern = "^[^\\x00]*$")]
    unique_key: Option<String>,
    /// Among which tasks the key is unique: `active` (pending or started;
    /// the default) or `always` (every task still on record). Ignored
    /// without `unique_key`.
    #[schema(pattern = "^(active|always)$")]
    unique_scope: Option<String>,
    /// Each attempt may run at most this many seconds (0.001 to 86400):
    /// then the handler is cancelled and the attempt fails ("timed out
    /// after …"). Without it, the runtime's default for the kind, if any.
    #[schema(minimum = 0.001, maximum = 86400)]
    timeout_seconds: Option<f64>,
    /// When given, the key is unique only among the tasks enqueued in the
    /// same period of this many seconds (1 to 31,622,400; fixed periods
    /// counted from the Unix epoch). Ignored without `unique_key`.
    #[schema(minimum = 1, maximum = 31622400)]
    unique_period_seconds: Option<f64>,
}

impl EnqueueBody {
    /// The task this body asks for; what is wrong with it otherwise.
    fn task(self, default_max_attempts: u32) -> Result<NewTask, String> {
        if self.task_data.is_null() {
            return Err("task_data must not be null".into());
        }
        leasekeeper_core::json::storable(&self.task_data, "task_data")?;
        let delay = match self.delay_seconds {
            None => None,
            Some(secs) if secs.is_finite() && (0.0..=86_400.0).contains(&secs) => {
                Some(Duration::from_secs_f64(secs))
            }
            Some(_) => return Err("delay_seconds must be between 0 and 86400".into()),
        };
        let max_attempts = self
            .max_attempts
            .unwrap_or(i32::try_from(default_max_attempts).unwrap_or(5));
        let mut task = NewTask::new(
            self.kind.unwrap_or_else(|| simulated::KIND.to_string()),
            self.task_data,
        )
        .max_attempts(max_attempts)
        .priority(self.priority.unwrap_or(0));
        task.delay = delay;
        if let Some(queue) = self.queue {
            task = task.queue(queue);
        }
        let scope = match self.unique_scope.as_deref() {
            None => UniqueScope::Active,
            Some(name) => UniqueScope::parse(name)
                .ok_or_else(|| format!("unique_scope must be active or always; got {name:?}"))?,
        };
        let period = match self.unique_period_seconds {
            None => None,
            Some(secs) if secs.is_finite() && (1.0..=31_622_400.0).contains(&secs) => {
                Some(Duration::from_secs_f64(secs))
            }
            Some(_) => {
                return Err("unique_period_seconds must be between 1 and 31622400".into());
            }
        };
        task.unique = self.unique_key.map(|key| Unique { key, scope, period });
        task.timeout = match self.timeout_seconds {
            None => None,
            Some(secs) if secs.is_finite() && (0.001..=86_400.0).contains(&secs) => {
                Some(Duration::from_secs_f64(secs).max(Duration::from_millis(1)))
            }
            Some(_) => return Err("timeout_seconds must be between 0.001 and 86400".into()),
        };
        store::check_new(&task)?;
        Ok(task)
    }
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
    )
)]
async fn enqueue(
    State(s): State<AppState>,
    JsonBody(body): JsonBody<EnqueueBody>,
) -> Result<(StatusCode, Json<Task>), AppError> {
    let task = body
        .task(s.settings.max_attempts)
        .map_err(AppError::BadRequest)?;
    Ok(
        match store::enqueue_outcome(&mut *s.pool.acquire().await?, s.schema(), &task).await? {
            Enqueued::New(task) => (StatusCode::CREATED, Json(task)),
            Enqueued::Existing(task) => (StatusCode::OK, Json(task)),
        },
    )
}

/// The largest body of `POST /api/tasks/batch`: 10,000 tasks of about
/// 1.5 KiB each.
pub const MAX_BATCH_BODY_BYTES: usize = 16 * 1024 * 1024;

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
    )
)]
async fn enqueue_batch(
    State(s): State<AppState>,
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
        tasks.push(
            body.task(s.settings.max_attempts)
                .map_err(|e| AppError::BadRequest(format!("tasks[{i}]: {e}")))?,
        );
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

#[utoipa::path(
    post,
    path = "/api/tasks/next",
    tag = "tasks",
    summary = "Claim the next task",
    description = "Late tasks (started, lease expired) first, then pending ones by `priority` and `scheduled_at`, within one queue; nothing from a paused queue. The claim is a lease on `task:<id>`; its `fencing_token` must accompany every heartbeat, completion and failure.",
    request_body = ClaimRequest,
    responses(
        (status = 202, description = "The claimed task, with its fencing token", body = Task),
        (status = 200, description = "Nothing claimable: `{\"message\": \"no task available\"}`", body = Message),
        (status = 400, description = "Bad JSON, a bad processor, queue or kinds", body = ErrorBody),
        TooLarge,
    )
)]
async fn claim_next(
    State(s): State<AppState>,
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
    responses(
        (status = 202, description = "Extended: the task with its new `must_heartbeat_before`", body = Task),
        (status = 400, description = "Bad JSON, a bad id or processor", body = ErrorBody),
        TaskNotFound,
        StaleWrite,
        TooLarge,
    )
)]
async fn heartbeat(
    State(s): State<AppState>,
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
    responses(
        (status = 202, description = "Processed: the task", body = Task),
        (status = 400, description = "Bad JSON, a bad id or processor", body = ErrorBody),
        TaskNotFound,
        StaleWrite,
        TooLarge,
    )
)]
async fn complete(
    State(s): State<AppState>,
    Id(id): Id,
    JsonBody(body): JsonBody<CompleteBody>,
) -> Result<(StatusCode, Json<Task>), AppError> {
    if let Some(output) = &body.task_output {
        storable(output, "task_output")?;
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
    responses(
        (status = 200, description = "The task, pending again", body = Task),
        (status = 400, description = "Bad JSON, a bad id, processor or delay", body = ErrorBody),
        TaskNotFound,
        StaleWrite,
        TooLarge,
    )
)]
async fn snooze(
    State(s): State<AppState>,
    Id(id): Id,
    JsonBody(body): JsonBody<SnoozeBody>,
) -> Result<Json<Task>, AppError> {
    let most = store::MAX_SNOOZE.as_secs_f64();
    if !(body.seconds.is_finite() && (0.0..=most).contains(&body.seconds)) {
        return Err(AppError::BadRequest(format!(
            "seconds must be between 0 and {most}"
        )));
    }
    let task = store::snooze(
        &mut *s.pool.acquire().await?,
        s.schema(),
        id,
        &body.processor,
        body.fencing_token,
        Duration::from_secs_f64(body.seconds),
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
    responses(
        (status = 200, description = "The task, pending again or failed", body = Task),
        (status = 400, description = "Bad JSON, a bad id, processor or error", body = ErrorBody),
        TaskNotFound,
        StaleWrite,
        TooLarge,
    )
)]
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

/// `POST /api/tasks/{id}/cancel`: a pending or started task becomes
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
async fn cancel_one(
    State(s): State<AppState>,
    _: crate::ops::Operator,
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
async fn retry_one(
    State(s): State<AppState>,
    _: crate::ops::Operator,
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

/// The statuses `POST /api/tasks/cancel` applies to.
#[derive(Clone, Copy, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CancelStatus {
    /// Not yet claimed.
    Pending,
    /// Claimed: the claim ends too.
    Started,
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

/// Body of the bulk `POST /api/tasks/cancel`: the tasks list's filters.
/// `status` is required, so a bulk action never means "everything" by
/// omission.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Tasks in this status.
    status: CancelStatus,
    /// Only tasks of this kind.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    kind: Option<String>,
    /// Only tasks in this queue.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    queue: Option<String>,
    /// Only tasks whose data contains this object (as the list's `data`).
    #[schema(value_type = Option<Object>)]
    data: Option<serde_json::Map<String, Value>>,
}

/// Body of the bulk `POST /api/tasks/retry`, as [`CancelBody`].
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryBody {
    /// Tasks in this status.
    status: RetryStatus,
    /// Only tasks of this kind.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    kind: Option<String>,
    /// Only tasks in this queue.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    queue: Option<String>,
    /// Only tasks whose data contains this object (as the list's `data`).
    #[schema(value_type = Option<Object>)]
    data: Option<serde_json::Map<String, Value>>,
}

impl CancelBody {
    fn filter(self) -> TaskFilter {
        TaskFilter {
            status: match self.status {
                CancelStatus::Pending => TaskStatus::Pending,
                CancelStatus::Started => TaskStatus::Started,
            },
            kind: self.kind,
            queue: self.queue,
            data: self.data,
        }
    }
}

impl RetryBody {
    fn filter(self) -> TaskFilter {
        TaskFilter {
            status: match self.status {
                RetryStatus::Failed => TaskStatus::Failed,
                RetryStatus::Cancelled => TaskStatus::Cancelled,
            },
            kind: self.kind,
            queue: self.queue,
            data: self.data,
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
    request_body = CancelBody,
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "How many tasks changed", body = Count),
        (status = 400, description = "Bad JSON, or a status the action does not apply to", body = ErrorBody),
        Unauthorized,
        TooLarge,
    )
)]
async fn cancel_matching(
    State(s): State<AppState>,
    _: crate::ops::Operator,
    JsonBody(body): JsonBody<CancelBody>,
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
    request_body = RetryBody,
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "How many tasks changed", body = Count),
        (status = 400, description = "Bad JSON, or a status the action does not apply to", body = ErrorBody),
        Unauthorized,
        TooLarge,
    )
)]
async fn retry_matching(
    State(s): State<AppState>,
    _: crate::ops::Operator,
    JsonBody(body): JsonBody<RetryBody>,
) -> Result<Json<Count>, AppError> {
    let count =
        control::retry_matching(&s.pool, s.schema(), &body.filter(), &s.instance_id).await?;
    Ok(Json(Count { count }))
}

/// `GET /api/tasks/{id}/attempts`: every attempt of the task on record,
/// oldest first.
#[utoipa::path(
    get,
    path = "/api/tasks/{id}/attempts",
    tag = "tasks",
    summary = "A task's attempts",
    description = "Every attempt of the task on record, oldest first: its number, the processor that held the claim, the claim's fencing token, when it was claimed and ended, its outcome (`running`, `completed`, `failed`, `taken_over`, `cancelled`, `timed_out`, `snoozed`, `given_back`) and the error it ended with. Empty for a task never claimed; pruned with the task.",
    params(TaskIdPath),
    responses(
        (status = 200, description = "The attempts, oldest first", body = [Attempt]),
        BadId,
        TaskNotFound,
    )
)]
async fn attempts(State(s): State<AppState>, Id(id): Id) -> Result<Json<Vec<Attempt>>, AppError> {
    Ok(Json(
        store::attempts(&mut *s.pool.acquire().await?, s.schema(), id).await?,
    ))
}

/// `GET /api/tasks/{id}/events`: the task lease's history (claims,
/// heartbeats' renewals, takeovers, refused writes, operator actions),
/// newest first, paged.
#[utoipa::path(
    get,
    path = "/api/tasks/{id}/events",
    tag = "tasks",
    summary = "A task lease's history",
    params(TaskIdPath, CursorQuery),
    responses(
        (status = 200, description = "A page of the events of lease `task:<id>`, newest first", body = [LeaseEvent],
            headers(("Link" = String, description = "The next (older) page, when older rows remain"))),
        (status = 400, description = "A bad id or query", body = ErrorBody),
        TaskNotFound,
    )
)]
async fn events(
    State(s): State<AppState>,
    Id(id): Id,
    ApiQuery(q): ApiQuery<CursorQuery>,
) -> Result<Response, AppError> {
    let mut conn = s.pool.acquire().await?;
    if store::get(&mut conn, s.schema(), id).await?.is_none() {
        return Err(AppError::NotFound(format!("no task with id {id}")));
    }
    let cursor = q.cursor();
    let page = leasekeeper_core::lease::store::events(
        &mut conn,
        s.schema(),
        &Task::resource_name(id),
        cursor,
    )
    .await?;
    Ok(super::paging::answer(
        &format!("/api/tasks/{id}/events"),
        cursor,
        page,
    ))
}

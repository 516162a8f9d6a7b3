//! `/api/workflows`: a workflow enqueued in one call, read with its tasks'
//! states and edges, listed, and cancelled by an operator (see
//! [`leasekeeper_core::workflow`] for what holds).

use super::extract::{ApiQuery, Id, JsonBody};
use super::paging::{CursorQuery, answer};
use super::responses::{BadId, BadQuery, NeedsCredential, NotJson, TooLarge, Unauthorized};
use crate::error::{AppError, ErrorBody};
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use leasekeeper_core::queue::store::TaskError;
use leasekeeper_core::worker::simulated;
use leasekeeper_core::workflow::store as flows;
use leasekeeper_core::workflow::{Workflow, WorkflowBody, WorkflowSummary};

/// The largest body of `POST /api/workflows`: 1,000 tasks of about 8 KiB.
pub const MAX_WORKFLOW_BODY_BYTES: usize = 8 * 1024 * 1024;

/// The workflow routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/api/workflows",
            get(list)
                .post(enqueue)
                .layer(axum::extract::DefaultBodyLimit::max(
                    MAX_WORKFLOW_BODY_BYTES,
                )),
        )
        .route("/api/workflows/{id}", get(get_one))
        .route("/api/workflows/{id}/cancel", post(cancel))
}

/// `{id}` of a workflow route.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct WorkflowIdPath {
    /// The workflow's id (a positive integer)
    #[param(minimum = 1)]
    pub id: i64,
}

/// `404` of a route that names a workflow.
#[derive(utoipa::IntoResponses)]
#[response(status = 404, description = "No workflow with that id")]
pub struct WorkflowNotFound(pub ErrorBody);

fn not_found(id: i64) -> AppError {
    AppError::NotFound(format!("no workflow with id {id}"))
}

#[utoipa::path(
    post,
    path = "/api/workflows",
    tag = "workflows",
    summary = "Enqueue a workflow",
    description = "Every task and edge in one transaction: a task with `depends_on` is `waiting` (never claimed) until each parent ended; the last parent's completion makes it pending and its claim carries `parent_outputs` (parent ref → output). A parent that fails for good or is cancelled cancels its dependents (their `last_error` names it), transitively, but those with `on_parent_failure: \"run\"`, which run once every parent ended. Unknown, repeated or cyclic refs, an empty list, more than 1,000 tasks or a bad task answer 400 and add nothing.",
    request_body = WorkflowBody,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 201, description = "The workflow, with its tasks (by id) and their states", body = Workflow),
        (status = 400, description = "Bad JSON, a bad task (named: `tasks[2].…`), refs unknown, repeated or in a cycle, no tasks or too many", body = ErrorBody),
        (status = 409, description = "A task names a queue not seen before, past the cap on queues: nothing added", body = ErrorBody),
        NeedsCredential,
        TooLarge,
        NotJson,
    )
)]
pub(super) async fn enqueue(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    JsonBody(body): JsonBody<WorkflowBody>,
) -> Result<(StatusCode, Json<Workflow>), AppError> {
    let default_attempts = i32::try_from(s.settings.max_attempts).unwrap_or(5);
    let flow = body
        .workflow(simulated::KIND, default_attempts)
        .map_err(AppError::BadRequest)?;
    let mut conn = s.pool.acquire().await?;
    let mut tx = super::tasks::enqueue::capped(&s, &mut conn).await?;
    let stored = flows::enqueue_workflow(&mut tx, s.schema(), &flow).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(stored)))
}

#[utoipa::path(
    get,
    path = "/api/workflows",
    tag = "workflows",
    summary = "Workflows, newest first",
    description = "Each with its status (derived from its tasks: `running` while one is pending, waiting or started, then `completed`, `failed` or `cancelled`) and how many of its tasks are processed. Paged by id.",
    params(CursorQuery),
    responses(
        (status = 200, description = "A page of workflows, newest first", body = [WorkflowSummary],
            headers(("Link" = String, description = "The next (older) page, when older rows remain"))),
        BadQuery,
    )
)]
pub(super) async fn list(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<CursorQuery>,
) -> Result<axum::response::Response, AppError> {
    let cursor = q.cursor();
    let page = crate::reads::read!(s, |c| flows::list(c, s.schema(), cursor).await)?;
    Ok(answer("/api/workflows", cursor, page))
}

#[utoipa::path(
    get,
    path = "/api/workflows/{id}",
    tag = "workflows",
    summary = "One workflow with its tasks",
    params(WorkflowIdPath),
    responses(
        (status = 200, description = "The workflow: its tasks by id, each with its ref, status and parents' refs", body = Workflow),
        BadId,
        WorkflowNotFound,
    )
)]
pub(super) async fn get_one(
    State(s): State<AppState>,
    Id(id): Id,
) -> Result<Json<Workflow>, AppError> {
    crate::reads::read!(s, |c| flows::get(c, s.schema(), id).await)?
        .map(Json)
        .ok_or_else(|| not_found(id))
}

#[utoipa::path(
    post,
    path = "/api/workflows/{id}/cancel",
    tag = "workflows",
    summary = "Cancel a workflow (operator)",
    description = "Every unfinished task (pending, waiting or started) is cancelled in one transaction, each with its audit row; a started one's claim ends and its handler hears it. Finished tasks stay as they are.",
    params(WorkflowIdPath),
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "The workflow as it is now", body = Workflow),
        BadId,
        Unauthorized,
        WorkflowNotFound,
    )
)]
pub(super) async fn cancel(
    State(s): State<AppState>,
    _: crate::auth::Operator,
    Id(id): Id,
) -> Result<Json<Workflow>, AppError> {
    match flows::cancel(
        &mut *s.pool.acquire().await?,
        s.schema(),
        id,
        &s.instance_id,
    )
    .await
    {
        Ok(flow) => Ok(Json(flow)),
        Err(TaskError::NotFound(_)) => Err(not_found(id)),
        Err(e) => Err(e.into()),
    }
}

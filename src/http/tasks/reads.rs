//! The task lists (by status, kind, queue and data, newest or oldest
//! first), one task, its attempts and its lease's history.

use crate::error::{AppError, ErrorBody};
use crate::http::extract::{ApiQuery, Id};
use crate::http::paging::{CursorQuery, Direction, answer_to};
use crate::http::params::TaskIdPath;
use crate::http::responses::{BadId, BadTaskQuery, TaskNotFound, TaskPage};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use leasekeeper_core::lease::LeaseEvent;
use leasekeeper_core::queue::store;
use leasekeeper_core::queue::{Attempt, Task, TaskName, TaskSearch, TaskStatus};
use serde::Deserialize;

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
    #[param(schema_with = TaskName::filter_schema, required = false)]
    kind: Option<String>,
    /// Only tasks in this queue (empty: any).
    #[param(schema_with = TaskName::filter_schema, required = false)]
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

pub(super) async fn list(
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
    Ok(match direction {
        Direction::Oldest(page, before) => {
            let rows = crate::reads::read!(s, |c| store::list(c, s.schema(), search, page).await)?;
            Json(crate::http::paging::below(rows, before, |r| r.id)).into_response()
        }
        Direction::Newest(cursor) => answer_to(
            &uri,
            cursor,
            crate::reads::read!(s, |c| store::list_page(c, s.schema(), search, cursor).await)?,
        ),
    })
}

crate::http::paging::list_routes! {
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
pub(super) async fn get_one(State(s): State<AppState>, Id(id): Id) -> Result<Json<Task>, AppError> {
    crate::reads::read!(s, |c| store::get(c, s.schema(), id).await)?
        .map(Json)
        .ok_or_else(|| AppError::NotFound(format!("no task with id {id}")))
}

/// `GET /api/tasks/{id}/attempts`: every attempt of the task on record,
/// oldest first.
#[utoipa::path(
    get,
    path = "/api/tasks/{id}/attempts",
    tag = "tasks",
    summary = "A task's attempts",
    description = "Every attempt of the task on record, oldest first: its number, the processor that held the claim, the claim's fencing token, when it was claimed and ended, its outcome (`running`, `completed`, `failed`, `taken_over`, `cancelled`, `timed_out`, `snoozed`, `given_back` (claimed ahead and given back unstarted, no attempt used), `interrupted` (its worker stopped mid-task; the attempt is spent), `waited` (its handler waited for a signal; the attempt is not counted)) and the error it ended with. Empty for a task never claimed; pruned with the task.",
    params(TaskIdPath),
    responses(
        (status = 200, description = "The attempts, oldest first", body = [Attempt]),
        BadId,
        TaskNotFound,
    )
)]
pub(super) async fn attempts(
    State(s): State<AppState>,
    Id(id): Id,
) -> Result<Json<Vec<Attempt>>, AppError> {
    Ok(Json(crate::reads::read!(s, |c| store::attempts(
        c,
        s.schema(),
        id
    )
    .await)?))
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
pub(super) async fn events(
    State(s): State<AppState>,
    Id(id): Id,
    ApiQuery(q): ApiQuery<CursorQuery>,
) -> Result<Response, AppError> {
    let cursor = q.cursor();
    let page = crate::reads::read!(s, |c| -> Result<_, AppError> {
        if store::get(c, s.schema(), id).await?.is_none() {
            return Err(AppError::NotFound(format!("no task with id {id}")));
        }
        Ok(
            leasekeeper_core::lease::store::events(c, s.schema(), &Task::resource_name(id), cursor)
                .await?,
        )
    })?;
    Ok(crate::http::paging::answer(
        &format!("/api/tasks/{id}/events"),
        cursor,
        page,
    ))
}

/// `GET /api/tasks/failed/summary`: the dead letters, grouped.
#[utoipa::path(
    get,
    path = "/api/tasks/failed/summary",
    tag = "tasks",
    summary = "Failed tasks, grouped",
    description = "The failed tasks grouped by kind, queue and error (its `error_group`: numbers read `<n>`, UUIDs `<uuid>`, hex `<hex>`, the first 200 characters), the largest groups first (at most 200): each with its count, its oldest and newest failure and one error as written. `POST /api/tasks/retry` with `status: failed` and a group's `kind`, `queue` and `error_group` retries that group. Failed tasks are kept by their own retention (`LEASEKEEPER_FAILED_RETENTION_SECS`, 30 days by default).",
    responses(
        (status = 200, description = "The groups, largest first", body = [leasekeeper_core::queue::failed::FailedGroup]),
    )
)]
pub(super) async fn failed_summary(
    State(s): State<AppState>,
) -> Result<Json<Vec<leasekeeper_core::queue::failed::FailedGroup>>, AppError> {
    Ok(Json(crate::reads::read!(s, |c| {
        leasekeeper_core::queue::failed::summary(c, s.schema()).await
    })?))
}

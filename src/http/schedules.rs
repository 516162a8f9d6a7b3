//! `/api/schedules`: cron-declared periodic tasks (see
//! [`leasekeeper_core::schedule`]): declare, read, pause, resume, trigger,
//! delete, and each schedule's fired ticks. Every change is an operator
//! action (the admin token when one is set), recorded in `lease_events` on
//! resource `schedule:<name>`.

use super::extract::{ApiQuery, JsonBody};
use super::paging::{CursorQuery, answer_to};
use super::responses::{NotJson, TooLarge, Unauthorized};
use crate::auth::Operator;
use crate::error::{AppError, ErrorBody};
use crate::state::AppState;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use leasekeeper_core::queue::{Task, TaskName};
use leasekeeper_core::schedule::store;
use leasekeeper_core::schedule::{CatchUp, NewSchedule, Schedule, Tick};
use serde::Deserialize;
use serde_json::Value;

/// The schedule routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/schedules", get(list))
        .route(
            "/api/schedules/{name}",
            get(get_one).put(declare).delete(delete_one),
        )
        .route("/api/schedules/{name}/ticks", get(ticks))
        .route("/api/schedules/{name}/pause", post(pause))
        .route("/api/schedules/{name}/resume", post(resume))
        .route("/api/schedules/{name}/trigger", post(trigger))
}

/// `{name}` of a schedule route.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct NamePath {
    /// The schedule's name: letters, digits, `.`, `_`, `-` and `:`,
    /// starting with a letter or digit, 1 to 128 characters.
    #[param(schema_with = name_schema)]
    pub name: String,
}

/// A schedule name's schema, from core's rule
/// ([`leasekeeper_core::schedule::NAME_PATTERN`]).
fn name_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .pattern(Some(leasekeeper_core::schedule::NAME_PATTERN))
        .into()
}

/// A schedule name from the path, checked.
pub struct Name(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Name {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| AppError::BadRequest(format!("invalid path: {}", e.body_text())))?;
        leasekeeper_core::schedule::check_name(&raw).map_err(AppError::BadRequest)?;
        Ok(Name(raw))
    }
}

fn not_found(name: &str) -> AppError {
    AppError::NotFound(format!("no schedule named {name:?}"))
}

/// Body of `PUT /api/schedules/{name}`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleBody {
    /// A cron expression: 5 fields (`0 2 * * *`), or 6 with seconds first
    /// (`*/5 * * * * *`), or a nickname (`@daily`).
    #[schema(min_length = 1, max_length = 256)]
    cron: String,
    /// The kind of the task each tick enqueues (`sleep`, the simulated
    /// work, when absent).
    #[schema(value_type = Option<TaskName>)]
    kind: Option<String>,
    /// Its queue (`default` when absent).
    #[schema(value_type = Option<TaskName>)]
    queue: Option<String>,
    /// Its data (`{}` when absent; the simulated work sleeps 1 s then).
    #[schema(schema_with = leasekeeper_core::json::any_but_null)]
    data: Option<Value>,
    /// Its priority (0 when absent; lower runs first).
    #[serde(default, deserialize_with = "leasekeeper_core::json::opt_int")]
    #[schema(minimum = -32768, maximum = 32767)]
    priority: Option<i16>,
    /// Its attempts (5 when absent).
    #[serde(default, deserialize_with = "leasekeeper_core::json::opt_int")]
    #[schema(minimum = 1, maximum = 1000)]
    max_attempts: Option<i32>,
    /// Ticks missed while no replica led: `all` (up to 100), `latest` (the
    /// default) or `none`.
    #[schema(value_type = Option<CatchUp>)]
    catch_up: Option<String>,
    /// An IANA time zone the expression is read in (`UTC` when absent).
    #[schema(min_length = 1, max_length = 64)]
    time_zone: Option<String>,
}

#[utoipa::path(
    get,
    path = "/api/schedules",
    tag = "schedules",
    summary = "Every schedule",
    description = "By name, each with its next and last tick and the scheduler's leader.",
    responses((status = 200, description = "The schedules", body = Vec<Schedule>))
)]
async fn list(State(s): State<AppState>) -> Result<Json<Vec<Schedule>>, AppError> {
    Ok(Json(crate::reads::read!(s, |c| store::list(
        c,
        s.schema()
    )
    .await)?))
}

#[utoipa::path(
    get,
    path = "/api/schedules/{name}",
    tag = "schedules",
    summary = "One schedule",
    description = "With `leader`: who fires the ticks now (`holder`, `fencing_token`), null while nobody holds `singleton:scheduler`.",
    params(NamePath),
    responses(
        (status = 200, description = "The schedule", body = Schedule),
        (status = 400, description = "A bad name", body = ErrorBody),
        (status = 404, description = "No such schedule", body = ErrorBody),
    )
)]
async fn get_one(State(s): State<AppState>, Name(name): Name) -> Result<Json<Schedule>, AppError> {
    crate::reads::read!(s, |c| store::get(c, s.schema(), &name).await)?
        .map(Json)
        .ok_or_else(|| not_found(&name))
}

#[utoipa::path(
    put,
    path = "/api/schedules/{name}",
    tag = "schedules",
    summary = "Declare a schedule (operator)",
    description = "Adds it (201) or replaces its definition (200; its paused state and ticks stay; a changed cron or time zone does not catch up the old expression's ticks). A cron, time zone or catch-up policy that does not parse answers 400 naming the field, and nothing is stored.",
    params(NamePath),
    request_body = ScheduleBody,
    security((), ("admin_token" = [])),
    responses(
        (status = 201, description = "Added", body = Schedule),
        (status = 200, description = "Replaced (or unchanged)", body = Schedule),
        (status = 400, description = "Bad JSON, a bad name, cron, time zone, policy, kind, queue or data", body = ErrorBody),
        Unauthorized,
        TooLarge,
        NotJson,
    )
)]
async fn declare(
    State(s): State<AppState>,
    _: Operator,
    Name(name): Name,
    JsonBody(body): JsonBody<ScheduleBody>,
) -> Result<(StatusCode, Json<Schedule>), AppError> {
    let mut new = NewSchedule::new(
        name,
        body.cron,
        body.kind
            .unwrap_or_else(|| leasekeeper_core::worker::simulated::KIND.to_string()),
    );
    if let Some(queue) = body.queue {
        new = new.queue(queue);
    }
    if let Some(data) = body.data {
        new = new.data(data);
    }
    if let Some(priority) = body.priority {
        new = new.priority(priority);
    }
    if let Some(max_attempts) = body.max_attempts {
        new = new.max_attempts(max_attempts);
    }
    if let Some(catch_up) = body.catch_up {
        new = new.catch_up(CatchUp::parse(&catch_up).ok_or_else(|| {
            AppError::BadRequest(format!(
                "catch_up: must be all, latest or none; got {catch_up:?}"
            ))
        })?);
    }
    if let Some(tz) = body.time_zone {
        new = new.time_zone(tz);
    }
    let (schedule, created) = store::upsert(
        &mut *s.pool.acquire().await?,
        s.schema(),
        &new,
        &s.instance_id,
    )
    .await?;
    nudge(&s);
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(schedule)))
}

/// The local scheduler re-reads the schedules now.
fn nudge(s: &AppState) {
    if let Some(scheduler) = &s.scheduler {
        scheduler.nudge();
    }
}

#[utoipa::path(
    get,
    path = "/api/schedules/{name}/ticks",
    tag = "schedules",
    summary = "A schedule's fired ticks",
    description = "Newest first, paged like every list (`before` is a tick's `id`): when each tick was due, the task it enqueued, the holder and fencing token that fired it, and when.",
    params(NamePath, CursorQuery),
    responses(
        (status = 200, description = "The ticks", body = Vec<Tick>),
        (status = 400, description = "A bad name or query", body = ErrorBody),
        (status = 404, description = "No such schedule", body = ErrorBody),
    )
)]
async fn ticks(
    State(s): State<AppState>,
    Name(name): Name,
    uri: Uri,
    ApiQuery(q): ApiQuery<CursorQuery>,
) -> Result<Response, AppError> {
    let cursor = q.cursor();
    let page = crate::reads::read!(s, |c| store::ticks(c, s.schema(), &name, cursor).await)?
        .ok_or_else(|| not_found(&name))?;
    Ok(answer_to(&uri, cursor, page))
}

async fn set_paused(s: &AppState, name: &str, paused: bool) -> Result<Json<Schedule>, AppError> {
    let schedule = store::set_paused(
        &mut *s.pool.acquire().await?,
        s.schema(),
        name,
        paused,
        &s.instance_id,
    )
    .await?;
    nudge(s);
    Ok(Json(schedule))
}

#[utoipa::path(
    post,
    path = "/api/schedules/{name}/pause",
    tag = "schedules",
    summary = "Pause a schedule (operator)",
    description = "It fires no tick until resumed; the paused time is never caught up.",
    params(NamePath),
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "The schedule, `paused` true", body = Schedule),
        (status = 400, description = "A bad name", body = ErrorBody),
        (status = 404, description = "No such schedule", body = ErrorBody),
        Unauthorized,
    )
)]
async fn pause(
    State(s): State<AppState>,
    _: Operator,
    Name(name): Name,
) -> Result<Json<Schedule>, AppError> {
    set_paused(&s, &name, true).await
}

#[utoipa::path(
    post,
    path = "/api/schedules/{name}/resume",
    tag = "schedules",
    summary = "Resume a schedule (operator)",
    description = "Its ticks after now fire; those of the paused time do not.",
    params(NamePath),
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "The schedule, `paused` false", body = Schedule),
        (status = 400, description = "A bad name", body = ErrorBody),
        (status = 404, description = "No such schedule", body = ErrorBody),
        Unauthorized,
    )
)]
async fn resume(
    State(s): State<AppState>,
    _: Operator,
    Name(name): Name,
) -> Result<Json<Schedule>, AppError> {
    set_paused(&s, &name, false).await
}

#[utoipa::path(
    post,
    path = "/api/schedules/{name}/trigger",
    tag = "schedules",
    summary = "Enqueue a schedule's task now (operator)",
    description = "One extra task (its `schedule` set, `tick_at` null), not a tick: the ticks go on as before.",
    params(NamePath),
    security((), ("admin_token" = [])),
    responses(
        (status = 201, description = "The task", body = Task),
        (status = 400, description = "A bad name", body = ErrorBody),
        (status = 404, description = "No such schedule", body = ErrorBody),
        Unauthorized,
    )
)]
async fn trigger(
    State(s): State<AppState>,
    _: Operator,
    Name(name): Name,
) -> Result<(StatusCode, Json<Task>), AppError> {
    let task = store::trigger(
        &mut *s.pool.acquire().await?,
        s.schema(),
        &name,
        &s.instance_id,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(task)))
}

#[utoipa::path(
    delete,
    path = "/api/schedules/{name}",
    tag = "schedules",
    summary = "Delete a schedule (operator)",
    description = "With its ticks; the tasks it enqueued stay. A schedule declared in a runtime's code comes back when that runtime starts again.",
    params(NamePath),
    security((), ("admin_token" = [])),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "A bad name", body = ErrorBody),
        (status = 404, description = "No such schedule", body = ErrorBody),
        Unauthorized,
    )
)]
async fn delete_one(
    State(s): State<AppState>,
    _: Operator,
    Name(name): Name,
) -> Result<StatusCode, AppError> {
    store::delete(
        &mut *s.pool.acquire().await?,
        s.schema(),
        &name,
        &s.instance_id,
    )
    .await?;
    nudge(&s);
    Ok(StatusCode::NO_CONTENT)
}

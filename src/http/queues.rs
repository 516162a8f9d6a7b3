//! `/api/queues`: every queue with its figures, one queue, the operator's
//! pause and resume (see [`leasekeeper_core::queue::queues`]) and its
//! limits ([`leasekeeper_core::queue::queue_limits`]). Pause, resume and
//! limits are operator actions (the admin token when one is set), recorded
//! in `lease_events` on resource `queue:<name>`.

use super::extract::JsonBody;
use super::responses::Unauthorized;
use super::responses::{NotJson, TooLarge};
use crate::auth::Operator;
use crate::error::{AppError, ErrorBody};
use crate::state::AppState;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use leasekeeper_core::queue::queue_limits::QueueLimits;
use leasekeeper_core::queue::queues::{self, QueueInfo};

/// The queue routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/queues", get(list))
        .route("/api/queues/{name}", get(get_one))
        .route("/api/queues/{name}/pause", post(pause))
        .route("/api/queues/{name}/resume", post(resume))
        .route("/api/queues/{name}/limits", put(set_limits))
}

/// `{name}` of a queue route.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct QueuePath {
    /// The queue's name: 1 to 128 characters, no control characters
    /// (percent-encoded in the path).
    #[param(schema_with = leasekeeper_core::queue::TaskName::inline_schema)]
    pub name: String,
}

/// A queue name from the path, checked.
pub struct Name(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Name {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| AppError::BadRequest(format!("invalid path: {}", e.body_text())))?;
        queues::check(&raw)?;
        Ok(Name(raw))
    }
}

/// `?after=NAME&limit=N` on `GET /api/queues`: queues are paged by name.
#[derive(serde::Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct QueuesQuery {
    /// Queues named after this one (by the database's order of names): the
    /// cursor of the `Link: rel="next"` header.
    #[param(schema_with = leasekeeper_core::queue::TaskName::inline_schema)]
    pub after: Option<String>,
    /// At most this many (default 100, 1 to 1000).
    pub limit: Option<i64>,
}

#[utoipa::path(
    get,
    path = "/api/queues",
    tag = "queues",
    summary = "The queues, a page at a time",
    description = "By name: whether it is paused, its pending, started and failed tasks, how long its oldest due task has waited, its completions in the last minute and the workers running its tasks. A queue exists from its first task (or an operator's pause), and retention prunes it once no task is left (unless paused). Paged by name: when more remain, a `Link: <...?after=NAME&limit=N>; rel=\"next\"` header names the next page.",
    params(QueuesQuery),
    responses(
        (status = 200, description = "A page of the queues, by name", body = Vec<QueueInfo>,
            headers(("Link" = String, description = "The next page, when more queues remain"))),
        (status = 400, description = "A bad query (`after` not a queue name, an unknown parameter)", body = ErrorBody),
    )
)]
async fn list(
    State(s): State<AppState>,
    crate::http::extract::ApiQuery(q): crate::http::extract::ApiQuery<QueuesQuery>,
) -> Result<axum::response::Response, AppError> {
    use axum::response::IntoResponse;
    let page = crate::reads::read!(s, |c| queues::list_page(
        c,
        s.schema(),
        q.after.as_deref(),
        q.limit
    )
    .await)?;
    let limit = page.items.len();
    let mut resp = Json(page.items).into_response();
    if let Some(after) = page.next {
        let link = format!(
            "</api/queues?after={}&limit={limit}>; rel=\"next\"",
            crate::http::paging::query_value(&after)
        );
        if let Ok(link) = axum::http::HeaderValue::from_str(&link) {
            resp.headers_mut().insert(axum::http::header::LINK, link);
        }
    }
    Ok(resp)
}

#[utoipa::path(
    get,
    path = "/api/queues/{name}",
    tag = "queues",
    summary = "One queue",
    description = "Its flag and figures, as in the list.",
    params(QueuePath),
    responses(
        (status = 200, description = "The queue", body = QueueInfo),
        (status = 400, description = "Not a queue name", body = ErrorBody),
        (status = 404, description = "No task ever used that queue, and nobody paused it", body = ErrorBody),
    )
)]
async fn get_one(State(s): State<AppState>, Name(name): Name) -> Result<Json<QueueInfo>, AppError> {
    crate::reads::read!(s, |c| queues::get(c, s.schema(), &name).await)?
        .map(Json)
        .ok_or_else(|| AppError::NotFound(format!("no queue named {name:?}")))
}

#[utoipa::path(
    post,
    path = "/api/queues/{name}/pause",
    tag = "queues",
    summary = "Pause a queue (operator)",
    description = "Effective at the next claim, in the database: no worker of any instance claims a task of the queue (pending, or late) until it is resumed; tasks already started finish normally. A name no task has used yet is created paused. Pausing a paused queue changes nothing. Audited in the same transaction.",
    params(QueuePath),
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "The queue, `paused` true", body = QueueInfo),
        (status = 400, description = "Not a queue name", body = ErrorBody),
        Unauthorized,
    )
)]
async fn pause(
    State(s): State<AppState>,
    _: Operator,
    Name(name): Name,
) -> Result<Json<QueueInfo>, AppError> {
    Ok(Json(
        queues::pause(
            &mut *s.pool.acquire().await?,
            s.schema(),
            &name,
            &s.instance_id,
        )
        .await?,
    ))
}

#[utoipa::path(
    post,
    path = "/api/queues/{name}/resume",
    tag = "queues",
    summary = "Resume a queue (operator)",
    description = "Its tasks are claimed again; idle workers of every instance are woken at once. Resuming a running queue changes nothing. Audited in the same transaction.",
    params(QueuePath),
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "The queue, `paused` false", body = QueueInfo),
        (status = 400, description = "Not a queue name", body = ErrorBody),
        (status = 404, description = "No such queue", body = ErrorBody),
        Unauthorized,
    )
)]
async fn resume(
    State(s): State<AppState>,
    _: Operator,
    Name(name): Name,
) -> Result<Json<QueueInfo>, AppError> {
    Ok(Json(
        queues::resume(
            &mut *s.pool.acquire().await?,
            s.schema(),
            &name,
            &s.instance_id,
        )
        .await?,
    ))
}

#[utoipa::path(
    put,
    path = "/api/queues/{name}/limits",
    tag = "queues",
    summary = "Set a queue's limits (operator)",
    description = "Replaces the queue's limits with the body's (a field null or absent clears it): `max_started` (at most this many of its tasks started at once, prefetched claims included; 1 to 100,000), `max_started_per_key` (per `concurrency_key`; 1 to 100,000), `rate_per_second` (claims a second across the fleet, a token bucket in the database; 0.000001 to 1,000,000) and `rate_burst` (1 to 1,000,000; one second's worth when absent; ignored without a rate). Exact across every instance: the claim enforces them in the database. A limited queue serves its keys fairly (fewest started first). Effective at the next claim; tasks started before a limit was lowered finish normally. A bad value answers 400 naming the field, and nothing changes. A name no task has used yet is created with the limits. Audited in the same transaction when anything changed.",
    params(QueuePath),
    request_body = QueueLimits,
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "The queue, with its limits", body = QueueInfo),
        (status = 400, description = "Not a queue name, bad JSON, or a limit out of range (the message names the field)", body = ErrorBody),
        Unauthorized,
        TooLarge,
        NotJson,
    )
)]
async fn set_limits(
    State(s): State<AppState>,
    _: Operator,
    Name(name): Name,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<Json<QueueInfo>, AppError> {
    let limits = QueueLimits::from_json(&body).map_err(|e| AppError::BadRequest(e.reason))?;
    Ok(Json(
        queues::set_limits(
            &mut *s.pool.acquire().await?,
            s.schema(),
            &name,
            &limits,
            &s.instance_id,
        )
        .await?,
    ))
}

//! `/api/instances`: the leasekeeper processes sharing this database, and
//! the operator's kill (any instance can kill any other, through it).

use super::Message;
use super::extract::{ApiQuery, WorkerId as NameSegment};
use super::paging::{CursorQuery, answer};
use super::responses::{BadId, BadQuery, Unauthorized};
use crate::auth::Operator;
use crate::error::{AppError, ErrorBody};
use crate::ops;
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use leasekeeper_core::instance::Instance;
use leasekeeper_core::instance::{alive_window, store};

/// The instance routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/instances", get(list))
        .route("/api/instances/{id}/kill", post(kill))
}

/// `GET /api/instances?before=SEQ&limit=N`: newest first, paged.
#[utoipa::path(
    get,
    path = "/api/instances",
    tag = "instances",
    summary = "The instances sharing this database",
    description = "Newest first, paged by `seq` (`before` is a sequence number). `alive` is judged by the database clock.",
    params(CursorQuery),
    responses(
        (status = 200, description = "A page of instances, newest first", body = [Instance],
            headers(("Link" = String, description = "The next (older) page, when older rows remain"))),
        BadQuery,
    )
)]
async fn list(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<CursorQuery>,
) -> Result<axum::response::Response, AppError> {
    let window = alive_window(s.settings.renew_interval);
    let cursor = q.cursor();
    let page = crate::reads::read!(s, |c| store::list_page(c, s.schema(), window, cursor).await)?;
    Ok(answer("/api/instances", cursor, page))
}

/// `POST /api/instances/{id}/kill`: 202, then the instance exits like a crash.
#[utoipa::path(
    post,
    path = "/api/instances/{id}/kill",
    tag = "instances",
    summary = "Kill an instance (operator)",
    description = "The instance exits with status 137 like a crash: no lease released, not marked stopped. Another instance is reached through its address.",
    params(("id" = String, Path, min_length = 1, max_length = 256, description = "The instance's id, e.g. `i-3010-5f2c`")),
    security((), ("admin_token" = [])),
    responses(
        (status = 202, description = "The kill is under way", body = Message),
        BadId,
        Unauthorized,
        (status = 404, description = "No such instance", body = ErrorBody),
        (status = 409, description = "Already stopped, or not answering", body = ErrorBody),
    )
)]
async fn kill(
    State(s): State<AppState>,
    _: Operator,
    NameSegment(id): NameSegment,
) -> Result<(StatusCode, Json<Message>), AppError> {
    let message = ops::kill_instance(&s, &id).await?;
    Ok((StatusCode::ACCEPTED, Json(Message { message })))
}

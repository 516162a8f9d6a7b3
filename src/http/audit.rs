//! `GET /api/audit`: every operator action, newest first, a page at a time.

use super::extract::ApiQuery;
use super::paging::{CursorQuery, answer};
use super::responses::BadQuery;
use crate::error::AppError;
use crate::state::AppState;
use axum::Router;
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use leasekeeper_core::lease::LeaseEvent;

/// The audit route.
pub fn routes() -> Router<AppState> {
    Router::new().route("/api/audit", get(audit))
}

#[utoipa::path(
    get,
    path = "/api/audit",
    tag = "audit",
    summary = "Every operator action",
    description = "`operator` events of every resource, newest first: `detail` has `action` and `by`; `holder` is the instance the action was taken through.",
    params(CursorQuery),
    responses(
        (status = 200, description = "A page of operator events, newest first", body = [LeaseEvent],
            headers(("Link" = String, description = "The next (older) page, when older rows remain"))),
        BadQuery,
    )
)]
async fn audit(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<CursorQuery>,
) -> Result<Response, AppError> {
    let cursor = q.cursor();
    let page = crate::reads::read!(s, |c| leasekeeper_core::lease::store::audit(
        c,
        s.schema(),
        cursor
    )
    .await)?;
    Ok(answer("/api/audit", cursor, page))
}

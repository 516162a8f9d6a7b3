//! `/api/leases`: the lease service's REST contract (docs/rest-api.md).

use super::extract::{ApiQuery, Id, JsonBody};
use super::paging::{CursorQuery, Direction, answer_to};
use super::params::LeaseIdPath;
use super::responses::{
    BadId, BadLeaseQuery, LeaseNotFound, LeasePage, NeedsCredential, NotJson, ReservedResource,
    TooLarge, Unauthorized,
};
use crate::error::{AppError, ErrorBody};
use crate::state::AppState;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, put};
use axum::{Json, Router};
use leasekeeper_core::lease::store::{self, Acquired};
use leasekeeper_core::lease::{Holder, Lease, LeaseEvent, LeaseFilter, Resource};
use serde::Deserialize;
use std::time::Duration;

/// The lease routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/leases", get(list_all).post(acquire))
        .route("/api/leases/active", get(list_active))
        .route("/api/leases/expired", get(list_expired))
        .route("/api/leases/renewed", get(list_renewed))
        .route("/api/leases/released", get(list_released))
        .route("/api/leases/renew", put(renew))
        .route("/api/leases/release", delete(release))
        .route("/api/leases/{id}", get(get_one).delete(delete_one))
        .route("/api/leases/{id}/events", get(events))
        .route(
            "/api/leases/{id}/force-release",
            axum::routing::post(force_release),
        )
}

/// `?before=ID&limit=N` on list routes: newest first, the next page named
/// by a `Link` header. `after=ID` instead pages oldest first (ids above it).
#[derive(Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Newest first, leases with an id below this (the cursor of the
    /// `Link: rel="next"` header).
    before: Option<i64>,
    /// Oldest first instead, leases with an id above this, for a client
    /// that follows new leases (no `Link` header); with `before` too, only
    /// leases between the two.
    after: Option<i64>,
    /// At most this many (default 100, 1 to 1000).
    limit: Option<i64>,
}

async fn list(
    state: &AppState,
    filter: LeaseFilter,
    uri: Uri,
    q: ListQuery,
) -> Result<Response, AppError> {
    let direction = Direction::of(q.before, q.after, q.limit);
    Ok(match direction {
        Direction::Oldest(page, before) => {
            let rows =
                crate::reads::read!(state, |c| store::list(c, state.schema(), filter, page)
                    .await)?;
            Json(super::paging::below(rows, before, |r| r.id)).into_response()
        }
        Direction::Newest(cursor) => answer_to(
            &uri,
            cursor,
            crate::reads::read!(state, |c| store::list_page(
                c,
                state.schema(),
                filter,
                cursor
            )
            .await)?,
        ),
    })
}

super::paging::list_routes! {
    tag = "leases", responses(LeasePage, BadLeaseQuery);
    list_all: "/api/leases", "Every lease", LeaseFilter::All;
    list_active: "/api/leases/active", "Leases held and not expired", LeaseFilter::Active;
    list_expired: "/api/leases/expired", "Leases that ran out without a release", LeaseFilter::Expired;
    list_renewed: "/api/leases/renewed", "Leases renewed at least once in their current term", LeaseFilter::Renewed;
    list_released: "/api/leases/released", "Leases their holder released", LeaseFilter::Released;
}

/// Body of `POST /api/leases`.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct AcquireBody {
    /// The thing to own.
    resource: Resource,
    /// Who asks.
    holder: Holder,
    /// The term's length in seconds (more than 0, at most 86400); the
    /// server's lease TTL when absent.
    #[schema(exclusive_minimum = 0, maximum = 86400)]
    ttl_seconds: Option<f64>,
}

/// Body of `PUT /api/leases/renew`, `DELETE /api/leases/release` and `DELETE /api/leases/{id}`.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct HolderBody {
    /// The resource held.
    resource: Resource,
    /// Its holder.
    holder: Holder,
    /// The term meant: refused unless the live term has this token.
    #[serde(default, deserialize_with = "leasekeeper_core::json::opt_int")]
    fencing_token: Option<i64>,
    /// Renew only: the new TTL in seconds, more than 0, at most 86400 (the
    /// term's own when absent).
    #[schema(exclusive_minimum = 0, maximum = 86400)]
    ttl_seconds: Option<f64>,
}

/// 403 for a resource under one of the library's
/// [`RESERVED_PREFIXES`](leasekeeper_core::lease::RESERVED_PREFIXES):
/// asked before the database is touched, of every caller, the operator
/// included (whose way to end such a term is force-release).
fn not_reserved(resource: &Resource) -> Result<(), AppError> {
    match resource.reserved_prefix() {
        None => Ok(()),
        Some(prefix) => Err(AppError::Forbidden(format!(
            "resource {:?} is under the reserved prefix {prefix:?}: the library's own leases cannot be \
             acquired, renewed, released or deleted through /api/leases (an operator ends a term with \
             POST /api/leases/{{id}}/force-release)",
            resource.as_str()
        ))),
    }
}

/// A TTL in seconds from a request, checked against the store's limit.
fn ttl(seconds: Option<f64>, default: Duration) -> Result<Duration, AppError> {
    let Some(secs) = seconds else {
        return Ok(default);
    };
    if !secs.is_finite() || secs <= 0.0 || secs > store::MAX_TTL.as_secs_f64() {
        return Err(AppError::BadRequest(format!(
            "ttl_seconds must be more than 0 and at most {}",
            store::MAX_TTL.as_secs()
        )));
    }
    // A positive TTL below the column's millisecond is one millisecond, as
    // the store rounds it.
    Ok(Duration::from_secs_f64(secs).max(Duration::from_millis(1)))
}

#[utoipa::path(
    post,
    path = "/api/leases",
    tag = "leases",
    summary = "Acquire a lease",
    request_body = AcquireBody,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 201, description = "A new term, with its fencing token", body = Lease),
        (status = 200, description = "The same holder already holds it: its live term", body = Lease),
        (status = 400, description = "Bad JSON, a bad name or TTL", body = ErrorBody),
        (status = 409, description = "Another holder holds it", body = ErrorBody),
        NeedsCredential,
        ReservedResource,
        TooLarge,
        NotJson,
    )
)]
async fn acquire(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    JsonBody(body): JsonBody<AcquireBody>,
) -> Result<(StatusCode, Json<Lease>), AppError> {
    not_reserved(&body.resource)?;
    let ttl = ttl(body.ttl_seconds, s.settings.lease_ttl)?;
    match store::acquire(
        &mut *s.pool.acquire().await?,
        s.schema(),
        &body.resource,
        &body.holder,
        ttl,
    )
    .await?
    {
        Acquired::New(lease) => Ok((StatusCode::CREATED, Json(lease))),
        Acquired::AlreadyHeld(lease) => Ok((StatusCode::OK, Json(lease))),
    }
}

#[utoipa::path(
    put,
    path = "/api/leases/renew",
    tag = "leases",
    summary = "Renew a lease",
    request_body = HolderBody,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 200, description = "Extended", body = Lease),
        (status = 400, description = "Bad JSON, a bad name or TTL", body = ErrorBody),
        (status = 404, description = "That holder has no live lease (in that term)", body = ErrorBody),
        NeedsCredential,
        ReservedResource,
        TooLarge,
        NotJson,
    )
)]
async fn renew(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    JsonBody(body): JsonBody<HolderBody>,
) -> Result<Json<Lease>, AppError> {
    not_reserved(&body.resource)?;
    let ttl = body
        .ttl_seconds
        .map(|secs| ttl(Some(secs), s.settings.lease_ttl))
        .transpose()?;
    let lease = store::renew(
        &mut *s.pool.acquire().await?,
        s.schema(),
        &body.resource,
        &body.holder,
        body.fencing_token,
        ttl,
    )
    .await?;
    Ok(Json(lease))
}

#[utoipa::path(
    delete,
    path = "/api/leases/release",
    tag = "leases",
    summary = "Release a lease",
    description = "The resource is free at once. `ttl_seconds` is ignored.",
    request_body = HolderBody,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 200, description = "Released", body = Lease),
        (status = 400, description = "Bad JSON or a bad name", body = ErrorBody),
        (status = 404, description = "No live lease of that holder (in that term)", body = ErrorBody),
        NeedsCredential,
        ReservedResource,
        TooLarge,
        NotJson,
    )
)]
async fn release(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    JsonBody(body): JsonBody<HolderBody>,
) -> Result<Json<Lease>, AppError> {
    not_reserved(&body.resource)?;
    let lease = store::release(
        &mut *s.pool.acquire().await?,
        s.schema(),
        &body.resource,
        &body.holder,
        body.fencing_token,
    )
    .await?;
    Ok(Json(lease))
}

#[utoipa::path(
    get,
    path = "/api/leases/{id}",
    tag = "leases",
    summary = "One lease",
    params(LeaseIdPath),
    responses(
        (status = 200, description = "The lease", body = Lease),
        BadId,
        LeaseNotFound,
    )
)]
async fn get_one(State(s): State<AppState>, Id(id): Id) -> Result<Json<Lease>, AppError> {
    crate::reads::read!(s, |c| store::get(c, s.schema(), id).await)?
        .map(Json)
        .ok_or_else(|| AppError::NotFound(format!("no lease with id {id}")))
}

#[utoipa::path(
    delete,
    path = "/api/leases/{id}",
    tag = "leases",
    summary = "Delete a lease row",
    description = "The resource's fencing-token counter survives the row. `ttl_seconds` is ignored.",
    params(LeaseIdPath),
    request_body = HolderBody,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 200, description = "Deleted: the row as it was", body = Lease),
        (status = 400, description = "Bad JSON, a bad id or name", body = ErrorBody),
        (status = 404, description = "No such lease of that holder, or `fencing_token` names another term", body = ErrorBody),
        NeedsCredential,
        ReservedResource,
        TooLarge,
        NotJson,
    )
)]
async fn delete_one(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    Id(id): Id,
    JsonBody(body): JsonBody<HolderBody>,
) -> Result<Json<Lease>, AppError> {
    not_reserved(&body.resource)?;
    let lease = store::delete(
        &mut *s.pool.acquire().await?,
        s.schema(),
        id,
        &body.resource,
        &body.holder,
        body.fencing_token,
    )
    .await?;
    Ok(Json(lease))
}

/// The body of a force-release: the term the operator means to end.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForceReleaseBody {
    /// The token of the term to end.
    #[serde(deserialize_with = "leasekeeper_core::json::int")]
    fencing_token: i64,
}

/// `POST /api/leases/{id}/force-release {"fencing_token": N}`: an operator
/// ends term N of lease `id`, whoever holds it (409 when that term is over).
#[utoipa::path(
    post,
    path = "/api/leases/{id}/force-release",
    tag = "leases",
    summary = "Force-release a term (operator)",
    description = "Ends that term now, whoever holds it. (A task's claim has no lease row: `POST /api/tasks/{id}/release` ends it.) Recorded in `lease_events` as an `operator` event.",
    params(LeaseIdPath),
    request_body = ForceReleaseBody,
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "Released", body = Lease),
        (status = 400, description = "Bad JSON or a bad id", body = ErrorBody),
        Unauthorized,
        (status = 409, description = "That term already ended, or another began", body = ErrorBody),
        TooLarge,
        NotJson,
    )
)]
async fn force_release(
    State(s): State<AppState>,
    _: crate::auth::Operator,
    Id(id): Id,
    JsonBody(body): JsonBody<ForceReleaseBody>,
) -> Result<Json<Lease>, AppError> {
    let mut conn = s.pool.acquire().await?;
    Ok(Json(
        crate::ops::force_release(
            &mut conn,
            s.schema(),
            id,
            body.fencing_token,
            &s.instance_id,
        )
        .await?,
    ))
}

/// `GET /api/leases/{id}/events`: the lease's history, newest first, paged.
#[utoipa::path(
    get,
    path = "/api/leases/{id}/events",
    tag = "leases",
    summary = "A lease's history",
    description = "`acquired`, `renewed`, `released`, `taken_over`, `deleted`, `stale_write_refused` and `operator` events of the lease's resource, newest first.",
    params(LeaseIdPath, CursorQuery),
    responses(
        (status = 200, description = "A page of events, newest first", body = [LeaseEvent],
            headers(("Link" = String, description = "The next (older) page, when older rows remain"))),
        (status = 400, description = "A bad id or query", body = ErrorBody),
        LeaseNotFound,
    )
)]
async fn events(
    State(s): State<AppState>,
    Id(id): Id,
    ApiQuery(q): ApiQuery<CursorQuery>,
) -> Result<axum::response::Response, AppError> {
    let cursor = q.cursor();
    let page = crate::reads::read!(s, |c| -> Result<_, AppError> {
        let lease = store::get(c, s.schema(), id)
            .await?
            .ok_or_else(|| AppError::NotFound(format!("no lease with id {id}")))?;
        Ok(store::events(c, s.schema(), &lease.resource, cursor).await?)
    })?;
    Ok(super::paging::answer(
        &format!("/api/leases/{id}/events"),
        cursor,
        page,
    ))
}

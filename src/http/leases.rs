//! `/api/leases`: the lease service's REST contract (SPEC §3).

use super::extract::{ApiQuery, Id, JsonBody};
use crate::error::AppError;
use crate::lease::store::{self, Acquired, Page};
use crate::lease::{Holder, Lease, LeaseFilter, Resource};
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, get, put};
use axum::{Json, Router};
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
        .route(
            "/api/leases/{id}/force-release",
            axum::routing::post(force_release),
        )
}

/// `?after=ID&limit=N` on list routes.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    after: Option<i32>,
    limit: Option<i64>,
}

async fn list(
    state: &AppState,
    filter: LeaseFilter,
    q: ListQuery,
) -> Result<Json<Vec<Lease>>, AppError> {
    let page = Page::new(q.after, q.limit);
    Ok(Json(
        store::list(&mut *state.pool.acquire().await?, filter, page).await?,
    ))
}

async fn list_all(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Vec<Lease>>, AppError> {
    list(&s, LeaseFilter::All, q).await
}

async fn list_active(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Vec<Lease>>, AppError> {
    list(&s, LeaseFilter::Active, q).await
}

async fn list_expired(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Vec<Lease>>, AppError> {
    list(&s, LeaseFilter::Expired, q).await
}

async fn list_renewed(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Vec<Lease>>, AppError> {
    list(&s, LeaseFilter::Renewed, q).await
}

async fn list_released(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Vec<Lease>>, AppError> {
    list(&s, LeaseFilter::Released, q).await
}

/// Body of `POST /api/leases`.
#[derive(Deserialize)]
pub struct AcquireBody {
    resource: Resource,
    holder: Holder,
    ttl_seconds: Option<f64>,
}

/// Body of `PUT /api/leases/renew`, `DELETE /api/leases/release` and `DELETE /api/leases/{id}`.
#[derive(Deserialize)]
pub struct HolderBody {
    resource: Resource,
    holder: Holder,
    fencing_token: Option<i64>,
    ttl_seconds: Option<f64>,
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
    Ok(Duration::from_secs_f64(secs))
}

async fn acquire(
    State(s): State<AppState>,
    JsonBody(body): JsonBody<AcquireBody>,
) -> Result<(StatusCode, Json<Lease>), AppError> {
    let ttl = ttl(body.ttl_seconds, s.settings.lease_ttl)?;
    match store::acquire(
        &mut *s.pool.acquire().await?,
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

async fn renew(
    State(s): State<AppState>,
    JsonBody(body): JsonBody<HolderBody>,
) -> Result<Json<Lease>, AppError> {
    let ttl = body
        .ttl_seconds
        .map(|secs| ttl(Some(secs), s.settings.lease_ttl))
        .transpose()?;
    let lease = store::renew(
        &mut *s.pool.acquire().await?,
        &body.resource,
        &body.holder,
        body.fencing_token,
        ttl,
    )
    .await?;
    Ok(Json(lease))
}

async fn release(
    State(s): State<AppState>,
    JsonBody(body): JsonBody<HolderBody>,
) -> Result<Json<Lease>, AppError> {
    let lease = store::release(
        &mut *s.pool.acquire().await?,
        &body.resource,
        &body.holder,
        body.fencing_token,
    )
    .await?;
    Ok(Json(lease))
}

async fn get_one(State(s): State<AppState>, Id(id): Id) -> Result<Json<Lease>, AppError> {
    store::get(&mut *s.pool.acquire().await?, id)
        .await?
        .map(Json)
        .ok_or_else(|| AppError::NotFound(format!("no lease with id {id}")))
}

async fn delete_one(
    State(s): State<AppState>,
    Id(id): Id,
    JsonBody(body): JsonBody<HolderBody>,
) -> Result<Json<Lease>, AppError> {
    let lease = store::delete(
        &mut *s.pool.acquire().await?,
        id,
        &body.resource,
        &body.holder,
        body.fencing_token,
    )
    .await?;
    Ok(Json(lease))
}

/// The body of a force-release: the term the operator means to end.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForceReleaseBody {
    fencing_token: i64,
}

/// `POST /api/leases/{id}/force-release {"fencing_token": N}`: an operator
/// ends term N of lease `id`, whoever holds it (409 when that term is over).
async fn force_release(
    State(s): State<AppState>,
    _: crate::ops::Operator,
    Id(id): Id,
    JsonBody(body): JsonBody<ForceReleaseBody>,
) -> Result<Json<Lease>, AppError> {
    let mut conn = s.pool.acquire().await?;
    Ok(Json(
        crate::ops::force_release(&mut conn, id, body.fencing_token, &s.instance_id).await?,
    ))
}

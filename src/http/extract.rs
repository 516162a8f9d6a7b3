//! Request extractors whose every failure is an [`AppError`]: bad JSON, a
//! bad query string or a bad id answer 400 with `{error}`, an oversized body
//! 413, never axum's plain-text rejections.

use crate::error::{AppError, parse_id};
use crate::http::MAX_BODY_BYTES;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use leasekeeper_core::lease::Holder;
use serde::de::DeserializeOwned;

/// A JSON body, parsed whatever its content type says (clients of the
/// original design often omit it).
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                AppError::PayloadTooLarge(MAX_BODY_BYTES)
            } else {
                AppError::BadRequest(format!("cannot read the request body: {rejection}"))
            }
        })?;
        if bytes.is_empty() {
            return Err(AppError::BadRequest("a JSON body is required".into()));
        }
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| AppError::BadRequest(format!("invalid JSON body: {e}")))
    }
}

/// A query string, parsed into `T`.
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| ApiQuery(q))
            .map_err(|e| AppError::BadRequest(format!("invalid query string: {}", e.body_text())))
    }
}

/// The one parameter of a route's path, as sent.
async fn path_segment<S: Send + Sync>(parts: &mut Parts, state: &S) -> Result<String, AppError> {
    Path::<String>::from_request_parts(parts, state)
        .await
        .map(|Path(raw)| raw)
        .map_err(|e| AppError::BadRequest(format!("invalid path: {}", e.body_text())))
}

/// A positive 32-bit row id from the path.
pub struct Id(pub i64);

impl<S> FromRequestParts<S> for Id
where
    S: Send + Sync,
{
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        parse_id(&path_segment(parts, state).await?).map(Id)
    }
}

/// A worker id from the path: a valid holder name (workers claim tasks
/// under their id).
pub struct WorkerId(pub Holder);

impl<S> FromRequestParts<S> for WorkerId
where
    S: Send + Sync,
{
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Holder::parse(path_segment(parts, state).await?)
            .map(WorkerId)
            .map_err(|e| AppError::BadRequest(format!("worker id: {e}")))
    }
}

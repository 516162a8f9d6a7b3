//! Request extractors whose every failure is an [`AppError`]: bad JSON, a
//! bad query string or a bad id answer 400 with `{error}`, an oversized body
//! 413, a body that is not said to be JSON 415, never axum's plain-text
//! rejections.

use crate::error::{AppError, parse_id};
use crate::http::MAX_BODY_BYTES;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use leasekeeper_core::lease::Holder;
use serde::de::DeserializeOwned;

/// A JSON body, sent as `Content-Type: application/json` (or another
/// `application/*+json`; parameters such as `charset` allowed): anything
/// else answers 415 before the body is read. A cross-site HTML form can
/// only send `text/plain`, `multipart/form-data` or form encoding, so the
/// type alone keeps a simple form post away from every JSON route.
pub struct JsonBody<T>(pub T);

/// Checks that a request says its body is JSON (see [`JsonBody`]); for a
/// route that reads the body itself.
pub struct JsonContentType;

impl<S> FromRequestParts<S> for JsonContentType
where
    S: Send + Sync,
{
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        require_json(&parts.headers).map(|()| JsonContentType)
    }
}

/// 415 unless `Content-Type` names JSON: `application/json` or
/// `application/<anything>+json`, any parameters, any case.
pub fn require_json(headers: &HeaderMap) -> Result<(), AppError> {
    let sent = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let is_json = sent.as_deref().is_some_and(|v| {
        let essence = v
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub == "json" || (sub.ends_with("+json") && sub.len() > 5))
    });
    if is_json {
        return Ok(());
    }
    Err(AppError::UnsupportedMediaType(match sent {
        Some(v) => format!(
            "the body must be JSON sent with Content-Type: application/json, not {:?}",
            v
        ),
        None => {
            "the body must be JSON sent with Content-Type: application/json (the header is missing)"
                .into()
        }
    }))
}

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        require_json(req.headers())?;
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

#[cfg(test)]
mod tests {
    use super::require_json;
    use axum::http::{HeaderMap, HeaderValue, StatusCode, header};

    fn with(content_type: Option<&str>) -> Result<(), StatusCode> {
        let mut headers = HeaderMap::new();
        if let Some(v) = content_type {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(v).unwrap());
        }
        require_json(&headers).map_err(|e| e.status())
    }

    #[test]
    fn json_types_pass_and_others_answer_415() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON;charset=UTF-8",
            "application/merge-patch+json",
        ] {
            assert_eq!(with(Some(ok)), Ok(()), "{ok}");
        }
        for bad in [
            None,
            Some("text/plain"),
            Some("text/plain; charset=utf-8"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some("application/jsonx"),
            Some("application/+json"),
            Some("text/json"),
            Some(""),
        ] {
            assert_eq!(
                with(bad),
                Err(StatusCode::UNSUPPORTED_MEDIA_TYPE),
                "{bad:?}"
            );
        }
    }
}

//! Server functions (the dashboard's `/sfn/...` endpoints) answer like the
//! REST API: a body past [`MAX_BODY_BYTES`] gets 413, and an error gets the
//! status of its [`AppError`].
//!
//! Left to itself, leptos answers every server function error with 500
//! unless the function set another status itself, whoever was at fault:
//! arguments that do not decode (`id=abc`), an id of 0, a body that is not
//! UTF-8 all said 500. Bodies had axum's default limit of 2 MB, not ours.

use crate::error::AppError;
use crate::http::MAX_BODY_BYTES;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use leptos::server_fn::error::SERVER_FN_ERROR_HEADER;

/// Where the server functions are mounted (`#[server(prefix = "/sfn")]`).
pub const PREFIX: &str = "/sfn/";

/// Middleware: limits server function bodies and gives their errors the
/// status of the [`AppError`] they carry.
pub async fn answer_like_the_api(req: Request, next: Next) -> Response {
    if !req.uri().path().starts_with(PREFIX) {
        return next.run(req).await;
    }
    let path = req.uri().path().to_owned();
    let (parts, body) = req.into_parts();
    let body = match read_limited(body).await {
        Ok(body) => body,
        Err(e) => return error_response(&path, &e),
    };
    let response = next.run(Request::from_parts(parts, Body::from(body))).await;
    if response.status() != StatusCode::INTERNAL_SERVER_ERROR
        || !response.headers().contains_key(SERVER_FN_ERROR_HEADER)
    {
        return response;
    }
    // The body is the function's AppError, encoded for the browser's copy
    // of the function to decode; it stays as it is, only the status moves.
    let (mut parts, body) = response.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return error_response(
            &path,
            &AppError::internal("cannot read a server function's error"),
        );
    };
    if let Ok(error) = serde_json::from_slice::<AppError>(&body) {
        parts.status = error.status();
    }
    Response::from_parts(parts, Body::from(body))
}

/// `error` as the function itself would have answered it, so the browser's
/// copy of the function decodes it.
fn error_response(path: &str, error: &AppError) -> Response {
    let body = serde_json::to_vec(error).unwrap_or_default();
    let mut response = (error.status(), body).into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(path) = HeaderValue::from_str(path) {
        headers.insert(SERVER_FN_ERROR_HEADER, path);
    }
    response
}

/// The whole body, or 413 past [`MAX_BODY_BYTES`] (read no further).
async fn read_limited(body: Body) -> Result<Bytes, AppError> {
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| AppError::BadRequest(format!("cannot read the request body: {e}")))?;
        if bytes.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(AppError::PayloadTooLarge(MAX_BODY_BYTES));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes.into())
}

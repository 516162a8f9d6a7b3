//! Refuses cross-site requests that would change something.
//!
//! A page on another site can make a visitor's browser POST to the
//! dashboard (a kill button, a generator stop) without reading the answer.
//! Browsers mark such requests with `Origin` and `Sec-Fetch-Site`; every
//! mutation whose origin is not this server's own gets 403. Requests with
//! no `Origin` at all (curl, the `worker` process, other programs) are not
//! browser cross-site requests and pass.

use crate::error::AppError;
use axum::extract::Request;
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Middleware: 403 for a cross-site POST, PUT, PATCH or DELETE.
pub async fn same_origin_only(req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    match cross_site_reason(&req) {
        Some(reason) => {
            tracing::warn!(method = %req.method(), path = %req.uri().path(), reason, "cross-site request refused");
            AppError::Forbidden(format!("cross-site request refused: {reason}")).into_response()
        }
        None => next.run(req).await,
    }
}

fn cross_site_reason(req: &Request) -> Option<&'static str> {
    let headers = req.headers();
    if headers
        .get("sec-fetch-site")
        .is_some_and(|site| site.as_bytes() == b"cross-site")
    {
        return Some("Sec-Fetch-Site says cross-site");
    }
    let origin = headers.get(header::ORIGIN)?;
    let Some(origin_host) = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest)
    else {
        return Some("the Origin header is not a URL");
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if host != Some(origin_host) {
        return Some("Origin does not match Host");
    }
    None
}

//! The security headers every answer carries, and the page's
//! Content-Security-Policy.
//!
//! - `X-Content-Type-Options: nosniff`: a JSON answer is never run as a
//!   script or rendered as HTML by a browser that guesses.
//! - `Referrer-Policy: same-origin`: other sites never learn a dashboard
//!   URL (they hold task ids and filters). Not `no-referrer`: a form posted
//!   before the page hydrated is answered with a redirect back to its
//!   `Referer`, and under `no-referrer` browsers also send `Origin: null`
//!   on such a post, which the cross-site check must refuse.
//! - `X-Frame-Options: DENY` on every answer and CSP `frame-ancestors
//!   'none'` on pages: no other site can frame the dashboard and have a
//!   visitor click its buttons.
//! - On HTML answers, [`content_security_policy`]: scripts only from this
//!   server or inline with this answer's nonce (Leptos puts the nonce on
//!   its hydration and streaming scripts), WebAssembly allowed to compile,
//!   connections only to this server.
//!
//! The page's shell sets the policy with its nonce; an HTML answer that
//! did not (none is known; a safety net) gets the same policy without one.

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

/// The Content-Security-Policy of a page whose inline scripts carry
/// `nonce` (none: no inline script may run). `dev_reload` allows the
/// WebSocket of `cargo leptos watch`'s reload (development only).
///
/// `style-src` allows inline styles: the browser's bundle-mismatch banner
/// is styled by a `style` attribute (it must show when the stylesheet is
/// another build's), and a style cannot run script.
pub fn content_security_policy(nonce: Option<&str>, dev_reload: bool) -> String {
    let nonce = nonce.map(|n| format!(" 'nonce-{n}'")).unwrap_or_default();
    let reload = if dev_reload { " ws: wss:" } else { "" };
    format!(
        "default-src 'self'; script-src 'self'{nonce} 'wasm-unsafe-eval'; \
         style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'{reload}; \
         object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
    )
}

/// Middleware: the headers above on every answer, the policy on HTML
/// answers that lack one.
pub async fn security_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let headers = resp.headers_mut();
    let fixed: [(HeaderName, &'static str); 3] = [
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    let html = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("text/html"));
    if html && !headers.contains_key(header::CONTENT_SECURITY_POLICY) {
        let policy = content_security_policy(None, false);
        if let Ok(value) = HeaderValue::from_str(&policy) {
            headers.insert(header::CONTENT_SECURITY_POLICY, value);
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::content_security_policy;

    #[test]
    fn the_policy_names_the_nonce_and_refuses_framing() {
        let p = content_security_policy(Some("abc_-1"), false);
        assert!(
            p.contains("script-src 'self' 'nonce-abc_-1' 'wasm-unsafe-eval';"),
            "{p}"
        );
        assert!(p.contains("frame-ancestors 'none'"), "{p}");
        assert!(p.contains("connect-src 'self';"), "{p}");
        assert!(!p.contains("'unsafe-eval'"), "{p}");
        let bare = content_security_policy(None, true);
        assert!(
            bare.contains("script-src 'self' 'wasm-unsafe-eval';"),
            "{bare}"
        );
        assert!(bare.contains("connect-src 'self' ws: wss:;"), "{bare}");
    }
}

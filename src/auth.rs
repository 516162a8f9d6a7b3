//! Who may speak: the server's credentials, the two roles they give, the
//! dashboard's sessions, and the rule for reads. Every check of a token or
//! a session is here; handlers name a role as an extractor
//! ([`Operator`], [`WorkerCredential`]) and the router layers
//! [`reads_need_a_credential`].
//!
//! - **Credentials** travel as `Authorization: Bearer <token>` (programs)
//!   or the [`SESSION_COOKIE`] the dashboard's sign-in sets (browsers).
//! - **Roles**: the admin token (`LEASEKEEPER_ADMIN_TOKEN`) or an operator
//!   session is the *operator*; the worker token
//!   (`LEASEKEEPER_WORKER_TOKEN`) is a *worker* (and producer). The
//!   operator passes every worker route too; the worker token never passes
//!   an operator route.
//! - **Locked** means either token is set. Then every worker route answers
//!   401 without a credential, before its body is read and before any
//!   database work, so a refused stranger leaves no `lease_events` row and
//!   moves no counter. Operator routes need the admin token when it is set
//!   (401), are refused with 403 when only a worker token is set (nothing
//!   could open them), and are open when nothing is set (possible only on
//!   loopback: `serve` refuses a network address without a token).
//! - **Reads** (`GET /api/...`, `/events`, server functions, pages) need a
//!   credential of either role when locked and the server listens beyond
//!   loopback; health, metrics, the OpenAPI document, static files and the
//!   sign-in stay public.
//!
//! Tokens are compared in constant time over their SHA-256 digests, so
//! neither where two tokens differ nor their lengths show in the time
//! taken.

use crate::error::AppError;
use crate::settings::Settings;
use crate::state::AppState;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use sha2::{Digest, Sha256};
use std::time::Duration;
use subtle::ConstantTimeEq;

/// The cookie that carries an operator session's random id (never a token).
pub const SESSION_COOKIE: &str = "leasekeeper_session";

/// How long a session lasts: the cookie's `Max-Age` and the row's expiry.
pub const SESSION_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// What a credential lets a request do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Workers and producers: enqueue, claim, heartbeat, complete, snooze,
    /// fail, report, application leases; and reads.
    Worker,
    /// Everything a worker may, plus the controls.
    Operator,
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize().into()
}

/// Compares two secrets in constant time: their digests are compared, so
/// no early answer on a length mismatch or a first differing byte.
fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (sha256(&[a.as_bytes()]), sha256(&[b.as_bytes()]));
    a[..].ct_eq(&b[..]).into()
}

/// Whether either token is set: then worker routes need a credential.
pub fn is_locked(settings: &Settings) -> bool {
    settings.admin_token.is_some() || settings.worker_token.is_some()
}

/// Whether reads need a credential too: locked, and listening beyond
/// loopback.
pub fn reads_locked(settings: &Settings) -> bool {
    is_locked(settings) && !settings.site_addr.ip().is_loopback()
}

/// The role `token` gives on this server, if any. Both tokens are always
/// compared, so which one matched does not show in the time taken.
pub fn token_role(settings: &Settings, token: &str) -> Option<Role> {
    let matches = |want: &Option<crate::settings::Secret>| {
        want.as_ref()
            .is_some_and(|w| same_secret(token, w.expose()))
    };
    let admin = matches(&settings.admin_token);
    let worker = matches(&settings.worker_token);
    if admin {
        Some(Role::Operator)
    } else if worker {
        Some(Role::Worker)
    } else {
        None
    }
}

/// Whether `candidate` is the configured admin token (false when none is set).
pub fn is_admin_token(settings: &Settings, candidate: &str) -> bool {
    token_role(settings, candidate) == Some(Role::Operator)
}

/// The bearer token of a request, if it sends one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The value of cookie `name`, if the request sends it.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| value.trim())
}

/// A session id as the cookie carries it: 64 lower-case hex digits (32
/// random bytes). Anything else is no session, looked up nowhere.
fn session_id(headers: &HeaderMap) -> Option<&str> {
    cookie(headers, SESSION_COOKIE)
        .filter(|id| id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// What the table keeps of a session id: its SHA-256.
fn id_hash(id: &str) -> [u8; 32] {
    sha256(&[id.as_bytes()])
}

/// The fingerprint of the admin token a session was made with, salted by
/// the session's id (which the table does not keep).
fn token_fingerprint(id: &str, admin_token: &str) -> [u8; 32] {
    sha256(&[id.as_bytes(), b"\0", admin_token.as_bytes()])
}

/// The role a request's credential gives: its bearer token's, else its
/// session's (an operator's, while the session lives and the admin token
/// it was made with is still the configured one). `None` without one.
pub async fn role_of(state: &AppState, headers: &HeaderMap) -> Result<Option<Role>, AppError> {
    if let Some(token) = bearer(headers) {
        return Ok(token_role(&state.settings, token));
    }
    let (Some(id), Some(admin)) = (session_id(headers), state.settings.admin_token.as_ref()) else {
        return Ok(None);
    };
    let valid = leasekeeper_core::session::is_valid(
        &mut *state.pool.acquire().await?,
        state.schema(),
        &id_hash(id),
        &token_fingerprint(id, admin.expose()),
    )
    .await?;
    Ok(valid.then_some(Role::Operator))
}

/// Whether a request may take operator actions.
pub async fn is_operator(state: &AppState, headers: &HeaderMap) -> Result<bool, AppError> {
    Ok(require_operator(state, headers).await.is_ok())
}

/// `Ok` when a request may take operator actions: 401 without the admin
/// token when one is set, 403 for the worker token, or when only a worker
/// token is set; open when no token is set at all.
pub async fn require_operator(state: &AppState, headers: &HeaderMap) -> Result<(), AppError> {
    let settings = &state.settings;
    if settings.admin_token.is_none() {
        return match settings.worker_token {
            None => Ok(()),
            Some(_) => Err(AppError::Forbidden(
                "controls are locked: a worker token is set but no admin token; set \
                 LEASEKEEPER_ADMIN_TOKEN to use them"
                    .into(),
            )),
        };
    }
    match role_of(state, headers).await? {
        Some(Role::Operator) => Ok(()),
        Some(Role::Worker) => Err(AppError::Forbidden(
            "the worker token does not open controls: they need the admin token \
             (LEASEKEEPER_ADMIN_TOKEN)"
                .into(),
        )),
        None => Err(AppError::Unauthorized(
            "this control needs the admin token (LEASEKEEPER_ADMIN_TOKEN): sign in on the dashboard, \
             or send Authorization: Bearer <token>"
                .into(),
        )),
    }
}

/// `Ok` when a request may use the worker routes: always when no token is
/// set, else with either token or an operator session (401 otherwise).
pub async fn require_worker(state: &AppState, headers: &HeaderMap) -> Result<Role, AppError> {
    if !is_locked(&state.settings) {
        return Ok(Role::Operator);
    }
    role_of(state, headers).await?.ok_or_else(|| {
        AppError::Unauthorized(
            "this route needs a credential: send Authorization: Bearer <token> with the worker \
             token (LEASEKEEPER_WORKER_TOKEN) or the admin token (LEASEKEEPER_ADMIN_TOKEN)"
                .into(),
        )
    })
}

/// A REST extractor: the request may take operator actions. It reads only
/// headers, so it answers before the body is read.
pub struct Operator;

impl FromRequestParts<AppState> for Operator {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        require_operator(state, &parts.headers)
            .await
            .map(|()| Operator)
    }
}

/// A REST extractor for the worker and producer routes: the request may
/// enqueue, claim, write its claims, report itself and hold application
/// leases. Named before the body in a handler's arguments, it answers 401
/// before the body is read or the pool is touched (a bearer token needs no
/// database; only a session cookie is looked up).
pub struct WorkerCredential;

impl FromRequestParts<AppState> for WorkerCredential {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        require_worker(state, &parts.headers)
            .await
            .map(|_| WorkerCredential)
    }
}

/// Server functions open without a credential: the sign-in page's own.
const PUBLIC_SERVER_FNS: &[&str] = &["sign_in", "sign_out", "get_access"];

/// Whether `path` is answered to anyone, even when reads are locked: health,
/// metrics, the OpenAPI document, the sign-in page and its server
/// functions, the bundle and other static files (a last segment with a
/// dot). Writes under `/api` pass too: their handlers name their role.
fn is_public(method: &Method, path: &str) -> bool {
    if matches!(
        path,
        "/healthz" | "/readyz" | "/metrics" | "/api/openapi.json" | "/signin"
    ) {
        return true;
    }
    if path.starts_with("/api/") || path == "/api" {
        return !matches!(*method, Method::GET | Method::HEAD);
    }
    if let Some(name) = path.strip_prefix(crate::http::server_fns::PREFIX) {
        return PUBLIC_SERVER_FNS.iter().any(|f| name.starts_with(f));
    }
    if path == "/events" || path.starts_with("/events/") {
        return false;
    }
    path.starts_with("/pkg/")
        || path
            .rsplit('/')
            .next()
            .is_some_and(|last| last.contains('.'))
}

/// Middleware: when [`reads_locked`], a request without a credential of
/// either role gets 401 (`/api`, `/events`, server functions) or, for a
/// page, a redirect to `/signin`; [`is_public`] paths pass.
pub async fn reads_need_a_credential(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    if !reads_locked(&state.settings) || is_public(req.method(), req.uri().path()) {
        return next.run(req).await;
    }
    match role_of(&state, req.headers()).await {
        Ok(Some(_)) => next.run(req).await,
        Err(e) => e.into_response(),
        Ok(None) => {
            let path = req.uri().path();
            let is_page = matches!(*req.method(), Method::GET | Method::HEAD)
                && !path.starts_with("/api")
                && !path.starts_with(crate::http::server_fns::PREFIX)
                && !path.starts_with("/events");
            if is_page {
                Redirect::to("/signin").into_response()
            } else {
                AppError::Unauthorized(
                    "reads need a credential on this server: send Authorization: Bearer <token> \
                     with the worker or admin token, or sign in on the dashboard"
                        .into(),
                )
                .into_response()
            }
        }
    }
}

/// A new operator session for a request that presented the admin token:
/// stored (hashed), and answered as the `Set-Cookie` value that carries its
/// id. `secure` adds `Secure` (the request came over https).
pub async fn open_session(state: &AppState, secure: bool) -> Result<String, AppError> {
    let admin = state
        .settings
        .admin_token
        .as_ref()
        .ok_or_else(|| AppError::BadRequest("no admin token is set on this server".into()))?;
    let id: String = rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    leasekeeper_core::session::create(
        &mut *state.pool.acquire().await?,
        state.schema(),
        &id_hash(&id),
        &token_fingerprint(&id, admin.expose()),
        SESSION_TTL,
    )
    .await?;
    Ok(format!(
        "{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
        SESSION_TTL.as_secs(),
        if secure { "; Secure" } else { "" }
    ))
}

/// Ends the session a request carries, if any, for every instance at
/// once, and answers the `Set-Cookie` value that clears the cookie.
pub async fn close_session(state: &AppState, headers: &HeaderMap) -> Result<String, AppError> {
    if let Some(id) = session_id(headers) {
        leasekeeper_core::session::delete(
            &mut *state.pool.acquire().await?,
            state.schema(),
            &id_hash(id),
        )
        .await?;
    }
    Ok(format!(
        "{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{}",
        if came_over_https(headers) {
            "; Secure"
        } else {
            ""
        }
    ))
}

/// Whether the request reached us over https, as a proxy in front says
/// (`X-Forwarded-Proto: https`) or the browser's `Origin` shows.
pub fn came_over_https(headers: &HeaderMap) -> bool {
    let forwarded = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
    let origin = headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("https://"));
    forwarded || origin
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn settings(admin: Option<&str>, worker: Option<&str>) -> Settings {
        let mut s = Settings::resolve(
            None,
            std::path::Path::new("none"),
            &crate::settings::SettingArgs::default(),
        )
        .unwrap();
        s.admin_token = admin.map(Into::into);
        s.worker_token = worker.map(Into::into);
        s
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const ADMIN: &str = "correct-horse-battery-staple";
    const WORKER: &str = "worker-token-of-some-length";

    #[test]
    fn each_token_gives_its_role() {
        let s = settings(Some(ADMIN), Some(WORKER));
        assert_eq!(token_role(&s, ADMIN), Some(Role::Operator));
        assert_eq!(token_role(&s, WORKER), Some(Role::Worker));
        assert_eq!(token_role(&s, "correct-horse-battery-stapl"), None);
        assert_eq!(token_role(&s, ""), None);
        let none = settings(None, None);
        assert_eq!(token_role(&none, ""), None);
        assert!(!is_admin_token(&settings(None, Some(WORKER)), WORKER));
    }

    #[test]
    fn only_a_bearer_header_carries_a_token() {
        let h = headers(&[("authorization", &format!("Bearer {ADMIN}"))]);
        assert_eq!(bearer(&h), Some(ADMIN));
        assert_eq!(bearer(&headers(&[("authorization", ADMIN)])), None);
        let raw_cookie = headers(&[("cookie", &format!("leasekeeper_admin={ADMIN}"))]);
        assert_eq!(bearer(&raw_cookie), None);
        assert_eq!(session_id(&raw_cookie), None);
    }

    #[test]
    fn a_session_cookie_is_64_hex_digits() {
        let id = "0123456789abcdef".repeat(4);
        let h = headers(&[("cookie", &format!("a=1; {SESSION_COOKIE}={id}; b=2"))]);
        assert_eq!(session_id(&h), Some(id.as_str()));
        for bad in [&id[..63], &id.to_uppercase(), ADMIN] {
            let h = headers(&[("cookie", &format!("{SESSION_COOKIE}={bad}"))]);
            assert_eq!(session_id(&h), None, "{bad}");
        }
        let h = headers(&[("cookie", &format!("x{SESSION_COOKIE}={id}"))]);
        assert_eq!(session_id(&h), None);
    }

    #[test]
    fn a_fingerprint_changes_with_the_token_and_the_id() {
        let id = "ab".repeat(32);
        let other = "cd".repeat(32);
        assert_ne!(token_fingerprint(&id, "a"), token_fingerprint(&id, "b"));
        assert_ne!(token_fingerprint(&id, "a"), token_fingerprint(&other, "a"));
        assert_ne!(id_hash(&id).to_vec(), id.as_bytes().to_vec());
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
        assert!(!same_secret("", "a"));
    }

    #[test]
    fn reads_lock_only_beyond_loopback_with_a_token() {
        let mut s = settings(Some(ADMIN), None);
        s.site_addr = "127.0.0.1:3000".parse().unwrap();
        assert!(!reads_locked(&s));
        s.site_addr = "0.0.0.0:3000".parse().unwrap();
        assert!(reads_locked(&s));
        s.admin_token = None;
        assert!(!reads_locked(&s));
        s.worker_token = Some(WORKER.into());
        assert!(reads_locked(&s));
    }

    #[test]
    fn public_paths() {
        for (m, p) in [
            (Method::GET, "/healthz"),
            (Method::GET, "/readyz"),
            (Method::GET, "/metrics"),
            (Method::GET, "/api/openapi.json"),
            (Method::GET, "/signin"),
            (Method::GET, "/pkg/leasekeeper.wasm"),
            (Method::GET, "/favicon.svg"),
            (Method::POST, "/sfn/sign_in123"),
            (Method::POST, "/sfn/get_access99"),
            (Method::POST, "/api/tasks"),
        ] {
            assert!(is_public(&m, p), "{m} {p}");
        }
        for (m, p) in [
            (Method::GET, "/api/tasks"),
            (Method::GET, "/api/tasks/1"),
            (Method::GET, "/events"),
            (Method::POST, "/sfn/list_tasks123"),
            (Method::GET, "/"),
            (Method::GET, "/tasks/1"),
        ] {
            assert!(!is_public(&m, p), "{m} {p}");
        }
    }
}

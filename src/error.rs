//! The one error type every REST route and server function returns.
//!
//! It is shared with the browser so a server function's error arrives as the
//! same value. On the server it maps to an HTTP status and a JSON body
//! `{"error": "..."}`; internal errors are logged once, where they are turned
//! into [`AppError::Internal`], and the client sees only a generic message.

use leptos::server_fn::error::ServerFnErrorErr;
use serde::{Deserialize, Serialize};

/// What went wrong, in terms a client can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum AppError {
    /// The request is malformed: bad JSON, a missing or over-long field, a bad id.
    #[error("{0}")]
    BadRequest(String),
    /// The thing asked for does not exist (or is not held by the caller).
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the current state, e.g. another holder owns the lease.
    #[error("{0}")]
    Conflict(String),
    /// The body is larger than the server accepts.
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// The request needs the admin token and did not carry it.
    #[error("{0}")]
    Unauthorized(String),
    /// The request is not allowed (wrong origin).
    #[error("{0}")]
    Forbidden(String),
    /// The server cannot answer this now: a read ran past the read
    /// timeout, or every read connection is busy. Trying again later (or
    /// a narrower read) may succeed.
    #[error("{0}")]
    Unavailable(String),
    /// The request's `Host` names a server this one does not answer for
    /// (what a DNS-rebinding page sends).
    #[error("{0}")]
    MisdirectedRequest(String),
    /// The body's `Content-Type` is not JSON.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// Something failed on the server; the details are in its log only.
    #[error("internal server error")]
    Internal,
    /// A server function could not be called or its answer not read (browser side).
    #[error("server function failed: {0}")]
    ServerFn(String),
}

/// The JSON body of every error answer, REST route or server function:
/// `{"error": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// What went wrong, in words a client can act on (a generic message for
    /// a 500; the details are in the server's log).
    pub error: String,
}

/// Parses a row id from a path or a lookup box: a positive integer that
/// fits a `bigint` id column.
pub fn parse_id(raw: &str) -> Result<i64, AppError> {
    raw.trim()
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| AppError::BadRequest(format!("id must be a positive integer, got {raw:?}")))
}

/// Refuses ids that no row can have (server functions get them already typed).
pub fn check_id(id: i64) -> Result<i64, AppError> {
    parse_id(&id.to_string())
}

impl leptos::server_fn::error::FromServerFnError for AppError {
    type Encoder = leptos::server_fn::codec::JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        // On the server these three are the caller's fault: arguments that
        // do not decode, a missing one, a body that cannot be read as text.
        // (In the browser they mean other things, e.g. an answer that does
        // not decode.)
        #[cfg(feature = "ssr")]
        match &value {
            ServerFnErrorErr::Args(e) => {
                return AppError::BadRequest(format!("invalid arguments: {e}"));
            }
            ServerFnErrorErr::MissingArg(name) => {
                return AppError::BadRequest(format!("missing argument {name}"));
            }
            ServerFnErrorErr::Deserialization(e) => {
                return AppError::BadRequest(format!("cannot read the request body: {e}"));
            }
            _ => {}
        }
        AppError::ServerFn(value.to_string())
    }
}

#[cfg(feature = "ssr")]
mod server {
    use super::AppError;
    use axum::Json;
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};

    impl AppError {
        /// The HTTP status this error answers with.
        pub fn status(&self) -> StatusCode {
            match self {
                AppError::BadRequest(_) => StatusCode::BAD_REQUEST,
                AppError::NotFound(_) => StatusCode::NOT_FOUND,
                AppError::Conflict(_) => StatusCode::CONFLICT,
                AppError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                AppError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
                AppError::Forbidden(_) => StatusCode::FORBIDDEN,
                AppError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                AppError::MisdirectedRequest(_) => StatusCode::MISDIRECTED_REQUEST,
                AppError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
                AppError::Internal | AppError::ServerFn(_) => StatusCode::INTERNAL_SERVER_ERROR,
            }
        }

        /// Logs an internal failure with its full context and returns the
        /// generic error the client sees. This is the one place internals are
        /// logged, so callers must not log them again.
        pub fn internal(err: impl std::fmt::Display) -> Self {
            tracing::error!(error = %err, "request failed");
            AppError::Internal
        }
    }

    impl IntoResponse for AppError {
        fn into_response(self) -> Response {
            let body = super::ErrorBody {
                error: self.to_string(),
            };
            (self.status(), Json(body)).into_response()
        }
    }

    /// The SQLSTATE of a statement cancelled, by its statement timeout or
    /// by `pg_cancel_backend` (`query_canceled`).
    const QUERY_CANCELED: &str = "57014";

    /// Whether `err` is a statement cancelled by its timeout (or by an
    /// administrator's `pg_cancel_backend`, which reads the same).
    fn cancelled(err: &sqlx::Error) -> bool {
        matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some(QUERY_CANCELED))
    }

    /// The answer to a cancelled statement: only reads run under a
    /// statement timeout ([`crate::reads`]).
    fn read_timed_out(err: &dyn std::fmt::Display) -> AppError {
        tracing::warn!(error = %err, "a statement was cancelled");
        AppError::Unavailable(
            "the read took longer than the read timeout (LEASEKEEPER_READ_TIMEOUT_SECS) \
             and was cancelled; narrow it (a filter, a smaller page) or raise the setting"
                .into(),
        )
    }

    impl From<sqlx::Error> for AppError {
        fn from(err: sqlx::Error) -> Self {
            if cancelled(&err) {
                return read_timed_out(&err);
            }
            AppError::internal(format!("database: {err}"))
        }
    }

    impl From<leasekeeper_core::lease::store::LeaseError> for AppError {
        fn from(err: leasekeeper_core::lease::store::LeaseError) -> Self {
            use leasekeeper_core::lease::store::LeaseError;
            match err {
                LeaseError::Held { .. } => AppError::Conflict(err.to_string()),
                LeaseError::NotFound(msg) => AppError::NotFound(msg),
                LeaseError::BadTtl | LeaseError::TaskClaim(_) => {
                    AppError::BadRequest(err.to_string())
                }
                LeaseError::Db(e) => AppError::from(e),
            }
        }
    }

    impl From<leasekeeper_core::queue::store::TaskError> for AppError {
        fn from(err: leasekeeper_core::queue::store::TaskError) -> Self {
            use leasekeeper_core::queue::store::TaskError;
            match err {
                TaskError::NotFound(_) => AppError::NotFound(err.to_string()),
                TaskError::Stale { .. } | TaskError::Conflict(_) => {
                    AppError::Conflict(err.to_string())
                }
                TaskError::BadInput(msg) => AppError::BadRequest(msg),
                TaskError::QueueCap(msg) => AppError::Conflict(format!(
                    "{msg}; nothing was enqueued. The cap is the max_queues setting \
                     (LEASEKEEPER_MAX_QUEUES); retention prunes queues left without tasks"
                )),
                TaskError::Lease(e) => AppError::from(e),
                TaskError::Db(e) => AppError::from(e),
            }
        }
    }

    impl From<leasekeeper_core::schedule::store::ScheduleError> for AppError {
        fn from(err: leasekeeper_core::schedule::store::ScheduleError) -> Self {
            use leasekeeper_core::schedule::store::ScheduleError;
            match err {
                ScheduleError::NotFound(_) => AppError::NotFound(err.to_string()),
                ScheduleError::BadInput { .. } => AppError::BadRequest(err.to_string()),
                ScheduleError::Task(e) => AppError::from(e),
                ScheduleError::Db(e) => AppError::from(e),
            }
        }
    }

    impl From<leasekeeper_core::queue::queues::QueueError> for AppError {
        fn from(err: leasekeeper_core::queue::queues::QueueError) -> Self {
            use leasekeeper_core::queue::queues::QueueError;
            match err {
                QueueError::NotFound(_) => AppError::NotFound(err.to_string()),
                QueueError::BadInput(msg) => AppError::BadRequest(msg),
                QueueError::Db(e) => AppError::from(e),
            }
        }
    }

    impl From<crate::worker::fleet::FleetError> for AppError {
        fn from(err: crate::worker::fleet::FleetError) -> Self {
            use crate::worker::fleet::FleetError;
            match err {
                FleetError::NotHere { .. } => AppError::NotFound(err.to_string()),
                FleetError::ShuttingDown => AppError::Conflict(err.to_string()),
                FleetError::NoSession => AppError::Unavailable(err.to_string()),
                FleetError::BadId(_) | FleetError::Db(_) => AppError::internal(err),
            }
        }
    }

    impl From<anyhow::Error> for AppError {
        fn from(err: anyhow::Error) -> Self {
            if err
                .chain()
                .any(|e| e.downcast_ref::<sqlx::Error>().is_some_and(cancelled))
            {
                return read_timed_out(&format!("{err:#}"));
            }
            AppError::internal(format!("{err:#}"))
        }
    }
}

//! What a server function reaches: the server's state, the pool, the
//! settings, the operator check, and a refusal's own status.

#[cfg(feature = "ssr")]
use crate::error::AppError;
#[cfg(feature = "ssr")]
use leptos::prelude::*;

/// The server's state, inside a server function.
#[cfg(feature = "ssr")]
pub fn state() -> Result<crate::state::AppState, AppError> {
    use_context::<crate::state::AppState>()
        .ok_or_else(|| AppError::internal("AppState missing from server function context"))
}

/// The database pool, inside a server function.
#[cfg(feature = "ssr")]
pub fn pool() -> Result<sqlx::PgPool, AppError> {
    state().map(|state| state.pool)
}

/// The schema of leasekeeper's tables, inside a server function.
#[cfg(feature = "ssr")]
pub fn schema() -> Result<leasekeeper_core::db::Schema, AppError> {
    state().map(|state| state.schema().clone())
}

/// The server's state, inside a server function that changes something:
/// 401 unless the request may take operator actions (see [`crate::auth`]).
#[cfg(feature = "ssr")]
pub async fn operator_state() -> Result<crate::state::AppState, AppError> {
    let state = state()?;
    let headers: axum::http::HeaderMap =
        leptos_axum::extract().await.map_err(AppError::internal)?;
    crate::auth::require_operator(&state, &headers)
        .await
        .map_err(refused)?;
    Ok(state)
}

/// Gives a server function's refusal its own status (401, 400, 409…)
/// instead of the 500 a server function's error answers by default.
#[cfg(feature = "ssr")]
pub fn refused(e: AppError) -> AppError {
    if let Some(resp) = use_context::<leptos_axum::ResponseOptions>() {
        resp.set_status(e.status());
    }
    e
}

/// The resolved settings, inside a server function.
#[cfg(feature = "ssr")]
pub fn settings() -> Result<std::sync::Arc<crate::settings::Settings>, AppError> {
    state().map(|state| state.settings)
}

//! `/api/instances`: the leasekeeper processes sharing this database.

use crate::error::AppError;
use crate::instance::{Instance, alive_window, store};
use crate::server::AppState;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};

/// The instance routes.
pub fn routes() -> Router<AppState> {
    Router::new().route("/api/instances", get(list))
}

async fn list(State(s): State<AppState>) -> Result<Json<Vec<Instance>>, AppError> {
    let window = alive_window(s.settings.renew_interval);
    Ok(Json(
        store::list(&mut *s.pool.acquire().await?, window).await?,
    ))
}

//! Liveness and readiness, for a load balancer or an orchestrator:
//! `GET /healthz` answers 200 while the process serves requests (it reads
//! nothing); `GET /readyz` answers 200 when the database answers within
//! [`READY_TIMEOUT`] and its migrations are exactly this build's, and 503
//! with a JSON reason otherwise.

use crate::db::{MigrationState, migration_state};
use crate::state::AppState;
use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use serde_json::{Value, json};
use std::time::Duration;

/// How long readiness waits for the database (a connection from the pool
/// and the migration check) before answering 503.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// `/healthz` and `/readyz`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

async fn healthz(State(s): State<AppState>) -> Json<Value> {
    Json(json!({ "status": "ok", "instance": &*s.instance_id }))
}

async fn readyz(State(s): State<AppState>) -> (StatusCode, Json<Value>) {
    let check = async {
        let mut conn = s.pool.acquire().await?;
        migration_state(&mut conn).await
    };
    let not_ready = |reason: String| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "ready": false, "instance": &*s.instance_id, "reason": reason })),
        )
    };
    match tokio::time::timeout(READY_TIMEOUT, check).await {
        Ok(Ok(MigrationState::Current { applied })) => (
            StatusCode::OK,
            Json(json!({ "ready": true, "instance": &*s.instance_id, "migrations": applied })),
        ),
        Ok(Ok(MigrationState::Behind(why))) => not_ready(format!("migrations not current: {why}")),
        Ok(Err(e)) => not_ready(format!("the database did not answer: {e}")),
        Err(_) => not_ready(format!(
            "the database did not answer within {} s",
            READY_TIMEOUT.as_secs_f64()
        )),
    }
}

//! Liveness and readiness, for a load balancer or an orchestrator:
//! `GET /healthz` answers 200 while the process serves requests (it reads
//! nothing); `GET /readyz` answers 200 when the database answers within
//! [`READY_TIMEOUT`] and its migrations are exactly this build's, and 503
//! with a JSON reason otherwise. The reason says what is wrong, never an
//! address, a user name or the driver's own error (those go to the log).

use crate::state::AppState;
use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use leasekeeper_core::db::{MigrationState, migration_state};
use serde::Serialize;
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

/// The answer of `/healthz`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Health {
    /// Always `ok`.
    status: &'static str,
    /// The instance that answered.
    instance: String,
    /// This instance's own generator singleton state (idle, acquiring,
    /// working, renewing, pausing, waiting, releasing), from memory: it says
    /// whether this replica believes it runs the generator even when the
    /// database is out of reach. Absent when it runs no generator.
    #[serde(skip_serializing_if = "Option::is_none")]
    generator: Option<String>,
}

/// The answer of `/readyz`: `migrations` when ready, `reason` when not.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Readiness {
    /// Whether this instance can serve requests that need the database.
    ready: bool,
    /// The instance that answered.
    instance: String,
    /// How many migrations are applied (when ready).
    #[serde(skip_serializing_if = "Option::is_none")]
    migrations: Option<usize>,
    /// Why it is not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    summary = "Liveness",
    description = "200 while the process serves requests; reads nothing, so a slow or absent database does not fail it. `generator` is this instance's own generator state, from memory.",
    responses((status = 200, description = "Alive", body = Health))
)]
async fn healthz(State(s): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok",
        instance: s.instance_id.to_string(),
        generator: s.generator.as_ref().map(|g| g.state().as_str().to_string()),
    })
}

#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    summary = "Readiness",
    description = "200 when the database answers within 2 s and its migrations are exactly this build's; 503 otherwise, with the reason (what is wrong, never an address, a user name or a driver error: those are in the server's log).",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "Not ready: the database did not answer, a migration is missing or failed, or a newer build migrated it", body = Readiness),
    )
)]
async fn readyz(State(s): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let check = async {
        let mut conn = s.pool.acquire().await?;
        migration_state(&mut conn, s.schema()).await
    };
    let answer = |status: StatusCode, migrations: Option<usize>, reason: Option<String>| {
        (
            status,
            Json(Readiness {
                ready: status == StatusCode::OK,
                instance: s.instance_id.to_string(),
                migrations,
                reason,
            }),
        )
    };
    let not_ready = |reason: String| answer(StatusCode::SERVICE_UNAVAILABLE, None, Some(reason));
    match tokio::time::timeout(READY_TIMEOUT, check).await {
        Ok(Ok(MigrationState::Current { applied })) => answer(StatusCode::OK, Some(applied), None),
        Ok(Ok(MigrationState::Behind(why))) => not_ready(format!("migrations not current: {why}")),
        // The driver's words can hold the host, the user and the database
        // name: they go to the log, the caller learns only what is wrong.
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: the database does not answer");
            not_ready("the database does not answer".into())
        }
        Err(_) => not_ready(format!(
            "the database does not answer within {} s",
            READY_TIMEOUT.as_secs_f64()
        )),
    }
}

//! `/api/workers`: who works, what each holds, and the operator's levers on
//! this instance's simulated workers (spawn, pause, kill). Worker processes
//! (`leasekeeper worker`) report themselves here too.

use super::extract::{ApiQuery, JsonBody, WorkerId};
use super::paging::CursorQuery;
use super::params::WorkerIdPath;
use super::responses::{
    BadId, BadQuery, NeedsCredential, NotJson, TooLarge, Unauthorized, WorkerNotFound,
};
use crate::auth::Operator;
use crate::error::{AppError, ErrorBody};
use crate::ops::{self, WorkerAction};
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use leasekeeper_core::lease::Holder;
use leasekeeper_core::worker::Report;
use leasekeeper_core::worker::{WorkerInfo, WorkerKind, registry};
use serde::Serialize;

/// The worker routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/workers", get(list).post(spawn))
        .route("/api/workers/{id}", get(get_one).put(report))
        .route("/api/workers/{id}/pause", post(pause))
        .route("/api/workers/{id}/kill", post(kill))
        .route("/api/workers/{id}/session", post(session))
}

/// `GET /api/workers?before=SEQ&limit=N`: newest first, paged.
#[utoipa::path(
    get,
    path = "/api/workers",
    tag = "workers",
    summary = "The workers",
    description = "Newest first, paged by `seq` (`before` is a sequence number). `alive` and the ages are computed by the database.",
    params(CursorQuery),
    responses(
        (status = 200, description = "A page of workers, newest first", body = [WorkerInfo],
            headers(("Link" = String, description = "The next (older) page, when older rows remain"))),
        BadQuery,
    )
)]
async fn list(
    State(s): State<AppState>,
    ApiQuery(q): ApiQuery<CursorQuery>,
) -> Result<axum::response::Response, AppError> {
    let cursor = q.cursor();
    let page = crate::reads::read!(s, |c| registry::list_page(
        c,
        s.schema(),
        s.settings.lease_ttl,
        cursor
    )
    .await)?;
    Ok(super::paging::answer("/api/workers", cursor, page))
}

async fn fetch(s: &AppState, id: &str) -> Result<WorkerInfo, AppError> {
    crate::reads::read!(s, |c| registry::get(
        c,
        s.schema(),
        id,
        s.settings.lease_ttl
    )
    .await)?
    .ok_or_else(|| AppError::NotFound(format!("no worker with id {id}")))
}

#[utoipa::path(
    get,
    path = "/api/workers/{id}",
    tag = "workers",
    summary = "One worker",
    params(WorkerIdPath),
    responses(
        (status = 200, description = "The worker", body = WorkerInfo),
        BadId,
        (status = 404, description = "No worker with that id", body = ErrorBody),
    )
)]
async fn get_one(
    State(s): State<AppState>,
    WorkerId(id): WorkerId,
) -> Result<Json<WorkerInfo>, AppError> {
    Ok(Json(fetch(&s, id.as_str()).await?))
}

#[utoipa::path(
    post,
    path = "/api/workers",
    tag = "workers",
    summary = "Spawn a simulated worker (operator)",
    description = "One more simulated worker on the instance that answers. Audited with the worker's row.",
    security((), ("admin_token" = [])),
    responses(
        (status = 201, description = "The new worker", body = WorkerInfo),
        Unauthorized,
        (status = 409, description = "The instance is shutting down", body = ErrorBody),
    )
)]
async fn spawn(
    State(s): State<AppState>,
    _: Operator,
) -> Result<(StatusCode, Json<WorkerInfo>), AppError> {
    Ok((StatusCode::CREATED, Json(ops::spawn_worker(&s).await?)))
}

/// The answer to pause and kill: what was done, and the worker's row as the
/// answer is sent (a pause takes effect at the worker's next step, within
/// milliseconds, so the row may still show its previous state).
#[derive(Serialize, utoipa::ToSchema)]
pub struct Done {
    /// What was done.
    message: String,
    /// The worker's row as the answer is sent.
    worker: WorkerInfo,
}

#[utoipa::path(
    post,
    path = "/api/workers/{id}/pause",
    tag = "workers",
    summary = "Pause a simulated worker (operator)",
    description = "Frozen for TTL + 2 s (no ticks, no heartbeats), then it tries to complete its task, which the fencing token refuses if another worker took it over. A worker of another instance is paused through that instance.",
    params(WorkerIdPath),
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "Paused", body = Done),
        BadId,
        Unauthorized,
        WorkerNotFound,
        (status = 409, description = "A worker process, or a worker that is not running", body = ErrorBody),
    )
)]
async fn pause(
    State(s): State<AppState>,
    _: Operator,
    WorkerId(id): WorkerId,
) -> Result<Json<Done>, AppError> {
    control(&s, &id, WorkerAction::Pause).await
}

#[utoipa::path(
    post,
    path = "/api/workers/{id}/kill",
    tag = "workers",
    summary = "Kill a simulated worker (operator)",
    description = "Aborted on the spot, nothing completed or released. The instance's liveness session then ends its claim (`session_ended`), so an idle worker takes the task over within a second (without liveness, once the lease runs out). A worker of another instance is killed through that instance.",
    params(WorkerIdPath),
    security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "Killed", body = Done),
        BadId,
        Unauthorized,
        WorkerNotFound,
        (status = 409, description = "A worker process, or a worker that is not running", body = ErrorBody),
    )
)]
async fn kill(
    State(s): State<AppState>,
    _: Operator,
    WorkerId(id): WorkerId,
) -> Result<Json<Done>, AppError> {
    control(&s, &id, WorkerAction::Kill).await
}

async fn control(s: &AppState, id: &Holder, action: WorkerAction) -> Result<Json<Done>, AppError> {
    let message = ops::control_worker(s, id, action).await?;
    Ok(Json(Done {
        message,
        worker: fetch(s, id.as_str()).await?,
    }))
}

/// `PUT /api/workers/{id}`: a worker process reports what it is doing.
#[utoipa::path(
    put,
    path = "/api/workers/{id}",
    tag = "workers",
    summary = "A worker process reports itself",
    params(WorkerIdPath),
    request_body = Report,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 200, description = "Recorded", body = WorkerInfo),
        (status = 400, description = "Bad JSON, a bad id, negative counts", body = ErrorBody),
        (status = 409, description = "A simulated worker's id, or a stale report after the worker stopped (a new run sends `fresh: true` first)", body = ErrorBody),
        NeedsCredential,
        TooLarge,
        NotJson,
    )
)]
async fn report(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    WorkerId(id): WorkerId,
    JsonBody(body): JsonBody<Report>,
) -> Result<Json<WorkerInfo>, AppError> {
    if body.tasks_done < 0 || body.tasks_abandoned < 0 {
        return Err(AppError::BadRequest(
            "tasks_done and tasks_abandoned must not be negative".into(),
        ));
    }
    registry::record(
        &mut *s.pool.acquire().await?,
        s.schema(),
        &id,
        WorkerKind::Http,
        None,
        &body,
        s.settings.lease_ttl,
    )
    .await?
    .map(Json)
    .ok_or_else(|| {
        AppError::Conflict(format!(
            "worker {id} is a simulated worker, or was marked crashed or stopped; \
             a new run must send fresh: true first"
        ))
    })
}

/// How often a session stream carries a keep-alive: the instance finds a
/// closed connection at its second write after the close, so a worker
/// process that died is found within about twice this.
const SESSION_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_millis(200);

/// What a worker process sends to open its session stream (nothing yet:
/// its id is the path's).
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenSession {}

/// `POST /api/workers/{id}/session`: a worker process's liveness, carried
/// by one open answer (see [`crate::worker::fleet::Fleet::open_stream`]).
#[utoipa::path(
    post,
    path = "/api/workers/{id}/session",
    tag = "workers",
    summary = "A worker process's session stream",
    description = "An endless `text/event-stream` kept open by a worker process (`leasekeeper worker`): `ready` (data: this instance's id) once this instance's liveness session vouches for the worker as a new term (whatever the worker held before, through an earlier stream, is ended first), then a keep-alive comment every 200 ms. While it is open a crash of this instance rescues the worker's claims within a second; when it closes (the process died), the worker's live claims are ended at once and an idle worker takes them over. A worker whose stream broke gives up its claims and opens a new one. On an instance without liveness (behind a transaction pooler) the stream opens but promises nothing: the TTL rules. 409 for a simulated or embedded worker's id or an instance's or runtime's own id (adopting a name ends what it holds); 503 while this instance's liveness session is not registered (the worker tries again).",
    params(WorkerIdPath),
    request_body = OpenSession,
    security((), ("worker_token" = []), ("admin_token" = [])),
    responses(
        (status = 200, description = "An endless `text/event-stream`", content_type = "text/event-stream", body = super::events::StreamEvent),
        (status = 400, description = "Bad JSON or a bad id", body = ErrorBody),
        (status = 409, description = "A simulated or embedded worker's id, an instance's or a runtime's id, or the instance is shutting down", body = ErrorBody),
        (status = 503, description = "This instance's liveness session is not registered now", body = ErrorBody),
        NeedsCredential,
        TooLarge,
        NotJson,
    )
)]
async fn session(
    State(s): State<AppState>,
    _: crate::auth::WorkerCredential,
    WorkerId(id): WorkerId,
    JsonBody(OpenSession {}): JsonBody<OpenSession>,
) -> Result<axum::response::Response, AppError> {
    use axum::response::IntoResponse;
    use axum::response::sse::{Event, KeepAlive, Sse};
    let known = crate::reads::read!(s, |c| registry::get(
        c,
        s.schema(),
        id.as_str(),
        s.settings.lease_ttl
    )
    .await)?;
    if known.is_some_and(|w| w.kind != WorkerKind::Http) {
        return Err(AppError::Conflict(format!(
            "worker {id} is a simulated worker or a service runtime's; \
             a worker process needs an id of its own"
        )));
    }
    // Adopting a name ends whatever it holds: never an instance's or a
    // runtime's own (their singleton terms), whoever asks.
    let process: bool = crate::reads::read!(s, |c| s
        .schema()
        .query_scalar(
            "SELECT EXISTS (SELECT 1 FROM $schema.instances WHERE id = $1)
                 OR EXISTS (SELECT 1 FROM $schema.liveness WHERE instance_id = $1)",
        )
        .bind(id.as_str())
        .fetch_one(&mut *c)
        .await)?;
    if process {
        return Err(AppError::Conflict(format!(
            "{id} is an instance's or a runtime's id; a worker process needs an id of its own"
        )));
    }
    let guard = s.fleet.open_stream(&id).await?;
    let ready = Event::default().event("ready").data(&*s.instance_id);
    let stop = s.live.stopped();
    // The guard lives as long as the answer's body: hyper drops the body
    // when its connection fails, and the guard's drop ends the claims.
    let stream = futures::stream::unfold(
        (Some(ready), guard, stop),
        |(ready, guard, stop)| async move {
            if let Some(ready) = ready {
                return Some((
                    Ok::<_, std::convert::Infallible>(ready),
                    (None, guard, stop),
                ));
            }
            // Nothing more to say but keep-alives, until this instance
            // stops or loses the liveness session that vouched for the
            // worker: then the stream ends (the worker gives its claims up
            // and opens a new one) and the guard goes with the body.
            let mut guard = guard;
            tokio::select! {
                () = stop.cancelled() => {}
                () = guard.ended() => {}
            }
            None
        },
    );
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(SESSION_KEEP_ALIVE))
        .into_response())
}

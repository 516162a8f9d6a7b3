//! Operator actions: force-release, a simulated worker's spawn, pause and
//! kill, an instance's kill. Who may take them is [`crate::auth`]'s
//! question ([`Operator`](crate::auth::Operator) on every route and
//! server function that reaches here). Every action taken is written to
//! `lease_events` as an `operator` row, in the transaction of the action
//! itself.

use crate::error::AppError;
use crate::state::AppState;
use leasekeeper_core::lease::store::record_operator_action;
use leasekeeper_core::lease::{Holder, Lease};
use serde_json::json;
use sqlx::{Connection, PgConnection};

/// [`control::force_release`](leasekeeper_core::queue::control::force_release),
/// with a term that is not live any more answered as a conflict.
pub async fn force_release(
    conn: &mut PgConnection,
    schema: &leasekeeper_core::db::Schema,
    id: i64,
    token: i64,
    by: &str,
) -> Result<Lease, AppError> {
    leasekeeper_core::queue::control::force_release(conn, schema, id, token, by)
        .await?
        .ok_or_else(|| {
            AppError::Conflict(format!(
                "lease {id} has no live term with token {token} (it ended, or another term began); nothing released"
            ))
        })
}

/// Which operator action on a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerAction {
    /// Freeze it past the TTL, then let it try to complete.
    Pause,
    /// Crash it: nothing released, nothing completed.
    Kill,
}

impl WorkerAction {
    /// Parses `pause` or `kill`.
    pub fn parse(raw: &str) -> Result<WorkerAction, AppError> {
        match raw {
            "pause" => Ok(WorkerAction::Pause),
            "kill" => Ok(WorkerAction::Kill),
            other => Err(AppError::BadRequest(format!(
                "action must be pause or kill, got {other:?}"
            ))),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            WorkerAction::Pause => "pause",
            WorkerAction::Kill => "kill",
        }
    }
}

/// Spawns a simulated worker on this instance, recorded as an operator
/// action in the transaction that records the worker.
pub async fn spawn_worker(
    state: &AppState,
) -> Result<leasekeeper_core::worker::WorkerInfo, AppError> {
    Ok(state.fleet.spawn_by(&state.instance_id).await?)
}

/// Pauses or kills simulated worker `id`: here when this instance runs it,
/// else through the instance that does (any instance's dashboard controls
/// every instance's workers). Answers what was done.
pub async fn control_worker(
    state: &AppState,
    id: &Holder,
    action: WorkerAction,
) -> Result<String, AppError> {
    let id = id.as_str();
    if !state.fleet.running().iter().any(|w| w == id) {
        let worker = leasekeeper_core::worker::registry::get(
            &mut *state.pool.acquire().await?,
            state.schema(),
            id,
            state.settings.lease_ttl,
        )
        .await?
        .ok_or_else(|| AppError::NotFound(format!("no worker with id {id}")))?;
        if let Some(why) = gone(state, &worker).await? {
            return Err(AppError::Conflict(format!(
                "worker {id} is not running ({why}); nothing to {}",
                action.as_str()
            )));
        }
        let owner = match (worker.kind, worker.instance_id.as_deref()) {
            (leasekeeper_core::worker::WorkerKind::Simulated, Some(owner))
                if owner != &*state.instance_id =>
            {
                owner
            }
            (leasekeeper_core::worker::WorkerKind::Http, _) => {
                return Err(AppError::Conflict(format!(
                    "worker {id} is a separate `leasekeeper worker` process: stop it where it runs"
                )));
            }
            (leasekeeper_core::worker::WorkerKind::Embedded, _) => {
                return Err(AppError::Conflict(format!(
                    "worker {id} belongs to a service's own runtime: stop it in that service"
                )));
            }
            _ => {
                return Err(AppError::Conflict(format!(
                    "worker {id} is not running (state {}); nothing to {}",
                    worker.state.as_str(),
                    action.as_str()
                )));
            }
        };
        return forward(state, owner, &["api", "workers", id, action.as_str()]).await;
    }
    let message = match action {
        WorkerAction::Pause => {
            // A pause changes no row (the worker freezes in memory), so its
            // audit row goes first, in a transaction that commits only once
            // the pause took effect: a pause that failed leaves no row.
            let mut conn = state.pool.acquire().await?;
            let mut tx = conn.begin().await?;
            record_operator_action(
                &mut tx,
                state.schema(),
                &format!("worker:{id}"),
                &state.instance_id,
                "pause_worker",
                json!({}),
            )
            .await?;
            let frozen = state.fleet.pause(id)?;
            tx.commit().await?;
            format!(
                "worker {id} paused for {:.1} s: no ticks, no heartbeats; then it tries to complete its task",
                frozen.as_secs_f64()
            )
        }
        WorkerAction::Kill => {
            // Crashed row, failover stopwatch and audit row: one transaction.
            state.fleet.kill_by(id, &state.instance_id).await?;
            format!(
                "worker {id} killed: nothing completed or released; its task's lease must run out"
            )
        }
    };
    Ok(message)
}

/// Why `worker`, not run by this instance, cannot be controlled: it is
/// crashed, stopped, silent past its liveness window, or ran on an instance
/// that is dead. `None` when it is alive as far as the database can tell.
async fn gone(
    state: &AppState,
    worker: &leasekeeper_core::worker::WorkerInfo,
) -> Result<Option<String>, AppError> {
    use leasekeeper_core::worker::WorkerState;
    if matches!(worker.state, WorkerState::Crashed | WorkerState::Stopped) {
        return Ok(Some(format!("state {}", worker.state.as_str())));
    }
    if !worker.alive {
        return Ok(Some(format!(
            "silent for {:.0} s: unreachable",
            worker.last_seen_age_ms as f64 / 1000.0
        )));
    }
    let Some(owner) = worker.instance_id.as_deref() else {
        return Ok(None);
    };
    if worker.kind != leasekeeper_core::worker::WorkerKind::Simulated
        || owner == &*state.instance_id
    {
        return Ok(None);
    }
    let window = leasekeeper_core::instance::alive_window(state.settings.renew_interval);
    let instances = leasekeeper_core::instance::store::list(
        &mut *state.pool.acquire().await?,
        state.schema(),
        window,
    )
    .await?;
    Ok(instances
        .into_iter()
        .find(|i| i.id == owner && !i.alive)
        .map(|i| {
            format!(
                "its instance {owner} is dead, silent for {:.0} s, and its workers with it",
                i.last_seen_ms_ago.max(0) as f64 / 1000.0
            )
        }))
}

/// Kills instance `id` like a crash: no lease released, no goodbye, so its
/// generator lease and its workers' task leases must expire and be taken
/// over. This instance exits shortly after answering; another instance is
/// reached through its address.
pub async fn kill_instance(state: &AppState, id: &Holder) -> Result<String, AppError> {
    let id = id.as_str();
    if id != &*state.instance_id {
        let mut conn = state.pool.acquire().await?;
        return match leasekeeper_core::instance::store::is_running(&mut conn, state.schema(), id)
            .await?
        {
            None => Err(AppError::NotFound(format!("no instance with id {id}"))),
            Some(false) => Err(AppError::Conflict(format!(
                "instance {id} has already stopped"
            ))),
            Some(true) => forward(state, id, &["api", "instances", id, "kill"]).await,
        };
    }
    let mut conn = state.pool.acquire().await?;
    // The stopwatch starts on the generator lease and every task lease of
    // this instance's workers; the audit row commits with it, before the
    // process dies.
    let mut tx = conn.begin().await?;
    let mut holders =
        leasekeeper_core::worker::registry::running_ids(&mut tx, state.schema(), id).await?;
    holders.push(id.to_string());
    leasekeeper_core::lease::stopwatch::record_kill(
        &mut tx,
        state.schema(),
        "instance",
        id,
        &holders,
    )
    .await?;
    record_operator_action(
        &mut tx,
        state.schema(),
        &format!("instance:{id}"),
        id,
        "kill_instance",
        json!({}),
    )
    .await?;
    tx.commit().await?;
    tracing::warn!(instance = %id, "killed by an operator: exiting now without releasing anything");
    // Answer first, then die the way a crash does: exit without running the
    // graceful shutdown (no lease released, instance not marked stopped).
    tokio::spawn(async {
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        std::process::exit(137);
    });
    Ok(format!(
        "instance {id} killed: its leases stay held until they expire, then others take over"
    ))
}

/// POSTs the path made of `segments` (each percent-encoded) to instance
/// `owner` (looked up in `instances`) with this instance's admin token, and
/// answers its `message`.
async fn forward(state: &AppState, owner: &str, segments: &[&str]) -> Result<String, AppError> {
    let address = leasekeeper_core::instance::store::address_if_running(
        &mut *state.pool.acquire().await?,
        state.schema(),
        owner,
    )
    .await?
    .ok_or_else(|| AppError::Conflict(format!("instance {owner} is not running")))?;
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .map_err(AppError::internal)?;
    let mut url = reqwest::Url::parse(&format!("http://{address}/")).map_err(|e| {
        AppError::Conflict(format!(
            "instance {owner} has an unusable address {address:?}: {e}"
        ))
    })?;
    url.path_segments_mut()
        .map_err(|()| AppError::internal("an http URL has path segments"))?
        .pop_if_empty()
        .extend(segments);
    let mut req = client.post(url);
    if let Some(token) = &state.settings.admin_token {
        req = req.bearer_auth(token.expose());
    }
    let resp = req.send().await.map_err(|e| {
        AppError::Conflict(format!(
            "instance {owner} did not answer at {address} ({e}); it may already be dead"
        ))
    })?;
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    let text = |key: &str| body.get(key).and_then(|m| m.as_str()).map(str::to_string);
    if status.is_success() {
        Ok(text("message").unwrap_or_else(|| format!("done by instance {owner}")))
    } else {
        let msg = format!(
            "instance {owner} refused: {}",
            text("error").unwrap_or_else(|| status.to_string())
        );
        Err(match status.as_u16() {
            401 => AppError::Unauthorized(msg),
            404 => AppError::NotFound(msg),
            _ => AppError::Conflict(msg),
        })
    }
}

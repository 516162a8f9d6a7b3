//! The workers page: every worker with its state, current task, fencing
//! token and heartbeat age, and buttons to spawn, pause and kill this
//! instance's simulated workers (plain forms before hydration).

use super::common::{ActionOutcome, DataTable, Notice, refresh_tick};
use crate::error::AppError;
use crate::worker::{WorkerInfo, WorkerKind, WorkerState};
use leptos::either::Either;
use leptos::prelude::*;
use serde::{Deserialize, Serialize};

/// The workers, and which instance answered (its simulated workers are the
/// ones this page can pause and kill).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkersView {
    /// Newest first.
    pub workers: Vec<WorkerInfo>,
    /// The instance serving this page.
    pub instance_id: String,
}

/// Every worker, for the dashboard.
#[server(prefix = "/sfn")]
pub async fn get_workers() -> Result<WorkersView, AppError> {
    let state = super::common::state()?;
    let workers =
        crate::worker::registry::list(&mut *state.pool.acquire().await?, state.settings.lease_ttl)
            .await?;
    Ok(WorkersView {
        workers,
        instance_id: state.instance_id.to_string(),
    })
}

/// Spawns a simulated worker on this instance.
#[server(prefix = "/sfn")]
pub async fn spawn_worker() -> Result<String, AppError> {
    let state = super::common::operator_state().await?;
    let worker = crate::ops::spawn_worker(&state).await?;
    Ok(format!("spawned {}", worker.id))
}

/// Pauses (`"pause"`) or kills (`"kill"`) simulated worker `id`, of this
/// instance or (through it) of another.
#[server(prefix = "/sfn")]
pub async fn control_worker(id: String, action: String) -> Result<String, AppError> {
    let action = crate::ops::WorkerAction::parse(&action).map_err(super::common::refused)?;
    let id = crate::lease::Holder::parse(id)
        .map_err(|e| super::common::refused(AppError::BadRequest(format!("worker id: {e}"))))?;
    let state = super::common::operator_state().await?;
    crate::ops::control_worker(&state, &id, action)
        .await
        .map_err(super::common::refused)
}

fn state_badge(state: WorkerState) -> &'static str {
    match state {
        WorkerState::Idle => "bg-slate-200 text-slate-700",
        WorkerState::Working => "bg-sky-100 text-sky-800",
        WorkerState::Paused => "bg-amber-100 text-amber-800",
        WorkerState::Crashed => "bg-red-100 text-red-800",
        WorkerState::Stopped => "bg-slate-100 text-slate-500",
    }
}

/// The workers page.
#[component]
pub fn WorkersPage() -> impl IntoView {
    let spawn = ServerAction::<SpawnWorker>::new();
    let control = ServerAction::<ControlWorker>::new();
    let tick = refresh_tick();
    let workers = Resource::new(
        move || (tick.get(), spawn.version().get(), control.version().get()),
        |_| get_workers(),
    );
    view! {
        <div class="flex flex-wrap items-end justify-between gap-4">
            <div>
                <h1 class="text-2xl font-semibold">"Workers"</h1>
                <p class="text-sm text-slate-600">
                    "Kill = crash: no release, the task's lease must run out and another worker takes it over. Pause = freeze past the TTL, then try to complete: the fencing token refuses it."
                </p>
            </div>
            <ActionForm action=spawn>
                <button type="submit" class="rounded bg-indigo-600 px-3 py-1 text-sm font-medium text-white hover:bg-indigo-700" data-testid="worker-spawn">
                    "Spawn a worker"
                </button>
            </ActionForm>
        </div>
        <ActionOutcome last=Signal::derive(move || control.value().get().or_else(|| spawn.value().get())) prefix="worker"/>
        <Transition fallback=|| view! { <p class="mt-4 text-sm text-slate-500">"Loading workers…"</p> }>
            {move || Suspend::new(async move {
                match workers.await {
                    Ok(v) if v.workers.is_empty() => Either::Left(view! {
                        <Notice kind="empty" testid="workers-empty" text="No workers. Spawn one here, or run `leasekeeper worker --server http://127.0.0.1:3000`.".to_string()/>
                    }),
                    Ok(v) => Either::Right(Either::Left(view! { <WorkerTable view=v control/> })),
                    Err(e) => Either::Right(Either::Right(view! {
                        <Notice kind="error" testid="workers-error" text=format!("Cannot load workers: {e}. The page retries on the next change, and every few seconds.")/>
                    })),
                }
            })}
        </Transition>
        <super::failover::Stopwatch/>
    }
}

#[component]
fn WorkerTable(view: WorkersView, control: ServerAction<ControlWorker>) -> impl IntoView {
    let here = view.instance_id;
    view! {
        <DataTable testid="workers-table" headers=vec!["worker", "kind", "instance", "state", "task", "token", "heartbeat age", "done / abandoned", "controls"]>
            {view
                .workers
                .into_iter()
                .map(|w| {
                    let controllable = w.kind == WorkerKind::Simulated
                        && matches!(w.state, WorkerState::Idle | WorkerState::Working | WorkerState::Paused);
                    let age = w
                        .heartbeat_age_ms
                        .filter(|_| w.state == WorkerState::Working || w.state == WorkerState::Paused)
                        .map(|ms| format!("{:.1} s", ms as f64 / 1000.0))
                        .unwrap_or_default();
                    let (pause_id, kill_id) = (w.id.clone(), w.id.clone());
                    view! {
                        <tr class="border-t border-slate-100" data-testid="worker-row" data-worker=w.id.clone()
                            data-state=w.state.as_str() data-task=w.task_id.map(|t| t.to_string()).unwrap_or_default()>
                            <td class="px-3 py-2 font-mono">{w.id.clone()}</td>
                            <td class="px-3 py-2">{w.kind.as_str()}</td>
                            <td class="px-3 py-2 font-mono text-xs" data-testid="worker-instance">
                                {w.instance_id.clone().unwrap_or_default()}
                                {(w.instance_id.as_deref() == Some(here.as_str())).then_some(" (this one)")}
                            </td>
                            <td class="px-3 py-2">
                                <span class=format!("rounded px-2 py-0.5 text-xs font-medium {}", state_badge(w.state)) data-testid="worker-state">
                                    {w.state.as_str()}
                                </span>
                            </td>
                            <td class="px-3 py-2">
                                {w.task_id.map(|t| view! { <a class="text-indigo-700 underline" href=format!("/tasks?id={t}")>{t}</a> })}
                            </td>
                            <td class="px-3 py-2 font-mono">{w.fencing_token.map(|t| t.to_string()).unwrap_or_default()}</td>
                            <td class="px-3 py-2 tabular-nums" data-testid="worker-heartbeat-age">{age}</td>
                            <td class="px-3 py-2 tabular-nums">{format!("{} / {}", w.tasks_done, w.tasks_abandoned)}</td>
                            <td class="px-3 py-2">
                                {controllable.then(|| view! {
                                    <div class="flex gap-2">
                                        <ActionForm action=control>
                                            <input type="hidden" name="id" value=pause_id/>
                                            <input type="hidden" name="action" value="pause"/>
                                            <button type="submit" class="rounded bg-amber-500 px-2 py-0.5 text-xs font-medium text-white hover:bg-amber-600" data-testid="worker-pause">"Pause"</button>
                                        </ActionForm>
                                        <ActionForm action=control>
                                            <input type="hidden" name="id" value=kill_id/>
                                            <input type="hidden" name="action" value="kill"/>
                                            <button type="submit" class="rounded bg-red-600 px-2 py-0.5 text-xs font-medium text-white hover:bg-red-700" data-testid="worker-kill">"Kill"</button>
                                        </ActionForm>
                                    </div>
                                })}
                            </td>
                        </tr>
                    }
                })
                .collect_view()}
        </DataTable>
    }
}

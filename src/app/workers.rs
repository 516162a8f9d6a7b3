//! The workers page: every worker with its state, current task, fencing
//! token and heartbeat age, and buttons to spawn, pause and kill this
//! instance's simulated workers (plain forms before hydration).

use super::live::refresh_tick;
use super::widgets::{ActionOutcome, DataTable, FilterPills, Notice, controls_class};
use crate::error::AppError;
use leasekeeper_core::worker::{WorkerInfo, WorkerKind, WorkerState};
use leptos::either::Either;
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

/// The workers, and which instance answered (its simulated workers are the
/// ones this page can pause and kill).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkersView {
    /// Newest first.
    pub workers: Vec<WorkerInfo>,
    /// The instance serving this page.
    pub instance_id: String,
    /// Instances not alive (found dead, or stopped): their
    /// simulated workers died with them, even while the workers' own rows
    /// are still within their liveness window.
    pub dead_instances: Vec<String>,
    /// Workers of this page left out by the filter.
    pub hidden: usize,
    /// The cursor of the next (older) page; `None` on the last.
    pub next: Option<i64>,
}

/// Which workers the page lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum WorkerFilter {
    /// Alive workers, and those gone in the last two minutes: long enough
    /// to see what a kill did, short enough that chaos crashes do not pile
    /// up.
    #[default]
    Current,
    /// Alive workers (idle, working or paused, and reporting).
    Alive,
    /// Crashed, stopped and unreachable workers.
    Gone,
    /// Every worker.
    All,
}

impl WorkerFilter {
    /// The filter's name in `?show=`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerFilter::Current => "current",
            WorkerFilter::Alive => "alive",
            WorkerFilter::Gone => "gone",
            WorkerFilter::All => "all",
        }
    }

    /// The filter named `raw`.
    pub fn parse(raw: &str) -> Option<WorkerFilter> {
        [
            WorkerFilter::Current,
            WorkerFilter::Alive,
            WorkerFilter::Gone,
            WorkerFilter::All,
        ]
        .into_iter()
        .find(|f| f.as_str() == raw)
    }
}

/// The workers `filter` selects from a page of the workers (newest first,
/// below `before`), for the dashboard.
#[server(prefix = "/sfn")]
pub async fn get_workers(
    filter: WorkerFilter,
    before: Option<i64>,
) -> Result<WorkersView, AppError> {
    let state = super::context::state()?;
    crate::reads::read!(state, |conn| -> Result<_, AppError> {
        let page = leasekeeper_core::worker::registry::list_page(
            &mut *conn,
            state.schema(),
            state.settings.lease_ttl,
            leasekeeper_core::paging::Cursor::new(before, None),
        )
        .await?;
        let (all, next) = (page.items, page.next);
        let window = leasekeeper_core::instance::alive_window(state.settings.renew_interval);
        let dead_instances = leasekeeper_core::instance::dead_ids(
            &leasekeeper_core::instance::store::list(&mut *conn, state.schema(), window).await?,
        );
        // How long a gone worker stays in the `current` list.
        const RECENTLY_GONE_MS: i64 = 120_000;
        let total = all.len();
        let workers: Vec<WorkerInfo> = all
            .into_iter()
            .filter(|w| match filter {
                WorkerFilter::Current => {
                    w.alive_given(&dead_instances) || w.last_seen_age_ms < RECENTLY_GONE_MS
                }
                WorkerFilter::Alive => w.alive_given(&dead_instances),
                WorkerFilter::Gone => !w.alive_given(&dead_instances),
                WorkerFilter::All => true,
            })
            .collect();
        Ok(WorkersView {
            hidden: total - workers.len(),
            next,
            workers,
            instance_id: state.instance_id.to_string(),
            dead_instances,
        })
    })
    .map_err(super::context::refused)
}

/// Spawns a simulated worker on this instance.
#[server(prefix = "/sfn")]
pub async fn spawn_worker() -> Result<String, AppError> {
    let state = super::context::operator_state().await?;
    let worker = crate::ops::spawn_worker(&state).await?;
    Ok(format!("spawned {}", worker.id))
}

/// Pauses (`"pause"`) or kills (`"kill"`) simulated worker `id`, of this
/// instance or (through it) of another.
#[server(prefix = "/sfn")]
pub async fn control_worker(id: String, action: String) -> Result<String, AppError> {
    let action = crate::ops::WorkerAction::parse(&action).map_err(super::context::refused)?;
    let id = leasekeeper_core::lease::Holder::parse(id)
        .map_err(|e| super::context::refused(AppError::BadRequest(format!("worker id: {e}"))))?;
    let state = super::context::operator_state().await?;
    crate::ops::control_worker(&state, &id, action)
        .await
        .map_err(super::context::refused)
}

/// What the page calls a worker's state: its own report while it is alive;
/// `unreachable` once it (or its instance) stopped reporting without saying
/// it crashed or stopped.
fn shown_state(w: &WorkerInfo, alive: bool) -> &'static str {
    match w.state {
        WorkerState::Idle | WorkerState::Working | WorkerState::Paused if !alive => "unreachable",
        state => state.as_str(),
    }
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
    let query = use_query_map();
    let filter = Memo::new(move |_| {
        query
            .read()
            .get("show")
            .and_then(|s| WorkerFilter::parse(&s))
            .unwrap_or_default()
    });
    let before = super::widgets::before_param();
    let workers = Resource::new(
        move || {
            (
                filter.get(),
                before.get(),
                tick.get(),
                spawn.version().get(),
                control.version().get(),
            )
        },
        |(filter, before, ..)| get_workers(filter, before),
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
        <super::widgets::FencingTokenNote/>
        <FilterPills
            path="/workers"
            param="show"
            values=vec!["current", "alive", "gone", "all"]
            selected=Signal::derive(move || filter.get().as_str())
            testid="worker-filters"
            label="Filter workers: current (alive, and gone in the last two minutes), alive, gone (crashed, stopped, unreachable) or all"
        />
        <ActionOutcome last=Signal::derive(move || control.value().get().or_else(|| spawn.value().get())) prefix="worker"/>
        <Transition fallback=|| view! { <p class="mt-4 text-sm text-slate-500">"Loading workers…"</p> }>
            {move || Suspend::new(async move {
                match workers.await {
                    Ok(v) if v.workers.is_empty() => {
                        let text = if v.hidden > 0 {
                            format!("No {} workers ({} others: see all).", filter.get_untracked().as_str(), v.hidden)
                        } else {
                            "No workers. Spawn one here, or run `leasekeeper worker --server http://127.0.0.1:3000`.".to_string()
                        };
                        let base = format!("/workers?show={}", filter.get_untracked().as_str());
                        Either::Left(view! {
                            <Notice kind="empty" testid="workers-empty" text/>
                            <super::widgets::Pager base before=before.get_untracked() next=v.next testid="workers-pager"/>
                        })
                    }
                    Ok(v) => Either::Right(Either::Left(view! {
                        <super::widgets::Pager base=format!("/workers?show={}", filter.get_untracked().as_str()) before=before.get_untracked() next=v.next testid="workers-pager"/>
                        {(v.hidden > 0).then(|| view! {
                            <p class="mt-2 text-xs text-slate-500" data-testid="workers-hidden">
                                {format!("{} other workers not shown by this filter.", v.hidden)}
                            </p>
                        })}
                        <WorkerTable view=v control/>
                    })),
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
    let dead = view.dead_instances;
    view! {
        <DataTable testid="workers-table" headers=vec!["worker", "kind", "instance", "state", "task", "token", "heartbeat age", "done / abandoned", "controls"]>
            {view
                .workers
                .into_iter()
                .map(|w| {
                    let alive = w.alive_given(&dead);
                    let shown = shown_state(&w, alive);
                    let badge = if alive { state_badge(w.state) } else { state_badge(WorkerState::Crashed) };
                    let controllable = alive
                        && w.kind == WorkerKind::Simulated
                        && matches!(w.state, WorkerState::Idle | WorkerState::Working | WorkerState::Paused);
                    let age = w
                        .heartbeat_age_ms
                        .filter(|_| alive && (w.state == WorkerState::Working || w.state == WorkerState::Paused))
                        .map(|ms| format!("{:.1} s", ms as f64 / 1000.0))
                        .unwrap_or_default();
                    let gone_why = (!alive && shown == "unreachable").then(|| {
                        match w.instance_id.as_ref().filter(|i| dead.contains(i)) {
                            Some(i) => format!("its instance {i} is dead"),
                            None => format!("silent for {:.0} s", w.last_seen_age_ms as f64 / 1000.0),
                        }
                    });
                    let (pause_id, kill_id) = (w.id.clone(), w.id.clone());
                    view! {
                        <tr class="border-t border-slate-100" data-testid="worker-row" data-worker=w.id.clone()
                            data-state=shown data-alive=alive.to_string() data-task=w.task_id.map(|t| t.to_string()).unwrap_or_default()>
                            <td class="px-3 py-2 font-mono">{w.id.clone()}</td>
                            <td class="px-3 py-2">{w.kind.as_str()}</td>
                            <td class="px-3 py-2 font-mono text-xs" data-testid="worker-instance">
                                {w.instance_id.clone().unwrap_or_default()}
                                {(w.instance_id.as_deref() == Some(here.as_str())).then_some(" (this one)")}
                            </td>
                            <td class="px-3 py-2">
                                <span class=format!("rounded px-2 py-0.5 text-xs font-medium {badge}") data-testid="worker-state" title=gone_why.clone()>
                                    {shown}
                                </span>
                                {gone_why.map(|why| view! { <span class="ml-1 text-xs text-slate-500" data-testid="worker-gone-why">{why}</span> })}
                            </td>
                            <td class="px-3 py-2">
                                {w.task_id.map(|t| view! { <a class="text-indigo-700 underline" href=format!("/tasks?id={t}")>{t}</a> })}
                            </td>
                            <td class="px-3 py-2 font-mono">{w.fencing_token.map(|t| t.to_string()).unwrap_or_default()}</td>
                            <td class="px-3 py-2 tabular-nums" data-testid="worker-heartbeat-age">{age}</td>
                            <td class="px-3 py-2 tabular-nums">{format!("{} / {}", w.tasks_done, w.tasks_abandoned)}</td>
                            <td class=controls_class("controls", "px-3 py-2 bg-white")>
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

//! The queues page: one row per queue with its figures (paused or not,
//! pending, started, failed, the oldest due task's wait, completions in the
//! last minute, workers on it), live; a depth and throughput chart per
//! queue; pause and resume; each queue's limits (shown with its busiest
//! concurrency keys, live) and a form to change them.
//!
//! The charts draw what this page has seen since it opened: every refresh
//! (each announced change, or the fallback poll) adds a point per queue,
//! up to [`POINTS`]. No history is stored for them.

use super::live::refresh_tick;
use super::time::relative;
use super::widgets::{ActionOutcome, DataTable, Notice, controls_class};
use crate::error::AppError;
use leasekeeper_core::queue::queues::QueueInfo;
use leptos::either::Either;
use leptos::prelude::*;
use std::collections::{HashMap, VecDeque};

/// How many points each queue's chart keeps.
const POINTS: usize = 60;

/// Every queue with its figures.
#[server(prefix = "/sfn")]
pub async fn get_queues() -> Result<Vec<QueueInfo>, AppError> {
    let state = super::context::state()?;
    crate::reads::read!(state, |conn| -> Result<_, AppError> {
        Ok(leasekeeper_core::queue::queues::list(&mut *conn, state.schema()).await?)
    })
    .map_err(super::context::refused)
}

/// `pause` or `resume` queue `name`; answers what was done.
#[server(prefix = "/sfn")]
pub async fn control_queue(name: String, action: String) -> Result<String, AppError> {
    use leasekeeper_core::queue::queues;
    queues::check(&name).map_err(|e| super::context::refused(AppError::from(e)))?;
    let paused = match action.as_str() {
        "pause" => true,
        "resume" => false,
        other => {
            return Err(super::context::refused(AppError::BadRequest(format!(
                "action must be pause or resume, got {other:?}"
            ))));
        }
    };
    let state = super::context::operator_state().await?;
    let mut conn = state.pool.acquire().await?;
    queues::set_paused(&mut conn, state.schema(), &name, paused, &state.instance_id)
        .await
        .map_err(|e| super::context::refused(AppError::from(e)))?;
    Ok(format!(
        "{} {name}",
        if paused { "paused" } else { "resumed" }
    ))
}

/// Sets queue `name`'s limits from the form's fields (each empty to clear
/// it); answers what was done. A bad value is refused naming its field,
/// by the same check as `PUT /api/queues/{name}/limits`.
#[server(prefix = "/sfn")]
pub async fn set_queue_limits(
    name: String,
    max_started: String,
    max_started_per_key: String,
    rate_per_second: String,
    rate_burst: String,
) -> Result<String, AppError> {
    use leasekeeper_core::queue::queue_limits::QueueLimits;
    use leasekeeper_core::queue::queues;
    queues::check(&name).map_err(|e| super::context::refused(AppError::from(e)))?;
    // A field as JSON: empty is null, a number is a number, anything else
    // stays text for the check to refuse by name.
    let field = |text: &str| {
        let text = text.trim();
        if text.is_empty() {
            serde_json::Value::Null
        } else {
            text.parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(serde_json::Value::Number)
                .unwrap_or_else(|| serde_json::Value::String(text.to_string()))
        }
    };
    let body = serde_json::json!({
        "max_started": field(&max_started),
        "max_started_per_key": field(&max_started_per_key),
        "rate_per_second": field(&rate_per_second),
        "rate_burst": field(&rate_burst),
    });
    let limits = QueueLimits::from_json(&body)
        .map_err(|e| super::context::refused(AppError::BadRequest(e.reason)))?;
    let state = super::context::operator_state().await?;
    let mut conn = state.pool.acquire().await?;
    queues::set_limits(
        &mut conn,
        state.schema(),
        &name,
        &limits,
        &state.instance_id,
    )
    .await
    .map_err(|e| super::context::refused(AppError::from(e)))?;
    Ok(format!("limits of {name}: {}", describe(&limits)))
}

/// A queue's limits in words: `at most 4 started, 2 per key, 50/s (burst
/// 10)`, or `none`.
pub fn describe(limits: &leasekeeper_core::queue::queue_limits::QueueLimits) -> String {
    let mut parts = Vec::new();
    if let Some(n) = limits.max_started {
        parts.push(format!("at most {n} started"));
    }
    if let Some(n) = limits.max_started_per_key {
        parts.push(format!("{n} per key"));
    }
    if let Some(rate) = limits.rate_per_second {
        parts.push(format!("{rate}/s (burst {})", limits.burst().unwrap_or(1)));
    }
    if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join(", ")
    }
}

/// One point of a queue's chart: its pending tasks and its completions in
/// the last minute, when the page last refreshed.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Point {
    depth: i64,
    completed: i64,
}

/// The points each queue's chart has, by queue.
type History = HashMap<String, VecDeque<Point>>;

fn record(history: &mut History, queues: &[QueueInfo]) {
    for q in queues {
        let points = history.entry(q.name.clone()).or_default();
        points.push_back(Point {
            depth: q.pending,
            completed: q.completed_last_minute,
        });
        while points.len() > POINTS {
            points.pop_front();
        }
    }
}

/// The queues page.
#[component]
pub fn QueuesPage() -> impl IntoView {
    let tick = refresh_tick();
    let control = ServerAction::<ControlQueue>::new();
    let limits = ServerAction::<SetQueueLimits>::new();
    let rows = Resource::new(
        move || (tick.get(), control.version().get(), limits.version().get()),
        |_| get_queues(),
    );
    let history = RwSignal::new(History::new());
    view! {
        <h1 class="text-xl font-semibold">"Queues"</h1>
        <p class="text-sm text-slate-600">
            "A queue exists from its first task. A pause is effective at the next claim, in the database: no worker of any instance claims a task of a paused queue, while the tasks already started finish normally. A resume wakes idle workers at once. Limits cap a queue's started tasks (in all, and per concurrency key) and its claims per second across every instance, exactly: the claim enforces them in the database, and a limited queue serves its keys fairly. Pause, resume and limits are operator actions, recorded in the audit."
        </p>
        <ActionOutcome last=Signal::derive(move || control.value().get()) prefix="queue"/>
        <ActionOutcome last=Signal::derive(move || limits.value().get()) prefix="limits"/>
        <Transition fallback=|| view! { <p class="mt-4 text-sm text-slate-500">"Loading queues…"</p> }>
            {move || Suspend::new(async move {
                match rows.await {
                    Ok(queues) if queues.is_empty() => Either::Left(view! {
                        <Notice kind="empty" testid="queues-empty" text="No queue yet: a queue appears with its first task.".to_string()/>
                    }),
                    Ok(queues) => {
                        history.update(|h| record(h, &queues));
                        Either::Right(Either::Left(view! { <QueueTable queues control history/> }))
                    }
                    Err(e) => Either::Right(Either::Right(view! {
                        <Notice kind="error" testid="queues-error" text=format!("Cannot load queues: {e}. The page retries on the next change, and every few seconds.")/>
                    })),
                }
            })}
        </Transition>
        <LimitsForm action=limits/>
    }
}

#[component]
fn QueueTable(
    queues: Vec<QueueInfo>,
    control: ServerAction<ControlQueue>,
    history: RwSignal<History>,
) -> impl IntoView {
    view! {
        <DataTable testid="queues-table" headers=vec!["queue", "state", "pending", "started", "failed", "oldest due", "done / min", "workers", "depth and throughput", "limits", "controls"]>
            {queues
                .into_iter()
                .map(|queue| view! { <QueueLine queue control history/> })
                .collect_view()}
        </DataTable>
    }
}

#[component]
fn QueueLine(
    queue: QueueInfo,
    control: ServerAction<ControlQueue>,
    history: RwSignal<History>,
) -> impl IntoView {
    let q = queue;
    let (action, label, class) = if q.paused {
        ("resume", "Resume", "bg-emerald-600 hover:bg-emerald-700")
    } else {
        ("pause", "Pause", "bg-amber-600 hover:bg-amber-700")
    };
    let state_class = if q.paused {
        "bg-amber-100 text-amber-800"
    } else {
        "bg-emerald-100 text-emerald-800"
    };
    let points: Vec<Point> = history
        .with_untracked(|h| h.get(&q.name).map(|p| p.iter().copied().collect()))
        .unwrap_or_default();
    let form_name = q.name.clone();
    let cell = |testid: &'static str, n: i64| {
        view! { <td class="px-3 py-2 tabular-nums" data-testid=testid>{n}</td> }
    };
    view! {
        <tr class="border-t border-slate-100 align-top" data-testid="queue-row" data-queue=q.name.clone() data-paused=q.paused.to_string()>
            <td class="px-3 py-2 font-mono font-semibold" data-testid="queue-name">{q.name.clone()}</td>
            <td class="px-3 py-2">
                <span class=format!("rounded px-2 py-0.5 text-xs font-medium {state_class}") data-testid="queue-state">
                    {if q.paused { "paused" } else { "running" }}
                </span>
            </td>
            {cell("queue-pending", q.pending)}
            {cell("queue-started", q.started)}
            {cell("queue-failed", q.failed)}
            <td class="px-3 py-2 tabular-nums" data-testid="queue-oldest">
                // An age (how long it has waited), so in the past: "… ago".
                {q.oldest_pending_age_ms.map(|ms| relative(-ms)).unwrap_or_else(|| "—".to_string())}
            </td>
            {cell("queue-completed", q.completed_last_minute)}
            {cell("queue-workers", q.workers)}
            <td class="px-3 py-2"><QueueChart points/></td>
            <td class="px-3 py-2"><QueueLimitsCell queue=q.clone()/></td>
            <td class=controls_class("controls", "px-3 py-2 bg-white")>
                <ActionForm action=control>
                    <input type="hidden" name="name" value=form_name/>
                    <input type="hidden" name="action" value=action/>
                    <button type="submit" class=format!("rounded px-2 py-0.5 text-xs font-medium text-white {class}") data-testid=format!("queue-{action}")>{label}</button>
                </ActionForm>
            </td>
        </tr>
    }
}

/// Pending tasks (a slate line) and completions in the last minute (a green
/// line), each scaled to its own peak, over the points this page has seen.
#[component]
fn QueueChart(points: Vec<Point>) -> impl IntoView {
    const WIDTH: f64 = 120.0;
    const HEIGHT: f64 = 28.0;
    let line = |value: fn(&Point) -> i64| {
        let peak = points.iter().map(value).max().unwrap_or(0).max(1) as f64;
        let step = WIDTH / (POINTS - 1) as f64;
        let start = POINTS.saturating_sub(points.len());
        points
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let x = (start + i) as f64 * step;
                let y = HEIGHT - 1.0 - value(p) as f64 / peak * (HEIGHT - 2.0);
                format!("{x:.1},{y:.1}")
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let depth = line(|p| p.depth);
    let done = line(|p| p.completed);
    let title = points
        .last()
        .map(|p| {
            format!(
                "{} pending, {} done in the last minute",
                p.depth, p.completed
            )
        })
        .unwrap_or_default();
    view! {
        <svg viewBox=format!("0 0 {WIDTH} {HEIGHT}") preserveAspectRatio="none" class="h-8 w-32 rounded bg-slate-50" role="img"
            aria-label="Pending tasks and completions per minute over time" data-testid="queue-chart" data-points=points.len()>
            <title>{title}</title>
            <polyline points=depth fill="none" class="stroke-slate-500" stroke-width="1.5" data-testid="queue-chart-depth"/>
            <polyline points=done fill="none" class="stroke-emerald-500" stroke-width="1.5" data-testid="queue-chart-throughput"/>
        </svg>
    }
}

/// A queue's limits and its busiest keys (started tasks per key, live).
#[component]
fn QueueLimitsCell(queue: QueueInfo) -> impl IntoView {
    let keys = queue
        .busiest_keys
        .iter()
        .map(|k| format!("{} {}", k.key, k.started))
        .collect::<Vec<_>>()
        .join(", ");
    view! {
        <div class="min-w-40 text-xs" data-testid="queue-limits" data-limited=queue.limits.any().to_string()>
            <span data-testid="queue-limits-text">{describe(&queue.limits)}</span>
            {(!keys.is_empty()).then(|| view! {
                <div class="mt-1 text-slate-500">"busiest keys: "<span class="font-mono" data-testid="queue-busiest-keys">{keys}</span></div>
            })}
        </div>
    }
}

/// The form that sets a queue's limits: outside the live table, so a
/// refresh does not take what is being typed.
#[component]
fn LimitsForm(action: ServerAction<SetQueueLimits>) -> impl IntoView {
    let input = |name: &'static str, label: &'static str, width: &'static str| {
        view! {
            <label class="flex flex-col text-xs text-slate-600">
                {label}
                <input type="text" name=name placeholder="none"
                    class=format!("{width} rounded border border-slate-300 px-2 py-1 font-mono text-sm") data-testid=format!("limits-{name}")/>
            </label>
        }
    };
    view! {
        <section class="mt-6 rounded border border-slate-200 bg-white p-4" data-testid="limits-form">
            <h2 class="text-sm font-semibold">"Set a queue's limits"</h2>
            <p class="mt-1 text-xs text-slate-600">
                "Each field empty clears that limit. Max started and per key: 1 to 100,000; per second: 0.000001 to 1,000,000; burst: 1 to 1,000,000 (one second's worth when empty). A new limit binds the next claim; tasks already started finish."
            </p>
            <ActionForm action>
                <div class="mt-2 flex flex-wrap items-end gap-3">
                    {input("name", "queue", "w-40")}
                    {input("max_started", "max started", "w-24")}
                    {input("max_started_per_key", "max started per key", "w-24")}
                    {input("rate_per_second", "per second", "w-24")}
                    {input("rate_burst", "burst", "w-24")}
                    <button type="submit" class="rounded bg-slate-700 px-3 py-1 text-sm font-medium text-white hover:bg-slate-800" data-testid="limits-save">"Save limits"</button>
                </div>
            </ActionForm>
        </section>
    }
}

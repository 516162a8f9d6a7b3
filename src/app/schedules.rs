//! The schedules page: every schedule with its cron in words, the next
//! tick counting down, paused or not, its last ticks (who fired each under
//! which token, and how late), pause, resume, trigger-now and delete; and
//! the ownership timeline of `singleton:scheduler`, the lease whose holder
//! fires them all.

use super::live::refresh_tick;
use super::time::{LocalTime, relative, remaining};
use super::widgets::{ActionOutcome, DataTable, Notice, controls_class};
use crate::error::AppError;
use leasekeeper_core::schedule::{Schedule, Tick};
use leptos::either::Either;
use leptos::prelude::*;

/// How many of each schedule's ticks the page shows.
#[cfg(feature = "ssr")]
pub const TICKS_SHOWN: i64 = 5;

/// A schedule and its last ticks, newest first.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScheduleRow {
    /// The schedule.
    pub schedule: Schedule,
    /// Its newest ticks.
    pub ticks: Vec<Tick>,
}

/// Every schedule with its last ticks.
#[server(prefix = "/sfn")]
pub async fn get_schedules() -> Result<Vec<ScheduleRow>, AppError> {
    use leasekeeper_core::schedule::store;
    let state = super::context::state()?;
    crate::reads::read!(state, |conn| -> Result<_, AppError> {
        let mut rows = Vec::new();
        for schedule in store::list(&mut *conn, state.schema()).await? {
            let cursor = leasekeeper_core::paging::Cursor::new(None, Some(TICKS_SHOWN));
            let ticks = store::ticks(&mut *conn, state.schema(), &schedule.name, cursor)
                .await?
                .map(|page| page.items)
                .unwrap_or_default();
            rows.push(ScheduleRow { schedule, ticks });
        }
        Ok(rows)
    })
    .map_err(super::context::refused)
}

/// `pause`, `resume`, `trigger` or `delete` schedule `name`; answers what
/// was done.
#[server(prefix = "/sfn")]
pub async fn control_schedule(name: String, action: String) -> Result<String, AppError> {
    use leasekeeper_core::schedule::store;
    leasekeeper_core::schedule::check_name(&name)
        .map_err(|e| super::context::refused(AppError::BadRequest(e)))?;
    let state = super::context::operator_state().await?;
    let mut conn = state.pool.acquire().await?;
    let schema = state.schema();
    let by = state.instance_id.as_ref();
    let done = match action.as_str() {
        "pause" => store::set_paused(&mut conn, schema, &name, true, by)
            .await
            .map(|_| format!("paused {name}")),
        "resume" => store::set_paused(&mut conn, schema, &name, false, by)
            .await
            .map(|_| format!("resumed {name}")),
        "trigger" => store::trigger(&mut conn, schema, &name, by)
            .await
            .map(|task| format!("triggered {name}: task {}", task.id)),
        "delete" => store::delete(&mut conn, schema, &name, by)
            .await
            .map(|()| format!("deleted {name}")),
        other => {
            return Err(super::context::refused(AppError::BadRequest(format!(
                "action must be pause, resume, trigger or delete, got {other:?}"
            ))));
        }
    }
    .map_err(|e| super::context::refused(AppError::from(e)))?;
    if let Some(scheduler) = &state.scheduler {
        scheduler.nudge();
    }
    Ok(done)
}

/// The schedules page.
#[component]
pub fn SchedulesPage() -> impl IntoView {
    let tick = refresh_tick();
    let control = ServerAction::<ControlSchedule>::new();
    let rows = Resource::new(
        move || (tick.get(), control.version().get()),
        |_| get_schedules(),
    );
    view! {
        <h1 class="text-xl font-semibold">"Schedules"</h1>
        <p class="text-sm text-slate-600">
            "Cron-declared tasks. Every tick is fired once, by the holder of the singleton:scheduler lease, in the transaction that checks its lease and token; after a failover the new holder fires the ticks it missed as the schedule's catch-up policy says. Declare schedules in code (Runtime::builder(..).schedule(..)) or with PUT /api/schedules/{name}."
        </p>
        <super::widgets::FencingTokenNote/>
        <ActionOutcome last=Signal::derive(move || control.value().get()) prefix="schedule"/>
        <Transition fallback=|| view! { <p class="mt-4 text-sm text-slate-500">"Loading schedules…"</p> }>
            {move || Suspend::new(async move {
                match rows.await {
                    Ok(rows) if rows.is_empty() => Either::Left(view! {
                        <Notice kind="empty" testid="schedules-empty" text="No schedule yet. Declare one: PUT /api/schedules/nightly {\"cron\": \"0 2 * * *\", \"kind\": \"report\"}.".to_string()/>
                    }),
                    Ok(rows) => Either::Right(Either::Left(view! { <ScheduleTable rows control/> })),
                    Err(e) => Either::Right(Either::Right(view! {
                        <Notice kind="error" testid="schedules-error" text=format!("Cannot load schedules: {e}. The page retries on the next change, and every few seconds.")/>
                    })),
                }
            })}
        </Transition>
        <h2 class="mt-8 text-lg font-semibold">"Who fires the ticks"</h2>
        <super::failover::OwnershipTimeline of=Signal::stored(Some(super::failover::TimelineOf::Resource(
            leasekeeper_core::schedule::RESOURCE.to_string(),
        )))/>
    }
}

#[component]
fn ScheduleTable(rows: Vec<ScheduleRow>, control: ServerAction<ControlSchedule>) -> impl IntoView {
    view! {
        <DataTable testid="schedules-table" headers=vec!["schedule", "when", "next tick", "state", "last ticks (holder #token, late by)", "controls"]>
            {rows
                .into_iter()
                .map(|row| view! { <ScheduleLine row control/> })
                .collect_view()}
        </DataTable>
    }
}

#[component]
fn ScheduleLine(row: ScheduleRow, control: ServerAction<ControlSchedule>) -> impl IntoView {
    let s = row.schedule;
    let name = s.name.clone();
    let first = s.next_tick_in_ms;
    let left = first.map(remaining);
    // `try_get`: see GeneratorFacts.
    let next = move || match left.map(|l| l.try_get().or(first)).unwrap_or(first) {
        Some(ms) => relative(ms.max(0)),
        None => "—".to_string(),
    };
    let button = |action: &'static str, label: &'static str, class: &'static str| {
        let name = name.clone();
        view! {
            <ActionForm action=control>
                <input type="hidden" name="name" value=name/>
                <input type="hidden" name="action" value=action/>
                <button type="submit" class=format!("rounded px-2 py-0.5 text-xs font-medium text-white {class}") data-testid=format!("schedule-{action}")>{label}</button>
            </ActionForm>
        }
    };
    let toggle = if s.paused {
        button("resume", "Resume", "bg-emerald-600 hover:bg-emerald-700")
    } else {
        button("pause", "Pause", "bg-amber-600 hover:bg-amber-700")
    };
    let state_class = if s.paused {
        "bg-amber-100 text-amber-800"
    } else {
        "bg-emerald-100 text-emerald-800"
    };
    view! {
        <tr class="border-t border-slate-100 align-top" id=format!("schedule-{}", s.name) data-testid="schedule-row" data-schedule=s.name.clone() data-paused=s.paused.to_string()>
            <td class="px-3 py-2">
                <div class="font-mono font-semibold">{s.name.clone()}</div>
                <div class="text-xs text-slate-500">{format!("{} → {} in {}", s.catch_up.as_str(), s.kind, s.queue)}</div>
            </td>
            <td class="px-3 py-2">
                <div data-testid="schedule-cron-text">{s.cron_text.clone()}</div>
                <div class="font-mono text-xs text-slate-500" data-testid="schedule-cron">{s.cron.clone()}</div>
            </td>
            <td class="px-3 py-2 tabular-nums" data-testid="schedule-next">
                {next}
                {s.next_tick_at.map(|at| view! { <div class="text-xs text-slate-500"><LocalTime at/></div> })}
            </td>
            <td class="px-3 py-2">
                <span class=format!("rounded px-2 py-0.5 text-xs font-medium {state_class}") data-testid="schedule-state">
                    {if s.paused { "paused" } else { "running" }}
                </span>
            </td>
            <td class="px-3 py-2">
                <ul class="space-y-0.5 text-xs tabular-nums" data-testid="schedule-ticks">
                    {row.ticks.into_iter().map(|t| view! {
                        <li data-testid="schedule-tick" data-token=t.fencing_token.to_string()>
                            <LocalTime at=t.tick_at/>
                            " "
                            <a class="text-indigo-700 underline" href=format!("/tasks?id={}", t.task_id)>{format!("task {}", t.task_id)}</a>
                            <span class="font-mono" data-testid="schedule-tick-holder">{format!(" {} #{}", t.holder, t.fencing_token)}</span>
                            <span class="text-slate-500" data-testid="schedule-tick-late">{format!(", {} ms late", t.lateness_ms())}</span>
                            {t.caught_up.then_some(" (caught up)")}
                        </li>
                    }).collect_view()}
                </ul>
            </td>
            <td class=controls_class("controls", "px-3 py-2 bg-white")>
                <div class="flex flex-wrap gap-1">
                    {toggle}
                    {button("trigger", "Run now", "bg-indigo-600 hover:bg-indigo-700")}
                    {button("delete", "Delete", "bg-red-600 hover:bg-red-700")}
                </div>
            </td>
        </tr>
    }
}

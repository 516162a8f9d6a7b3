//! The tasks page: the queue with each task's status, processor, fencing
//! token, attempts and a heartbeat countdown whose colour shifts as the
//! deadline nears (late tasks are flagged); a search by status, kind,
//! queue and data (in the URL, so it works before hydration and can be
//! shared); and lookup by id with its attempts on record, last error and
//! the task lease's history.

use super::live::refresh_tick;
use super::time::{LocalTime, remaining};
use super::widgets::{
    ActionOutcome, DataTable, FilterPills, HistoryList, LookupForm, Notice, Pager, controls_class,
};
use crate::error::AppError;
use crate::error::parse_id;
use leasekeeper_core::queue::{
    Attempt, AttemptOutcome, TaskAction, TaskDetail, TaskPage, TaskSearch, TaskStatus,
};
use leasekeeper_core::workflow::{Link, TaskLinks};
use leptos::either::{Either, EitherOf3};
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

/// A page of the tasks the search finds (`status`, `kind`, `queue`, and
/// `data`, the JSON text of an object the tasks' data contains; each
/// absent or blank: any), newest first, below `before`, for the dashboard.
#[server(prefix = "/sfn")]
pub async fn get_tasks(
    status: Option<TaskStatus>,
    before: Option<i64>,
    kind: Option<String>,
    queue: Option<String>,
    data: Option<String>,
) -> Result<TaskPage, AppError> {
    use leasekeeper_core::queue::store;
    let mut search = TaskSearch::parse(None, kind.as_deref(), queue.as_deref(), data.as_deref())
        .map_err(|e| super::context::refused(AppError::BadRequest(e)))?;
    search.status = status;
    let settings = super::context::settings()?;
    let state = super::context::state()?;
    crate::reads::read!(state, |conn| -> Result<_, AppError> {
        let page = store::list_page(
            &mut *conn,
            state.schema(),
            search,
            leasekeeper_core::paging::Cursor::new(before, None),
        )
        .await?;
        Ok(TaskPage {
            tasks: page.items,
            next: page.next,
            ttl_ms: i64::try_from(settings.lease_ttl.as_millis()).unwrap_or(i64::MAX),
        })
    })
    .map_err(super::context::refused)
}

/// A task's detail and, for a task in a workflow, its parents and children.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TaskView {
    /// The task, its lease history and its attempts.
    #[serde(flatten)]
    pub detail: TaskDetail,
    /// Its neighbours in its workflow (both empty outside one).
    pub links: TaskLinks,
}

/// Task `id` with its lease history and its place in its workflow; `None`
/// when there is no such task.
#[server(prefix = "/sfn")]
pub async fn get_task_detail(id: i64) -> Result<Option<TaskView>, AppError> {
    use leasekeeper_core::lease::store as leases;
    use leasekeeper_core::queue::store;
    crate::error::check_id(id)?;
    let state = super::context::state()?;
    crate::reads::read!(state, |conn| -> Result<_, AppError> {
        let Some(task) = store::get(&mut *conn, state.schema(), id).await? else {
            return Ok(None);
        };
        let history = leases::history(
            &mut *conn,
            state.schema(),
            &leasekeeper_core::queue::Task::resource_name(id),
            50,
        )
        .await?;
        let attempts = store::attempts(&mut *conn, state.schema(), id).await?;
        let links = if task.workflow_id.is_some() {
            leasekeeper_core::workflow::store::links(&mut *conn, state.schema(), id).await?
        } else {
            TaskLinks::default()
        };
        Ok(Some(TaskView {
            detail: TaskDetail {
                task,
                history,
                attempts,
            },
            links,
        }))
    })
    .map_err(super::context::refused)
}

/// Cancels (`action` = `cancel`) or retries (`retry`) task `id`, or
/// releases (`release`) its claim whose token is `token`: an operator
/// action, audited in the same transaction.
#[server(prefix = "/sfn")]
pub async fn control_task(
    id: i64,
    action: String,
    #[server(default)] token: Option<i64>,
) -> Result<String, AppError> {
    use leasekeeper_core::queue::control;
    crate::error::check_id(id)?;
    let state = super::context::operator_state().await?;
    let action = parse_action(&action)?;
    let mut conn = state.pool.acquire().await?;
    let task = match (action, token) {
        (TaskAction::Release, Some(token)) => {
            control::release(&mut conn, state.schema(), id, token, &state.instance_id).await
        }
        (TaskAction::Release, None) => {
            return Err(super::context::refused(AppError::BadRequest(
                "a release names the claim's token".into(),
            )));
        }
        _ => control::apply(&mut conn, state.schema(), action, id, &state.instance_id).await,
    }
    .map_err(|e| super::context::refused(e.into()))?;
    Ok(match task.status {
        TaskStatus::Started => format!(
            "task {id}'s claim (token {}) released; the next worker to claim takes it over",
            token.unwrap_or_default()
        ),
        TaskStatus::Cancelled => format!(
            "task {id} cancelled; a worker that still runs it has its next heartbeat or completion refused"
        ),
        _ => format!(
            "task {id} is pending again, attempts reset to 0 of {}",
            task.max_attempts
        ),
    })
}

/// Cancels or retries every task with `status` (`action` = `cancel` or
/// `retry`) that the rest of the search (`kind`, `queue`, `data`, as for
/// [`get_tasks`]) finds: the tasks page's "all matching the filter"
/// controls, which so never act on a task the list would not show.
#[server(prefix = "/sfn")]
pub async fn control_tasks(
    status: String,
    action: String,
    kind: Option<String>,
    queue: Option<String>,
    data: Option<String>,
) -> Result<String, AppError> {
    use leasekeeper_core::queue::control::{self, TaskFilter};
    let state = super::context::operator_state().await?;
    let status = TaskStatus::parse(&status).ok_or_else(|| {
        super::context::refused(AppError::BadRequest(format!("no task status {status:?}")))
    })?;
    let search = TaskSearch::parse(None, kind.as_deref(), queue.as_deref(), data.as_deref())
        .map_err(|e| super::context::refused(AppError::BadRequest(e)))?;
    let filter = TaskFilter {
        status,
        kind: search.kind,
        queue: search.queue,
        data: search.data,
        error_group: None,
    };
    let action = parse_action(&action)?;
    let count = control::apply_matching(
        &state.pool,
        state.schema(),
        action,
        &filter,
        &state.instance_id,
    )
    .await
    .map_err(|e| super::context::refused(e.into()))?;
    let done = match action {
        TaskAction::Cancel => "cancelled",
        TaskAction::Retry => "retried",
        TaskAction::Release => "released",
    };
    Ok(format!("{count} {} tasks {done}", status.as_str()))
}

/// A server function's `action` argument, refused with a 400 unless it
/// names a [`TaskAction`].
#[cfg(feature = "ssr")]
fn parse_action(raw: &str) -> Result<TaskAction, AppError> {
    TaskAction::parse(raw).map_err(|e| super::context::refused(AppError::BadRequest(e)))
}

/// How near a started task's heartbeat deadline is: the countdown's colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Band {
    /// Not started: no deadline.
    None,
    /// More than half the TTL left (green).
    Ok,
    /// Between half and a fifth of the TTL left (amber).
    Soon,
    /// A fifth of the TTL or less left (orange).
    Urgent,
    /// Past the deadline: anyone may take the task over (red).
    Late,
}

impl Band {
    /// The band's name, for `data-band`.
    pub fn as_str(self) -> &'static str {
        match self {
            Band::None => "none",
            Band::Ok => "ok",
            Band::Soon => "soon",
            Band::Urgent => "urgent",
            Band::Late => "late",
        }
    }

    /// The band's colour classes.
    pub fn class(self) -> &'static str {
        match self {
            Band::None => "text-slate-400",
            Band::Ok => "bg-emerald-100 text-emerald-800",
            Band::Soon => "bg-amber-100 text-amber-800",
            Band::Urgent => "bg-orange-200 text-orange-900",
            Band::Late => "bg-red-100 text-red-800 font-semibold",
        }
    }
}

/// The heartbeat countdown for `ms` left (`None`: the task is not started)
/// against a TTL of `ttl_ms`: its text and band.
pub fn heartbeat_view(ms: Option<i64>, ttl_ms: i64) -> (String, Band) {
    let Some(ms) = ms else {
        return ("—".to_string(), Band::None);
    };
    if ms <= 0 {
        return (format!("late by {:.1} s", -ms as f64 / 1000.0), Band::Late);
    }
    let left = ms as f64 / ttl_ms.max(1) as f64;
    let band = if left > 0.5 {
        Band::Ok
    } else if left > 0.2 {
        Band::Soon
    } else {
        Band::Urgent
    };
    (format!("{:.1} s left", ms as f64 / 1000.0), band)
}

/// A task status's badge colours.
pub(super) fn status_badge(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Pending => "bg-slate-200 text-slate-700",
        TaskStatus::Started => "bg-sky-100 text-sky-800",
        TaskStatus::Processed => "bg-emerald-100 text-emerald-800",
        TaskStatus::Failed => "bg-red-100 text-red-800",
        TaskStatus::Cancelled => "bg-amber-100 text-amber-800",
        TaskStatus::Waiting => "bg-violet-100 text-violet-800",
    }
}

/// The same hues for a task drawn in SVG (a workflow's graph): the shape's
/// fill and stroke, and the status text's fill. Written out, not derived
/// from [`status_badge`]: tailwind generates only classes it finds whole in
/// the source.
pub(super) fn status_node(status: TaskStatus) -> (&'static str, &'static str) {
    match status {
        TaskStatus::Pending => ("fill-slate-200 stroke-slate-400", "fill-slate-700"),
        TaskStatus::Started => ("fill-sky-100 stroke-sky-400", "fill-sky-800"),
        TaskStatus::Processed => ("fill-emerald-100 stroke-emerald-400", "fill-emerald-800"),
        TaskStatus::Failed => ("fill-red-100 stroke-red-400", "fill-red-800"),
        TaskStatus::Cancelled => ("fill-amber-100 stroke-amber-400", "fill-amber-800"),
        TaskStatus::Waiting => ("fill-violet-100 stroke-violet-400", "fill-violet-800"),
    }
}

const FILTERS: [&str; 7] = [
    "all",
    "pending",
    "waiting",
    "started",
    "processed",
    "failed",
    "cancelled",
];

/// The tasks page.
#[component]
pub fn TasksPage() -> impl IntoView {
    let query = use_query_map();
    let filter = Memo::new(move |_| {
        let raw = query.read().get("status").unwrap_or_default();
        FILTERS.into_iter().find(|f| *f == raw).unwrap_or("all")
    });
    // The search in the URL (`?status=&kind=&queue=&data=`), or why it is
    // not one.
    let search = Memo::new(move |_| {
        let q = query.read();
        TaskSearch::parse(
            Some(filter.get()),
            q.get("kind").as_deref(),
            q.get("queue").as_deref(),
            q.get("data").as_deref(),
        )
    });
    // The dead letters show above the list of failed tasks.
    let failed = Memo::new(move |_| filter.get() == "failed");
    let lookup = Memo::new(move |_| query.read().get("id").filter(|s| !s.trim().is_empty()));
    // `?confirm=cancel|retry`: asks before a bulk action on the filter.
    let confirm = Memo::new(move |_| query.read().get("confirm"));
    let tick = refresh_tick();
    let one = ServerAction::<ControlTask>::new();
    let all = ServerAction::<ControlTasks>::new();
    let group = ServerAction::<super::failed::RetryFailedGroup>::new();
    let before = super::widgets::before_param();
    let tasks = Resource::new(
        move || {
            (
                search.get(),
                before.get(),
                tick.get(),
                one.version().get(),
                all.version().get(),
                group.version().get(),
            )
        },
        |(search, before, ..)| async move {
            let search = search.map_err(AppError::BadRequest)?;
            let data = search.data_text();
            get_tasks(search.status, before, search.kind, search.queue, data).await
        },
    );
    let detail = Resource::new(
        move || {
            (
                lookup.get(),
                tick.get(),
                one.version().get(),
                all.version().get(),
            )
        },
        |(raw, _, _, _)| async move {
            let Some(raw) = raw else { return Ok(None) };
            let id = parse_id(&raw)?;
            get_task_detail(id).await.map(|d| d.ok_or(id)).map(Some)
        },
    );

    view! {
        <div class="flex flex-wrap items-end justify-between gap-4">
            <div>
                <h1 class="text-2xl font-semibold">"Tasks"</h1>
                <p class="text-sm text-slate-600">
                    "The queue, newest first. Every claim is a lease: the countdown is the time left before the claim's lease runs out and any worker may take the task over."
                </p>
                <super::widgets::FencingTokenNote/>
            </div>
            <LookupForm path="/tasks" param="status" keep=Signal::derive(move || filter.get()) prefix="task" placeholder="Task id"/>
        </div>
        <FilterPills
            path="/tasks"
            param="status"
            values=FILTERS.to_vec()
            selected=Signal::derive(move || filter.get())
            testid="task-filters"
            label="Filter tasks by status"
        />
        <SearchForm search=Signal::derive(move || search.get().unwrap_or_default()) raw=Signal::derive(move || {
            let q = query.read();
            (q.get("kind").unwrap_or_default(), q.get("queue").unwrap_or_default(), q.get("data").unwrap_or_default())
        })/>
        <BulkControls search=Signal::derive(move || search.get().ok()) confirm=Signal::derive(move || confirm.get()) all/>
        <ActionOutcome last=one.value() prefix="task"/>
        {move || failed.get().then(|| view! {
            <super::failed::DeadLetters
                search=Signal::derive(move || search.get().unwrap_or_default())
                here=Signal::derive(move || {
                    let mut search = search.get().unwrap_or_default();
                    search.status = Some(TaskStatus::Failed);
                    search_url(&search)
                })
                confirm=Signal::derive(move || confirm.get())
                retry=group/>
        })}

        <Transition fallback=|| view! { <p class="mt-4 text-sm text-slate-500">"Loading task…"</p> }>
            {move || Suspend::new(async move {
                match detail.await {
                    Ok(None) => EitherOf3::A(()),
                    Ok(Some(Ok(d))) => EitherOf3::B(view! { <TaskDetailView view=d one/> }),
                    Ok(Some(Err(id))) => EitherOf3::C(view! {
                        <Notice kind="warn" testid="task-detail-missing" text=format!("No task with id {id}.")/>
                    }),
                    Err(e) => EitherOf3::C(view! { <Notice kind="error" testid="task-detail-error" text=e.to_string()/> }),
                }
            })}
        </Transition>
        <super::failover::OwnershipTimeline of=Signal::derive(move || {
            lookup
                .get()
                .and_then(|raw| parse_id(&raw).ok())
                .map(|id| super::failover::TimelineOf::Resource(leasekeeper_core::queue::Task::resource_name(id)))
        })/>

        <Transition fallback=|| view! { <p class="mt-4 text-sm text-slate-500">"Loading tasks…"</p> }>
            {move || Suspend::new(async move {
                match tasks.await {
                    Ok(page) if page.tasks.is_empty() => Either::Left(view! {
                        <Notice kind="empty" testid="tasks-empty" text=match search.get_untracked() {
                            Ok(s) if s.kind.is_some() || s.queue.is_some() || s.data.is_some() => {
                                "No tasks match this search.".to_string()
                            }
                            _ => format!(
                                "No {} tasks. Start the generator, or enqueue one with POST /api/tasks {{\"task_data\": {{\"sleep_duration_seconds\": 5}}}}.",
                                if filter.get_untracked() == "all" { "" } else { filter.get_untracked() }
                            ),
                        }/>
                    }),
                    Ok(page) => {
                        let base = search_url(&search.get_untracked().unwrap_or_default());
                        let next = page.next;
                        Either::Right(Either::Left(view! {
                            <TaskTable page one/>
                            <Pager base before=before.get_untracked() next testid="tasks-pager"/>
                        }))
                    }
                    Err(e) => Either::Right(Either::Right(view! {
                        <Notice kind="error" testid="tasks-error" text=format!("Cannot load tasks: {e}. The page retries on the next change, and every few seconds.")/>
                    })),
                }
            })}
        </Transition>
    }
}

/// `/tasks` with `search` in its query.
fn search_url(search: &TaskSearch) -> String {
    match search.query() {
        q if q.is_empty() => "/tasks".to_string(),
        q => format!("/tasks?{q}"),
    }
}

/// The search form: status, kind, queue and data (a JSON object the
/// tasks' data contains). A plain GET form: it works before hydration,
/// and the search lands in the URL, to share or reload. `raw` is the
/// kind, queue and data as the URL has them, shown back even when bad.
#[component]
fn SearchForm(search: Signal<TaskSearch>, raw: Signal<(String, String, String)>) -> impl IntoView {
    let input = "rounded border border-slate-300 px-2 py-1 text-sm";
    let status = move || search.get().status.map(|s| s.as_str()).unwrap_or("all");
    view! {
        <leptos_router::components::Form method="GET" action="/tasks">
            <div class="mt-4 flex flex-wrap items-end gap-2 text-sm" role="search" aria-label="Search tasks" data-testid="task-search">
                <label class="flex flex-col">
                    <span class="text-xs text-slate-500">"status"</span>
                    <select name="status" class=input data-testid="task-search-status">
                        {FILTERS
                            .into_iter()
                            .map(|f| view! { <option value=f selected=move || status() == f>{f}</option> })
                            .collect_view()}
                    </select>
                </label>
                <label class="flex flex-col">
                    <span class="text-xs text-slate-500">"kind"</span>
                    <input name="kind" class=format!("w-32 {input}") placeholder="any" maxlength="128"
                        prop:value=move || raw.get().0 data-testid="task-search-kind"/>
                </label>
                <label class="flex flex-col">
                    <span class="text-xs text-slate-500">"queue"</span>
                    <input name="queue" class=format!("w-32 {input}") placeholder="any" maxlength="128"
                        prop:value=move || raw.get().1 data-testid="task-search-queue"/>
                </label>
                <label class="flex min-w-0 flex-1 flex-col">
                    <span class="text-xs text-slate-500">"data contains (a JSON object)"</span>
                    <input name="data" class=format!("font-mono {input}") placeholder="{\"customer\": 7}"
                        prop:value=move || raw.get().2 data-testid="task-search-data"/>
                </label>
                <button type="submit" class="rounded bg-indigo-600 px-3 py-1 text-sm font-medium text-white hover:bg-indigo-700"
                    data-testid="task-search-submit">"Search"</button>
                <a href="/tasks" class="px-1 py-1 text-indigo-700 underline" data-testid="task-search-clear">"Clear"</a>
            </div>
        </leptos_router::components::Form>
    }
}

/// The search in words, for a bulk action's confirmation: "pending tasks
/// of kind `email` in queue `mail` whose data contains {...}".
fn search_words(status: TaskStatus, search: &TaskSearch) -> String {
    let mut words = format!("{} task", status.as_str());
    if let Some(kind) = &search.kind {
        words.push_str(&format!(" of kind {kind:?}"));
    }
    if let Some(queue) = &search.queue {
        words.push_str(&format!(" in queue {queue:?}"));
    }
    if let Some(data) = search.data_text() {
        words.push_str(&format!(" whose data contains {data}"));
    }
    words
}

/// "Cancel all pending…" / "Retry all failed…" for the search shown; each
/// a link to `?confirm=<action>` (works before hydration), which shows a
/// confirmation naming what will happen. The action takes the whole search
/// (status, kind, queue, data), so it changes only tasks the list shows.
#[component]
fn BulkControls(
    search: Signal<Option<TaskSearch>>,
    confirm: Signal<Option<String>>,
    all: ServerAction<ControlTasks>,
) -> impl IntoView {
    move || {
        let search = search.get()?;
        let status = search.status?;
        let action = TaskAction::for_status(status)?.as_str();
        let narrowed = search.kind.is_some() || search.queue.is_some() || search.data.is_some();
        let label = format!(
            "{} all {}{}…",
            capitalized(action),
            status.as_str(),
            if narrowed { " found" } else { "" }
        );
        let confirming = confirm.get().filter(|c| c == action);
        let consequence = match status {
            TaskStatus::Started => {
                "Their claims end now: the workers running them have their next heartbeat and completion refused."
            }
            TaskStatus::Pending => "No worker will claim them; a retry puts them back.",
            _ => {
                "They go back to pending with their attempts reset to 0, and workers claim them again."
            }
        };
        let here = search_url(&search);
        let words = search_words(status, &search);
        Some(view! {
            <div class="mt-3 flex flex-wrap items-center gap-2 text-sm" data-testid="task-bulk">
                <a href=format!("{here}&confirm={action}")
                    class="rounded bg-white px-2 py-0.5 text-xs font-medium ring-1 ring-slate-300 hover:bg-slate-100"
                    data-testid=format!("tasks-{action}-all")>{label}</a>
                {confirming.map(|_| view! {
                    <div class="w-full rounded border border-amber-300 bg-amber-50 p-3" role="alertdialog"
                        aria-label=format!("{action} every {words}?") data-testid="task-bulk-confirm">
                        <p class="font-semibold">{format!("{} every {words}, as many as there are when you confirm?", capitalized(action))}</p>
                        <p class="mt-1">{consequence}</p>
                        <div class="mt-2 flex gap-2">
                            <ActionForm action=all>
                                <input type="hidden" name="status" value=status.as_str()/>
                                <input type="hidden" name="action" value=action/>
                                <input type="hidden" name="kind" value=search.kind.clone().unwrap_or_default()/>
                                <input type="hidden" name="queue" value=search.queue.clone().unwrap_or_default()/>
                                <input type="hidden" name="data" value=search.data_text().unwrap_or_default()/>
                                <button type="submit" class="rounded bg-red-600 px-3 py-1 text-sm font-medium text-white hover:bg-red-700" data-testid="task-bulk-confirmed">
                                    {format!("{} them", capitalized(action))}
                                </button>
                            </ActionForm>
                            <a href=here.clone() class="rounded bg-white px-3 py-1 text-sm ring-1 ring-slate-300 hover:bg-slate-100" data-testid="task-bulk-keep">"Keep them"</a>
                        </div>
                    </div>
                })}
                <ActionOutcome last=all.value() prefix="task-bulk"/>
            </div>
        })
    }
}

fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// The cancel or retry button of one task (none for a processed task),
/// and for a started one the release of its claim (token `token`).
#[component]
fn TaskControl(
    id: i64,
    status: TaskStatus,
    token: Option<i64>,
    one: ServerAction<ControlTask>,
) -> impl IntoView {
    let main = TaskAction::for_status(status).map(TaskAction::as_str).map(|action| {
        view! {
            <ActionForm action=one>
                <input type="hidden" name="id" value=id/>
                <input type="hidden" name="action" value=action/>
                <button type="submit" data-testid=format!("task-{action}")
                    class="rounded bg-white px-2 py-0.5 text-xs font-medium ring-1 ring-slate-300 hover:bg-slate-100"
                    title=if action == "cancel" { "Take this task out of the queue; a worker running it is refused its next write" } else { "Back to pending, attempts reset" }>
                    {capitalized(action)}
                </button>
            </ActionForm>
        }
    });
    let release = token.filter(|_| status == TaskStatus::Started).map(|token| {
        view! {
            <ActionForm action=one>
                <input type="hidden" name="id" value=id/>
                <input type="hidden" name="action" value="release"/>
                <input type="hidden" name="token" value=token/>
                <button type="submit" data-testid="task-release"
                    class="rounded bg-white px-2 py-0.5 text-xs font-medium ring-1 ring-slate-300 hover:bg-slate-100"
                    title="End this claim now: the next worker to claim takes the task over with the next token; this worker is refused its next write">
                    "Release claim"
                </button>
            </ActionForm>
        }
    });
    view! { <div class="flex gap-1">{main}{release}</div> }
}

#[component]
fn TaskTable(page: TaskPage, one: ServerAction<ControlTask>) -> impl IntoView {
    let ttl_ms = page.ttl_ms;
    view! {
        <DataTable testid="tasks-table" headers=vec!["id", "kind", "status", "processor", "token", "attempts", "heartbeat deadline", "data", "controls"]>
            {page
                .tasks
                .into_iter()
                .map(|task| {
                    let left = task
                        .heartbeat_in_ms
                        .filter(|_| task.status == TaskStatus::Started)
                        .map(remaining);
                    let first = task.heartbeat_in_ms.unwrap_or_default();
                    let beat = move || heartbeat_view(left.map(|l| l.try_get().unwrap_or(first)), ttl_ms);
                    view! {
                        <tr class="border-t border-slate-100" data-testid="task-row" data-task-id=task.id data-status=task.status.as_str()>
                            <td class="px-3 py-2">
                                <a class="text-indigo-700 underline" href=format!("/tasks?id={}", task.id) data-testid="task-link">{task.id}</a>
                            </td>
                            <td class="px-3 py-2 font-mono text-xs" data-testid="task-kind">
                                {task.kind.clone()}
                                <span class="text-slate-500">{format!(" · {}", task.queue)}</span>
                            </td>
                            <td class="px-3 py-2">
                                <span class=format!("rounded px-2 py-0.5 text-xs font-medium {}", status_badge(task.status)) data-testid="task-status">
                                    {task.status.as_str()}
                                </span>
                            </td>
                            <td class="px-3 py-2 font-mono" data-testid="task-processor">{task.processor.clone().unwrap_or_default()}</td>
                            <td class="px-3 py-2 font-mono" data-testid="task-token">{task.fencing_token.map(|t| t.to_string()).unwrap_or_default()}</td>
                            <td class="px-3 py-2 tabular-nums">{format!("{}/{}", task.attempts, task.max_attempts)}</td>
                            <td class="px-3 py-2">
                                <span class=move || format!("rounded px-2 py-0.5 text-xs tabular-nums {}", beat().1.class()) data-testid="task-heartbeat"
                                    data-band=move || beat().1.as_str() data-late=move || (beat().1 == Band::Late).to_string()>
                                    {move || beat().0}
                                </span>
                            </td>
                            <td class="max-w-xs truncate px-3 py-2 font-mono text-xs text-slate-600">{task.task_data.to_string()}</td>
                            <td class=controls_class("controls", "px-3 py-2 bg-white")>
                                <TaskControl id=task.id status=task.status token=task.fencing_token one/>
                            </td>
                        </tr>
                    }
                })
                .collect_view()}
        </DataTable>
    }
}

#[component]
fn TaskDetailView(view: TaskView, one: ServerAction<ControlTask>) -> impl IntoView {
    let TaskView { detail, links } = view;
    let task = detail.task;
    view! {
        <section class="mt-4 rounded border border-indigo-200 bg-white p-4" data-testid="task-detail">
            <div class="flex flex-wrap items-baseline gap-x-6 gap-y-1">
                <h2 class="text-lg font-semibold">{format!("Task {}", task.id)}</h2>
                <span class=format!("rounded px-2 py-0.5 text-xs font-medium {}", status_badge(task.status)) data-testid="detail-status">
                    {task.status.as_str()}
                </span>
                <span>"processor " <b class="font-mono" data-testid="detail-processor">{task.processor.clone().unwrap_or_default()}</b></span>
                <span>"token " <b class="font-mono" data-testid="detail-token">{task.fencing_token.map(|t| t.to_string()).unwrap_or_default()}</b></span>
                <span data-testid="detail-attempts">{format!("attempt {} of {}", task.attempts, task.max_attempts)}</span>
                <TaskControl id=task.id status=task.status token=task.fencing_token one/>
            </div>
            <dl class="mt-2 grid grid-cols-1 gap-x-6 gap-y-1 text-sm sm:grid-cols-2">
                <div><dt class="inline text-slate-500">"kind "</dt><dd class="inline font-mono" data-testid="detail-kind">{task.kind.clone()}</dd></div>
                <div><dt class="inline text-slate-500">"queue "</dt><dd class="inline font-mono" data-testid="detail-queue">{format!("{} (priority {})", task.queue, task.priority)}</dd></div>
                // break-all: JSON and error text have long unbroken runs
                // that would widen the page past a phone's screen.
                <div class="min-w-0 break-all"><dt class="inline text-slate-500">"data "</dt><dd class="inline font-mono" data-testid="detail-data">{task.task_data.to_string()}</dd></div>
                <div class="min-w-0 break-all"><dt class="inline text-slate-500">"output "</dt><dd class="inline font-mono" data-testid="detail-output">{task.task_output.as_ref().map(|o| o.to_string()).unwrap_or_default()}</dd></div>
                <div class="min-w-0 break-words"><dt class="inline text-slate-500">"last error "</dt><dd class="inline" data-testid="detail-error">{task.last_error.clone().unwrap_or_default()}</dd></div>
                <div><dt class="inline text-slate-500">"enqueued "</dt><dd class="inline tabular-nums"><LocalTime at=task.created_at/></dd></div>
                {task.schedule.clone().map(|name| view! {
                    <div><dt class="inline text-slate-500">"schedule "</dt><dd class="inline" data-testid="detail-schedule">
                        <a class="font-mono text-indigo-700 underline" href=format!("/schedules#schedule-{name}")>{name.clone()}</a>
                        {match task.tick_at {
                            Some(at) => Either::Left(view! { <span>", tick of "<LocalTime at/></span> }),
                            None => Either::Right(view! { <span>", run now by an operator"</span> }),
                        }}
                    </dd></div>
                })}
                {task.unique_key.clone().map(|key| view! {
                    <div class="min-w-0 break-all"><dt class="inline text-slate-500">"unique key "</dt><dd class="inline font-mono" data-testid="detail-unique-key">
                        {format!("{key} ({})", task.unique_scope.map(|s| s.as_str()).unwrap_or("active"))}
                    </dd></div>
                })}
            </dl>
            <WorkflowPlace task=task.clone() links/>
            <SignalWait task=task.clone()/>
            <AttemptsTable attempts=detail.attempts/>
            <HistoryList history=detail.history/>
        </section>
    }
}

/// A task's place in its workflow: the workflow, its ref, its parents and
/// children (each linked, with its status), what a parent's failure does
/// to it, and the outputs its processed parents handed it. Nothing for a
/// task outside a workflow.
#[component]
fn WorkflowPlace(task: leasekeeper_core::queue::Task, links: TaskLinks) -> impl IntoView {
    let flow = task.workflow_id?;
    let neighbours = |links: Vec<Link>, testid: &'static str| {
        if links.is_empty() {
            return Either::Left(view! { <span class="text-slate-500">"none"</span> });
        }
        Either::Right(view! {
            <ul class="inline-flex flex-wrap gap-x-3 gap-y-1">
                {links.into_iter().map(|l| {
                    let status = l.status.map(|s| s.as_str()).unwrap_or("deleted");
                    view! {
                        <li data-testid=testid data-task-id=l.id data-ref=l.r#ref.clone() data-status=status>
                            <a class="font-mono text-indigo-700 underline" href=format!("/tasks?id={}", l.id)>{format!("{} (task {})", l.r#ref, l.id)}</a>
                            " "
                            <span class=format!("rounded px-2 py-0.5 text-xs font-medium {}", l.status.map(status_badge).unwrap_or("text-slate-500"))>{status}</span>
                        </li>
                    }
                }).collect_view()}
            </ul>
        })
    };
    Some(view! {
        <h3 class="mt-3 text-sm font-semibold text-slate-700">"Workflow"</h3>
        <dl class="mt-1 grid grid-cols-1 gap-x-6 gap-y-1 text-sm sm:grid-cols-2" data-testid="detail-workflow-place">
            <div><dt class="inline text-slate-500">"workflow "</dt><dd class="inline">
                <a class="text-indigo-700 underline" href=format!("/workflows/{flow}") data-testid="detail-workflow">{format!("workflow {flow}")}</a>
                <span class="font-mono">{task.workflow_ref.clone().map(|r| format!(", as {r}"))}</span>
            </dd></div>
            <div><dt class="inline text-slate-500">"if a parent fails "</dt><dd class="inline font-mono" data-testid="detail-on-parent-failure">
                {task.on_parent_failure.clone().unwrap_or_else(|| "— (no parents)".to_string())}
            </dd></div>
            <div><dt class="inline text-slate-500">"parents "</dt><dd class="inline" data-testid="detail-parents">
                {neighbours(links.parents, "detail-parent")}
                {(task.parents_left > 0).then(|| format!(" ({} not ended yet)", task.parents_left))}
            </dd></div>
            <div><dt class="inline text-slate-500">"children "</dt><dd class="inline" data-testid="detail-children">{neighbours(links.children, "detail-child")}</dd></div>
            <div class="min-w-0 break-all sm:col-span-2"><dt class="inline text-slate-500">"parent outputs "</dt><dd class="inline font-mono" data-testid="detail-parent-outputs">
                {task.parent_outputs.as_ref().map(|o| o.to_string()).unwrap_or_default()}
            </dd></div>
        </dl>
    })
}

/// The signal a task waits for (and until when), and the signals it got.
/// Nothing for a task that never waited for one.
#[component]
fn SignalWait(task: leasekeeper_core::queue::Task) -> impl IntoView {
    (task.wait_signal.is_some() || task.signals.is_some()).then(|| view! {
        <h3 class="mt-3 text-sm font-semibold text-slate-700">"Signals"</h3>
        <dl class="mt-1 grid grid-cols-1 gap-x-6 gap-y-1 text-sm sm:grid-cols-2" data-testid="detail-signal-wait">
            {task.wait_signal.clone().map(|name| view! {
                <div><dt class="inline text-slate-500">"waits for "</dt><dd class="inline font-mono" data-testid="detail-wait-signal">{name}</dd></div>
                <div><dt class="inline text-slate-500">"until "</dt><dd class="inline tabular-nums" data-testid="detail-wait-until">
                    {match task.wait_until {
                        Some(at) => Either::Left(view! { <LocalTime at/> }),
                        None => Either::Right("no time limit"),
                    }}
                </dd></div>
            })}
            <div class="min-w-0 break-all sm:col-span-2"><dt class="inline text-slate-500">"signals received "</dt><dd class="inline font-mono" data-testid="detail-signals">
                {task.signals.as_ref().map(|o| o.to_string()).unwrap_or_else(|| "none yet".to_string())}
            </dd></div>
        </dl>
    })
}

/// A task's attempts on record, oldest first: who held each claim, under
/// which token, and how it ended.
#[component]
fn AttemptsTable(attempts: Vec<Attempt>) -> impl IntoView {
    if attempts.is_empty() {
        return Either::Left(view! {
            <p class="mt-3 text-sm text-slate-500" data-testid="attempts-none">"No attempt yet."</p>
        });
    }
    Either::Right(view! {
        <DataTable testid="attempts-table" headers=vec!["attempt", "processor", "token", "claimed", "ended", "outcome", "error"]>
            {attempts
                .into_iter()
                .map(|a| {
                    view! {
                        <tr class="border-t border-slate-100" data-testid="attempt-row" data-number=a.number data-outcome=a.outcome.as_str()>
                            <td class="px-3 py-2 tabular-nums" data-testid="attempt-number">{a.number}</td>
                            <td class="px-3 py-2 font-mono" data-testid="attempt-processor">{a.processor.clone()}</td>
                            <td class="px-3 py-2 font-mono" data-testid="attempt-token">{a.fencing_token}</td>
                            <td class="px-3 py-2 tabular-nums"><LocalTime at=a.claimed_at/></td>
                            <td class="px-3 py-2 tabular-nums">{a.ended_at.map(|at| view! { <LocalTime at/> })}</td>
                            <td class="px-3 py-2">
                                <span class=format!("rounded px-2 py-0.5 text-xs font-medium {}", outcome_badge(a.outcome)) data-testid="attempt-outcome">
                                    {a.outcome.as_str()}
                                </span>
                            </td>
                            <td class="min-w-0 max-w-md break-words px-3 py-2 text-xs" data-testid="attempt-error">{a.error.clone().unwrap_or_default()}</td>
                        </tr>
                    }
                })
                .collect_view()}
        </DataTable>
    })
}

fn outcome_badge(outcome: AttemptOutcome) -> &'static str {
    match outcome {
        AttemptOutcome::Running => "bg-sky-100 text-sky-800",
        AttemptOutcome::Completed => "bg-emerald-100 text-emerald-800",
        AttemptOutcome::Failed | AttemptOutcome::TimedOut | AttemptOutcome::Interrupted => {
            "bg-red-100 text-red-800"
        }
        AttemptOutcome::TakenOver | AttemptOutcome::Cancelled => "bg-amber-100 text-amber-800",
        AttemptOutcome::GivenBack | AttemptOutcome::Snoozed | AttemptOutcome::Waited => {
            "bg-slate-200 text-slate-700"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Band, heartbeat_view};

    #[test]
    fn the_countdown_changes_colour_at_a_half_and_a_fifth_of_the_ttl_and_turns_late_at_zero() {
        let band = |ms| heartbeat_view(Some(ms), 10_000).1;
        assert_eq!(heartbeat_view(None, 10_000), ("—".to_string(), Band::None));
        assert_eq!(band(10_000), Band::Ok);
        assert_eq!(band(5_001), Band::Ok);
        assert_eq!(band(5_000), Band::Soon);
        assert_eq!(band(2_001), Band::Soon);
        assert_eq!(band(2_000), Band::Urgent);
        assert_eq!(band(1), Band::Urgent);
        assert_eq!(band(0), Band::Late);
        assert_eq!(heartbeat_view(Some(-1_500), 10_000).0, "late by 1.5 s");
        assert_eq!(heartbeat_view(Some(2_500), 10_000).0, "2.5 s left");
        // Each band has its own colour.
        let classes = [Band::None, Band::Ok, Band::Soon, Band::Urgent, Band::Late].map(Band::class);
        for (i, a) in classes.iter().enumerate() {
            assert!(classes[i + 1..].iter().all(|b| b != a), "{a} repeats");
        }
    }
}

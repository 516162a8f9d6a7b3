//! The instances page: the generator panel (desired state, holder instance,
//! fencing token, time to expiry, start and stop buttons that work from any
//! instance) and every instance with whether it is alive.

use super::live::{Live, refresh_tick};
use super::time::{LocalTime, relative, remaining};
use super::widgets::{ActionOutcome, DataTable, Notice, controls_class};
use crate::error::AppError;
use leasekeeper_core::generator::GeneratorStatus;
use leasekeeper_core::instance::Instance;
use leptos::either::Either;
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

/// The generator's status as this instance sees it.
#[server(prefix = "/sfn")]
pub async fn get_generator_status() -> Result<GeneratorStatus, AppError> {
    let state = super::context::state()?;
    crate::reads::read!(state, |conn| -> Result<_, AppError> {
        Ok(leasekeeper_core::generator::runtime::report(
            &mut *conn,
            state.schema(),
            &state.instance_id,
            state.generator.as_ref(),
        )
        .await?)
    })
    .map_err(super::context::refused)
}

/// Starts (`"start"`) or stops (`"stop"`) the generator, through this instance.
#[server(prefix = "/sfn")]
pub async fn set_generator(action: String) -> Result<GeneratorStatus, AppError> {
    use leasekeeper_core::generator::Desired;
    let desired = match action.as_str() {
        "start" => Desired::Running,
        "stop" => Desired::Stopped,
        other => {
            return Err(AppError::BadRequest(format!(
                "action must be start or stop, got {other:?}"
            )));
        }
    };
    let state = super::context::operator_state().await?;
    let mut conn = state.pool.acquire().await?;
    Ok(leasekeeper_core::generator::runtime::request(
        &mut conn,
        state.schema(),
        desired,
        &state.instance_id,
        state.generator.as_ref(),
    )
    .await?)
}

/// The instances, and which one serves this page.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InstancesView {
    /// A page of the instances, newest first.
    pub instances: Vec<Instance>,
    /// The cursor of the next (older) page; `None` on the last.
    pub next: Option<i64>,
    /// The instance serving this page.
    pub here: String,
}

/// A page of the instances, newest first, below `before`.
#[server(prefix = "/sfn")]
pub async fn get_instances(before: Option<i64>) -> Result<InstancesView, AppError> {
    let state = super::context::state()?;
    let window = leasekeeper_core::instance::alive_window(state.settings.renew_interval);
    let cursor = leasekeeper_core::paging::Cursor::new(before, None);
    let page = crate::reads::read!(state, |c| {
        leasekeeper_core::instance::store::list_page(c, state.schema(), window, cursor).await
    })
    .map_err(super::context::refused)?;
    Ok(InstancesView {
        instances: page.items,
        next: page.next,
        here: state.instance_id.to_string(),
    })
}

/// Kills instance `id` like a crash (through the instance serving this, if
/// it is another one).
#[server(prefix = "/sfn")]
pub async fn kill_instance(id: String) -> Result<String, AppError> {
    let id = leasekeeper_core::lease::Holder::parse(id)
        .map_err(|e| super::context::refused(AppError::BadRequest(format!("instance id: {e}"))))?;
    let state = super::context::operator_state().await?;
    crate::ops::kill_instance(&state, &id)
        .await
        .map_err(super::context::refused)
}

/// The instances page.
#[component]
pub fn InstancesPage() -> impl IntoView {
    let tick = refresh_tick();
    let kill = ServerAction::<KillInstance>::new();
    // `?confirm=<id>`: the instance serving this page asked to be killed;
    // the page asks first (before hydration too: it is a link).
    let query = use_query_map();
    let confirm = Memo::new(move |_| query.read().get("confirm"));
    let before = super::widgets::before_param();
    let instances = Resource::new(
        move || {
            (
                before.get(),
                tick.get(),
                kill.version().get(),
                confirm.get(),
            )
        },
        |(before, ..)| get_instances(before),
    );
    // Once this page's own instance is killed, the page says where to go
    // instead of showing every refetch's network error.
    let live = use_context::<Live>();
    let alternatives = StoredValue::new(Vec::<String>::new());
    let self_kill = ServerAction::<KillInstance>::new();
    Effect::new(move |_| {
        if let (Some(Ok(_)), Some(live)) = (self_kill.value().get(), live) {
            live.gone.set(Some(alternatives.get_value()));
        }
    });
    view! {
        <GeneratorPanel/>
        <h2 class="mt-8 text-xl font-semibold">"Instances"</h2>
        <p class="text-sm text-slate-600">
            "Every leasekeeper process on this database. An instance is alive while it heartbeats; a killed one drops out after two missed heartbeats. Kill = crash: its leases are not released, so they run out and other instances take over."
        </p>
        <ActionOutcome last=Signal::derive(move || self_kill.value().get().or_else(|| kill.value().get())) prefix="instance"/>
        <Transition fallback=|| view! { <p class="mt-4 text-sm text-slate-500">"Loading instances…"</p> }>
            {move || Suspend::new(async move {
                match instances.await {
                    Ok(v) if v.instances.is_empty() => Either::Left(view! {
                        <Notice kind="empty" testid="instances-empty" text="No instance has registered yet.".to_string()/>
                    }),
                    Ok(v) => {
                        let others: Vec<String> = v
                            .instances
                            .iter()
                            .filter(|i| i.alive && i.id != v.here)
                            .map(|i| i.address.clone())
                            .collect();
                        alternatives.set_value(others.clone());
                        let confirming = confirm.get_untracked().filter(|c| *c == v.here);
                        let next = v.next;
                        Either::Right(Either::Left(view! {
                            {confirming.map(|id| view! { <ConfirmSelfKill id others=others.clone() kill=self_kill/> })}
                            <InstanceTable view=v kill/>
                            <super::widgets::Pager base="/instances".to_string() before=before.get_untracked() next testid="instances-pager"/>
                        }))
                    }
                    Err(e) => Either::Right(Either::Right(view! {
                        <Notice kind="error" testid="instances-error" text=format!("Cannot load instances: {e}. The page retries on the next change, and every few seconds.")/>
                    })),
                }
            })}
        </Transition>
        <super::failover::Stopwatch/>
    }
}

/// Asks before killing the instance that serves this page, and says which
/// live instance to open afterwards.
#[component]
fn ConfirmSelfKill(
    id: String,
    others: Vec<String>,
    kill: ServerAction<KillInstance>,
) -> impl IntoView {
    let instead = view! {
        <super::live::LiveInstanceLinks
            others
            lead="Afterwards, open a live instance: "
            none="No other instance is alive: nothing will serve this dashboard until you start one."
            testid="confirm-other"
        />
    };
    view! {
        <div class="mt-4 rounded border border-red-300 bg-red-50 p-3 text-sm" data-testid="instance-kill-confirm" role="alertdialog" aria-label="Kill the instance serving this page?">
            <p class="font-semibold">{format!("Instance {id} serves this page. Kill it?")}</p>
            <p class="mt-1">"It dies like a crash: this page stops updating, and its leases run out before others take over. " {instead}</p>
            <div class="mt-2 flex gap-2">
                <ActionForm action=kill>
                    <input type="hidden" name="id" value=id.clone()/>
                    <button type="submit" class="rounded bg-red-600 px-3 py-1 text-sm font-medium text-white hover:bg-red-700" data-testid="instance-kill-confirmed">"Kill it"</button>
                </ActionForm>
                <a href="/instances" class="rounded bg-white px-3 py-1 text-sm ring-1 ring-slate-300 hover:bg-slate-100" data-testid="instance-kill-cancel">"Cancel"</a>
            </div>
        </div>
    }
}

#[component]
fn InstanceTable(view: InstancesView, kill: ServerAction<KillInstance>) -> impl IntoView {
    let here = view.here;
    view! {
        <DataTable testid="instances-table" headers=vec!["instance", "address", "alive", "last seen", "generator", "started", "controls"]>
            {view.instances
                .into_iter()
                .map(|i| {
                    let kill_id = i.id.clone();
                    let is_here = i.id == here;
                    let alive_class = if i.alive { "bg-emerald-100 text-emerald-800" } else { "bg-red-100 text-red-800" };
                    view! {
                        <tr class="border-t border-slate-100" data-testid="instance-row" data-instance=i.id.clone() data-alive=i.alive.to_string()>
                            <td class="px-3 py-2 font-mono">{i.id.clone()}{is_here.then_some(" (this one)")}</td>
                            <td class="px-3 py-2 font-mono">
                                <a class="text-indigo-700 underline" href=format!("http://{}/instances", i.address)>{i.address.clone()}</a>
                            </td>
                            <td class="px-3 py-2">
                                <span class=format!("rounded px-2 py-0.5 text-xs font-medium {alive_class}") data-testid="instance-alive">
                                    {if i.alive { "alive" } else if i.stopped_at.is_some() { "stopped" } else { "dead" }}
                                </span>
                            </td>
                            <td class="px-3 py-2 tabular-nums" data-testid="instance-last-seen">{relative(-i.last_seen_ms_ago)}</td>
                            <td class="px-3 py-2">{i.holds_generator.then_some("holds the generator")}</td>
                            <td class="px-3 py-2 tabular-nums text-slate-500"><LocalTime at=i.started_at/></td>
                            <td class=controls_class("controls", "px-3 py-2 bg-white")>
                                {match (i.alive, is_here) {
                                    (false, _) => None,
                                    (true, true) => Some(Either::Left(view! {
                                        <a href=format!("/instances?confirm={kill_id}") class="inline-block rounded bg-red-600 px-2 py-0.5 text-xs font-medium text-white hover:bg-red-700" data-testid="instance-kill">"Kill…"</a>
                                    })),
                                    (true, false) => Some(Either::Right(view! {
                                        <ActionForm action=kill>
                                            <input type="hidden" name="id" value=kill_id/>
                                            <button type="submit" class="rounded bg-red-600 px-2 py-0.5 text-xs font-medium text-white hover:bg-red-700" data-testid="instance-kill">"Kill"</button>
                                        </ActionForm>
                                    })),
                                }}
                            </td>
                        </tr>
                    }
                })
                .collect_view()}
        </DataTable>
    }
}

/// Desired state, holder, token and expiry of the generator, with start and
/// stop buttons (plain forms before hydration).
#[component]
pub fn GeneratorPanel() -> impl IntoView {
    let action = ServerAction::<SetGenerator>::new();
    let tick = refresh_tick();
    let status = Resource::new(
        move || (tick.get(), action.version().get()),
        |_| get_generator_status(),
    );
    view! {
        <section class="rounded border border-slate-200 bg-white p-4" data-testid="generator-panel">
            <div class="flex flex-wrap items-center justify-between gap-4">
                <div>
                    <h2 class="text-xl font-semibold">"Generator"</h2>
                    <p class="text-sm text-slate-600">
                        "Inserts a task every interval, on exactly one instance: the holder of the singleton:generator lease."
                    </p>
                    <super::widgets::FencingTokenNote/>
                </div>
                <div class="flex gap-2">
                    <ActionForm action=action>
                        <input type="hidden" name="action" value="start"/>
                        <button type="submit" class="rounded bg-emerald-600 px-3 py-1 text-sm font-medium text-white hover:bg-emerald-700" data-testid="generator-start">
                            "Start"
                        </button>
                    </ActionForm>
                    <ActionForm action=action>
                        <input type="hidden" name="action" value="stop"/>
                        <button type="submit" class="rounded bg-slate-700 px-3 py-1 text-sm font-medium text-white hover:bg-slate-800" data-testid="generator-stop">
                            "Stop"
                        </button>
                    </ActionForm>
                </div>
            </div>
            <Transition fallback=|| view! { <p class="mt-2 text-sm text-slate-500">"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match status.await {
                        Ok(s) => Either::Left(view! { <GeneratorFacts status=s/> }),
                        Err(e) => Either::Right(view! {
                            <Notice kind="error" testid="generator-error" text=format!("Cannot load the generator status: {e}")/>
                        }),
                    }
                })}
            </Transition>
            <super::failover::OwnershipTimeline of=Signal::stored(Some(super::failover::TimelineOf::Resource(
                leasekeeper_core::generator::RESOURCE.to_string(),
            )))/>
            {move || action.value().get().and_then(|r| r.err()).map(|e| view! {
                <Notice kind="error" testid="generator-action-error" text=e.to_string()/>
            })}
        </section>
    }
}

#[component]
fn GeneratorFacts(status: GeneratorStatus) -> impl IntoView {
    let first = status.expires_in_ms;
    let left = first.map(remaining);
    // `try_get`: a refetch disposes this view's signals while a clock tick
    // may still re-run it; a plain `get` then panics (and froze the
    // countdown while the badge still said live).
    let expiry = move || match left.map(|l| l.try_get().or(first)).unwrap_or(first) {
        Some(ms) if ms > 0 => format!("expires {}", relative(ms)),
        Some(ms) => format!("expired {}", relative(ms)),
        None => "—".to_string(),
    };
    view! {
        <dl class="mt-3 grid grid-cols-2 gap-x-6 gap-y-1 text-sm sm:grid-cols-5">
            <div><dt class="text-slate-500">"desired"</dt>
                <dd class="font-semibold" data-testid="generator-desired">{status.desired.as_str()}</dd></div>
            <div><dt class="text-slate-500">"holder"</dt>
                <dd class="font-mono" data-testid="generator-holder">{status.holder.clone().unwrap_or_else(|| "nobody".to_string())}</dd></div>
            <div><dt class="text-slate-500">"token"</dt>
                <dd class="font-mono" data-testid="generator-token">{status.fencing_token.map(|t| t.to_string()).unwrap_or_default()}</dd></div>
            <div><dt class="text-slate-500">"lease"</dt>
                <dd class="tabular-nums" data-testid="generator-expiry">{expiry}</dd></div>
            <div><dt class="text-slate-500">"this instance"</dt>
                <dd class="font-mono" data-testid="generator-local">
                    {format!("{} ({})", status.answered_by.clone().unwrap_or_default(), status.local_state.clone().unwrap_or_else(|| "no generator".into()))}
                </dd></div>
        </dl>
    }
}

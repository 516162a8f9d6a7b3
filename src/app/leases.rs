//! The leases page: every lease with its holder, fencing token and expiry
//! countdown, a state filter, and lookup by id with ownership history.
//!
//! Filter and lookup live in the URL (`?state=active&id=7`), so the page
//! works before hydration (plain links and a GET form) and a view can be
//! shared. Once hydrated it refreshes itself every second.

use super::live::refresh_tick;
use super::time::{relative, remaining};
use super::widgets::{ActionOutcome, DataTable, FilterPills, HistoryList, LookupForm, Notice};
use crate::error::AppError;
use crate::error::parse_id;
use leasekeeper_core::lease::{Lease, LeaseDetail, LeaseFilter, LeaseState};
use leptos::either::EitherOf3;
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

/// A page of the leases matching `filter`, newest first, below `before`,
/// for the dashboard.
#[server(prefix = "/sfn")]
pub async fn get_leases(
    filter: LeaseFilter,
    before: Option<i64>,
) -> Result<leasekeeper_core::paging::Paged<Lease>, AppError> {
    use leasekeeper_core::lease::store;
    let state = super::context::state()?;
    let cursor = leasekeeper_core::paging::Cursor::new(before, None);
    crate::reads::read!(state, |c| store::list_page(
        c,
        state.schema(),
        filter,
        cursor
    )
    .await)
    .map_err(super::context::refused)
}

/// Lease `id` with its recent history; `None` when there is no such lease.
#[server(prefix = "/sfn")]
pub async fn get_lease_detail(id: i64) -> Result<Option<LeaseDetail>, AppError> {
    use leasekeeper_core::lease::store;
    crate::error::check_id(id)?;
    let state = super::context::state()?;
    crate::reads::read!(state, |c| store::detail(c, state.schema(), id).await)
        .map_err(super::context::refused)
}

/// Ends term `token` of lease `id` now, whoever holds it (an operator action).
#[server(prefix = "/sfn")]
pub async fn force_release_lease(id: i64, token: i64) -> Result<String, AppError> {
    crate::error::check_id(id)?;
    let state = super::context::operator_state().await?;
    let mut conn = state.pool.acquire().await?;
    let lease = crate::ops::force_release(&mut conn, state.schema(), id, token, &state.instance_id)
        .await
        .map_err(super::context::refused)?;
    Ok(format!(
        "released term #{token} of {} (held by {}); the next holder gets a higher token",
        lease.resource,
        lease.holder.unwrap_or_default()
    ))
}

/// Human text for how long a lease in `state` has left, `ms` from now (or
/// how long ago it ended).
pub fn expiry_text(state: LeaseState, ms: i64) -> String {
    match state {
        LeaseState::Released => "released".to_string(),
        LeaseState::Active | LeaseState::Expired if ms > 0 => format!("expires {}", relative(ms)),
        LeaseState::Active | LeaseState::Expired => format!("expired {}", relative(ms)),
    }
}

/// A lease's expiry, counting down in the browser.
#[component]
fn Expiry(state: LeaseState, ms: i64, testid: &'static str) -> impl IntoView {
    let left = remaining(ms);
    view! { <span class="tabular-nums" data-testid=testid>{move || expiry_text(state, left.try_get().unwrap_or(ms))}</span> }
}

fn state_badge(state: LeaseState) -> &'static str {
    match state {
        LeaseState::Active => "bg-emerald-100 text-emerald-800",
        LeaseState::Expired => "bg-amber-100 text-amber-800",
        LeaseState::Released => "bg-slate-200 text-slate-700",
    }
}

/// The leases page.
#[component]
pub fn LeasesPage() -> impl IntoView {
    let query = use_query_map();
    let filter = Memo::new(move |_| {
        query
            .read()
            .get("state")
            .and_then(|s| LeaseFilter::parse(&s))
            .unwrap_or_default()
    });
    let lookup = Memo::new(move |_| query.read().get("id").filter(|s| !s.trim().is_empty()));
    let tick = refresh_tick();
    let release = ServerAction::<ForceReleaseLease>::new();

    let before = super::widgets::before_param();
    let leases = Resource::new(
        move || {
            (
                filter.get(),
                before.get(),
                tick.get(),
                release.version().get(),
            )
        },
        |(f, before, _, _)| get_leases(f, before),
    );
    let detail = Resource::new(
        move || (lookup.get(), tick.get(), release.version().get()),
        |(raw, _, _)| async move {
            let Some(raw) = raw else { return Ok(None) };
            let id = parse_id(&raw)?;
            get_lease_detail(id).await.map(|d| d.ok_or(id)).map(Some)
        },
    );

    view! {
        <div class="flex flex-wrap items-end justify-between gap-4">
            <div>
                <h1 class="text-2xl font-semibold">"Leases"</h1>
                <p class="text-sm text-slate-600">
                    "Who owns what, until when, with which fencing token. Judged by the database clock; updated live as leases change."
                </p>
                <super::widgets::FencingTokenNote/>
            </div>
            <LookupForm path="/leases" param="state" keep=Signal::derive(move || filter.get().as_str()) prefix="lease" placeholder="Lease id"/>
        </div>

        <FilterPills
            path="/leases"
            param="state"
            values=LeaseFilter::ALL.iter().map(|f| f.as_str()).collect()
            selected=Signal::derive(move || filter.get().as_str())
            testid="lease-filters"
            label="Filter leases by state"
        />

        <Transition fallback=|| view! { <p class="mt-4 text-sm text-slate-500">"Loading lease…"</p> }>
            {move || Suspend::new(async move {
                match detail.await {
                    Ok(None) => EitherOf3::A(()),
                    Ok(Some(Ok(d))) => EitherOf3::B(view! { <LeaseDetailView detail=d release/> }),
                    Ok(Some(Err(id))) => EitherOf3::C(view! {
                        <Notice kind="warn" testid="lease-detail-missing" text=format!(
                            "No lease with id {id}. It may have been deleted; clear the lookup to see all leases."
                        )/>
                    }),
                    Err(e) => EitherOf3::C(view! { <Notice kind="error" testid="lease-detail-error" text=e.to_string()/> }),
                }
            })}
        </Transition>
        <super::failover::OwnershipTimeline of=Signal::derive(move || {
            lookup.get().and_then(|raw| parse_id(&raw).ok()).map(super::failover::TimelineOf::Lease)
        })/>

        <Transition fallback=|| view! { <p class="mt-4 text-sm text-slate-500">"Loading leases…"</p> }>
            {move || Suspend::new(async move {
                match leases.await {
                    Ok(page) if page.items.is_empty() => EitherOf3::A(view! {
                        <Notice kind="empty" testid="leases-empty" text=format!(
                            "No {} leases. Acquire one with POST /api/leases {{\"resource\": \"r1\", \"holder\": \"me\"}}.",
                            if filter.get_untracked() == LeaseFilter::All { "" } else { filter.get_untracked().as_str() }
                        )/>
                    }),
                    Ok(page) => {
                        let base = match filter.get_untracked() {
                            LeaseFilter::All => "/leases".to_string(),
                            f => format!("/leases?state={}", f.as_str()),
                        };
                        EitherOf3::B(view! {
                            <LeaseTable leases=page.items/>
                            <super::widgets::Pager base before=before.get_untracked() next=page.next testid="leases-pager"/>
                        })
                    }
                    Err(e) => EitherOf3::C(view! {
                        <Notice kind="error" testid="leases-error" text=format!("Cannot load leases: {e}. The page retries on the next change, and every few seconds.")/>
                    }),
                }
            })}
        </Transition>
    }
}

#[component]
fn LeaseTable(leases: Vec<Lease>) -> impl IntoView {
    view! {
        <DataTable testid="leases-table" headers=vec!["id", "resource", "holder", "token", "state", "expiry", "renewals"]>
            {leases
                .into_iter()
                .map(|lease| {
                    view! {
                        <tr
                            class="border-t border-slate-100"
                            data-testid="lease-row"
                            data-resource=lease.resource.clone()
                            data-state=lease.state.as_str()
                        >
                            <td class="px-3 py-2">
                                <a class="text-indigo-700 underline" href=format!("/leases?id={}", lease.id) data-testid="lease-link">
                                    {lease.id}
                                </a>
                            </td>
                            <td class="px-3 py-2 font-mono" data-testid="lease-resource">{lease.resource.clone()}</td>
                            <td class="px-3 py-2 font-mono" data-testid="lease-holder">{lease.holder.clone().unwrap_or_default()}</td>
                            <td class="px-3 py-2 font-mono" data-testid="lease-token">{lease.fencing_token}</td>
                            <td class="px-3 py-2">
                                <span class=format!("rounded px-2 py-0.5 text-xs font-medium {}", state_badge(lease.state)) data-testid="lease-state">
                                    {lease.state.as_str()}
                                </span>
                            </td>
                            <td class="px-3 py-2"><Expiry state=lease.state ms=lease.expires_in_ms testid="lease-expiry"/></td>
                            <td class="px-3 py-2 tabular-nums">{lease.renew_count}</td>
                        </tr>
                    }
                })
                .collect_view()}
        </DataTable>
    }
}

#[component]
fn LeaseDetailView(detail: LeaseDetail, release: ServerAction<ForceReleaseLease>) -> impl IntoView {
    let lease = detail.lease;
    let live = lease.state == LeaseState::Active;
    view! {
        <section class="mt-4 rounded border border-indigo-200 bg-white p-4" data-testid="lease-detail">
            <div class="flex flex-wrap items-baseline gap-x-6 gap-y-1">
                <h2 class="text-lg font-semibold">{format!("Lease {} — ", lease.id)}<span class="font-mono">{lease.resource.clone()}</span></h2>
                <span>"holder " <b class="font-mono" data-testid="detail-holder">{lease.holder.clone().unwrap_or_default()}</b></span>
                <span>"token " <b class="font-mono" data-testid="detail-token">{lease.fencing_token}</b></span>
                <span class=format!("rounded px-2 py-0.5 text-xs font-medium {}", state_badge(lease.state))>{lease.state.as_str()}</span>
                <Expiry state=lease.state ms=lease.expires_in_ms testid="detail-expiry"/>
                {live.then(|| view! {
                    <ActionForm action=release>
                        <input type="hidden" name="id" value=lease.id/>
                        <input type="hidden" name="token" value=lease.fencing_token/>
                        <button type="submit" class="rounded bg-red-600 px-2 py-0.5 text-xs font-medium text-white hover:bg-red-700" data-testid="lease-force-release"
                            title="End this term now, whoever holds it; the holder's next renewal fails and it steps down">
                            "Force release"
                        </button>
                    </ActionForm>
                })}
            </div>
            <ActionOutcome last=release.value() prefix="lease"/>
            <HistoryList history=detail.history/>
        </section>
    }
}

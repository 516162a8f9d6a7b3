//! The audit page (`/audit`): every operator action, newest first, a page
//! at a time: what was done, to what, and through which instance.

use super::live::refresh_tick;
use super::time::LocalTime;
use super::widgets::{Notice, Pager, before_param, operator_text};
use crate::error::AppError;
use leasekeeper_core::lease::LeaseEvent;
use leasekeeper_core::paging::Paged;
use leptos::either::Either;
use leptos::prelude::*;

/// A page of the audit log, newest first, below `before`.
#[server(prefix = "/sfn")]
pub async fn get_audit(before: Option<i64>) -> Result<Paged<LeaseEvent>, AppError> {
    let state = super::context::state()?;
    crate::reads::read!(state, |conn| -> Result<_, AppError> {
        Ok(leasekeeper_core::lease::store::audit(
            &mut *conn,
            state.schema(),
            leasekeeper_core::paging::Cursor::new(before, None),
        )
        .await?)
    })
    .map_err(super::context::refused)
}

/// Where a page about an audited resource is: a task, a worker, an
/// instance or the generator.
pub fn resource_href(resource: &str) -> Option<String> {
    let (kind, rest) = resource.split_once(':').unwrap_or((resource, ""));
    match kind {
        "task" => Some(format!("/tasks?id={rest}")),
        "worker" => Some("/workers?show=all".to_string()),
        "instance" => Some("/instances".to_string()),
        "singleton" | "generator" => Some("/instances".to_string()),
        _ => None,
    }
}

/// The audit page.
#[component]
pub fn AuditPage() -> impl IntoView {
    let before = before_param();
    let tick = refresh_tick();
    let page = Resource::new(move || (before.get(), tick.get()), |(b, _)| get_audit(b));
    view! {
        <h1 class="text-2xl font-semibold">"Audit log"</h1>
        <p class="text-sm text-slate-600">
            "Every operator action, newest first: generator start and stop, worker spawn, pause and kill, instance kills, force-releases, task cancels and retries. Each row was written in the same transaction as its action. Also at GET /api/audit."
        </p>
        <Transition fallback=|| view! { <p class="mt-4 text-sm text-slate-500">"Loading the audit log…"</p> }>
            {move || Suspend::new(async move {
                match page.await {
                    Ok(p) if p.items.is_empty() => Either::Left(view! {
                        <Notice kind="empty" testid="audit-empty" text="No operator action yet. Start the generator or kill a worker, and it shows here.".to_string()/>
                    }),
                    Ok(p) => Either::Right(Either::Left(view! { <AuditTable page=p before=before.get_untracked()/> })),
                    Err(e) => Either::Right(Either::Right(view! {
                        <Notice kind="error" testid="audit-error" text=format!("Cannot load the audit log: {e}.")/>
                    })),
                }
            })}
        </Transition>
    }
}

#[component]
fn AuditTable(page: Paged<LeaseEvent>, before: Option<i64>) -> impl IntoView {
    view! {
        <super::widgets::DataTable testid="audit-table" headers=vec!["when", "action", "on"]>
            {page
                .items
                .into_iter()
                .map(|e| {
                    let by = e.holder.clone().unwrap_or_default();
                    let action = e.detail.as_ref().and_then(|d| d.get("action")).and_then(|a| a.as_str()).unwrap_or_default().to_string();
                    let href = resource_href(&e.resource);
                    view! {
                        <tr class="border-t border-slate-100" data-testid="audit-row" data-action=action data-id=e.id>
                            <td class="px-3 py-2 tabular-nums text-slate-500"><LocalTime at=e.at/></td>
                            <td class="px-3 py-2" data-testid="audit-text">{operator_text(&by, e.detail.as_ref())}</td>
                            <td class="px-3 py-2 font-mono">
                                {match href {
                                    Some(href) => Either::Left(view! { <a class="text-indigo-700 underline" href=href>{e.resource.clone()}</a> }),
                                    None => Either::Right(e.resource.clone()),
                                }}
                            </td>
                        </tr>
                    }
                })
                .collect_view()}
        </super::widgets::DataTable>
        <Pager base="/audit".to_string() before next=page.next testid="audit-pager"/>
    }
}

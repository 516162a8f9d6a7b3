//! The widgets pages share: filter pills, the lookup form, the ownership
//! history list, notices, a control's outcome, the scrolling table and the
//! pager.

use super::live::Live;
use super::time::LocalTime;
use leasekeeper_core::lease::LeaseEvent;
use leptos::prelude::*;
use leptos_router::components::Form;

/// Pills that set `?{param}=<value>` on `path`, one per value; the selected
/// one is marked `aria-current`. Each has `data-testid="filter-<value>"`.
#[component]
pub fn FilterPills(
    path: &'static str,
    param: &'static str,
    values: Vec<&'static str>,
    #[prop(into)] selected: Signal<&'static str>,
    testid: &'static str,
    label: &'static str,
) -> impl IntoView {
    view! {
        <nav class="mt-4 flex flex-wrap gap-2" data-testid=testid aria-label=label>
            {values
                .into_iter()
                .map(|value| {
                    let is_selected = move || selected.get() == value;
                    view! {
                        <a
                            href=format!("{path}?{param}={value}")
                            data-testid=format!("filter-{value}")
                            aria-current=move || is_selected().then_some("page")
                            class=move || {
                                if is_selected() {
                                    "rounded-full bg-slate-900 px-3 py-1 text-sm text-white"
                                } else {
                                    "rounded-full bg-white px-3 py-1 text-sm text-slate-700 ring-1 ring-slate-300 hover:bg-slate-100"
                                }
                            }
                        >
                            {value}
                        </a>
                    }
                })
                .collect_view()}
        </nav>
    }
}

/// A GET form that looks an id up on `path`, keeping the current filter.
/// Testids: `<prefix>-lookup-input`, `<prefix>-lookup-submit`.
#[component]
pub fn LookupForm(
    path: &'static str,
    param: &'static str,
    #[prop(into)] keep: Signal<&'static str>,
    prefix: &'static str,
    placeholder: &'static str,
) -> impl IntoView {
    let input_id = format!("{prefix}-lookup");
    view! {
        <Form method="GET" action=path>
            <input type="hidden" name=param value=move || keep.get()/>
            <div class="flex gap-2">
                <label class="sr-only" for=input_id.clone()>{placeholder}</label>
                <input
                    id=input_id
                    name="id"
                    inputmode="numeric"
                    placeholder=placeholder
                    class="w-32 rounded border border-slate-300 px-2 py-1 text-sm"
                    data-testid=format!("{prefix}-lookup-input")
                />
                <button
                    type="submit"
                    class="rounded bg-indigo-600 px-3 py-1 text-sm font-medium text-white hover:bg-indigo-700"
                    data-testid=format!("{prefix}-lookup-submit")
                >
                    "Look up"
                </button>
            </div>
        </Form>
    }
}

/// A resource's ownership history, newest first.
#[component]
pub fn HistoryList(history: Vec<LeaseEvent>) -> impl IntoView {
    view! {
        <h3 class="mt-3 text-sm font-semibold text-slate-700">"Ownership history (newest first)"</h3>
        <ol class="mt-1 divide-y divide-slate-100 text-sm" data-testid="lease-history">
            {history
                .into_iter()
                .map(|event| {
                    let holder = event.holder.clone().unwrap_or_default();
                    let who = match (&event.previous_holder, event.kind.as_str()) {
                        (Some(prev), "taken_over") => format!("{holder} took over from {prev}"),
                        (_, "operator") => operator_text(&holder, event.detail.as_ref()),
                        (_, "stale_write_refused") => {
                            let reason = event
                                .detail
                                .as_ref()
                                .and_then(|d| d.get("reason"))
                                .and_then(|r| r.as_str())
                                .unwrap_or("stale");
                            format!("{holder}: {reason}")
                        }
                        _ => holder,
                    };
                    view! {
                        <li class="flex flex-wrap gap-x-4 py-1" data-testid="history-event" data-kind=event.kind.clone()>
                            <span class="w-52 text-slate-500"><LocalTime at=event.at/></span>
                            <span class="w-36 font-medium">{event.kind.clone()}</span>
                            <span class="w-16 font-mono">{event.fencing_token.map(|t| format!("#{t}")).unwrap_or_default()}</span>
                            <span class="font-mono">{who}</span>
                        </li>
                    }
                })
                .collect_view()}
        </ol>
    }
}

/// What an operator row in a history says: the action, its target's
/// details and the instance it was taken through.
pub fn operator_text(by: &str, detail: Option<&serde_json::Value>) -> String {
    let field = |k: &str| detail.and_then(|d| d.get(k));
    let action = field("action")
        .and_then(|a| a.as_str())
        .unwrap_or("action")
        .replace('_', " ");
    let mut facts = Vec::new();
    if let Some(holder) = field("holder").and_then(|h| h.as_str()) {
        facts.push(format!("held by {holder}"));
    }
    if let Some(token) = field("fencing_token").and_then(|t| t.as_i64()) {
        facts.push(format!("token #{token}"));
    }
    if let Some(previous) = field("previous").and_then(|d| d.as_str()) {
        facts.push(format!("was {previous}"));
    }
    let facts = if facts.is_empty() {
        String::new()
    } else {
        format!(" ({})", facts.join(", "))
    };
    format!("operator: {action}{facts}, through {by}")
}

/// The one sentence that says what a fencing token is, where tokens first
/// appear on a page.
#[component]
pub fn FencingTokenNote() -> impl IntoView {
    view! {
        <p class="mt-1 text-xs text-slate-500" data-testid="fencing-token-note">
            "Token (#): the lease's fencing token, a number that rises with every new holder; a write carrying an older token than the current one is refused, so a holder that lost its lease cannot overwrite its successor."
        </p>
    }
}

/// A boxed message for errors and empty states. Errors are left out once
/// this page's instance is gone ([`ServerGone`](super::live::ServerGone) says it once instead).
#[component]
pub fn Notice(kind: &'static str, #[prop(into)] testid: String, text: String) -> impl IntoView {
    let class = match kind {
        "error" => "mt-4 rounded border border-red-300 bg-red-50 p-3 text-sm",
        "warn" => "mt-4 rounded border border-amber-300 bg-amber-50 p-3 text-sm",
        _ => "mt-6 rounded border border-dashed border-slate-300 p-6 text-center text-slate-600",
    };
    let gone = use_context::<Live>().map(|l| l.gone);
    let hidden = move || {
        kind == "error" && gone.is_some_and(|g| g.try_with(Option::is_some).unwrap_or(false))
    };
    view! { <p class=class data-testid=testid hidden=hidden>{text}</p> }
}

/// What the last control press did: its message, or its error.
/// Testids: `<prefix>-action-result`, `<prefix>-action-error`.
#[component]
pub fn ActionOutcome(
    #[prop(into)] last: Signal<Option<Result<String, crate::error::AppError>>>,
    prefix: &'static str,
) -> impl IntoView {
    move || {
        last.get().map(|r| match r {
            Ok(msg) => view! {
                <p class="mt-3 text-sm text-slate-700" data-testid=format!("{prefix}-action-result")>{msg}</p>
            }
            .into_any(),
            Err(e) => view! { <Notice kind="error" testid=format!("{prefix}-action-error") text=e.to_string()/> }
                .into_any(),
        })
    }
}

/// An operator action's confirmation: `question` (also its label),
/// `consequence`, the form that acts (`children`, an `ActionForm` holding a
/// [`ConfirmButton`]) and "Keep them", a link to `keep`. Testids:
/// `<prefix>-confirm`, `<prefix>-keep`.
#[component]
pub fn ConfirmBox(
    prefix: &'static str,
    question: String,
    #[prop(into)] consequence: String,
    keep: String,
    children: Children,
) -> impl IntoView {
    let label = question.clone();
    view! {
        <div class="mt-3 rounded border border-amber-300 bg-amber-50 p-3 text-sm" role="alertdialog"
            aria-label=label data-testid=format!("{prefix}-confirm")>
            <p class="break-words font-semibold">{question}</p>
            <p class="mt-1">{consequence}</p>
            <div class="mt-2 flex gap-2">
                {children()}
                <a href=keep class="rounded bg-white px-3 py-1 text-sm ring-1 ring-slate-300 hover:bg-slate-100" data-testid=format!("{prefix}-keep")>"Keep them"</a>
            </div>
        </div>
    }
}

/// The submit button of a [`ConfirmBox`]'s form. Testid:
/// `<prefix>-confirmed`.
#[component]
pub fn ConfirmButton(prefix: &'static str, text: &'static str) -> impl IntoView {
    view! {
        <button type="submit" class="rounded bg-red-600 px-3 py-1 text-sm font-medium text-white hover:bg-red-700" data-testid=format!("{prefix}-confirmed")>
            {text}
        </button>
    }
}

/// The classes of a table cell in column `header`: a `controls` column
/// sticks to the right edge of the scrolling table, so on a phone its
/// buttons stay on screen while the other columns scroll.
pub fn controls_class(header: &str, base: &str) -> String {
    if header == "controls" {
        format!("{base} sticky right-0 shadow-[-6px_0_6px_-6px_rgba(0,0,0,0.25)]")
    } else {
        base.to_string()
    }
}

/// A bordered, scrollable table with a header row of `headers`; the rows
/// come as children.
#[component]
pub fn DataTable(
    testid: &'static str,
    headers: Vec<&'static str>,
    children: Children,
) -> impl IntoView {
    view! {
        <div class="mt-4 overflow-x-auto rounded border border-slate-200 bg-white">
            <table class="min-w-full text-left text-sm" data-testid=testid>
                <thead class="bg-slate-100 text-xs uppercase text-slate-600">
                    <tr>
                        {headers.into_iter().map(|h| view! { <th class=controls_class(h, "px-3 py-2 bg-slate-100")>{h}</th> }).collect_view()}
                    </tr>
                </thead>
                <tbody>{children()}</tbody>
            </table>
        </div>
    }
}

/// The `before` cursor of a list page's URL (`?before=N`), if any.
pub fn before_param() -> Memo<Option<i64>> {
    let query = leptos_router::hooks::use_query_map();
    Memo::new(move |_| query.read().get("before").and_then(|b| b.parse().ok()))
}

/// Paging links under a newest-first list: "Newest" back to the first
/// page (when not on it) and "Older" to the next page (when there is
/// one). `base` is the page's URL with its other parameters, e.g.
/// `/tasks?status=failed`. Plain links: they work before hydration, and
/// the cursor stays in the URL to share or reload.
#[component]
pub fn Pager(
    base: String,
    before: Option<i64>,
    next: Option<i64>,
    testid: &'static str,
) -> impl IntoView {
    let join = if base.contains('?') { '&' } else { '?' };
    let older = next.map(|n| format!("{base}{join}before={n}"));
    let newest = before.is_some().then(|| base.clone());
    (older.is_some() || newest.is_some()).then(|| {
        view! {
            <nav class="mt-2 flex gap-3 text-sm" aria-label="Pages" data-testid=testid>
                {newest.map(|href| view! { <a class="text-indigo-700 underline" href=href data-testid=format!("{testid}-newest")>"← Newest"</a> })}
                {older.map(|href| view! { <a class="text-indigo-700 underline" href=href data-testid=format!("{testid}-older")>"Older →"</a> })}
            </nav>
        }
    })
}

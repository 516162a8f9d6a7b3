//! Pieces every dashboard page shares: the pool for server functions, the
//! refresh timer, filter pills, the lookup form, id parsing and the
//! ownership history list.

#[cfg(feature = "ssr")]
use crate::error::AppError;
pub use crate::error::{check_id, parse_id};
use crate::lease::LeaseEvent;
use leptos::prelude::*;
use leptos_router::components::Form;
use std::time::Duration;

/// The server's state, inside a server function.
#[cfg(feature = "ssr")]
pub fn state() -> Result<crate::server::AppState, AppError> {
    use_context::<crate::server::AppState>()
        .ok_or_else(|| AppError::internal("AppState missing from server function context"))
}

/// The database pool, inside a server function.
#[cfg(feature = "ssr")]
pub fn pool() -> Result<sqlx::PgPool, AppError> {
    state().map(|state| state.pool)
}

/// The resolved settings, inside a server function.
#[cfg(feature = "ssr")]
pub fn settings() -> Result<std::sync::Arc<crate::settings::Settings>, AppError> {
    state().map(|state| state.settings)
}

/// Calls `f` every `period` while the component is mounted (browser only:
/// effects do not run on the server).
pub fn every(period: Duration, f: impl Fn() + Clone + 'static) {
    Effect::new(move |_| {
        if let Ok(handle) = set_interval_with_handle(f.clone(), period) {
            on_cleanup(move || handle.clear());
        }
    });
}

/// A signal that counts seconds once hydrated; resources keyed on it refetch.
pub fn refresh_tick() -> RwSignal<u64> {
    let tick = RwSignal::new(0_u64);
    every(Duration::from_secs(1), move || tick.update(|t| *t += 1));
    tick
}

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
                            <span class="w-44 tabular-nums text-slate-500">{event.at.format("%Y-%m-%d %H:%M:%S%.3f").to_string()}</span>
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

/// A boxed message for errors and empty states.
#[component]
pub fn Notice(kind: &'static str, testid: &'static str, text: String) -> impl IntoView {
    let class = match kind {
        "error" => "mt-4 rounded border border-red-300 bg-red-50 p-3 text-sm",
        "warn" => "mt-4 rounded border border-amber-300 bg-amber-50 p-3 text-sm",
        _ => "mt-6 rounded border border-dashed border-slate-300 p-6 text-center text-slate-600",
    };
    view! { <p class=class data-testid=testid>{text}</p> }
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
                        {headers.into_iter().map(|h| view! { <th class="px-3 py-2">{h}</th> }).collect_view()}
                    </tr>
                </thead>
                <tbody>{children()}</tbody>
            </table>
        </div>
    }
}

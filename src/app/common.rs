//! Pieces every dashboard page shares: the pool for server functions, the
//! live-update context (change counter, connection state, browser clock), filter pills, the lookup form, id parsing and the
//! ownership history list.

#[cfg(feature = "ssr")]
use crate::error::AppError;
pub use crate::error::{check_id, parse_id};
use leasekeeper_core::lease::LeaseEvent;
use leptos::prelude::*;
use leptos_router::components::Form;
use std::time::Duration;

/// The server's state, inside a server function.
#[cfg(feature = "ssr")]
pub fn state() -> Result<crate::state::AppState, AppError> {
    use_context::<crate::state::AppState>()
        .ok_or_else(|| AppError::internal("AppState missing from server function context"))
}

/// The database pool, inside a server function.
#[cfg(feature = "ssr")]
pub fn pool() -> Result<sqlx::PgPool, AppError> {
    state().map(|state| state.pool)
}

/// The server's state, inside a server function that changes something:
/// 401 unless the request may take operator actions (see [`crate::ops`]).
#[cfg(feature = "ssr")]
pub async fn operator_state() -> Result<crate::state::AppState, AppError> {
    let state = state()?;
    let headers: axum::http::HeaderMap =
        leptos_axum::extract().await.map_err(AppError::internal)?;
    crate::ops::authorize(&state.settings, &headers).map_err(refused)?;
    Ok(state)
}

/// Gives a server function's refusal its own status (401, 400, 409…)
/// instead of the 500 a server function's error answers by default.
#[cfg(feature = "ssr")]
pub fn refused(e: AppError) -> AppError {
    if let Some(resp) = use_context::<leptos_axum::ResponseOptions>() {
        resp.set_status(e.status());
    }
    e
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

/// How a browser learns of changes: the header shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LiveState {
    /// Not connected yet (and, without JavaScript, never: reload to refresh).
    Connecting,
    /// The server's event stream is open; changes arrive as they commit.
    Live,
    /// The stream dropped; the browser reconnects and meanwhile refetches
    /// every [`FALLBACK_POLL`].
    Polling,
}

impl LiveState {
    /// The state's name, for `data-state`.
    pub fn as_str(self) -> &'static str {
        match self {
            LiveState::Connecting => "connecting",
            LiveState::Live => "live",
            LiveState::Polling => "polling",
        }
    }
}

/// How often pages refetch while the event stream is down.
pub const FALLBACK_POLL: Duration = Duration::from_secs(5);

/// The live-update context every page reads: a change counter that moves
/// when the server announces a change, the connection state, and the
/// browser's clock (milliseconds since the epoch, 0 before hydration) for
/// countdowns and local times.
#[derive(Clone, Copy, Debug)]
pub struct Live {
    /// Moves on every announced change (and every fallback poll).
    pub changes: RwSignal<u64>,
    /// The event stream's state.
    pub state: RwSignal<LiveState>,
    /// The browser's clock, updated four times a second; 0 on the server.
    pub clock: RwSignal<f64>,
    /// Set when the operator killed the instance serving this page, with
    /// the addresses of live instances to open instead: the page then says
    /// so once, instead of an error box per failed refetch.
    pub gone: RwSignal<Option<Vec<String>>>,
}

/// Creates the live context and, in the browser, opens the event stream.
/// Called once, by the app.
pub fn provide_live() -> Live {
    let live = Live {
        changes: RwSignal::new(0),
        state: RwSignal::new(LiveState::Connecting),
        clock: RwSignal::new(0.0),
        gone: RwSignal::new(None),
    };
    provide_context(live);
    Effect::new(move |_| {
        #[cfg(feature = "hydrate")]
        {
            stream::connect(live);
            let tick = move || live.clock.set(js_sys::Date::now());
            tick();
            every(Duration::from_millis(250), tick);
        }
    });
    every(FALLBACK_POLL, move || {
        if live.state.get_untracked() != LiveState::Live && live.gone.get_untracked().is_none() {
            live.changes.update(|c| *c += 1);
        }
    });
    live
}

/// The browser side of `GET /api/events`.
#[cfg(feature = "hydrate")]
mod stream {
    use super::{Live, LiveState};
    use leptos::prelude::*;
    use wasm_bindgen::JsCast;
    use wasm_bindgen::closure::Closure;

    /// How long to wait before reopening a stream the browser gave up on.
    const REOPEN_AFTER_MS: i32 = 3_000;

    /// Opens the stream; the browser reconnects by itself after a network
    /// error, and we reopen it when it gives up (an HTTP error answer).
    pub fn connect(live: Live) {
        let Ok(source) = web_sys::EventSource::new("/api/events") else {
            live.state.set(LiveState::Polling);
            return;
        };
        // `ready` comes first on every (re)connection: refetch whatever was
        // missed while disconnected.
        let on_ready = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| {
            live.state.set(LiveState::Live);
            live.changes.update(|c| *c += 1);
        });
        let on_change = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| {
            live.changes.update(|c| *c += 1);
        });
        let source_for_error = source.clone();
        let on_error = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| {
            live.state.set(LiveState::Polling);
            if source_for_error.ready_state() == web_sys::EventSource::CLOSED {
                let reopen = Closure::once_into_js(move || connect(live));
                if let Some(window) = web_sys::window() {
                    let _ = window.set_timeout_with_callback_and_timeout_and_arguments_0(
                        reopen.unchecked_ref(),
                        REOPEN_AFTER_MS,
                    );
                }
            }
        });
        let _ = source.add_event_listener_with_callback("ready", on_ready.as_ref().unchecked_ref());
        let _ =
            source.add_event_listener_with_callback("change", on_change.as_ref().unchecked_ref());
        source.set_onerror(Some(on_error.as_ref().unchecked_ref()));
        // The stream lives as long as the page: the closures must too.
        on_ready.forget();
        on_change.forget();
        on_error.forget();
    }
}

/// A signal that moves whenever the server announces a change (or, while
/// the stream is down, every [`FALLBACK_POLL`]); resources keyed on it
/// refetch. Constant on the server.
pub fn refresh_tick() -> Signal<u64> {
    match use_context::<Live>() {
        Some(live) => live.changes.into(),
        None => Signal::stored(0),
    }
}

/// `ms` (a time left, by the database clock when the page data was read)
/// counting down by the browser's clock from the moment it is first seen
/// in the browser; constant on the server. Read it with `try_get`: a row
/// removed by a refetch can be disposed while a clock tick is still
/// re-running its view, and a plain `get` then panics.
pub fn remaining(ms: i64) -> Signal<i64> {
    let Some(live) = use_context::<Live>() else {
        return Signal::stored(ms);
    };
    let seen_at = StoredValue::new(None::<f64>);
    Signal::derive(move || {
        let now = live.clock.get();
        if now == 0.0 {
            return ms;
        }
        // Anchored at the real moment it is first seen, not at the last
        // tick (up to 250 ms earlier): counting from the tick made the
        // countdown reach zero, and the page say "late", before the
        // database's deadline had passed.
        let start = seen_at.try_get_value().flatten().unwrap_or_else(|| {
            let at = first_seen_at(now);
            seen_at.try_set_value(Some(at));
            at
        });
        ms - (now - start).max(0.0) as i64
    })
}

/// The browser's clock right now (the last tick, `tick`, on the server).
fn first_seen_at(tick: f64) -> f64 {
    #[cfg(feature = "hydrate")]
    {
        let _ = tick;
        js_sys::Date::now()
    }
    #[cfg(not(feature = "hydrate"))]
    {
        tick
    }
}

/// "in 4.2 s" / "4.2 s ago" for a time `ms` milliseconds away.
pub fn relative(ms: i64) -> String {
    let secs = ms.abs() as f64 / 1000.0;
    let amount = if secs < 60.0 {
        format!("{secs:.1} s")
    } else if secs < 3600.0 {
        format!("{:.0} min", secs / 60.0)
    } else {
        format!("{:.1} h", secs / 3600.0)
    };
    if ms >= 0 {
        format!("in {amount}")
    } else {
        format!("{amount} ago")
    }
}

/// The header's live indicator.
#[component]
pub fn LiveBadge() -> impl IntoView {
    let state = use_context::<Live>()
        .map(|l| l.state)
        .unwrap_or_else(|| RwSignal::new(LiveState::Connecting));
    let gone = use_context::<Live>().map(|l| l.gone);
    let is_gone = move || gone.is_some_and(|g| g.get().is_some());
    let text = move || match state.get() {
        _ if is_gone() => "instance gone".to_string(),
        LiveState::Connecting => "not live: reload to refresh".to_string(),
        LiveState::Live => "live".to_string(),
        LiveState::Polling => format!(
            "reconnecting; refreshing every {} s",
            FALLBACK_POLL.as_secs()
        ),
    };
    let class = move || match state.get() {
        LiveState::Live => "bg-emerald-100 text-emerald-800",
        LiveState::Polling => "bg-amber-100 text-amber-800",
        LiveState::Connecting => "bg-slate-100 text-slate-600",
    };
    view! {
        <span
            class=move || format!("rounded-full px-2 py-0.5 text-xs {}", class())
            data-testid="live-status"
            data-state=move || if is_gone() { "gone" } else { state.get().as_str() }
            role="status"
        >
            {text}
        </span>
    }
}

/// A time shown in the viewer's local time zone once hydrated (UTC in the
/// server's HTML), with the UTC instant in `datetime` and the tooltip.
#[component]
pub fn LocalTime(at: chrono::DateTime<chrono::Utc>) -> impl IntoView {
    let utc = at.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string();
    let iso = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let clock = use_context::<Live>().map(|l| l.clock);
    let utc_text = utc.clone();
    let text = move || {
        let hydrated = clock.map(|c| c.get() > 0.0).unwrap_or(false);
        if hydrated {
            local_text(at).unwrap_or_else(|| utc_text.clone())
        } else {
            utc_text.clone()
        }
    };
    view! {
        <time datetime=iso title=utc class="tabular-nums">
            {text}
        </time>
    }
}

/// `at` in the browser's time zone, `YYYY-MM-DD HH:MM:SS.mmm`.
#[cfg(feature = "hydrate")]
fn local_text(at: chrono::DateTime<chrono::Utc>) -> Option<String> {
    let d = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(
        at.timestamp_millis() as f64
    ));
    Some(format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}",
        d.get_full_year(),
        d.get_month() + 1,
        d.get_date(),
        d.get_hours(),
        d.get_minutes(),
        d.get_seconds(),
        d.get_milliseconds()
    ))
}

#[cfg(not(feature = "hydrate"))]
fn local_text(_at: chrono::DateTime<chrono::Utc>) -> Option<String> {
    None
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
/// this page's instance is gone ([`ServerGone`] says it once instead).
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

/// Once the operator killed the instance serving this page: one banner
/// saying so, with links to the live instances.
#[component]
pub fn ServerGone() -> impl IntoView {
    let gone = use_context::<Live>().map(|l| l.gone);
    move || {
        gone.and_then(|g| g.get()).map(|others| {
            view! {
                <p class="mb-4 rounded border border-red-300 bg-red-50 p-3 text-sm" data-testid="server-gone" role="alert">
                    <b>"You killed the instance serving this page: nothing here updates any more."</b>
                    <LiveInstanceLinks
                        others
                        lead=" Open a live instance: "
                        none=" No other instance is alive: start one (leasekeeper serve) and open it."
                        testid="server-gone-link"
                    />
                </p>
            }
        })
    }
}

/// Links to the instances pages of the live instances at `others`
/// (addresses) after `lead`, each with `data-testid=testid`; `none` when
/// there is none (`data-testid="<testid>-none"`).
#[component]
pub fn LiveInstanceLinks(
    others: Vec<String>,
    lead: &'static str,
    none: &'static str,
    testid: &'static str,
) -> impl IntoView {
    if others.is_empty() {
        leptos::either::Either::Left(
            view! { <span data-testid=format!("{testid}-none")>{none}</span> },
        )
    } else {
        leptos::either::Either::Right(view! {
            <span>{lead}</span>
            {others.into_iter().map(|a| view! {
                <a class="mr-2 font-mono text-indigo-700 underline" data-testid=testid href=format!("http://{a}/instances")>{a.clone()}</a>
            }).collect_view()}
        })
    }
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

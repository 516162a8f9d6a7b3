//! The live-update context every page reads: a change counter that moves
//! when the server announces a change (`GET /api/events`), the connection
//! state and its badge, and the banner for a page whose instance was killed.

use leptos::prelude::*;
use std::time::Duration;

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

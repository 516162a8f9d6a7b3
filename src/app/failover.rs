//! The two pictures that explain a failover without reading logs: a
//! resource's ownership timeline, and the failover stopwatch.

use super::live::refresh_tick;
use super::time::remaining;
use super::widgets::Notice;
use crate::error::AppError;
use leasekeeper_core::lease::Failover;
use leasekeeper_core::lease::history::timeline::{TermEnd, Timeline};
use leptos::prelude::*;
use serde::{Deserialize, Serialize};

/// Which resource a timeline is about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimelineOf {
    /// A resource by name (`task:7`, `singleton:generator`).
    Resource(String),
    /// The resource of lease row `id`.
    Lease(i64),
}

/// A timeline and the resource it is about.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimelineView {
    /// The resource.
    pub resource: String,
    /// Its terms and marks.
    pub timeline: Timeline,
}

/// The timeline of `of` from its newest events, as of the database's now;
/// `None` for a lease id that does not exist.
#[server(prefix = "/sfn")]
pub async fn get_timeline(of: TimelineOf) -> Result<Option<TimelineView>, AppError> {
    // The most events one timeline reads (newest first).
    const TIMELINE_EVENTS: i64 = 400;
    let state = super::context::state()?;
    crate::reads::read!(state, |conn| -> Result<_, AppError> {
        let resource = match of {
            // The lease store's own rules: a NUL reaching PostgreSQL fails the
            // query (500) rather than finding nothing.
            TimelineOf::Resource(r) => leasekeeper_core::lease::Resource::parse(r)
                .map_err(|e| AppError::BadRequest(e.to_string()))?
                .as_str()
                .to_owned(),
            TimelineOf::Lease(id) => {
                crate::error::check_id(id)?;
                match leasekeeper_core::lease::store::get(&mut *conn, state.schema(), id).await? {
                    Some(lease) => lease.resource,
                    None => return Ok(None),
                }
            }
        };
        let events = leasekeeper_core::lease::store::history(
            &mut *conn,
            state.schema(),
            &resource,
            TIMELINE_EVENTS,
        )
        .await?;
        let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *conn)
            .await?;
        Ok(Some(TimelineView {
            timeline: leasekeeper_core::lease::history::timeline::build(&events, now),
            resource,
        }))
    })
    .map_err(super::context::refused)
}

const WIDTH: f64 = 1000.0;
const LABEL: f64 = 170.0;
const LANE: f64 = 30.0;

/// A resource's ownership timeline: a lane per holder, a bar per term
/// (token inside), renew ticks, shaded unowned gaps, takeover and expiry
/// markers, refused stale writes in red. Updates live; placed once per page
/// (not inside a detail that re-renders) so an update redraws it in place.
#[component]
pub fn OwnershipTimeline(#[prop(into)] of: Signal<Option<TimelineOf>>) -> impl IntoView {
    let tick = refresh_tick();
    // Seconds of history drawn (`None`: all of it). A recent window by
    // default: over the whole history, the terms that matter now are a
    // sliver.
    let window = RwSignal::new(Some(DEFAULT_WINDOW_SECS));
    let timeline = Resource::new(
        move || (of.get(), tick.get()),
        |(of, _)| async move {
            match of {
                None => Ok(None),
                Some(of) => get_timeline(of).await,
            }
        },
    );
    view! {
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                match timeline.await {
                    Ok(None) => ().into_any(),
                    Ok(Some(v)) => view! {
                        <section class="mt-3 rounded border border-slate-200 bg-white p-3" data-testid="timeline" data-resource=v.resource.clone()
                            data-window=move || window.get().map(|w| w.to_string()).unwrap_or_else(|| "all".into())>
                            <div class="flex flex-wrap items-baseline justify-between gap-2">
                                <h3 class="text-sm font-semibold text-slate-700">{format!("Ownership timeline of {}", v.resource)}</h3>
                                <WindowPicker window/>
                            </div>
                            {if v.timeline.terms.is_empty() {
                                view! { <Notice kind="empty" testid="timeline-empty" text="Nobody has held this resource yet.".to_string()/> }.into_any()
                            } else {
                                let whole = v.timeline;
                                (move || {
                                    let shown = match window.get() {
                                        Some(secs) => whole.recent(chrono::Duration::seconds(secs)),
                                        None => whole.clone(),
                                    };
                                    let older = whole.terms.len() - shown.terms.len();
                                    view! {
                                        <TimelineSvg timeline=shown/>
                                        {(older > 0).then(|| view! {
                                            <p class="text-xs text-slate-500" data-testid="timeline-older">
                                                {format!("{older} older {} before this window (choose “all” to see {}).",
                                                    if older == 1 { "term" } else { "terms" },
                                                    if older == 1 { "it" } else { "them" })}
                                            </p>
                                        })}
                                    }
                                }).into_any()
                            }}
                        </section>
                    }.into_any(),
                    Err(e) => view! { <Notice kind="error" testid="timeline-error" text=e.to_string()/> }.into_any(),
                }
            })}
        </Transition>
    }
}

/// The window a timeline opens with, in seconds.
pub const DEFAULT_WINDOW_SECS: i64 = 60;

/// The windows a timeline offers: label, seconds (`None`: all).
const WINDOWS: [(&str, Option<i64>); 5] = [
    ("15 s", Some(15)),
    ("1 min", Some(60)),
    ("10 min", Some(600)),
    ("1 h", Some(3_600)),
    ("all", None),
];

/// Buttons that choose how much history a timeline draws (browser only;
/// before hydration it shows the default window).
#[component]
fn WindowPicker(window: RwSignal<Option<i64>>) -> impl IntoView {
    view! {
        <div class="flex gap-1 text-xs" role="group" aria-label="How much history to draw" data-testid="timeline-window">
            {WINDOWS.into_iter().map(|(label, secs)| {
                let testid = format!("timeline-window-{}", secs.map(|s| s.to_string()).unwrap_or_else(|| "all".into()));
                view! {
                    <button type="button" data-testid=testid
                        aria-pressed=move || (window.get() == secs).to_string()
                        class=move || if window.get() == secs {
                            "rounded bg-slate-800 px-2 py-0.5 text-white"
                        } else {
                            "rounded bg-white px-2 py-0.5 text-slate-700 ring-1 ring-slate-300 hover:bg-slate-100"
                        }
                        on:click=move |_| window.set(secs)>
                        {label}
                    </button>
                }
            }).collect_view()}
        </div>
    }
}

#[component]
fn TimelineSvg(timeline: Timeline) -> impl IntoView {
    let holders = timeline.holders();
    let span_ms = (timeline.to - timeline.from).num_milliseconds().max(1) as f64;
    let x = move |at: chrono::DateTime<chrono::Utc>| {
        LABEL + (at - timeline.from).num_milliseconds() as f64 / span_ms * (WIDTH - LABEL - 10.0)
    };
    let lane = |holder: &str| holders.iter().position(|h| h == holder).unwrap_or(0) as f64;
    let height = LANE * holders.len().max(1) as f64 + 24.0;
    let bottom = height - 20.0;
    let gaps = timeline.gaps().into_iter().map(|(a, b)| view! {
        <rect data-testid="timeline-gap" x=x(a) y=0 width=(x(b) - x(a)).max(0.5) height=bottom fill="#f1f5f9">
            <title>{format!("unowned for {:.1} s", (b - a).num_milliseconds() as f64 / 1000.0)}</title>
        </rect>
    }).collect_view();
    let labels = holders.iter().enumerate().map(|(i, h)| view! {
        <text x=4 y=LANE * i as f64 + 19.0 font-size="13" class="fill-slate-700" font-family="monospace" data-testid="timeline-label">
            {if h.len() > 22 { format!("{}…", &h[..21]) } else { h.clone() }}
        </text>
    }).collect_view();
    let terms = timeline.terms.iter().map(|t| {
        let y = LANE * lane(&t.holder) + 4.0;
        let (x0, x1) = (x(t.start), x(t.end));
        let fill = match t.end_kind {
            TermEnd::Held => "#10b981",
            TermEnd::Released => "#64748b",
            TermEnd::Expired | TermEnd::TakenOver => "#f59e0b",
            TermEnd::Deleted => "#94a3b8",
        };
        let ticks = t.renewals.iter().map(|r| view! {
            <line data-testid="timeline-renew" x1=x(*r) x2=x(*r) y1=y y2=y + 22.0 stroke="white" stroke-width="1"/>
        }).collect_view();
        let took_over = t.took_over.then(|| view! {
            <path data-testid="timeline-takeover" d=format!("M{x0} {} l5 -7 l-10 0 z", y - 1.0) fill="#dc2626">
                <title>{format!("{} took over (token #{})", t.holder, t.token)}</title>
            </path>
        });
        let expired = matches!(t.end_kind, TermEnd::Expired | TermEnd::TakenOver).then(|| view! {
            <text data-testid="timeline-expiry" x=x1 y=y + 16.0 font-size="13" fill="#b91c1c" text-anchor="middle">"×"</text>
        });
        view! {
            <g data-testid="timeline-term" data-token=t.token data-holder=t.holder.clone() data-end=t.end_kind.as_str()>
                <rect x=x0 y=y width=(x1 - x0).max(2.0) height=22 rx=3 fill=fill>
                    <title>{format!("{} #{}: {} for {:.1} s, {} renewals", t.holder, t.token, t.end_kind.as_str(),
                        (t.end - t.start).num_milliseconds() as f64 / 1000.0, t.renewals.len())}</title>
                </rect>
                {ticks}
                <text x=x0 + 4.0 y=y + 15.0 font-size="11" fill="white" font-family="monospace">{format!("#{}", t.token)}</text>
                {took_over}
                {expired}
            </g>
        }
    }).collect_view();
    let marks = timeline.marks.iter().map(|m| {
        let y = m.holder.as_deref().filter(|h| holders.iter().any(|x| x == h)).map(|h| LANE * lane(h) + 15.0).unwrap_or(bottom - 4.0);
        let (testid, fill) = if m.kind == "operator" { ("timeline-operator", "#7c3aed") } else { ("timeline-refused", "#dc2626") };
        view! {
            <circle data-testid=testid cx=x(m.at) cy=y r=5 fill=fill stroke="white" stroke-width="1.5">
                <title>{m.text.clone()}</title>
            </circle>
        }
    }).collect_view();
    let span = format!("-{:.0} s", span_ms / 1000.0);
    view! {
        // On a phone the drawing keeps a readable size and scrolls inside
        // its box; the page itself never scrolls sideways.
        <div class="mt-1 overflow-x-auto" data-testid="timeline-scroll">
            <svg viewBox=format!("0 0 {WIDTH} {height}") width="100%" class="min-w-[720px] rounded border border-slate-200 bg-white" role="img"
                aria-label="Ownership timeline: one bar per term">
                {gaps}
                {labels}
                {terms}
                {marks}
                <text x=LABEL y=height - 5.0 font-size="12" class="fill-slate-500" data-testid="timeline-span">{span}</text>
                <text x=WIDTH - 10.0 y=height - 5.0 font-size="12" text-anchor="end" class="fill-slate-500">"now"</text>
            </svg>
        </div>
        <p class="mt-1 flex flex-wrap gap-x-4 text-xs text-slate-500">
            <span><span class="inline-block h-2 w-3 bg-emerald-500"></span>" held"</span>
            <span><span class="inline-block h-2 w-3 bg-slate-500"></span>" released"</span>
            <span><span class="inline-block h-2 w-3 bg-amber-500"></span>" expired (× = ran out)"</span>
            <span>"white ticks: renewals · ▼ takeover · red dot: refused stale write · violet: operator · shaded: nobody held it"</span>
        </p>
    }
}

/// The stopwatch's rows and the bound they are judged against.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StopwatchView {
    /// Newest first.
    pub rows: Vec<Failover>,
    /// TTL + renew interval, in milliseconds: the longest a takeover should
    /// take after a holder dies.
    pub bound_ms: i64,
}

/// The newest failovers.
#[server(prefix = "/sfn")]
pub async fn get_failovers() -> Result<StopwatchView, AppError> {
    let state = super::context::state()?;
    let rows = crate::reads::read!(state, |c| leasekeeper_core::lease::stopwatch::recent(
        c,
        state.schema(),
        10
    )
    .await)
    .map_err(super::context::refused)?;
    let bound = state.settings.lease_ttl + state.settings.renew_interval;
    Ok(StopwatchView {
        rows,
        bound_ms: i64::try_from(bound.as_millis()).unwrap_or(i64::MAX),
    })
}

/// The failover stopwatch: for each lease a killed worker or instance held
/// (or a silently dead holder left), the time until another holder took it
/// over, next to the bound TTL + renew interval; a running clock while it
/// waits.
#[component]
pub fn Stopwatch() -> impl IntoView {
    let tick = refresh_tick();
    let view_data = Resource::new(move || tick.get(), |_| get_failovers());
    view! {
        <section class="mt-6 rounded border border-slate-200 bg-white p-4" data-testid="stopwatch">
            <h2 class="text-lg font-semibold">"Failover stopwatch"</h2>
            <p class="text-sm text-slate-600">
                "From a kill (or a holder's last renewal, when it went silent: crashed, stalled or paused) to another holder's term with a higher fencing token. The bound, TTL + renew interval, assumes a contender is free to claim at once; busy workers claim only between tasks, so a full queue can take longer."
            </p>
            <Transition fallback=|| view! { <p class="text-sm text-slate-500">"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match view_data.await {
                        Ok(v) if v.rows.is_empty() => view! {
                            <Notice kind="empty" testid="stopwatch-empty" text="No failover yet. Kill a busy worker or an instance to start the stopwatch.".to_string()/>
                        }.into_any(),
                        Ok(v) => view! { <StopwatchRows view=v/> }.into_any(),
                        Err(e) => view! { <Notice kind="error" testid="stopwatch-error" text=e.to_string()/> }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

#[component]
fn StopwatchRows(view: StopwatchView) -> impl IntoView {
    let bound_s = view.bound_ms as f64 / 1000.0;
    view! {
        <ol class="mt-2 divide-y divide-slate-100 text-sm">
            {view.rows.into_iter().map(|f| {
                let ended = f.ended.clone();
                let waiting = f.elapsed_ms.is_none() && ended.is_none();
                let over = f.elapsed_ms.is_some_and(|ms| ms > view.bound_ms);
                let running = remaining(-f.since_ms);
                let ended_text = ended.clone();
                let elapsed = move || match (f.elapsed_ms, &ended_text) {
                    (Some(ms), _) => format!("{:.2} s", ms as f64 / 1000.0),
                    (None, Some(how)) => how.clone(),
                    (None, None) => format!("waiting… {:.1} s", -running.try_get().unwrap_or(-f.since_ms) as f64 / 1000.0),
                };
                let class = if ended.is_some() { "text-red-700 font-semibold" } else if waiting { "text-amber-700" } else if over { "text-red-700 font-semibold" } else { "text-emerald-700" };
                let row_state = match (&ended, waiting) {
                    (Some(_), _) => "ended",
                    (None, true) => "waiting",
                    (None, false) => "taken_over",
                };
                let who = if f.cause == "killed" {
                    format!("killed {}", f.subject.clone().unwrap_or_default())
                } else {
                    format!("{} went silent", f.old_holder.clone().unwrap_or_default())
                };
                let taken = f.new_holder.clone().map(|h| format!("→ {h} #{}", f.new_token.unwrap_or_default())).unwrap_or_default();
                view! {
                    <li class="flex flex-wrap items-baseline gap-x-4 py-1" data-testid="stopwatch-row" data-resource=f.resource.clone()
                        data-state=row_state data-cause=f.cause.clone() data-subject=f.subject.clone()>
                        <span class="font-mono">{f.resource.clone()}</span>
                        <span class="text-slate-600">{format!("{who} (#{})", f.old_token.unwrap_or_default())}</span>
                        <span class="font-mono text-slate-600">{taken}</span>
                        <span class=format!("tabular-nums {class}") data-testid="stopwatch-elapsed" data-ms=f.elapsed_ms.map(|m| m.to_string())>{elapsed}</span>
                        {f.rule.clone().map(|rule| {
                            let (text, title) = if rule == "session" {
                                ("by its session", "its holder was found dead (process crashed, worker killed, stream closed): ended at once")
                            } else {
                                ("by the TTL", "its holder went silent (paused, cut off, or nothing vouched for it): ended when its lease ran out")
                            };
                            view! {
                                <span class="rounded bg-slate-100 px-1.5 text-xs text-slate-700" data-testid="stopwatch-rule" data-rule=rule title=title>{text}</span>
                            }
                        })}
                        {ended.is_none().then(|| view! {
                            <span class="tabular-nums text-slate-500" data-testid="stopwatch-bound" data-ms=view.bound_ms>
                                {format!("bound {bound_s:.1} s{}", if over { " — over: no contender claimed it sooner" } else { "" })}
                            </span>
                        })}
                        {ended.as_ref().map(|how| view! {
                            <span class="text-xs text-red-700" data-testid="stopwatch-ended">
                                {if how == "task failed" {
                                    "the task ran out of attempts (see its last error), so nobody takes its lease over".to_string()
                                } else {
                                    format!("{how}: nobody takes its lease over")
                                }}
                            </span>
                        })}
                    </li>
                }
            }).collect_view()}
        </ol>
    }
}

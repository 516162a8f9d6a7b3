//! The overview page (`/`): counts by state, throughput over the last five
//! minutes, the split-brain banner, the generator panel, and instances and
//! workers at a glance. Every live value has a `data-testid`.

use super::instances::GeneratorPanel;
use super::live::refresh_tick;
use super::widgets::Notice;
use crate::error::AppError;
use crate::overview::{Overview, Throughput};
use leasekeeper_core::instance::Instance;
use leasekeeper_core::lease::history::split_brain::SplitBrain;
use leasekeeper_core::worker::{WorkerInfo, WorkerState};
use leptos::either::Either;
use leptos::prelude::*;

/// Everything the overview shows, as this instance sees it.
#[server(prefix = "/sfn")]
pub async fn get_overview() -> Result<Overview, AppError> {
    let state = super::context::state()?;
    crate::reads::read!(state, |c| crate::overview::store::read(
        c,
        state.viewpoint()
    )
    .await)
}

/// The overview page.
#[component]
pub fn OverviewPage() -> impl IntoView {
    let tick = refresh_tick();
    let overview = Resource::new(move || tick.get(), |_| get_overview());
    view! {
        <h1 class="text-2xl font-semibold">"Overview"</h1>
        <p class="text-sm text-slate-600">
            "The whole system at a glance: tasks by state, throughput, who is alive, and whether any resource ever had two live holders."
        </p>
        <super::widgets::FencingTokenNote/>
        <Transition fallback=|| view! { <p class="mt-4 text-sm text-slate-500">"Loading the overview…"</p> }>
            {move || Suspend::new(async move {
                match overview.await {
                    Ok(o) => Either::Left(view! { <OverviewBody overview=o/> }),
                    Err(e) => Either::Right(view! {
                        <Notice kind="error" testid="overview-error" text=format!("Cannot load the overview: {e}. The page retries on the next change, and every few seconds.")/>
                    }),
                }
            })}
        </Transition>
        <super::failover::Stopwatch/>
        <div class="mt-6">
            <GeneratorPanel/>
        </div>
    }
}

#[component]
fn OverviewBody(overview: Overview) -> impl IntoView {
    let c = &overview.counts;
    let late = if c.tasks_late >= leasekeeper_core::counts::LATE_CAP {
        format!("{}+", c.tasks_late)
    } else {
        c.tasks_late.to_string()
    };
    let no_tasks = (c.tasks_total() == 0).then(|| view! {
        <Notice kind="empty" testid="overview-no-tasks" text="No tasks yet: start the generator below, or enqueue one with POST /api/tasks {\"task_data\": {\"sleep_duration_seconds\": 5}}.".to_string()/>
    });
    let workers_line = format!("{} busy", overview.workers_busy);
    view! {
        <SplitBrainNotice split=overview.split_brain.clone()/>
        <div class="mt-4 grid grid-cols-2 gap-3 sm:grid-cols-5 lg:grid-cols-9" data-testid="overview-counts">
            <CountCard label="pending" href="/tasks?status=pending" testid="count-pending" value=c.tasks_pending.to_string()/>
            <CountCard label="started" href="/tasks?status=started" testid="count-started" value=c.tasks_started.to_string()/>
            <CountCard label="late" href="/tasks?status=started" testid="count-late" value=late tone=warn(c.tasks_late)/>
            <CountCard label="processed" href="/tasks?status=processed" testid="count-processed" value=c.tasks_processed.to_string()/>
            <CountCard label="failed" href="/tasks?status=failed" testid="count-failed" value=c.tasks_failed.to_string() tone=warn(c.tasks_failed)/>
            <CountCard label="cancelled" href="/tasks?status=cancelled" testid="count-cancelled" value=c.tasks_cancelled.to_string()/>
            <CountCard label="waiting" href="/tasks?status=waiting" testid="count-waiting" value=c.tasks_waiting.to_string()/>
            <CountCard label="leases active" href="/leases?state=active" testid="count-leases-active" value=c.leases_active.to_string()/>
            <CountCard label="workers alive" href="/workers" testid="count-workers-alive" value=overview.workers_alive.to_string()>
                <span class="text-xs text-slate-500" data-testid="count-workers-busy" data-value=overview.workers_busy>{workers_line}</span>
            </CountCard>
            <CountCard label="instances alive" href="/instances" testid="count-instances-alive" value=overview.instances_alive.to_string()/>
        </div>
        {no_tasks}
        <ThroughputChart throughput=overview.throughput.clone()/>
        <div class="mt-6 grid grid-cols-1 gap-4 md:grid-cols-2">
            <InstancesGlance instances=overview.instances.clone()/>
            <WorkersGlance workers=overview.workers.clone()/>
        </div>
    }
}

/// Red when there is something to look at.
fn warn(n: i64) -> &'static str {
    if n > 0 { "text-red-700" } else { "" }
}

/// One number with its label, linking to the page that lists them.
#[component]
fn CountCard(
    label: &'static str,
    href: &'static str,
    testid: &'static str,
    value: String,
    #[prop(default = "")] tone: &'static str,
    #[prop(optional)] children: Option<Children>,
) -> impl IntoView {
    view! {
        <a href=href class="block rounded border border-slate-200 bg-white p-3 hover:border-indigo-300">
            <div class="text-xs uppercase tracking-wide text-slate-500">{label}</div>
            <div class=format!("text-2xl font-semibold tabular-nums {tone}") data-testid=testid data-value=value.clone()>
                {value.clone()}
            </div>
            {children.map(|c| c())}
        </a>
    }
}

#[component]
fn SplitBrainNotice(split: SplitBrain) -> impl IntoView {
    if split.overlaps.is_empty() {
        let span = if split.covered_secs >= 120 {
            format!("{} minutes", split.covered_secs / 60)
        } else {
            format!("{} s", split.covered_secs)
        };
        return Either::Left(view! {
            <p class="mt-4 rounded border border-emerald-300 bg-emerald-50 p-3 text-sm text-emerald-900" data-testid="split-brain-ok">
                {format!("No split brain seen in the last {span} ({} lease events checked): no resource had two live holders.", split.events_checked)}
            </p>
        });
    }
    Either::Right(view! {
        <section class="mt-4 rounded border-2 border-red-500 bg-red-50 p-3 text-sm text-red-900" data-testid="split-brain-banner" role="alert">
            <h2 class="font-semibold">"Split brain: a resource had two live holders at once"</h2>
            <ul class="mt-1 list-disc pl-5">
                {split
                    .overlaps
                    .into_iter()
                    .map(|o| {
                        let when = o.at.format("%H:%M:%S%.3f").to_string();
                        let until = o.other_expires_at.map(|t| t.format("%H:%M:%S%.3f").to_string()).unwrap_or_default();
                        let text = if o.source == "tasks" {
                            format!(
                                ": the lease names {} (#{}) but the task row names {} (#{})",
                                o.holder.unwrap_or_default(), o.fencing_token.unwrap_or_default(),
                                o.other_holder.unwrap_or_default(), o.other_token.unwrap_or_default(),
                            )
                        } else {
                            format!(
                                ": {} (#{}) took it at {when} while {} (#{}) held it until {until}",
                                o.holder.unwrap_or_default(), o.fencing_token.unwrap_or_default(),
                                o.other_holder.unwrap_or_default(), o.other_token.unwrap_or_default(),
                            )
                        };
                        view! {
                            <li>
                                <b class="font-mono" data-testid="split-brain-resource">{o.resource}</b>
                                {text}
                            </li>
                        }
                    })
                    .collect_view()}
            </ul>
        </section>
    })
}

/// Completed (green) and failed (red) tasks per bucket, as stacked bars.
#[component]
fn ThroughputChart(throughput: Throughput) -> impl IntoView {
    const HEIGHT: f64 = 60.0;
    const BAR: f64 = 10.0;
    let peak = throughput
        .buckets
        .iter()
        .map(|b| b.completed + b.failed)
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let completed: i64 = throughput.buckets.iter().map(|b| b.completed).sum();
    let failed: i64 = throughput.buckets.iter().map(|b| b.failed).sum();
    let width = BAR * throughput.buckets.len().max(1) as f64;
    let minutes = throughput.buckets.len() as i64 * throughput.bucket_secs / 60;
    let bars = throughput
        .buckets
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let x = i as f64 * BAR;
            let done_h = b.completed as f64 / peak * HEIGHT;
            let fail_h = b.failed as f64 / peak * HEIGHT;
            let title = format!("{} completed, {} failed", b.completed, b.failed);
            view! {
                <g data-testid="throughput-bar" data-completed=b.completed data-failed=b.failed data-start-ms=b.start_ms>
                    <title>{title}</title>
                    <rect x=x + 1.0 y=HEIGHT - done_h width=BAR - 2.0 height=done_h class="fill-emerald-500"/>
                    <rect x=x + 1.0 y=HEIGHT - done_h - fail_h width=BAR - 2.0 height=fail_h class="fill-red-500"/>
                </g>
            }
        })
        .collect_view();
    view! {
        <section class="mt-6 rounded border border-slate-200 bg-white p-4">
            <div class="flex flex-wrap items-baseline justify-between gap-2">
                <h2 class="text-lg font-semibold">"Throughput"</h2>
                <p class="text-sm text-slate-600">
                    <span class="font-semibold tabular-nums text-emerald-700" data-testid="throughput-completed">{completed}</span>
                    " completed, "
                    <span class="font-semibold tabular-nums text-red-700" data-testid="throughput-failed">{failed}</span>
                    {format!(" failed in the last {minutes} minutes, per {} s", throughput.bucket_secs)}
                </p>
            </div>
            <svg
                viewBox=format!("0 0 {width} {HEIGHT}")
                preserveAspectRatio="none"
                class="mt-2 h-24 w-full rounded bg-slate-50"
                role="img"
                aria-label="Tasks completed and failed per time bucket"
                data-testid="throughput-chart"
            >
                {bars}
            </svg>
            {(!throughput.sampling).then(|| view! {
                <p class="mt-1 text-xs text-slate-500">"This instance has just started sampling; bars appear within seconds."</p>
            })}
        </section>
    }
}

#[component]
fn InstancesGlance(instances: Vec<Instance>) -> impl IntoView {
    view! {
        <section class="rounded border border-slate-200 bg-white p-4" data-testid="overview-instances">
            <h2 class="text-lg font-semibold"><a class="hover:underline" href="/instances">"Instances"</a></h2>
            {if instances.is_empty() {
                Either::Left(view! { <p class="mt-2 text-sm text-slate-600">"No instance has registered yet."</p> })
            } else {
                Either::Right(view! {
                    <ul class="mt-2 divide-y divide-slate-100 text-sm">
                        {instances.into_iter().take(12).map(|i| {
                            let (label, class) = if i.alive {
                                ("alive", "bg-emerald-100 text-emerald-800")
                            } else if i.stopped_at.is_some() {
                                ("stopped", "bg-slate-100 text-slate-600")
                            } else {
                                ("dead", "bg-red-100 text-red-800")
                            };
                            view! {
                                <li class="flex flex-wrap items-center gap-x-3 py-1" data-testid="overview-instance" data-instance=i.id.clone() data-alive=i.alive.to_string()>
                                    <span class="font-mono">{i.id.clone()}</span>
                                    <span class=format!("rounded px-2 py-0.5 text-xs font-medium {class}")>{label}</span>
                                    {i.holds_generator.then(|| view! { <span class="text-xs text-indigo-700">"holds the generator"</span> })}
                                </li>
                            }
                        }).collect_view()}
                    </ul>
                })
            }}
        </section>
    }
}

#[component]
fn WorkersGlance(workers: Vec<WorkerInfo>) -> impl IntoView {
    view! {
        <section class="rounded border border-slate-200 bg-white p-4" data-testid="overview-workers">
            <h2 class="text-lg font-semibold"><a class="hover:underline" href="/workers">"Workers"</a></h2>
            {if workers.is_empty() {
                Either::Left(view! {
                    <p class="mt-2 text-sm text-slate-600" data-testid="overview-workers-empty">
                        "No worker is alive: spawn one on the " <a class="text-indigo-700 underline" href="/workers">"workers page"</a>
                        ", or run `leasekeeper worker --server http://127.0.0.1:3000`."
                    </p>
                })
            } else {
                Either::Right(view! {
                    <ul class="mt-2 divide-y divide-slate-100 text-sm">
                        {workers.into_iter().take(24).map(|w| {
                            let holds = match (w.state, w.task_id) {
                                (WorkerState::Working | WorkerState::Paused, Some(t)) => Some(view! {
                                    <a class="text-indigo-700 underline" href=format!("/tasks?id={t}")>
                                        {format!("task {t} #{}", w.fencing_token.unwrap_or_default())}
                                    </a>
                                }),
                                _ => None,
                            };
                            view! {
                                <li class="flex flex-wrap items-center gap-x-3 py-1" data-testid="overview-worker" data-worker=w.id.clone() data-state=w.state.as_str()>
                                    <span class="font-mono">{w.id.clone()}</span>
                                    <span class="text-xs text-slate-600">{w.state.as_str()}</span>
                                    {holds}
                                </li>
                            }
                        }).collect_view()}
                    </ul>
                })
            }}
        </section>
    }
}

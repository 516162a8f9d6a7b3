//! The dashboard: HTML shell, router and pages, shared by the server (which
//! renders them) and the browser (which hydrates them).

mod access;
mod audit;
pub mod context;
mod failed;
mod failover;
mod instances;
mod leases;
pub mod live;
mod overview;
mod queues;
mod schedules;
mod tasks;
pub mod time;
pub mod widgets;
mod workers;
mod workflows;

pub use access::{Access, GetAccess, SignIn, SignOut, get_access, sign_in, sign_out};
pub use audit::{AuditPage, GetAudit, get_audit};
pub use failed::{
    DeadLetters, GetFailedGroups, RetryFailedGroup, get_failed_groups, retry_failed_group,
};
pub use failover::{
    OwnershipTimeline, Stopwatch, StopwatchView, TimelineOf, TimelineView, get_failovers,
    get_timeline,
};
pub use instances::{
    GeneratorPanel, InstancesPage, KillInstance, SetGenerator, get_generator_status, get_instances,
    kill_instance, set_generator,
};
pub use leases::{
    ForceReleaseLease, LeasesPage, force_release_lease, get_lease_detail, get_leases,
};
pub use overview::{OverviewPage, get_overview};
pub use queues::{
    ControlQueue, QueuesPage, SetQueueLimits, control_queue, get_queues, set_queue_limits,
};
pub use schedules::{ControlSchedule, SchedulesPage, control_schedule, get_schedules};
pub use tasks::{
    ControlTask, ControlTasks, GetTasks, TasksPage, control_task, control_tasks, get_task_detail,
    get_tasks,
};
pub use workers::{
    ControlWorker, SpawnWorker, WorkersPage, control_worker, get_workers, spawn_worker,
};
pub use workflows::{
    CancelWorkflow, GetWorkflow, GetWorkflows, WorkflowPage, WorkflowsPage, cancel_workflow,
    get_workflow, get_workflows,
};

use leptos::prelude::*;
use leptos_meta::{MetaTags, Stylesheet, Title, provide_meta_context};
use leptos_router::components::{Route, Router, Routes};
use leptos_router::{ParamSegment, SsrMode, StaticSegment};

/// The HTML document around the app, rendered on the server only.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    #[cfg(feature = "ssr")]
    content_security_policy(&options);
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <AutoReload options=options.clone()/>
                <HydrationScripts options/>
                <link rel="icon" type="image/svg+xml" href="/favicon.svg"/>
                // The browser compares its own build with this one before
                // hydrating (see `crate::bundle`).
                <meta name="leasekeeper-build" content=crate::bundle::BUILD/>
                <MetaTags/>
            </head>
            <body class="bg-slate-50 text-slate-900 antialiased">
                <App/>
            </body>
        </html>
    }
}

/// Puts the page's Content-Security-Policy on the answer, with the nonce
/// Leptos gives this answer's inline scripts (see `crate::http::headers`).
#[cfg(feature = "ssr")]
fn content_security_policy(options: &LeptosOptions) {
    use axum::http::{HeaderValue, header};
    let Some(resp) = use_context::<leptos_axum::ResponseOptions>() else {
        return;
    };
    let nonce = leptos::nonce::use_nonce();
    let dev_reload = options.env == leptos::config::Env::DEV;
    let policy = crate::http::headers::content_security_policy(nonce.as_deref(), dev_reload);
    if let Ok(value) = HeaderValue::from_str(&policy) {
        resp.insert_header(header::CONTENT_SECURITY_POLICY, value);
    }
}

/// The banner over a page whose server serves another build's bundle (the
/// browser then does not hydrate, so nothing else would explain why the
/// page is not live).
fn bundle_mismatch() -> Option<impl IntoView> {
    #[cfg(feature = "ssr")]
    let other = match crate::bundle::checked() {
        Some(crate::bundle::BundleCheck::Different(other)) => Some(other.clone()),
        _ => None,
    };
    #[cfg(not(feature = "ssr"))]
    let other: Option<String> = None;
    other.map(|other| {
        view! {
            <p class="border-b border-red-300 bg-red-50 p-3 text-sm" data-testid="bundle-mismatch" role="alert">
                {crate::bundle::mismatch_text(&other)}
            </p>
        }
    })
}

/// The dashboard application: navigation and routes.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    live::provide_live();
    view! {
        <Stylesheet id="leptos" href="/pkg/leasekeeper.css"/>
        <Title text="leasekeeper"/>
        <Router>
            // Rendered only by a server whose bundle is another build's; the
            // browser then does not hydrate, so both sides agree.
            {bundle_mismatch()}
            <header class="border-b border-slate-200 bg-white">
                <div class="mx-auto flex max-w-6xl flex-wrap items-center gap-x-6 gap-y-2 px-4 py-3">
                    <a href="/" class="text-lg font-semibold tracking-tight" data-testid="brand">
                        "leasekeeper"
                    </a>
                    <nav class="flex flex-wrap gap-x-4 gap-y-1 text-sm text-slate-600">
                        <a href="/" class="hover:text-slate-900" data-testid="nav-overview">"Overview"</a>
                        <a href="/leases" class="hover:text-slate-900" data-testid="nav-leases">"Leases"</a>
                        <a href="/tasks" class="hover:text-slate-900" data-testid="nav-tasks">"Tasks"</a>
                        <a href="/workers" class="hover:text-slate-900" data-testid="nav-workers">"Workers"</a>
                        <a href="/workflows" class="hover:text-slate-900" data-testid="nav-workflows">"Workflows"</a>
                        <a href="/queues" class="hover:text-slate-900" data-testid="nav-queues">"Queues"</a>
                        <a href="/schedules" class="hover:text-slate-900" data-testid="nav-schedules">"Schedules"</a>
                        <a href="/instances" class="hover:text-slate-900" data-testid="nav-instances">"Instances"</a>
                        <a href="/audit" class="hover:text-slate-900" data-testid="nav-audit">"Audit"</a>
                    </nav>
                    <span class="ml-auto flex items-center gap-3"><access::AccessBadge/><live::LiveBadge/></span>
                </div>
            </header>
            <main class="mx-auto max-w-6xl px-4 py-6">
                <live::ServerGone/>
                <Routes fallback=|| view! { <NotFound/> }>
                    // Async: the server waits for the data and sends whole
                    // HTML, so pages work before (and without) hydration.
                    <Route path=StaticSegment("") view=OverviewPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("leases") view=LeasesPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("tasks") view=TasksPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("workers") view=WorkersPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("workflows") view=WorkflowsPage ssr=SsrMode::Async/>
                    <Route path=(StaticSegment("workflows"), ParamSegment("id")) view=WorkflowPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("queues") view=QueuesPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("schedules") view=SchedulesPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("instances") view=InstancesPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("audit") view=audit::AuditPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("signin") view=access::SignInPage ssr=SsrMode::Async/>
                </Routes>
            </main>
        </Router>
    }
}

#[component]
fn NotFound() -> impl IntoView {
    #[cfg(feature = "ssr")]
    {
        if let Some(resp) = use_context::<leptos_axum::ResponseOptions>() {
            resp.set_status(axum::http::StatusCode::NOT_FOUND);
        }
    }
    view! {
        <div class="rounded border border-slate-200 bg-white p-6" data-testid="not-found">
            <h1 class="text-xl font-semibold">"Page not found"</h1>
            <p class="mt-2 text-slate-600">
                "There is nothing here. " <a class="text-indigo-700 underline" href="/leases">"See the leases"</a> "."
            </p>
        </div>
    }
}

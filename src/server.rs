//! Start-up in one place: logging, the database, the router (REST API, server
//! functions, dashboard pages, static files), and graceful shutdown.

use crate::app::{App, shell};
use crate::http;
use crate::settings::Settings;
use crate::state::AppState;
use crate::worker::fleet::{Fleet, FleetConfig};
use anyhow::Context;
use axum::Router;
use leasekeeper_core::db::{Database, Sessions};
use leasekeeper_core::generator::runtime::Generator;
use leasekeeper_core::instance::{self, Registration};
use leasekeeper_core::lease::Holder;
use leasekeeper_core::live::LiveHub;
use leasekeeper_core::liveness::Liveness;
use leasekeeper_core::maintenance::Maintenance;
use leasekeeper_core::schedule::runtime::Scheduler;
use leptos::config::{Env, LeptosOptions};
use leptos_axum::{LeptosRoutes, generate_route_list};
use std::sync::Arc;

/// Logs to stderr; `RUST_LOG` picks the level (default: info, sqlx quiet).
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,tower_http=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn env_or(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_string())
}

/// Leptos options for serving the site built by `cargo leptos build`.
///
/// cargo-leptos passes its settings through `LEPTOS_*` variables; without
/// them (the binary run directly from the repository root) the same defaults
/// apply, so `target/debug/leasekeeper` serves the full site too.
pub fn leptos_options(settings: &Settings) -> LeptosOptions {
    let env = if std::env::var("LEPTOS_WATCH").is_ok() {
        Env::DEV
    } else {
        Env::PROD
    };
    LeptosOptions::builder()
        .output_name(env_or("LEPTOS_OUTPUT_NAME", "leasekeeper"))
        .site_root(env_or("LEPTOS_SITE_ROOT", "target/site"))
        .site_pkg_dir(env_or("LEPTOS_SITE_PKG_DIR", "pkg"))
        .env(env)
        .site_addr(settings.site_addr)
        .reload_port(
            env_or("LEPTOS_RELOAD_PORT", "3001")
                .parse::<u32>()
                .unwrap_or(3001),
        )
        .build()
}

/// The whole HTTP surface: REST API, server functions, pages, static files.
pub fn router(state: AppState) -> Router {
    let routes = generate_route_list(App);
    let options = state.leptos_options.clone();
    Router::new()
        .merge(crate::http::events::route())
        .merge(http::health::routes())
        .merge(http::metrics::route())
        .merge(http::api_router())
        .leptos_routes(&state, routes, move || shell(options.clone()))
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(shell))
        .layer(axum::middleware::from_fn(
            http::server_fns::answer_like_the_api,
        ))
        .layer(axum::middleware::from_fn(http::run_to_completion))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::auth::reads_need_a_credential,
        ))
        .layer(axum::middleware::from_fn(http::origin::same_origin_only))
        // Outside the cross-site check: a rebinding page's Host is refused
        // before its matching Origin is believed.
        .layer(axum::middleware::from_fn_with_state(
            state.settings.clone(),
            http::perimeter::known_hosts_only,
        ))
        .layer(axum::middleware::from_fn(http::headers::security_headers))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// `leasekeeper serve`: open the database, serve until Ctrl-C or SIGTERM,
/// then stop the embedded cluster if this process started it.
pub async fn serve(settings: Settings) -> anyhow::Result<()> {
    // First, before a folder or a database is touched: nothing open to a
    // network by accident.
    if settings.check_exposure()? == crate::settings::Exposure::OpenByChoice {
        tracing::warn!(
            addr = %settings.site_addr,
            "SERVING BEYOND LOOPBACK WITH NO TOKEN (LEASEKEEPER_OPEN_NETWORK): anyone who can reach this address can enqueue, claim, complete, cancel and read every task and run every control"
        );
    }
    // Before anything is counted: a counter touched before the recorder
    // exists is lost.
    http::metrics::install();
    crate::bundle::check_at_start(&leptos_options(&settings));
    let db = Database::open(
        settings
            .database_url
            .as_ref()
            .map(crate::settings::Secret::expose),
        &settings.data_dir,
        &settings.schema,
    )
    .await?;
    let listener = tokio::net::TcpListener::bind(settings.site_addr)
        .await
        .with_context(|| format!("cannot listen on {}", settings.site_addr))?;
    let instance_id: Arc<str> = instance::new_id(settings.site_addr.port()).into();
    let registration = Registration::start(
        db.pool.clone(),
        instance_id.clone(),
        &settings.site_addr.to_string(),
        settings.renew_interval,
    )
    .await
    .context("registering this instance")?;
    // Where the liveness session and LISTEN go: the database URL, or
    // behind a transaction pooler the direct URL (checked to reach the
    // same database), or nowhere.
    let direct = settings
        .direct_database_url
        .as_ref()
        .map(|url| url.expose().parse::<sqlx::postgres::PgConnectOptions>())
        .transpose()
        .context("LEASEKEEPER_DIRECT_DATABASE_URL is not a valid PostgreSQL URL")?;
    let sessions = Sessions::of(&db.pool, direct)
        .await
        .context("the direct database URL (setting direct_database_url)")?;
    // The instance's liveness session: vouches for the instance (its
    // singleton leases) and its simulated workers, so a crash of this
    // process is rescued within a second; a pause or a partition is left
    // to the TTL.
    let liveness = match &sessions {
        Some(sessions) => Some(
            Liveness::start_in(sessions, instance_id.clone(), vec![instance_id.to_string()])
                .await
                .context("opening this instance's liveness session")?,
        ),
        None => {
            tracing::warn!(instance = %instance_id,
                "liveness off: behind a transaction pooler (setting pooler) with no direct_database_url, \
                 a session means nothing, so a crashed instance's claims wait out their TTL; \
                 and without LISTEN pages refresh on their timers and idle workers poll");
            None
        }
    };
    if let Some(sessions) = &sessions
        && sessions.bypass_pooler
    {
        tracing::info!(instance = %instance_id,
            "behind a transaction pooler: the liveness session and LISTEN use the direct database URL");
    }
    let generator = Generator::spawn(
        db.pool.clone(),
        Holder::parse(instance_id.as_ref()).context("instance id as a lease holder")?,
        crate::generator::config(&settings),
    );
    // Retention runs on whichever instance holds `singleton:maintenance`.
    let maintenance = Maintenance::spawn(
        db.pool.clone(),
        Holder::parse(instance_id.as_ref()).context("instance id as a lease holder")?,
        settings.maintenance_config(),
    );
    // Schedules fire on whichever instance holds `singleton:scheduler`.
    let scheduler = Scheduler::spawn(
        db.pool.clone(),
        Holder::parse(instance_id.as_ref()).context("instance id as a lease holder")?,
        settings.scheduler_config(),
    );
    let live = LiveHub::start_for(&db.pool, sessions.as_ref());
    let mut fleet = Fleet::new(
        db.pool.clone(),
        instance_id.clone(),
        FleetConfig::from_settings(&settings),
        Some(live.clone()),
    );
    if let Some(liveness) = &liveness {
        fleet = fleet.vouched_by(liveness);
    }
    let state = AppState {
        live: live.clone(),
        leptos_options: leptos_options(&settings),
        pool: db.pool.clone(),
        read_pool: crate::reads::read_pool(&db.pool),
        settings: Arc::new(settings.clone()),
        instance_id: instance_id.clone(),
        generator: Some(generator.handle()),
        scheduler: Some(scheduler.handle()),
        fleet: fleet.clone(),
        overview: crate::overview::sampler::Sampler::spawn(db.pool.clone()),
    };
    let overview = state.overview.clone();
    for _ in 0..settings.workers {
        if let Err(e) = fleet.spawn().await {
            tracing::warn!(error = %e, "cannot start a simulated worker");
        }
    }
    tracing::info!(instance = %instance_id, workers = settings.workers, "leasekeeper listening on http://{}", settings.site_addr);
    let served = axum::serve(listener, router(state))
        .with_graceful_shutdown(async move {
            crate::signals::shutdown_signal().await;
            // Open event streams would hold the graceful shutdown forever.
            live.shutdown();
        })
        .await
        .context("serving HTTP");
    tracing::info!("shutting down");
    overview.stop();
    // Workers give their tasks back before the database goes away.
    fleet.shutdown(std::time::Duration::from_secs(5)).await;
    // Release the generator lease if held, so another instance takes over
    // at once rather than after the TTL; then say goodbye.
    generator.shutdown().await;
    scheduler.shutdown().await;
    maintenance.shutdown().await;
    if let Err(e) = registration.shutdown().await {
        tracing::warn!(error = %e, "cannot mark this instance stopped");
    }
    if let Some(liveness) = liveness {
        liveness.shutdown().await;
    }
    db.close().await?;
    served
}

//! `leasekeeper-tools bench dashboard`: the dashboard's two speed targets, each
//! next to a baseline measured in the same run.
//!
//! 1. **Push latency**: from a committed change (a task enqueued; the clock
//!    starts when the commit returns) to the moment a browser-like client,
//!    subscribed to `GET /api/events` like the dashboard, has refetched the
//!    tasks page's data (the `get_tasks` server function) and finds the new
//!    task in it. Measured idle (baseline) and while 1,000 workers' worth of
//!    lease events flow (1,000 renewals per second of 1,000 leases, one per
//!    worker per second). The browser's own rendering is not included.
//!    **Push to pixel** ([`super::pixel`]): the same path to the screen of a
//!    real browser (Chromium through Playwright), from a task's commit to
//!    the first frame showing it on the tasks page and on the overview,
//!    idle and under 1,000 task events a second (target: p95 ≤ 150 ms).
//! 2. **Server-side render of `/tasks`** (the whole HTML page over HTTP) with
//!    1,000 tasks (baseline) and with 1,000,000.
//! 3. **Search by data** at 1,000,000 tasks: `GET /api/tasks?data={"customer":k}`
//!    for random customers, each matching about ten tasks (target: p95 ≤
//!    50 ms), and the `/tasks` page searched the same way.
//!
//! It runs its own server on a free port over a fresh database in its own
//! embedded cluster (`target/leasekeeper-bench-db`), unless `DATABASE_URL`
//! is set. Build it with `--release` for figures worth comparing.

use super::{BenchServer, Options, Results, Samples, fresh_database, ratio, report, step};
use anyhow::{Context, Result, bail};
use leasekeeper::settings::Settings;
use leasekeeper_core::lease::store as leases;
use leasekeeper_core::lease::{Holder, Resource};
use leasekeeper_core::live::LiveHub;
use leasekeeper_core::queue::store as tasks;
use serde_json::{Value, json};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const BENCH_DB: &str = "leasekeeper_bench";
const LOAD_WORKERS: usize = 1_000;
const LOAD_CONNECTIONS: usize = 16;
/// The search target: p95 of a data search at a million tasks, in ms.
const SEARCH_TARGET_MS: f64 = 50.0;

/// Runs the dashboard benchmark (only its push-to-pixel phase with
/// `pixel_only`) and prints (and optionally writes) results.
pub async fn dashboard(settings: Settings, options: Options, pixel_only: bool) -> Result<()> {
    let db = fresh_database(&settings, BENCH_DB, 48).await?;
    let result = run(settings, &options, db.pool.clone(), pixel_only).await;
    db.close().await?;
    report(&result?, &options)
}

async fn run(
    settings: Settings,
    options: &Options,
    pool: PgPool,
    pixel_only: bool,
) -> Result<Results> {
    let live = LiveHub::start(pool.clone());
    let server = BenchServer::start(settings, &pool, live.clone()).await?;
    let base = server.base.clone();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let probes = if options.quick { 40 } else { 200 };
    let renders = if options.quick { 40 } else { 200 };
    let mut results = Results::new();
    if pixel_only {
        super::pixel::push_to_pixel(&base, &pool, probes, &mut results).await?;
        live.shutdown();
        server.stop().await?;
        return Ok(results);
    }

    step("push latency, idle (baseline)");
    let idle = push_latency(&http, &base, &pool, probes).await?;
    results.push(("push_idle_p50_ms", idle.percentile(50.0)));
    results.push(("push_idle_p95_ms", idle.percentile(95.0)));

    step("push latency with 1,000 workers' worth of lease events per second");
    let load_stop = CancellationToken::new();
    let load = tokio::spawn(lease_load(pool.clone(), load_stop.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = event_count(&pool).await?;
    let loaded_started = Instant::now();
    let loaded = push_latency(&http, &base, &pool, probes).await?;
    let rate = (event_count(&pool).await? - before) as f64 / loaded_started.elapsed().as_secs_f64();
    load_stop.cancel();
    load.await??;
    results.push(("push_loaded_p50_ms", loaded.percentile(50.0)));
    results.push(("push_loaded_p95_ms", loaded.percentile(95.0)));
    results.push(("push_loaded_events_per_s", rate.round()));
    results.push((
        "push_p95_loaded_vs_idle",
        ratio(loaded.percentile(95.0), idle.percentile(95.0)),
    ));

    // Before the million tasks: the probes' pages and the load are those of
    // a queue in steady use, not of a bulk insert's aftermath.
    super::pixel::push_to_pixel(&base, &pool, probes, &mut results).await?;

    step("render /tasks with 1,000 tasks (baseline)");
    fill_tasks(&pool, 1_000).await?;
    let small = render_times(
        &http,
        &format!("{base}/tasks"),
        "data-testid=\"task-row\"",
        renders,
    )
    .await?;
    results.push(("ssr_tasks_1k_p50_ms", small.percentile(50.0)));
    results.push(("ssr_tasks_1k_p95_ms", small.percentile(95.0)));

    step("insert tasks up to 1,000,000");
    fill_tasks(&pool, 1_000_000).await?;
    let row = "data-testid=\"task-row\"";
    for (key50, key95, path, expect) in [
        ("ssr_tasks_1m_p50_ms", "ssr_tasks_1m_p95_ms", "/tasks", row),
        (
            "ssr_tasks_1m_pending_p50_ms",
            "ssr_tasks_1m_pending_p95_ms",
            "/tasks?status=pending",
            row,
        ),
        (
            "ssr_tasks_1m_failed_p50_ms",
            "ssr_tasks_1m_failed_p95_ms",
            "/tasks?status=failed",
            row,
        ),
        (
            "ssr_tasks_1m_search_p50_ms",
            "ssr_tasks_1m_search_p95_ms",
            "/tasks?data=%7B%22customer%22%3A4242%7D",
            row,
        ),
        (
            "ssr_overview_1m_p50_ms",
            "ssr_overview_1m_p95_ms",
            "/",
            "data-testid=\"count-pending\"",
        ),
    ] {
        step(&format!("render {path} with 1,000,000 tasks"));
        let t = render_times(&http, &format!("{base}{path}"), expect, renders).await?;
        results.push((key50, t.percentile(50.0)));
        results.push((key95, t.percentile(95.0)));
    }
    let big95 = results
        .iter()
        .find(|(k, _)| *k == "ssr_tasks_1m_p95_ms")
        .map(|(_, v)| *v)
        .unwrap_or(f64::NAN);
    results.push(("ssr_p95_1m_vs_1k", ratio(big95, small.percentile(95.0))));

    step("search GET /api/tasks?data={\"customer\":k} with 1,000,000 tasks");
    let searches = if options.quick { 40 } else { 200 };
    let (found, search) = search_times(&http, &base, searches).await?;
    results.push(("search_data_1m_p50_ms", search.percentile(50.0)));
    results.push(("search_data_1m_p95_ms", search.percentile(95.0)));
    results.push(("search_data_1m_max_ms", search.percentile(100.0)));
    results.push(("search_data_1m_rows_per_search", found));
    results.push((
        "search_data_1m_p95_within_50ms",
        if search.percentile(95.0) <= SEARCH_TARGET_MS {
            1.0
        } else {
            0.0
        },
    ));

    live.shutdown();
    server.stop().await?;
    Ok(results)
}

async fn event_count(pool: &PgPool) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM lease_events")
        .fetch_one(pool)
        .await?)
}

/// 1,000 leases, each renewed once a second by its "worker", over
/// [`LOAD_CONNECTIONS`] connections.
async fn lease_load(pool: PgPool, stop: CancellationToken) -> Result<()> {
    let schema = leasekeeper_core::db::Schema::of(&pool);
    let ttl = Duration::from_secs(30);
    let mut names = Vec::new();
    {
        let mut conn = pool.acquire().await?;
        for i in 0..LOAD_WORKERS {
            let resource = Resource::parse(format!("bench:worker-{i}"))?;
            let holder = Holder::parse(format!("bench-w{i}"))?;
            leases::acquire(&mut conn, &schema, &resource, &holder, ttl).await?;
            names.push((resource, holder));
        }
    }
    let names = Arc::new(names);
    let mut tasks = Vec::new();
    for c in 0..LOAD_CONNECTIONS {
        let (pool, stop, names) = (pool.clone(), stop.clone(), names.clone());
        let schema = schema.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            let mine: Vec<_> = names.iter().skip(c).step_by(LOAD_CONNECTIONS).collect();
            // Each connection renews its share once per second, evenly spread.
            let mut tick = tokio::time::interval(Duration::from_secs(1) / mine.len().max(1) as u32);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut next = 0;
            while !stop.is_cancelled() {
                tick.tick().await;
                let (resource, holder) = mine[next % mine.len()];
                next += 1;
                leases::renew(&mut conn, &schema, resource, holder, None, Some(ttl)).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// A streaming `GET /api/events`: yields once per `change` event.
struct EventStream {
    resp: reqwest::Response,
    buffer: String,
}

impl EventStream {
    async fn open(http: &reqwest::Client, base: &str) -> Result<Self> {
        let resp = http
            .get(format!("{base}/api/events"))
            .timeout(Duration::from_secs(3600))
            .send()
            .await?
            .error_for_status()?;
        let mut stream = EventStream {
            resp,
            buffer: String::new(),
        };
        stream.next("ready").await?;
        Ok(stream)
    }

    /// Waits for the next event named `name`.
    async fn next(&mut self, name: &str) -> Result<()> {
        let marker = format!("event: {name}\n");
        loop {
            if let Some(at) = self.buffer.find(&marker) {
                let end = self.buffer[at..].find("\n\n").map(|e| at + e + 2);
                if let Some(end) = end {
                    self.buffer.drain(..end);
                    return Ok(());
                }
            }
            match tokio::time::timeout(Duration::from_secs(10), self.resp.chunk()).await {
                Ok(Ok(Some(chunk))) => self.buffer.push_str(&String::from_utf8_lossy(&chunk)),
                Ok(Ok(None)) => bail!("the event stream ended"),
                Ok(Err(e)) => bail!("the event stream failed: {e}"),
                Err(_) => bail!("no {name} event within 10 s"),
            }
        }
    }
}

/// The tasks page's data, as the hydrated page fetches it.
async fn page_task_ids(http: &reqwest::Client, base: &str) -> Result<Vec<i64>> {
    use leptos::server_fn::ServerFn;
    let path = <leasekeeper::app::GetTasks as ServerFn>::PATH;
    let page: Value = http
        .post(format!("{base}{path}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("")
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(page["tasks"]
        .as_array()
        .map(|a| a.iter().filter_map(|t| t["id"].as_i64()).collect())
        .unwrap_or_default())
}

/// What a page on the event stream saw: when each refetch finished, and
/// the task ids it showed.
type Refetched = (Instant, Vec<i64>);

/// Plays the hydrated tasks page: on every `change` event, refetch its data
/// (one at a time, as the page's resource does) and publish what it shows.
async fn play_page(
    http: reqwest::Client,
    base: String,
    seen: tokio::sync::broadcast::Sender<Refetched>,
    stop: CancellationToken,
) -> Result<()> {
    let mut events = EventStream::open(&http, &base).await?;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            got = events.next("change") => got?,
        }
        let ids = page_task_ids(&http, &base).await?;
        let _ = seen.send((Instant::now(), ids));
    }
}

async fn push_latency(
    http: &reqwest::Client,
    base: &str,
    pool: &PgPool,
    probes: usize,
) -> Result<Samples> {
    let schema = &leasekeeper_core::db::Schema::of(pool);
    let (tx, mut seen) = tokio::sync::broadcast::channel::<Refetched>(1024);
    let stop = CancellationToken::new();
    let page = tokio::spawn(play_page(http.clone(), base.to_string(), tx, stop.clone()));
    let mut samples = Vec::with_capacity(probes);
    for _ in 0..probes {
        let id = {
            let mut conn = pool.acquire().await?;
            tasks::enqueue(
                &mut conn,
                schema,
                &leasekeeper_core::queue::NewTask::new(
                    leasekeeper_core::worker::simulated::KIND,
                    json!({"sleep_duration_seconds": 1, "probe": true}),
                )
                .max_attempts(1),
            )
            .await?
            .id as i64
        };
        let committed = Instant::now();
        let shown_at = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match seen.recv().await {
                    Ok((at, ids)) if at >= committed && ids.contains(&id) => return Ok(at),
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(e) => return Err(anyhow::anyhow!("the page stopped: {e}")),
                }
            }
        })
        .await
        .context("a change did not reach the page within 10 s")??;
        samples.push(shown_at.duration_since(committed).as_secs_f64() * 1000.0);
        let pause = 50 + rand::random::<u64>() % 100;
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    stop.cancel();
    page.await??;
    Ok(Samples(samples))
}

/// Times `n` whole-page GETs of `url`; each page must contain `expect`
/// (proof that the data was rendered, not just the shell).
async fn render_times(
    http: &reqwest::Client,
    url: &str,
    expect: &str,
    n: usize,
) -> Result<Samples> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + 5 {
        let started = Instant::now();
        let body = http
            .get(url)
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        if !body.contains("</html>") || !body.contains(expect) {
            bail!("{url} did not render a whole page with {expect:?}");
        }
        if i >= 5 {
            samples.push(ms); // the first five warm caches and the pool
        }
    }
    Ok(Samples(samples))
}

/// Times `n` REST searches by data (`?data={"customer":k}`, a random
/// customer of [`fill_tasks`]'s each time, URL-encoded) through the server;
/// each answer must be 200 and hold only tasks of that customer, and some.
/// Answers the mean rows a search found, and the times.
async fn search_times(http: &reqwest::Client, base: &str, n: usize) -> Result<(f64, Samples)> {
    let mut samples = Vec::with_capacity(n);
    let mut rows = 0usize;
    for i in 0..n + 5 {
        let customer = rand::random::<u32>() % 100_000;
        let url = format!("{base}/api/tasks?data=%7B%22customer%22%3A{customer}%7D");
        let started = Instant::now();
        let page: Vec<Value> = http
            .get(&url)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        if page.is_empty() || page.iter().any(|t| t["task_data"]["customer"] != customer) {
            bail!(
                "{url} found {} tasks, not those of customer {customer}",
                page.len()
            );
        }
        if i >= 5 {
            samples.push(ms); // the first five warm caches and the pool
            rows += page.len();
        }
    }
    Ok((rows as f64 / n.max(1) as f64, Samples(samples)))
}

/// Tops `tasks` up to `total` rows, in the mix a long-running queue has:
/// mostly processed, some pending, failed and started; each task's data
/// names one of 100,000 customers (so about ten tasks a customer at a
/// million) and one of seven regions.
async fn fill_tasks(pool: &PgPool, total: i64) -> Result<()> {
    let have: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(pool)
        .await?;
    if have >= total {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO tasks (kind, task_data, status, processor, started_at, processed_at, failed_at,
                            must_heartbeat_before, fencing_token, attempts, last_error)
         SELECT 'sleep', jsonb_build_object('sleep_duration_seconds', 1 + g % 10,
                                            'customer', g % 100000, 'region', 'r' || (g % 7)),
                s.status,
                CASE WHEN s.status <> 'pending' THEN 'bench-w' || (g % 1000) END,
                CASE WHEN s.status <> 'pending' THEN now() END,
                CASE WHEN s.status = 'processed' THEN now() END,
                CASE WHEN s.status = 'failed' THEN now() END,
                CASE WHEN s.status = 'started' THEN now() + interval '1 hour' END,
                CASE WHEN s.status <> 'pending' THEN 1 END,
                CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END,
                CASE WHEN s.status = 'failed' THEN 'bench' END
           FROM generate_series(1, $1::bigint) AS g,
                LATERAL (SELECT CASE WHEN g % 100 < 90 THEN 'processed'
                                     WHEN g % 100 < 95 THEN 'pending'
                                     WHEN g % 100 < 99 THEN 'failed'
                                     ELSE 'started' END AS status) AS s",
    )
    .bind(total - have)
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE tasks").execute(pool).await?;
    Ok(())
}

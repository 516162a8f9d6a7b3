//! Push to pixel: from a task's commit to the first frame Chromium paints
//! with the change, on the tasks page and on the overview, idle and under
//! 1,000 task events per second. A phase of `bench dashboard`.
//!
//! The whole way a change travels is inside the figure: the committing
//! process's announcer (`NOTIFY`), the server's `LISTEN` connection and its
//! hub, the server-sent event to the browser (at most one per 100 ms), the
//! page's resource refetching its server function, Leptos rendering the
//! answer, and the frame that shows it. The browser is Debian's Chromium
//! driven by playwright-core through `pixel.mjs`; its pages are hydrated
//! and live (`live-status` in state `live`) before any probe. The site it
//! loads is `target/site`, which must come from `cargo leptos build` at
//! the same commit and profile as this binary: the server refuses to go
//! live with another build's bundle (`src/bundle.rs`), and the phase then
//! says so.
//!
//! A probe is a task that fails for good (queue `pixel`, one attempt): its
//! failure is the measured commit. The clock starts when `fail` returns
//! (the commit is durable) and stops at the first frame painted after the
//! page's DOM shows the change, read in the page from the same system clock:
//!
//! - on `/tasks?status=failed`, the task's row (`data-task-id`, status
//!   failed). The status filter is what keeps the probe on the first page:
//!   unfiltered, newest first, the load's 300-odd new tasks a second push a
//!   row off the page's 50 within a refetch or two;
//! - on `/`, the failed count (`count-failed`) reaching the new total.
//!   Nothing else fails during the run, so only the probe moves it.
//!
//! The load (`task_load`) is tasks enqueued, claimed and completed
//! through the library (batches of ten, three state changes each), paced at
//! 1,000 state changes a second in all; its achieved rate is reported.

use super::{Results, Samples, step};
use anyhow::{Context, Result, bail};
use leasekeeper_core::lease::Holder;
use leasekeeper_core::queue::store as tasks;
use leasekeeper_core::queue::{ClaimFilter, NewTask};
use serde_json::{Value, json};
use sqlx::PgPool;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio_util::sync::CancellationToken;

/// The load: task state changes per second, in all.
pub const LOAD_EVENTS_PER_S: u64 = 1_000;
/// The target: p95 from commit to pixel under that load, in ms.
pub const TARGET_P95_MS: f64 = 150.0;
/// The queue of the probes (the load claims from the default queue only).
const PROBE_QUEUE: &str = "pixel";
/// The kind of the probes and of the load's tasks.
const PROBE_KIND: &str = "pixel-probe";
const LOAD_KIND: &str = "pixel-load";
/// Tasks per load batch (each batch: one enqueue, one claim, one
/// completion statement), and the loops running batches side by side.
const LOAD_BATCH: usize = 10;
const LOAD_LOOPS: usize = 4;
/// playwright-core installed by the bench when `end2end/node_modules` has
/// none (the same major line as the end-to-end tests').
const PLAYWRIGHT_CORE: &str = "playwright-core@^1.50";

/// The two pages measured: (name in the keys, path, what shows the probe).
#[derive(Clone, Copy)]
enum Page {
    Tasks,
    Overview,
}

impl Page {
    fn name(self) -> &'static str {
        match self {
            Page::Tasks => "tasks",
            Page::Overview => "overview",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Page::Tasks => "/tasks?status=failed",
            Page::Overview => "/",
        }
    }

    /// Part of the path of the server function whose answer shows the
    /// probe (for the stages).
    fn fetch(self) -> &'static str {
        match self {
            Page::Tasks => "get_tasks",
            Page::Overview => "get_overview",
        }
    }
}

/// Where a probe's time went, each in ms after its commit (see
/// `pixel.mjs`): the first `change` event in the page, the start and end
/// of the refetch that brought the change, the DOM showing it.
const STAGES: [&str; 4] = ["event", "fetch_start", "fetch_end", "dom"];

/// Prints the stages' p50 and p95 on stderr: the profile behind a figure.
fn print_stages(what: &str, stages: &[Vec<f64>; 4], pixel: &Samples) {
    let mut line = format!("bench: {what}, ms after the commit (p50/p95):");
    for (name, v) in STAGES.iter().zip(stages) {
        let s = Samples(v.clone());
        line += &format!(" {name} {}/{}", s.percentile(50.0), s.percentile(95.0));
    }
    line += &format!(
        " pixel {}/{}",
        pixel.percentile(50.0),
        pixel.percentile(95.0)
    );
    eprintln!("{line}");
}

/// Measures push to pixel on both pages, idle and under load, and pushes
/// its keys onto `results`. When the browser cannot run (no node, no
/// playwright-core, no Chromium, no built site), every key is `null` and
/// the reason goes to stderr.
pub(super) async fn push_to_pixel(
    base: &str,
    pool: &PgPool,
    probes: usize,
    results: &mut Results,
) -> Result<()> {
    let keys_before = results.len();
    match measure(base, pool, probes, results).await {
        Ok(()) => Ok(()),
        Err(e) => {
            eprintln!("bench: push to pixel skipped: {e:#}");
            results.truncate(keys_before);
            for key in KEYS {
                results.push((key, f64::NAN));
            }
            Ok(())
        }
    }
}

/// Every key of this phase, in the order written.
pub const KEYS: [&str; 16] = [
    "push_to_pixel_idle_tasks_p95_ms",
    "push_to_pixel_idle_overview_p95_ms",
    "push_to_pixel_idle_p95_ms",
    "push_to_pixel_tasks_p50_ms",
    "push_to_pixel_tasks_p95_ms",
    "push_to_pixel_tasks_p99_ms",
    "push_to_pixel_overview_p50_ms",
    "push_to_pixel_overview_p95_ms",
    "push_to_pixel_overview_p99_ms",
    "push_to_pixel_p50_ms",
    "push_to_pixel_p95_ms",
    "push_to_pixel_p99_ms",
    "push_to_pixel_max_ms",
    "push_to_pixel_events_per_s",
    "push_to_pixel_p95_loaded_vs_idle",
    "push_to_pixel_p95_within_150ms",
];

async fn measure(base: &str, pool: &PgPool, probes: usize, results: &mut Results) -> Result<()> {
    let site = site_bundle()?;
    let playwright = playwright_core().await?;
    let mut browser = Browser::start(base, &playwright).await?;
    let outcome = async {
        step(&format!(
            "push to pixel, idle (baseline; Chromium, site {})",
            site.display()
        ));
        let idle_probes = (probes / 2).max(10);
        let idle_tasks = probe_page(&mut browser, pool, Page::Tasks, idle_probes).await?;
        let idle_overview = probe_page(&mut browser, pool, Page::Overview, idle_probes).await?;

        step("push to pixel with 1,000 task events per second");
        let stop = CancellationToken::new();
        let events = Arc::new(AtomicU64::new(0));
        let load = tokio::spawn(task_load(pool.clone(), events.clone(), stop.clone()));
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (before, started) = (events.load(Ordering::Relaxed), Instant::now());
        let measured = async {
            let t = probe_page(&mut browser, pool, Page::Tasks, probes).await?;
            let o = probe_page(&mut browser, pool, Page::Overview, probes).await?;
            anyhow::Ok((t, o))
        }
        .await;
        let rate =
            (events.load(Ordering::Relaxed) - before) as f64 / started.elapsed().as_secs_f64();
        stop.cancel();
        load.await??;
        let (tasks, overview) = measured?;

        let worse = |p: f64, a: &Samples, b: &Samples| a.percentile(p).max(b.percentile(p));
        let idle95 = worse(95.0, &idle_tasks, &idle_overview);
        results.push((
            "push_to_pixel_idle_tasks_p95_ms",
            idle_tasks.percentile(95.0),
        ));
        results.push((
            "push_to_pixel_idle_overview_p95_ms",
            idle_overview.percentile(95.0),
        ));
        results.push(("push_to_pixel_idle_p95_ms", idle95));
        for (keys, s) in [
            (
                [
                    "push_to_pixel_tasks_p50_ms",
                    "push_to_pixel_tasks_p95_ms",
                    "push_to_pixel_tasks_p99_ms",
                ],
                &tasks,
            ),
            (
                [
                    "push_to_pixel_overview_p50_ms",
                    "push_to_pixel_overview_p95_ms",
                    "push_to_pixel_overview_p99_ms",
                ],
                &overview,
            ),
        ] {
            for (key, p) in keys.into_iter().zip([50.0, 95.0, 99.0]) {
                results.push((key, s.percentile(p)));
            }
        }
        let p95 = worse(95.0, &tasks, &overview);
        results.push(("push_to_pixel_p50_ms", worse(50.0, &tasks, &overview)));
        results.push(("push_to_pixel_p95_ms", p95));
        results.push(("push_to_pixel_p99_ms", worse(99.0, &tasks, &overview)));
        results.push(("push_to_pixel_max_ms", worse(100.0, &tasks, &overview)));
        results.push(("push_to_pixel_events_per_s", rate.round()));
        results.push((
            "push_to_pixel_p95_loaded_vs_idle",
            super::ratio(p95, idle95),
        ));
        results.push((
            "push_to_pixel_p95_within_150ms",
            if p95 <= TARGET_P95_MS { 1.0 } else { 0.0 },
        ));
        anyhow::Ok(())
    }
    .await;
    browser.quit().await;
    outcome
}

/// The built site's script, which the server serves and the browser needs
/// to hydrate: the server finds it where [`leasekeeper::server::leptos_options`]
/// says (`target/site/pkg` from the repository root by default).
fn site_bundle() -> Result<PathBuf> {
    let root = std::env::var("LEPTOS_SITE_ROOT").unwrap_or_else(|_| "target/site".into());
    let pkg = std::env::var("LEPTOS_SITE_PKG_DIR").unwrap_or_else(|_| "pkg".into());
    let name = std::env::var("LEPTOS_OUTPUT_NAME").unwrap_or_else(|_| "leasekeeper".into());
    let js = Path::new(&root).join(pkg).join(format!("{name}.js"));
    if !js.exists() {
        bail!(
            "no built site at {} (run `cargo leptos build --release`, or without --release for a debug bench, from the repository root first)",
            js.display()
        );
    }
    Ok(js)
}

/// The playwright-core module directory: the end-to-end tests' (installed
/// by `.ci/setup --e2e`), else one the bench installs into
/// `target/bench-pixel`.
async fn playwright_core() -> Result<PathBuf> {
    for dir in [
        "end2end/node_modules/playwright-core",
        "target/bench-pixel/node_modules/playwright-core",
    ] {
        if Path::new(dir).join("package.json").exists() {
            return Ok(std::fs::canonicalize(dir)?);
        }
    }
    let dir = Path::new("target/bench-pixel");
    std::fs::create_dir_all(dir)?;
    let status = tokio::time::timeout(
        Duration::from_secs(600),
        tokio::process::Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "--prefix",
                ".",
            ])
            .arg(PLAYWRIGHT_CORE)
            .current_dir(dir)
            .stdout(Stdio::null())
            .status(),
    )
    .await
    .context("npm install took over 10 minutes")?
    .context("npm is not available")?;
    if !status.success() {
        bail!("npm install {PLAYWRIGHT_CORE} failed ({status})");
    }
    Ok(std::fs::canonicalize(
        dir.join("node_modules/playwright-core"),
    )?)
}

/// `pixel.mjs` running Chromium, spoken to a JSON line at a time.
struct Browser {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    /// Where the script was written (removed on quit).
    script: PathBuf,
}

impl Browser {
    async fn start(base: &str, playwright: &Path) -> Result<Self> {
        let script =
            std::env::temp_dir().join(format!("leasekeeper-pixel-{}.mjs", std::process::id()));
        std::fs::write(&script, include_str!("pixel.mjs"))?;
        let mut child = tokio::process::Command::new("node")
            .arg(&script)
            .env("BASE", base)
            .env("PLAYWRIGHT_CORE", playwright)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("node is not available")?;
        let stdin = child.stdin.take().context("node's stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("node's stdout")?).lines();
        let mut browser = Browser {
            child,
            stdin,
            stdout,
            script,
        };
        let ready = browser.read(Duration::from_secs(60)).await?;
        if ready["ready"] != true {
            bail!("Chromium did not start: {ready}");
        }
        Ok(browser)
    }

    async fn ask(&mut self, msg: Value, patience: Duration) -> Result<Value> {
        self.stdin.write_all(format!("{msg}\n").as_bytes()).await?;
        self.stdin.flush().await?;
        self.read(patience).await
    }

    async fn read(&mut self, patience: Duration) -> Result<Value> {
        let line = tokio::time::timeout(patience, self.stdout.next_line())
            .await
            .context("the browser did not answer")??
            .context("the browser script ended")?;
        let v: Value =
            serde_json::from_str(&line).with_context(|| format!("the browser said {line:?}"))?;
        if let Some(e) = v.get("error") {
            bail!("the browser: {e}");
        }
        Ok(v)
    }

    async fn quit(mut self) {
        let _ = self.stdin.write_all(b"{\"cmd\":\"quit\"}\n").await;
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        let _ = self.child.start_kill();
        let _ = std::fs::remove_file(&self.script);
    }
}

/// Now, in milliseconds since the epoch: the clock the page reads too.
fn wall_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// `probes` probes on `page`, opened afresh (hydrated, live), one at a time.
async fn probe_page(
    browser: &mut Browser,
    pool: &PgPool,
    page: Page,
    probes: usize,
) -> Result<Samples> {
    let schema = leasekeeper_core::db::Schema::of(pool);
    browser
        .ask(
            json!({"cmd": "open", "path": page.path()}),
            Duration::from_secs(60),
        )
        .await
        .with_context(|| format!("opening {} (hydrated and live)", page.path()))?;
    let prober = Holder::parse("bench-pixel")?;
    let filter = ClaimFilter::queue(PROBE_QUEUE);
    let mut samples = Vec::with_capacity(probes);
    let mut stages: [Vec<f64>; 4] = Default::default();
    let mut conn = pool.acquire().await?;
    for n in 0..probes {
        // The probe task, claimed: neither step is measured.
        tasks::enqueue(
            &mut conn,
            &schema,
            &NewTask::new(PROBE_KIND, json!({"probe": n}))
                .queue(PROBE_QUEUE)
                .max_attempts(1),
        )
        .await?;
        let task = tasks::claim_next_in(
            &mut conn,
            &schema,
            &prober,
            Duration::from_secs(60),
            &filter,
        )
        .await?
        .context("the probe task was not claimable")?;
        let token = task.fencing_token.context("a claimed task has a token")?;
        // Past the event stream's gap (100 ms) after the enqueue's and the
        // claim's own events, so an idle probe's change is not held back by
        // its own preparation; a random phase, so under load commits fall
        // anywhere between two events.
        let pause = 110 + rand::random::<u64>() % 100;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let (selector, value) = match page {
            Page::Tasks => (
                format!(
                    "[data-testid=\"task-row\"][data-task-id=\"{}\"][data-status=\"failed\"]",
                    task.id
                ),
                Value::Null,
            ),
            Page::Overview => {
                let failed = leasekeeper_core::counts::counts(&mut conn, &schema)
                    .await?
                    .tasks_failed;
                (
                    "[data-testid=\"count-failed\"]".to_string(),
                    json!((failed + 1).to_string()),
                )
            }
        };
        browser
            .ask(
                json!({"cmd": "arm", "probe": n, "selector": selector, "value": value}),
                Duration::from_secs(10),
            )
            .await?;
        // The measured commit: the task fails for good.
        tasks::fail(
            &mut conn,
            &schema,
            task.id,
            &prober,
            token,
            "push-to-pixel probe",
            tasks::RetryPolicy::default(),
        )
        .await?;
        let committed = wall_ms();
        let answer = browser
            .ask(
                json!({"cmd": "wait", "probe": n, "committed_ms": committed, "fetch": page.fetch()}),
                Duration::from_secs(15),
            )
            .await
            .with_context(|| format!("probe {n} on the {} page ({})", page.name(), page.path()))?;
        let shown = answer["shown_ms"].as_f64().context("no shown_ms")?;
        samples.push(shown - committed);
        for (name, v) in STAGES.iter().zip(stages.iter_mut()) {
            if let Some(ms) = answer["stages"][name].as_f64() {
                v.push(ms);
            }
        }
    }
    let samples = Samples(samples);
    print_stages(&format!("{} page", page.name()), &stages, &samples);
    Ok(samples)
}

/// Tasks enqueued, claimed and completed through the library at
/// [`LOAD_EVENTS_PER_S`] state changes a second in all, over
/// [`LOAD_LOOPS`] connections, until `stop`; `events` counts the changes
/// made (an enqueue, a claim, a completion: one each per task).
async fn task_load(pool: PgPool, events: Arc<AtomicU64>, stop: CancellationToken) -> Result<()> {
    let per_batch = 3 * LOAD_BATCH as u64;
    let batches_per_s = LOAD_EVENTS_PER_S as f64 / per_batch as f64 / LOAD_LOOPS as f64;
    let period = Duration::from_secs_f64(1.0 / batches_per_s);
    let mut loops = Vec::new();
    for l in 0..LOAD_LOOPS {
        let (pool, events, stop) = (pool.clone(), events.clone(), stop.clone());
        loops.push(tokio::spawn(async move {
            let schema = leasekeeper_core::db::Schema::of(&pool);
            let holder = Holder::parse(format!("bench-pixel-load-{l}"))?;
            let mut conn = pool.acquire().await?;
            let mut tick = tokio::time::interval(period);
            // Behind schedule (a slow commit), catch up: the rate is the point.
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            while !stop.is_cancelled() {
                tick.tick().await;
                let batch: Vec<NewTask> = (0..LOAD_BATCH)
                    .map(|i| NewTask::new(LOAD_KIND, json!({"load": l, "i": i})))
                    .collect();
                let added = tasks::enqueue_many(&mut conn, &schema, &batch).await?;
                events.fetch_add(added.len() as u64, Ordering::Relaxed);
                let claimed = tasks::claim_batch(
                    &mut conn,
                    &schema,
                    &holder,
                    Duration::from_secs(60),
                    LOAD_BATCH,
                )
                .await?;
                events.fetch_add(claimed.len() as u64, Ordering::Relaxed);
                let claims: Vec<(i64, i64)> = claimed
                    .iter()
                    .filter_map(|t| Some((t.id, t.fencing_token?)))
                    .collect();
                let done =
                    tasks::complete_all_of(&mut conn, &schema, &holder, &claims, None).await?;
                events.fetch_add(done.len() as u64, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for l in loops {
        l.await??;
    }
    Ok(())
}

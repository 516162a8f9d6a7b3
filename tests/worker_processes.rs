//! Worker processes against a real instance: one `leasekeeper serve` on its
//! own embedded cluster, four `leasekeeper worker` processes over HTTP, 200
//! tasks. Two workers are SIGKILLed mid-task (the real crash); their tasks
//! must be taken over as soon as the instance sees their session streams
//! close, before their leases would run out, and every task must end
//! processed exactly once, as the database's own history shows.
//!
//! The server keeps its tables in the schema [`SCHEMA`], not the default
//! one, so the whole path (migration, REST, workers) runs on a configured
//! schema. Children are killed and the cluster stopped even when the test
//! fails (see [`Cleanup`]). Logs are kept in `target/worker-processes-test/`.

use leasekeeper_core::db::embedded::EmbeddedPostgres;
use leasekeeper_core::db::{Schema, connect_options};
use leasekeeper_core::queue::Task;
use serde_json::{Value, json};
use sqlx::{PgPool, Row};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_leasekeeper");
const TASKS: usize = 200;
/// The server's schema (`LEASEKEEPER_SCHEMA`).
const SCHEMA: &str = "wp_jobs";

fn base_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/worker-processes-test")
}

/// Kills every child and stops the cluster when dropped, pass or fail.
struct Cleanup {
    server: Option<Child>,
    workers: BTreeMap<String, Child>,
    data_dir: PathBuf,
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid fits"));
    let _ = nix::sys::signal::kill(pid, sig);
}

fn wait_blocking(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn stop_cluster(data_dir: &Path) {
    let dir = data_dir.to_path_buf();
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        if let Err(e) = rt.block_on(EmbeddedPostgres::stop(&dir)) {
            eprintln!("cannot stop the test cluster: {e:#}");
        }
    })
    .join();
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for child in self.workers.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(mut server) = self.server.take() {
            signal(&server, nix::sys::signal::Signal::SIGTERM);
            if wait_blocking(&mut server, Duration::from_secs(15)).is_none() {
                let _ = server.kill();
                let _ = server.wait();
            }
        }
        stop_cluster(&self.data_dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn command(data_dir: &Path, log: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("DATABASE_URL")
        .env(
            "LEASEKEEPER_CONFIG",
            concat!(env!("CARGO_MANIFEST_DIR"), "/Leptos.toml"),
        )
        .env("LEASEKEEPER_DATA_DIR", data_dir)
        .env("LEASEKEEPER_SCHEMA", SCHEMA)
        .env("LEASEKEEPER_WORKERS", "0")
        .env("LEASEKEEPER_CHAOS", "0")
        .env("LEASEKEEPER_LEASE_TTL_SECS", "2")
        .env("LEASEKEEPER_RENEW_INTERVAL_SECS", "0.6")
        .env("LEASEKEEPER_HEARTBEAT_INTERVAL_SECS", "0.5")
        .env("RUST_LOG", "info,sqlx=warn,tower_http=warn")
        .stdin(Stdio::null())
        .stdout(File::create(log).expect("log file"))
        .stderr(File::create(log.with_extension("err.log")).expect("log file"));
    cmd
}

async fn wait_for<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}; logs in {}",
            base_dir().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}

/// A lease event: kind, holder, fencing token, the refusal's reason.
type Event = (String, Option<String>, Option<i64>, Option<String>);
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_processes_lose_their_tasks_to_others_and_every_task_is_processed_once() {
    let base = base_dir();
    let data_dir = base.join("db");
    stop_cluster(&data_dir); // a cluster left by an earlier, interrupted run
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).expect("test folder");
    let mut cleanup = Cleanup {
        server: None,
        workers: BTreeMap::new(),
        data_dir: data_dir.clone(),
    };

    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    cleanup.server = Some(
        command(&data_dir, &base.join("server.log"))
            .args(["serve", "--addr", &format!("127.0.0.1:{port}")])
            .spawn()
            .expect("starting leasekeeper serve"),
    );
    let http = reqwest::Client::new();
    wait_for("the server to answer", Duration::from_secs(180), || async {
        http.get(format!("{url}/api/workers"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    let cluster = EmbeddedPostgres::start(&data_dir)
        .await
        .expect("reusing the server's cluster");
    assert!(!cluster.started_here(), "the server owns the cluster");
    let schema = Schema::parse(SCHEMA).expect("a valid schema");
    let pool = PgPool::connect_with(connect_options(
        cluster.connect_options("leasekeeper"),
        &schema,
    ))
    .await
    .expect("connecting to the server's database");

    let names: Vec<String> = (1..=4).map(|n| format!("pw{n}")).collect();
    for name in &names {
        let child = command(&data_dir, &base.join(format!("{name}.log")))
            .args(["worker", "--server", &url, "--id", name])
            .spawn()
            .expect("starting leasekeeper worker");
        cleanup.workers.insert(name.clone(), child);
    }

    // One task in four takes a second; the rest are instant.
    for i in 0..TASKS {
        let secs = if i % 4 == 0 { 1 } else { 0 };
        let response = http
            .post(format!("{url}/api/tasks"))
            .json(&json!({ "task_data": { "sleep_duration_seconds": secs, "n": i } }))
            .send()
            .await
            .expect("enqueueing");
        assert_eq!(response.status(), reqwest::StatusCode::CREATED);
    }

    // Kill two workers, each just after it claimed a one-second task, so
    // the kill lands mid-task.
    let mut killed: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let hunt = Instant::now();
    while killed.len() < 2 {
        assert!(
            hunt.elapsed() < Duration::from_secs(60),
            "no worker caught mid-task"
        );
        let fresh = sqlx::query(
            "SELECT id, processor, fencing_token FROM tasks
              WHERE status = 'started' AND task_data->>'sleep_duration_seconds' = '1'
                AND now() - started_at < interval '400 ms'
              ORDER BY started_at DESC",
        )
        .fetch_all(&pool)
        .await
        .expect("looking for started tasks");
        for row in fresh {
            let processor: String = row.get("processor");
            if killed.len() < 2
                && !killed.contains_key(&processor)
                && let Some(child) = cleanup.workers.get_mut(&processor)
            {
                child.kill().expect("SIGKILL");
                child.wait().expect("reaping");
                killed.insert(processor, (row.get("id"), row.get("fencing_token")));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (name, (task_id, token)) in &killed {
        let row = sqlx::query("SELECT processor, fencing_token, status FROM tasks WHERE id = $1")
            .bind(task_id)
            .fetch_one(&pool)
            .await
            .unwrap();
        let status: String = row.get("status");
        let processor: String = row.get("processor");
        let now_token: i64 = row.get("fencing_token");
        // Still its claim, or already taken over (within milliseconds of
        // the kill: its stream closed).
        assert!(
            (status.as_str(), processor.as_str(), now_token) == ("started", name.as_str(), *token)
                || now_token > *token,
            "{name} died holding task {task_id}: now {status} by {processor} with {now_token}"
        );
    }

    wait_for("every task processed", Duration::from_secs(120), || async {
        count(
            &pool,
            "SELECT count(*) FROM tasks WHERE status = 'processed'",
        )
        .await
            == TASKS as i64
    })
    .await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM tasks").await,
        TASKS as i64
    );

    // Exactly once: each task's history has one release, by the holder
    // and token that completed it; a refused write never carries the
    // winning token.
    let tasks: Vec<(i64, String, i64)> =
        sqlx::query_as("SELECT id, processor, fencing_token FROM tasks ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    for (id, processor, token) in &tasks {
        let history: Vec<Event> = sqlx::query_as(
            "SELECT kind, holder, fencing_token, detail->>'reason' FROM lease_events
              WHERE resource = $1 ORDER BY id",
        )
        .bind(Task::resource_name(*id))
        .fetch_all(&pool)
        .await
        .unwrap();
        let released: Vec<_> = history.iter().filter(|e| e.0 == "released").collect();
        assert_eq!(released.len(), 1, "task {id}: {history:?}");
        assert_eq!(
            (released[0].1.as_deref(), released[0].2),
            (Some(processor.as_str()), Some(*token)),
            "task {id}: {history:?}"
        );
        // A refusal carrying the completing token can only be that
        // worker's own request that reached the server after its completion
        // (a heartbeat it had in flight and dropped: the server runs every
        // request to its end): after the release, and "already processed".
        let released_at = history.iter().position(|e| e.0 == "released").unwrap();
        assert!(
            history
                .iter()
                .enumerate()
                .filter(|(_, e)| e.0 == "stale_write_refused" && e.2 == Some(*token))
                .all(|(i, e)| i > released_at && e.3.as_deref() == Some("already processed")),
            "task {id}: {history:?}"
        );
        assert!(names.contains(processor), "task {id} by {processor}");
    }

    // The killed workers' tasks were taken over by others and completed
    // with the new token.
    for (name, (task_id, token)) in &killed {
        let (processor, final_token, attempts): (String, i64, i32) =
            sqlx::query_as("SELECT processor, fencing_token, attempts FROM tasks WHERE id = $1")
                .bind(task_id)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_ne!(&processor, name, "task {task_id} was taken over");
        assert!(!killed.contains_key(&processor), "by a survivor");
        assert!(final_token > *token && attempts >= 2);
        // Rescued through its session stream: the instance saw the
        // stream close and ended the claim (`session_ended`), and the
        // takeover came after that end but before the lease's TTL would
        // have run out.
        let takeovers = count(
            &pool,
            &format!(
                "SELECT count(*) FROM lease_events t
                  WHERE t.resource = 'task:{task_id}' AND t.kind = 'taken_over'
                    AND t.previous_holder = '{name}' AND t.fencing_token = {}
                    AND t.at >= (SELECT e.at FROM lease_events e
                                  WHERE e.resource = t.resource AND e.kind = 'session_ended'
                                    AND e.holder = '{name}' AND e.fencing_token = {token})
                    AND t.at < (SELECT max(a.expires_at) FROM lease_events a
                                 WHERE a.resource = t.resource AND a.kind <> 'session_ended'
                                   AND a.fencing_token = {token})",
                token + 1
            ),
        )
        .await;
        assert_eq!(
            takeovers, 1,
            "task {task_id} taken over from {name} once its stream closed, before its TTL"
        );
    }

    // The dashboard's view: the killed workers are dead, the others alive.
    let survivors: BTreeSet<&String> = names.iter().filter(|n| !killed.contains_key(*n)).collect();
    wait_for(
        "the killed workers shown dead",
        Duration::from_secs(10),
        || async {
            let list: Value = http
                .get(format!("{url}/api/workers"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let alive = |id: &str| {
                list.as_array()
                    .unwrap()
                    .iter()
                    .find(|w| w["id"] == id)
                    .map(|w| w["alive"] == true && w["kind"] == "http")
            };
            killed.keys().all(|n| alive(n) == Some(false))
                && survivors.iter().all(|n| alive(n) == Some(true))
        },
    )
    .await;

    // A graceful stop: SIGTERM, exit 0, recorded as stopped.
    for name in &survivors {
        let mut child = cleanup.workers.remove(*name).unwrap();
        signal(&child, nix::sys::signal::Signal::SIGTERM);
        let status = wait_blocking(&mut child, Duration::from_secs(15)).expect("worker exited");
        assert!(status.success(), "{name}: {status}");
        let state: String = sqlx::query_scalar("SELECT state FROM workers WHERE id = $1")
            .bind(name)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(state, "stopped");
    }
    pool.close().await;
    drop(cleanup);
}

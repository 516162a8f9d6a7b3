//! `leasekeeper worker` and its credential, from outside: a real process
//! against a real server (or a stub that refuses everything). Without the
//! worker token it is refused (401), exits non-zero within seconds naming
//! the cause, and nothing of it is recorded; with `--token-file` it claims
//! and completes a task. The token is never printed.

use crate::common::TestDb;
use leasekeeper_core::queue::{NewTask, store as tasks};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_leasekeeper");
const WORKER_TOKEN: &str = "it-worker-token-5f2c9a7e1b";
const ADMIN_TOKEN: &str = "it-admin-token-8d3e6b0c4a";

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/worker-token-test")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn token_file(dir: &Path, token: &str) -> PathBuf {
    let path = dir.join("token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path
}

/// The program with the test's settings and none of the caller's tokens.
fn command() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("LEASEKEEPER_WORKER_TOKEN")
        .env_remove("LEASEKEEPER_ADMIN_TOKEN")
        .env("LEASEKEEPER_WORKERS", "0")
        .env("LEASEKEEPER_CHAOS", "0")
        .env("LEASEKEEPER_LEASE_TTL_SECS", "2")
        .env("LEASEKEEPER_RENEW_INTERVAL_SECS", "0.6")
        .env("LEASEKEEPER_HEARTBEAT_INTERVAL_SECS", "0.5")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// `leasekeeper worker --server server` with `args`: started, and given
/// `limit` to exit by itself. Answers its exit status (None: still running,
/// killed) and what it wrote to stdout and stderr.
async fn worker_until_exit(
    server: &str,
    args: &[&str],
    env: Option<(&str, &str)>,
    limit: Duration,
) -> (Option<std::process::ExitStatus>, String) {
    let mut cmd = command();
    cmd.args(["worker", "--server", server])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some((key, value)) = env {
        cmd.env(key, value);
    }
    let child = cmd.spawn().expect("starting leasekeeper worker");
    let pid = child.id();
    match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(output) => {
            let output = output.unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            (Some(output.status), text)
        }
        // Dropped with the future: kill_on_drop ends it.
        Err(_) => (
            None,
            format!("worker {pid:?} still running after {limit:?}"),
        ),
    }
}

/// A task of the simulated workers' kind that takes no time.
async fn enqueue_sleep(
    db: &TestDb,
    schema: &leasekeeper_core::db::Schema,
) -> leasekeeper_core::queue::Task {
    tasks::enqueue(
        &mut db.pool.acquire().await.unwrap(),
        schema,
        &NewTask::new(
            leasekeeper_core::worker::simulated::KIND,
            json!({ "sleep_duration_seconds": 0 }),
        ),
    )
    .await
    .unwrap()
}

/// Task `id` was never claimed.
async fn assert_untouched(db: &TestDb, schema: &leasekeeper_core::db::Schema, id: i64) {
    let untouched = tasks::get(&mut db.pool.acquire().await.unwrap(), schema, id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (untouched.attempts, untouched.processor),
        (0, None),
        "nothing claimed"
    );
}

/// A server that answers every request 401 and hands over what it read.
async fn refusing_stub() -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !String::from_utf8_lossy(&seen).contains("\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = tx.send(String::from_utf8_lossy(&seen).into_owned());
                let body = r#"{"error":"a worker token is required"}"#;
                let answer = format!(
                    "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (url, rx)
}

/// The client's half, against a stub: the token from `--token-file` goes
/// with every request, and a 401 stops the process at once, non-zero,
/// with one line naming the file and the 401, never the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refused_401_exits_non_zero_naming_the_cause_and_presents_its_token_file() {
    let dir = scratch("stub");
    let file = token_file(&dir, WORKER_TOKEN);
    let (url, mut requests) = refusing_stub().await;
    let (status, output) = worker_until_exit(
        &url,
        &["--id", "tw-stub", "--token-file", file.to_str().unwrap()],
        None,
        Duration::from_secs(10),
    )
    .await;
    let status = status.unwrap_or_else(|| panic!("did not exit: {output}"));
    assert!(!status.success(), "{status}: {output}");
    let last = output.lines().last().unwrap_or_default();
    assert!(
        last.contains(&format!("refused the token in {}", file.display()))
            && last.contains("(401 Unauthorized: a worker token is required)"),
        "{output}"
    );
    assert!(
        !output.contains(WORKER_TOKEN),
        "the token was printed: {output}"
    );
    let mut seen = 0;
    while let Ok(request) = requests.try_recv() {
        seen += 1;
        assert!(
            request
                .lines()
                .any(|l| l.eq_ignore_ascii_case(&format!("authorization: Bearer {WORKER_TOKEN}"))),
            "{request}"
        );
    }
    assert!(seen >= 1, "the worker asked nothing");
    // Refused at once: no retry loop.
    assert!(seen <= 2, "{seen} requests after a 401");

    // Without any token: the line says to set one.
    let (status, output) =
        worker_until_exit(&url, &["--id", "tw-stub"], None, Duration::from_secs(10)).await;
    assert!(status.is_some_and(|s| !s.success()), "{output}");
    assert!(
        output.contains("requires a worker token (401")
            && output.contains("LEASEKEEPER_WORKER_TOKEN"),
        "{output}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The whole contract against a real, locked server (the server's 401 is
/// part A1 of issue 37): without the token, or with a made-up one, the
/// worker is refused, exits non-zero within seconds naming the 401, and
/// nothing of it is recorded; with `--token-file` it claims and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_needs_the_worker_token_and_works_with_its_token_file() {
    let db = TestDb::new().await;
    let schema = leasekeeper_core::db::Schema::default();
    let task = enqueue_sleep(&db, &schema).await;
    let server = crate::common::Served::start(
        &db,
        &[
            ("LEASEKEEPER_WORKER_TOKEN", WORKER_TOKEN),
            ("LEASEKEEPER_ADMIN_TOKEN", ADMIN_TOKEN),
            ("LEASEKEEPER_LEASE_TTL_SECS", "2"),
            ("LEASEKEEPER_RENEW_INTERVAL_SECS", "0.6"),
            ("LEASEKEEPER_HEARTBEAT_INTERVAL_SECS", "0.5"),
        ],
    )
    .await;
    let url = server.base.clone();

    // No token, then a made-up one: refused, and out within seconds.
    for (id, env) in [
        ("tw-none", None),
        (
            "tw-forged",
            Some(("LEASEKEEPER_WORKER_TOKEN", "made-up-token-0123456789")),
        ),
    ] {
        let started = std::time::Instant::now();
        let (status, output) =
            worker_until_exit(&url, &["--id", id], env, Duration::from_secs(10)).await;
        let status = status.unwrap_or_else(|| panic!("{id} did not exit: {output}"));
        assert!(!status.success(), "{id}: {status}: {output}");
        assert!(started.elapsed() < Duration::from_secs(10));
        // 401 by the contract; a 403 for a made-up token is refused as well.
        let last = output.lines().last().unwrap_or_default();
        assert!(
            (last.contains("(401") || (env.is_some() && last.contains("(403")))
                && last.contains("LEASEKEEPER_WORKER_TOKEN"),
            "{id}: {output}"
        );
        assert!(!output.contains("made-up-token-0123456789"), "{output}");
        let recorded: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM lease_events WHERE holder = $1)
                  + (SELECT count(*) FROM workers WHERE id = $1)",
        )
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(recorded, 0, "{id} left rows behind");
    }
    assert_untouched(&db, &schema, task.id).await;

    // With the token in a file: the task is claimed and completed.
    let dir = scratch("real");
    let file = token_file(&dir, WORKER_TOKEN);
    let mut worker = command()
        .args([
            "worker",
            "--server",
            &url,
            "--id",
            "tw-file",
            "--token-file",
        ])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting leasekeeper worker");
    let started = std::time::Instant::now();
    let done = loop {
        let now = tasks::get(&mut db.pool.acquire().await.unwrap(), &schema, task.id)
            .await
            .unwrap()
            .unwrap();
        if now.status == leasekeeper_core::queue::TaskStatus::Processed {
            break now;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not completed: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done.processor.as_deref(), Some("tw-file"));
    assert!(
        worker.try_wait().unwrap().is_none(),
        "the worker is still at work"
    );
    let _ = worker.kill().await;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A worker process given an instance's own name is refused a session
/// stream (409: adopting the name would end what the instance holds): it
/// stops at once, non-zero, saying why, having claimed nothing; it does
/// not retry for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_named_like_its_instance_stops_saying_why() {
    let db = TestDb::new().await;
    let schema = leasekeeper_core::db::Schema::default();
    let task = enqueue_sleep(&db, &schema).await;
    let server = crate::common::Served::start(&db, &[]).await;
    let instance: String = sqlx::query_scalar("SELECT id FROM instances WHERE stopped_at IS NULL")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let (status, output) = worker_until_exit(
        &server.base,
        &["--id", &instance],
        None,
        Duration::from_secs(15),
    )
    .await;
    let status = status.unwrap_or_else(|| panic!("did not stop: {output}"));
    assert!(!status.success(), "{status}: {output}");
    let last = output.lines().last().unwrap_or_default();
    assert!(
        last.contains("refuses worker") && last.contains("409") && last.contains("--id"),
        "{output}"
    );
    assert_untouched(&db, &schema, task.id).await;
}

//! The `ledger_service` example, run for real: two replica processes of one
//! binary on one database; one is killed with SIGKILL mid-run; every task
//! must still end with exactly one effect row, written by the claim that
//! completed it, and the singleton job must move to the survivor.

use leasekeeper_core::db::testing::TestDb;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TASKS: i64 = 240;

/// The example binary `cargo test` built next to this test.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let bin = dir.join("examples").join("ledger_service");
    assert!(
        bin.exists(),
        "{} is missing: `cargo test -p leasekeeper-core` builds it",
        bin.display()
    );
    bin
}

/// The test database as a URL for the replicas: host and port as query
/// parameters, so a socket folder (the embedded cluster's) works as well
/// as an address.
fn url(db: &TestDb) -> String {
    let o = &db.plain;
    let host = match o.get_socket() {
        Some(dir) => dir.display().to_string(),
        None => o.get_host().to_string(),
    };
    format!(
        "postgres://{}@localhost/{}?host={host}&port={}&sslmode=disable",
        o.get_username(),
        o.get_database().expect("a database name"),
        o.get_port(),
    )
}

fn replica(db: &TestDb, name: &str, extra: &[&str]) -> Child {
    Command::new(example())
        .args(["--database-url", &url(db), "--replica", name])
        .args(["--lease-ttl-ms", "1500", "--run-for-secs", "60"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting a replica")
}

async fn count(db: &TestDb, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(&db.pool)
        .await
        .unwrap_or(0)
}

async fn wait_for(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_run_loses_no_task_and_doubles_no_effect() {
    let db = TestDb::new().await;
    let mut a = replica(&db, "replica-a", &["--enqueue", &TASKS.to_string()]);
    let mut b = replica(&db, "replica-b", &[]);

    // Kill a while both are busy and a holds tasks (and maybe the report job).
    wait_for("a third processed", Duration::from_secs(60), async || {
        count(&db, "SELECT count(*) FROM tasks WHERE status = 'processed'").await >= TASKS / 3
    })
    .await;
    wait_for("a holding a task", Duration::from_secs(10), async || {
        count(
            &db,
            "SELECT count(*) FROM tasks WHERE status = 'started' AND processor LIKE 'replica-a-%'",
        )
        .await
            > 0
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(a.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL");
    a.wait().expect("reaping a");
    let killed_at: i64 = count(
        &db,
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
    )
    .await;

    wait_for(
        "every task processed",
        Duration::from_secs(60),
        async || count(&db, "SELECT count(*) FROM tasks WHERE status = 'processed'").await == TASKS,
    )
    .await;

    // Exactly one effect per task, from the claim that completed it.
    let deposits = count(&db, "SELECT count(*) FROM tasks WHERE kind = 'deposit'").await;
    let emails = count(
        &db,
        "SELECT count(*) FROM tasks WHERE kind = 'welcome_email'",
    )
    .await;
    assert_eq!(deposits + emails, TASKS);
    assert_eq!(
        count(&db, "SELECT count(*) FROM public.ledger").await,
        deposits
    );
    assert_eq!(
        count(&db, "SELECT count(DISTINCT task_id) FROM public.ledger").await,
        deposits
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM public.outbox").await,
        emails
    );
    assert_eq!(
        count(&db, "SELECT count(DISTINCT task_id) FROM public.outbox").await,
        emails
    );
    let mismatched = count(
        &db,
        "SELECT count(*) FROM tasks t
           LEFT JOIN public.ledger l ON l.task_id = t.id
           LEFT JOIN public.outbox o ON o.task_id = t.id
          WHERE COALESCE(l.token, o.token) IS DISTINCT FROM t.fencing_token
             OR COALESCE(l.replica, o.replica) IS DISTINCT FROM split_part(t.processor, '-', 1) || '-' || split_part(t.processor, '-', 2)",
    )
    .await;
    assert_eq!(mismatched, 0, "every effect is the completing claim's");

    // The kill landed mid-run: some task of a's was taken over by b.
    let taken_over = count(
        &db,
        "SELECT count(*) FROM lease_events WHERE kind = 'taken_over' AND resource LIKE 'task:%'",
    )
    .await;
    assert!(
        taken_over >= 1,
        "no task was taken over: the kill hit nothing"
    );

    // The singleton job ran on one replica at a time, with rising tokens,
    // and b runs it after a's death.
    wait_for("b reporting", Duration::from_secs(10), async || {
        count(
            &db,
            &format!(
                "SELECT count(*) FROM public.reports WHERE replica = 'replica-b'
                   AND (extract(epoch FROM at) * 1000)::bigint > {killed_at}"
            ),
        )
        .await
            > 0
    })
    .await;
    let overlapping = count(
        &db,
        "SELECT count(*) FROM public.reports r1 JOIN public.reports r2
            ON r1.token < r2.token AND r1.at > r2.at",
    )
    .await;
    assert_eq!(
        overlapping, 0,
        "an older term reported after a newer one began"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(b.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("SIGINT");
    let status = b.wait().expect("reaping b");
    assert!(status.success(), "b stops cleanly on Ctrl-C: {status}");
}

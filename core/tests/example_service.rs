//! The `ledger_service` example, run for real: two replica processes of one
//! binary on one database and a receiver process; one replica is stopped
//! (SIGSTOP) past its lease TTL while it holds tasks, so the other takes
//! them over, then resumed, its stale claims still running, and later
//! killed with SIGKILL mid-run. Every task must still end with exactly one
//! effect, on each path: the completion's transaction (`deposit`,
//! `welcome_email`: one row, written by the claim that completed it), a
//! transaction of the handler's own fenced by `assert_fence` (`ship`: one
//! shipment per task, however many claims ran it), and a receiver outside
//! the database fenced by the token (`notify`: the receiver's last word
//! per task is the completing claim's, never a stale claim's); and the
//! singleton job must move to the survivor.

use leasekeeper_core::db::testing::TestDb;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Tasks in each of the two batches: the first enqueued by replica a as it
/// starts, the second after the stop, for the kill.
const TASKS: i64 = 1000;

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

fn replica(db: &TestDb, receiver: &str, name: &str, extra: &[&str]) -> Child {
    Command::new(example())
        .args(["--database-url", &db.url(), "--replica", name])
        .args(["--receiver", receiver])
        .args(["--lease-ttl-ms", "1500", "--run-for-secs", "180"])
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

/// The example's receiver on a free port: its process and address.
fn receiver() -> (Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let child = Command::new(example())
        .args(["--serve-receiver", &addr])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting the receiver");
    let start = Instant::now();
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the receiver never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, addr)
}

/// The receiver's state: per resource, (token, value) of its last
/// accepted request; and how many requests it refused.
fn dump(addr: &str) -> (std::collections::HashMap<String, (i64, String)>, u64) {
    use std::io::{BufRead, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("the receiver");
    stream.write_all(b"DUMP\n").expect("DUMP");
    let mut latest = std::collections::HashMap::new();
    let mut refused = None;
    for line in std::io::BufReader::new(stream).lines() {
        let line = line.expect("a line");
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["END"] => break,
            ["REFUSED", n] => refused = Some(n.parse().expect("a count")),
            [resource, token, value, _accepted] => {
                latest.insert(
                    resource.to_string(),
                    (token.parse().expect("a token"), value.to_string()),
                );
            }
            other => panic!("unexpected receiver line {other:?}"),
        }
    }
    (latest, refused.expect("REFUSED line"))
}

/// Kills the processes it names when dropped, so a failing test leaves
/// no replica or receiver behind.
struct Reap(Vec<u32>);

impl Drop for Reap {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal)
        .expect("signalling a replica");
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
    use nix::sys::signal::Signal;
    let db = TestDb::new().await;
    let (mut receiver_process, receiver) = receiver();
    let mut a = replica(
        &db,
        &receiver,
        "replica-a",
        &["--enqueue", &TASKS.to_string()],
    );
    let mut b = replica(&db, &receiver, "replica-b", &[]);
    let _reap = Reap(vec![receiver_process.id(), a.id(), b.id()]);
    let a_holds_a_task = async || {
        count(
            &db,
            "SELECT count(*) FROM tasks WHERE status = 'started' AND processor LIKE 'replica-a-%'",
        )
        .await
            > 0
    };

    // Stop a past its TTL (1.5 s) while it holds tasks: b takes them
    // over; then a wakes up with its stale claims mid-handler.
    wait_for("a tenth processed", Duration::from_secs(60), async || {
        count(&db, "SELECT count(*) FROM tasks WHERE status = 'processed'").await >= TASKS / 10
    })
    .await;
    wait_for("a holding a task", Duration::from_secs(10), a_holds_a_task).await;
    let stopped_tasks: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM tasks WHERE status = 'started' AND processor LIKE 'replica-a-%'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    signal(&a, Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(4_000)).await;
    signal(&a, Signal::SIGCONT);
    let taken_during_stop = count(
        &db,
        &format!(
            "SELECT count(*) FROM tasks WHERE id IN ({}) AND processor NOT LIKE 'replica-a-%'",
            stopped_tasks
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
    )
    .await;
    assert!(
        taken_during_stop >= 1,
        "b took over none of the stopped replica's tasks"
    );

    // Kill a while both are busy and a holds tasks (and maybe the report
    // job). A second batch keeps them busy, however much of the first the
    // survivor finished while a was stopped (on an idle machine, nearly
    // all of it: a then had nothing left to hold).
    let status = Command::new(example())
        .args(["--database-url", &db.url(), "--replica", "replica-c"])
        .args(["--receiver", &receiver])
        .args(["--enqueue", &TASKS.to_string(), "--enqueue-only"])
        .stdout(Stdio::null())
        .status()
        .expect("enqueueing the second batch");
    assert!(status.success(), "the second batch: {status}");
    wait_for("a holding a task", Duration::from_secs(30), a_holds_a_task).await;
    signal(&a, Signal::SIGKILL);
    a.wait().expect("reaping a");
    let killed_at: i64 = count(
        &db,
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
    )
    .await;

    wait_for(
        "every task processed",
        Duration::from_secs(120),
        async || {
            count(&db, "SELECT count(*) FROM tasks WHERE status = 'processed'").await == 2 * TASKS
        },
    )
    .await;

    // Exactly one effect per task, from the claim that completed it.
    let deposits = count(&db, "SELECT count(*) FROM tasks WHERE kind = 'deposit'").await;
    let emails = count(
        &db,
        "SELECT count(*) FROM tasks WHERE kind = 'welcome_email'",
    )
    .await;
    let ships = count(&db, "SELECT count(*) FROM tasks WHERE kind = 'ship'").await;
    let notifies = count(&db, "SELECT count(*) FROM tasks WHERE kind = 'notify'").await;
    assert_eq!(deposits + emails + ships + notifies, 2 * TASKS);
    assert!(ships > 0 && notifies > 0, "the example enqueues every kind");
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
          WHERE t.kind IN ('deposit', 'welcome_email')
            AND (COALESCE(l.token, o.token) IS DISTINCT FROM t.fencing_token
             OR COALESCE(l.replica, o.replica) IS DISTINCT FROM split_part(t.processor, '-', 1) || '-' || split_part(t.processor, '-', 2))",
    )
    .await;
    assert_eq!(mismatched, 0, "every effect is the completing claim's");

    // The handler's own transaction, fenced by assert_fence: one shipment
    // per task, from a claim that held the task when it wrote.
    assert_eq!(
        count(&db, "SELECT count(*) FROM public.shipments").await,
        ships,
        "a shipment doubled or went missing"
    );
    assert_eq!(
        count(&db, "SELECT count(DISTINCT task_id) FROM public.shipments").await,
        ships
    );
    // The receiver outside the database: every notify task's last accepted
    // word is the completing claim's (a stale claim that spoke after its
    // successor was refused, so it never overwrote it).
    let (latest, refused) = dump(&receiver);
    let completed: Vec<(i64, i64, String)> =
        sqlx::query_as("SELECT id, fencing_token, processor FROM tasks WHERE kind = 'notify'")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(completed.len() as i64, notifies);
    for (id, token, processor) in &completed {
        let (got, by) = latest
            .get(&format!("task:{id}"))
            .unwrap_or_else(|| panic!("task {id} never reached the receiver"));
        assert_eq!(
            got, token,
            "task {id}: the receiver's last word is a stale claim's"
        );
        assert!(
            processor.starts_with(&format!("{by}-")),
            "task {id}: {by} vs {processor}"
        );
    }
    eprintln!(
        "fenced effects: {ships} shipments, {notifies} notifications, {refused} stale requests refused by the receiver"
    );

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

    signal(&b, Signal::SIGINT);
    let status = b.wait().expect("reaping b");
    assert!(status.success(), "b stops cleanly on Ctrl-C: {status}");
    signal(&receiver_process, Signal::SIGINT);
    receiver_process.wait().expect("reaping the receiver");
}

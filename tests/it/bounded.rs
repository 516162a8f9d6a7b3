//! Bounded work per request (issue 37): reads time out on a pool of their
//! own and never starve a worker's claim; a read whose client goes away is
//! cancelled in the database; the batch route refuses an over-long array
//! while reading it, with little memory; queue names are capped (raced);
//! `GET /api/queues` pages.

use crate::api::{Api, error_of};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tower::ServiceExt;

/// A transaction on its own connection holding `ACCESS EXCLUSIVE` on the
/// schedules table: every read of it waits (a claim never reads it).
async fn lock_schedules(api: &Api) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = api.db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE leasekeeper.schedules IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

/// Reads that wait past the read timeout answer 503 naming the setting, at
/// once after the timeout, even when there are more of them than read
/// connections; meanwhile a worker's claim (on the main pool) succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_read_times_out_with_503_and_a_claim_still_succeeds_meanwhile() {
    let api = Api::with_settings(|s| s.read_timeout = Duration::from_millis(200)).await;
    let (s, task) = api.post("/api/tasks", json!({"task_data": {"n": 1}})).await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    let lock = lock_schedules(&api).await;
    let started = Instant::now();
    // Twice as many reads as the read pool has connections.
    let reads: Vec<_> = (0..2 * leasekeeper::reads::READ_POOL_SIZE)
        .map(|_| {
            let app = api.app();
            tokio::spawn(async move {
                let req = Request::get("/api/schedules").body(Body::empty()).unwrap();
                let resp = app.oneshot(req).await.unwrap();
                let status = resp.status();
                let body = http_body_util::BodyExt::collect(resp.into_body())
                    .await
                    .unwrap()
                    .to_bytes();
                (status, serde_json::from_slice::<Value>(&body).unwrap())
            })
        })
        .collect();
    // The reads hold every read connection now; the claim does not need one.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let claim_started = Instant::now();
    let (s, claimed) = api
        .post("/api/tasks/next", json!({"processor": "w-1"}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{claimed}");
    assert_eq!(claimed["id"], task["id"]);
    assert!(
        claim_started.elapsed() < Duration::from_millis(1000),
        "the claim waited {:?} behind the reads",
        claim_started.elapsed()
    );
    for read in reads {
        // Bounded: without the timeout the reads would wait for the lock,
        // which is released only below.
        let (status, body) = tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("a read still waiting 5 s after the others began")
            .unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(
            error_of(&body).contains("LEASEKEEPER_READ_TIMEOUT_SECS"),
            "{body}"
        );
    }
    // Two waves of 0.2 s, not the lock's hold.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the reads took {:?}",
        started.elapsed()
    );
    lock.rollback().await.unwrap();
    // The read connections came back usable.
    let (s, body) = api.get("/api/schedules").await;
    assert_eq!(s, StatusCode::OK, "{body}");
}

/// A read whose client goes away mid-statement is cancelled in the
/// database within a second, not left waiting (here: on a lock the test
/// holds, with a read timeout of a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_client_disconnects_is_cancelled_in_the_database() {
    let api = Api::with_settings(|s| s.read_timeout = Duration::from_secs(60)).await;
    let lock = lock_schedules(&api).await;
    let app = api.app();
    let client = tokio::spawn(async move {
        let req = Request::get("/api/schedules").body(Body::empty()).unwrap();
        app.oneshot(req).await.map(|r| r.status())
    });
    // The read's backend, waiting on the lock.
    let waiting = "SELECT pid FROM pg_stat_activity
                    WHERE datname = current_database() AND pid <> pg_backend_pid()
                      AND state = 'active' AND wait_event_type = 'Lock'
                      AND query ILIKE '%schedules%'";
    let pid: i32 = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(pid) = sqlx::query_scalar(waiting)
                .fetch_optional(&api.db.pool)
                .await
                .unwrap()
            {
                break pid;
            }
            assert!(Instant::now() < deadline, "the read never reached the lock");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // The client goes away: its request future is dropped.
    client.abort();
    let gone_at = Instant::now();
    loop {
        let still: Option<String> =
            sqlx::query_scalar("SELECT state FROM pg_stat_activity WHERE pid = $1")
                .bind(pid)
                .fetch_optional(&api.db.pool)
                .await
                .unwrap();
        if still.as_deref() != Some("active") {
            break;
        }
        assert!(
            gone_at.elapsed() < Duration::from_secs(1),
            "backend {pid} still runs the abandoned read after {:?}",
            gone_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lock.rollback().await.unwrap();
}

async fn queue_names(api: &Api) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM leasekeeper.queues ORDER BY name")
        .fetch_all(&api.db.pool)
        .await
        .unwrap()
}

async fn task_count(api: &Api) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM leasekeeper.tasks")
        .fetch_one(&api.db.pool)
        .await
        .unwrap()
}

/// With `max_queues` 3: the fourth name is refused 409 naming the cap and
/// the setting, one or in a batch, and the whole batch adds nothing; known
/// names still enqueue.
#[tokio::test]
async fn a_new_queue_past_the_cap_is_refused_409_and_nothing_is_inserted() {
    let api = Api::with_settings(|s| s.max_queues = 3).await;
    for q in ["a", "b", "c"] {
        let (s, body) = api
            .post("/api/tasks", json!({"task_data": {}, "queue": q}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
    }
    let before = task_count(&api).await;
    let (s, body) = api
        .post("/api/tasks", json!({"task_data": {}, "queue": "d"}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    let error = error_of(&body);
    assert!(error.contains("the most allowed is 3"), "{error}");
    assert!(error.contains("LEASEKEEPER_MAX_QUEUES"), "{error}");
    let (s, body) = api
        .post(
            "/api/tasks/batch",
            json!([
                {"task_data": {}, "queue": "a"},
                {"task_data": {}, "queue": "e"},
                {"task_data": {}, "queue": "b"},
            ]),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    assert_eq!(task_count(&api).await, before, "nothing inserted");
    assert_eq!(queue_names(&api).await, ["a", "b", "c"]);
    let (s, body) = api
        .post(
            "/api/tasks/batch",
            json!([{"task_data": {}, "queue": "a"}, {"task_data": {}, "queue": "c"}]),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
}

/// Race: many enqueues of new names at once, each of which could see the
/// cap minus one: exactly the cap's worth of names get in, every other
/// enqueue is refused, and no more queue rows exist than the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_of_new_names_at_once_never_pass_the_cap() {
    const CAP: usize = 5;
    const TRIES: usize = 24;
    let api = Api::with_settings(|s| s.max_queues = CAP as u32).await;
    let gate = std::sync::Arc::new(tokio::sync::Barrier::new(TRIES));
    let tries: Vec<_> = (0..TRIES)
        .map(|i| {
            let app = api.app();
            let gate = gate.clone();
            tokio::spawn(async move {
                let body = json!({"task_data": {}, "queue": format!("q{i}")}).to_string();
                let req = Request::builder()
                    .method(Method::POST)
                    .uri("/api/tasks")
                    .header("content-type", "application/json")
                    .body(Body::from(body))
                    .unwrap();
                gate.wait().await;
                app.oneshot(req).await.unwrap().status()
            })
        })
        .collect();
    let mut created = 0;
    for t in tries {
        match t.await.unwrap() {
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => {}
            other => panic!("an enqueue answered {other}"),
        }
    }
    assert_eq!(created, CAP);
    assert_eq!(queue_names(&api).await.len(), CAP);
    assert_eq!(task_count(&api).await, CAP as i64);
}

/// `GET /api/queues` pages by name: `limit`, a `Link` to the next page with
/// `after`, every queue once; a bad `after` is 400.
#[tokio::test]
async fn the_queues_list_pages_by_name() {
    let api = Api::new().await;
    for q in ["mail", "a b", "zeta", "billing", "default"] {
        let (s, body) = api
            .post("/api/tasks", json!({"task_data": {}, "queue": q}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{body}");
    }
    let (s, first, next) = api.page("/api/queues?limit=2").await;
    assert_eq!(s, StatusCode::OK, "{first}");
    assert_eq!(first.as_array().unwrap().len(), 2);
    let next = next.expect("a Link to the next page");
    assert!(next.starts_with("/api/queues?after="), "{next}");
    let (all, pages) = api.walk("/api/queues?limit=2").await;
    assert_eq!(pages, 3);
    let names: Vec<&str> = all.iter().map(|q| q["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 5);
    let mut expected = queue_names(&api).await;
    expected.dedup();
    assert_eq!(
        names,
        expected.iter().map(String::as_str).collect::<Vec<_>>()
    );
    let (s, _, next) = api.page("/api/queues").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(next, None, "one page holds them all by default");
    let (s, body) = api.get("/api/queues?after=%00").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
}

/// An array one past the batch cap is refused with the cap's words and the
/// count, whatever its elements (read while parsing, never all kept).
#[tokio::test]
async fn an_over_long_batch_is_refused_with_its_count() {
    let api = Api::new().await;
    let mut body = String::from("[");
    for i in 0..leasekeeper_core::queue::MAX_ENQUEUE_BATCH + 1 {
        if i > 0 {
            body.push(',');
        }
        body.push('0');
    }
    body.push(']');
    let (s, e) = api
        .send_with(Method::POST, "/api/tasks/batch", &[], Body::from(body))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    assert_eq!(error_of(&e), "at most 10000 tasks at once, got 10001");
    assert_eq!(task_count(&api).await, 0);
}

/// The peak resident memory of process `pid`, in KiB (`VmHWM`).
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}

/// From outside: the real server, a 16 MiB `[0,0,…]` batch. Refused, and
/// the server's peak memory grows by less than 64 MiB (it grew by 281 MiB
/// when the array became a `Vec<Value>` first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_16_mib_batch_of_zeros_is_refused_with_little_memory() {
    let db = crate::common::TestDb::new().await;
    let server = crate::common::Served::start(&db, &[]).await;
    let base = server.base.clone();
    let client = reqwest::Client::new();
    // Just under the 16 MiB body limit.
    let limit = 16 * 1024 * 1024;
    let mut body = Vec::with_capacity(limit);
    body.push(b'[');
    while body.len() + 3 < limit {
        body.extend_from_slice(b"0,");
    }
    body.extend_from_slice(b"0]");
    let before = peak_kib(server.pid());
    let res = client
        .post(format!("{base}/api/tasks/batch"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = res.status();
    let answer: Value = res.json().await.unwrap();
    let after = peak_kib(server.pid());
    drop(server);
    assert_eq!(status, reqwest::StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        error_of(&answer).starts_with("at most 10000 tasks at once, got "),
        "{answer}"
    );
    let grew_mib = (after.saturating_sub(before)) / 1024;
    eprintln!("peak memory: {before} KiB before, {after} KiB after (+{grew_mib} MiB)");
    assert!(grew_mib < 64, "the peak grew by {grew_mib} MiB");
}

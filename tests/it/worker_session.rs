//! A worker process's session stream (`POST /api/workers/{id}/session`,
//! issue 38): its refusals, and what its close does, with the instance's
//! liveness and without. While a stream is
//! open the instance's liveness session vouches for the worker; when it
//! closes without a goodbye the worker's claims end at once; a newer
//! stream of the same worker (a reconnection) starts a new term, and the
//! old stream's late close ends nothing of it.

use crate::api::{Api, error_of};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use leasekeeper_core::db::Schema;
use leasekeeper_core::lease::Holder;
use leasekeeper_core::queue::{NewTask, store};
use serde_json::json;
use std::time::{Duration, Instant};
use tower::ServiceExt;

const TTL: Duration = Duration::from_secs(15);

/// Asks for worker `id`'s session stream; answers the (streaming) answer.
async fn request(api: &Api, id: &str) -> axum::response::Response {
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("/api/workers/{id}/session"))
        .header("content-type", "application/json")
        .body(Body::from("{}"))
        .unwrap();
    api.app().oneshot(req).await.unwrap()
}

/// Opens worker `id`'s session stream and reads its `ready`.
async fn open(api: &Api, id: &str) -> axum::response::Response {
    let mut response = request(api, id).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/event-stream",
        "{:?}",
        response.headers()
    );
    let first = tokio::time::timeout(Duration::from_secs(5), response.body_mut().frame())
        .await
        .expect("ready within 5 s")
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(first.data_ref().unwrap()).to_string();
    assert!(text.starts_with("event: ready\ndata: i-test\n"), "{text:?}");
    response
}

async fn enqueue(api: &Api) -> i64 {
    store::enqueue(
        &mut api.db.pool.acquire().await.unwrap(),
        &Schema::default(),
        &NewTask::new("k", json!({})),
    )
    .await
    .unwrap()
    .id
}

async fn claim(api: &Api, holder: &str) -> Option<(i64, i64)> {
    store::claim_next(
        &mut api.db.pool.acquire().await.unwrap(),
        &Schema::default(),
        &Holder::parse(holder).unwrap(),
        TTL,
    )
    .await
    .unwrap()
    .map(|t| (t.id, t.fencing_token.unwrap()))
}

#[tokio::test]
async fn bad_requests_for_a_session_stream_are_refused_and_change_nothing() {
    let api = Api::new().await;
    let long = "w".repeat(300);
    let (s, body) = api
        .post(&format!("/api/workers/{long}/session"), json!({}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    let (s, body) = api
        .post("/api/workers/pw/session", json!({ "queue": "x" }))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    assert!(error_of(&body).contains("queue"), "{body}");
    let (s, _) = api
        .send_bytes(
            Method::POST,
            "/api/workers/pw/session",
            &[("content-type", "text/plain")],
            Body::from("{}"),
        )
        .await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // A simulated worker's id is not a worker process's.
    let (s, w) = api.post("/api/workers", json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{w}");
    let (s, body) = api.post("/api/workers/i-test-w1/session", json!({})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    assert!(error_of(&body).contains("simulated"), "{body}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM liveness")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

/// An instance without liveness (behind a transaction pooler) opens the
/// stream, so its workers run, but promises nothing: its close ends
/// nothing, and the claim waits out its TTL.
#[tokio::test]
async fn without_liveness_the_stream_opens_and_its_close_ends_nothing() {
    let api = Api::new().await;
    let task = enqueue(&api).await;
    let stream = open(&api, "pw").await;
    assert_eq!(claim(&api, "pw").await, Some((task, 1)));
    drop(stream);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        claim(&api, "other").await,
        None,
        "still pw's, under its TTL"
    );
}

#[tokio::test]
async fn a_session_stream_needs_a_worker_credential() {
    let api = Api::with_settings(|s| {
        s.worker_token = Some("worker-token-0123456789".into());
    })
    .await;
    let (s, body) = api.post("/api/workers/pw/session", json!({})).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stream_ends_its_workers_claims_at_once_and_an_older_one_ends_nothing() {
    let (api, liveness) = Api::vouched().await;
    // An instance's own name is never adopted (that would end its
    // singleton terms), whoever asks.
    let (s, body) = api.post("/api/workers/i-test/session", json!({})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    assert!(error_of(&body).contains("instance"), "{body}");
    let task = enqueue(&api).await;
    let first = open(&api, "pw").await;
    assert_eq!(claim(&api, "pw").await, Some((task, 1)));
    // The worker reconnects (its first stream broke on its side): the new
    // term ends what it held, and it claims again.
    let second = open(&api, "pw").await;
    assert_eq!(claim(&api, "pw").await, Some((task, 2)), "a new term");
    // The first stream's close reaches the instance only now: nothing of
    // the new term is ended.
    drop(first);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(claim(&api, "other").await, None, "still pw's");

    // The process dies: its stream closes without a goodbye.
    let closed = Instant::now();
    drop(second);
    let rescued = loop {
        assert!(
            closed.elapsed() < Duration::from_secs(2),
            "not ended within 2 s (TTL 15 s)"
        );
        if let Some(got) = claim(&api, "other").await {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(rescued, (task, 3));
    let kinds: Vec<String> = sqlx::query_scalar(
        "SELECT kind FROM lease_events WHERE resource = 'task:' || $1 ORDER BY id",
    )
    .bind(task)
    .fetch_all(&api.db.pool)
    .await
    .unwrap();
    assert_eq!(
        kinds,
        [
            "acquired",
            "session_ended",
            "taken_over",
            "session_ended",
            "taken_over"
        ]
    );
    let holders: Vec<String> =
        sqlx::query_scalar("SELECT holders FROM liveness WHERE instance_id = 'i-test'")
            .fetch_one(&api.db.pool)
            .await
            .unwrap();
    assert_eq!(holders, ["i-test"], "no longer vouched for");
    liveness.shutdown().await;
}

/// The instance's own liveness session is cut while its server runs: it
/// may be judged dead and its holders' claims ended, so every session
/// stream it vouched for ends at once (the workers give their claims up),
/// and a worker can open a new one once it is registered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_end_when_the_instance_loses_its_liveness_session() {
    let (api, liveness) = Api::vouched().await;
    let mut stream = open(&api, "pw").await;
    let pid: i32 = sqlx::query_scalar("SELECT pid FROM liveness WHERE instance_id = 'i-test'")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    let cut = Instant::now();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&api.db.pool)
        .await
        .unwrap();
    // Keep-alives may come first; then the body ends.
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(2), stream.body_mut().frame())
            .await
            .expect("the stream ended within 2 s of the cut");
        match frame {
            None | Some(Err(_)) => break,
            Some(Ok(_)) => assert!(cut.elapsed() < Duration::from_secs(2)),
        }
    }
    drop(stream);
    // Registered again, the instance vouches for a new stream.
    let again = Instant::now();
    loop {
        let response = request(&api, "pw").await;
        if response.status() == StatusCode::OK {
            break;
        }
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            again.elapsed() < Duration::from_secs(5),
            "not registered again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    liveness.shutdown().await;
}

//! Task controls (issue 14 item 3): cancel and retry, one task and in bulk,
//! over REST and through the dashboard's server functions; each change is
//! audited in its own transaction; a cancelled claim's holder is refused;
//! and the races a cancel or retry can meet, raced for real.

use crate::api::{Api, error_of};
use axum::body::Body;
use axum::http::{Method, StatusCode};
use leasekeeper::app::{ControlTask, ControlTasks};
use leptos::server_fn::ServerFn;
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::Barrier;

async fn enqueue(api: &Api) -> i64 {
    let (s, task) = api
        .post(
            "/api/tasks",
            json!({"task_data": {"n": 1}, "max_attempts": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    task["id"].as_i64().unwrap()
}

async fn claim(api: &Api, processor: &str) -> Value {
    let (s, task) = api
        .post("/api/tasks/next", json!({"processor": processor}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{task}");
    task
}

/// The operator rows of task `id`: (action, previous status).
async fn audit(api: &Api, id: i64) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT detail->>'action', detail->>'previous' FROM lease_events
          WHERE resource = $1 AND kind = 'operator' ORDER BY id",
    )
    .bind(format!("task:{id}"))
    .fetch_all(&api.db.pool)
    .await
    .unwrap()
}

/// Whether task `id` has a live claim: its lease is the task row.
async fn lease_live(api: &Api, id: i64) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1
                           AND status = 'started' AND must_heartbeat_before > now())",
    )
    .bind(id)
    .fetch_one(&api.db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_pending_task_is_cancelled_and_retried_and_each_step_is_audited() {
    let api = Api::new().await;
    let id = enqueue(&api).await;

    let (s, task) = api
        .post(&format!("/api/tasks/{id}/cancel"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{task}");
    assert_eq!(task["status"], "cancelled");
    assert!(task["cancelled_at"].is_string(), "{task}");
    // Twice: a conflict that says why, and nothing more happens.
    let (s, err) = api
        .post(&format!("/api/tasks/{id}/cancel"), json!({}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{err}");
    assert!(error_of(&err).contains("it is cancelled"), "{err}");
    // A claim does not take a cancelled task.
    let (s, none) = api.post("/api/tasks/next", json!({"processor": "w"})).await;
    assert_eq!(s, StatusCode::OK, "{none}");

    let (s, task) = api.post(&format!("/api/tasks/{id}/retry"), json!({})).await;
    assert_eq!(s, StatusCode::OK, "{task}");
    assert_eq!(task["status"], "pending");
    assert_eq!(task["attempts"], 0);
    assert!(task["cancelled_at"].is_null(), "{task}");
    let (s, err) = api.post(&format!("/api/tasks/{id}/retry"), json!({})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{err}");
    assert!(error_of(&err).contains("it is pending"), "{err}");

    assert_eq!(
        audit(&api, id).await,
        [
            ("cancel_task".to_string(), "pending".to_string()),
            ("retry_task".to_string(), "cancelled".to_string())
        ]
    );
    // The counters moved with the statuses.
    let (s, overview) = api.get("/api/overview").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(overview["counts"]["tasks_pending"], 1, "{overview}");
    assert_eq!(overview["counts"]["tasks_cancelled"], 0, "{overview}");

    for (path, status) in [
        ("/api/tasks/999999/cancel", StatusCode::NOT_FOUND),
        ("/api/tasks/999999/retry", StatusCode::NOT_FOUND),
        ("/api/tasks/0/cancel", StatusCode::BAD_REQUEST),
        ("/api/tasks/abc/retry", StatusCode::BAD_REQUEST),
    ] {
        let (s, err) = api.post(path, json!({})).await;
        assert_eq!(s, status, "{path}: {err}");
        assert!(!error_of(&err).is_empty(), "{path}: {err}");
    }
}

#[tokio::test]
async fn cancelling_a_started_task_ends_its_claim_and_refuses_its_holder() {
    let api = Api::new().await;
    let id = enqueue(&api).await;
    let claimed = claim(&api, "w1").await;
    let token = claimed["fencing_token"].as_i64().unwrap();
    assert!(lease_live(&api, id).await);

    let (s, task) = api
        .post(&format!("/api/tasks/{id}/cancel"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{task}");
    assert_eq!(task["status"], "cancelled");
    assert!(!lease_live(&api, id).await, "the claim's lease must end");

    let body = json!({"processor": "w1", "fencing_token": token, "task_output": 1});
    let (s, err) = api
        .put(&format!("/api/tasks/{id}/heartbeat"), body.clone())
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{err}");
    let (s, err) = api.put(&format!("/api/tasks/{id}/complete"), body).await;
    assert_eq!(s, StatusCode::CONFLICT, "{err}");
    assert!(error_of(&err).contains("cancelled"), "{err}");
    let kinds = crate::common::event_kinds(&api.db.pool, &format!("task:{id}")).await;
    assert_eq!(
        kinds,
        [
            "acquired",
            "released",
            "operator",
            "stale_write_refused",
            "stale_write_refused"
        ],
        "acquired, the cancel's release and its audit row, then both refused writes"
    );
    assert_eq!(
        audit(&api, id).await,
        [("cancel_task".to_string(), "started".to_string())]
    );
    let (_, task) = api.get(&format!("/api/tasks/{id}")).await;
    assert_eq!(
        task["status"], "cancelled",
        "the refused completion changed nothing"
    );
}

#[tokio::test]
async fn bulk_cancel_and_retry_take_every_matching_task_in_batches() {
    let api = Api::new().await;
    let n = leasekeeper_core::queue::control::BATCH as usize * 2 + 37;
    sqlx::query(
        "INSERT INTO tasks (kind, task_data)
         SELECT CASE WHEN i % 2 = 0 THEN 'even' ELSE 'odd' END, '{}'
           FROM generate_series(1, $1) i",
    )
    .bind(n as i32)
    .execute(&api.db.pool)
    .await
    .unwrap();
    enqueue(&api).await;
    let t = claim(&api, "w").await;
    // The claim took the oldest pending task; complete it so one is processed.
    let body = json!({"processor": "w", "fencing_token": t["fencing_token"]});
    let (s, _) = api
        .put(&format!("/api/tasks/{}/complete", t["id"]), body)
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);

    // Only the odd ones first: the kind filter holds.
    let (s, r) = api
        .post(
            "/api/tasks/cancel",
            json!({"status": "pending", "kind": "odd"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let odd_left = n.div_ceil(2) - usize::from(t["kind"] == "odd");
    assert_eq!(r["count"], odd_left as u64, "{r}");
    let (s, r) = api
        .post("/api/tasks/cancel", json!({"status": "pending"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let cancelled = n; // every generated task but the processed one, plus the enqueued one
    assert_eq!(
        r["count"].as_u64().unwrap() + odd_left as u64,
        cancelled as u64,
        "{r}"
    );
    let (_, overview) = api.get("/api/overview").await;
    assert_eq!(
        overview["counts"]["tasks_cancelled"], cancelled,
        "{overview}"
    );
    assert_eq!(overview["counts"]["tasks_pending"], 0, "{overview}");
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM lease_events
          WHERE kind = 'operator' AND detail->>'action' = 'cancel_task'
            AND (detail->>'bulk')::bool",
    )
    .fetch_one(&api.db.pool)
    .await
    .unwrap();
    assert_eq!(audited, cancelled as i64, "one audit row per task");

    let (s, r) = api
        .post("/api/tasks/retry", json!({"status": "cancelled"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["count"], cancelled, "{r}");
    let (_, overview) = api.get("/api/overview").await;
    assert_eq!(overview["counts"]["tasks_pending"], cancelled, "{overview}");
    assert_eq!(overview["counts"]["tasks_processed"], 1, "{overview}");

    // Bad bulk requests: clear errors, nothing changed.
    for (path, body, needle) in [
        (
            "/api/tasks/cancel",
            json!({"status": "processed"}),
            "expected one of `pending`, `started`, `waiting`",
        ),
        (
            "/api/tasks/retry",
            json!({"status": "pending"}),
            "expected `failed` or `cancelled`",
        ),
        (
            "/api/tasks/retry",
            json!({"status": "bogus"}),
            "unknown variant `bogus`",
        ),
        ("/api/tasks/cancel", json!({}), "status"),
        (
            "/api/tasks/cancel",
            json!({"status": "pending", "kind": ""}),
            "kind must be",
        ),
        (
            "/api/tasks/cancel",
            json!({"status": "pending", "limit": 3}),
            "limit",
        ),
    ] {
        let (s, err) = api.post(path, body.clone()).await;
        assert!(s.is_client_error(), "{path} {body}: {s} {err}");
        assert!(error_of(&err).contains(needle), "{path} {body}: {err}");
    }
    let (_, overview) = api.get("/api/overview").await;
    assert_eq!(overview["counts"]["tasks_pending"], cancelled, "{overview}");
}

#[tokio::test]
async fn with_a_token_set_task_controls_need_it() {
    const TOKEN: &str = "an-admin-token-for-tests";
    let api = Api::with_settings(|s| s.admin_token = Some(TOKEN.into())).await;
    // Enqueueing needs a credential too once a token is set.
    let (s, task) = api
        .send_with(
            Method::POST,
            "/api/tasks",
            &[("authorization", &format!("Bearer {TOKEN}"))],
            Body::from(r#"{"task_data": {"n": 1}, "max_attempts": 1}"#),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    let id = task["id"].as_i64().unwrap();
    for uri in [
        format!("/api/tasks/{id}/cancel"),
        format!("/api/tasks/{id}/retry"),
        "/api/tasks/cancel".to_string(),
        "/api/tasks/retry".to_string(),
    ] {
        let (s, err) = api
            .raw(Method::POST, &uri, Body::from(r#"{"status":"pending"}"#))
            .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri}: {err}");
    }
    let form = [("content-type", "application/x-www-form-urlencoded")];
    for (path, body) in [
        (
            <ControlTask as ServerFn>::PATH,
            format!("id={id}&action=cancel"),
        ),
        (
            <ControlTasks as ServerFn>::PATH,
            "status=pending&action=cancel".to_string(),
        ),
    ] {
        let (s, err) = api
            .send_bytes(Method::POST, path, &form, Body::from(body))
            .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{path}");
        assert!(String::from_utf8_lossy(&err).contains("admin token"));
    }
    let (_, task) = api.get(&format!("/api/tasks/{id}")).await;
    assert_eq!(task["status"], "pending", "refused: nothing changed");
    assert!(audit(&api, id).await.is_empty(), "nothing audited");
    // With it: done.
    let (s, task) = api
        .send_with(
            Method::POST,
            &format!("/api/tasks/{id}/cancel"),
            &[("authorization", &format!("Bearer {TOKEN}"))],
            Body::empty(),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{task}");
}

#[tokio::test]
async fn the_page_controls_cancel_and_retry() {
    let api = Api::new().await;
    let id = enqueue(&api).await;
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let (s, said) = api
        .send_bytes(
            Method::POST,
            <ControlTask as ServerFn>::PATH,
            &form,
            Body::from(format!("id={id}&action=cancel")),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{said:?}");
    assert!(String::from_utf8_lossy(&said).contains(&format!("task {id} cancelled")));
    let (s, said) = api
        .send_bytes(
            Method::POST,
            <ControlTasks as ServerFn>::PATH,
            &form,
            Body::from("status=cancelled&action=retry"),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{said:?}");
    assert!(String::from_utf8_lossy(&said).contains("1 cancelled tasks retried"));
    let (s, said) = api
        .send_bytes(
            Method::POST,
            <ControlTask as ServerFn>::PATH,
            &form,
            Body::from(format!("id={id}&action=delete")),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{said:?}");
    let (_, task) = api.get(&format!("/api/tasks/{id}")).await;
    assert_eq!(task["status"], "pending");
}

/// Race: an operator cancels a started task at the instant its holder
/// completes it. Exactly one wins: either the task is processed and the
/// cancel is refused (409), or it is cancelled, its lease ended, and the
/// completion refused and recorded. Never both, never a cancelled task with
/// a live lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_racing_the_holders_completion_never_lets_both_win() {
    an_action_racing_the_holders_completion("cancel", "cancelled").await;
}

/// Race: an operator releases a started task's claim at the instant its
/// holder completes it. Exactly one wins: either the task is processed and
/// the release is refused (409), or the task is still started with its
/// claim ended (late, ready for a takeover) and the completion refused and
/// recorded. Never both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_racing_the_holders_completion_never_lets_both_win() {
    an_action_racing_the_holders_completion("release", "started").await;
}

/// 60 rounds of `action` (`cancel` or `release`, posted to the task) racing
/// the holder's completion; the task is in `status` when the action won.
async fn an_action_racing_the_holders_completion(action: &'static str, status: &'static str) {
    let api = Arc::new(Api::new().await);
    let (mut cancelled, mut completed) = (0, 0);
    for round in 0..60 {
        let id = enqueue(&api).await;
        let t = claim(&api, "holder").await;
        assert_eq!(t["id"], id);
        let token = t["fencing_token"].as_i64().unwrap();
        let barrier = Arc::new(Barrier::new(2));
        let cancel = {
            let (api, barrier) = (api.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                api.post(
                    &format!("/api/tasks/{id}/{action}"),
                    json!({"fencing_token": token}),
                )
                .await
                .0
            })
        };
        let complete = {
            let (api, barrier) = (api.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                if round % 3 == 2 {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                let body = json!({"processor": "holder", "fencing_token": token});
                api.put(&format!("/api/tasks/{id}/complete"), body).await.0
            })
        };
        let (c, d) = (cancel.await.unwrap(), complete.await.unwrap());
        let (_, task) = api.get(&format!("/api/tasks/{id}")).await;
        match (c, d) {
            (StatusCode::OK, StatusCode::CONFLICT) => {
                assert_eq!(task["status"], status, "round {round}");
                assert!(
                    !lease_live(&api, id).await,
                    "round {round}: lease left live"
                );
                cancelled += 1;
            }
            (StatusCode::CONFLICT, StatusCode::ACCEPTED) => {
                assert_eq!(task["status"], "processed", "round {round}");
                completed += 1;
            }
            other => panic!("round {round}: both or neither won: {other:?}, {task}"),
        }
        let refused: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM lease_events WHERE resource = $1 AND kind = 'stale_write_refused'",
        )
        .bind(format!("task:{id}"))
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
        assert_eq!(refused, i64::from(c == StatusCode::OK), "round {round}");
    }
    assert!(
        cancelled > 0 && completed > 0,
        "not raced: {action} won {cancelled}, the completion {completed}"
    );
}

/// Race: an operator cancels a pending task at the instant a worker claims
/// it. Either the cancel comes first (the claim finds nothing) or the claim
/// does, and the cancel then ends that claim too: a cancelled task never
/// keeps a live lease (the lease of a claim that committed while the cancel
/// waited for the row is seen and released).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_racing_a_claim_never_leaves_a_live_claim_on_a_cancelled_task() {
    let api = Arc::new(Api::new().await);
    let (mut before, mut after) = (0, 0);
    for round in 0..60 {
        let id = enqueue(&api).await;
        let barrier = Arc::new(Barrier::new(2));
        let cancel = {
            let (api, barrier) = (api.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                if round % 3 == 2 {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                api.post(&format!("/api/tasks/{id}/cancel"), json!({}))
                    .await
            })
        };
        let claim = {
            let (api, barrier) = (api.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                api.post("/api/tasks/next", json!({"processor": "racer"}))
                    .await
            })
        };
        let ((c, cancelled), (s, _)) = (cancel.await.unwrap(), claim.await.unwrap());
        assert_eq!(
            c,
            StatusCode::OK,
            "round {round}: a cancel of a pending or started task wins"
        );
        assert_eq!(cancelled["status"], "cancelled");
        assert!(
            !lease_live(&api, id).await,
            "round {round}: a live lease on a cancelled task"
        );
        if s == StatusCode::ACCEPTED {
            after += 1;
            assert_eq!(
                audit(&api, id).await,
                [("cancel_task".to_string(), "started".to_string())],
                "round {round}"
            );
        } else {
            before += 1;
        }
    }
    assert!(
        before > 0 && after > 0,
        "not raced: {before} before, {after} after the claim"
    );
}

/// Race: two operators retry the same failed task at once. One retry wins;
/// the other is told it is pending now; one audit row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_retries_at_once_retry_once() {
    let api = Arc::new(Api::new().await);
    for round in 0..30 {
        let id = enqueue(&api).await;
        let (s, _) = api
            .post(&format!("/api/tasks/{id}/cancel"), json!({}))
            .await;
        assert_eq!(s, StatusCode::OK);
        let barrier = Arc::new(Barrier::new(2));
        let retries: Vec<_> = (0..2)
            .map(|_| {
                let (api, barrier) = (api.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    api.post(&format!("/api/tasks/{id}/retry"), json!({}))
                        .await
                        .0
                })
            })
            .collect();
        let mut won = 0;
        for r in retries {
            match r.await.unwrap() {
                StatusCode::OK => won += 1,
                StatusCode::CONFLICT => {}
                other => panic!("round {round}: {other}"),
            }
        }
        assert_eq!(won, 1, "round {round}");
        assert_eq!(
            audit(&api, id).await.len(),
            2,
            "round {round}: cancel + one retry"
        );
    }
}

#[tokio::test]
async fn another_sites_page_cannot_cancel_or_retry() {
    let api = Api::new().await;
    let id = enqueue(&api).await;
    let cross = [
        ("origin", "http://evil.example"),
        ("host", "127.0.0.1:3000"),
    ];
    for uri in [
        format!("/api/tasks/{id}/cancel"),
        "/api/tasks/cancel".to_string(),
        "/api/tasks/retry".to_string(),
    ] {
        let (s, err) = api
            .send_with(
                Method::POST,
                &uri,
                &cross,
                Body::from(r#"{"status":"pending"}"#),
            )
            .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{uri}: {err}");
    }
    let (_, task) = api.get(&format!("/api/tasks/{id}")).await;
    assert_eq!(task["status"], "pending", "nothing changed");
    assert!(audit(&api, id).await.is_empty());
}

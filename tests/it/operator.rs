//! Operator controls: the admin token guards them (reads stay open), every
//! action is audited in lease_events, force-release ends exactly the term
//! the operator saw, and kills of other instances go through them.

use crate::api::{Api, error_of};
use axum::body::Body;
use axum::http::{Method, StatusCode};
use leasekeeper::app::{ControlWorker, SetGenerator, SpawnWorker};
use leptos::server_fn::ServerFn;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

const TOKEN: &str = "an-admin-token-for-tests";

async fn with_token() -> Api {
    Api::with_settings(|s| s.admin_token = Some(TOKEN.into())).await
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

async fn desired(api: &Api) -> String {
    sqlx::query_scalar("SELECT desired FROM generator_state")
        .fetch_one(&api.db.pool)
        .await
        .unwrap()
}

async fn operator_actions(api: &Api) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT resource, detail->>'action' FROM lease_events WHERE kind = 'operator' ORDER BY id",
    )
    .fetch_all(&api.db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn with_a_token_set_controls_need_it_and_reads_do_not() {
    let api = with_token().await;
    // REST controls without the token: 401, nothing changes.
    let refused: [(Method, &str); 4] = [
        (Method::POST, "/api/generator/start"),
        (Method::POST, "/api/workers"),
        (Method::POST, "/api/instances/i-x/kill"),
        (Method::POST, "/api/workers/w-x/kill"),
    ];
    for (method, uri) in &refused {
        let (s, err) = api.raw(method.clone(), uri, Body::empty()).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri}: {err}");
        assert!(error_of(&err).contains("admin token"), "{err}");
        let (s, _) = api
            .send_with(
                method.clone(),
                uri,
                &[("authorization", "Bearer wrong-token-wrong-token")],
                Body::empty(),
            )
            .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri} with a wrong token");
    }
    let (s, _) = api
        .send_with(Method::DELETE, "/api/generator/stop", &[], Body::empty())
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // Server functions (the dashboard's buttons) too.
    let form = [("content-type", "application/x-www-form-urlencoded")];
    for (path, body) in [
        (<SetGenerator as ServerFn>::PATH, "action=start"),
        (<SpawnWorker as ServerFn>::PATH, ""),
        (<ControlWorker as ServerFn>::PATH, "id=w-x&action=kill"),
    ] {
        let (s, err) = api
            .send_with(Method::POST, path, &form, Body::from(body))
            .await;
        assert_ne!(s, StatusCode::OK, "{path}: {err}");
        assert!(err.to_string().contains("admin token"), "{path}: {err}");
    }
    assert_eq!(desired(&api).await, "stopped");
    assert!(api.fleet.running().is_empty());
    assert!(operator_actions(&api).await.is_empty());
    // Reads are open.
    for uri in [
        "/api/generator/status",
        "/api/workers",
        "/api/instances",
        "/api/leases",
    ] {
        assert_eq!(api.get(uri).await.0, StatusCode::OK, "{uri}");
    }
    // With the token (header, or the session its sign-in opens) the
    // controls work.
    let (s, _) = api
        .send_with(
            Method::POST,
            "/api/generator/start",
            &[("authorization", &bearer())],
            Body::empty(),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(desired(&api).await, "running");
    // The old cookie that held the token itself opens nothing now.
    let raw = format!("leasekeeper_admin={TOKEN}");
    let (s, _) = api
        .send_with(
            Method::POST,
            <SetGenerator as ServerFn>::PATH,
            &[form[0], ("cookie", &raw)],
            Body::from("action=stop"),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (_, set) = crate::credentials::sign_in(&api, TOKEN, &[]).await;
    let cookie = crate::credentials::cookie_pair(&set.expect("a session cookie"));
    let (s, err) = api
        .send_with(
            Method::POST,
            <SetGenerator as ServerFn>::PATH,
            &[form[0], ("cookie", &cookie)],
            Body::from("action=stop"),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{err}");
    assert_eq!(desired(&api).await, "stopped");
}

#[tokio::test]
async fn every_worker_control_is_audited() {
    let api = Api::new().await;
    let (s, worker) = api.post("/api/workers", json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{worker}");
    let id = worker["id"].as_str().unwrap().to_string();
    let (s, body) = api
        .post(&format!("/api/workers/{id}/kill"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let actions = operator_actions(&api).await;
    assert_eq!(
        actions,
        vec![
            (format!("worker:{id}"), "spawn_worker".to_string()),
            (format!("worker:{id}"), "kill_worker".to_string()),
        ]
    );
    // A dead worker cannot be killed again; nothing more is audited.
    let (s, body) = api
        .post(&format!("/api/workers/{id}/kill"), json!({}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    assert_eq!(operator_actions(&api).await.len(), 2);
}

async fn acquire(api: &Api, resource: &str, holder: &str) -> Value {
    let (s, lease) = api
        .post(
            "/api/leases",
            json!({"resource": resource, "holder": holder, "ttl_seconds": 30}),
        )
        .await;
    assert!(s.is_success(), "{lease}");
    lease
}

#[tokio::test]
async fn force_release_ends_the_term_the_operator_saw_and_no_other() {
    let api = Api::new().await;
    let lease = acquire(&api, "printer", "alice").await;
    let (id, token) = (
        lease["id"].as_i64().unwrap(),
        lease["fencing_token"].as_i64().unwrap(),
    );
    // A stale token (the operator looked at an older term): refused.
    let (s, err) = api
        .post(
            &format!("/api/leases/{id}/force-release"),
            json!({"fencing_token": token - 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{err}");
    let (s, released) = api
        .post(
            &format!("/api/leases/{id}/force-release"),
            json!({"fencing_token": token}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{released}");
    assert_eq!(released["state"], "released");
    // The holder's renewal now fails: it must step down.
    let (s, _) = api
        .put(
            "/api/leases/renew",
            json!({"resource": "printer", "holder": "alice"}),
        )
        .await;
    assert!(s.is_client_error(), "renew after force-release: {s}");
    // The next holder gets a higher token; releasing the old term again is a no-op.
    let next = acquire(&api, "printer", "bob").await;
    assert!(next["fencing_token"].as_i64().unwrap() > token);
    let (s, _) = api
        .post(
            &format!("/api/leases/{id}/force-release"),
            json!({"fencing_token": token}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(
        operator_actions(&api).await,
        vec![("printer".to_string(), "force_release".to_string())]
    );
    // Bad input: 400, not 500.
    for body in [
        json!({}),
        json!({"fencing_token": "7"}),
        json!({"fencing_token": 1, "x": 1}),
    ] {
        let (s, err) = api
            .post(&format!("/api/leases/{id}/force-release"), body)
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{err}");
    }
    let (s, _) = api
        .post("/api/leases/0/force-release", json!({"fencing_token": 1}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn releasing_a_task_s_claim_ends_it_and_the_task_is_taken_over_at_once() {
    let api = Api::new().await;
    let (s, task) = api
        .post(
            "/api/tasks",
            json!({"task_data": {"sleep_duration_seconds": 30}}),
        )
        .await;
    assert!(s.is_success(), "{task}");
    let (s, claim) = api
        .post("/api/tasks/next", json!({"processor": "w-old"}))
        .await;
    assert!(s.is_success(), "{claim}");
    let task_id = claim["id"].as_i64().unwrap();
    let token = claim["fencing_token"].as_i64().unwrap();
    // Another term's token: nothing changes.
    let (s, body) = api
        .post(
            &format!("/api/tasks/{task_id}/release"),
            json!({"fencing_token": token + 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    let (s, body) = api
        .post(
            &format!("/api/tasks/{task_id}/release"),
            json!({"fencing_token": token}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "started");
    assert!(body["heartbeat_in_ms"].as_i64().unwrap() <= 0, "{body}");
    // The old processor's completion is refused; another worker takes over.
    let (s, _) = api
        .put(
            &format!("/api/tasks/{task_id}/complete"),
            json!({"processor": "w-old", "fencing_token": token, "task_output": {}}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, again) = api
        .post("/api/tasks/next", json!({"processor": "w-new"}))
        .await;
    assert!(s.is_success(), "{again}");
    assert_eq!(again["id"].as_i64(), Some(task_id));
    assert_eq!(again["fencing_token"].as_i64(), Some(token + 1));
    // Released twice: its claim is the new one's now.
    let (s, body) = api
        .post(
            &format!("/api/tasks/{task_id}/release"),
            json!({"fencing_token": token}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    // The history: the release ends the term, then the takeover; audited.
    let kinds = crate::common::event_kinds(&api.db.pool, &format!("task:{task_id}")).await;
    assert_eq!(
        kinds,
        [
            "acquired",
            "released",
            "operator",
            "stale_write_refused",
            "taken_over"
        ]
    );
    let (_, audit) = api.get("/api/audit").await;
    assert!(audit.to_string().contains("release_claim"), "{audit}");
}

/// Race: the holder renews while the operator force-releases the same term.
/// Whatever the order, a successful force-release leaves the lease released:
/// a renewal never revives a term the operator ended.
#[tokio::test]
async fn force_release_racing_the_holders_renewal_never_leaves_it_live() {
    let api = Arc::new(Api::new().await);
    let mut released_first = 0;
    for round in 0..60 {
        let resource = format!("race-{round}");
        let lease = acquire(&api, &resource, "holder").await;
        let (id, token) = (
            lease["id"].as_i64().unwrap(),
            lease["fencing_token"].as_i64().unwrap(),
        );
        let barrier = Arc::new(Barrier::new(2));
        let renew = {
            let (api, barrier, resource) = (api.clone(), barrier.clone(), resource.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                // Every third round the renewal starts a millisecond late,
                // so that the release-first order is covered whatever the
                // scheduler favours; the other rounds race unaided.
                if round % 3 == 2 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                api.put(
                    "/api/leases/renew",
                    json!({"resource": resource, "holder": "holder"}),
                )
                .await
                .0
            })
        };
        let release = {
            let (api, barrier) = (api.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                api.post(
                    &format!("/api/leases/{id}/force-release"),
                    json!({"fencing_token": token}),
                )
                .await
                .0
            })
        };
        let (renewed, released) = (renew.await.unwrap(), release.await.unwrap());
        assert_eq!(
            released,
            StatusCode::OK,
            "round {round}: the term was live, the release must win"
        );
        let state: (bool, bool) = sqlx::query_as(
            "SELECT released_at IS NOT NULL, expires_at > now() FROM leases WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
        assert_eq!(
            state,
            (true, false),
            "round {round}: renew {renewed} left the lease live"
        );
        if !renewed.is_success() {
            released_first += 1;
        }
    }
    // Both orders must have happened for the race to have been raced.
    assert!(released_first > 0, "the release never came first");
}

#[tokio::test]
async fn killing_another_instance_goes_through_it_and_says_why_it_cannot() {
    let api = Api::new().await;
    let (s, err) = api.post("/api/instances/i-nobody/kill", json!({})).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{err}");
    // Registered, but nothing listens at its address (it died unannounced).
    sqlx::query("INSERT INTO instances (id, address) VALUES ('i-ghost', '127.0.0.1:9')")
        .execute(&api.db.pool)
        .await
        .unwrap();
    let (s, err) = api.post("/api/instances/i-ghost/kill", json!({})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{err}");
    assert!(error_of(&err).contains("did not answer"), "{err}");
    sqlx::query("UPDATE instances SET stopped_at = now() WHERE id = 'i-ghost'")
        .execute(&api.db.pool)
        .await
        .unwrap();
    let (s, err) = api.post("/api/instances/i-ghost/kill", json!({})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{err}");
    assert!(error_of(&err).contains("already stopped"), "{err}");
}

//! The worker REST routes, driven in-process: spawn, list, pause and kill
//! this instance's simulated workers; 404 for anyone else's; reports from
//! worker processes.

use crate::api::{Api, error_of};
use axum::http::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;

async fn wait_for_state(api: &Api, id: &str, state: &str) -> Value {
    for _ in 0..50 {
        let (s, w) = api.get(&format!("/api/workers/{id}")).await;
        assert_eq!(s, StatusCode::OK, "{w}");
        if w["state"] == state {
            return w;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("worker {id} never became {state}");
}

#[tokio::test]
async fn spawn_list_pause_and_kill_a_simulated_worker() {
    let api = Api::new().await;
    let (s, w) = api.post("/api/workers", json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{w}");
    assert_eq!(w["id"], "i-test-w1");
    assert_eq!(w["kind"], "simulated");
    assert_eq!(w["instance_id"], "i-test");
    assert_eq!(w["state"], "idle");
    assert_eq!(w["alive"], true);

    let (s, list) = api.get("/api/workers").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["id"], "i-test-w1");

    let (s, paused) = api.post("/api/workers/i-test-w1/pause", json!({})).await;
    assert_eq!(s, StatusCode::OK, "{paused}");
    assert!(
        paused["message"].as_str().unwrap().contains("paused"),
        "{paused}"
    );
    wait_for_state(&api, "i-test-w1", "paused").await;

    let (s, killed) = api.post("/api/workers/i-test-w1/kill", json!({})).await;
    assert_eq!(s, StatusCode::OK, "{killed}");
    assert_eq!(killed["worker"]["state"], "crashed");
    assert_eq!(killed["worker"]["alive"], false);

    // Not running any more: both levers answer 409, saying why.
    for action in ["pause", "kill"] {
        let (s, err) = api
            .post(&format!("/api/workers/i-test-w1/{action}"), json!({}))
            .await;
        assert_eq!(s, StatusCode::CONFLICT, "{err}");
        assert!(
            error_of(&err).contains("is not running (state crashed)"),
            "{err}"
        );
    }
    api.fleet.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_worker_of_a_dead_instance_or_a_bad_id_cannot_be_touched() {
    let api = Api::new().await;
    sqlx::query(
        "INSERT INTO workers (id, instance_id, kind, state) VALUES ('other-w1', 'other', 'simulated', 'idle')",
    )
    .execute(&api.db.pool)
    .await
    .unwrap();
    // Another instance's worker is killed through that instance; one that
    // is not running cannot be reached.
    let (s, err) = api.post("/api/workers/other-w1/kill", json!({})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{err}");
    assert!(
        error_of(&err).contains("instance other is not running"),
        "{err}"
    );
    let (s, err) = api.post("/api/workers/nobody/kill", json!({})).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{err}");
    let (s, w) = api.get("/api/workers/other-w1").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(w["state"], "idle", "untouched");

    let (s, _) = api.get("/api/workers/nobody").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let long = "x".repeat(300);
    let (s, err) = api
        .post(&format!("/api/workers/{long}/pause"), json!({}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{err}");
}

#[tokio::test]
async fn worker_processes_report_themselves() {
    let api = Api::new().await;
    let report = json!({
        "state": "working", "task_id": 5, "fencing_token": 3,
        "heartbeat": true, "tasks_done": 2, "tasks_abandoned": 1, "fresh": true
    });
    let (s, w) = api.put("/api/workers/proc-1", report).await;
    assert_eq!(s, StatusCode::OK, "{w}");
    assert_eq!(w["kind"], "http");
    assert_eq!(w["instance_id"], Value::Null);
    assert_eq!(w["state"], "working");
    assert_eq!(w["task_id"], 5);
    assert_eq!(w["tasks_done"], 2);
    assert!(w["heartbeat_age_ms"].as_i64().unwrap() < 1000, "{w}");
    assert_eq!(w["alive"], true);

    let stopped = json!({"state": "stopped", "task_id": null, "fencing_token": null});
    let (s, w) = api.put("/api/workers/proc-1", stopped).await;
    assert_eq!(s, StatusCode::OK, "{w}");
    assert_eq!(w["alive"], false);
    // A stale report after the stop is refused; a new run starts fresh.
    let idle = json!({"state": "idle", "task_id": null, "fencing_token": null});
    let (s, err) = api.put("/api/workers/proc-1", idle.clone()).await;
    assert_eq!(s, StatusCode::CONFLICT, "{err}");
    let mut fresh = idle.clone();
    fresh["fresh"] = json!(true);
    let (s, w) = api.put("/api/workers/proc-1", fresh).await;
    assert_eq!(s, StatusCode::OK, "{w}");
    assert_eq!(w["state"], "idle");

    // A process cannot take over a simulated worker's row.
    let (s, _) = api.post("/api/workers", json!({})).await;
    assert_eq!(s, StatusCode::CREATED);
    let mut hijack = idle;
    hijack["fresh"] = json!(true);
    let (s, err) = api.put("/api/workers/i-test-w1", hijack).await;
    assert_eq!(s, StatusCode::CONFLICT, "{err}");

    let (s, err) = api
        .put("/api/workers/proc-1", json!({"state": "dancing"}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{err}");
    api.fleet.shutdown(Duration::from_secs(5)).await;
}

//! The audit log and the histories over REST (issue 14 item 4): every
//! operator action is in `GET /api/audit`, newest first and paged; a task's
//! and a lease's events page too; and an action whose audit row cannot be
//! written does not happen (the row is in the action's transaction).

use crate::api::{Api, error_of};
use axum::http::StatusCode;
use serde_json::json;

#[tokio::test]
async fn every_operator_action_is_in_the_audit_log_newest_first_page_by_page() {
    let api = Api::new().await;
    let (s, worker) = api.post("/api/workers", json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{worker}");
    let w = worker["id"].as_str().unwrap().to_string();
    let (s, body) = api
        .post(&format!("/api/workers/{w}/pause"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let (s, body) = api.post(&format!("/api/workers/{w}/kill"), json!({})).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let (s, task) = api.post("/api/tasks", json!({"task_data": {}})).await;
    assert_eq!(s, StatusCode::CREATED);
    let t = task["id"].as_i64().unwrap();
    let (s, _) = api.post(&format!("/api/tasks/{t}/cancel"), json!({})).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = api.post("/api/generator/start", json!({})).await;
    assert_eq!(s, StatusCode::OK);

    let (rows, pages) = api.walk("/api/audit?limit=2").await;
    let actions: Vec<&str> = rows
        .iter()
        .map(|r| r["detail"]["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "generator_start",
            "cancel_task",
            "kill_worker",
            "pause_worker",
            "spawn_worker"
        ]
    );
    assert_eq!(pages, 3, "2 + 2 + 1 rows");
    assert!(rows.iter().all(|r| r["kind"] == "operator"), "{rows:?}");
    assert!(
        rows.iter().all(|r| r["holder"] == "i-test"),
        "who did it: {rows:?}"
    );
    let ids: Vec<i64> = rows.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");

    // The task's own history, paged: a task cancelled before any claim has
    // only its audit row.
    let (events, _) = api.walk(&format!("/api/tasks/{t}/events?limit=1")).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["detail"]["action"], "cancel_task");

    // Bad cursors and unknown rows: clear errors.
    for (uri, status, needle) in [
        (
            "/api/audit?before=abc",
            StatusCode::BAD_REQUEST,
            "invalid query string",
        ),
        (
            "/api/audit?page=2",
            StatusCode::BAD_REQUEST,
            "unknown field",
        ),
        (
            "/api/tasks/999999/events",
            StatusCode::NOT_FOUND,
            "no task with id 999999",
        ),
        (
            "/api/leases/999999/events",
            StatusCode::NOT_FOUND,
            "no lease with id 999999",
        ),
        ("/api/tasks/x/events", StatusCode::BAD_REQUEST, "id"),
    ] {
        let (s, body, _) = api.page(uri).await;
        assert_eq!(s, status, "{uri}: {body}");
        assert!(error_of(&body).contains(needle), "{uri}: {body}");
    }
    // A cursor below every row: an empty last page.
    let (s, body, next) = api.page("/api/audit?before=1").await;
    assert_eq!((s, body, next), (StatusCode::OK, json!([]), None));
}

#[tokio::test]
async fn a_lease_history_pages_through_every_renewal() {
    let api = Api::new().await;
    let (s, lease) = api
        .post(
            "/api/leases",
            json!({"resource": "audit:paged", "holder": "h", "ttl_seconds": 60}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{lease}");
    for _ in 0..6 {
        let (s, body) = api
            .put(
                "/api/leases/renew",
                json!({"resource": "audit:paged", "holder": "h"}),
            )
            .await;
        assert!(s.is_success(), "{body}");
    }
    let id = lease["id"].as_i64().unwrap();
    let (rows, pages) = api.walk(&format!("/api/leases/{id}/events?limit=3")).await;
    let kinds: Vec<&str> = rows.iter().map(|r| r["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, [["renewed"; 6].as_slice(), &["acquired"]].concat());
    assert_eq!(pages, 3);
}

/// An operator row that cannot be written: every action fails whole. A
/// trigger refuses operator rows, as a full disk or a lost connection at
/// that statement would.
#[tokio::test]
async fn an_action_whose_audit_row_fails_does_not_happen() {
    let api = Api::new().await;
    let (s, task) = api.post("/api/tasks", json!({"task_data": {}})).await;
    assert_eq!(s, StatusCode::CREATED);
    let t = task["id"].as_i64().unwrap();
    let (s, lease) = api
        .post(
            "/api/leases",
            json!({"resource": "audit:held", "holder": "h", "ttl_seconds": 60}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    for sql in [
        "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS
         $$ BEGIN RAISE EXCEPTION 'the audit log is down'; END $$",
        "CREATE TRIGGER refuse_audit BEFORE INSERT ON lease_events
         FOR EACH ROW WHEN (NEW.kind = 'operator') EXECUTE FUNCTION refuse_audit()",
    ] {
        sqlx::query(sql).execute(&api.db.pool).await.unwrap();
    }

    let (s, body) = api.post("/api/workers", json!({})).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "spawn: {body}");
    let workers: i64 = sqlx::query_scalar("SELECT count(*) FROM workers")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(workers, 0, "no worker recorded");
    assert!(api.fleet.running().is_empty(), "no worker running");

    let (s, body) = api.post(&format!("/api/tasks/{t}/cancel"), json!({})).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "cancel: {body}");
    let (s, body) = api
        .post("/api/tasks/cancel", json!({"status": "pending"}))
        .await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "bulk cancel: {body}");
    let (_, task) = api.get(&format!("/api/tasks/{t}")).await;
    assert_eq!(task["status"], "pending");

    let (s, body) = api.post("/api/generator/start", json!({})).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "generator: {body}");
    let desired: String = sqlx::query_scalar("SELECT desired FROM generator_state")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(desired, "stopped");

    let (s, body) = api
        .post(
            &format!("/api/leases/{}/force-release", lease["id"]),
            json!({"fencing_token": lease["fencing_token"]}),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::INTERNAL_SERVER_ERROR,
        "force-release: {body}"
    );
    let (_, now) = api.get(&format!("/api/leases/{}", lease["id"])).await;
    assert_eq!(now["state"], "active", "{now}");

    // With the audit log back, the same actions work and are logged.
    sqlx::query("DROP TRIGGER refuse_audit ON lease_events")
        .execute(&api.db.pool)
        .await
        .unwrap();
    let (s, worker) = api.post("/api/workers", json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{worker}");
    let w = worker["id"].as_str().unwrap();
    sqlx::query(
        "CREATE TRIGGER refuse_audit BEFORE INSERT ON lease_events
         FOR EACH ROW WHEN (NEW.kind = 'operator') EXECUTE FUNCTION refuse_audit()",
    )
    .execute(&api.db.pool)
    .await
    .unwrap();
    // A pause changes no row: its audit row commits only with it, so a
    // failed audit leaves the worker running, unpaused.
    let (s, body) = api
        .post(&format!("/api/workers/{w}/pause"), json!({}))
        .await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "pause: {body}");
    let (s, body) = api.post(&format!("/api/workers/{w}/kill"), json!({})).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "kill: {body}");
    assert!(
        api.fleet.running().iter().any(|r| r == w),
        "a kill that cannot be audited does not happen"
    );
    let state: String = sqlx::query_scalar("SELECT state FROM workers WHERE id = $1")
        .bind(w)
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_ne!(state, "crashed");
}

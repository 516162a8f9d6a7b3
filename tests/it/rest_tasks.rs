//! The task REST contract (docs/rest-api.md), in-process: enqueue, claim (202/200),
//! heartbeat (202/409), complete (202/409), fail, lists and bad input.

use crate::api::{Api, error_of};
use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

async fn enqueue(api: &Api, data: Value) -> Value {
    let (s, task) = api.post("/api/tasks", json!({ "task_data": data })).await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    task
}

#[tokio::test]
async fn a_task_goes_through_claim_heartbeat_complete() {
    let api = Api::new().await;
    let task = enqueue(&api, json!({"sleep_duration_seconds": 5})).await;
    assert_eq!(task["status"], "pending");
    assert_eq!(task["max_attempts"], 5);

    let (s, claimed) = api
        .post("/api/tasks/next", json!({"processor": "w1"}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{claimed}");
    assert_eq!(claimed["id"], task["id"]);
    assert_eq!(claimed["status"], "started");
    assert_eq!(claimed["processor"], "w1");
    let token = claimed["fencing_token"].as_i64().unwrap();
    assert!(claimed["must_heartbeat_before"].is_string());

    let (s, none) = api
        .post("/api/tasks/next", json!({"processor": "w2"}))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(none["message"], "no task available");

    let id = task["id"].as_i64().unwrap();
    let body = json!({"processor": "w1", "fencing_token": token});
    let (s, beat) = api
        .put(&format!("/api/tasks/{id}/heartbeat"), body.clone())
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{beat}");
    // Compared as instants: RFC 3339 strings with different numbers of
    // fractional digits do not sort as the times they name (".1Z" > ".12Z").
    let deadline = |v: &Value| {
        chrono::DateTime::parse_from_rfc3339(v["must_heartbeat_before"].as_str().unwrap()).unwrap()
    };
    assert!(deadline(&beat) >= deadline(&claimed), "{beat} {claimed}");

    let wrong = json!({"processor": "w1", "fencing_token": token + 1, "task_output": 1});
    let (s, err) = api.put(&format!("/api/tasks/{id}/complete"), wrong).await;
    assert_eq!(s, StatusCode::CONFLICT, "{err}");
    assert!(error_of(&err).contains("not current"), "{err}");

    let done = json!({"processor": "w1", "fencing_token": token, "task_output": {"slept": 5}});
    let (s, finished) = api
        .put(&format!("/api/tasks/{id}/complete"), done.clone())
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{finished}");
    assert_eq!(finished["status"], "processed");
    assert_eq!(finished["task_output"], json!({"slept": 5}));
    let (s, err) = api.put(&format!("/api/tasks/{id}/complete"), done).await;
    assert_eq!(s, StatusCode::CONFLICT, "completing twice: {err}");
    let (s, err) = api.put(&format!("/api/tasks/{id}/heartbeat"), body).await;
    assert_eq!(s, StatusCode::CONFLICT, "heartbeat after completion: {err}");

    let (s, got) = api.get(&format!("/api/tasks/{id}")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(got["status"], "processed");
}

#[tokio::test]
async fn fail_retries_then_lists_filter_by_status() {
    let api = Api::new().await;
    let t1 = enqueue(&api, json!({"n": 1})).await;
    let (_, claimed) = api.post("/api/tasks/next", json!({"processor": "w"})).await;
    let id = t1["id"].as_i64().unwrap();
    let body =
        json!({"processor": "w", "fencing_token": claimed["fencing_token"], "error": "boom"});
    let (s, failed) = api.put(&format!("/api/tasks/{id}/fail"), body).await;
    assert_eq!(s, StatusCode::OK, "{failed}");
    assert_eq!(failed["status"], "pending");
    assert_eq!(failed["last_error"], "boom");
    let t2 = enqueue(&api, json!({"n": 2})).await;
    let (_, started) = api.post("/api/tasks/next", json!({"processor": "w"})).await;
    assert_eq!(
        started["id"], t2["id"],
        "the failed task waits out its backoff"
    );

    let ids = |v: Value| -> Vec<i64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_i64().unwrap())
            .collect()
    };
    let (a, b) = (t1["id"].as_i64().unwrap(), t2["id"].as_i64().unwrap());
    for (path, expected) in [
        // Newest first.
        ("/api/tasks", vec![b, a]),
        ("/api/tasks/pending", vec![a]),
        ("/api/tasks/started", vec![b]),
        ("/api/tasks/processed", vec![]),
        ("/api/tasks/failed", vec![]),
        ("/api/tasks?status=started", vec![b]),
        ("/api/tasks?limit=1", vec![b]),
        (&format!("/api/tasks?before={b}"), vec![a]),
        // Oldest first, for a client following new tasks.
        ("/api/tasks?after=0", vec![a, b]),
        (&format!("/api/tasks?after={a}"), vec![b]),
    ] {
        let (s, v) = api.get(path).await;
        assert_eq!(s, StatusCode::OK, "{path}");
        assert_eq!(ids(v), expected, "{path}");
    }
    let (s, err) = api.get("/api/tasks?status=bogus").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{err}");
}

#[tokio::test]
async fn bad_task_input_gets_400_and_changes_nothing() {
    let api = Api::new().await;
    let cases: Vec<(Method, &str, &str, &str)> = vec![
        (Method::POST, "/api/tasks", "{", "invalid JSON"),
        (
            Method::POST,
            "/api/tasks",
            "{}",
            "missing field `task_data`",
        ),
        (
            Method::POST,
            "/api/tasks",
            r#"{"task_data": null}"#,
            "must not be null",
        ),
        (
            Method::POST,
            "/api/tasks",
            r#"{"task_data": {"x": "a\u0000b"}}"#,
            "NUL",
        ),
        (
            Method::POST,
            "/api/tasks",
            r#"{"task_data": {}, "max_attempts": 0}"#,
            "max_attempts",
        ),
        (
            Method::POST,
            "/api/tasks",
            r#"{"task_data": {}, "delay_seconds": -1}"#,
            "delay_seconds",
        ),
        (
            Method::POST,
            "/api/tasks/next",
            "{}",
            "missing field `processor`",
        ),
        (
            Method::POST,
            "/api/tasks/next",
            r#"{"processor": ""}"#,
            "holder must not be empty",
        ),
        (
            Method::PUT,
            "/api/tasks/abc/heartbeat",
            r#"{"processor": "w", "fencing_token": 1}"#,
            "positive integer",
        ),
        (
            Method::PUT,
            "/api/tasks/1/heartbeat",
            r#"{"processor": "w"}"#,
            "missing field `fencing_token`",
        ),
        (
            Method::PUT,
            "/api/tasks/1/complete",
            r#"{"processor": "w", "fencing_token": "x"}"#,
            "invalid type",
        ),
        (
            Method::PUT,
            "/api/tasks/1/fail",
            r#"{"processor": "w", "fencing_token": 1, "error": "a\u0000"}"#,
            "NUL",
        ),
        (Method::GET, "/api/tasks/0", "", "positive integer"),
    ];
    for (method, uri, body, expected) in cases {
        let (s, err) = api
            .raw(method.clone(), uri, Body::from(body.to_string()))
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{method} {uri} {body}: {err}");
        assert!(
            error_of(&err).contains(expected),
            "{method} {uri}: {err} lacks {expected:?}"
        );
    }
    let (s, _) = api.get("/api/tasks/12345").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = api
        .put(
            "/api/tasks/12345/complete",
            json!({"processor": "w", "fencing_token": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(count, 0);
}

#[tokio::test]
async fn kind_queue_and_priority_over_rest() {
    let api = Api::new().await;
    // The original contract: no kind, no queue: simulated work, default queue.
    let plain = enqueue(&api, json!({"n": 0})).await;
    assert_eq!(plain["kind"], "sleep");
    assert_eq!(plain["queue"], "default");
    assert_eq!(plain["priority"], 0);
    let (s, mail) = api
        .post(
            "/api/tasks",
            json!({"task_data": {"to": "ada"}, "kind": "email", "queue": "mail", "priority": 3}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{mail}");
    assert_eq!(
        (&mail["kind"], &mail["queue"], &mail["priority"]),
        (&json!("email"), &json!("mail"), &json!(3))
    );
    let (_, urgent) = api
        .post(
            "/api/tasks",
            json!({"task_data": {"to": "bob"}, "kind": "email", "queue": "mail", "priority": -1}),
        )
        .await;

    // A claim without a queue takes from `default` only.
    let (s, got) = api
        .post("/api/tasks/next", json!({"processor": "w1"}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    assert_eq!(got["id"], plain["id"]);
    let (s, _) = api
        .post("/api/tasks/next", json!({"processor": "w1"}))
        .await;
    assert_eq!(s, StatusCode::OK, "nothing else in default");
    // Kinds filter: nothing of kind sms in mail.
    let (s, _) = api
        .post(
            "/api/tasks/next",
            json!({"processor": "w2", "queue": "mail", "kinds": ["sms"]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    // Priority first within the queue.
    let (s, first) = api
        .post(
            "/api/tasks/next",
            json!({"processor": "w2", "queue": "mail", "kinds": ["email"]}),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    assert_eq!(first["id"], urgent["id"]);
    assert_eq!(first["attempts"], 1);
}

#[tokio::test]
async fn bad_kind_queue_priority_and_kinds_are_refused() {
    let api = Api::new().await;
    let long = "k".repeat(129);
    for body in [
        json!({"task_data": {}, "kind": ""}),
        json!({"task_data": {}, "kind": long}),
        json!({"task_data": {}, "queue": ""}),
        json!({"task_data": {}, "queue": "a\u{0}b"}),
        json!({"task_data": {}, "priority": 40000}),
        json!({"task_data": {}, "priority": "high"}),
        json!({"task_data": {}, "kind": 7}),
    ] {
        let (s, err) = api.post("/api/tasks", body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {err}");
    }
    for body in [
        json!({"processor": "w", "kinds": []}),
        json!({"processor": "w", "kinds": [""]}),
        json!({"processor": "w", "queue": ""}),
        json!({"processor": "w", "kinds": "email"}),
    ] {
        let (s, err) = api.post("/api/tasks/next", body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {err}");
    }
    let (_, tasks) = api.get("/api/tasks").await;
    assert_eq!(
        tasks.as_array().map(Vec::len),
        Some(0),
        "nothing stored: {tasks}"
    );
}

/// Found by Schemathesis: a number at `f64`'s edge was stored (jsonb keeps
/// its digits) and then could not be read back, so the answer was a 500
/// and the task unreadable. Now it is refused before anything is written.
#[tokio::test]
async fn task_data_that_would_not_read_back_is_refused_and_stores_nothing() {
    let api = Api::new().await;
    let body = r#"{"task_data": {"x": [-1.7976931348623157e308]}}"#;
    let (s, err) = api
        .send_with(
            axum::http::Method::POST,
            "/api/tasks",
            &[],
            axum::body::Body::from(body),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{err}");
    assert!(error_of(&err).contains("task_data"), "{err}");
    let (s, all) = api.get("/api/tasks").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(all, serde_json::json!([]));
}

#[tokio::test]
async fn a_claimed_task_snoozes_back_to_pending_without_using_an_attempt() {
    let api = Api::new().await;
    let (s, task) = api
        .post(
            "/api/tasks",
            json!({"task_data": {}, "kind": "poll", "timeout_seconds": 2.5}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    assert_eq!(task["timeout_ms"], 2500);
    let (s, claimed) = api
        .post("/api/tasks/next", json!({"processor": "w1"}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let id = claimed["id"].as_i64().unwrap();
    let token = claimed["fencing_token"].as_i64().unwrap();
    let uri = format!("/api/tasks/{id}/snooze");
    for bad in [json!(-1), json!(31_622_401), json!("soon")] {
        let (s, e) = api
            .put(
                &uri,
                json!({"processor": "w1", "fencing_token": token, "seconds": bad}),
            )
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {e}");
    }
    let (s, e) = api
        .put(
            &uri,
            json!({"processor": "w1", "fencing_token": token + 1, "seconds": 60}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{e}");
    let (s, snoozed) = api
        .put(
            &uri,
            json!({"processor": "w1", "fencing_token": token, "seconds": 60}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{snoozed}");
    assert_eq!(snoozed["status"], "pending");
    assert_eq!(snoozed["attempts"], 0);
    // Not due for a minute: nothing to claim.
    let (s, _) = api
        .post("/api/tasks/next", json!({"processor": "w2"}))
        .await;
    assert_eq!(s, StatusCode::OK);
    let (_, events) = api.get(&format!("/api/tasks/{id}/events")).await;
    assert_eq!(events[0]["kind"], "snoozed", "{events}");
    let (s, e) = api
        .post("/api/tasks", json!({"task_data": {}, "timeout_seconds": 0}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
}

/// `GET /api/tasks/{id}/attempts`: every attempt, oldest first, in the
/// documented shape; a worker's fail names how its attempt ended; 404 for
/// no such task, 400 for a bad id.
#[tokio::test]
async fn a_tasks_attempts_are_listed_oldest_first_with_their_holders_and_tokens() {
    let api = Api::new().await;
    let task = enqueue(&api, json!({})).await;
    let id = task["id"].as_i64().unwrap();
    let uri = format!("/api/tasks/{id}/attempts");
    let (s, none) = api.get(&uri).await;
    assert_eq!((s, none), (StatusCode::OK, json!([])));

    let (_, first) = api
        .post("/api/tasks/next", json!({"processor": "w1"}))
        .await;
    let token1 = first["fencing_token"].as_i64().unwrap();
    // Not a failure's kind: refused, nothing changed.
    for (outcome, expected) in [("completed", "timed_out"), ("finished", "unknown variant")] {
        let body =
            json!({"processor": "w1", "fencing_token": token1, "error": "x", "outcome": outcome});
        let (s, err) = api.put(&format!("/api/tasks/{id}/fail"), body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{outcome}: {err}");
        assert!(error_of(&err).contains(expected), "{err}");
    }
    let body = json!({"processor": "w1", "fencing_token": token1, "error": "timed out after 2s", "outcome": "timed_out"});
    let (s, failed) = api.put(&format!("/api/tasks/{id}/fail"), body).await;
    assert_eq!(s, StatusCode::OK, "{failed}");
    // The retry is due after the backoff (1 s).
    let mut second = json!(null);
    for _ in 0..60 {
        let (s, claimed) = api
            .post("/api/tasks/next", json!({"processor": "w2"}))
            .await;
        if s == StatusCode::ACCEPTED {
            second = claimed;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let token2 = second["fencing_token"].as_i64().expect("claimed again");

    let (s, all) = api.get(&uri).await;
    assert_eq!(s, StatusCode::OK, "{all}");
    let all = all.as_array().unwrap().clone();
    assert_eq!(all.len(), 2, "{all:?}");
    let keys: Vec<&str> = all[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut keys = keys;
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "claimed_at",
            "ended_at",
            "error",
            "fencing_token",
            "number",
            "outcome",
            "processor"
        ]
    );
    assert_eq!(
        (
            &all[0]["number"],
            &all[0]["processor"],
            &all[0]["outcome"],
            &all[0]["error"]
        ),
        (
            &json!(1),
            &json!("w1"),
            &json!("timed_out"),
            &json!("timed out after 2s")
        )
    );
    assert_eq!(all[0]["fencing_token"], token1);
    assert!(all[0]["ended_at"].is_string());
    assert_eq!(
        (
            &all[1]["number"],
            &all[1]["processor"],
            &all[1]["outcome"],
            &all[1]["ended_at"]
        ),
        (&json!(2), &json!("w2"), &json!("running"), &Value::Null)
    );
    assert_eq!(all[1]["fencing_token"], token2);
    assert!(token1 < token2);

    let (s, err) = api.get("/api/tasks/12345/attempts").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{err}");
    for bad in ["abc", "0", "-3"] {
        let (s, err) = api.get(&format!("/api/tasks/{bad}/attempts")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {err}");
        assert!(error_of(&err).contains("positive integer"), "{err}");
    }
}

//! The schedules REST contract, in-process: declare (201/200), bad input
//! naming its field with nothing stored, read, ticks paged, pause, resume,
//! trigger, delete (204 then 404); unique keys and the batch enqueue of
//! `POST /api/tasks`.

use crate::api::{Api, error_of};
use axum::body::Body;
use axum::http::{Method, StatusCode};
use leasekeeper_core::schedule::runtime::{Scheduler, SchedulerConfig};
use serde_json::{Value, json};
use std::time::Duration;

#[tokio::test]
async fn a_schedule_is_declared_read_paused_resumed_triggered_and_deleted() {
    let api = Api::new().await;
    let body = json!({"cron": "*/5 * * * * *", "kind": "report", "data": {"to": "ops"}, "catch_up": "all"});
    let (s, created) = api.put("/api/schedules/nightly", body.clone()).await;
    assert_eq!(s, StatusCode::CREATED, "{created}");
    assert_eq!(created["name"], "nightly");
    assert_eq!(created["catch_up"], "all");
    assert_eq!(created["paused"], false);
    assert_eq!(created["queue"], "default");
    assert_eq!(created["cron_text"], "At every 5 seconds (UTC)");
    assert!(created["next_tick_at"].is_string());
    assert_eq!(created["last_tick_at"], Value::Null);
    let (s, same) = api.put("/api/schedules/nightly", body).await;
    assert_eq!(s, StatusCode::OK, "{same}");
    let (s, replaced) = api
        .put(
            "/api/schedules/nightly",
            json!({"cron": "0 2 * * *", "time_zone": "Europe/Berlin"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(replaced["cron_text"], "At 02:00 (Europe/Berlin)");
    assert_eq!(replaced["kind"], "sleep");

    // Bad input: 400 naming the field; nothing stored or changed.
    for (bad, field) in [
        (json!({"cron": "61 * * * *"}), "cron"),
        (json!({"cron": "* * * *"}), "cron"),
        (
            json!({"cron": "0 2 * * *", "time_zone": "Mars/Olympus"}),
            "time_zone",
        ),
        (
            json!({"cron": "0 2 * * *", "catch_up": "sometimes"}),
            "catch_up",
        ),
        (
            json!({"cron": "0 2 * * *", "max_attempts": 0}),
            "max_attempts",
        ),
    ] {
        for name in ["nightly", "fresh"] {
            let (s, e) = api
                .put(&format!("/api/schedules/{name}"), bad.clone())
                .await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {e}");
            assert!(error_of(&e).starts_with(field), "{bad}: {e}");
        }
    }
    let (s, e) = api
        .put("/api/schedules/bad%20name", json!({"cron": "0 2 * * *"}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    let (_, all) = api.get("/api/schedules").await;
    assert_eq!(all.as_array().unwrap().len(), 1, "{all}");
    assert_eq!(
        all[0]["cron"], "0 2 * * *",
        "the bad replacements changed nothing"
    );

    let (s, one) = api.get("/api/schedules/nightly").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(one["leader"], Value::Null, "no scheduler runs in this test");
    let (s, _) = api.get("/api/schedules/nope").await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    let (s, paused) = api.post("/api/schedules/nightly/pause", json!({})).await;
    assert_eq!((s, &paused["paused"]), (StatusCode::OK, &json!(true)));
    assert_eq!(paused["next_tick_at"], Value::Null);
    let (s, resumed) = api.post("/api/schedules/nightly/resume", json!({})).await;
    assert_eq!((s, &resumed["paused"]), (StatusCode::OK, &json!(false)));

    let (s, task) = api.post("/api/schedules/nightly/trigger", json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    assert_eq!(task["schedule"], "nightly");
    assert_eq!(task["tick_at"], Value::Null);
    assert_eq!(task["status"], "pending");
    let (s, _) = api.post("/api/schedules/nope/trigger", json!({})).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    let (_, audit) = api.get("/api/audit").await;
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["resource"] == "schedule:nightly")
        .map(|e| e["detail"]["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "schedule_trigger",
            "schedule_resume",
            "schedule_pause",
            "schedule_replace",
            "schedule_create"
        ]
    );

    let (s, body) = api
        .send_bytes(Method::DELETE, "/api/schedules/nightly", &[], Body::empty())
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert!(body.is_empty());
    let (s, _) = api.get("/api/schedules/nightly").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = api.delete("/api/schedules/nightly", Value::Null).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_are_listed_newest_first_with_holder_and_token_and_paged() {
    let api = Api::new().await;
    let (s, _) = api
        .put(
            "/api/schedules/beat",
            json!({"cron": "* * * * * *", "catch_up": "all"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let holder = leasekeeper_core::lease::Holder::parse("rep-a").unwrap();
    let scheduler = Scheduler::spawn(
        api.db.pool.clone(),
        holder,
        SchedulerConfig::from_ttl(Duration::from_secs(3)),
    );
    let mut ticks = Value::Null;
    for _ in 0..100 {
        ticks = api.get("/api/schedules/beat/ticks").await.1;
        if ticks.as_array().is_some_and(|t| t.len() >= 3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, one) = api.get("/api/schedules/beat").await;
    assert_eq!(one["leader"]["holder"], "rep-a", "{one}");
    scheduler.shutdown().await;
    let list = ticks.as_array().unwrap();
    assert!(list.len() >= 3, "{ticks}");
    assert!(
        list.windows(2)
            .all(|w| w[0]["tick_at"].as_str() > w[1]["tick_at"].as_str()),
        "newest first"
    );
    for t in list {
        assert_eq!(t["holder"], "rep-a");
        assert_eq!(t["fencing_token"], one["leader"]["fencing_token"]);
        let (_, task) = api.get(&format!("/api/tasks/{}", t["task_id"])).await;
        assert_eq!(task["schedule"], "beat");
        assert_eq!(task["tick_at"], t["tick_at"]);
    }
    let (s, page, next) = api.page("/api/schedules/beat/ticks?limit=2").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(page.as_array().unwrap().len(), 2);
    assert!(next.is_some(), "a Link to the next page");
    let (all, _) = api.walk("/api/schedules/beat/ticks?limit=1").await;
    assert_eq!(
        all.len(),
        api.get("/api/schedules/beat/ticks")
            .await
            .1
            .as_array()
            .unwrap()
            .len()
    );
    let (s, _) = api.get("/api/schedules/nope/ticks").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_unique_key_answers_201_then_200_with_the_same_task() {
    let api = Api::new().await;
    let body = json!({"task_data": {"customer": 7}, "kind": "sync", "unique_key": "customer-7"});
    let (s, first) = api.post("/api/tasks", body.clone()).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    assert_eq!(first["unique_key"], "customer-7");
    assert_eq!(first["unique_scope"], "active");
    let (s, again) = api.post("/api/tasks", body).await;
    assert_eq!(s, StatusCode::OK, "{again}");
    assert_eq!(again["id"], first["id"]);
    for (bad, says) in [
        (json!({"task_data": {}, "unique_key": ""}), "unique_key"),
        (
            json!({"task_data": {}, "unique_key": "k", "unique_scope": "sometimes"}),
            "unique_scope",
        ),
        (
            json!({"task_data": {}, "unique_key": "k", "unique_period_seconds": 0}),
            "unique_period_seconds",
        ),
    ] {
        let (s, e) = api.post("/api/tasks", bad.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {e}");
        assert!(error_of(&e).contains(says), "{bad}: {e}");
    }
    let (s, period) = api
        .post(
            "/api/tasks",
            json!({"task_data": {}, "unique_key": "p", "unique_period_seconds": 3600}),
        )
        .await;
    assert_eq!(
        (s, &period["unique_scope"]),
        (StatusCode::CREATED, &json!("active"))
    );
    // Without a key, scope and period ask for nothing.
    let (s, plain) = api
        .post(
            "/api/tasks",
            json!({"task_data": {}, "unique_scope": "always"}),
        )
        .await;
    assert_eq!(
        (s, &plain["unique_key"]),
        (StatusCode::CREATED, &Value::Null)
    );
}

#[tokio::test]
async fn a_batch_answers_its_tasks_in_order_or_names_the_bad_one_and_adds_nothing() {
    let api = Api::new().await;
    let bodies: Vec<Value> = (0..50)
        .map(|i| json!({"task_data": {"i": i}, "kind": "bulk", "priority": i % 3}))
        .collect();
    let (s, tasks) = api
        .post("/api/tasks/batch", Value::Array(bodies.clone()))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{tasks}");
    let tasks = tasks.as_array().unwrap();
    assert_eq!(tasks.len(), 50);
    for (i, t) in tasks.iter().enumerate() {
        assert_eq!(t["task_data"]["i"], i, "in order");
        assert_eq!(t["status"], "pending");
    }
    let count = |api: &Api| {
        let pool = api.db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM tasks")
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let before = count(&api).await;
    let mut bad = bodies.clone();
    bad[7] = json!({"task_data": null});
    let (s, e) = api.post("/api/tasks/batch", Value::Array(bad)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&e).starts_with("tasks[7]: "), "{e}");
    let mut bad = bodies;
    bad[3] = json!({"task_data": {}, "max_attempts": "many"});
    let (s, e) = api.post("/api/tasks/batch", Value::Array(bad)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(error_of(&e).starts_with("tasks[3]: "), "{e}");
    for not_array in [json!({"task_data": {}}), json!("x")] {
        let (s, _) = api.post("/api/tasks/batch", not_array).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
    }
    assert_eq!(count(&api).await, before, "nothing added");
    // Unique keys in a batch: the repeat answers the first.
    let (s, tasks) = api
        .post(
            "/api/tasks/batch",
            json!([
                {"task_data": {}, "kind": "sync", "unique_key": "c-1"},
                {"task_data": {}, "kind": "sync", "unique_key": "c-1"},
            ]),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(tasks[0]["id"], tasks[1]["id"]);
    // 10,000 at once: one statement, under the body limit.
    let many: Vec<Value> = (0..10_000)
        .map(|i| json!({"task_data": {"i": i}, "kind": "bulk"}))
        .collect();
    let (s, tasks) = api.post("/api/tasks/batch", Value::Array(many)).await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(tasks.as_array().unwrap().len(), 10_000);
    let too_many: Vec<Value> = (0..10_001).map(|_| json!({"task_data": {}})).collect();
    let (s, e) = api.post("/api/tasks/batch", Value::Array(too_many)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    assert_eq!(error_of(&e), "at most 10000 tasks at once, got 10001");
}

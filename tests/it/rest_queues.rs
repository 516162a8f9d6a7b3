//! The queues REST contract, in-process: the list and one queue with their
//! figures, 404 for a name never used, 400 for a name that cannot be one,
//! pause and resume audited (and refused without the admin token when one
//! is set), the claims a pause stops, and the per-queue gauges of
//! `/metrics`.

use crate::api::{Api, error_of};
use axum::body::Body;
use axum::http::{Method, StatusCode};
use http_body_util::BodyExt;
use leasekeeper_core::queue::{NewTask, store};
use serde_json::{Value, json};

async fn enqueue(api: &Api, queue: &str, n: usize) {
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| NewTask::new("sleep", json!({ "i": i })).queue(queue))
        .collect();
    store::enqueue_many(
        &mut api.db.pool.acquire().await.unwrap(),
        &Default::default(),
        &tasks,
    )
    .await
    .unwrap();
}

async fn operator_actions(api: &Api) -> Vec<(String, String, String)> {
    sqlx::query_as(
        "SELECT resource, holder, detail->>'action' FROM lease_events WHERE kind = 'operator' ORDER BY id",
    )
    .fetch_all(&api.db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn queues_are_listed_read_paused_and_resumed_with_an_audit_row_each() {
    let api = Api::new().await;
    let (s, none) = api.get("/api/queues").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(none, json!([]));
    enqueue(&api, "mail", 3).await;
    enqueue(&api, "default", 1).await;

    let (s, all) = api.get("/api/queues").await;
    assert_eq!(s, StatusCode::OK);
    let names: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default", "mail"]);
    let (s, mail) = api.get("/api/queues/mail").await;
    assert_eq!(s, StatusCode::OK, "{mail}");
    for field in [
        "name",
        "paused",
        "pending",
        "started",
        "failed",
        "oldest_pending_age_ms",
        "completed_last_minute",
        "workers",
    ] {
        assert!(mail.get(field).is_some(), "{field} in {mail}");
    }
    assert_eq!(mail["pending"], 3);
    assert_eq!(mail["paused"], false);
    // The list's row is the same queue (its age read a moment earlier).
    let mut listed = all[1].clone();
    listed["oldest_pending_age_ms"] = mail["oldest_pending_age_ms"].clone();
    assert_eq!(mail, listed);

    let (s, e) = api.get("/api/queues/never-used").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{e}");
    assert!(error_of(&e).contains("never-used"), "{e}");
    let long = "q".repeat(129);
    for bad in ["bad%0Aname", long.as_str()] {
        for (method, uri) in [
            (Method::GET, format!("/api/queues/{bad}")),
            (Method::POST, format!("/api/queues/{bad}/pause")),
            (Method::POST, format!("/api/queues/{bad}/resume")),
        ] {
            let (s, e) = api.raw(method, &uri, Body::empty()).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{uri}: {e}");
        }
    }
    // A name with a space or a slash is a queue name like any other.
    let (s, e) = api.post("/api/queues/odd%20one%2Fx/pause", json!({})).await;
    assert_eq!(s, StatusCode::OK, "{e}");
    assert_eq!(e["name"], "odd one/x");

    let (s, paused) = api.post("/api/queues/mail/pause", json!({})).await;
    assert_eq!(s, StatusCode::OK, "{paused}");
    assert_eq!(paused["paused"], true);
    assert!(paused["paused_at"].is_string());
    // Again: unchanged, no second audit row.
    let (s, _) = api.post("/api/queues/mail/pause", json!({})).await;
    assert_eq!(s, StatusCode::OK);
    // A paused queue's tasks are not claimed through the REST claim either.
    let claim = json!({"processor": "w-rest", "queue": "mail"});
    let (s, none) = api.post("/api/tasks/next", claim.clone()).await;
    assert_eq!(s, StatusCode::OK, "{none}");
    assert_eq!(none["message"], "no task available");
    let (s, resumed) = api.post("/api/queues/mail/resume", json!({})).await;
    assert_eq!(s, StatusCode::OK, "{resumed}");
    assert_eq!(resumed["paused"], false);
    assert_eq!(resumed["paused_at"], Value::Null);
    let (s, task) = api.post("/api/tasks/next", claim).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{task}");
    assert_eq!(task["queue"], "mail");
    let (_, mail) = api.get("/api/queues/mail").await;
    assert_eq!(
        (&mail["pending"], &mail["started"], &mail["workers"]),
        (&json!(2), &json!(1), &json!(1))
    );
    let (s, e) = api.post("/api/queues/never-used/resume", json!({})).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{e}");

    assert_eq!(
        operator_actions(&api).await,
        [
            (
                "queue:odd one/x".into(),
                "i-test".into(),
                "queue_pause".into()
            ),
            ("queue:mail".into(), "i-test".into(), "queue_pause".into()),
            ("queue:mail".into(), "i-test".into(), "queue_resume".into()),
        ]
    );
    // And the audit route shows them.
    let (s, audit) = api.get("/api/audit").await;
    assert_eq!(s, StatusCode::OK);
    assert!(audit.to_string().contains("queue_resume"), "{audit}");
}

#[tokio::test]
async fn without_the_admin_token_pause_and_resume_are_refused_and_reads_are_not() {
    const TOKEN: &str = "an-admin-token-for-queue-tests";
    let api = Api::with_settings(|s| s.admin_token = Some(TOKEN.into())).await;
    enqueue(&api, "mail", 1).await;
    for uri in ["/api/queues/mail/pause", "/api/queues/mail/resume"] {
        let (s, e) = api.raw(Method::POST, uri, Body::empty()).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri}: {e}");
        assert!(error_of(&e).contains("admin token"), "{e}");
        let (s, _) = api
            .send_with(
                Method::POST,
                uri,
                &[("authorization", "Bearer wrong-token-wrong-token")],
                Body::empty(),
            )
            .await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri} with a wrong token");
    }
    let (s, mail) = api.get("/api/queues/mail").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(mail["paused"], false, "nothing changed");
    assert!(operator_actions(&api).await.is_empty());
    // The page's button (a server function) is refused too.
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let path = <leasekeeper::app::ControlQueue as leptos::server_fn::ServerFn>::PATH;
    let (s, e) = api
        .send_with(
            Method::POST,
            path,
            &form,
            Body::from("name=mail&action=pause"),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{e}");
    // With it: done.
    let bearer = format!("Bearer {TOKEN}");
    let (s, paused) = api
        .send_with(
            Method::POST,
            "/api/queues/mail/pause",
            &[("authorization", bearer.as_str())],
            Body::empty(),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{paused}");
    assert_eq!(paused["paused"], true);
}

#[tokio::test]
async fn metrics_show_each_queues_depth_and_oldest_pending_task() {
    let api = Api::new().await;
    // A name no other test uses: the recorder is the process's.
    let queue = "metrics-queue-depth-test";
    enqueue(&api, queue, 3).await;
    let res = api.open("/metrics").await;
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(body.to_vec()).unwrap();
    let sample = |series: String| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str())?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    };
    assert_eq!(
        sample(format!(
            "leasekeeper_queue_depth{{queue=\"{queue}\",status=\"pending\"}}"
        )),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        sample(format!(
            "leasekeeper_queue_depth{{queue=\"{queue}\",status=\"started\"}}"
        )),
        Some(0.0)
    );
    let oldest = sample(format!(
        "leasekeeper_queue_oldest_pending_seconds{{queue=\"{queue}\"}}"
    ))
    .expect("the oldest pending gauge");
    assert!((0.0..60.0).contains(&oldest), "{oldest}");
}

#[tokio::test]
async fn limits_are_set_checked_by_field_shown_audited_and_enforced_on_the_rest_claim() {
    let api = Api::new().await;
    // Keyed tasks through the REST enqueue.
    for key in ["acme", "acme", "acme", "globex"] {
        let (s, t) = api
            .post(
                "/api/tasks",
                json!({"task_data": {}, "queue": "sync", "concurrency_key": key}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{t}");
        assert_eq!(t["concurrency_key"], key);
    }
    let (s, e) = api
        .post(
            "/api/tasks",
            json!({"task_data": {}, "concurrency_key": ""}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    assert!(error_of(&e).starts_with("concurrency_key"), "{e}");
    // Every bad value: 400 naming the field, nothing written.
    for (body, field) in [
        (json!({"max_started": 0}), "max_started"),
        (json!({"max_started": 100001}), "max_started"),
        (json!({"max_started": 2.5}), "max_started"),
        (json!({"max_started": "ten"}), "max_started"),
        (
            json!({"max_started_per_key": 5000000000u64}),
            "max_started_per_key",
        ),
        (json!({"rate_per_second": 0}), "rate_per_second"),
        (json!({"rate_per_second": 1000001}), "rate_per_second"),
        (json!({"rate_per_second": 5e-324}), "rate_per_second"),
        (json!({"rate_per_second": true}), "rate_per_second"),
        (json!({"rate_per_second": 1, "rate_burst": 0}), "rate_burst"),
        (json!({"max_starts": 1}), "unknown field \"max_starts\""),
        (json!([1]), "the body must be a JSON object"),
    ] {
        let (s, e) = api.put("/api/queues/sync/limits", body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {e}");
        assert!(error_of(&e).starts_with(field), "{body}: {e} names {field}");
    }
    let (_, sync) = api.get("/api/queues/sync").await;
    assert_eq!(
        sync["limits"],
        json!({"max_started": null, "max_started_per_key": null, "rate_per_second": null, "rate_burst": null})
    );
    // A burst without a rate means nothing, and is ignored (the body's
    // schema allows it): answered, and shown unset.
    let (s, q) = api
        .put(
            "/api/queues/sync/limits",
            json!({"rate_burst": 3, "rate_per_second": null}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{q}");
    assert_eq!(q["limits"]["rate_burst"], Value::Null);
    let limits = json!({"max_started": 100000, "max_started_per_key": 2, "rate_per_second": 1000000, "rate_burst": null});
    let (s, set) = api.put("/api/queues/sync/limits", limits.clone()).await;
    assert_eq!(s, StatusCode::OK, "{set}");
    let mut expected = limits.clone();
    expected["rate_per_second"] = json!(1000000.0);
    assert_eq!(set["limits"], expected);
    let (_, listed) = api.get("/api/queues").await;
    assert_eq!(listed[0]["limits"], expected);
    // The REST claim obeys them: two of acme, one of globex.
    let mut claimed = Vec::new();
    loop {
        let (s, t) = api
            .post(
                "/api/tasks/next",
                json!({"processor": "w-rest", "queue": "sync"}),
            )
            .await;
        if s != StatusCode::ACCEPTED {
            break;
        }
        claimed.push(t["concurrency_key"].as_str().unwrap().to_string());
    }
    claimed.sort();
    assert_eq!(claimed, ["acme", "acme", "globex"]);
    let (_, sync) = api.get("/api/queues/sync").await;
    assert_eq!(
        sync["busiest_keys"],
        json!([{"key": "acme", "started": 2}, {"key": "globex", "started": 1}])
    );
    // Cleared with nulls (or an empty object): the last acme task is claimed.
    let (s, cleared) = api.put("/api/queues/sync/limits", json!({})).await;
    assert_eq!(s, StatusCode::OK, "{cleared}");
    let (s, t) = api
        .post(
            "/api/tasks/next",
            json!({"processor": "w-rest", "queue": "sync"}),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{t}");
    let audited: Vec<String> = operator_actions(&api)
        .await
        .into_iter()
        .filter(|(r, _, _)| r == "queue:sync")
        .map(|(_, _, a)| a)
        .collect();
    assert_eq!(audited, ["queue_limits", "queue_limits"]);
}

#[tokio::test]
async fn without_the_admin_token_limits_are_refused() {
    const TOKEN: &str = "an-admin-token-for-limit-tests";
    let api = Api::with_settings(|s| s.admin_token = Some(TOKEN.into())).await;
    let (s, e) = api
        .put("/api/queues/mail/limits", json!({"max_started": 1}))
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{e}");
    let form = [("content-type", "application/x-www-form-urlencoded")];
    let path = <leasekeeper::app::SetQueueLimits as leptos::server_fn::ServerFn>::PATH;
    let (s, e) = api
        .send_with(
            Method::POST,
            path,
            &form,
            Body::from("name=mail&max_started=1&max_started_per_key=&rate_per_second=&rate_burst="),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{e}");
    let (s, _) = api.get("/api/queues/mail").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "nothing was created");
}

/// The slowest rate allowed works end to end: its bucket's refill is a
/// product of two small numbers, which must not underflow (a rate near the
/// smallest float did, and every claim of its queue answered 500).
#[tokio::test]
async fn the_slowest_rate_claims_its_burst_and_then_nothing() {
    let api = Api::new().await;
    enqueue(&api, "slow", 3).await;
    let (s, q) = api
        .put(
            "/api/queues/slow/limits",
            json!({"rate_per_second": 0.000001}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{q}");
    let claim = json!({"processor": "w-rest", "queue": "slow"});
    let (s, t) = api.post("/api/tasks/next", claim.clone()).await;
    assert_eq!(s, StatusCode::ACCEPTED, "the burst of one: {t}");
    for _ in 0..3 {
        let (s, none) = api.post("/api/tasks/next", claim.clone()).await;
        assert_eq!(s, StatusCode::OK, "{none}");
        assert_eq!(none["message"], "no task available");
    }
}

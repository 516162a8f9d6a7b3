//! Ids that last: with the task and lease sequences started just below
//! 2^31 (where a `serial` column stopped every claim and every singleton
//! acquire), tasks and leases cross it through the REST worker API, the
//! embedded runtime, a takeover, cancel and retry, the lists, and the
//! server functions the task and lease pages render.

use crate::api::Api;
use axum::http::StatusCode;
use leasekeeper_core::queue::store;
use leasekeeper_core::worker::handler::{Done, HandlerResult, Job, TaskContext};
use leasekeeper_core::worker::runtime::Runtime;
use serde_json::{Value, json};
use std::time::Duration;

/// The last value an int4 sequence could hand out.
const INT4_MAX: i64 = i32::MAX as i64;

/// Starts both sequences so that the next id is `INT4_MAX - 1`.
async fn near_the_int4_limit(api: &Api) {
    for table in ["tasks", "leases"] {
        sqlx::query("SELECT setval(pg_get_serial_sequence($1, 'id'), $2)")
            .bind(table)
            .bind(INT4_MAX - 2)
            .execute(&api.db.pool)
            .await
            .unwrap();
    }
}

async fn enqueue(api: &Api, n: i64) -> i64 {
    let (s, task) = api
        .post(
            "/api/tasks",
            json!({ "task_data": {"n": n}, "max_attempts": 3 }),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    task["id"].as_i64().unwrap()
}

async fn claim(api: &Api, processor: &str) -> (i64, i64) {
    let (s, t) = api
        .post("/api/tasks/next", json!({ "processor": processor }))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{t}");
    (
        t["id"].as_i64().unwrap(),
        t["fencing_token"].as_i64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_and_leases_cross_the_int4_limit_everywhere() {
    let api = Api::new().await;
    near_the_int4_limit(&api).await;

    // Enqueue across the limit.
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(enqueue(&api, n).await);
    }
    assert_eq!(ids.first(), Some(&(INT4_MAX - 1)));
    assert!(
        ids.iter().filter(|id| **id > INT4_MAX).count() >= 4,
        "{ids:?}"
    );

    // Claims, heartbeat and completion of a task whose id no int4 can hold
    // (a claim's lease is its task row).
    let mut claims = Vec::new();
    for w in 0..4 {
        claims.push(claim(&api, &format!("w{w}")).await);
    }
    let (big, token) = claims[3];
    assert!(big > INT4_MAX);
    // Leases of the lease API get ids past the limit (a claim's lease is
    // its task row: claims take no lease ids).
    let mut lease = 0;
    for n in 0..4 {
        let (s, acquired) = api
            .post(
                "/api/leases",
                json!({"resource": format!("job:big{n}"), "holder": "h", "ttl_seconds": 30}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{acquired}");
        lease = acquired["id"].as_i64().unwrap();
    }
    assert!(lease > INT4_MAX, "lease id {lease}");
    let body = json!({"processor": "w3", "fencing_token": token});
    let (s, beat) = api.put(&format!("/api/tasks/{big}/heartbeat"), body).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{beat}");
    let done = json!({"processor": "w3", "fencing_token": token, "task_output": {"ok": true}});
    let (s, finished) = api.put(&format!("/api/tasks/{big}/complete"), done).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{finished}");
    assert_eq!(finished["id"], json!(big));
    assert_eq!(finished["status"], "processed");

    // A takeover: w2's claim runs out and w9 takes the task with the next
    // token; w2's late completion is refused.
    let (late, old_token) = claims[2];
    assert!(late > INT4_MAX);
    sqlx::query("UPDATE tasks SET must_heartbeat_before = now() - interval '1 ms' WHERE id = $1")
        .bind(late)
        .execute(&api.db.pool)
        .await
        .unwrap();
    let (taken, new_token) = claim(&api, "w9").await;
    assert_eq!((taken, new_token), (late, old_token + 1));
    let stale = json!({"processor": "w2", "fencing_token": old_token, "task_output": 1});
    let (s, err) = api.put(&format!("/api/tasks/{late}/complete"), stale).await;
    assert_eq!(s, StatusCode::CONFLICT, "{err}");

    // Cancel and retry.
    let (cancelled_id, _) = claims[1];
    let (s, cancelled) = api
        .post(&format!("/api/tasks/{cancelled_id}/cancel"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
    let (s, retried) = api
        .post(&format!("/api/tasks/{cancelled_id}/retry"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{retried}");
    assert_eq!(retried["status"], "pending");

    // Reads by id, lists paged by a cursor past the limit, history.
    let (s, got) = api.get(&format!("/api/tasks/{big}")).await;
    assert_eq!((s, got["id"].clone()), (StatusCode::OK, json!(big)));
    let (s, got) = api.get(&format!("/api/leases/{lease}")).await;
    assert_eq!((s, got["id"].clone()), (StatusCode::OK, json!(lease)));
    let (s, events) = api.get(&format!("/api/tasks/{big}/events")).await;
    assert_eq!(s, StatusCode::OK, "{events}");
    assert!(!events.as_array().unwrap().is_empty());
    let (s, older) = api
        .get(&format!("/api/tasks?before={}", INT4_MAX + 3))
        .await;
    assert_eq!(s, StatusCode::OK, "{older}");
    let older: Vec<i64> = older
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        older,
        vec![INT4_MAX + 2, INT4_MAX + 1, INT4_MAX, INT4_MAX - 1]
    );
    let (rows, _) = api.walk("/api/leases?limit=2").await;
    assert!(rows.iter().any(|l| l["id"] == json!(lease)));

    // A plain lease past the limit (an application's own name: the
    // library's `singleton:` prefix is reserved on the REST API).
    let (s, single) = api
        .post(
            "/api/leases",
            json!({"resource": "app:nightly", "holder": "replica-a", "ttl_ms": 30000}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{single}");
    assert!(single["id"].as_i64().unwrap() > INT4_MAX, "{single}");

    // The server functions behind the task and lease pages (what the pages
    // render; a page itself is rendered by the browser tests).
    for (name, id, field) in [
        ("get_task_detail", big, "task"),
        ("get_lease_detail", lease, "lease"),
    ] {
        let path = leptos::server_fn::axum::server_fn_paths()
            .map(|(path, _)| path)
            .find(|path| {
                path.strip_prefix(leasekeeper::http::server_fns::PREFIX)
                    .is_some_and(|n| n.trim_end_matches(|c: char| c.is_ascii_digit()) == name)
            })
            .unwrap_or_else(|| panic!("the server function {name}"));
        let headers = [
            ("origin", "http://127.0.0.1:3000"),
            ("host", "127.0.0.1:3000"),
            ("content-type", "application/x-www-form-urlencoded"),
            ("accept", "application/json"),
        ];
        let (s, detail) = api
            .send_bytes(
                axum::http::Method::POST,
                path,
                &headers,
                axum::body::Body::from(format!("id={id}")),
            )
            .await;
        assert_eq!(
            s,
            StatusCode::OK,
            "{name}: {}",
            String::from_utf8_lossy(&detail)
        );
        let detail: Value = serde_json::from_slice(&detail).unwrap();
        let got = if field == "task" {
            &detail["task"]["id"]
        } else {
            &detail["lease"]["id"]
        };
        assert_eq!(got, &json!(id), "{name}: {detail}");
    }

    // The embedded runtime: batched claims, heartbeats and completions and
    // its workers' rows, all with ids past the limit.
    let remaining = ids[4..].to_vec();
    let runtime = Runtime::builder(api.db.pool.clone())
        .id("rt-big")
        .queue("default", 2)
        .lease(Duration::from_millis(600), Duration::from_millis(150))
        .handler("sleep", |job: Job, _: TaskContext| async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            HandlerResult::Ok(Done::output(json!({ "id": job.id })))
        })
        .start()
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    let mut biggest_seen = 0;
    loop {
        // What the runtime's reporter wrote for its workers while they
        // worked (an idle worker's row has no task).
        let working: Option<i64> = sqlx::query_scalar("SELECT max(task_id) FROM workers")
            .fetch_one(&api.db.pool)
            .await
            .unwrap();
        biggest_seen = biggest_seen.max(working.unwrap_or_default());
        let mut conn = api.db.pool.acquire().await.unwrap();
        let mut done = 0;
        for id in &remaining {
            let t = store::get(&mut conn, &Default::default(), *id)
                .await
                .unwrap()
                .unwrap();
            if t.status.as_str() == "processed" {
                assert_eq!(t.task_output, Some(json!({ "id": id })));
                done += 1;
            }
        }
        if done == remaining.len() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "runtime did not finish {remaining:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    runtime.shutdown().await;
    assert!(
        biggest_seen > INT4_MAX,
        "workers reported task {biggest_seen}"
    );
}

#[tokio::test]
async fn the_sequences_are_bigint() {
    let api = Api::new().await;
    for table in ["tasks", "leases"] {
        let (seq_type, max): (String, i64) = sqlx::query_as(
            "SELECT s.data_type::text, s.max_value FROM pg_sequences s
              WHERE format('%I.%I', s.schemaname, s.sequencename)::regclass
                    = pg_get_serial_sequence($1, 'id')::regclass",
        )
        .bind(table)
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
        assert_eq!((seq_type.as_str(), max), ("bigint", i64::MAX), "{table}");
    }
    let int4_columns: Vec<String> = sqlx::query_scalar(
        "SELECT table_name || '.' || column_name FROM information_schema.columns
          WHERE table_schema = current_schema() AND data_type = 'integer'
            AND (column_name = 'id' OR column_name LIKE '%\\_id' OR column_name LIKE 'tasks\\_%')",
    )
    .fetch_all(&api.db.pool)
    .await
    .unwrap();
    assert!(int4_columns.is_empty(), "int4 ids left: {int4_columns:?}");
}

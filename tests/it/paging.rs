//! Paging everywhere (issue 14 item 5): every REST list answers newest
//! first, a page at a time, and names the next page in a `Link` header; a
//! cursor stays right while new rows arrive; bad cursors are refused.

use crate::api::{Api, error_of};
use axum::http::StatusCode;
use serde_json::{Value, json};

/// The values of `key` of every row of every page from `uri` on, and how
/// many pages there were.
async fn walk(api: &Api, uri: &str, key: &str) -> (Vec<Value>, usize) {
    let (rows, pages) = api.walk(uri).await;
    (rows.iter().map(|r| r[key].clone()).collect(), pages)
}

fn descending(values: &[Value]) -> bool {
    values
        .windows(2)
        .all(|w| w[0].as_i64().unwrap() > w[1].as_i64().unwrap())
}

#[tokio::test]
async fn task_lists_page_newest_first_and_new_tasks_do_not_shift_a_page() {
    let api = Api::new().await;
    sqlx::query(
        "INSERT INTO tasks (kind, task_data) SELECT 'sleep', '{}' FROM generate_series(1, 25)",
    )
    .execute(&api.db.pool)
    .await
    .unwrap();
    // Five of them cancelled, for the status filter.
    let (s, r) = api
        .post("/api/tasks/cancel", json!({"status": "pending"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    let (s, _) = api
        .post("/api/tasks/retry", json!({"status": "cancelled"}))
        .await;
    assert_eq!(s, StatusCode::OK);
    for id in [3, 8, 13, 18, 23] {
        let (s, _) = api
            .post(&format!("/api/tasks/{id}/cancel"), json!({}))
            .await;
        assert_eq!(s, StatusCode::OK);
    }

    let (ids, pages) = walk(&api, "/api/tasks?limit=10", "id").await;
    assert_eq!(ids.len(), 25);
    assert_eq!(pages, 3);
    assert!(descending(&ids), "{ids:?}");
    assert_eq!(ids[0], 25);

    // The link keeps the filter.
    let (s, first, next) = api.page("/api/tasks?status=cancelled&limit=2").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(first.as_array().unwrap().len(), 2);
    let next = next.expect("more cancelled tasks");
    assert!(
        next.contains("status=cancelled") && next.contains("before=18"),
        "{next}"
    );
    // New tasks arrive: the second page is the same.
    sqlx::query("INSERT INTO tasks (kind, task_data, status, cancelled_at) SELECT 'sleep', '{}', 'cancelled', now() FROM generate_series(1, 3)")
        .execute(&api.db.pool)
        .await
        .unwrap();
    let (_, second, _) = api.page(&next).await;
    let second: Vec<i64> = second
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_i64().unwrap())
        .collect();
    assert_eq!(second, [13, 8]);
    let (all, _) = walk(&api, "/api/tasks/failed?limit=1", "id").await;
    assert!(all.is_empty());

    // The oldest-first `after` paging stays for clients that follow new
    // tasks; with `before` too it reads the window between the two.
    let (s, asc, _) = api.page("/api/tasks?after=20&limit=3").await;
    assert_eq!(s, StatusCode::OK);
    let asc: Vec<&Value> = asc.as_array().unwrap().iter().map(|t| &t["id"]).collect();
    assert_eq!(asc, [&json!(21), &json!(22), &json!(23)]);
    for (uri, want) in [
        ("/api/tasks?after=2&before=5", vec![3, 4]),
        ("/api/tasks?after=2&before=5&limit=1", vec![3]),
        ("/api/tasks?after=5&before=5", vec![]),
        ("/api/leases?after=0&before=1", vec![]),
    ] {
        let (s, window, _) = api.page(uri).await;
        assert_eq!(s, StatusCode::OK, "{uri}: {window}");
        let ids: Vec<i64> = window
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_i64().unwrap())
            .collect();
        assert_eq!(ids, want, "{uri}");
    }
    for (uri, needle) in [
        ("/api/tasks?before=x", "invalid query string"),
        ("/api/leases?before=1.5", "invalid query string"),
        ("/api/workers?cursor=3", "unknown field"),
        ("/api/instances?limit=-", "invalid query string"),
    ] {
        let (s, body, _) = api.page(uri).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{uri}: {body}");
        assert!(error_of(&body).contains(needle), "{uri}: {body}");
    }
}

#[tokio::test]
async fn lease_worker_and_instance_lists_page_newest_first() {
    let api = Api::new().await;
    for i in 0..7 {
        let (s, _) = api
            .post(
                "/api/leases",
                json!({"resource": format!("p-{i}"), "holder": "h"}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED);
    }
    let (resources, pages) = walk(&api, "/api/leases/active?limit=3", "resource").await;
    assert_eq!(
        resources,
        (0..7)
            .rev()
            .map(|i| json!(format!("p-{i}")))
            .collect::<Vec<_>>()
    );
    assert_eq!(pages, 3);

    sqlx::query(
        "INSERT INTO workers (id, kind, state) SELECT 'pw-' || i, 'http', 'idle' FROM generate_series(1, 5) i",
    )
    .execute(&api.db.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO instances (id, address) SELECT 'pi-' || i, '127.0.0.1:1' FROM generate_series(1, 5) i",
    )
    .execute(&api.db.pool)
    .await
    .unwrap();
    for (uri, prefix) in [
        ("/api/workers?limit=2", "pw-"),
        ("/api/instances?limit=2", "pi-"),
    ] {
        let (ids, pages) = walk(&api, uri, "id").await;
        assert_eq!(
            ids,
            (1..=5)
                .rev()
                .map(|i| json!(format!("{prefix}{i}")))
                .collect::<Vec<_>>(),
            "{uri}"
        );
        assert_eq!(pages, 3, "{uri}");
        let (seqs, _) = walk(&api, uri, "seq").await;
        assert!(descending(&seqs), "{uri}: {seqs:?}");
    }
}

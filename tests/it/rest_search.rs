//! Searching `GET /api/tasks` by kind, queue, status and data (URL-encoded
//! JSON object): exactly the matching tasks, paged through `Link` headers
//! that keep the search; bad searches answer 400 naming what is wrong; the
//! bulk cancel takes the same data filter.

use crate::api::{Api, error_of};
use axum::http::StatusCode;
use serde_json::{Value, json};

/// `text` percent-encoded for a query parameter.
fn enc(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn enqueue(api: &Api, kind: &str, queue: &str, data: Value) -> i64 {
    let (s, task) = api
        .post(
            "/api/tasks",
            json!({"task_data": data, "kind": kind, "queue": queue}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    task["id"].as_i64().unwrap()
}

fn ids(rows: &[Value]) -> Vec<i64> {
    rows.iter().map(|t| t["id"].as_i64().unwrap()).collect()
}

#[tokio::test]
async fn the_list_finds_tasks_by_data_kind_and_queue_across_pages() {
    let api = Api::new().await;
    let mut customer7 = Vec::new();
    for i in 0..12 {
        let (kind, queue) = if i % 2 == 0 {
            ("email", "mail")
        } else {
            ("sms", "default")
        };
        let id = enqueue(&api, kind, queue, json!({"customer": 7 - (i % 3), "i": i})).await;
        if i % 3 == 0 {
            customer7.push((id, kind, queue));
        }
    }
    customer7.reverse();
    let data = enc(r#"{"customer":7}"#);

    // Data alone, three a page: the Link header keeps the search.
    let (rows, pages) = api.walk(&format!("/api/tasks?data={data}&limit=3")).await;
    assert_eq!(
        ids(&rows),
        customer7.iter().map(|c| c.0).collect::<Vec<_>>()
    );
    assert_eq!(pages, 2, "four tasks, three a page");
    let (_, _, next) = api.page(&format!("/api/tasks?data={data}&limit=3")).await;
    assert!(next.unwrap().contains(&format!("data={data}")));

    // With kind, with queue, with status, all together.
    for (query, want) in [
        (format!("data={data}&kind=email"), vec!["email"]),
        (format!("data={data}&queue=default"), vec!["sms"]),
        (
            format!("data={data}&status=pending&kind=sms&queue=default"),
            vec!["sms"],
        ),
    ] {
        let (rows, _) = api.walk(&format!("/api/tasks?{query}&limit=1")).await;
        let expected: Vec<i64> = customer7
            .iter()
            .filter(|c| want.contains(&c.1))
            .map(|c| c.0)
            .collect();
        assert_eq!(ids(&rows), expected, "{query}");
    }
    // The status routes take the search too; a search matching nothing is
    // an empty page; blank parameters and `{}` mean any.
    let (s, rows) = api.get(&format!("/api/tasks/pending?data={data}")).await;
    assert_eq!((s, rows.as_array().unwrap().len()), (StatusCode::OK, 4));
    let (s, rows) = api.get(&format!("/api/tasks/failed?data={data}")).await;
    assert_eq!((s, rows), (StatusCode::OK, json!([])));
    let (s, rows) = api
        .get(&format!("/api/tasks?kind=&queue=&data={}", enc("{}")))
        .await;
    assert_eq!((s, rows.as_array().unwrap().len()), (StatusCode::OK, 12));
    // Oldest first (`after`) with the search.
    let (s, rows) = api
        .get(&format!("/api/tasks?after=0&data={data}&kind=email"))
        .await;
    assert_eq!(s, StatusCode::OK);
    let mut oldest: Vec<i64> = customer7
        .iter()
        .filter(|c| c.1 == "email")
        .map(|c| c.0)
        .collect();
    oldest.reverse();
    assert_eq!(ids(rows.as_array().unwrap()), oldest);
}

#[tokio::test]
async fn bad_searches_answer_400_saying_what_is_wrong() {
    let api = Api::new().await;
    let long = format!(r#"{{"k":"{}"}}"#, "x".repeat(9000));
    for (query, says) in [
        (
            format!("data={}", enc("[1,2]")),
            "data must be a JSON object, e.g. {\"customer\":7}",
        ),
        (format!("data={}", enc("7")), "data must be a JSON object"),
        (
            format!("data={}", enc("\"customer\"")),
            "data must be a JSON object",
        ),
        (format!("data={}", enc("{customer:7}")), "not JSON"),
        (
            format!("data={}", enc(&long)),
            "data must be at most 8192 characters",
        ),
        (format!("data={}", enc(r#"{"k":"a\u0000"}"#)), "NUL"),
        (
            format!("kind={}", enc("a\u{7}b")),
            "kind must not contain control characters",
        ),
        (
            format!("queue={}", "q".repeat(129)),
            "queue must be 1 to 128 characters",
        ),
        ("status=done".to_string(), "status must be one of"),
    ] {
        for path in ["/api/tasks", "/api/tasks/pending"] {
            let (s, err) = api.get(&format!("{path}?{query}")).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{path}?{query:.60}: {err}");
            assert!(error_of(&err).contains(says), "{path}?{query:.60}: {err}");
        }
    }
}

#[tokio::test]
async fn the_bulk_cancel_takes_the_data_filter() {
    let api = Api::new().await;
    let a = enqueue(&api, "email", "mail", json!({"customer": 1})).await;
    let b = enqueue(&api, "email", "mail", json!({"customer": 2})).await;
    let (s, count) = api
        .post(
            "/api/tasks/cancel",
            json!({"status": "pending", "kind": "email", "data": {"customer": 1}}),
        )
        .await;
    assert_eq!((s, count), (StatusCode::OK, json!({"count": 1})));
    let (_, ta) = api.get(&format!("/api/tasks/{a}")).await;
    let (_, tb) = api.get(&format!("/api/tasks/{b}")).await;
    assert_eq!(
        (ta["status"].as_str(), tb["status"].as_str()),
        (Some("cancelled"), Some("pending"))
    );
    let (s, err) = api
        .post(
            "/api/tasks/cancel",
            json!({"status": "pending", "data": [1]}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{err}");
}

//! Mutations from another site's page are refused (403) and change nothing;
//! same-origin pages and non-browser clients (no Origin) pass; reads pass.

use crate::api::{Api, error_of};
use axum::body::Body;
use axum::http::{Method, StatusCode};
use leasekeeper::app::SetGenerator;
use leptos::server_fn::ServerFn;
use serde_json::json;

const SET_GENERATOR: &str = <SetGenerator as ServerFn>::PATH;

fn acquire_body() -> Body {
    Body::from(json!({"resource": "r1", "holder": "a"}).to_string())
}

#[tokio::test]
async fn cross_site_mutations_are_refused_and_change_nothing() {
    let api = Api::new().await;
    let refused: [&[(&str, &str)]; 4] = [
        &[
            ("origin", "http://evil.example"),
            ("host", "127.0.0.1:3000"),
        ],
        &[
            ("origin", "http://127.0.0.1:3001"),
            ("host", "127.0.0.1:3000"),
        ],
        &[("origin", "null"), ("host", "127.0.0.1:3000")],
        &[("sec-fetch-site", "cross-site"), ("host", "127.0.0.1:3000")],
    ];
    for headers in refused {
        let (s, err) = api
            .send_with(Method::POST, "/api/leases", headers, acquire_body())
            .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{headers:?}: {err}");
        assert!(
            error_of(&err).contains("cross-site request refused"),
            "{err}"
        );
        let (s, _) = api
            .send_with(Method::POST, "/api/generator/start", headers, Body::empty())
            .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{headers:?}");
        // Server functions (the dashboard's buttons) sit behind the same check.
        let mut form = headers.to_vec();
        form.push(("content-type", "application/x-www-form-urlencoded"));
        let (s, _) = api
            .send_with(
                Method::POST,
                SET_GENERATOR,
                &form,
                Body::from("action=start"),
            )
            .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{headers:?}");
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM leases")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(count, 0, "a refused request changed nothing");
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM lease_events")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(events, 0);
    let desired: String = sqlx::query_scalar("SELECT desired FROM generator_state")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(desired, "stopped", "the generator was not started");
}

#[tokio::test]
async fn same_origin_clients_without_origin_and_reads_pass() {
    let api = Api::new().await;
    let same = [
        ("origin", "http://127.0.0.1:3000"),
        ("host", "127.0.0.1:3000"),
    ];
    let (s, _) = api
        .send_with(Method::POST, "/api/leases", &same, acquire_body())
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = api
        .raw(Method::PUT, "/api/leases/renew", acquire_body())
        .await;
    assert_eq!(s, StatusCode::OK, "no Origin: curl, the worker process");
    let cross = [
        ("origin", "http://evil.example"),
        ("host", "127.0.0.1:3000"),
    ];
    let (s, _) = api
        .send_with(Method::GET, "/api/leases", &cross, Body::empty())
        .await;
    assert_eq!(s, StatusCode::OK, "reads are not refused");
    // The dashboard's own button, posted from its own page, works.
    let form = [
        ("origin", "http://127.0.0.1:3000"),
        ("host", "127.0.0.1:3000"),
        ("content-type", "application/x-www-form-urlencoded"),
        ("accept", "application/json"),
    ];
    let (s, status) = api
        .send_with(
            Method::POST,
            SET_GENERATOR,
            &form,
            Body::from("action=start"),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{status}");
    assert_eq!(status["desired"], "running");
}

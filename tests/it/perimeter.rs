//! The perimeter, from outside: a `Host` the server does not answer for
//! gets 421 on every route and changes nothing (what a DNS-rebinding page
//! sends); IP literals, loopback names and allowed names pass; every
//! answer carries the security headers and a page its CSP with the nonce
//! of its own scripts; a JSON route refuses a body not said to be JSON
//! (415) and inserts nothing; `serve` beyond loopback without a token
//! exits before it creates anything.

use crate::api::{Api, error_of};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use leasekeeper::app::SetGenerator;
use leptos::server_fn::ServerFn;
use serde_json::{Value, json};
use tower::ServiceExt;

const SET_GENERATOR: &str = <SetGenerator as ServerFn>::PATH;

/// A server that answers `jobs.example.com` and every name under `internal`.
async fn api() -> Api {
    Api::with_settings(|s| {
        s.allowed_hosts = vec!["jobs.example.com".into(), ".internal".into()];
    })
    .await
}

async fn count(api: &Api, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&api.db.pool)
        .await
        .unwrap()
}

async fn generator_desired(api: &Api) -> String {
    sqlx::query_scalar("SELECT desired FROM generator_state")
        .fetch_one(&api.db.pool)
        .await
        .unwrap()
}

/// Sends a request with exactly `headers`; status, headers, body text.
async fn send(
    api: &Api,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut req = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = api
        .app()
        .oneshot(req.body(Body::from(body.to_string())).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

#[tokio::test]
async fn a_rebinding_pages_requests_answer_421_and_change_nothing() {
    let api = api().await;
    for host in [
        "evil.example:3000",
        "evil.example",
        "jobs.example.com.evil.example",
    ] {
        // The page's own origin: Origin matches Host, as after a rebinding.
        let origin = format!("http://{host}");
        let rebinding = [("host", host), ("origin", origin.as_str())];
        let (s, err) = api
            .send_with(
                Method::POST,
                "/api/generator/start",
                &rebinding,
                Body::empty(),
            )
            .await;
        assert_eq!(s, StatusCode::MISDIRECTED_REQUEST, "{host}: {err}");
        assert!(
            error_of(&err).contains("LEASEKEEPER_ALLOWED_HOSTS"),
            "names the setting: {err}"
        );
        let (s, _) = api
            .send_with(
                Method::POST,
                "/api/leases",
                &rebinding,
                Body::from(json!({"resource": "r1", "holder": "a"}).to_string()),
            )
            .await;
        assert_eq!(s, StatusCode::MISDIRECTED_REQUEST, "{host}");
        let form = [
            ("host", host),
            ("origin", origin.as_str()),
            ("content-type", "application/x-www-form-urlencoded"),
            ("accept", "application/json"),
        ];
        let (s, _, _) = send(&api, Method::POST, SET_GENERATOR, &form, "action=start").await;
        assert_eq!(
            s,
            StatusCode::MISDIRECTED_REQUEST,
            "{host}: server function"
        );
        // Reads too: a rebinding page could otherwise read every task.
        for uri in [
            "/api/tasks",
            "/api/leases",
            "/",
            "/tasks",
            "/healthz",
            "/metrics",
            "/api/events",
        ] {
            let (s, headers, body) = send(&api, Method::GET, uri, &[("host", host)], "").await;
            assert_eq!(s, StatusCode::MISDIRECTED_REQUEST, "{host} {uri}: {body}");
            let err: Value = serde_json::from_str(&body).unwrap();
            assert!(
                error_of(&err).contains(&format!("{:?}", host.split(':').next().unwrap())),
                "{err}"
            );
            assert_eq!(
                headers["x-frame-options"], "DENY",
                "the refusal carries the headers too"
            );
        }
    }
    assert_eq!(count(&api, "leases").await, 0, "no lease was taken");
    assert_eq!(count(&api, "lease_events").await, 0);
    assert_eq!(
        generator_desired(&api).await,
        "stopped",
        "the generator was not started"
    );
}

#[tokio::test]
async fn ip_literals_loopback_and_allowed_names_are_answered() {
    let api = api().await;
    let hosts = [
        "127.0.0.1:3000",
        "192.168.1.20:3000",
        "localhost:3000",
        "localhost",
        "app.localhost:3000",
        "[::1]:3000",
        "jobs.example.com",
        "JOBS.EXAMPLE.COM:443",
        "internal",
        "a.internal:3000",
    ];
    for (i, host) in hosts.iter().enumerate() {
        let origin = format!("http://{host}");
        let headers = [("host", *host), ("origin", origin.as_str())];
        let (s, body) = api
            .send_with(
                Method::POST,
                "/api/leases",
                &headers,
                Body::from(json!({"resource": format!("r{i}"), "holder": "a"}).to_string()),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{host}: {body}");
        let (s, _, body) = send(&api, Method::GET, "/api/leases", &[("host", host)], "").await;
        assert_eq!(s, StatusCode::OK, "{host}: {body}");
    }
    assert_eq!(count(&api, "leases").await, hosts.len() as i64);
    // Without a name on the list, the same names are refused.
    let bare = Api::new().await;
    for host in ["jobs.example.com", "a.internal:3000"] {
        let (s, _, _) = send(&bare, Method::GET, "/api/leases", &[("host", host)], "").await;
        assert_eq!(s, StatusCode::MISDIRECTED_REQUEST, "{host}");
    }
    // No Host at all (HTTP/1.0, this in-process client): answered.
    let (s, _) = bare.get("/api/leases").await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn every_answer_carries_the_security_headers_and_a_page_its_policy() {
    let api = api().await;
    let (s, headers, body) = send(
        &api,
        Method::GET,
        "/api/leases",
        &[("host", "127.0.0.1:3000")],
        "",
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["referrer-policy"], "same-origin");
    assert_eq!(headers["x-frame-options"], "DENY");
    let (_, headers, _) = send(&api, Method::GET, "/api/nope", &[], "").await;
    assert_eq!(headers["x-content-type-options"], "nosniff", "errors too");

    let (s, headers, page) = send(
        &api,
        Method::GET,
        "/signin",
        &[("host", "localhost:3000")],
        "",
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{page}");
    assert!(
        headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/html"),
        "{headers:?}"
    );
    assert_eq!(headers["x-frame-options"], "DENY");
    let policy = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    for part in [
        "default-src 'self'",
        "frame-ancestors 'none'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "connect-src 'self'",
        "'wasm-unsafe-eval'",
    ] {
        assert!(policy.contains(part), "{part}: {policy}");
    }
    assert!(
        !policy.contains("script-src 'self' 'unsafe-inline'"),
        "{policy}"
    );
    // The policy's nonce is the one on the page's hydration script, and
    // each answer has its own.
    let nonce = policy
        .split("'nonce-")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .unwrap_or_else(|| panic!("no nonce in {policy}"));
    assert!(nonce.len() >= 16, "{nonce}");
    assert!(
        page.contains(&format!("<script type=\"module\" nonce=\"{nonce}\">")),
        "the hydration script carries the nonce: {page}"
    );
    let (_, again, _) = send(&api, Method::GET, "/signin", &[], "").await;
    assert_ne!(
        again[header::CONTENT_SECURITY_POLICY],
        headers[header::CONTENT_SECURITY_POLICY]
    );
}

#[tokio::test]
async fn a_json_route_refuses_a_body_not_said_to_be_json() {
    let api = api().await;
    let lease = json!({"resource": "r1", "holder": "a"}).to_string();
    let task = json!({"task_data": {"n": 1}}).to_string();
    let batch = json!([{"task_data": {"n": 1}}]).to_string();
    // What, its Content-Type (none: no header), the body.
    let cases: [(&str, Option<&str>, &str); 4] = [
        (
            "form",
            Some("application/x-www-form-urlencoded"),
            "resource=r1&holder=a",
        ),
        ("text", Some("text/plain"), lease.as_str()),
        (
            "text with charset",
            Some("text/plain;charset=UTF-8"),
            task.as_str(),
        ),
        ("no type", None, batch.as_str()),
    ];
    for (what, content_type, body) in cases {
        let headers: Vec<(&str, &str)> = content_type
            .map(|t| ("content-type", t))
            .into_iter()
            .collect();
        for uri in [
            "/api/leases",
            "/api/tasks",
            "/api/tasks/batch",
            "/api/tasks/next",
        ] {
            let (s, _, answer) = send(&api, Method::POST, uri, &headers, body).await;
            assert_eq!(
                s,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{what} to {uri}: {answer}"
            );
            let err: Value = serde_json::from_str(&answer).unwrap();
            assert!(error_of(&err).contains("application/json"), "{err}");
        }
    }
    assert_eq!(count(&api, "leases").await, 0, "nothing inserted");
    assert_eq!(count(&api, "tasks").await, 0, "nothing inserted");
    // JSON with a charset, or a `+json` type, is JSON.
    for (i, content_type) in [
        "application/json; charset=utf-8",
        "application/merge-patch+json",
    ]
    .iter()
    .enumerate()
    {
        let body = json!({"resource": format!("ok{i}"), "holder": "a"}).to_string();
        let (s, _, answer) = send(
            &api,
            Method::POST,
            "/api/leases",
            &[("content-type", content_type)],
            &body,
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{content_type}: {answer}");
    }
}

#[tokio::test]
async fn the_document_declares_415_on_every_body_and_421_everywhere() {
    let api = Api::new().await;
    let (s, doc) = api.get("/api/openapi.json").await;
    assert_eq!(s, StatusCode::OK);
    let mut bodies = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            assert!(responses.contains_key("421"), "{method} {path}");
            if op.get("requestBody").is_some() {
                bodies += 1;
                assert!(
                    responses.contains_key("415"),
                    "{method} {path} reads a body"
                );
            }
        }
    }
    assert!(bodies >= 16, "the routes with a JSON body: {bodies}");
}

#[test]
fn serve_beyond_loopback_without_a_token_exits_before_creating_anything() {
    let dir = std::env::temp_dir().join(format!(
        "leasekeeper-perimeter-{}-{:?}",
        std::process::id(),
        std::time::SystemTime::now()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let data_dir = dir.join("never-created");
    let started = std::time::Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasekeeper"))
        .args(["serve", "--addr", "0.0.0.0:0", "--data-dir"])
        .arg(&data_dir)
        // No settings file, no inherited token or database.
        .current_dir(&dir)
        .env_remove("LEASEKEEPER_ADMIN_TOKEN")
        .env_remove("LEASEKEEPER_WORKER_TOKEN")
        .env_remove("LEASEKEEPER_OPEN_NETWORK")
        .env_remove("LEASEKEEPER_CONFIG")
        .env_remove("DATABASE_URL")
        .env_remove("LEPTOS_SITE_ADDR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "at once"
    );
    for name in [
        "LEASEKEEPER_ADMIN_TOKEN",
        "LEASEKEEPER_WORKER_TOKEN",
        "LEASEKEEPER_OPEN_NETWORK",
        "0.0.0.0",
    ] {
        assert!(stderr.contains(name), "{name}: {stderr}");
    }
    assert!(!data_dir.exists(), "no data folder before the check");
    std::fs::remove_dir_all(&dir).unwrap();
}

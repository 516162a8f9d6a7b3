//! The lease REST contract (docs/rest-api.md), driven in-process through the router:
//! every route, every status, every error case.

use crate::api::{Api, error_of};
use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

#[tokio::test]
async fn acquire_answers_201_then_200_for_the_holder_then_409() {
    let api = Api::new().await;
    let (s, lease) = api
        .post("/api/leases", json!({"resource": "r1", "holder": "a"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{lease}");
    assert_eq!(lease["fencing_token"], 1);
    assert_eq!(lease["holder"], "a");
    assert_eq!(lease["state"], "active");
    assert_eq!(lease["ttl_ms"], 15000);

    let (s, again) = api
        .post("/api/leases", json!({"resource": "r1", "holder": "a"}))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(again["id"], lease["id"]);
    assert_eq!(again["fencing_token"], 1);

    let (s, err) = api
        .post("/api/leases", json!({"resource": "r1", "holder": "b"}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert!(error_of(&err).contains("held by a"), "{err}");

    let (s, custom) = api
        .post(
            "/api/leases",
            json!({"resource": "r2", "holder": "a", "ttl_seconds": 2.5}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(custom["ttl_ms"], 2500);
}

#[tokio::test]
async fn renew_and_release_need_a_live_lease_of_that_holder() {
    let api = Api::new().await;
    let body = json!({"resource": "r1", "holder": "a"});
    api.post("/api/leases", body.clone()).await;

    let (s, renewed) = api.put("/api/leases/renew", body.clone()).await;
    assert_eq!(s, StatusCode::OK, "{renewed}");
    assert_eq!(renewed["renew_count"], 1);

    let stranger = json!({"resource": "r1", "holder": "b"});
    let (s, err) = api.put("/api/leases/renew", stranger.clone()).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{err}");
    let (s, _) = api.delete("/api/leases/release", stranger).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = api
        .put(
            "/api/leases/renew",
            json!({"resource": "r1", "holder": "a", "fencing_token": 7}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "a wrong token renews nothing");

    let (s, released) = api.delete("/api/leases/release", body.clone()).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(released["state"], "released");
    let (s, _) = api.delete("/api/leases/release", body.clone()).await;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "a second release finds no live lease"
    );
    let (s, _) = api.put("/api/leases/renew", body).await;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "a released lease cannot be renewed"
    );
}

#[tokio::test]
async fn lists_filter_by_state() {
    let api = Api::new().await;
    for r in ["a1", "a2", "gone"] {
        api.post("/api/leases", json!({"resource": r, "holder": "h"}))
            .await;
    }
    api.put(
        "/api/leases/renew",
        json!({"resource": "a2", "holder": "h"}),
    )
    .await;
    api.delete(
        "/api/leases/release",
        json!({"resource": "gone", "holder": "h"}),
    )
    .await;
    sqlx::query("INSERT INTO leases (resource, holder, expires_at, ttl_ms, fencing_token) VALUES ('old', 'h', now() - interval '1 s', 1000, 1)")
        .execute(&api.db.pool)
        .await
        .unwrap();
    let names = |v: Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|l| l["resource"].as_str().unwrap().to_string())
            .collect()
    };
    for (path, expected) in [
        // Newest first.
        ("/api/leases", vec!["old", "gone", "a2", "a1"]),
        ("/api/leases/active", vec!["a2", "a1"]),
        ("/api/leases/expired", vec!["old"]),
        ("/api/leases/renewed", vec!["a2"]),
        ("/api/leases/released", vec!["gone"]),
        ("/api/leases?limit=2", vec!["old", "gone"]),
        // Oldest first with `after`.
        ("/api/leases?after=0&limit=2", vec!["a1", "a2"]),
    ] {
        let (s, v) = api.call(Method::GET, path, None).await;
        assert_eq!(s, StatusCode::OK, "{path}");
        assert_eq!(names(v), expected, "{path}");
    }
    let (s, err) = api.get("/api/leases?limit=abc").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{err}");
}

#[tokio::test]
async fn get_and_delete_by_id() {
    let api = Api::new().await;
    let (_, lease) = api
        .post("/api/leases", json!({"resource": "r1", "holder": "a"}))
        .await;
    let id = lease["id"].as_i64().unwrap();
    let (s, got) = api.get(&format!("/api/leases/{id}")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(got["resource"], "r1");

    for bad in ["abc", "-1", "0", "9223372036854775808", "1.5"] {
        let (s, err) = api.get(&format!("/api/leases/{bad}")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {err}");
        assert!(error_of(&err).contains("positive integer"), "{err}");
    }
    let (s, _) = api.get("/api/leases/99999999999").await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    let (s, _) = api
        .delete(
            &format!("/api/leases/{id}"),
            json!({"resource": "r1", "holder": "b"}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "only the holder deletes");
    let (s, _) = api
        .delete(
            &format!("/api/leases/{id}"),
            json!({"resource": "r1", "holder": "a"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = api.get(&format!("/api/leases/{id}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, again) = api
        .post("/api/leases", json!({"resource": "r1", "holder": "a"}))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(again["fencing_token"], 2, "tokens survive deletion");
}

#[tokio::test]
async fn bad_input_gets_400_with_a_json_error_and_changes_nothing() {
    let api = Api::new().await;
    let long = "x".repeat(257);
    let cases: Vec<(Method, &str, Body, &str)> = vec![
        (
            Method::POST,
            "/api/leases",
            Body::from("{not json"),
            "invalid JSON",
        ),
        (
            Method::POST,
            "/api/leases",
            Body::from("resource=r1&holder=a"),
            "invalid JSON",
        ),
        (
            Method::POST,
            "/api/leases",
            Body::empty(),
            "JSON body is required",
        ),
        (
            Method::POST,
            "/api/leases",
            Body::from(r#"{"resource": "r1"}"#),
            "missing field `holder`",
        ),
        (
            Method::POST,
            "/api/leases",
            Body::from(r#"{"holder": "a"}"#),
            "missing field `resource`",
        ),
        (
            Method::POST,
            "/api/leases",
            Body::from(r#"{"resource": "r1", "holder": ""}"#),
            "holder must not be empty",
        ),
        (
            Method::POST,
            "/api/leases",
            Body::from(r#"{"resource": " ", "holder": "a"}"#),
            "resource must not be empty",
        ),
        (
            Method::POST,
            "/api/leases",
            Body::from(json!({"resource": "r1", "holder": long}).to_string()),
            "at most 256",
        ),
        (
            Method::POST,
            "/api/leases",
            Body::from(json!({"resource": long, "holder": "a"}).to_string()),
            "at most 256",
        ),
        (
            Method::POST,
            "/api/leases",
            Body::from(r#"{"resource": 5, "holder": "a"}"#),
            "invalid type",
        ),
        (
            Method::POST,
            "/api/leases",
            Body::from(r#"{"resource": "r1", "holder": "a", "ttl_seconds": -1}"#),
            "ttl_seconds",
        ),
        (
            Method::POST,
            "/api/leases",
            Body::from(r#"{"resource": "r1", "holder": "a", "ttl_seconds": 1e9}"#),
            "ttl_seconds",
        ),
        (
            Method::POST,
            "/api/leases",
            Body::from(r#"{"resource": "a\u0000b", "holder": "a"}"#),
            "control characters",
        ),
        (
            Method::PUT,
            "/api/leases/renew",
            Body::from("[]"),
            "invalid JSON",
        ),
        (
            Method::DELETE,
            "/api/leases/release",
            Body::from(r#"{"resource": "r1"}"#),
            "missing field `holder`",
        ),
        (
            Method::DELETE,
            "/api/leases/1",
            Body::from("{}"),
            "missing field",
        ),
    ];
    for (method, uri, body, expected) in cases {
        let (s, err) = api.raw(method.clone(), uri, body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{method} {uri}: {err}");
        assert!(
            error_of(&err).contains(expected),
            "{method} {uri}: {err} lacks {expected:?}"
        );
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM leases")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(count, 0, "bad input changed nothing");
}

#[tokio::test]
async fn invalid_utf8_and_oversized_bodies() {
    let api = Api::new().await;
    let (s, err) = api
        .raw(
            Method::POST,
            "/api/leases",
            Body::from(vec![b'{', 0xff, 0xfe, b'}']),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{err}");
    let huge = json!({"resource": "r1", "holder": "a", "pad": "x".repeat(70 * 1024)}).to_string();
    let (s, err) = api.raw(Method::POST, "/api/leases", Body::from(huge)).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{err}");
    assert!(error_of(&err).contains("larger than 65536 bytes"), "{err}");
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_json() {
    let api = Api::new().await;
    let (s, err) = api.get("/api/nope").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&err), "no such API route");
    let (s, err) = api.call(Method::PATCH, "/api/leases", None).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "{err}");
}

#[tokio::test]
async fn internal_errors_are_500_with_a_generic_message() {
    let api = Api::new().await;
    // Cut the server off from its database (the main pool: reads have a
    // pool of their own, see `crate::bounded`).
    api.db.pool.close().await;
    let (s, err) = api
        .post(
            "/api/leases",
            json!({"resource": "r1", "holder": "a", "ttl_seconds": 10}),
        )
        .await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(error_of(&err), "internal server error", "no internals leak");
}

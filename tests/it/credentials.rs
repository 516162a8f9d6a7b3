//! Credentials and roles from outside, through the router (issue 37): with
//! a token set, every worker and producer route answers 401 without a
//! credential before anything is read or recorded; either token opens
//! them; the worker token never opens a control; the library's own leases
//! are out of the lease API's reach for everyone; reads need a credential
//! beyond loopback; the dashboard's cookie carries a session, not a token.

use crate::api::{Api, error_of};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use leasekeeper::app::{SetGenerator, SignIn, SignOut};
use leptos::server_fn::ServerFn;
use serde_json::{Value, json};
use tower::ServiceExt;

pub const ADMIN: &str = "an-admin-token-for-credential-tests";
pub const WORKER: &str = "a-worker-token-for-credential-tests";

/// A server with both tokens set; `beyond_loopback` makes it listen on
/// 0.0.0.0 (the router does not bind: only the reads rule looks).
async fn locked(beyond_loopback: bool) -> Api {
    Api::with_settings(|s| {
        s.admin_token = Some(ADMIN.into());
        s.worker_token = Some(WORKER.into());
        if beyond_loopback {
            s.site_addr = "0.0.0.0:3000".parse().unwrap();
        }
    })
    .await
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Sends `body` as JSON with `token` as a bearer, if any.
async fn send(
    api: &Api,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Value,
) -> (StatusCode, Value) {
    let auth = token.map(bearer);
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("authorization", a)])
        .unwrap_or_default();
    let body = if body.is_null() {
        Body::empty()
    } else {
        Body::from(body.to_string())
    };
    api.send_with(method, uri, &headers, body).await
}

async fn count(api: &Api, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(&api.db.pool)
        .await
        .unwrap()
}

/// Everything a refused request could have left behind.
async fn footprint(api: &Api) -> (i64, i64, i64, i64) {
    (
        count(api, "SELECT count(*) FROM lease_events").await,
        count(api, "SELECT count(*) FROM tasks").await,
        count(api, "SELECT count(*) FROM leases").await,
        count(api, "SELECT count(*) FROM workers").await,
    )
}

/// A started task claimed by `w1` with the admin token: (id, token).
async fn claimed(api: &Api) -> (i64, i64) {
    let (s, task) = send(
        api,
        Method::POST,
        "/api/tasks",
        Some(ADMIN),
        json!({"task_data": {"n": 1}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    let (s, claim) = send(
        api,
        Method::POST,
        "/api/tasks/next",
        Some(ADMIN),
        json!({"processor": "w1"}),
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{claim}");
    (
        claim["id"].as_i64().unwrap(),
        claim["fencing_token"].as_i64().unwrap(),
    )
}

/// Every worker and producer route, aimed at a real claim and a real
/// application lease, as a stranger who read their ids would send them.
fn worker_routes(id: i64, token: i64) -> Vec<(Method, String, Value)> {
    let claim = json!({"processor": "w1", "fencing_token": token});
    vec![
        (
            Method::POST,
            "/api/tasks".into(),
            json!({"task_data": {"n": 2}}),
        ),
        (
            Method::POST,
            "/api/tasks/batch".into(),
            json!([{"task_data": {"n": 3}}]),
        ),
        (
            Method::POST,
            "/api/tasks/next".into(),
            json!({"processor": "stranger"}),
        ),
        (
            Method::POST,
            "/api/workflows".into(),
            json!({"name": "w", "tasks": [{"ref": "a", "task_data": {}}]}),
        ),
        (
            Method::PUT,
            format!("/api/tasks/{id}/heartbeat"),
            claim.clone(),
        ),
        (
            Method::PUT,
            format!("/api/tasks/{id}/complete"),
            json!({"processor": "w1", "fencing_token": token, "task_output": "forged"}),
        ),
        (
            Method::PUT,
            format!("/api/tasks/{id}/snooze"),
            json!({"processor": "w1", "fencing_token": token, "seconds": 3600}),
        ),
        (
            Method::PUT,
            format!("/api/tasks/{id}/wait"),
            json!({"processor": "w1", "fencing_token": token, "signal": "s", "timeout_seconds": 60}),
        ),
        (
            Method::POST,
            format!("/api/tasks/{id}/signal"),
            json!({"name": "s", "payload": "forged"}),
        ),
        (
            Method::PUT,
            format!("/api/tasks/{id}/fail"),
            json!({"processor": "w1", "fencing_token": token, "error": "forged"}),
        ),
        // A stale write too: a wrong token on an existing id is what used
        // to record a `stale_write_refused` row for anyone.
        (
            Method::PUT,
            format!("/api/tasks/{id}/complete"),
            json!({"processor": "w1", "fencing_token": token + 7}),
        ),
        (
            Method::PUT,
            "/api/workers/proc-1".into(),
            json!({"state": "idle", "fresh": true}),
        ),
        (
            Method::POST,
            "/api/leases".into(),
            json!({"resource": "app:x", "holder": "stranger"}),
        ),
        (
            Method::PUT,
            "/api/leases/renew".into(),
            json!({"resource": "app:held", "holder": "owner"}),
        ),
        (
            Method::DELETE,
            "/api/leases/release".into(),
            json!({"resource": "app:held", "holder": "owner"}),
        ),
        (
            Method::DELETE,
            "/api/leases/1".into(),
            json!({"resource": "app:held", "holder": "owner"}),
        ),
    ]
}

#[tokio::test]
async fn without_a_credential_every_worker_route_is_401_and_leaves_nothing() {
    for only_worker_token in [false, true] {
        let api = Api::with_settings(|s| {
            s.worker_token = Some(WORKER.into());
            if !only_worker_token {
                s.admin_token = Some(ADMIN.into());
            }
        })
        .await;
        let (s, lease) = send(
            &api,
            Method::POST,
            "/api/leases",
            Some(WORKER),
            json!({"resource": "app:held", "holder": "owner", "ttl_seconds": 300}),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{lease}");
        let (s, _) = send(
            &api,
            Method::POST,
            "/api/tasks",
            Some(WORKER),
            json!({"task_data": {}}),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED);
        let (s, claim) = send(
            &api,
            Method::POST,
            "/api/tasks/next",
            Some(WORKER),
            json!({"processor": "w1"}),
        )
        .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{claim}");
        let (id, token) = (
            claim["id"].as_i64().unwrap(),
            claim["fencing_token"].as_i64().unwrap(),
        );
        let before = footprint(&api).await;
        for (method, uri, body) in worker_routes(id, token) {
            for credential in [None, Some("not-a-token-of-this-server")] {
                let (s, err) = send(&api, method.clone(), &uri, credential, body.clone()).await;
                assert_eq!(
                    s,
                    StatusCode::UNAUTHORIZED,
                    "{method} {uri} with {credential:?}: {err}"
                );
                assert!(error_of(&err).contains("LEASEKEEPER_WORKER_TOKEN"), "{err}");
            }
            // Refused before the body is read: a body that is not JSON
            // is still a 401, not a 400.
            let (s, _) = api
                .send_with(method.clone(), &uri, &[], Body::from("{not json"))
                .await;
            assert_eq!(
                s,
                StatusCode::UNAUTHORIZED,
                "{method} {uri} with a bad body"
            );
        }
        assert_eq!(
            footprint(&api).await,
            before,
            "a refused request left a row behind"
        );
        let (_, task) = api.get(&format!("/api/tasks/{id}")).await;
        assert_eq!(task["status"], "started", "{task}");
        assert_eq!(task["fencing_token"], token, "{task}");
    }
}

#[tokio::test]
async fn either_token_opens_every_worker_route() {
    for token in [WORKER, ADMIN] {
        let api = locked(false).await;
        let (s, lease) = send(
            &api,
            Method::POST,
            "/api/leases",
            Some(token),
            json!({"resource": "app:held", "holder": "owner", "ttl_seconds": 300}),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{lease}");
        let (s, _) = send(
            &api,
            Method::POST,
            "/api/tasks/batch",
            Some(token),
            json!([{"task_data": {}}, {"task_data": {}}]),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED);
        let (s, claim) = send(
            &api,
            Method::POST,
            "/api/tasks/next",
            Some(token),
            json!({"processor": "w1"}),
        )
        .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{claim}");
        let (id, fence) = (
            claim["id"].as_i64().unwrap(),
            claim["fencing_token"].as_i64().unwrap(),
        );
        let held = json!({"processor": "w1", "fencing_token": fence});
        let (s, b) = send(
            &api,
            Method::PUT,
            &format!("/api/tasks/{id}/heartbeat"),
            Some(token),
            held.clone(),
        )
        .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{b}");
        let (s, b) = send(
            &api,
            Method::PUT,
            &format!("/api/tasks/{id}/complete"),
            Some(token),
            held,
        )
        .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{b}");
        let (s, claim) = send(
            &api,
            Method::POST,
            "/api/tasks/next",
            Some(token),
            json!({"processor": "w2"}),
        )
        .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{claim}");
        let (id, fence) = (
            claim["id"].as_i64().unwrap(),
            claim["fencing_token"].as_i64().unwrap(),
        );
        let (s, b) = send(
            &api,
            Method::PUT,
            &format!("/api/tasks/{id}/fail"),
            Some(token),
            json!({"processor": "w2", "fencing_token": fence, "error": "boom"}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        let (s, b) = send(
            &api,
            Method::PUT,
            "/api/workers/proc-1",
            Some(token),
            json!({"state": "idle", "fresh": true}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        let holder = json!({"resource": "app:held", "holder": "owner"});
        let (s, b) = send(
            &api,
            Method::PUT,
            "/api/leases/renew",
            Some(token),
            holder.clone(),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        let (s, b) = send(
            &api,
            Method::DELETE,
            "/api/leases/release",
            Some(token),
            holder.clone(),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        let (s, b) = send(
            &api,
            Method::DELETE,
            &format!("/api/leases/{}", lease["id"]),
            Some(token),
            holder,
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    // Snooze, on its own claim.
    let api = locked(false).await;
    let (id, fence) = claimed(&api).await;
    let (s, b) = send(
        &api,
        Method::PUT,
        &format!("/api/tasks/{id}/snooze"),
        Some(WORKER),
        json!({"processor": "w1", "fencing_token": fence, "seconds": 1}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
}

#[tokio::test]
async fn the_worker_token_never_opens_a_control() {
    let api = locked(false).await;
    let (id, _) = claimed(&api).await;
    let (_, task) = api.get(&format!("/api/tasks/{id}")).await;
    // A lease of the lease store to force-release (a task's claim has none).
    let lease = leasekeeper_core::lease::store::acquire(
        &mut api.db.pool.acquire().await.unwrap(),
        &Default::default(),
        &leasekeeper_core::lease::Resource::parse("job:held").unwrap(),
        &leasekeeper_core::lease::Holder::parse("h").unwrap(),
        std::time::Duration::from_secs(60),
    )
    .await
    .unwrap()
    .into_lease();
    let (lease_id, lease_token) = (lease.id, lease.fencing_token);
    let before = footprint(&api).await;
    let controls: Vec<(Method, String, Value)> = vec![
        (Method::POST, "/api/generator/start".into(), Value::Null),
        (Method::POST, "/api/workers".into(), Value::Null),
        (Method::POST, format!("/api/tasks/{id}/cancel"), Value::Null),
        (Method::POST, "/api/workflows/1/cancel".into(), Value::Null),
        (
            Method::POST,
            "/api/queues/default/pause".into(),
            Value::Null,
        ),
        (
            Method::POST,
            format!("/api/leases/{lease_id}/force-release"),
            json!({"fencing_token": lease_token}),
        ),
    ];
    for (method, uri, body) in &controls {
        let (s, err) = send(&api, method.clone(), uri, Some(WORKER), body.clone()).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{uri}: {err}");
        assert!(error_of(&err).contains("LEASEKEEPER_ADMIN_TOKEN"), "{err}");
        let (s, _) = send(&api, method.clone(), uri, None, body.clone()).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri}");
    }
    assert_eq!(footprint(&api).await, before);
    assert_eq!(
        api.get(&format!("/api/tasks/{id}")).await.1["status"],
        task["status"]
    );
    // The admin token opens them.
    let (s, b) = send(
        &api,
        Method::POST,
        &format!("/api/leases/{lease_id}/force-release"),
        Some(ADMIN),
        json!({"fencing_token": lease_token}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");

    // With only a worker token set, nothing opens a control: 403 naming
    // the setting that would.
    let api = Api::with_settings(|s| s.worker_token = Some(WORKER.into())).await;
    for token in [None, Some(WORKER)] {
        let (s, err) = send(
            &api,
            Method::POST,
            "/api/generator/start",
            token,
            Value::Null,
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{err}");
        assert!(error_of(&err).contains("LEASEKEEPER_ADMIN_TOKEN"), "{err}");
    }
}

#[tokio::test]
async fn the_library_s_own_leases_are_refused_to_everyone() {
    let api = locked(false).await;
    let (id, _) = claimed(&api).await;
    let before = footprint(&api).await;
    for resource in [
        format!("task:{id}"),
        "singleton:generator".to_string(),
        "singleton:maintenance".to_string(),
        "singleton:scheduler".to_string(),
        "queue:default".to_string(),
        "schedule:nightly".to_string(),
        "worker:w1".to_string(),
        "instance:i-test".to_string(),
    ] {
        let holder = json!({"resource": resource, "holder": "w1", "ttl_seconds": 86400});
        for token in [WORKER, ADMIN] {
            for (method, uri) in [
                (Method::POST, "/api/leases"),
                (Method::PUT, "/api/leases/renew"),
                (Method::DELETE, "/api/leases/release"),
                (Method::DELETE, "/api/leases/1"),
            ] {
                let (s, err) = send(&api, method.clone(), uri, Some(token), holder.clone()).await;
                assert_eq!(s, StatusCode::FORBIDDEN, "{method} {uri} {resource}: {err}");
                assert!(error_of(&err).contains("reserved prefix"), "{err}");
            }
        }
    }
    assert_eq!(
        footprint(&api).await,
        before,
        "a refused lease call left a row behind"
    );
    let (s, b) = send(
        &api,
        Method::POST,
        "/api/leases",
        Some(WORKER),
        json!({"resource": "app:x", "holder": "a"}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
}

#[tokio::test]
async fn beyond_loopback_reads_need_a_credential() {
    let api = locked(true).await;
    let (id, _) = claimed(&api).await;
    let reads = [
        "/api/tasks".to_string(),
        format!("/api/tasks/{id}"),
        "/api/workers".into(),
        "/api/leases".into(),
        "/api/overview".into(),
        "/api/audit".into(),
    ];
    for uri in &reads {
        let (s, err) = api.send_with(Method::GET, uri, &[], Body::empty()).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri}: {err}");
        let (s, _) = send(&api, Method::GET, uri, Some("wrong-token"), Value::Null).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{uri}");
        for token in [WORKER, ADMIN] {
            let (s, body) = send(&api, Method::GET, uri, Some(token), Value::Null).await;
            assert_eq!(s, StatusCode::OK, "{uri}: {body}");
        }
    }
    // The event stream too.
    assert_eq!(
        api.open("/api/events").await.status(),
        StatusCode::UNAUTHORIZED
    );
    // Public whatever the tokens.
    for uri in ["/healthz", "/readyz", "/metrics", "/api/openapi.json"] {
        let status = api.open(uri).await.status();
        assert!(status.is_success(), "{uri}: {status}");
    }
    // A page redirects to the sign-in; the sign-in page itself answers.
    let page = api.open("/tasks").await;
    assert!(page.status().is_redirection(), "{}", page.status());
    assert_eq!(page.headers()[header::LOCATION], "/signin");
    assert_eq!(api.open("/signin").await.status(), StatusCode::OK);
    // A server function that reads is refused; the sign-in's are not.
    let (s, _) = api
        .send_bytes(
            Method::POST,
            <leasekeeper::app::GetAccess as ServerFn>::PATH,
            &[],
            Body::empty(),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = api
        .send_bytes(
            Method::POST,
            <leasekeeper::app::GetAudit as ServerFn>::PATH,
            &[],
            Body::empty(),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    // On loopback the same server's reads stay open.
    let api = locked(false).await;
    assert_eq!(api.get("/api/tasks").await.0, StatusCode::OK);
}

/// Signs in with `token` through the dashboard's form: the answer's
/// status and its `Set-Cookie`, if any.
pub async fn sign_in(
    api: &Api,
    token: &str,
    extra: &[(&str, &str)],
) -> (StatusCode, Option<String>) {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(<SignIn as ServerFn>::PATH)
        .header("content-type", "application/x-www-form-urlencoded");
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let body = format!("token={}", token.replace(' ', "+"));
    let resp = api
        .app()
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let cookie = resp
        .headers()
        .get(header::SET_COOKIE)
        .map(|c| c.to_str().unwrap().to_string());
    (resp.status(), cookie)
}

/// The `name=value` part of a `Set-Cookie`.
pub fn cookie_pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().trim().to_string()
}

async fn start_generator(api: &Api, cookie: &str) -> StatusCode {
    api.send_bytes(
        Method::POST,
        <SetGenerator as ServerFn>::PATH,
        &[
            ("content-type", "application/x-www-form-urlencoded"),
            ("cookie", cookie),
        ],
        Body::from("action=start"),
    )
    .await
    .0
}

#[tokio::test]
async fn the_cookie_holds_a_session_that_sign_out_and_rotation_end() {
    let api = locked(true).await;
    let (s, set) = sign_in(&api, "not-the-admin-token", &[]).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(set.is_none(), "{set:?}");
    let (s, _) = sign_in(&api, WORKER, &[]).await;
    assert_eq!(
        s,
        StatusCode::UNAUTHORIZED,
        "the worker token signs nobody in"
    );

    let (s, set) = sign_in(&api, ADMIN, &[]).await;
    assert!(s.is_redirection() || s.is_success(), "{s}");
    let set = set.expect("a session cookie");
    assert!(set.starts_with("leasekeeper_session="), "{set}");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=86400"] {
        assert!(set.contains(attribute), "{set} lacks {attribute}");
    }
    assert!(!set.contains("Secure"), "plain http: {set}");
    assert!(
        !set.contains(ADMIN),
        "the cookie must not carry the token: {set}"
    );
    let cookie = cookie_pair(&set);
    let stored: Vec<Vec<u8>> = sqlx::query_scalar("SELECT id_hash FROM operator_sessions")
        .fetch_all(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(stored.len(), 1);
    let id = cookie.split_once('=').unwrap().1;
    assert_ne!(
        stored[0],
        id.as_bytes(),
        "the table keeps a hash, not the id"
    );

    // The session opens reads and controls.
    let (s, _) = api
        .send_with(
            Method::GET,
            "/api/tasks",
            &[("cookie", &cookie)],
            Body::empty(),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(start_generator(&api, &cookie).await, StatusCode::OK);
    let (s, _) = api
        .send_with(
            Method::DELETE,
            "/api/generator/stop",
            &[("cookie", &cookie)],
            Body::empty(),
        )
        .await;
    assert_eq!(s, StatusCode::OK);

    // Sign-out deletes it: the same cookie opens nothing any more.
    let resp = api
        .app()
        .oneshot(
            Request::builder()
                .method(Method::POST)
                .uri(<SignOut as ServerFn>::PATH)
                .header("content-type", "application/x-www-form-urlencoded")
                .header("cookie", &cookie)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let cleared = resp.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .to_string();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    assert_eq!(
        count(&api, "SELECT count(*) FROM operator_sessions").await,
        0
    );
    assert_eq!(
        start_generator(&api, &cookie).await,
        StatusCode::UNAUTHORIZED
    );
    let (s, _) = api
        .send_with(
            Method::GET,
            "/api/tasks",
            &[("cookie", &cookie)],
            Body::empty(),
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);

    // Over https (a proxy says so) the cookie is Secure.
    let (_, set) = sign_in(&api, ADMIN, &[("x-forwarded-proto", "https")]).await;
    let set = set.unwrap();
    assert!(set.contains("; Secure"), "{set}");
    let cookie = cookie_pair(&set);
    assert_eq!(start_generator(&api, &cookie).await, StatusCode::OK);

    // A rotated admin token ends the sessions made with the old one: a
    // server over the same database with another token refuses it.
    let same_db = crate::common::TestDb {
        options: api.db.options.clone(),
        pool: api.db.pool.clone(),
        plain: api.db.plain.clone(),
    };
    let settings = leasekeeper::settings::Settings::resolve(
        None,
        std::path::Path::new("none"),
        &leasekeeper::settings::SettingArgs::default(),
    )
    .unwrap();
    let rotated = Api::over(same_db, settings, |s| {
        s.admin_token = Some("a-rotated-admin-token-for-tests".into());
        s.worker_token = Some(WORKER.into());
    });
    assert_eq!(
        start_generator(&rotated, &cookie).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        start_generator(&api, &cookie).await,
        StatusCode::OK,
        "the old server still takes it"
    );
}

//! An in-process client for the router, shared by the REST tests.

use crate::common::TestDb;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use leasekeeper::server::{leptos_options, router};
use leasekeeper::settings::{SettingArgs, Settings};
use leasekeeper::state::AppState;
use leasekeeper::worker::fleet::{Fleet, FleetConfig};
use leasekeeper_core::worker::chaos::ChaosSettings;
use serde_json::Value;
use std::sync::Arc;
use tower::ServiceExt;

/// The whole router over a fresh database.
pub struct Api {
    app: axum::Router,
    /// The database behind it.
    pub db: TestDb,
    /// The instance's simulated workers (none until spawned).
    pub fleet: Fleet,
    /// The instance's live hub, detached: tests publish to it by hand.
    pub live: leasekeeper_core::live::LiveHub,
}

impl Api {
    pub async fn new() -> Self {
        Api::with_settings(|_| {}).await
    }

    /// An API whose settings `adjust` changed first (e.g. an admin token).
    pub async fn with_settings(adjust: impl FnOnce(&mut Settings)) -> Self {
        let settings =
            Settings::resolve(None, std::path::Path::new("none"), &SettingArgs::default()).unwrap();
        Api::over(TestDb::new().await, settings, adjust)
    }

    /// An API over `db` (its pool already in `settings.schema`).
    pub fn over(db: TestDb, settings: Settings, adjust: impl FnOnce(&mut Settings)) -> Self {
        Api::build(db, settings, adjust, None)
    }

    /// An API whose instance keeps a liveness session (as `serve` does),
    /// which vouches for its simulated workers and its worker processes'
    /// session streams; and that session.
    pub async fn vouched() -> (Self, leasekeeper_core::liveness::Liveness) {
        let db = TestDb::new().await;
        let liveness = leasekeeper_core::liveness::Liveness::start(
            (*db.pool.connect_options()).clone(),
            leasekeeper_core::db::Schema::of(&db.pool),
            Arc::from("i-test"),
            vec!["i-test".to_string()],
        )
        .await
        .unwrap();
        let settings =
            Settings::resolve(None, std::path::Path::new("none"), &SettingArgs::default()).unwrap();
        (Api::build(db, settings, |_| {}, Some(&liveness)), liveness)
    }

    fn build(
        db: TestDb,
        mut settings: Settings,
        adjust: impl FnOnce(&mut Settings),
        liveness: Option<&leasekeeper_core::liveness::Liveness>,
    ) -> Self {
        adjust(&mut settings);
        let instance_id: Arc<str> = Arc::from("i-test");
        let fleet = Fleet::new(
            db.pool.clone(),
            instance_id.clone(),
            FleetConfig {
                chaos: ChaosSettings::off(),
                ..FleetConfig::from_settings(&settings)
            },
            None,
        );
        let fleet = match liveness {
            Some(liveness) => fleet.vouched_by(liveness),
            None => fleet,
        };
        let live = leasekeeper_core::live::LiveHub::detached();
        let state = AppState {
            leptos_options: leptos_options(&settings),
            pool: db.pool.clone(),
            read_pool: leasekeeper::reads::read_pool(&db.pool),
            settings: Arc::new(settings),
            instance_id,
            fleet: fleet.clone(),
            generator: None,
            scheduler: None,
            live: live.clone(),
            overview: Default::default(),
        };
        Api {
            app: router(state),
            db,
            fleet,
            live,
        }
    }

    /// The router itself, for a test that sends its own requests.
    pub fn app(&self) -> axum::Router {
        self.app.clone()
    }

    /// Sends a request and hands back the streaming response.
    pub async fn open(&self, uri: &str) -> axum::response::Response {
        let req = Request::builder().uri(uri).body(Body::empty()).unwrap();
        self.app.clone().oneshot(req).await.unwrap()
    }

    pub async fn raw(&self, method: Method, uri: &str, body: Body) -> (StatusCode, Value) {
        self.send_with(method, uri, &[], body).await
    }

    /// Sends a request with extra headers (e.g. `Origin`).
    pub async fn send_with(
        &self,
        method: Method,
        uri: &str,
        headers: &[(&str, &str)],
        body: Body,
    ) -> (StatusCode, Value) {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        let (status, bytes) = self.send_bytes(method, uri, &all, body).await;
        let value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            panic!(
                "{uri}: body is not JSON: {}",
                String::from_utf8_lossy(&bytes)
            )
        });
        (status, value)
    }

    /// Sends a request with exactly `headers` and hands back the answer's
    /// raw body (server functions' answers are not all JSON objects).
    pub async fn send_bytes(
        &self,
        method: Method,
        uri: &str,
        headers: &[(&str, &str)],
        body: Body,
    ) -> (StatusCode, axum::body::Bytes) {
        let mut req = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let resp = self
            .app
            .clone()
            .oneshot(req.body(body).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.into_body().collect().await.unwrap().to_bytes())
    }

    /// GET one page of a list: status, body, and the next page's URI from
    /// the `Link` header, if any.
    pub async fn page(&self, uri: &str) -> (StatusCode, Value, Option<String>) {
        let resp = self.open(uri).await;
        let status = resp.status();
        let next = resp.headers().get("link").map(|l| {
            let l = l.to_str().unwrap();
            l.strip_prefix('<')
                .and_then(|l| l.strip_suffix(">; rel=\"next\""))
                .unwrap_or_else(|| panic!("Link header {l:?}"))
                .to_string()
        });
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        (status, serde_json::from_slice(&body).unwrap(), next)
    }

    /// Every row of every page of the list at `uri`, following the `Link`
    /// headers, and how many pages there were.
    pub async fn walk(&self, uri: &str) -> (Vec<Value>, usize) {
        let (mut rows, mut pages, mut next) = (Vec::new(), 0, Some(uri.to_string()));
        while let Some(uri) = next {
            let (s, body, more) = self.page(&uri).await;
            assert_eq!(s, StatusCode::OK, "{uri}: {body}");
            rows.extend(body.as_array().unwrap().iter().cloned());
            pages += 1;
            assert!(pages <= 100, "paging does not end");
            next = more;
        }
        (rows, pages)
    }

    pub async fn get(&self, uri: &str) -> (StatusCode, Value) {
        self.call(Method::GET, uri, None).await
    }

    /// Something real for bad input to aim at: a lease on `fuzz:held` held
    /// by `owner` for 300 s, and a pending task. Answers both as created.
    pub async fn held_lease_and_task(&self) -> (Value, Value) {
        let (s, lease) = self
            .post(
                "/api/leases",
                serde_json::json!({"resource": "fuzz:held", "holder": "owner", "ttl_seconds": 300}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{lease}");
        let (s, task) = self
            .post("/api/tasks", serde_json::json!({"task_data": {"n": 1}}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{task}");
        (lease, task)
    }

    pub async fn post(&self, uri: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, uri, Some(body)).await
    }

    pub async fn put(&self, uri: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::PUT, uri, Some(body)).await
    }

    pub async fn delete(&self, uri: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::DELETE, uri, Some(body)).await
    }

    pub async fn call(
        &self,
        method: Method,
        uri: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let body = body
            .map(|b| Body::from(b.to_string()))
            .unwrap_or_else(Body::empty);
        self.raw(method, uri, body).await
    }
}

pub fn error_of(v: &Value) -> &str {
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error field in {v}"))
}

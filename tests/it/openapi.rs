//! `GET /api/openapi.json` documents every REST route of the router, and
//! nothing it lacks.
//!
//! axum has no public list of a router's routes, so the routes are found
//! twice, independently of the document:
//! - in the source: every `.route("PATH", get(..).post(..))` call under
//!   `src/` (read when the test runs, so a new file counts too) gives the
//!   (method, path) pairs the program defines;
//! - in the running router: every documented operation is sent to the real
//!   router, and must reach a handler, not the "no such API route" 404 or
//!   the 405 of a path that lacks that method.
//!
//! The probes are side-effect free: the server has an admin token and the
//! probes carry none, so every operator, worker and producer route stops
//! at its 401 (which also checks that exactly those routes declare a
//! token), and every other route that changes something is sent no body,
//! so it stops at its 400.

use crate::api::Api;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use tower::ServiceExt;

/// HTTP methods as they appear in OpenAPI path items (and as axum's
/// routing functions are named).
const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Routes that are not routes of the API but its fallbacks: unknown `/api`
/// paths answer 404 with a JSON error.
const FALLBACKS: [(&str, &str); 2] = [("any", "/api"), ("any", "/api/{*rest}")];

/// One route: (method, path), lowercase method, axum's path syntax (which
/// is OpenAPI's for plain `{param}` segments).
type Route = (String, String);

/// The (method, path) pairs the document describes.
fn documented(doc: &Value) -> BTreeSet<Route> {
    let paths = doc["paths"].as_object().expect("paths is an object");
    paths
        .iter()
        .flat_map(|(path, item)| {
            let item = item.as_object().expect("a path item is an object");
            METHODS
                .iter()
                .filter(|m| item.contains_key(**m))
                .map(move |m| (m.to_string(), path.clone()))
        })
        .collect()
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// `line` without its `//` comment, if it has one (a `//` inside a string
/// literal, as in `"http://..."`, is not a comment).
fn without_comment(line: &str) -> &str {
    let mut in_string = false;
    let mut escaped = false;
    let mut previous = ' ';
    for (i, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            '/' if !in_string && previous == '/' => return &line[..i - 1],
            _ => {}
        }
        previous = c;
    }
    line
}

/// The (method, path) pairs of every `.route("PATH", METHOD_ROUTER)` call
/// in `source` (comments skipped). Panics on a call it cannot read, so a
/// route written some new way is not silently missed.
fn routes_in(file: &str, source: &str) -> Vec<Route> {
    let code: String = source
        .lines()
        .map(without_comment)
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find(".route(") {
        rest = &rest[at + ".route(".len()..];
        let args = rest.trim_start();
        let Some(after_quote) = args.strip_prefix('"') else {
            panic!("{file}: a .route( call whose path is not a string literal: {args:.60}");
        };
        let end = after_quote.find('"').expect("a closed string literal");
        let path = &after_quote[..end];
        // The method router: up to the `)` that closes `.route(`.
        let mut depth = 1;
        let tail = &after_quote[end + 1..];
        let close = tail
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map(|(i, _)| i)
            .expect("a closed .route( call");
        let router = &tail[..close];
        let methods: Vec<&str> = METHODS
            .iter()
            .chain(&["any"])
            .copied()
            .filter(|m| calls(router, m))
            .collect();
        assert!(
            !methods.is_empty(),
            "{file}: cannot tell the methods of route {path:?} from {router:?}; \
             teach tests/it/openapi.rs this way of writing a route"
        );
        found.extend(
            methods
                .into_iter()
                .map(|m| (m.to_string(), path.to_string())),
        );
        rest = &tail[close..];
    }
    found
}

/// Whether `code` calls a function named `name` (`get(`, `.post(`,
/// `axum::routing::put(`), not merely one whose name ends in it.
fn calls(code: &str, name: &str) -> bool {
    let pattern = format!("{name}(");
    code.match_indices(&pattern).any(|(i, _)| {
        code[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    })
}

/// The routes the program's source defines, fallbacks aside.
fn defined_in_source() -> BTreeSet<Route> {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let mut routes = BTreeSet::new();
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap();
        routes.extend(routes_in(&file.display().to_string(), &source));
    }
    for (method, path) in FALLBACKS {
        assert!(
            routes.remove(&(method.to_string(), path.to_string())),
            "the fallback {method} {path} is gone: update FALLBACKS"
        );
    }
    routes
}

#[test]
fn the_route_reader_reads_every_way_routes_are_written_here() {
    let source = r#"
        Router::new()
            .route("/api/a", get(list_all).post(acquire))
            // .route("/api/commented", get(nothing))
            .route("/api/d", get(d)) // .route("/api/trailing", get(nothing))
            .route(
                "/api/b/{id}",
                axum::routing::post(force_release),
            )
            .route("/api/c", get(get_one).delete(delete_one))
            .route("/api", any(no_such_route))
    "#;
    let want: Vec<Route> = [
        ("get", "/api/a"),
        ("post", "/api/a"),
        ("get", "/api/d"),
        ("post", "/api/b/{id}"),
        ("get", "/api/c"),
        ("delete", "/api/c"),
        ("any", "/api"),
    ]
    .iter()
    .map(|(m, p)| (m.to_string(), p.to_string()))
    .collect();
    assert_eq!(routes_in("example", source), want);
}

/// The document as served.
async fn served(api: &Api) -> Value {
    let resp = api.open("/api/openapi.json").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers()[header::CONTENT_TYPE],
        "application/json",
        "served as JSON"
    );
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let doc: Value = serde_json::from_slice(&bytes).expect("the document is JSON");
    assert_eq!(
        doc,
        serde_json::from_str::<Value>(leasekeeper::http::openapi::document()).unwrap(),
        "the route serves the document built once"
    );
    doc
}

#[tokio::test]
async fn the_document_has_exactly_the_routes_the_source_defines() {
    let api = Api::new().await;
    let doc = served(&api).await;
    let documented = documented(&doc);
    let defined = defined_in_source();
    let undocumented: Vec<_> = defined.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&defined).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "routes without documentation (add #[utoipa::path] to the handler and list it in \
         src/http/openapi.rs): {undocumented:?}; documented routes the source does not \
         define: {unknown:?}"
    );
    for required in ["/healthz", "/readyz", "/metrics", "/api/openapi.json"] {
        assert!(
            documented.iter().any(|(_, p)| p == required),
            "{required} is documented"
        );
    }
    assert!(
        !documented.iter().any(|(_, p)| p.starts_with("/sfn")),
        "server functions are internals, not documented"
    );
}

/// `path` with every `{param}` replaced by `1` (a valid row id and a valid
/// worker or instance name alike).
fn concrete(path: &str) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = open + rest[open..].find('}').expect("a closed {param}");
        out.push('1');
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

#[tokio::test]
async fn every_documented_operation_reaches_a_handler_of_the_router() {
    let api = Api::with_settings(|s| s.admin_token = Some("an-admin-token-for-tests".into())).await;
    let doc = served(&api).await;
    let mut problems = Vec::new();
    for (method, path) in documented(&doc) {
        let uri = concrete(&path);
        let req = Request::builder()
            .method(Method::from_bytes(method.to_uppercase().as_bytes()).unwrap())
            .uri(&uri)
            .body(Body::empty())
            .unwrap();
        // Only the status and, for a 404, the body are read: `/api/events`
        // never ends.
        let resp = api.app().oneshot(req).await.unwrap();
        let status = resp.status();
        if status == StatusCode::METHOD_NOT_ALLOWED {
            problems.push(format!(
                "{method} {uri}: the router has the path but not the method"
            ));
        }
        if status == StatusCode::NOT_FOUND {
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            let error = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_owned));
            if error.as_deref().is_none_or(|e| e == "no such API route") {
                problems.push(format!(
                    "{method} {uri}: the router has no such route (404 {})",
                    String::from_utf8_lossy(&bytes)
                ));
            }
        }
        let operation = &doc["paths"][&path][&method];
        let declares_token = operation["security"]
            .as_array()
            .is_some_and(|s| s.iter().any(|r| r.get("admin_token").is_some()));
        if status == StatusCode::UNAUTHORIZED {
            if !(declares_token && operation["responses"].get("401").is_some()) {
                problems.push(format!(
                    "{method} {path} needs the admin token: its documentation must say so \
                     (security admin_token and a 401 response)"
                ));
            }
        } else if declares_token && method != "get" {
            // A read's credential depends on where the server listens
            // (loopback here): every_read_declares_its_credential_… checks
            // reads beyond loopback.
            problems.push(format!(
                "{method} {path} declares the admin token but answered {status} without it"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[tokio::test]
async fn the_document_is_well_formed_openapi_3_1() {
    let api = Api::new().await;
    let doc = served(&api).await;
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1.")),
        "openapi version: {}",
        doc["openapi"]
    );
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    assert!(
        doc["info"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("/sfn")),
        "the description says server functions are left out"
    );
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["admin_token"]["type"], "http");
    assert_eq!(schemes["admin_token"]["scheme"], "bearer");
    let schemas = doc["components"]["schemas"]
        .as_object()
        .expect("components.schemas");
    let tags: BTreeSet<&str> = doc["tags"]
        .as_array()
        .expect("tags")
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();

    for (path, item) in doc["paths"].as_object().expect("paths") {
        assert!(path.starts_with('/'), "{path}");
        let item = item.as_object().unwrap();
        let operations: Vec<_> = METHODS.iter().filter_map(|m| item.get(*m)).collect();
        assert!(!operations.is_empty(), "{path} has no operation");
        for op in operations {
            let responses = op["responses"].as_object().expect("responses");
            assert!(!responses.is_empty(), "{path}: no responses");
            for (code, response) in responses {
                assert!(
                    code.len() == 3 && code.parse::<u16>().is_ok(),
                    "{path}: response key {code}"
                );
                assert!(
                    response["description"].is_string(),
                    "{path} {code}: a response needs a description"
                );
            }
            let op_tags = op["tags"].as_array().expect("every operation has a tag");
            assert!(
                op_tags.iter().all(|t| tags.contains(t.as_str().unwrap())),
                "{path}: tag not declared"
            );
            // Every `{param}` of the path is a declared path parameter.
            let declared: BTreeSet<&str> = op["parameters"]
                .as_array()
                .map(|ps| {
                    ps.iter()
                        .filter(|p| p["in"] == "path")
                        .map(|p| p["name"].as_str().unwrap())
                        .collect()
                })
                .unwrap_or_default();
            let in_path: BTreeSet<&str> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
                .collect();
            assert_eq!(declared, in_path, "{path}: path parameters");
        }
    }
    // Every reference points at a schema that exists.
    let text = doc.to_string();
    for piece in text.split("\"$ref\":\"").skip(1) {
        let target = &piece[..piece.find('"').unwrap()];
        let name = target
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("unexpected reference {target}"));
        assert!(schemas.contains_key(name), "dangling reference {target}");
    }
    // The shared types are described from the real types.
    for name in [
        "Lease",
        "Task",
        "LeaseEvent",
        "WorkerInfo",
        "Instance",
        "Overview",
        "ErrorBody",
    ] {
        assert!(schemas.contains_key(name), "schema {name}");
    }
    assert_eq!(
        schemas["ErrorBody"]["required"],
        serde_json::json!(["error"])
    );
}

/// The document's enums list exactly the texts the API sends and accepts.
#[tokio::test]
async fn every_enum_in_the_document_lists_the_texts_on_the_wire() {
    use leasekeeper_core::generator::Desired;
    use leasekeeper_core::lease::LeaseState;
    use leasekeeper_core::queue::TaskStatus;
    use leasekeeper_core::worker::{WorkerKind, WorkerState};
    let api = Api::new().await;
    let doc = served(&api).await;
    let wire: [(&str, Vec<&str>); 5] = [
        ("Desired", Desired::ALL.map(Desired::as_str).to_vec()),
        (
            "LeaseState",
            LeaseState::ALL.map(LeaseState::as_str).to_vec(),
        ),
        (
            "TaskStatus",
            TaskStatus::ALL.map(TaskStatus::as_str).to_vec(),
        ),
        (
            "WorkerKind",
            WorkerKind::ALL.map(WorkerKind::as_str).to_vec(),
        ),
        (
            "WorkerState",
            WorkerState::ALL.map(WorkerState::as_str).to_vec(),
        ),
    ];
    for (name, texts) in wire {
        let listed: Vec<&str> = doc["components"]["schemas"][name]["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("{name} has no enum in the document"))
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(listed, texts, "{name}");
    }
}

/// The limits the document writes as literals (utoipa's attributes take
/// no constants) are core's: each is read back from the document and
/// compared with the constant core's checks use, so a limit changed in
/// core fails here until the document says the same.
#[test]
fn the_documents_limits_are_cores_constants() {
    use leasekeeper_core::queue::{
        MAX_ATTEMPTS, MAX_CLAIM_KINDS, MAX_DELAY, MAX_ERROR_CHARS, MAX_NAME_CHARS, MAX_SNOOZE,
        MAX_UNIQUE_KEY_CHARS, NAME_PATTERN, TIMEOUTS, UNIQUE_PERIODS,
    };
    let doc: Value = serde_json::from_str(leasekeeper::http::openapi::document()).unwrap();
    let schemas = &doc["components"]["schemas"];
    let number = |schema: &str, field: &str, bound: &str| -> f64 {
        schemas[schema]["properties"][field][bound]
            .as_f64()
            .unwrap_or_else(|| panic!("{schema}.{field} has no {bound}"))
    };
    let enqueue = "EnqueueBody";
    let cases: Vec<(&str, &str, &str, f64)> = vec![
        (enqueue, "max_attempts", "minimum", 1.0),
        (enqueue, "max_attempts", "maximum", f64::from(MAX_ATTEMPTS)),
        (enqueue, "delay_seconds", "minimum", 0.0),
        (enqueue, "delay_seconds", "maximum", MAX_DELAY.as_secs_f64()),
        (
            enqueue,
            "timeout_seconds",
            "minimum",
            TIMEOUTS.start().as_secs_f64(),
        ),
        (
            enqueue,
            "timeout_seconds",
            "maximum",
            TIMEOUTS.end().as_secs_f64(),
        ),
        (
            enqueue,
            "unique_period_seconds",
            "minimum",
            UNIQUE_PERIODS.0.as_secs_f64(),
        ),
        (
            enqueue,
            "unique_period_seconds",
            "maximum",
            UNIQUE_PERIODS.1.as_secs_f64(),
        ),
        (
            enqueue,
            "unique_key",
            "maxLength",
            MAX_UNIQUE_KEY_CHARS as f64,
        ),
        ("SnoozeBody", "seconds", "minimum", 0.0),
        ("SnoozeBody", "seconds", "maximum", MAX_SNOOZE.as_secs_f64()),
        (
            "WorkflowBody",
            "tasks",
            "maxItems",
            leasekeeper_core::workflow::MAX_WORKFLOW_TASKS as f64,
        ),
        ("WorkflowBody", "tasks", "minItems", 1.0),
        (
            "WaitBody",
            "timeout_seconds",
            "maximum",
            leasekeeper_core::queue::store::MAX_WAIT.as_secs_f64(),
        ),
        ("FailBody", "error", "maxLength", MAX_ERROR_CHARS as f64),
        ("ScheduleBody", "max_attempts", "minimum", 1.0),
        (
            "ScheduleBody",
            "max_attempts",
            "maximum",
            f64::from(MAX_ATTEMPTS),
        ),
    ];
    for (schema, field, bound, core) in cases {
        assert_eq!(
            number(schema, field, bound),
            core,
            "{schema}.{field}.{bound}"
        );
    }
    // The kind and queue rule is written once, from core's constants.
    assert_eq!(schemas["TaskName"]["maxLength"], MAX_NAME_CHARS);
    assert_eq!(schemas["TaskName"]["pattern"], NAME_PATTERN);
    let kinds = &schemas["ClaimRequest"]["properties"]["kinds"];
    assert_eq!(kinds["maxItems"], MAX_CLAIM_KINDS, "{kinds}");
    assert_eq!(kinds["items"]["maxLength"], MAX_NAME_CHARS, "{kinds}");
}

/// Every operation that changes something names its credential and its
/// 401; the worker and producer routes name both tokens, and answer the
/// worker token past their 401 (a bodiless probe stops at its 400); the
/// operator routes name only the admin token, and refuse the worker one.
#[tokio::test]
async fn every_write_declares_its_credential_and_its_401() {
    const ADMIN: &str = "an-admin-token-for-tests";
    const WORKER: &str = "a-worker-token-for-tests";
    let api = Api::with_settings(|s| {
        s.admin_token = Some(ADMIN.into());
        s.worker_token = Some(WORKER.into());
    })
    .await;
    let doc = served(&api).await;
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["worker_token"]["scheme"], "bearer");
    let mut problems = Vec::new();
    let mut worker_routes = 0;
    for (method, path) in documented(&doc) {
        if method == "get" {
            continue;
        }
        let operation = &doc["paths"][&path][&method];
        let names = |scheme: &str| {
            operation["security"]
                .as_array()
                .is_some_and(|s| s.iter().any(|r| r.get(scheme).is_some()))
        };
        if !names("admin_token") || operation["responses"].get("401").is_none() {
            problems.push(format!(
                "{method} {path}: no security requirement with a 401"
            ));
            continue;
        }
        let req = Request::builder()
            .method(Method::from_bytes(method.to_uppercase().as_bytes()).unwrap())
            .uri(concrete(&path))
            .header(header::AUTHORIZATION, format!("Bearer {WORKER}"))
            .body(Body::empty())
            .unwrap();
        let status = api.app().oneshot(req).await.unwrap().status();
        if names("worker_token") {
            worker_routes += 1;
            if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                problems.push(format!(
                    "{method} {path} declares the worker token but refused it ({status})"
                ));
            }
        } else if status != StatusCode::FORBIDDEN {
            problems.push(format!(
                "{method} {path} is an operator route but answered the worker token {status}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Enqueue (2), a workflow, claim, heartbeat, complete, snooze, wait,
    // signal, fail, report, the session stream, and the four application
    // lease routes.
    assert_eq!(worker_routes, 16, "the worker and producer routes");
}

/// Every read (but the document itself) declares the 401 it answers when
/// the server is locked beyond loopback, the 503 of the read timeout, and
/// that either token opens it; and on such a server an anonymous read does
/// answer 401, while one with the worker token gets past it.
#[tokio::test]
async fn every_read_declares_its_credential_its_401_and_its_503() {
    const ADMIN: &str = "an-admin-token-for-tests";
    const WORKER: &str = "a-worker-token-for-tests";
    let api = Api::with_settings(|s| {
        s.admin_token = Some(ADMIN.into());
        s.worker_token = Some(WORKER.into());
        s.site_addr = "0.0.0.0:3000".parse().unwrap();
    })
    .await;
    let doc = served(&api).await;
    let mut problems = Vec::new();
    let mut reads = 0;
    for (method, path) in documented(&doc) {
        if method != "get" || !path.starts_with("/api/") || path == "/api/openapi.json" {
            continue;
        }
        reads += 1;
        let operation = &doc["paths"][&path]["get"];
        let security = operation["security"].as_array();
        for scheme in ["worker_token", "admin_token"] {
            if !security.is_some_and(|s| s.iter().any(|r| r.get(scheme).is_some())) {
                problems.push(format!("GET {path}: does not name {scheme}"));
            }
        }
        for status in ["401", "503"] {
            if operation["responses"].get(status).is_none() {
                problems.push(format!("GET {path}: no {status} answer"));
            }
        }
        let status_with = |token: Option<&str>| {
            let mut req = Request::builder().uri(concrete(&path));
            if let Some(token) = token {
                req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
            }
            let req = req.body(Body::empty()).unwrap();
            let app = api.app();
            async move { app.oneshot(req).await.unwrap().status() }
        };
        let anonymous = status_with(None).await;
        if anonymous != StatusCode::UNAUTHORIZED {
            problems.push(format!(
                "GET {path}: {anonymous} to an anonymous read beyond loopback"
            ));
        }
        let worker = status_with(Some(WORKER)).await;
        if worker == StatusCode::UNAUTHORIZED || worker == StatusCode::FORBIDDEN {
            problems.push(format!("GET {path}: {worker} with the worker token"));
        }
    }
    assert!(reads > 20, "only {reads} reads documented");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

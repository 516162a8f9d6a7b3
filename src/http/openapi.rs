//! `GET /api/openapi.json`: the REST API described as OpenAPI 3.1, derived
//! by `utoipa` from the handlers' own `#[utoipa::path]` annotations and the
//! types they read and answer (`ToSchema` on [`Lease`](leasekeeper_core::lease::Lease),
//! [`Task`](leasekeeper_core::queue::Task), the body structs, ...), so a field added to
//! a type shows up in the document without a second edit.
//!
//! Every REST route is listed in [`ApiDoc`]'s `paths`; the integration test
//! `tests/it/openapi.rs` checks that against the router and the route
//! definitions in `src/http/`, both ways.

use super::{
    audit, events, generator, health, instances, leases, metrics, overview, queues, schedules,
    tasks, workers, workflows,
};
use crate::error::ErrorBody;
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use leasekeeper_core::json::{STORABLE_JSON, storable_json};
use std::sync::LazyLock;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// The document's description: what it covers and the rules every route shares.
const DESCRIPTION: &str = "\
Time-bound leases in PostgreSQL with fencing tokens, a leased task queue, \
workers, instances and a lease-guarded generator.

This document covers every REST route: everything under `/api`, plus \
`/healthz`, `/readyz` and `/metrics`. The dashboard's server functions \
(`/sfn/...`) are its internals, not a public API, and are left out.

**Errors** are JSON `{\"error\": \"...\"}`: 400 for bad input, 404, 409, \
413 for bodies over 64 KiB (16 MiB for `POST /api/tasks/batch`), 500 with a generic message (details go to the \
server's log). An unknown `/api` path answers 404, a known path with another \
method 405, both with the same body.

**Cross-site requests.** A request that changes something (POST, PUT, \
PATCH, DELETE) and carries an `Origin` other than the server's own, or \
`Sec-Fetch-Site: cross-site`, gets 403. Clients that send no `Origin` are \
unaffected.

**Host.** Every route, reads included, answers 421 to a request whose \
`Host` is a DNS name the server was not told about: IP addresses, \
`localhost` and `*.localhost` are always answered, other names only when \
listed in `LEASEKEEPER_ALLOWED_HOSTS`. A DNS-rebinding page cannot pass it.

**JSON bodies** must be sent with `Content-Type: application/json` \
(parameters such as `charset` allowed, or another `application/*+json`), \
else 415: a cross-site HTML form cannot send that type.

**Paging.** Every list answers a JSON array, newest first, at most `limit` \
rows (default 100, up to 1000), and, when older rows remain, a header \
`Link: </api/tasks?status=failed&before=812&limit=100>; rel=\"next\"` naming \
the next page. The cursor `before` is an id (a sequence number `seq` for \
workers and instances), so a page does not shift while new rows arrive. \
Lease and task lists also take `after=ID` instead, oldest first, without a \
`Link` header; `before` and `after` together are refused.

**Credentials** travel as `Authorization: Bearer <token>`. The admin \
token (`LEASEKEEPER_ADMIN_TOKEN`, scheme `admin_token`) opens everything; \
the worker token (`LEASEKEEPER_WORKER_TOKEN`, scheme `worker_token`) opens \
the worker and producer routes: enqueue (one and batch), claim, heartbeat, \
complete, snooze, fail, a worker's report, and the application lease \
routes. With either token set, those answer 401 without a credential, \
before anything is read or recorded. With neither set (possible only on \
loopback) everything is open.

**Operator routes** (generator start/stop, worker spawn/pause/kill, \
instance kill, force-release, task cancel/retry, queue pause/resume, every schedule change) need the admin token when \
the server has one, else 401; the worker token gets 403, and so does \
everyone when only a worker token is set. Each writes an \
`operator` row to `lease_events` in the action's own transaction \
(`GET /api/audit`).

**Reads** (every other `GET /api/...` and `/api/events`) need either token \
when one is set and the server listens beyond loopback (401 otherwise). \
`/healthz`, `/readyz`, `/metrics` and this document are always public.

**Reserved resources.** `/api/leases` acquire, renew, release and delete \
refuse resources under `task:`, `singleton:`, `queue:`, `schedule:`, \
`worker:` and `instance:` with 403, for every caller: those are the \
library's own leases and audit trails.";

/// The OpenAPI document of the REST API.
#[derive(OpenApi)]
#[openapi(
    info(title = "leasekeeper", description = DESCRIPTION),
    paths(
        leases::list_all,
        leases::acquire,
        leases::list_active,
        leases::list_expired,
        leases::list_renewed,
        leases::list_released,
        leases::renew,
        leases::release,
        leases::get_one,
        leases::delete_one,
        leases::events,
        leases::force_release,
        tasks::reads::list_all,
        tasks::enqueue::enqueue,
        tasks::enqueue::enqueue_batch,
        tasks::reads::list_pending,
        tasks::reads::list_started,
        tasks::reads::list_processed,
        tasks::reads::list_failed,
        tasks::reads::failed_summary,
        tasks::work::claim_next,
        tasks::reads::get_one,
        tasks::work::heartbeat,
        tasks::work::complete,
        tasks::work::fail,
        tasks::work::snooze,
        tasks::work::wait,
        tasks::work::signal,
        tasks::reads::events,
        tasks::reads::attempts,
        tasks::controls::cancel_one,
        tasks::controls::retry_one,
        tasks::controls::release_one,
        tasks::controls::cancel_matching,
        tasks::controls::retry_matching,
        workers::list,
        workers::spawn,
        workers::get_one,
        workers::report,
        workers::pause,
        workers::kill,
        workers::session,
        generator::status,
        generator::start,
        generator::stop,
        queues::list,
        queues::get_one,
        queues::pause,
        queues::resume,
        queues::set_limits,
        workflows::enqueue,
        workflows::list,
        workflows::get_one,
        workflows::cancel,
        schedules::list,
        schedules::get_one,
        schedules::declare,
        schedules::ticks,
        schedules::pause,
        schedules::resume,
        schedules::trigger,
        schedules::delete_one,
        instances::list,
        instances::kill,
        overview::overview,
        audit::audit,
        events::events,
        health::healthz,
        health::readyz,
        metrics::render,
        openapi_json,
    ),
    components(schemas(ErrorBody)),
    modifiers(&AdminToken),
    tags(
        (name = "leases", description = "The lease service: acquire, renew, release, with fencing tokens"),
        (name = "tasks", description = "The task queue: every claim is a lease on `task:<id>`"),
        (name = "workers", description = "Simulated workers and worker processes"),
        (name = "generator", description = "The lease-guarded task generator"),
        (name = "queues", description = "Queues: their depth and throughput, the operator's pause, and their limits"),
        (name = "workflows", description = "Tasks that wait for tasks: one call enqueues them all; outputs handed on; a parent's failure cascades"),
        (name = "schedules", description = "Cron-declared periodic tasks, each tick fired once under the scheduler's fenced lease"),
        (name = "instances", description = "The leasekeeper processes sharing the database"),
        (name = "overview", description = "Counts, throughput, the split-brain check"),
        (name = "audit", description = "Operator actions"),
        (name = "events", description = "Live updates as server-sent events"),
        (name = "health", description = "Liveness and readiness"),
        (name = "metrics", description = "Prometheus metrics"),
        (name = "openapi", description = "This document"),
    )
)]
pub struct ApiDoc;

/// Adds the `admin_token` and `worker_token` bearer schemes the routes
/// name, and the
/// [`STORABLE_JSON`] component.
struct AdminToken;

impl Modify for AdminToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut bearer = Http::new(HttpAuthScheme::Bearer);
        bearer.description = Some(
            "The server's `LEASEKEEPER_ADMIN_TOKEN`, needed by operator routes only when one is set"
                .into(),
        );
        components.add_security_scheme("admin_token", SecurityScheme::Http(bearer));
        let mut worker = Http::new(HttpAuthScheme::Bearer);
        worker.description = Some(
            "The server's `LEASEKEEPER_WORKER_TOKEN`: the worker and producer routes (the admin token opens them too), needed when either token is set"
                .into(),
        );
        components.add_security_scheme("worker_token", SecurityScheme::Http(worker));
        components
            .schemas
            .insert(STORABLE_JSON.to_string(), storable_json(true));
    }
}

/// The query parameters whose value is JSON text: the task lists' `data`.
/// utoipa can only give a parameter a `schema`, which for an object means
/// form fields (`?customer=7`); OpenAPI says a parameter sent as JSON text
/// by `content` instead, which [`json_query_parameters`] writes in.
const JSON_QUERY_PARAMETERS: &[&str] = &["data"];

/// `doc` with each query parameter of [`JSON_QUERY_PARAMETERS`] described
/// as `content: {"application/json": {"schema": ...}}`: a JSON object whose
/// values are [`STORABLE_JSON`], at most 16 fields.
fn json_query_parameters(mut doc: serde_json::Value) -> serde_json::Value {
    use serde_json::json;
    let object = json!({
        "type": "object",
        "maxProperties": 16,
        "propertyNames": {"type": "string", "pattern": "^[^\\x00]*$", "maxLength": 64},
        "additionalProperties": {"$ref": format!("#/components/schemas/{STORABLE_JSON}")},
    });
    let Some(paths) = doc["paths"].as_object_mut() else {
        return doc;
    };
    for operation in paths.values_mut().filter_map(|p| p.as_object_mut()) {
        for op in operation.values_mut() {
            let Some(params) = op
                .get_mut("parameters")
                .and_then(serde_json::Value::as_array_mut)
            else {
                continue;
            };
            for param in params.iter_mut() {
                let json_text = param["in"] == "query"
                    && param["name"]
                        .as_str()
                        .is_some_and(|n| JSON_QUERY_PARAMETERS.contains(&n));
                if let (true, Some(p)) = (json_text, param.as_object_mut()) {
                    p.remove("schema");
                    p.insert(
                        "content".into(),
                        json!({"application/json": {"schema": object.clone()}}),
                    );
                }
            }
        }
    }
    doc
}

/// `doc` with the 421 of [`super::perimeter`] on every operation: any
/// route answers it to a `Host` the server does not answer for.
fn misdirected_everywhere(mut doc: serde_json::Value) -> serde_json::Value {
    let answer = serde_json::json!({
        "description": "The `Host` is a DNS name this server does not answer for (not an IP address, not `localhost`, not in `LEASEKEEPER_ALLOWED_HOSTS`): the DNS-rebinding fence",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    });
    let Some(paths) = doc["paths"].as_object_mut() else {
        return doc;
    };
    for item in paths.values_mut().filter_map(|p| p.as_object_mut()) {
        for op in item.values_mut() {
            if let Some(responses) = op
                .get_mut("responses")
                .and_then(serde_json::Value::as_object_mut)
            {
                responses.insert("421".into(), answer.clone());
            }
        }
    }
    doc
}

/// Adds to every read (a `GET /api/…` but this document's own) what every read
/// may answer whatever its route: 401 when the server is locked and
/// listens beyond loopback (`crate::auth::reads_need_a_credential`), 503
/// past the read timeout (`crate::reads`), and the credentials it then
/// takes (none on loopback, either token beyond).
fn reads_everywhere(mut doc: serde_json::Value) -> serde_json::Value {
    let unauthorized = serde_json::json!({
        "description": "The server is locked (a token is set) and listens beyond loopback: reads need either token (or a dashboard session)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    });
    let unavailable = serde_json::json!({
        "description": "The read ran past the read timeout (`LEASEKEEPER_READ_TIMEOUT_SECS`), or every read connection is busy: try again, or read less",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    });
    let security = serde_json::json!([{}, {"worker_token": []}, {"admin_token": []}]);
    let Some(paths) = doc["paths"].as_object_mut() else {
        return doc;
    };
    for (path, item) in paths.iter_mut() {
        // Health, readiness and metrics stay public, as does this document.
        if !path.starts_with("/api/") || path == "/api/openapi.json" {
            continue;
        }
        let Some(read) = item
            .get_mut("get")
            .and_then(serde_json::Value::as_object_mut)
        else {
            continue;
        };
        read.entry("security").or_insert_with(|| security.clone());
        if let Some(responses) = read
            .get_mut("responses")
            .and_then(serde_json::Value::as_object_mut)
        {
            responses
                .entry("401")
                .or_insert_with(|| unauthorized.clone());
            responses
                .entry("503")
                .or_insert_with(|| unavailable.clone());
        }
    }
    doc
}

/// The document as JSON, built once.
pub fn document() -> &'static str {
    static JSON: LazyLock<String> = LazyLock::new(|| {
        // Serialising a tree of strings, maps and numbers cannot fail.
        serde_json::to_value(ApiDoc::openapi())
            .map(json_query_parameters)
            .map(misdirected_everywhere)
            .map(reads_everywhere)
            .and_then(|doc| serde_json::to_string_pretty(&doc))
            .unwrap_or_else(|e| {
                format!("{{\"error\": \"cannot render the OpenAPI document: {e}\"}}")
            })
    });
    &JSON
}

#[utoipa::path(
    get,
    path = "/api/openapi.json",
    tag = "openapi",
    summary = "This document",
    responses((status = 200, description = "The OpenAPI 3.1 document of the REST API", content_type = "application/json", body = Object))
)]
async fn openapi_json() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], document())
}

/// The route of the document.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/api/openapi.json", get(openapi_json))
}

//! Bad input against every REST route that takes an id or a body: wrong
//! types, missing fields, over-long and huge strings, NUL and invalid UTF-8,
//! negative and huge numbers and ids, non-JSON and oversized bodies, plus a
//! few hundred random bodies per route from a seeded generator. Every answer
//! must be a JSON `{error}` with 400, 404, 405, 409 or 413 (never a 5xx, never
//! a success), and nothing in the database may change (a refused stale
//! write is still recorded as `stale_write_refused`: history, not data).

use crate::api::Api;
use axum::body::Body;
use axum::http::{Method, StatusCode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

/// The routes that read an id from the path or a JSON body. `{id}` is
/// replaced by each id under test; `{lease}`, `{task}` by real ones.
const ROUTES: &[(&str, &str)] = &[
    ("POST", "/api/leases"),
    ("PUT", "/api/leases/renew"),
    ("DELETE", "/api/leases/release"),
    ("GET", "/api/leases/{id}"),
    ("DELETE", "/api/leases/{id}"),
    ("DELETE", "/api/leases/{lease}"),
    ("POST", "/api/leases/{id}/force-release"),
    ("POST", "/api/leases/{lease}/force-release"),
    ("POST", "/api/tasks"),
    ("POST", "/api/tasks/next"),
    ("GET", "/api/tasks/{id}"),
    ("PUT", "/api/tasks/{id}/heartbeat"),
    ("PUT", "/api/tasks/{task}/heartbeat"),
    ("PUT", "/api/tasks/{id}/complete"),
    ("PUT", "/api/tasks/{task}/complete"),
    ("PUT", "/api/tasks/{id}/fail"),
    ("PUT", "/api/tasks/{task}/fail"),
    ("POST", "/api/tasks/{id}/release"),
    ("GET", "/api/workers/{id}"),
    ("PUT", "/api/workers/{id}"),
    ("POST", "/api/workers/{id}/pause"),
    ("POST", "/api/workers/{id}/kill"),
    ("POST", "/api/instances/{id}/kill"),
];

/// Ids that are not ids of anything: negative, zero, past i64 (and one
/// that fits but names no row),
/// not numbers, NUL, very long.
fn bad_ids() -> Vec<String> {
    vec![
        "0".into(),
        "-1".into(),
        "2147483648".into(),
        "9223372036854775808".into(),
        "99999999999999999999".into(),
        "abc".into(),
        "1.5".into(),
        "%00".into(),
        "%FF%FE".into(),
        "x".repeat(3000),
    ]
}

/// Bodies that are wrong whatever the route wants.
fn bad_bodies() -> Vec<(String, Vec<u8>)> {
    let mut bodies: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), Vec::new()),
        ("not JSON".into(), b"not json".to_vec()),
        ("truncated JSON".into(), b"{\"resource\": \"a\"".to_vec()),
        ("null".into(), b"null".to_vec()),
        ("an array".into(), b"[1, 2]".to_vec()),
        ("a string".into(), b"\"resource\"".to_vec()),
        (
            "invalid UTF-8".into(),
            b"{\"resource\": \"\xff\xfe\", \"holder\": \"\xc0\"}".to_vec(),
        ),
        (
            "oversized (70 KiB)".into(),
            json!({"resource": "r".repeat(70 * 1024)})
                .to_string()
                .into_bytes(),
        ),
    ];
    let json_bodies = [
        ("no fields", json!({})),
        (
            "wrong types",
            json!({"resource": 1, "holder": [], "ttl_seconds": "ten", "processor": {},
                   "fencing_token": "1", "task_data": 5, "max_attempts": "x",
                   "delay_seconds": "soon", "error": 5, "task_output": 1, "state": 3}),
        ),
        (
            "over-long names",
            json!({"resource": "r".repeat(300), "holder": "h".repeat(300),
                   "processor": "p".repeat(300), "fencing_token": 1, "error": "e"}),
        ),
        (
            "NUL in names",
            json!({"resource": "a\u{0}b", "holder": "h\u{0}", "processor": "p\u{0}",
                   "fencing_token": 1, "error": "e\u{0}"}),
        ),
        (
            "negative numbers",
            json!({"resource": "r", "holder": "h", "ttl_seconds": -1, "processor": "",
                   "fencing_token": -1, "max_attempts": -3, "delay_seconds": -5,
                   "task_data": {}, "error": "e"}),
        ),
        (
            "huge numbers",
            json!({"resource": "r", "holder": "h", "ttl_seconds": 1e300, "processor": "",
                   "fencing_token": 1e30, "max_attempts": 2147483648u64,
                   "delay_seconds": 1e300, "task_data": {}, "error": "e"}),
        ),
        (
            "numbers past i64",
            json!({"resource": "r", "holder": "h", "ttl_seconds": u64::MAX, "processor": "",
                   "fencing_token": u64::MAX, "max_attempts": u64::MAX, "task_data": {}}),
        ),
        (
            "deep nesting",
            serde_json::from_str(&format!("{}{}", "[".repeat(2000), "]".repeat(2000)))
                .unwrap_or(Value::Null),
        ),
    ];
    for (name, body) in json_bodies {
        bodies.push((name.into(), body.to_string().into_bytes()));
    }
    bodies.push((
        "i64 overflow literal".into(),
        br#"{"resource": "r", "holder": "h", "ttl_seconds": 9223372036854775808, "processor": "", "fencing_token": 9223372036854775808, "max_attempts": 9223372036854775808, "task_data": {}}"#.to_vec(),
    ));
    bodies
}

/// A random JSON body: some of the fields the routes know, each with a
/// value of a random kind (or a random unknown field).
fn random_body(rng: &mut StdRng) -> Value {
    const FIELDS: &[&str] = &[
        "resource",
        "holder",
        "ttl_seconds",
        "processor",
        "fencing_token",
        "task_data",
        "task_output",
        "max_attempts",
        "delay_seconds",
        "error",
        "state",
        "fresh",
        "duration_seconds",
    ];
    let mut body = serde_json::Map::new();
    for _ in 0..rng.random_range(0..6) {
        let key = if rng.random_bool(0.9) {
            FIELDS[rng.random_range(0..FIELDS.len())].to_string()
        } else {
            format!("k{}", rng.random::<u16>())
        };
        body.insert(key, random_value(rng, 2));
    }
    Value::Object(body)
}

fn random_value(rng: &mut StdRng, depth: u32) -> Value {
    match rng.random_range(0..10) {
        0 => Value::Null,
        1 => json!(rng.random_bool(0.5)),
        2 => json!(rng.random::<i64>()),
        3 => json!(-rng.random_range(0..1000)),
        4 => json!(rng.random::<f64>() * 1e12),
        5 => json!("x".repeat(rng.random_range(0..400))),
        6 => json!(""),
        7 => json!("\u{0}\u{7f}\u{202e}"),
        8 if depth > 0 => json!([random_value(rng, depth - 1)]),
        _ if depth > 0 => json!({"k": random_value(rng, depth - 1)}),
        _ => json!(0),
    }
}

/// Everything a bad request must not change.
async fn snapshot(api: &Api) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT coalesce(md5(string_agg(l::text, ',' ORDER BY id)), '') FROM leases l
         UNION ALL SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY id)), '') FROM tasks t
         UNION ALL SELECT count(*)::text FROM lease_events WHERE kind <> 'stale_write_refused'
         UNION ALL SELECT count(*)::text FROM workers
         UNION ALL SELECT coalesce(md5(string_agg(g::text, ',')), '') FROM generator_state g",
    )
    .fetch_all(&api.db.pool)
    .await
    .unwrap()
}

fn allowed(status: StatusCode) -> bool {
    matches!(status.as_u16(), 400 | 404 | 405 | 409 | 413)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_on_every_route_is_refused_cleanly_and_changes_nothing() {
    let api = Api::new().await;
    // Something real to aim at: a held lease and a claimed task.
    let (lease, task) = api.held_lease_and_task().await;
    let (s, claimed) = api
        .post("/api/tasks/next", json!({"processor": "owner"}))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{claimed}");
    let lease_id = lease["id"].to_string();
    let task_id = task["id"].to_string();
    let before = snapshot(&api).await;

    let mut rng = StdRng::seed_from_u64(0x1ea5e);
    let mut checked = 0usize;
    let mut failures = Vec::new();
    for (method, template) in ROUTES {
        let method: Method = method.parse().unwrap();
        let mut cases: Vec<(String, String, Vec<u8>)> = Vec::new();
        let paths: Vec<(String, String)> = if template.contains("{id}") {
            bad_ids()
                .into_iter()
                .map(|id| (format!("id {:.20}", id), template.replace("{id}", &id)))
                .collect()
        } else {
            let path = template
                .replace("{lease}", &lease_id)
                .replace("{task}", &task_id);
            vec![("real id".to_string(), path)]
        };
        for (what, path) in &paths {
            // A bad id with a plausible body, and with every bad body.
            if template.contains("{id}") {
                let plausible = json!({"resource": "fuzz:held", "holder": "owner", "processor": "owner",
                                   "fencing_token": 1, "error": "e", "task_output": null});
                cases.push((
                    format!("{what}, plausible body"),
                    path.clone(),
                    plausible.to_string().into_bytes(),
                ));
            }
            for (name, body) in bad_bodies() {
                cases.push((format!("{what}, {name}"), path.clone(), body));
            }
        }
        for (what, path, body) in cases {
            if method == Method::GET && !body.is_empty() {
                continue;
            }
            let (status, answer) = api.raw(method.clone(), &path, Body::from(body)).await;
            checked += 1;
            let has_error = answer["error"].as_str().is_some_and(|e| !e.is_empty());
            if !allowed(status) || !has_error {
                failures.push(format!(
                    "{method} {path:.80} ({what}): {status} {answer:.200}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} refused badly:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 1000, "only {checked} requests");
    assert_eq!(
        snapshot(&api).await,
        before,
        "a refused request changed the database"
    );

    // Random bodies (seeded): some are valid requests (unknown fields are
    // ignored, any JSON is valid task data), so success is allowed here;
    // what is not is a 5xx, a panic, or an error that is not a JSON
    // `{error}` with one of the statuses above.
    let mut failures = Vec::new();
    for (method, template) in ROUTES.iter().filter(|(_, t)| !t.contains("{id}")) {
        let method: Method = method.parse().unwrap();
        let path = template
            .replace("{lease}", &lease_id)
            .replace("{task}", &task_id);
        for n in 0..150 {
            let body = random_body(&mut rng);
            let (status, answer) = api
                .raw(method.clone(), &path, Body::from(body.to_string()))
                .await;
            let has_error = answer["error"].as_str().is_some_and(|e| !e.is_empty());
            let answered_well = status.is_success() || (allowed(status) && has_error);
            if !answered_well {
                failures.push(format!(
                    "{method} {path} (random #{n}: {body:.200}): {status} {answer:.200}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} random bodies answered badly:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

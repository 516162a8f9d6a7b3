//! Bad input against every server function (the dashboard's `/sfn/...`
//! endpoints), taken from the server function registry so a new one is
//! covered without being listed here: empty, garbage, invalid UTF-8,
//! oversized and JSON bodies; for the functions listed in [`KNOWN`], every
//! argument missing or of the wrong type (ids that are not positive `i64`s,
//! NUL, 3000-character and 70 KiB strings, unknown enum variants); then a
//! few hundred random bodies from a seeded generator.
//!
//! Every answer must be a success (where the body happens to be a valid
//! call) or an error the client can act on: 400, 401, 404, 409 or 413 with
//! the function's `AppError` as its body, never a 5xx (a panic answers 500
//! too, see `run_to_completion`). Bodies that are bad for the function must
//! be refused. Nothing in the database may change.
//!
//! Everything runs twice: with an admin token set (controls refuse with 401
//! after decoding their arguments) and with the controls open (the
//! arguments reach the function's own checks and the database).

use crate::api::Api;
use axum::body::Body;
use axum::http::{Method, StatusCode};
use leasekeeper::error::AppError;
use leasekeeper::http::server_fns::PREFIX;
use leptos::server_fn::axum::server_fn_paths;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// How many server functions there were when this test was written: fewer
/// registered means registration (or this test's view of it) broke.
const MIN_FUNCTIONS: usize = 18;

/// The kind of one argument, which decides its bad values.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// A row id: a positive `i64`.
    Id,
    /// A fencing token: an `i64`.
    Token,
    /// A string the function checks itself (a name, an action, a token).
    Text,
    /// A lowercase enum variant (`filter=active`).
    Choice,
    /// An optional lowercase enum variant: missing or empty is valid.
    OptionalChoice,
    /// An externally tagged enum (`of[Resource]=task:1`, `of[Lease]=1`).
    Tagged,
    /// An optional paging cursor, an `i64`: missing is valid.
    Cursor,
    /// An optional kind or queue name: missing or blank is valid (any).
    OptionalName,
    /// A kind or queue name that must be there: 1 to 128 characters, no
    /// control character.
    Name,
    /// An optional JSON object as text: missing or blank is valid (any).
    OptionalObject,
    /// A failed task's error group: any text of at most 200 characters
    /// without NUL (blank and control characters are groups too).
    ErrorGroup,
}

impl Kind {
    /// Whether a call may leave the argument out.
    fn optional(self) -> bool {
        matches!(
            self,
            Kind::OptionalChoice | Kind::Cursor | Kind::OptionalName | Kind::OptionalObject
        )
    }
}

/// One argument of a server function, with a valid value for it that
/// changes nothing (ids of rows that do not exist, an unknown worker).
struct Arg {
    name: &'static str,
    kind: Kind,
    valid: &'static str,
}

const fn arg(name: &'static str, kind: Kind, valid: &'static str) -> Arg {
    Arg { name, kind, valid }
}

/// The server functions whose arguments this test knows. A registered
/// function missing here still gets the generic and the random bodies
/// (with the admin token set only).
const KNOWN: &[(&str, &[Arg])] = &[
    ("get_access", &[]),
    ("sign_in", &[arg("token", Kind::Text, "not-the-token")]),
    ("sign_out", &[]),
    (
        "get_timeline",
        &[arg("of", Kind::Tagged, "of[Resource]=nothing")],
    ),
    ("get_failovers", &[]),
    ("get_generator_status", &[]),
    ("set_generator", &[arg("action", Kind::Text, "stop")]),
    ("get_instances", &[arg("before", Kind::Cursor, "1")]),
    ("get_audit", &[arg("before", Kind::Cursor, "1")]),
    ("kill_instance", &[arg("id", Kind::Text, "i-none")]),
    (
        "get_leases",
        &[
            arg("filter", Kind::Choice, "all"),
            arg("before", Kind::Cursor, "1"),
        ],
    ),
    ("get_lease_detail", &[arg("id", Kind::Id, "2147483647")]),
    (
        "force_release_lease",
        &[
            arg("id", Kind::Id, "2147483647"),
            arg("token", Kind::Token, "1"),
        ],
    ),
    ("get_overview", &[]),
    ("get_queues", &[]),
    (
        "control_queue",
        &[
            // A resume never creates a queue: a call that passes every
            // check answers 404 and changes nothing.
            arg("name", Kind::Text, "no-such-queue"),
            arg("action", Kind::Text, "resume"),
        ],
    ),
    ("get_schedules", &[]),
    (
        "control_schedule",
        &[
            arg("name", Kind::Text, "no-such-schedule"),
            arg("action", Kind::Text, "pause"),
        ],
    ),
    (
        "get_tasks",
        &[
            arg("status", Kind::OptionalChoice, "pending"),
            arg("before", Kind::Cursor, "1"),
            arg("kind", Kind::OptionalName, "email"),
            arg("queue", Kind::OptionalName, "mail"),
            arg("data", Kind::OptionalObject, "%7B%22customer%22%3A7%7D"),
        ],
    ),
    (
        "control_task",
        &[
            arg("id", Kind::Id, "2147483647"),
            arg("action", Kind::Text, "cancel"),
        ],
    ),
    (
        "control_tasks",
        &[
            arg("status", Kind::Text, "started"),
            arg("action", Kind::Text, "cancel"),
            arg("kind", Kind::OptionalName, "no-such-kind"),
            arg("queue", Kind::OptionalName, "no-such-queue"),
            arg("data", Kind::OptionalObject, "%7B%22customer%22%3A7%7D"),
        ],
    ),
    ("get_task_detail", &[arg("id", Kind::Id, "2147483647")]),
    (
        "get_workers",
        &[
            arg("filter", Kind::Choice, "all"),
            arg("before", Kind::Cursor, "1"),
        ],
    ),
    ("spawn_worker", &[]),
    (
        "control_worker",
        &[
            arg("id", Kind::Text, "w-none"),
            arg("action", Kind::Text, "pause"),
        ],
    ),
    ("get_workflows", &[arg("before", Kind::Cursor, "1")]),
    ("get_workflow", &[arg("id", Kind::Id, "2147483647")]),
    // No such workflow: a call that passes every check answers 404 and
    // changes nothing.
    ("cancel_workflow", &[arg("id", Kind::Id, "2147483647")]),
    ("get_failed_groups", &[]),
    // No failed task of this kind: a call that passes every check retries
    // none and changes nothing.
    (
        "retry_failed_group",
        &[
            arg("kind", Kind::Name, "no-such-kind"),
            arg("queue", Kind::Name, "no-such-queue"),
            arg(
                "error_group",
                Kind::ErrorGroup,
                "timeout%20after%20%3Cn%3E%20ms",
            ),
        ],
    ),
];

/// Functions that change something whatever their arguments: called only
/// with the admin token set (and not sent), where they refuse.
const NOT_WITH_CONTROLS_OPEN: &[&str] = &["spawn_worker", "control_tasks"];

/// The function name in a server function's path: `/sfn/<name><hash>`.
fn name_of(path: &str) -> &str {
    path.trim_start_matches(PREFIX)
        .trim_end_matches(|c: char| c.is_ascii_digit())
}

/// What an answer to a case may be.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// The body is bad for this function: it must be refused (4xx).
    Refused,
    /// The body may happen to be a valid call (unknown keys are ignored).
    Either,
}

/// One request: a description, its body and its content type.
struct Case {
    what: String,
    body: Vec<u8>,
    json: bool,
    expect: Expect,
}

fn case(what: impl Into<String>, body: impl Into<Vec<u8>>, expect: Expect) -> Case {
    Case {
        what: what.into(),
        body: body.into(),
        json: false,
        expect,
    }
}

/// A 70 KiB value: past the 64 KiB body limit.
fn huge() -> String {
    "h".repeat(70 * 1024)
}

/// Values that are wrong for an argument of `kind`, URL-encoded.
fn bad_values(kind: Kind) -> Vec<String> {
    let mut values: Vec<String> = match kind {
        Kind::Id | Kind::Token => vec![
            "abc".into(),
            "-1".into(),
            "0".into(),
            "99999999999999999999".into(),
            "1.5".into(),
            "1e3".into(),
            "0x10".into(),
            "".into(),
            "%2B%2B1".into(),
            "9".repeat(3000),
        ],
        Kind::Text => vec![
            "".into(),
            "%20%20".into(),
            "bogus".into(),
            "%FF%FE".into(),
            "%C0%80".into(),
            "%07%1B".into(),
            "%E2%80%AEkcatta".into(),
            "t".repeat(3000),
        ],
        Kind::Choice | Kind::OptionalChoice => vec![
            "bogus".into(),
            "ACTIVE".into(),
            "Active".into(),
            "%FF".into(),
            "1".into(),
            "c".repeat(3000),
        ],
        Kind::Tagged => vec![],
        Kind::OptionalName | Kind::Name => vec![
            "%07%1B".into(),
            "a%0Ab".into(),
            "n".repeat(129),
            "n".repeat(3000),
        ],
        Kind::ErrorGroup => vec!["g".repeat(201), "g".repeat(3000)],
        Kind::OptionalObject => vec![
            "bogus".into(),
            "%5B1%5D".into(),
            "7".into(),
            "null".into(),
            "%7Bx%7D".into(),
            "%7B%22a%22%3A1".into(),
            format!("%7B%22a%22%3A%22{}%22%7D", "d".repeat(9000)),
        ],
        Kind::Cursor => vec![
            "abc".into(),
            "99999999999999999999".into(),
            "1.5".into(),
            "1e3".into(),
            "0x10".into(),
            "%2B%2B1".into(),
            "9".repeat(3000),
        ],
    };
    if matches!(kind, Kind::Id) {
        // Past i64 either way: no row id.
        values.push("9223372036854775808".into());
        values.push("-9223372036854775809".into());
    }
    if matches!(kind, Kind::Choice | Kind::Name) {
        values.push("".into());
    }
    values.push("a%00b".into());
    values.push("%00".into());
    values
}

/// Cases for each argument in `args`, the others given valid values.
fn argument_cases(args: &[Arg]) -> Vec<Case> {
    let mut cases = Vec::new();
    for (i, arg) in args.iter().enumerate() {
        let others: Vec<String> = args
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, a)| valid_pair(a))
            .collect();
        let with = |pair: String| {
            let mut pairs = others.clone();
            pairs.push(pair);
            pairs.join("&")
        };
        let missing_expect = if arg.kind.optional() {
            Expect::Either
        } else {
            Expect::Refused
        };
        cases.push(case(
            format!("{} missing", arg.name),
            others.join("&"),
            missing_expect,
        ));
        let mut values: Vec<(String, String)> = Vec::new();
        if let Kind::Tagged = arg.kind {
            let n = arg.name;
            for raw in [
                format!("{n}="),
                format!("{n}=Resource"),
                format!("{n}[Bogus]=1"),
                format!("{n}[Lease]=abc"),
                format!("{n}[Lease]=0"),
                format!("{n}[Lease]=-1"),
                format!("{n}[Lease]=99999999999999999999"),
                format!("{n}[Resource]="),
                format!("{n}[Resource]=%00"),
                format!("{n}[Resource]=a%00b"),
                format!("{n}[Resource]=%07"),
                format!("{n}[Resource]=%FF%FE"),
                format!("{n}[Resource]={}", "r".repeat(3000)),
                format!("{n}[Resource]={}", "r".repeat(257)),
                format!("{n}[Resource]=a&{n}[Lease]=1"),
                format!("{n}[Resource][x]=1"),
                format!("{n}[lease]=1"),
            ] {
                values.push((format!("{:.60}", raw), raw));
            }
        } else {
            for value in bad_values(arg.kind) {
                let raw = format!("{}={value}", arg.name);
                values.push((format!("{}={:.40}", arg.name, value), raw));
            }
            values.push((
                format!("{}[]=nested", arg.name),
                format!("{}[]=1&{}[x]=2", arg.name, arg.name),
            ));
        }
        for (what, raw) in values {
            let expect = match (arg.kind, what.as_str()) {
                // `status=` may well mean "no status": all tasks.
                (Kind::OptionalChoice, w) if w.ends_with('=') => Expect::Either,
                // Decoded as two U+FFFD characters: a valid resource name.
                (Kind::Tagged, w) if w.ends_with("%FF%FE") => Expect::Either,
                // The form decoder keeps one of the two variants.
                (Kind::Tagged, w) if w.contains('&') => Expect::Either,
                _ => Expect::Refused,
            };
            cases.push(case(what, with(raw), expect));
        }
        cases.push(case(
            format!("{}=<70 KiB>", arg.name),
            with(format!("{}={}", arg.name, huge())),
            Expect::Refused,
        ));
    }
    cases
}

fn valid_pair(arg: &Arg) -> String {
    match arg.kind {
        Kind::Tagged => arg.valid.to_string(),
        _ => format!("{}={}", arg.name, arg.valid),
    }
}

/// Bodies that are wrong whatever the function takes; `required` says
/// whether it has an argument that must be there (without one, most of
/// them decode to a valid call).
fn generic_cases(required: bool) -> Vec<Case> {
    let bad_unless_argless = if required {
        Expect::Refused
    } else {
        Expect::Either
    };
    let mut cases = vec![
        case("empty", "", bad_unless_argless),
        case(
            "not url-encoded",
            "this is { not & = = url encoded %",
            bad_unless_argless,
        ),
        case("stray percent", "%", bad_unless_argless),
        case("bad escape", "%zz=%zz", bad_unless_argless),
        case("only separators", "&&&===&", bad_unless_argless),
        case("NUL bytes", b"\0\0=\0".to_vec(), bad_unless_argless),
        case("3000 characters", "x".repeat(3000), bad_unless_argless),
        case(
            "deep nesting",
            format!("a{}=1", "[b]".repeat(50)),
            bad_unless_argless,
        ),
        case(
            "invalid UTF-8",
            b"\xff\xfe=\xc0\x80".to_vec(),
            Expect::Refused,
        ),
        case(
            "invalid UTF-8 after a valid pair",
            b"id=1&token=\xc3\x28".to_vec(),
            Expect::Refused,
        ),
        case("oversized (70 KiB)", huge(), Expect::Refused),
        case(
            "oversized pairs (70 KiB)",
            "k=v&".repeat(70 * 1024 / 4),
            Expect::Refused,
        ),
    ];
    let json_body = json!({"id": 1, "token": 1, "action": "stop", "filter": "all",
                           "status": "pending", "of": {"Lease": 1}});
    cases.push(Case {
        json: true,
        ..case("JSON", json_body.to_string(), bad_unless_argless)
    });
    cases
}

/// A random form body: some pairs with names the function knows (or
/// others), values of random kinds, now and then raw random bytes.
fn random_body(rng: &mut StdRng, names: &[&str]) -> Vec<u8> {
    const OTHER_NAMES: &[&str] = &["id", "token", "action", "of[Lease]", "of[Resource]", "x"];
    let mut body = Vec::new();
    for n in 0..rng.random_range(0..5) {
        if n > 0 {
            body.push(b'&');
        }
        if rng.random_bool(0.05) {
            body.extend((0..rng.random_range(1..40)).map(|_| rng.random::<u8>()));
            continue;
        }
        let name = if !names.is_empty() && rng.random_bool(0.7) {
            names[rng.random_range(0..names.len())]
        } else {
            OTHER_NAMES[rng.random_range(0..OTHER_NAMES.len())]
        };
        body.extend_from_slice(name.as_bytes());
        if rng.random_bool(0.1) {
            body.extend_from_slice(b"[]");
        }
        body.push(b'=');
        body.extend(random_value(rng));
    }
    body
}

fn random_value(rng: &mut StdRng) -> Vec<u8> {
    match rng.random_range(0..10) {
        0 => rng.random::<i64>().to_string().into_bytes(),
        1 => format!("-{}", rng.random_range(0..1000)).into_bytes(),
        2 => "9".repeat(rng.random_range(10..60)).into_bytes(),
        3 => format!("{}", rng.random::<f64>() * 1e6).into_bytes(),
        4 => "x".repeat(rng.random_range(0..4000)).into_bytes(),
        5 => (0..rng.random_range(1..20))
            .flat_map(|_| format!("%{:02X}", rng.random::<u8>()).into_bytes())
            .collect(),
        6 => Vec::new(),
        7 => ["Resource", "Lease", "ALL", "Pending ", "paus", "kil"][rng.random_range(0..6)]
            .as_bytes()
            .to_vec(),
        8 => b"%00%7F%E2%80%AE".to_vec(),
        _ => (0..rng.random_range(1..20))
            .map(|_| rng.random::<u8>())
            .collect(),
    }
}

/// Every table's rows, digested: what a refused call must not change.
/// Refused stale writes are history, not data, and are left out.
async fn snapshot(api: &Api) -> Vec<(String, String)> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1",
    )
    .fetch_all(&api.db.pool)
    .await
    .unwrap();
    let mut digests = Vec::new();
    for table in tables {
        let only = if table == "lease_events" {
            "WHERE kind <> 'stale_write_refused'"
        } else {
            ""
        };
        let digest: String = sqlx::query_scalar(&format!(
            "SELECT count(*) || ' ' || coalesce(md5(string_agg(t::text, ',' ORDER BY t::text)), '')
               FROM \"{table}\" t {only}"
        ))
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
        digests.push((table, digest));
    }
    digests
}

/// Statuses an error may have: the client's fault, said so.
fn allowed(status: StatusCode) -> bool {
    matches!(status.as_u16(), 400 | 401 | 404 | 409 | 413)
}

/// Checks one answer; `Some(reason)` when it is wrong.
fn judge(status: StatusCode, body: &[u8], expect: Expect) -> Option<String> {
    if status.is_success() {
        return (expect == Expect::Refused).then(|| "a bad call succeeded".to_string());
    }
    if !allowed(status) {
        return Some(format!("status {status}"));
    }
    match serde_json::from_slice::<AppError>(body) {
        Ok(AppError::Internal | AppError::ServerFn(_)) => {
            Some("a client error reported as a server failure".into())
        }
        Ok(e) if e.to_string().trim().is_empty() => Some("an empty error message".into()),
        Ok(_) => None,
        Err(_) => Some("the body is not an AppError".into()),
    }
}

async fn run_pass(api: &Api, open: bool, rng: &mut StdRng) -> (usize, Vec<String>) {
    let mut paths: Vec<&'static str> = server_fn_paths()
        .filter(|(path, _)| path.starts_with(PREFIX))
        .map(|(path, method)| {
            assert_eq!(method, Method::POST, "{path}: this test sends POSTs");
            path
        })
        .collect();
    paths.sort_unstable();
    let mut sent = 0;
    let mut failures = Vec::new();
    for path in paths {
        let name = name_of(path);
        let args = KNOWN.iter().find(|(known, _)| *known == name).map(|k| k.1);
        if open && (args.is_none() || NOT_WITH_CONTROLS_OPEN.contains(&name)) {
            continue;
        }
        // Unknown arguments count as required: bodies without them are bad.
        let required = args.is_none_or(|args| args.iter().any(|a| !a.kind.optional()));
        let mut cases = generic_cases(required);
        let args = args.unwrap_or_default();
        cases.extend(argument_cases(args));
        let names: Vec<&str> = args.iter().map(|a| a.name).collect();
        for n in 0..20 {
            cases.push(case(
                format!("random #{n}"),
                random_body(rng, &names),
                Expect::Either,
            ));
        }
        for case in cases {
            let content_type = if case.json {
                "application/json"
            } else {
                "application/x-www-form-urlencoded"
            };
            // The dashboard's own page: same origin, asking for JSON.
            let headers = [
                ("origin", "http://127.0.0.1:3000"),
                ("host", "127.0.0.1:3000"),
                ("content-type", content_type),
                ("accept", "application/json"),
            ];
            let (status, body) = api
                .send_bytes(Method::POST, path, &headers, Body::from(case.body.clone()))
                .await;
            sent += 1;
            if let Some(reason) = judge(status, &body, case.expect) {
                failures.push(format!(
                    "{name} ({}): {reason}: {status} {:.200}  [body {:.80}]",
                    case.what,
                    String::from_utf8_lossy(&body),
                    String::from_utf8_lossy(&case.body),
                ));
            }
        }
    }
    (sent, failures)
}

#[test]
fn every_known_function_is_registered_and_none_is_missing() {
    let names: Vec<&str> = server_fn_paths()
        .filter(|(path, _)| path.starts_with(PREFIX))
        .map(|(path, _)| name_of(path))
        .collect();
    assert!(
        names.len() >= MIN_FUNCTIONS,
        "only {} server functions registered under {PREFIX}: {names:?}",
        names.len()
    );
    for (known, _) in KNOWN {
        assert!(
            names.contains(known),
            "{known} is not registered (renamed?): {names:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_to_every_server_function_is_refused_cleanly_and_changes_nothing() {
    let mut rng = StdRng::seed_from_u64(0x5f_bad);
    let mut total = 0;
    for open in [false, true] {
        let api = Api::with_settings(|s| {
            if !open {
                s.admin_token = Some("an-admin-token-for-tests".into());
            }
        })
        .await;
        // Something real to aim at: a held lease (id 1, token 1) and a task
        // (made with the token when one is set: enqueueing needs it then).
        if open {
            api.held_lease_and_task().await;
        } else {
            let auth = [("authorization", "Bearer an-admin-token-for-tests")];
            for (uri, body) in [
                (
                    "/api/leases",
                    r#"{"resource": "fuzz:held", "holder": "owner", "ttl_seconds": 300}"#,
                ),
                ("/api/tasks", r#"{"task_data": {"n": 1}}"#),
            ] {
                let (s, made) = api
                    .send_with(Method::POST, uri, &auth, Body::from(body))
                    .await;
                assert_eq!(s, StatusCode::CREATED, "{uri}: {made}");
            }
        }
        let before = snapshot(&api).await;
        let (sent, failures) = run_pass(&api, open, &mut rng).await;
        let controls = if open { "open" } else { "token set" };
        assert!(
            failures.is_empty(),
            "controls {controls}: {} of {sent} calls answered badly:\n{}",
            failures.len(),
            failures.join("\n")
        );
        assert_eq!(
            snapshot(&api).await,
            before,
            "controls {controls}: a refused call changed the database"
        );
        total += sent;
    }
    assert!(total > 1000, "only {total} calls");
}

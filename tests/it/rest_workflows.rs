//! `/api/workflows` (issue 40): a diamond over REST from enqueue to its
//! last task, outputs handed on in the claim; bad workflows refused whole;
//! the operator's cancel, audited; a durable wait and its signal over
//! REST.

use crate::api::{Api, error_of};
use axum::http::StatusCode;
use serde_json::{Value, json};

fn diamond() -> Value {
    json!({
        "name": "diamond",
        "tasks": [
            {"ref": "a", "kind": "step", "task_data": {"n": 1}},
            {"ref": "b", "kind": "step", "task_data": {}, "depends_on": ["a"]},
            {"ref": "c", "kind": "step", "task_data": {}, "depends_on": ["a"]},
            {"ref": "d", "kind": "step", "task_data": {}, "depends_on": ["b", "c"],
             "on_parent_failure": "run"}
        ]
    })
}

async fn claim(api: &Api) -> Option<Value> {
    let (s, task) = api
        .post("/api/tasks/next", json!({"processor": "w-1"}))
        .await;
    match s {
        StatusCode::ACCEPTED => Some(task),
        StatusCode::OK => None,
        other => panic!("{other}: {task}"),
    }
}

async fn complete(api: &Api, task: &Value, output: Value) {
    let (s, body) = api
        .put(
            &format!("/api/tasks/{}/complete", task["id"]),
            json!({"processor": "w-1", "fencing_token": task["fencing_token"], "task_output": output}),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{body}");
}

#[tokio::test]
async fn a_diamond_runs_over_rest_with_its_outputs_in_the_claims() {
    let api = Api::new().await;
    let (s, flow) = api.post("/api/workflows", diamond()).await;
    assert_eq!(s, StatusCode::CREATED, "{flow}");
    assert_eq!(flow["status"], "running");
    let tasks = flow["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 4);
    assert_eq!(tasks[0]["status"], "pending");
    assert_eq!(tasks[3]["status"], "waiting");
    assert_eq!(tasks[3]["depends_on"], json!(["b", "c"]));

    let a = claim(&api).await.expect("a");
    assert_eq!(a["workflow_ref"], "a");
    assert!(claim(&api).await.is_none(), "b and c wait for a");
    complete(&api, &a, json!({"from": "a"})).await;
    let b = claim(&api).await.expect("b");
    let c = claim(&api).await.expect("c");
    assert_eq!(b["parent_outputs"], json!({"a": {"from": "a"}}));
    complete(&api, &b, json!("b")).await;
    assert!(claim(&api).await.is_none(), "d waits for c");
    complete(&api, &c, json!("c")).await;
    let d = claim(&api).await.expect("d");
    assert_eq!(d["parent_outputs"], json!({"b": "b", "c": "c"}));
    assert_eq!(d["on_parent_failure"], "run");
    complete(&api, &d, json!(null)).await;

    let (s, done) = api.get(&format!("/api/workflows/{}", flow["id"])).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(done["status"], "completed");
    let (s, list) = api.get("/api/workflows").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(list[0]["id"], flow["id"]);
    assert_eq!(
        (list[0]["tasks"].as_i64(), list[0]["processed"].as_i64()),
        (Some(4), Some(4))
    );
}

#[tokio::test]
async fn a_bad_workflow_answers_400_and_adds_nothing() {
    let api = Api::new().await;
    let cases = [
        (json!({"name": "x", "tasks": []}), "at least one task"),
        (
            json!({"name": "x", "tasks": [{"ref": "a", "task_data": {}, "depends_on": ["nope"]}]}),
            "no task has ref",
        ),
        (
            json!({"name": "x", "tasks": [{"ref": "a", "task_data": {}}, {"ref": "a", "task_data": {}}]}),
            "used twice",
        ),
        (
            json!({"name": "x", "tasks": [
                {"ref": "a", "task_data": {}, "depends_on": ["b"]},
                {"ref": "b", "task_data": {}, "depends_on": ["a"]}]}),
            "cycle",
        ),
        (
            json!({"name": "x", "tasks": [{"ref": "a", "task_data": {}, "on_parent_failure": "shrug"}]}),
            "tasks[0].on_parent_failure",
        ),
        (
            json!({"name": "x", "tasks": [{"ref": "a", "task_data": {}, "max_attempts": 0}]}),
            "tasks[0].max_attempts",
        ),
        (
            json!({"name": "x", "tasks": [{"ref": "a", "task_data": null}]}),
            "tasks[0].task_data",
        ),
        (
            json!({"name": "", "tasks": [{"ref": "a", "task_data": {}}]}),
            "name",
        ),
    ];
    for (body, says) in cases {
        let (s, err) = api.post("/api/workflows", body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {err}");
        assert!(error_of(&err).contains(says), "{body}: {err}");
    }
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
    let (s, _) = api.get("/api/workflows/99").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_operator_cancels_a_workflow_audited() {
    // The credentials (a worker token refused, 403; none, 401) are
    // credentials.rs's lists of routes.
    let api = Api::new().await;
    let (s, flow) = api.post("/api/workflows", diamond()).await;
    assert_eq!(s, StatusCode::CREATED, "{flow}");
    let a = claim(&api).await.expect("a");
    let (s, cancelled) = api
        .post(&format!("/api/workflows/{}/cancel", flow["id"]), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM lease_events
          WHERE kind = 'operator' AND detail->>'action' = 'cancel_task'",
    )
    .fetch_one(&api.db.pool)
    .await
    .unwrap();
    assert_eq!(audited, 4);
    // The running task's processor is refused from now on.
    let (s, _) = api
        .put(
            &format!("/api/tasks/{}/complete", a["id"]),
            json!({"processor": "w-1", "fencing_token": a["fencing_token"]}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, _) = api.post("/api/workflows/12345/cancel", json!({})).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_task_waits_for_a_signal_over_rest() {
    let api = Api::new().await;
    let (s, task) = api
        .post("/api/tasks", json!({"kind": "approve", "task_data": {}}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    let claimed = claim(&api).await.expect("the task");
    let id = claimed["id"].as_i64().unwrap();
    let wait = |token: Value, signal: &str, timeout: f64| {
        json!({"processor": "w-1", "fencing_token": token, "signal": signal,
               "timeout_seconds": timeout})
    };
    let uri = format!("/api/tasks/{id}/wait");
    for (body, says) in [
        (wait(claimed["fencing_token"].clone(), "", 60.0), "signal"),
        (
            wait(claimed["fencing_token"].clone(), "ok", 0.0),
            "timeout_seconds",
        ),
        (
            wait(claimed["fencing_token"].clone(), "ok", 1e12),
            "timeout_seconds",
        ),
    ] {
        let (s, err) = api.put(&uri, body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {err}");
        assert!(error_of(&err).contains(says), "{err}");
    }
    let (s, _) = api.put(&uri, wait(json!(99), "ok", 60.0)).await;
    assert_eq!(s, StatusCode::CONFLICT, "a stale token is refused");
    let (s, waiting) = api
        .put(&uri, wait(claimed["fencing_token"].clone(), "ok", 60.0))
        .await;
    assert_eq!(s, StatusCode::OK, "{waiting}");
    assert_eq!(waiting["status"], "waiting");
    assert_eq!(waiting["wait_signal"], "ok");
    assert!(claim(&api).await.is_none(), "a waiting task is not claimed");

    let signal = format!("/api/tasks/{id}/signal");
    let (s, err) = api.post(&signal, json!({"name": "nope"})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{err}");
    assert!(
        error_of(&err).contains("waits for the signal \"ok\""),
        "{err}"
    );
    let (s, woken) = api
        .post(&signal, json!({"name": "ok", "payload": {"yes": true}}))
        .await;
    assert_eq!(s, StatusCode::OK, "{woken}");
    assert_eq!(woken["status"], "pending");
    let again = claim(&api).await.expect("claimable again");
    assert_eq!(again["id"], id);
    assert_eq!(again["signals"], json!({"ok": {"yes": true}}));
    assert_eq!(again["attempts"], 1, "the wait used no attempt");
    let (s, err) = api.post(&signal, json!({"name": "ok"})).await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert!(error_of(&err).contains("is started"), "{err}");
    let (s, _) = api
        .post("/api/tasks/424242/signal", json!({"name": "ok"}))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_failed_summary_groups_errors_and_retry_takes_one_group() {
    let api = Api::new().await;
    for (kind, error) in [
        ("charge", "timeout after 17 ms"),
        ("charge", "timeout after 4242 ms"),
        ("charge", "card declined"),
    ] {
        let (s, t) = api
            .post(
                "/api/tasks",
                json!({"kind": kind, "task_data": {}, "max_attempts": 1}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{t}");
        let c = claim(&api).await.expect("the task");
        let (s, f) = api
            .put(
                &format!("/api/tasks/{}/fail", c["id"]),
                json!({"processor": "w-1", "fencing_token": c["fencing_token"], "error": error}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{f}");
        assert_eq!(f["status"], "failed");
    }
    let (s, groups) = api.get("/api/tasks/failed/summary").await;
    assert_eq!(s, StatusCode::OK, "{groups}");
    assert_eq!(groups.as_array().unwrap().len(), 2, "{groups}");
    assert_eq!(groups[0]["error_group"], "timeout after <n> ms");
    assert_eq!(groups[0]["count"], 2);
    let (s, done) = api
        .post(
            "/api/tasks/retry",
            json!({"status": "failed", "kind": "charge", "queue": "default",
                   "error_group": groups[0]["error_group"]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{done}");
    let (_, left) = api.get("/api/tasks/failed/summary").await;
    assert_eq!(left.as_array().unwrap().len(), 1);
    assert_eq!(left[0]["error_group"], "card declined");
    let (s, _) = api
        .post(
            "/api/tasks/retry",
            json!({"status": "failed", "error_group": "x\u{0}"}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

/// Calls the server function at `path` with the form `body`, as the
/// operator when `bearer` is given: its status and its answer as text.
async fn call_sfn(
    api: &Api,
    path: &str,
    body: String,
    bearer: Option<&str>,
) -> (StatusCode, String) {
    let mut headers = vec![("content-type", "application/x-www-form-urlencoded")];
    headers.extend(bearer.map(|b| ("authorization", b)));
    let (s, bytes) = api
        .send_bytes(
            axum::http::Method::POST,
            path,
            &headers,
            axum::body::Body::from(body),
        )
        .await;
    (s, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn the_pages_server_functions_read_workflows_and_cancel_one_only_for_the_operator() {
    use axum::body::Body;
    use axum::http::Method;
    use leasekeeper::app::{CancelWorkflow, GetWorkflow, GetWorkflows};
    use leptos::server_fn::ServerFn;
    const TOKEN: &str = "an-admin-token-for-tests";
    let api = Api::with_settings(|s| s.admin_token = Some(TOKEN.into())).await;
    let bearer = format!("Bearer {TOKEN}");
    let (s, flow) = api
        .send_with(
            Method::POST,
            "/api/workflows",
            &[("authorization", &bearer)],
            Body::from(diamond().to_string()),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{flow}");
    let id = flow["id"].as_i64().unwrap();
    let call = |path: &'static str, body: String, auth: bool| {
        call_sfn(&api, path, body, auth.then_some(bearer.as_str()))
    };

    // Reads are open: the list has it with its figures, the detail its tasks.
    let (s, list) = call(<GetWorkflows as ServerFn>::PATH, String::new(), false).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let list: Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list["items"][0]["id"], id, "{list}");
    assert_eq!(list["items"][0]["tasks"], 4, "{list}");
    let (s, one) = call(<GetWorkflow as ServerFn>::PATH, format!("id={id}"), false).await;
    assert_eq!(s, StatusCode::OK, "{one}");
    let one: Value = serde_json::from_str(&one).unwrap();
    assert_eq!(one["tasks"].as_array().map(Vec::len), Some(4), "{one}");
    let (s, none) = call(<GetWorkflow as ServerFn>::PATH, "id=424242".into(), false).await;
    assert_eq!((s, none.as_str()), (StatusCode::OK, "null"));

    // The cancel without the token: refused, nothing changed, nothing audited.
    let (s, err) = call(
        <CancelWorkflow as ServerFn>::PATH,
        format!("id={id}"),
        false,
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{err}");
    assert!(err.contains("admin token"), "{err}");
    let (_, now) = api.get(&format!("/api/workflows/{id}")).await;
    assert_eq!(now["status"], "running");
    let audited = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM lease_events e JOIN tasks t ON e.resource = 'task:' || t.id
              WHERE t.workflow_id = $1 AND e.kind = 'operator'",
        )
        .bind(id)
        .fetch_one(&api.db.pool)
        .await
        .unwrap()
    };
    assert_eq!(audited().await, 0);

    // With it: every task cancelled, each audited; a missing one is a 404.
    let (s, said) = call(<CancelWorkflow as ServerFn>::PATH, format!("id={id}"), true).await;
    assert_eq!(s, StatusCode::OK, "{said}");
    assert!(
        said.contains(&format!(
            "workflow {id} is cancelled: 4 of its 4 tasks cancelled"
        )),
        "{said}"
    );
    let (_, now) = api.get(&format!("/api/workflows/{id}")).await;
    assert_eq!(now["status"], "cancelled");
    assert_eq!(audited().await, 4);
    let (s, err) = call(<CancelWorkflow as ServerFn>::PATH, "id=424242".into(), true).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{err}");
}

#[tokio::test]
async fn the_dead_letters_server_functions_group_failures_and_retry_one_group_only_for_the_operator()
 {
    use axum::body::Body;
    use axum::http::Method;
    use leasekeeper::app::{GetFailedGroups, RetryFailedGroup};
    use leptos::server_fn::ServerFn;
    const TOKEN: &str = "an-admin-token-for-tests";
    let api = Api::with_settings(|s| s.admin_token = Some(TOKEN.into())).await;
    let bearer = format!("Bearer {TOKEN}");
    let authed = |method: Method, uri: String, body: Value| {
        let api = &api;
        let bearer = bearer.clone();
        async move {
            api.send_with(
                method,
                &uri,
                &[("authorization", &bearer)],
                Body::from(body.to_string()),
            )
            .await
        }
    };
    // Two errors of one group, another error, and the first group's error
    // on another kind (a group is its kind and queue too).
    let mut ids = Vec::new();
    for (kind, error) in [
        ("charge", "timeout after 17 ms"),
        ("charge", "timeout after 4242 ms"),
        ("charge", "card declined"),
        ("refund", "timeout after 5 ms"),
    ] {
        let (s, t) = authed(
            Method::POST,
            "/api/tasks".into(),
            json!({"kind": kind, "task_data": {}, "max_attempts": 1}),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{t}");
        let (s, c) = authed(
            Method::POST,
            "/api/tasks/next".into(),
            json!({"processor": "w-1", "kinds": [kind]}),
        )
        .await;
        assert_eq!(s, StatusCode::ACCEPTED, "{c}");
        assert_eq!(c["id"], t["id"]);
        let (s, f) = authed(
            Method::PUT,
            format!("/api/tasks/{}/fail", c["id"]),
            json!({"processor": "w-1", "fencing_token": c["fencing_token"], "error": error}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{f}");
        assert_eq!(f["status"], "failed");
        ids.push(t["id"].as_i64().unwrap());
    }
    let call = |path: &'static str, body: &'static str, auth: bool| {
        call_sfn(
            &api,
            path,
            body.to_string(),
            auth.then_some(bearer.as_str()),
        )
    };
    let statuses = || async {
        let mut all = Vec::new();
        for id in &ids {
            let (_, t) = api.get(&format!("/api/tasks/{id}")).await;
            all.push(t["status"].as_str().unwrap_or_default().to_string());
        }
        all
    };
    let audited = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM lease_events WHERE kind = 'operator'")
            .fetch_one(&api.db.pool)
            .await
            .unwrap()
    };

    // The read is open: three groups, the largest first, with an example.
    let (s, groups) = call(<GetFailedGroups as ServerFn>::PATH, "", false).await;
    assert_eq!(s, StatusCode::OK, "{groups}");
    let groups: Value = serde_json::from_str(&groups).unwrap();
    assert_eq!(groups.as_array().map(Vec::len), Some(3), "{groups}");
    assert_eq!(groups[0]["kind"], "charge", "{groups}");
    assert_eq!(groups[0]["queue"], "default", "{groups}");
    assert_eq!(groups[0]["error_group"], "timeout after <n> ms");
    assert_eq!(groups[0]["count"], 2);
    assert_eq!(groups[0]["example"], "timeout after 4242 ms");

    let body = "kind=charge&queue=default&error_group=timeout%20after%20%3Cn%3E%20ms";
    // Without the token: refused, nothing changed, nothing audited.
    let (s, err) = call(<RetryFailedGroup as ServerFn>::PATH, body, false).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{err}");
    assert!(err.contains("admin token"), "{err}");
    assert_eq!(statuses().await, ["failed"; 4]);
    assert_eq!(audited().await, 0);

    // A blank kind or queue would widen the retry, and names and groups
    // follow their rules: refused, nothing changed.
    for bad in [
        "kind=&queue=default&error_group=timeout%20after%20%3Cn%3E%20ms",
        "kind=charge&queue=&error_group=timeout%20after%20%3Cn%3E%20ms",
        "kind=charge&queue=%01&error_group=timeout%20after%20%3Cn%3E%20ms",
        "kind=charge&queue=default&error_group=x%00",
    ] {
        let (s, err) = call(<RetryFailedGroup as ServerFn>::PATH, bad, true).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {err}");
    }
    assert_eq!(statuses().await, ["failed"; 4]);
    assert_eq!(audited().await, 0);

    // With it: exactly that group retried, each task audited.
    let (s, said) = call(<RetryFailedGroup as ServerFn>::PATH, body, true).await;
    assert_eq!(s, StatusCode::OK, "{said}");
    assert!(said.contains("2 tasks retried"), "{said}");
    assert_eq!(statuses().await, ["pending", "pending", "failed", "failed"]);
    assert_eq!(audited().await, 2);
    let (_, left) = call(<GetFailedGroups as ServerFn>::PATH, "", false).await;
    let left: Value = serde_json::from_str(&left).unwrap();
    let mut left: Vec<(String, String)> = left
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["kind"].as_str().unwrap().to_string(),
                g["error_group"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            ("charge".to_string(), "card declined".to_string()),
            ("refund".to_string(), "timeout after <n> ms".to_string())
        ]
    );
    // Again: the group is gone, nothing more to retry.
    let (s, said) = call(<RetryFailedGroup as ServerFn>::PATH, body, true).await;
    assert_eq!(s, StatusCode::OK, "{said}");
    assert!(said.contains("0 tasks retried"), "{said}");
    assert_eq!(audited().await, 2);
}

//! Workflows (issue 40): children wait for every parent, get their
//! outputs, are cancelled by a parent's failure (or run anyway), and the
//! race of two parents ending at once on two connections makes the child
//! claimable exactly once, after both.

use crate::common::{IdleWorker, TestDb, holder};
use leasekeeper_core::db::Schema;
use leasekeeper_core::queue::control;
use leasekeeper_core::queue::store::{self, RetryPolicy, TaskError};
use leasekeeper_core::queue::{NewTask, Task, TaskStatus};
use leasekeeper_core::workflow::store as flows;
use leasekeeper_core::workflow::{NewWorkflow, Workflow, WorkflowStatus, WorkflowTask};
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

fn step(r: &str) -> WorkflowTask {
    WorkflowTask::new(
        r,
        NewTask::new("step", json!({ "step": r })).max_attempts(1),
    )
}

fn diamond() -> NewWorkflow {
    NewWorkflow::new("diamond")
        .task(step("a"))
        .task(step("b").after(["a"]))
        .task(step("c").after(["a"]))
        .task(step("d").after(["b", "c"]))
}

/// p and q, then `child` after both.
fn join(child: &str) -> NewWorkflow {
    NewWorkflow::new("join")
        .task(step("p"))
        .task(step("q"))
        .task(step(child).after(["p", "q"]))
}

/// `op` for `a` and for `b` at once, each in its own transaction on its own
/// connection: the one `a_first` names sends its statement first and stays
/// uncommitted for 150 ms while the other's statement runs (and waits for
/// any row lock the first holds); then each commits.
async fn at_once<T, R>(
    db: &TestDb,
    [a, b]: [T; 2],
    a_first: bool,
    op: impl AsyncFn(&mut sqlx::PgConnection, T) -> R,
) -> [R; 2] {
    let run = async |item: T, first: bool| {
        let mut tx = db.pool.begin().await.unwrap();
        if !first {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let answer = op(&mut tx, item).await;
        if first {
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        tx.commit().await.unwrap();
        answer
    };
    let (a, b) = tokio::join!(run(a, a_first), run(b, !a_first));
    [a, b]
}

async fn enqueue(db: &TestDb, flow: &NewWorkflow) -> Workflow {
    flows::enqueue_workflow(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        flow,
    )
    .await
    .unwrap()
}

fn ids(flow: &Workflow) -> HashMap<String, i64> {
    flow.tasks.iter().map(|t| (t.r#ref.clone(), t.id)).collect()
}

/// Everything claimable now, claimed by `w` (one batch).
async fn claim_all(db: &TestDb, w: &str) -> Vec<Task> {
    store::claim_batch(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        &holder(w),
        TTL,
        100,
    )
    .await
    .unwrap()
}

async fn complete(db: &TestDb, task: &Task, w: &str, output: serde_json::Value) {
    store::complete(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        task.id,
        &holder(w),
        task.fencing_token.unwrap(),
        Some(&output),
    )
    .await
    .unwrap();
}

async fn get(db: &TestDb, id: i64) -> Task {
    store::get(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        id,
    )
    .await
    .unwrap()
    .unwrap()
}

fn refs(tasks: &[Task]) -> Vec<String> {
    let mut r: Vec<String> = tasks
        .iter()
        .map(|t| t.workflow_ref.clone().unwrap())
        .collect();
    r.sort();
    r
}

#[tokio::test]
async fn a_diamond_runs_in_order_and_hands_its_outputs_on() {
    let db = TestDb::new().await;
    let flow = enqueue(&db, &diamond()).await;
    assert_eq!(flow.status, WorkflowStatus::Running);
    let statuses: Vec<_> = flow
        .tasks
        .iter()
        .map(|t| (t.r#ref.as_str(), t.status))
        .collect();
    assert_eq!(
        statuses,
        [
            ("a", TaskStatus::Pending),
            ("b", TaskStatus::Waiting),
            ("c", TaskStatus::Waiting),
            ("d", TaskStatus::Waiting)
        ]
    );
    assert_eq!(flow.tasks[3].depends_on, ["b", "c"]);

    let first = claim_all(&db, "w").await;
    assert_eq!(refs(&first), ["a"], "only the root is claimable");
    complete(&db, &first[0], "w", json!({"got": "a"})).await;

    let second = claim_all(&db, "w").await;
    assert_eq!(refs(&second), ["b", "c"]);
    for t in &second {
        assert_eq!(t.parent_outputs, Some(json!({"a": {"got": "a"}})), "{t:?}");
    }
    let b = second
        .iter()
        .find(|t| t.workflow_ref.as_deref() == Some("b"))
        .unwrap();
    let c = second
        .iter()
        .find(|t| t.workflow_ref.as_deref() == Some("c"))
        .unwrap();
    complete(&db, b, "w", json!(2)).await;
    assert!(claim_all(&db, "w").await.is_empty(), "d waits for c too");
    let d = get(&db, ids(&flow)["d"]).await;
    assert_eq!((d.status, d.parents_left), (TaskStatus::Waiting, 1));
    complete(&db, c, "w", json!(3)).await;

    let last = claim_all(&db, "w").await;
    assert_eq!(refs(&last), ["d"]);
    assert_eq!(last[0].parent_outputs, Some(json!({"b": 2, "c": 3})));
    complete(&db, &last[0], "w", json!(null)).await;
    let done = flows::get(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        flow.id,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(done.status, WorkflowStatus::Completed);
}

#[tokio::test]
async fn a_bad_workflow_is_refused_whole() {
    let db = TestDb::new().await;
    let bad = [
        NewWorkflow::new("empty"),
        NewWorkflow::new("unknown").task(step("a").after(["zz"])),
        NewWorkflow::new("twice").task(step("a")).task(step("a")),
        NewWorkflow::new("cycle")
            .task(step("a").after(["b"]))
            .task(step("b").after(["a"])),
        NewWorkflow::new("bad task").task(WorkflowTask::new("a", NewTask::new("", json!({})))),
        NewWorkflow::new("unique").task(WorkflowTask::new(
            "a",
            NewTask::new("k", json!({})).unique("u"),
        )),
    ];
    for flow in &bad {
        let got = flows::enqueue_workflow(
            &mut db.pool.acquire().await.unwrap(),
            &Schema::default(),
            flow,
        )
        .await;
        assert!(
            matches!(got, Err(TaskError::BadInput(_))),
            "{}: {got:?}",
            flow.name
        );
    }
    let (tasks, flows_n, edges): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM tasks), (SELECT count(*) FROM workflows),
                (SELECT count(*) FROM task_parents)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((tasks, flows_n, edges), (0, 0, 0));
}

#[tokio::test]
async fn a_workflow_enqueued_in_a_transaction_that_rolls_back_leaves_nothing() {
    let db = TestDb::new().await;
    let mut tx = db.pool.begin().await.unwrap();
    flows::enqueue_workflow(&mut tx, &Schema::default(), &diamond())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
}

#[tokio::test]
async fn a_failed_parent_cancels_its_descendants_and_cleanup_runs() {
    // a -> b -> c (cancel on failure), a -> tidy (runs anyway), and
    // x -> y where x succeeds: y is untouched by a's failure.
    let db = TestDb::new().await;
    let flow = enqueue(
        &db,
        &NewWorkflow::new("fails")
            .task(step("a"))
            .task(step("b").after(["a"]))
            .task(step("c").after(["b"]))
            .task(step("tidy").after(["a", "x"]).run_on_parent_failure())
            .task(step("x"))
            .task(step("y").after(["x"])),
    )
    .await;
    let id = ids(&flow);
    let roots = claim_all(&db, "w").await;
    assert_eq!(refs(&roots), ["a", "x"]);
    let a = roots
        .iter()
        .find(|t| t.workflow_ref.as_deref() == Some("a"))
        .unwrap();
    let x = roots
        .iter()
        .find(|t| t.workflow_ref.as_deref() == Some("x"))
        .unwrap();
    store::fail(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        a.id,
        &holder("w"),
        a.fencing_token.unwrap(),
        "disk full",
        RetryPolicy::default(),
    )
    .await
    .unwrap();
    for r in ["b", "c"] {
        let t = get(&db, id[r]).await;
        assert_eq!(t.status, TaskStatus::Cancelled, "{r}");
        assert!(t.cancelled_at.is_some());
    }
    assert_eq!(
        get(&db, id["b"]).await.last_error.unwrap(),
        format!("cancelled: parent a (task {}) failed", id["a"])
    );
    assert_eq!(
        get(&db, id["c"]).await.last_error.unwrap(),
        format!("cancelled: parent b (task {}) was cancelled", id["b"])
    );
    // tidy still waits for x; then runs, with x's output only.
    assert_eq!(get(&db, id["tidy"]).await.status, TaskStatus::Waiting);
    complete(&db, x, "w", json!("x done")).await;
    let next = claim_all(&db, "w").await;
    assert_eq!(refs(&next), ["tidy", "y"]);
    let tidy = next
        .iter()
        .find(|t| t.workflow_ref.as_deref() == Some("tidy"))
        .unwrap();
    assert_eq!(tidy.parent_outputs, Some(json!({"x": "x done"})));
    for t in &next {
        complete(&db, t, "w", json!(null)).await;
    }
    let end = flows::get(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        flow.id,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(end.status, WorkflowStatus::Failed);
}

#[tokio::test]
async fn a_cancel_cascades_down_a_chain_of_a_thousand() {
    // The cascade runs as deep as the workflow: each level's cancel fires
    // the trigger for the next. A thousand levels is the most a workflow
    // can have.
    let db = TestDb::new().await;
    let mut flow = NewWorkflow::new("chain").task(step("t0"));
    for i in 1..999 {
        flow = flow.task(step(&format!("t{i}")).after([format!("t{}", i - 1)]));
    }
    // At the bottom, a cleanup below a task the cascade cancels: it runs.
    flow = flow.task(step("tidy").after(["t998"]).run_on_parent_failure());
    let flow = enqueue(&db, &flow).await;
    control::cancel(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        ids(&flow)["t0"],
        "ops",
    )
    .await
    .unwrap();
    let cancelled: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'cancelled'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(cancelled, 999);
    let id = ids(&flow);
    assert_eq!(
        get(&db, id["t998"]).await.last_error.unwrap(),
        format!("cancelled: parent t997 (task {}) was cancelled", id["t997"])
    );
    let tidy = get(&db, id["tidy"]).await;
    assert_eq!((tidy.status, tidy.parents_left), (TaskStatus::Pending, 0));
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM task_parents WHERE outcome IS NULL")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(open, 0, "every edge closed");
    // The root's retry brings the whole chain back, in one statement too.
    control::retry(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        id["t0"],
        "ops",
    )
    .await
    .unwrap();
    let back: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tasks WHERE status = 'waiting' AND parents_left = 1
            AND cascaded_from IS NULL AND last_error IS NULL",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(back, 998);
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM task_parents WHERE outcome IS NULL")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(open, 998, "the chain's edges open again, not tidy's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_parents_ending_at_once_on_two_connections_release_the_child_once() {
    // Each round: p and q complete in two transactions on two connections,
    // both statements run before either commits (the second waits for the
    // child's row lock the first holds), then both commit. The child must
    // be pending after both, with both outputs and no parent left,
    // whichever order they commit in.
    let db = TestDb::new().await;
    for round in 0..20 {
        let flow = enqueue(&db, &join("child")).await;
        let id = ids(&flow);
        let claimed = claim_all(&db, "w").await;
        assert_eq!(refs(&claimed), ["p", "q"]);
        let [p, q] = [by_ref(&claimed, "p").clone(), by_ref(&claimed, "q").clone()];
        let ended = at_once(&db, [p, q], round % 2 == 0, async |conn, t: Task| {
            store::complete(
                conn,
                &Schema::default(),
                t.id,
                &holder("w"),
                t.fencing_token.unwrap(),
                Some(&json!(t.workflow_ref)),
            )
            .await
            .unwrap()
            .status
        })
        .await;
        assert_eq!(ended, [TaskStatus::Processed; 2]);
        let child = get(&db, id["child"]).await;
        assert_eq!(
            (child.status, child.parents_left),
            (TaskStatus::Pending, 0),
            "round {round}"
        );
        assert_eq!(child.parent_outputs, Some(json!({"p": "p", "q": "q"})));
        let next = claim_all(&db, "w").await;
        assert_eq!(refs(&next), ["child"]);
        complete(&db, &next[0], "w", json!(null)).await;
    }
}

#[tokio::test]
async fn a_child_is_not_claimable_while_one_parent_is_uncommitted() {
    let db = TestDb::new().await;
    let flow = enqueue(&db, &join("child")).await;
    let claimed = claim_all(&db, "w").await;
    let mut tx = db.pool.begin().await.unwrap();
    for t in &claimed {
        store::complete(
            &mut tx,
            &Schema::default(),
            t.id,
            &holder("w"),
            t.fencing_token.unwrap(),
            None,
        )
        .await
        .unwrap();
    }
    // Both parents ended in the open transaction: not yet for anyone else.
    assert!(claim_all(&db, "other").await.is_empty());
    tx.commit().await.unwrap();
    let next = claim_all(&db, "other").await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].id, ids(&flow)["child"]);
}

#[tokio::test]
async fn a_workflow_cancel_ends_every_unfinished_task_audited() {
    let db = TestDb::new().await;
    let flow = enqueue(&db, &diamond()).await;
    let a = claim_all(&db, "w").await.remove(0);
    let cancelled = flows::cancel(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        flow.id,
        "ops@example",
    )
    .await
    .unwrap();
    assert_eq!(cancelled.status, WorkflowStatus::Cancelled);
    assert!(
        cancelled
            .tasks
            .iter()
            .all(|t| t.status == TaskStatus::Cancelled)
    );
    // The running task's claim ended: its completion is refused.
    let late = store::complete(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        a.id,
        &holder("w"),
        a.fencing_token.unwrap(),
        None,
    )
    .await;
    assert!(matches!(late, Err(TaskError::Stale { .. })), "{late:?}");
    let audited: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM lease_events WHERE kind = 'operator'
            AND detail->>'action' = 'cancel_task' AND detail->>'by' = 'ops@example'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(audited, 4);
    let missing = flows::cancel(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        flow.id + 1000,
        "ops",
    )
    .await;
    assert!(matches!(missing, Err(TaskError::NotFound(_))));
}

#[tokio::test]
async fn a_retried_child_waits_again_for_an_unfinished_parent() {
    // An operator cancels a waiting child and retries it while its parent
    // still runs: it goes back to waiting, not to pending.
    let db = TestDb::new().await;
    let flow = enqueue(&db, &diamond()).await;
    let id = ids(&flow);
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    control::cancel(&mut conn, &schema, id["b"], "ops")
        .await
        .unwrap();
    let retried = control::retry(&mut conn, &schema, id["b"], "ops")
        .await
        .unwrap();
    assert_eq!(
        (retried.status, retried.parents_left),
        (TaskStatus::Waiting, 1)
    );
    let a = claim_all(&db, "w").await;
    assert_eq!(refs(&a), ["a"]);
    complete(&db, &a[0], "w", json!(1)).await;
    assert_eq!(refs(&claim_all(&db, "w").await), ["b", "c"]);
}

#[tokio::test]
async fn the_links_name_parents_and_children() {
    let db = TestDb::new().await;
    let flow = enqueue(&db, &diamond()).await;
    let id = ids(&flow);
    let links = flows::links(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        id["b"],
    )
    .await
    .unwrap();
    assert_eq!(links.parents.len(), 1);
    assert_eq!(
        (links.parents[0].id, links.parents[0].r#ref.as_str()),
        (id["a"], "a")
    );
    assert_eq!(links.children.len(), 1);
    assert_eq!(links.children[0].id, id["d"]);
    assert_eq!(links.children[0].status, Some(TaskStatus::Waiting));
    let listed = flows::list(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        leasekeeper_core::paging::Cursor::first(),
    )
    .await
    .unwrap();
    assert_eq!((listed.items.len(), listed.next), (1, None));
    assert_eq!((listed.items[0].tasks, listed.items[0].processed), (4, 0));
    assert_eq!(listed.items[0].status, WorkflowStatus::Running);
}

#[tokio::test]
async fn a_parent_whose_holder_died_is_taken_over_and_its_child_runs_once_after() {
    // The parent's holder stops (as after kill -9: no completion, no
    // release) and its lease runs out; a second worker takes the parent
    // over and completes it. The child is claimable only after that
    // completion, and runs once.
    let db = TestDb::new().await;
    let schema = Schema::default();
    let flow = enqueue(
        &db,
        &NewWorkflow::new("crash")
            .task(WorkflowTask::new(
                "p",
                NewTask::new("step", json!({})).max_attempts(3),
            ))
            .task(step("c").after(["p"])),
    )
    .await;
    let id = ids(&flow);
    let mut conn = db.pool.acquire().await.unwrap();
    let first = store::claim_next(
        &mut conn,
        &schema,
        &holder("dead"),
        Duration::from_millis(200),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(first.id, id["p"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let taken = store::claim_next(&mut conn, &schema, &holder("heir"), TTL)
        .await
        .unwrap()
        .expect("the parent, taken over");
    assert_eq!(taken.id, id["p"], "the late parent, not its child");
    assert!(taken.fencing_token > first.fencing_token);
    // The dead holder's completion, arriving late, is refused.
    let late = store::complete(
        &mut conn,
        &schema,
        first.id,
        &holder("dead"),
        first.fencing_token.unwrap(),
        None,
    )
    .await;
    assert!(matches!(late, Err(TaskError::Stale { .. })), "{late:?}");
    assert_eq!(get(&db, id["c"]).await.status, TaskStatus::Waiting);
    complete(&db, &taken, "heir", json!("heir's")).await;
    let child = claim_all(&db, "w").await;
    assert_eq!(refs(&child), ["c"]);
    assert_eq!(child[0].parent_outputs, Some(json!({"p": "heir's"})));
    complete(&db, &child[0], "w", json!(null)).await;
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts WHERE task_id = $1")
        .bind(id["c"])
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(runs, 1);
}

/// The last parent's end wakes an idle worker as an enqueue does: a
/// worker whose poll is a minute long (so only an announcement wakes it)
/// starts the child within a second of the parent's completion, made
/// elsewhere (the tasks trigger sends the announcement). Alone, this fails
/// when the end is not announced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_parent_s_end_wakes_an_idle_worker() {
    use leasekeeper_core::queue::ClaimFilter;
    let db = TestDb::new().await;
    let schema = Schema::default();
    let mut idle = IdleWorker::start(
        &db,
        "wake",
        "child",
        ClaimFilter::default().kinds(vec!["child".to_string()]),
    );
    let flow = enqueue(
        &db,
        &NewWorkflow::new("wake")
            .task(WorkflowTask::new("p", NewTask::new("parent", json!({}))))
            .task(WorkflowTask::new("c", NewTask::new("child", json!({}))).after(["p"])),
    )
    .await;
    // The enqueue woke the worker; it found nothing of its kind claimable.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        idle.starts.try_recv().is_err(),
        "the child started before its parent ended"
    );
    let mut conn = db.pool.acquire().await.unwrap();
    let p = store::claim_next_in(
        &mut conn,
        &schema,
        &holder("elsewhere"),
        TTL,
        &ClaimFilter::default().kinds(vec!["parent".to_string()]),
    )
    .await
    .unwrap()
    .unwrap();
    store::complete(
        &mut conn,
        &schema,
        p.id,
        &holder("elsewhere"),
        p.fencing_token.unwrap(),
        None,
    )
    .await
    .unwrap();
    let ended = tokio::time::Instant::now();
    let (id, at) = tokio::time::timeout(Duration::from_secs(5), idle.starts.recv())
        .await
        .expect("no start within 5 s of the parent's end")
        .unwrap();
    assert_eq!(id, ids(&flow)["c"]);
    let took = at.saturating_duration_since(ended);
    assert!(
        took < Duration::from_secs(1),
        "the child started {took:?} after its parent ended"
    );
    idle.stop().await;
}

/// Fails `task` (claimed by `w`, one attempt) for good.
async fn fail_for_good(db: &TestDb, task: &Task, w: &str) {
    let failed = store::fail(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        task.id,
        &holder(w),
        task.fencing_token.unwrap(),
        "boom",
        RetryPolicy::default(),
    )
    .await
    .unwrap();
    assert_eq!(failed.status, TaskStatus::Failed);
}

/// The task of `tasks` whose ref is `r`.
fn by_ref<'a>(tasks: &'a [Task], r: &str) -> &'a Task {
    tasks
        .iter()
        .find(|t| t.workflow_ref.as_deref() == Some(r))
        .unwrap()
}

#[tokio::test]
async fn a_retried_parent_brings_back_what_its_failure_cancelled() {
    // a -> b -> c, and a -> tidy (runs anyway). a fails for good: b and c
    // are cancelled, tidy runs. The operator retries a: b and c wait for
    // it again; a's success then runs b, then c. tidy is not run again.
    let db = TestDb::new().await;
    let schema = Schema::default();
    let flow = enqueue(
        &db,
        &NewWorkflow::new("again")
            .task(step("a"))
            .task(step("b").after(["a"]))
            .task(step("c").after(["b"]))
            .task(step("tidy").after(["a"]).run_on_parent_failure()),
    )
    .await;
    let id = ids(&flow);
    let a = claim_all(&db, "w").await.remove(0);
    fail_for_good(&db, &a, "w").await;
    let tidy = claim_all(&db, "w").await;
    assert_eq!(refs(&tidy), ["tidy"]);
    complete(&db, &tidy[0], "w", json!("tidied")).await;
    assert_eq!(get(&db, id["c"]).await.status, TaskStatus::Cancelled);

    let retried = control::retry(
        &mut db.pool.acquire().await.unwrap(),
        &schema,
        id["a"],
        "ops",
    )
    .await
    .unwrap();
    assert_eq!(retried.status, TaskStatus::Pending);
    for r in ["b", "c"] {
        let t = get(&db, id[r]).await;
        assert_eq!(
            (t.status, t.parents_left, t.last_error, t.cancelled_at),
            (TaskStatus::Waiting, 1, None, None),
            "{r}"
        );
    }
    assert_eq!(get(&db, id["tidy"]).await.status, TaskStatus::Processed);
    // The edges into b and c are open again; tidy's stays closed, with the
    // time a's failure closed it.
    let edges: Vec<(String, Option<String>, bool)> = sqlx::query_as(
        "SELECT parent_ref || '>' || (SELECT workflow_ref FROM tasks WHERE id = task_id),
                outcome, ended_at IS NOT NULL
           FROM task_parents ORDER BY task_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        edges,
        [
            ("a>b".to_string(), None, false),
            ("b>c".to_string(), None, false),
            ("a>tidy".to_string(), Some("failed".to_string()), true),
        ]
    );
    let status = |db: &TestDb| {
        let pool = db.pool.clone();
        async move {
            flows::get(
                &mut pool.acquire().await.unwrap(),
                &Schema::default(),
                flow.id,
            )
            .await
            .unwrap()
            .unwrap()
            .status
        }
    };
    assert_eq!(status(&db).await, WorkflowStatus::Running);
    for (r, output) in [("a", "a again"), ("b", "b"), ("c", "c")] {
        let next = claim_all(&db, "w").await;
        assert_eq!(refs(&next), [r]);
        if r == "b" {
            assert_eq!(next[0].parent_outputs, Some(json!({"a": "a again"})));
        }
        complete(&db, &next[0], "w", json!(output)).await;
    }
    assert!(claim_all(&db, "w").await.is_empty(), "tidy ran once");
    assert_eq!(status(&db).await, WorkflowStatus::Completed);
}

#[tokio::test]
async fn a_child_with_another_failed_parent_comes_back_only_when_both_are_retried() {
    // p, q -> c -> d, and c cancels on failure. Both parents fail for
    // good. Retrying p alone leaves c and d cancelled (q still failed);
    // p then succeeds; retrying q (in bulk, as the dead letters' "retry
    // these") brings c back waiting for q only, with p's output already.
    let db = TestDb::new().await;
    let schema = Schema::default();
    let flow = enqueue(
        &db,
        &NewWorkflow::new("two")
            .task(step("p"))
            .task(WorkflowTask::new(
                "q",
                NewTask::new("other", json!({})).max_attempts(1),
            ))
            .task(step("c").after(["p", "q"]))
            .task(step("d").after(["c"])),
    )
    .await;
    let id = ids(&flow);
    let roots = claim_all(&db, "w").await;
    fail_for_good(&db, by_ref(&roots, "p"), "w").await;
    fail_for_good(&db, by_ref(&roots, "q"), "w").await;
    assert_eq!(get(&db, id["c"]).await.status, TaskStatus::Cancelled);

    control::retry(
        &mut db.pool.acquire().await.unwrap(),
        &schema,
        id["p"],
        "ops",
    )
    .await
    .unwrap();
    for r in ["c", "d"] {
        assert_eq!(get(&db, id[r]).await.status, TaskStatus::Cancelled, "{r}");
    }
    let p = claim_all(&db, "w").await;
    assert_eq!(refs(&p), ["p"]);
    complete(&db, &p[0], "w", json!("p's")).await;
    assert_eq!(get(&db, id["c"]).await.status, TaskStatus::Cancelled);

    let filter = control::TaskFilter {
        status: TaskStatus::Failed,
        kind: Some("other".into()),
        queue: None,
        data: None,
        error_group: None,
    };
    let n = control::retry_matching(&db.pool, &schema, &filter, "ops")
        .await
        .unwrap();
    assert_eq!(n, 1);
    let c = get(&db, id["c"]).await;
    assert_eq!((c.status, c.parents_left), (TaskStatus::Waiting, 1));
    assert_eq!(c.parent_outputs, Some(json!({"p": "p's"})));
    assert_eq!(get(&db, id["d"]).await.status, TaskStatus::Waiting);
    let q = claim_all(&db, "w").await;
    assert_eq!(refs(&q), ["q"]);
    complete(&db, &q[0], "w", json!("q's")).await;
    let c = claim_all(&db, "w").await;
    assert_eq!(refs(&c), ["c"]);
    assert_eq!(c[0].parent_outputs, Some(json!({"p": "p's", "q": "q's"})));
}

#[tokio::test]
async fn an_operator_s_cancel_of_a_child_is_not_undone_by_its_parent_s_retry() {
    // Only the cascade's cancels come back: a child the operator cancelled
    // stays cancelled when its parent is retried.
    let db = TestDb::new().await;
    let schema = Schema::default();
    let flow = enqueue(&db, &diamond()).await;
    let id = ids(&flow);
    let mut conn = db.pool.acquire().await.unwrap();
    control::cancel(&mut conn, &schema, id["b"], "ops")
        .await
        .unwrap();
    let a = claim_all(&db, "w").await.remove(0);
    fail_for_good(&db, &a, "w").await;
    assert_eq!(get(&db, id["c"]).await.status, TaskStatus::Cancelled);
    control::retry(&mut conn, &schema, id["a"], "ops")
        .await
        .unwrap();
    assert_eq!(get(&db, id["b"]).await.status, TaskStatus::Cancelled);
    assert_eq!(get(&db, id["c"]).await.status, TaskStatus::Waiting);
    // d's other parent, b, stays cancelled: d stays cancelled too.
    assert_eq!(get(&db, id["d"]).await.status, TaskStatus::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_retries_at_once_of_two_failed_parents_bring_the_child_back() {
    // Each round: p and q failed for good, c cancelled. p and q are
    // retried in two transactions on two connections, both statements
    // sent before either commits, commits alternating. Whichever commits
    // second must find the other's retry and bring c back: c waits for
    // both, never stays cancelled with both parents running again.
    let db = TestDb::new().await;
    for round in 0..20 {
        let flow = enqueue(&db, &join("c")).await;
        let id = ids(&flow);
        let claimed = claim_all(&db, "w").await;
        for t in &claimed {
            fail_for_good(&db, t, "w").await;
        }
        assert_eq!(get(&db, id["c"]).await.status, TaskStatus::Cancelled);
        let retried = at_once(
            &db,
            [id["p"], id["q"]],
            round % 2 == 0,
            async |conn, task| {
                control::retry(conn, &Schema::default(), task, "ops")
                    .await
                    .unwrap()
                    .status
            },
        )
        .await;
        assert_eq!(retried, [TaskStatus::Pending; 2]);
        let c = get(&db, id["c"]).await;
        assert_eq!(
            (c.status, c.parents_left),
            (TaskStatus::Waiting, 2),
            "round {round}"
        );
        for t in claim_all(&db, "w").await {
            complete(&db, &t, "w", json!(null)).await;
        }
        let c = claim_all(&db, "w").await;
        assert_eq!(refs(&c), ["c"], "round {round}");
        complete(&db, &c[0], "w", json!(null)).await;
    }
}

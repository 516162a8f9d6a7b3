//! Durable waits (issue 40): a handler ends its attempt waiting for a
//! signal; the task waits as a row through a runtime's restart; a signal
//! makes it run again with the payload; a timeout without one; a signal
//! it does not wait for is refused; two signals racing wake it once.

use crate::common::{TestDb, holder, until};
use leasekeeper_core::db::Schema;
use leasekeeper_core::queue::store::{self, TaskError};
use leasekeeper_core::queue::{NewTask, TaskStatus};
use leasekeeper_core::{Done, HandlerResult, Job, Runtime, TaskContext};
use serde_json::json;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

/// A handler that waits for `approval` on its first run, and on the next
/// completes with the signals it got.
async fn approve(job: Job, _ctx: TaskContext) -> HandlerResult {
    if job.signals.is_empty() && job.attempt == 1 && job.data["waited"].is_null() {
        return Ok(Done::wait_for("approval", Duration::from_secs(3600)));
    }
    Ok(Done::output(json!({
        "signals": job.signals,
        "attempt": job.attempt,
    })))
}

async fn runtime(db: &TestDb) -> Runtime {
    Runtime::builder(db.pool.clone())
        .queue("default", 2)
        .scheduler(None)
        .handler("approve", approve)
        .start()
        .await
        .unwrap()
}

async fn status(db: &TestDb, id: i64) -> TaskStatus {
    store::get(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        id,
    )
    .await
    .unwrap()
    .unwrap()
    .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_survives_a_restart_and_a_signal_resumes_it_once() {
    let db = TestDb::new().await;
    let schema = Schema::default();
    let rt = runtime(&db).await;
    let task = store::enqueue(
        &mut db.pool.acquire().await.unwrap(),
        &schema,
        &NewTask::new("approve", json!({})),
    )
    .await
    .unwrap();
    until("the task waits", Duration::from_secs(10), || async {
        status(&db, task.id).await == TaskStatus::Waiting
    })
    .await;
    let waiting = store::get(&mut db.pool.acquire().await.unwrap(), &schema, task.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(waiting.wait_signal.as_deref(), Some("approval"));
    assert_eq!(waiting.attempts, 0, "a wait gives its attempt back");
    assert!(
        waiting.must_heartbeat_before.is_none(),
        "its claim is released"
    );
    // The process goes away; the wait is a row.
    rt.shutdown().await;
    let rt = runtime(&db).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(status(&db, task.id).await, TaskStatus::Waiting);

    let mut conn = db.pool.acquire().await.unwrap();
    let wrong = store::signal(&mut conn, &schema, task.id, "other", &json!(1)).await;
    assert!(
        matches!(&wrong, Err(TaskError::Conflict(why)) if why.contains("waits for the signal \"approval\"")),
        "{wrong:?}"
    );
    let woken = store::signal(
        &mut conn,
        &schema,
        task.id,
        "approval",
        &json!({"by": "ada"}),
    )
    .await
    .unwrap();
    assert_eq!(woken.status, TaskStatus::Pending);
    until("the task completes", Duration::from_secs(10), || async {
        status(&db, task.id).await == TaskStatus::Processed
    })
    .await;
    let done = store::get(&mut conn, &schema, task.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        done.task_output,
        Some(json!({"signals": {"approval": {"by": "ada"}}, "attempt": 1}))
    );
    let again = store::signal(&mut conn, &schema, task.id, "approval", &json!(2)).await;
    assert!(
        matches!(&again, Err(TaskError::Conflict(why)) if why.contains("is processed")),
        "{again:?}"
    );
    let outcomes: Vec<String> =
        sqlx::query_scalar("SELECT outcome FROM attempts WHERE task_id = $1 ORDER BY number")
            .bind(task.id)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(outcomes, ["waited", "completed"]);
    // Read back as the API and the task page read them.
    let attempts = store::attempts(&mut conn, &schema, task.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        [
            leasekeeper_core::queue::AttemptOutcome::Waited,
            leasekeeper_core::queue::AttemptOutcome::Completed
        ]
    );
    let history: Vec<String> = sqlx::query_scalar(
        "SELECT kind FROM lease_events WHERE resource = $1 AND kind IN ('waiting', 'signalled')
          ORDER BY id",
    )
    .bind(format!("task:{}", task.id))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(history, ["waiting", "signalled"]);
    rt.shutdown().await;
}

/// A task claimed by `w` and waiting for `signal` for `timeout`.
async fn waiting(db: &TestDb, signal: &str, timeout: Duration) -> i64 {
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    store::enqueue(&mut conn, &schema, &NewTask::new("k", json!({})))
        .await
        .unwrap();
    let t = store::claim_next(&mut conn, &schema, &holder("w"), TTL)
        .await
        .unwrap()
        .unwrap();
    store::wait_for(
        &mut conn,
        &schema,
        t.id,
        &holder("w"),
        t.fencing_token.unwrap(),
        signal,
        timeout,
    )
    .await
    .unwrap();
    t.id
}

#[tokio::test]
async fn a_wait_times_out_into_a_claim_without_the_signal() {
    let db = TestDb::new().await;
    let schema = Schema::default();
    let id = waiting(&db, "approval", Duration::from_millis(50)).await;
    let mut conn = db.pool.acquire().await.unwrap();
    assert!(
        store::claim_next(&mut conn, &schema, &holder("w2"), TTL)
            .await
            .unwrap()
            .is_none(),
        "a waiting task is never claimed"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        store::resume_timed_out(&mut conn, &schema, 100)
            .await
            .unwrap(),
        1
    );
    let claimed = store::claim_next(&mut conn, &schema, &holder("w2"), TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, id);
    assert_eq!(claimed.signals, None);
    assert_eq!(claimed.attempts, 1, "the wait used no attempt");
    let late = store::signal(&mut conn, &schema, id, "approval", &json!(1)).await;
    assert!(matches!(late, Err(TaskError::Conflict(_))), "{late:?}");
}

#[tokio::test]
async fn a_wait_from_a_claim_that_is_not_current_is_refused() {
    let db = TestDb::new().await;
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    store::enqueue(&mut conn, &schema, &NewTask::new("k", json!({})))
        .await
        .unwrap();
    let t = store::claim_next(&mut conn, &schema, &holder("w"), TTL)
        .await
        .unwrap()
        .unwrap();
    let stale = store::wait_for(
        &mut conn,
        &schema,
        t.id,
        &holder("w"),
        t.fencing_token.unwrap() + 1,
        "s",
        Duration::from_secs(1),
    )
    .await;
    assert!(matches!(stale, Err(TaskError::Stale { .. })), "{stale:?}");
    let bad = store::wait_for(
        &mut conn,
        &schema,
        t.id,
        &holder("w"),
        1,
        "",
        Duration::from_secs(1),
    )
    .await;
    assert!(matches!(bad, Err(TaskError::BadInput(_))), "{bad:?}");
    assert_eq!(
        store::get(&mut conn, &schema, t.id)
            .await
            .unwrap()
            .unwrap()
            .status,
        TaskStatus::Started
    );
    let missing = store::signal(&mut conn, &schema, 999_999, "s", &json!(null)).await;
    assert!(matches!(missing, Err(TaskError::NotFound(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_signals_racing_wake_the_task_once() {
    let db = TestDb::new().await;
    for round in 0..20 {
        let id = waiting(&db, "go", Duration::from_secs(3600)).await;
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
        let mut handles = Vec::new();
        for n in 0..2 {
            let (pool, barrier) = (db.pool.clone(), barrier.clone());
            handles.push(tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                barrier.wait().await;
                store::signal(&mut conn, &Schema::default(), id, "go", &json!(n)).await
            }));
        }
        let mut woke = 0;
        for h in handles {
            match h.await.unwrap() {
                Ok(t) => {
                    woke += 1;
                    assert_eq!(t.signals.as_ref().unwrap().as_object().unwrap().len(), 1);
                }
                Err(TaskError::Conflict(_)) => {}
                Err(e) => panic!("round {round}: {e}"),
            }
        }
        assert_eq!(woke, 1, "round {round}");
        let t = store::claim_next(
            &mut db.pool.acquire().await.unwrap(),
            &Schema::default(),
            &holder("w"),
            TTL,
        )
        .await
        .unwrap();
        let row = store::get(
            &mut db.pool.acquire().await.unwrap(),
            &Schema::default(),
            id,
        )
        .await
        .unwrap()
        .unwrap();
        let t = t.unwrap_or_else(|| panic!("round {round}: nothing claimable; the task: {row:?}"));
        assert_eq!(t.id, id);
        store::complete(
            &mut db.pool.acquire().await.unwrap(),
            &Schema::default(),
            t.id,
            &holder("w"),
            t.fencing_token.unwrap(),
            None,
        )
        .await
        .unwrap();
    }
}

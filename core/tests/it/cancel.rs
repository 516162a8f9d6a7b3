//! Cancels that reach the handler: an operator's cancel (one task or in
//! bulk) or force-release of a started task's lease completes the running
//! handler's `TaskContext::cancelled()` within a second, through the
//! announcement and the heartbeat it prompts (the runtime's heartbeats are
//! 10 s apart here, so only the announcement explains a quick stop). A
//! worker that hears nothing and a handler that ignores the signal are
//! fenced all the same.

use crate::common::TestDb;
use leasekeeper_core::db::Schema;
use leasekeeper_core::lease::Holder;
use leasekeeper_core::queue::control::{self, TaskFilter};
use leasekeeper_core::queue::store::{self, FencedTransaction};
use leasekeeper_core::queue::{ClaimFilter, NewTask, Task, TaskStatus};
use leasekeeper_core::worker::chaos::{Chaos, ChaosSettings};
use leasekeeper_core::worker::handler::Handlers;
use leasekeeper_core::worker::in_process::InProcess;
use leasekeeper_core::worker::run::{Worker, WorkerConfig};
use leasekeeper_core::{Done, HandlerResult, Job, Runtime, TaskContext};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What a handler went through: started, or saw `cancelled()` complete.
#[derive(Debug, PartialEq)]
enum Seen {
    Started(i64),
    Cancelled(i64),
    Finished(i64),
}

/// A handler that says when it starts, then waits for `cancelled()` (an
/// hour at most) and says when that completed.
fn waits_for_cancel(
    seen: mpsc::UnboundedSender<(Seen, Instant)>,
) -> impl Fn(Job, TaskContext) -> std::pin::Pin<Box<dyn Future<Output = HandlerResult> + Send>>
+ Send
+ Sync
+ 'static {
    move |job: Job, ctx: TaskContext| {
        let seen = seen.clone();
        Box::pin(async move {
            let _ = seen.send((Seen::Started(job.id), Instant::now()));
            tokio::select! {
                () = ctx.cancelled() => {
                    let _ = seen.send((Seen::Cancelled(job.id), Instant::now()));
                    Err("cancelled".into())
                }
                () = tokio::time::sleep(Duration::from_secs(3600)) => Ok(Done::empty()),
            }
        })
    }
}

/// A runtime of `n` workers running [`waits_for_cancel`] for kind `long`,
/// heartbeating every 10 s (a 30 s lease).
async fn runtime(db: &TestDb, n: usize) -> (Runtime, mpsc::UnboundedReceiver<(Seen, Instant)>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let runtime = Runtime::builder(db.pool.clone())
        .queue("default", n)
        .lease(Duration::from_secs(30), Duration::from_secs(10))
        .scheduler(None)
        .handler("long", waits_for_cancel(tx))
        .start()
        .await
        .unwrap();
    (runtime, rx)
}

async fn enqueue(db: &TestDb, n: usize) -> Vec<i64> {
    let mut conn = db.pool.acquire().await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..n {
        let task = store::enqueue(
            &mut conn,
            &Schema::default(),
            &NewTask::new("long", json!({})),
        )
        .await
        .unwrap();
        ids.push(task.id);
    }
    ids
}

/// The next thing a handler saw, within `limit`.
async fn next(
    rx: &mut mpsc::UnboundedReceiver<(Seen, Instant)>,
    limit: Duration,
) -> (Seen, Instant) {
    tokio::time::timeout(limit, rx.recv())
        .await
        .expect("the handler said nothing in time")
        .expect("the handlers are gone")
}

async fn status(db: &TestDb, id: i64) -> TaskStatus {
    store::get(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        id,
    )
    .await
    .unwrap()
    .expect("the task")
    .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_sees_an_operator_cancel_in_under_a_second() {
    let db = TestDb::new().await;
    let (runtime, mut seen) = runtime(&db, 1).await;
    let id = enqueue(&db, 1).await[0];
    assert_eq!(
        next(&mut seen, Duration::from_secs(10)).await.0,
        Seen::Started(id)
    );
    // Well before the first heartbeat (10 s after the claim).
    tokio::time::sleep(Duration::from_millis(200)).await;
    control::cancel(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        id,
        "ops@example",
    )
    .await
    .unwrap();
    // From the commit (the call returned): the cancel exists from then on.
    // The statement's own time, long on a loaded CI machine, is not the
    // signal's.
    let cancelled_at = Instant::now();
    let (what, at) = next(&mut seen, Duration::from_secs(5)).await;
    assert_eq!(what, Seen::Cancelled(id));
    let took = at - cancelled_at;
    assert!(
        took < Duration::from_secs(1),
        "the handler saw the cancel after {took:?}"
    );
    println!("cancel to cancelled(): {took:?}");
    assert_eq!(status(&db, id).await, TaskStatus::Cancelled);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_cancel_reaches_every_handler() {
    let db = TestDb::new().await;
    let (runtime, mut seen) = runtime(&db, 3).await;
    let mut ids = enqueue(&db, 3).await;
    let mut started = Vec::new();
    for _ in 0..3 {
        match next(&mut seen, Duration::from_secs(10)).await.0 {
            Seen::Started(id) => started.push(id),
            other => panic!("{other:?} before every task started"),
        }
    }
    started.sort_unstable();
    ids.sort_unstable();
    assert_eq!(started, ids);
    let filter = TaskFilter {
        status: TaskStatus::Started,
        kind: Some("long".into()),
        queue: None,
        data: None,
        error_group: None,
    };
    let n = control::cancel_matching(&db.pool, &Schema::default(), &filter, "ops")
        .await
        .unwrap();
    assert_eq!(n, 3);
    // From the commit, as above.
    let cancelled_at = Instant::now();
    let mut cancelled = Vec::new();
    for _ in 0..3 {
        let (what, at) = next(&mut seen, Duration::from_secs(5)).await;
        let Seen::Cancelled(id) = what else {
            panic!("{what:?}")
        };
        let took = at - cancelled_at;
        assert!(
            took < Duration::from_secs(1),
            "task {id} saw the cancel after {took:?}"
        );
        cancelled.push(id);
    }
    cancelled.sort_unstable();
    assert_eq!(cancelled, ids);
    runtime.shutdown().await;
}

/// The host's own table, which a handler writes in its fenced transaction.
async fn ledger(db: &TestDb) {
    sqlx::query("CREATE TABLE public.ledger (task_id bigint NOT NULL)")
        .execute(&db.pool)
        .await
        .unwrap();
}

async fn ledger_rows(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM public.ledger")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_ignores_the_cancel_is_fenced() {
    // A worker that hears no announcements (as one over the REST API) runs
    // a handler that ignores `cancelled()`: it finishes after the cancel,
    // writes its effect in its fenced transaction and completes. The
    // completion is refused and recorded, and the effect rolls back.
    let db = TestDb::new().await;
    ledger(&db).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let handlers = Handlers::new().register("long", move |job: Job, ctx: TaskContext| {
        let seen = tx.clone();
        async move {
            let _ = seen.send((Seen::Started(job.id), Instant::now()));
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let mut fenced: FencedTransaction = ctx.transaction().await?;
            sqlx::query("INSERT INTO ledger (task_id) VALUES ($1)")
                .bind(job.id)
                .execute(&mut *fenced)
                .await?;
            HandlerResult::Ok(Done::in_transaction(json!({"done": true}), fenced))
        }
    });
    let transport = InProcess::new(db.pool.clone(), Duration::from_secs(30), Arc::from("deaf"))
        .serving(ClaimFilter::default().kinds(vec!["long".to_string()]));
    let (worker, controls) = Worker::new(
        Holder::parse("deaf-w1").unwrap(),
        transport.clone(),
        handlers,
        WorkerConfig::new(Duration::from_secs(30), Duration::from_secs(10)),
        Chaos::from_os(ChaosSettings::off()),
    );
    let running = tokio::spawn(worker.run());
    let id = enqueue(&db, 1).await[0];
    assert_eq!(
        next(&mut seen, Duration::from_secs(10)).await.0,
        Seen::Started(id)
    );
    control::cancel(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        id,
        "ops",
    )
    .await
    .unwrap();
    let refused = async {
        loop {
            let kinds: Vec<(String, Option<String>)> = sqlx::query_as(
                "SELECT kind, detail->>'op' FROM lease_events WHERE resource = $1 ORDER BY id",
            )
            .bind(Task::resource_name(id))
            .fetch_all(&db.pool)
            .await
            .unwrap();
            if kinds.iter().any(|(k, _)| k == "stale_write_refused") {
                return kinds;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let kinds = tokio::time::timeout(Duration::from_secs(10), refused)
        .await
        .expect("the late completion refused and recorded");
    assert!(
        kinds.contains(&(
            "stale_write_refused".to_string(),
            Some("complete".to_string())
        )),
        "{kinds:?}"
    );
    assert_eq!(status(&db, id).await, TaskStatus::Cancelled);
    assert_eq!(
        ledger_rows(&db).await,
        0,
        "the effect rolled back with the refused completion"
    );
    controls.stop();
    running.await.unwrap();
    transport.flush().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_ignoring_the_cancel_in_a_hearing_worker_writes_nothing() {
    // The runtime's worker hears the cancel and loses the claim at once; its
    // handler carries on regardless and answers within the lost grace: the
    // answer is discarded, its fenced effect never commits, and the task
    // stays cancelled.
    let db = TestDb::new().await;
    ledger(&db).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let runtime = Runtime::builder(db.pool.clone())
        .queue("default", 1)
        .lease(Duration::from_secs(30), Duration::from_secs(10))
        .lost_grace(Duration::from_secs(5))
        .scheduler(None)
        .handler("long", move |job: Job, ctx: TaskContext| {
            let seen = tx.clone();
            async move {
                let _ = seen.send((Seen::Started(job.id), Instant::now()));
                tokio::time::sleep(Duration::from_millis(1000)).await;
                let mut fenced = ctx.transaction().await?;
                sqlx::query("INSERT INTO ledger (task_id) VALUES ($1)")
                    .bind(job.id)
                    .execute(&mut *fenced)
                    .await?;
                let _ = seen.send((Seen::Finished(job.id), Instant::now()));
                HandlerResult::Ok(Done::in_transaction(json!({"done": true}), fenced))
            }
        })
        .start()
        .await
        .unwrap();
    let id = enqueue(&db, 1).await[0];
    assert_eq!(
        next(&mut seen, Duration::from_secs(10)).await.0,
        Seen::Started(id)
    );
    control::cancel(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        id,
        "ops",
    )
    .await
    .unwrap();
    // The handler ran to its end (it ignored the signal)...
    assert_eq!(
        next(&mut seen, Duration::from_secs(5)).await.0,
        Seen::Finished(id)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ... and nothing of it stayed.
    assert_eq!(status(&db, id).await, TaskStatus::Cancelled);
    assert_eq!(ledger_rows(&db).await, 0);
    runtime.shutdown().await;
}

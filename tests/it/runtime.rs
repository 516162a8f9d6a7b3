//! The worker runtime a service embeds, against a real database: handlers
//! by kind, queues with their own concurrency, priorities, retries of
//! errors and panics, and fenced transactional effects.

use crate::common::TestDb;
use leasekeeper_core::queue::store::{self, RetryPolicy};
use leasekeeper_core::queue::{NewTask, Task, TaskStatus};
use leasekeeper_core::worker::handler::{Done, HandlerResult, Job, TaskContext};
use leasekeeper_core::worker::runtime::{Runtime, RuntimeError};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

async fn enqueue(db: &TestDb, task: NewTask) -> Task {
    store::enqueue(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &task,
    )
    .await
    .unwrap()
}

async fn task(db: &TestDb, id: i64) -> Task {
    store::get(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        id,
    )
    .await
    .unwrap()
    .unwrap()
}

/// Waits up to `within` for `check` to hold.
async fn until<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    while !check().await {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_honour_priority_then_due_time_and_serve_only_their_queue_and_kinds() {
    let db = TestDb::new().await;
    // Enqueued before the runtime starts, in an order priority must undo.
    let mut ids = Vec::new();
    for (n, priority) in [(0, 5), (1, 0), (2, -3), (3, 0), (4, 5)] {
        let t = enqueue(
            &db,
            NewTask::new("note", json!({ "n": n })).priority(priority),
        )
        .await;
        ids.push(t.id);
    }
    let other_queue = enqueue(&db, NewTask::new("note", json!({})).queue("elsewhere")).await;
    let other_kind = enqueue(&db, NewTask::new("unhandled", json!({}))).await;

    let order = Arc::new(Mutex::new(Vec::new()));
    let seen = order.clone();
    let runtime = Runtime::builder(db.pool.clone())
        .id("rt-prio")
        .queue("default", 1)
        .handler("note", move |job: Job, _: TaskContext| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(job.data["n"].as_i64().unwrap());
                HandlerResult::Ok(Done::output(json!({ "noted": job.id })))
            }
        })
        .start()
        .await
        .unwrap();
    until("five notes", Duration::from_secs(10), || async {
        order.lock().unwrap().len() == 5
    })
    .await;
    // Priority -3 first, then the two 0s in enqueue order, then the 5s.
    assert_eq!(*order.lock().unwrap(), vec![2, 1, 3, 0, 4]);
    // The handler has run; its completion is written by the batching
    // completer a moment later.
    until("five processed", Duration::from_secs(10), || async {
        let mut done = 0;
        for id in &ids {
            done += usize::from(task(&db, *id).await.status == TaskStatus::Processed);
        }
        done == ids.len()
    })
    .await;
    for id in &ids {
        let t = task(&db, *id).await;
        assert_eq!(t.status, TaskStatus::Processed);
        assert_eq!(t.task_output, Some(json!({ "noted": id })));
        assert!(t.processor.unwrap().starts_with("rt-prio-default-"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(task(&db, other_queue.id).await.status, TaskStatus::Pending);
    let untouched = task(&db, other_kind.id).await;
    assert_eq!(untouched.status, TaskStatus::Pending);
    assert_eq!(
        untouched.attempts, 0,
        "a kind without a handler is not even claimed"
    );

    // The runtime and its worker are visible like any instance.
    let (alive, kind): (bool, String) = sqlx::query_as(
        "SELECT stopped_at IS NULL, (SELECT kind FROM workers WHERE instance_id = 'rt-prio' LIMIT 1)
           FROM instances WHERE id = 'rt-prio'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(alive);
    assert_eq!(kind, "embedded");
    runtime.shutdown().await;
    let stopped: bool =
        sqlx::query_scalar("SELECT stopped_at IS NOT NULL FROM instances WHERE id = 'rt-prio'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_queue_runs_at_its_own_concurrency() {
    let db = TestDb::new().await;
    for _ in 0..6 {
        enqueue(&db, NewTask::new("slow", json!({})).queue("wide")).await;
        enqueue(&db, NewTask::new("slow", json!({})).queue("narrow")).await;
    }
    let running: Arc<Mutex<std::collections::HashMap<String, (usize, usize)>>> = Arc::default();
    let seen = running.clone();
    let runtime = Runtime::builder(db.pool.clone())
        .queue("wide", 3)
        .queue("narrow", 1)
        .handler("slow", move |job: Job, _: TaskContext| {
            let seen = seen.clone();
            async move {
                {
                    let mut map = seen.lock().unwrap();
                    let (now, peak) = map.entry(job.queue.clone()).or_default();
                    *now += 1;
                    *peak = (*peak).max(*now);
                }
                // Long enough for every worker of a queue to be at work at
                // once, even when claims are slow on a loaded machine.
                tokio::time::sleep(Duration::from_millis(500)).await;
                seen.lock().unwrap().get_mut(&job.queue).unwrap().0 -= 1;
                HandlerResult::Ok(Done::empty())
            }
        })
        .start()
        .await
        .unwrap();
    assert_eq!(runtime.worker_count(), 4);
    until("all twelve done", Duration::from_secs(20), || async {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status <> 'processed'")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        left == 0
    })
    .await;
    let map = running.lock().unwrap().clone();
    assert_eq!(map["wide"].1, 3, "{map:?}");
    assert_eq!(map["narrow"].1, 1, "{map:?}");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_and_panics_are_failed_attempts_retried_then_failed() {
    let db = TestDb::new().await;
    let flaky = enqueue(&db, NewTask::new("flaky", json!({})).max_attempts(3)).await;
    let broken = enqueue(&db, NewTask::new("broken", json!({})).max_attempts(2)).await;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let runtime = Runtime::builder(db.pool.clone())
        .queue("default", 2)
        .retry(RetryPolicy::exponential(
            Duration::from_millis(50),
            Duration::from_millis(100),
        ))
        .handler("flaky", move |job: Job, _: TaskContext| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(job.attempt);
                if job.attempt < 3 {
                    panic!("attempt {} blew up", job.attempt);
                }
                HandlerResult::Ok(Done::output(json!({ "attempt": job.attempt })))
            }
        })
        .handler("broken", |_: Job, _: TaskContext| async {
            Err::<Done, _>(std::io::Error::other("disk on fire").into())
        })
        .start()
        .await
        .unwrap();
    until("both finished", Duration::from_secs(20), || async {
        let a = task(&db, flaky.id).await.status;
        let b = task(&db, broken.id).await.status;
        a == TaskStatus::Processed && b == TaskStatus::Failed
    })
    .await;
    assert_eq!(
        *calls.lock().unwrap(),
        vec![1, 2, 3],
        "panics retried, runtime alive"
    );
    let flaky = task(&db, flaky.id).await;
    assert_eq!(flaky.task_output, Some(json!({ "attempt": 3 })));
    assert_eq!(
        flaky.last_error.as_deref(),
        Some("the handler panicked: attempt 2 blew up")
    );
    let broken = task(&db, broken.id).await;
    assert_eq!(broken.attempts, 2);
    assert_eq!(broken.last_error.as_deref(), Some("disk on fire"));
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_transaction_commits_with_its_completion() {
    let db = TestDb::new().await;
    sqlx::query("CREATE TABLE public.outbox (task_id int PRIMARY KEY, body text NOT NULL)")
        .execute(&db.pool)
        .await
        .unwrap();
    let t = enqueue(&db, NewTask::new("mail", json!({ "to": "ada" }))).await;
    let runtime = Runtime::builder(db.pool.clone())
        .handler("mail", |job: Job, ctx: TaskContext| async move {
            let mut tx = ctx.transaction().await?;
            sqlx::query("INSERT INTO outbox (task_id, body) VALUES ($1, $2)")
                .bind(job.id)
                .bind(format!("hello {}", job.data["to"].as_str().unwrap_or("?")))
                .execute(&mut *tx)
                .await?;
            Ok(Done::in_transaction(json!("queued"), tx))
        })
        .start()
        .await
        .unwrap();
    until("processed", Duration::from_secs(10), || async {
        task(&db, t.id).await.status == TaskStatus::Processed
    })
    .await;
    let body: String = sqlx::query_scalar("SELECT body FROM public.outbox WHERE task_id = $1")
        .bind(t.id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(body, "hello ada");
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_runtime_that_cannot_work_is_refused_with_a_clear_error() {
    let db = TestDb::new().await;
    let none = Runtime::builder(db.pool.clone()).start().await;
    assert!(matches!(&none, Err(RuntimeError::Config(m)) if m.contains("at least one handler")));
    let zero = Runtime::builder(db.pool.clone())
        .queue("default", 0)
        .handler("x", |_: Job, _: TaskContext| async {
            HandlerResult::Ok(Done::empty())
        })
        .start()
        .await;
    assert!(matches!(&zero, Err(RuntimeError::Config(m)) if m.contains("concurrency")));
    let bad_queue = Runtime::builder(db.pool.clone())
        .queue("", 1)
        .handler("x", |_: Job, _: TaskContext| async {
            HandlerResult::Ok(Done::empty())
        })
        .start()
        .await;
    assert!(matches!(&bad_queue, Err(RuntimeError::Config(m)) if m.contains("queue")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_lists_a_services_runtime_and_refuses_to_kill_its_workers() {
    let api = crate::api::Api::new().await;
    let runtime = Runtime::builder(api.db.pool.clone())
        .id("svc-1")
        .queue("default", 2)
        .handler("note", |_: Job, _: TaskContext| async {
            HandlerResult::Ok(Done::empty())
        })
        .start()
        .await
        .unwrap();
    // Each worker records itself as it starts.
    until("both workers listed", Duration::from_secs(10), || async {
        let (_, workers) = api.get("/api/workers").await;
        workers
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["instance_id"] == "svc-1")
            .count()
            == 2
    })
    .await;
    let (s, workers) = api.get("/api/workers").await;
    assert_eq!(s, axum::http::StatusCode::OK);
    let ours: Vec<&serde_json::Value> = workers
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["instance_id"] == "svc-1")
        .collect();
    assert_eq!(ours.len(), 2, "{workers}");
    assert!(
        ours.iter()
            .all(|w| w["kind"] == "embedded" && w["alive"] == true),
        "{workers}"
    );
    let (_, instances) = api.get("/api/instances").await;
    assert!(
        instances
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["id"] == "svc-1" && i["alive"] == true),
        "{instances}"
    );
    let id = ours[0]["id"].as_str().unwrap();
    let (s, err) = api
        .post(&format!("/api/workers/{id}/kill"), json!({}))
        .await;
    assert_eq!(s, axum::http::StatusCode::CONFLICT, "{err}");
    assert!(
        crate::api::error_of(&err).contains("service's own runtime"),
        "{err}"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_the_tasks_at_hand_within_its_grace_and_gives_back_the_rest() {
    let db = TestDb::new().await;
    let quick = enqueue(&db, NewTask::new("quick", json!({})).priority(-1)).await;
    let slow = enqueue(&db, NewTask::new("slow", json!({})).priority(-1)).await;
    let waiting = enqueue(&db, NewTask::new("quick", json!({}))).await;
    // Without prefetch: which worker runs which task is then fixed (one
    // each, `waiting` never claimed); a graceful stop's give-back of claims
    // waiting in local queues is `prefetch::prefetched_claims_have_their_
    // own_leases_and_a_graceful_stop_gives_them_back_unused` (core).
    let runtime = Runtime::builder(db.pool.clone())
        .queue("default", 2)
        .prefetch(0)
        .shutdown_grace(Duration::from_secs(2))
        .handler("quick", |_: Job, _: TaskContext| async {
            tokio::time::sleep(Duration::from_millis(600)).await;
            HandlerResult::Ok(Done::output(json!("finished")))
        })
        .handler("slow", |_: Job, _: TaskContext| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            HandlerResult::Ok(Done::empty())
        })
        .start()
        .await
        .unwrap();
    until(
        "both first tasks started",
        Duration::from_secs(10),
        || async {
            task(&db, quick.id).await.status == TaskStatus::Started
                && task(&db, slow.id).await.status == TaskStatus::Started
        },
    )
    .await;
    let began = tokio::time::Instant::now();
    runtime.shutdown().await;
    let took = began.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(8),
        "waited out the grace for the slow task, then stopped: {took:?}"
    );
    // The quick task was finished, not failed; nothing new was claimed.
    let quick = task(&db, quick.id).await;
    assert_eq!(quick.status, TaskStatus::Processed);
    assert_eq!(quick.task_output, Some(json!("finished")));
    let waiting = task(&db, waiting.id).await;
    assert_eq!((waiting.status, waiting.attempts), (TaskStatus::Pending, 0));
    // The slow one was given back at once, to be retried, not left to its lease.
    let slow = task(&db, slow.id).await;
    assert_eq!(slow.status, TaskStatus::Pending);
    assert_eq!(slow.attempts, 1);
    assert!(
        slow.last_error
            .as_deref()
            .unwrap_or("")
            .contains("stopped before finishing"),
        "{slow:?}"
    );
}

/// A handler that answers what `jsonb` would store but never give back (a
/// number at `f64`'s edge) fails its attempt with the reason, and its
/// fenced writes roll back; nothing unreadable is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_could_not_be_read_back_is_a_failed_attempt() {
    let db = TestDb::new().await;
    sqlx::query("CREATE TABLE public.effects (n int)")
        .execute(&db.pool)
        .await
        .unwrap();
    let t = enqueue(&db, NewTask::new("edge", json!({})).max_attempts(1)).await;
    let runtime = Runtime::builder(db.pool.clone())
        .id("rt-edge")
        .handler("edge", |_: Job, ctx: TaskContext| async move {
            let mut tx = ctx.transaction().await?;
            sqlx::query("INSERT INTO effects VALUES (1)")
                .execute(&mut *tx)
                .await?;
            let output: serde_json::Value =
                serde_json::from_str(r#"{"x": -1.7976931348623157e308}"#)?;
            HandlerResult::Ok(Done::in_transaction(output, tx))
        })
        .start()
        .await
        .unwrap();
    until("the attempt failed", Duration::from_secs(10), || async {
        task(&db, t.id).await.status == TaskStatus::Failed
    })
    .await;
    runtime.shutdown().await;
    let failed = task(&db, t.id).await;
    assert!(
        failed
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("cannot be stored"),
        "{:?}",
        failed.last_error
    );
    assert_eq!(failed.task_output, None);
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM public.effects")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(effects, 0, "the handler's write rolled back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snoozed_task_comes_back_later_without_using_an_attempt() {
    let db = TestDb::new().await;
    let t = enqueue(&db, NewTask::new("poll", json!({})).max_attempts(1)).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let runtime = Runtime::builder(db.pool.clone())
        .id("rt-snooze")
        .scheduler(None)
        .handler("poll", move |job: Job, _: TaskContext| {
            let log = log.clone();
            async move {
                let n = {
                    let mut log = log.lock().unwrap();
                    log.push(job.attempt);
                    log.len()
                };
                // Not ready the first two times: come back in 300 ms.
                HandlerResult::Ok(if n < 3 {
                    Done::snooze(Duration::from_millis(300))
                } else {
                    Done::output(json!({"after": n}))
                })
            }
        })
        .start()
        .await
        .unwrap();
    until("snoozed once", Duration::from_secs(5), || async {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    let between = task(&db, t.id).await;
    until("processed", Duration::from_secs(10), || async {
        task(&db, t.id).await.status == TaskStatus::Processed
    })
    .await;
    runtime.shutdown().await;
    // One attempt allowed, three claims: the snoozes used none.
    let done = task(&db, t.id).await;
    assert_eq!(done.task_output, Some(json!({"after": 3})));
    assert_eq!(done.attempts, 1);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![1, 1, 1],
        "each claim is attempt 1"
    );
    assert!(
        between.status == TaskStatus::Pending || between.status == TaskStatus::Started,
        "{between:?}"
    );
    let history: Vec<(String, Option<serde_json::Value>)> =
        sqlx::query_as("SELECT kind, detail FROM lease_events WHERE resource = $1 ORDER BY id")
            .bind(format!("task:{}", t.id))
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let kinds: Vec<&str> = history.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "acquired", "released", "snoozed", "acquired", "released", "snoozed", "acquired",
            "released"
        ]
    );
    assert_eq!(history[2].1, Some(json!({"for_ms": 300})));
    // Due again only after the snooze: the second claim came >= 300 ms
    // after the first release.
    let at: Vec<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "SELECT at FROM lease_events WHERE resource = $1 AND kind IN ('snoozed', 'acquired') ORDER BY id",
    )
    .bind(format!("task:{}", t.id))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!((at[2] - at[1]).num_milliseconds() >= 290, "{at:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_past_its_timeout_is_cancelled_and_failed_and_the_kind_default_applies() {
    let db = TestDb::new().await;
    let own = enqueue(
        &db,
        NewTask::new("hang", json!({}))
            .max_attempts(1)
            .timeout(Duration::from_millis(300)),
    )
    .await;
    let by_kind = enqueue(&db, NewTask::new("hang", json!({})).max_attempts(1)).await;
    let cancelled = Arc::new(Mutex::new(0));
    let count = cancelled.clone();
    let runtime = Runtime::builder(db.pool.clone())
        .id("rt-timeout")
        .scheduler(None)
        .timeout("hang", Duration::from_millis(600))
        .handler("hang", move |_: Job, ctx: TaskContext| {
            let count = count.clone();
            async move {
                ctx.cancelled().await;
                *count.lock().unwrap() += 1;
                HandlerResult::Ok(Done::output(json!("too late")))
            }
        })
        .start()
        .await
        .unwrap();
    until("both failed", Duration::from_secs(10), || async {
        task(&db, own.id).await.status == TaskStatus::Failed
            && task(&db, by_kind.id).await.status == TaskStatus::Failed
    })
    .await;
    runtime.shutdown().await;
    assert_eq!(
        task(&db, own.id).await.last_error.as_deref(),
        Some("timed out after 300ms")
    );
    assert_eq!(task(&db, own.id).await.timeout_ms, Some(300));
    assert_eq!(
        task(&db, by_kind.id).await.last_error.as_deref(),
        Some("timed out after 600ms")
    );
    assert_eq!(*cancelled.lock().unwrap(), 2, "each handler saw its cancel");
    assert_eq!(
        task(&db, own.id).await.task_output,
        None,
        "its answer was discarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_declared_in_code_fire_once_across_replicas_and_run_on_their_handlers() {
    use leasekeeper_core::schedule::runtime::SchedulerConfig;
    use leasekeeper_core::schedule::{CatchUp, NewSchedule};
    let db = TestDb::new().await;
    let ran = Arc::new(Mutex::new(Vec::new()));
    let replica = |id: &'static str| {
        let ran = ran.clone();
        Runtime::builder(db.pool.clone())
            .id(id)
            .scheduler(Some(SchedulerConfig::from_ttl(Duration::from_secs(3))))
            .schedule(
                NewSchedule::new("beat", "* * * * * *", "beat")
                    .catch_up(CatchUp::All)
                    .data(json!({"from": "code"})),
            )
            .handler("beat", move |job: Job, _: TaskContext| {
                let ran = ran.clone();
                async move {
                    ran.lock().unwrap().push(job.id);
                    HandlerResult::Ok(Done::empty())
                }
            })
            .start()
    };
    let (a, b) = (
        replica("rt-a").await.unwrap(),
        replica("rt-b").await.unwrap(),
    );
    until("three ticks run", Duration::from_secs(10), || async {
        ran.lock().unwrap().len() >= 3
    })
    .await;
    a.shutdown().await;
    b.shutdown().await;
    let ticks: Vec<(String, i64)> =
        sqlx::query_as("SELECT holder, task_id FROM schedule_ticks ORDER BY tick_at")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let schedules: i64 = sqlx::query_scalar("SELECT count(*) FROM schedules")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(schedules, 1, "declared twice, stored once");
    assert!(
        ticks.iter().all(|(h, _)| h == "rt-a" || h == "rt-b"),
        "{ticks:?}"
    );
    let mut ran = ran.lock().unwrap().clone();
    ran.sort();
    let before = ran.len();
    ran.dedup();
    assert_eq!(ran.len(), before, "each tick's task ran once");
    // A bad declaration refuses to start, naming the schedule and field.
    let bad = Runtime::builder(db.pool.clone())
        .schedule(NewSchedule::new("broken", "99 * * * *", "beat"))
        .handler("beat", |_: Job, _: TaskContext| async { Ok(Done::empty()) })
        .start()
        .await;
    assert!(
        matches!(&bad, Err(RuntimeError::Config(m)) if m.contains("broken") && m.contains("cron")),
        "{bad:?}"
    );
}

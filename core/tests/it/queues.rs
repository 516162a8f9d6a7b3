//! Queues against a real database: rows created on first use (one enqueue
//! or a bulk one, concurrent enqueues of a new queue), claims skipping a
//! paused queue on every claim path while its started tasks finish, the
//! resume, the audit rows, the figures, and the claim's plan.

use crate::common::{IdleWorker, TestDb, holder};
use leasekeeper_core::queue::queues::{self, QueueError};
use leasekeeper_core::queue::store::{self, RetryPolicy};
use leasekeeper_core::queue::{ClaimFilter, NewTask, Task, TaskStatus};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

const TTL: Duration = Duration::from_secs(30);

async fn enqueue(db: &TestDb, queue: &str) -> Task {
    store::enqueue(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &NewTask::new("note", json!({})).queue(queue),
    )
    .await
    .unwrap()
}

async fn claim(db: &TestDb, queue: &str, who: &str) -> Option<Task> {
    store::claim_next_in(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &holder(who),
        TTL,
        &ClaimFilter::queue(queue),
    )
    .await
    .unwrap()
}

async fn names(db: &TestDb) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM queues ORDER BY name")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_bulk_enqueue_creates_a_row_per_new_queue_and_only_those() {
    let db = TestDb::new().await;
    assert!(names(&db).await.is_empty());
    let mut conn = db.pool.acquire().await.unwrap();
    let tasks: Vec<NewTask> = (0..300)
        .map(|n| NewTask::new("note", json!({ "n": n })).queue(["c", "a", "b"][n % 3]))
        .collect();
    store::enqueue_many(&mut conn, &Default::default(), &tasks)
        .await
        .unwrap();
    assert_eq!(names(&db).await, ["a", "b", "c"]);
    // Known queues: nothing written, nothing changed.
    store::enqueue_many(&mut conn, &Default::default(), &tasks[..2])
        .await
        .unwrap();
    enqueue(&db, "d").await;
    assert_eq!(names(&db).await, ["a", "b", "c", "d"]);
    let a = queues::get(&mut conn, &Default::default(), "a")
        .await
        .unwrap()
        .expect("queue a");
    // 100 of the bulk enqueue, and `tasks[1]` again.
    assert_eq!(
        (a.pending, a.started, a.failed, a.paused),
        (101, 0, 0, false)
    );
    assert!(a.oldest_pending_age_ms.is_some_and(|ms| ms >= 0));
    assert!(
        queues::get(&mut conn, &Default::default(), "never-used")
            .await
            .unwrap()
            .is_none()
    );
    assert!(matches!(
        queues::get(&mut conn, &Default::default(), "").await,
        Err(QueueError::BadInput(_))
    ));
    assert!(matches!(
        queues::pause(&mut conn, &Default::default(), "bad\nname", "ops").await,
        Err(QueueError::BadInput(_))
    ));
    assert!(matches!(
        queues::resume(&mut conn, &Default::default(), "never-used", "ops").await,
        Err(QueueError::NotFound(_))
    ));
    let listed = queues::list(&mut conn, &Default::default()).await.unwrap();
    let listed: Vec<(&str, i64)> = listed
        .iter()
        .map(|q| (q.name.as_str(), q.pending))
        .collect();
    assert_eq!(listed, [("a", 101), ("b", 100), ("c", 101), ("d", 1)]);
}

/// Many transactions enqueue into the same new queues at once, each naming
/// them in another order and holding its transaction open a moment: none
/// fails (no unique violation, no deadlock), and each queue has one row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_enqueues_of_the_same_new_queues_do_not_fail() {
    let db = TestDb::new().await;
    let n = 8;
    let start = Arc::new(Barrier::new(n));
    let mut runs = Vec::new();
    for i in 0..n {
        let pool = db.pool.clone();
        let start = start.clone();
        runs.push(tokio::spawn(async move {
            let mut order = vec!["q1", "q2", "q3", "q4", "q5"];
            order.rotate_left(i % 5);
            if i % 2 == 1 {
                order.reverse();
            }
            // A different subset each: the statements' distinct names differ.
            order.truncate(3 + i % 3);
            let tasks: Vec<NewTask> = order
                .iter()
                .map(|q| NewTask::new("note", json!({ "i": i })).queue(*q))
                .collect();
            let mut tx = pool.begin().await.unwrap();
            start.wait().await;
            store::enqueue_many(&mut tx, &Default::default(), &tasks)
                .await
                .map_err(|e| format!("enqueue {i}: {e}"))?;
            tokio::time::sleep(Duration::from_millis(50)).await;
            tx.commit().await.map_err(|e| format!("commit {i}: {e}"))
        }));
    }
    for run in runs {
        run.await.unwrap().unwrap();
    }
    assert_eq!(names(&db).await, ["q1", "q2", "q3", "q4", "q5"]);
}

#[tokio::test]
async fn claims_skip_a_paused_queue_on_every_path_and_a_resume_claims_again() {
    let db = TestDb::new().await;
    let schema = Default::default();
    let mail = [enqueue(&db, "mail").await, enqueue(&db, "mail").await];
    let other = enqueue(&db, "default").await;
    let mut conn = db.pool.acquire().await.unwrap();
    let paused = queues::pause(&mut conn, &schema, "mail", "ops@example")
        .await
        .unwrap();
    assert!(paused.paused && paused.paused_at.is_some());
    assert_eq!(paused.pending, 2);
    // Pausing again changes nothing and writes no second audit row.
    queues::pause(&mut conn, &schema, "mail", "ops@example")
        .await
        .unwrap();

    assert!(claim(&db, "mail", "w1").await.is_none(), "one claim");
    let batch = store::claim_for(
        &mut conn,
        &schema,
        &[holder("w1"), holder("w2")],
        TTL,
        &ClaimFilter::queue("mail").kinds(["note"]),
    )
    .await
    .unwrap();
    assert!(batch.tasks.is_empty(), "a batch claim");
    // The other queue is not affected.
    assert_eq!(claim(&db, "default", "w1").await.unwrap().id, other.id);
    for t in &mail {
        assert_eq!(
            store::get(&mut conn, &schema, t.id)
                .await
                .unwrap()
                .unwrap()
                .status,
            TaskStatus::Pending
        );
    }

    let resumed = queues::resume(&mut conn, &schema, "mail", "ops@example")
        .await
        .unwrap();
    assert!(!resumed.paused && resumed.paused_at.is_none());
    assert_eq!(claim(&db, "mail", "w1").await.unwrap().id, mail[0].id);

    let audit: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT resource, holder, detail->>'action' FROM lease_events
          WHERE kind = 'operator' ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        audit,
        [
            (
                "queue:mail".into(),
                "ops@example".into(),
                "queue_pause".into()
            ),
            (
                "queue:mail".into(),
                "ops@example".into(),
                "queue_resume".into()
            ),
        ]
    );
}

/// A late task (its processor went silent) of a paused queue is not taken
/// over either, until the resume.
#[tokio::test]
async fn a_late_task_of_a_paused_queue_waits_for_the_resume() {
    let db = TestDb::new().await;
    let schema = Default::default();
    let task = enqueue(&db, "mail").await;
    let first = claim(&db, "mail", "w1").await.unwrap();
    assert_eq!(first.id, task.id);
    let mut conn = db.pool.acquire().await.unwrap();
    queues::pause(&mut conn, &schema, "mail", "ops")
        .await
        .unwrap();
    sqlx::query("UPDATE tasks SET must_heartbeat_before = now() - interval '1 ms' WHERE id = $1")
        .bind(task.id)
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE leases SET expires_at = now() - interval '1 ms' WHERE resource = $1")
        .bind(format!("task:{}", task.id))
        .execute(&db.pool)
        .await
        .unwrap();
    assert!(claim(&db, "mail", "w2").await.is_none());
    queues::resume(&mut conn, &schema, "mail", "ops")
        .await
        .unwrap();
    let taken = claim(&db, "mail", "w2")
        .await
        .expect("taken over after the resume");
    assert_eq!((taken.id, taken.fencing_token), (task.id, Some(2)));
}

#[tokio::test]
async fn started_tasks_of_a_paused_queue_heartbeat_complete_and_fail_normally() {
    let db = TestDb::new().await;
    let schema = Default::default();
    for _ in 0..2 {
        enqueue(&db, "mail").await;
    }
    let a = claim(&db, "mail", "w1").await.unwrap();
    let b = claim(&db, "mail", "w2").await.unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    queues::pause(&mut conn, &schema, "mail", "ops")
        .await
        .unwrap();
    let during = queues::get(&mut conn, &schema, "mail")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((during.started, during.workers), (2, 2));
    store::heartbeat(&mut conn, &schema, a.id, &holder("w1"), 1, TTL)
        .await
        .unwrap();
    let done = store::complete(&mut conn, &schema, a.id, &holder("w1"), 1, None)
        .await
        .unwrap();
    assert_eq!(done.status, TaskStatus::Processed);
    let failed = store::fail(
        &mut conn,
        &schema,
        b.id,
        &holder("w2"),
        1,
        "no",
        RetryPolicy::default(),
    )
    .await
    .unwrap();
    // Back to pending for its retry, and not claimed while paused.
    assert_eq!(failed.status, TaskStatus::Pending);
    sqlx::query("UPDATE tasks SET scheduled_at = now() WHERE id = $1")
        .bind(b.id)
        .execute(&db.pool)
        .await
        .unwrap();
    assert!(claim(&db, "mail", "w3").await.is_none());
    let after = queues::get(&mut conn, &schema, "mail")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (after.pending, after.started, after.completed_last_minute),
        (1, 0, 1)
    );
}

/// Pausing a name no task has used yet creates it paused: its first task
/// is not claimed.
#[tokio::test]
async fn a_queue_paused_before_its_first_task_stays_paused() {
    let db = TestDb::new().await;
    let schema = Default::default();
    let mut conn = db.pool.acquire().await.unwrap();
    let q = queues::pause(&mut conn, &schema, "later", "ops")
        .await
        .unwrap();
    assert!(q.paused);
    assert_eq!(q.pending, 0);
    enqueue(&db, "later").await;
    assert!(claim(&db, "later", "w1").await.is_none());
    let q = queues::get(&mut conn, &schema, "later")
        .await
        .unwrap()
        .unwrap();
    assert!(q.paused);
    assert_eq!(q.pending, 1);
}

/// The claim's plan with the pause test stays an index scan on the pending
/// index (the test is a one-time filter, not a join per row).
#[tokio::test]
async fn the_claim_plan_stays_an_index_scan() {
    let db = TestDb::new().await;
    sqlx::query(
        "INSERT INTO tasks (kind, queue, task_data)
         SELECT 'note', 'q' || (g % 10), '{}' FROM generate_series(1, 20000) g",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE tasks")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("ANALYZE queues")
        .execute(&db.pool)
        .await
        .unwrap();
    use leasekeeper_core::queue::store::sql;
    for (what, statement) in [("claim", sql::claim(1, false))] {
        let plan = crate::common::explain(
            &db.pool,
            &statement,
            &[("$1", "ARRAY['w']"), ("$2", "30000"), ("$3", "'q3'")],
        )
        .await;
        assert!(
            plan.contains("Index Scan using tasks_pending_idx"),
            "{what}: the pending tasks by index:\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan on tasks") && !plan.contains("Seq Scan on leases"),
            "{what}: no scan of tasks or leases:\n{plan}"
        );
        assert!(
            plan.contains("One-Time Filter"),
            "{what}: the pause test once:\n{plan}"
        );
    }
}

async fn status(db: &TestDb, id: i64) -> TaskStatus {
    sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// A runtime's task running when its queue is paused finishes; the
/// runtime claims nothing more of that queue while it is paused; after the
/// resume, its idle workers claim within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_finishes_what_it_started_claims_nothing_while_paused_and_resumes_within_a_second()
 {
    use leasekeeper_core::worker::handler::{Done, Job, TaskContext};
    use leasekeeper_core::worker::runtime::Runtime;
    let db = TestDb::new().await;
    let schema = Default::default();
    let runtime = Runtime::builder(db.pool.clone())
        .id("rt-queues")
        .queue("mail", 2)
        .handler("note", |job: Job, _: TaskContext| async move {
            tokio::time::sleep(Duration::from_millis(600)).await;
            Ok(Done::output(json!({ "id": job.id })))
        })
        .start()
        .await
        .unwrap();
    let running = enqueue(&db, "mail").await;
    let start = tokio::time::Instant::now();
    while status(&db, running.id).await != TaskStatus::Started {
        assert!(start.elapsed() < Duration::from_secs(10), "never claimed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut conn = db.pool.acquire().await.unwrap();
    queues::pause(&mut conn, &schema, "mail", "ops")
        .await
        .unwrap();
    let waiting = [enqueue(&db, "mail").await, enqueue(&db, "mail").await];
    let start = tokio::time::Instant::now();
    while status(&db, running.id).await != TaskStatus::Processed {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the started task did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Longer than the workers' poll: they looked, and took nothing.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for t in &waiting {
        assert_eq!(
            status(&db, t.id).await,
            TaskStatus::Pending,
            "claimed while paused"
        );
    }
    queues::resume(&mut conn, &schema, "mail", "ops")
        .await
        .unwrap();
    let resumed = tokio::time::Instant::now();
    loop {
        let mut claimed = 0;
        for t in &waiting {
            claimed += usize::from(status(&db, t.id).await != TaskStatus::Pending);
        }
        if claimed == waiting.len() {
            break;
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(1),
            "{claimed} of {} claimed a second after the resume",
            waiting.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    runtime.shutdown().await;
}

/// The resume announces new work (`Topics::WORK`): an idle worker whose
/// poll is a minute long, so that only an announcement can wake it,
/// starts the paused queue's task within a second of the resume. (Run
/// alongside other tests, their announcements may wake it too; alone,
/// this fails if the resume is not announced.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_wakes_an_idle_worker_without_a_poll() {
    let db = TestDb::new().await;
    let schema = Default::default();
    let mut conn = db.pool.acquire().await.unwrap();
    queues::pause(&mut conn, &schema, "mail", "ops")
        .await
        .unwrap();
    let mut idle = IdleWorker::start(&db, "resume", "note", ClaimFilter::queue("mail"));
    let task = enqueue(&db, "mail").await;
    // The enqueue's own announcement woke the worker; it found the queue
    // paused and went back to waiting (a minute).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(idle.starts.try_recv().is_err(), "claimed while paused");
    assert_eq!(status(&db, task.id).await, TaskStatus::Pending);
    queues::resume(&mut conn, &schema, "mail", "ops")
        .await
        .unwrap();
    let resumed = tokio::time::Instant::now();
    let (id, at) = tokio::time::timeout(Duration::from_secs(5), idle.starts.recv())
        .await
        .expect("no start within 5 s of the resume")
        .unwrap();
    assert_eq!(id, task.id);
    let took = at.saturating_duration_since(resumed);
    assert!(
        took < Duration::from_secs(1),
        "the resumed queue's task started {took:?} after the resume"
    );
    idle.stop().await;
}

//! Retry policies: backoff, jitter and max attempts per kind, measured by
//! the database clock (a failed attempt's delay is the task's new
//! `scheduled_at` less the moment its claim was released, both written by
//! the failing transaction); kinds without a policy keep the default.

use crate::common::{TestDb, holder};
use leasekeeper_core::db::Schema;
use leasekeeper_core::queue::store::{self, RetryPolicy};
use leasekeeper_core::queue::{NewTask, TaskStatus};
use leasekeeper_core::worker::runtime::RuntimeError;
use leasekeeper_core::{Done, Job, Runtime, TaskContext};
use serde_json::json;
use std::time::Duration;

async fn enqueue(db: &TestDb, kind: &str, max_attempts: i32) -> i64 {
    store::enqueue(
        &mut db.pool.acquire().await.unwrap(),
        &Schema::default(),
        &NewTask::new(kind, json!({})).max_attempts(max_attempts),
    )
    .await
    .unwrap()
    .id
}

/// Task `id`'s status, attempts, max attempts, and the delay of its last
/// failed attempt by the database clock, in ms (`scheduled_at` less its
/// last release).
async fn after_failure(db: &TestDb, id: i64) -> (String, i32, i32, Option<i64>) {
    sqlx::query_as(
        "SELECT t.status, t.attempts, t.max_attempts,
                (EXTRACT(EPOCH FROM t.scheduled_at - (
                    SELECT max(e.at) FROM lease_events e
                     WHERE e.resource = 'task:' || t.id AND e.kind = 'released')) * 1000)::int8
           FROM tasks t WHERE t.id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// Claims task `id` (which must be due) and fails its attempt under `policy`.
async fn claim_and_fail(db: &TestDb, id: i64, policy: RetryPolicy) {
    let mut conn = db.pool.acquire().await.unwrap();
    let w = holder("w");
    let task = store::claim_next(&mut conn, &Schema::default(), &w, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("the task is due");
    assert_eq!(task.id, id);
    store::fail(
        &mut conn,
        &Schema::default(),
        id,
        &w,
        task.fencing_token.unwrap(),
        "boom",
        policy,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_policys_jitter_stays_in_its_window_and_its_max_attempts_replace_the_tasks() {
    let db = TestDb::new().await;
    let policy = RetryPolicy::constant(Duration::from_millis(400))
        .jitter(0.5)
        .max_attempts(2);
    let mut delays = Vec::new();
    for _ in 0..12 {
        let id = enqueue(&db, "jittery", 5).await;
        claim_and_fail(&db, id, policy).await;
        let (status, attempts, max_attempts, delay) = after_failure(&db, id).await;
        assert_eq!((status.as_str(), attempts, max_attempts), ("pending", 1, 2));
        let delay = delay.expect("released");
        // [400 * (1 - 0.5), 400] ms, give or take the millisecond columns.
        assert!((198..=402).contains(&delay), "delay {delay} ms");
        delays.push(delay);
        // Out of the way of the next claim.
        sqlx::query("UPDATE tasks SET status = 'cancelled', cancelled_at = now() WHERE id = $1")
            .bind(id)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    delays.sort_unstable();
    delays.dedup();
    assert!(delays.len() > 3, "jitter varies the delay: {delays:?}");

    // The second attempt is the last (the policy's 2, not the task's 5).
    let id = enqueue(&db, "jittery", 5).await;
    claim_and_fail(&db, id, policy).await;
    tokio::time::sleep(Duration::from_millis(450)).await;
    claim_and_fail(&db, id, policy).await;
    let (status, attempts, max_attempts, _) = after_failure(&db, id).await;
    assert_eq!((status.as_str(), attempts, max_attempts), ("failed", 2, 2));
}

#[tokio::test]
async fn the_default_policy_is_unchanged() {
    let db = TestDb::new().await;
    assert_eq!(
        RetryPolicy::default(),
        RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(60))
    );
    assert_eq!(RetryPolicy::default().max_attempts, None);
    assert_eq!(RetryPolicy::default().jitter, 0.0);
    // 1 s after the first failure, exactly, and the task keeps its own max.
    let id = enqueue(&db, "plain", 3).await;
    claim_and_fail(&db, id, RetryPolicy::default()).await;
    let (status, attempts, max_attempts, delay) = after_failure(&db, id).await;
    assert_eq!((status.as_str(), attempts, max_attempts), ("pending", 1, 3));
    assert!((998..=1002).contains(&delay.unwrap()), "{delay:?}");
}

#[tokio::test]
async fn a_bad_policy_is_refused_by_the_store_and_the_runtime() {
    let db = TestDb::new().await;
    for bad in [
        RetryPolicy::default().jitter(1.5),
        RetryPolicy::default().jitter(-0.1),
        RetryPolicy::default().max_attempts(0),
        RetryPolicy::default().max_attempts(1001),
        RetryPolicy::exponential(Duration::from_secs(2), Duration::from_secs(1)),
    ] {
        assert!(bad.check().is_err(), "{bad:?}");
        let started = Runtime::builder(db.pool.clone())
            .scheduler(None)
            .handler("k", |_: Job, _: TaskContext| async { Ok(Done::empty()) })
            .retry_kind("k", bad)
            .start()
            .await;
        match started {
            Err(RuntimeError::Config(why)) => assert!(why.contains("\"k\""), "{why}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_retries_each_kind_by_its_own_policy() {
    // Both handlers always fail. `picky` has a policy of its own (two
    // attempts, 100 ms apart); `plain` has none and backs off by the
    // default (1 s after its first failure, its own five attempts).
    let db = TestDb::new().await;
    let picky = enqueue(&db, "picky", 5).await;
    let plain = enqueue(&db, "plain", 5).await;
    let failing =
        |_: Job, _: TaskContext| async { Err::<Done, _>(std::io::Error::other("no luck").into()) };
    let runtime = Runtime::builder(db.pool.clone())
        .queue("default", 2)
        .scheduler(None)
        .handler("picky", failing)
        .handler("plain", failing)
        .retry_kind(
            "picky",
            RetryPolicy::constant(Duration::from_millis(100)).max_attempts(2),
        )
        .start()
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    loop {
        let (status, ..) = after_failure(&db, picky).await;
        if status == TaskStatus::Failed.as_str() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "picky is {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, attempts, max_attempts, delay) = after_failure(&db, picky).await;
    assert_eq!(
        (attempts, max_attempts),
        (2, 2),
        "failed for good after its policy's 2"
    );
    // Its one backoff: 100 ms from the first failure's release to the
    // second claim's scheduled time, by the database clock.
    let first_delay: i64 = sqlx::query_scalar(
        "SELECT (EXTRACT(EPOCH FROM (SELECT at FROM lease_events WHERE resource = $1 AND kind = 'acquired' ORDER BY id OFFSET 1 LIMIT 1)
                              - (SELECT at FROM lease_events WHERE resource = $1 AND kind = 'released' ORDER BY id LIMIT 1)) * 1000)::int8",
    )
    .bind(format!("task:{picky}"))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        first_delay >= 99,
        "claimed again after {first_delay} ms, before its backoff"
    );
    let _ = delay;
    let (status, attempts, max_attempts, delay) = after_failure(&db, plain).await;
    assert_eq!(
        (status.as_str(), attempts, max_attempts),
        ("pending", 1, 5),
        "plain kept the default"
    );
    assert!((998..=1002).contains(&delay.unwrap()), "{delay:?}");
    runtime.shutdown().await;
}

//! The task store against a real database: claim with its lease in one
//! transaction, heartbeat, complete, fail with backoff, stale writes refused
//! and recorded, concurrent claimers never sharing a task.

use crate::common::{TestDb, event_kinds, holder};
use leasekeeper_core::queue::TaskStatus;
use leasekeeper_core::queue::store::{self, RetryPolicy, TaskError};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

const TTL: Duration = Duration::from_secs(30);

async fn enqueue(db: &TestDb, n: usize) -> Vec<i64> {
    let mut conn = db.pool.acquire().await.unwrap();
    let mut ids = Vec::new();
    for i in 0..n {
        let task = store::enqueue(
            &mut conn,
            &Default::default(),
            &leasekeeper_core::queue::NewTask::new(
                leasekeeper_core::worker::simulated::KIND,
                json!({"sleep_duration_seconds": 0, "n": i}),
            )
            .max_attempts(3),
        )
        .await
        .unwrap();
        ids.push(task.id);
    }
    ids
}

/// Moves task `id`'s deadline (and its lease) into the past, as if its
/// processor had stalled past the TTL.
async fn expire(db: &TestDb, id: i64) {
    sqlx::query("UPDATE tasks SET must_heartbeat_before = now() - interval '1 ms' WHERE id = $1")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE leases SET expires_at = now() - interval '1 ms' WHERE resource = $1")
        .bind(format!("task:{id}"))
        .execute(&db.pool)
        .await
        .unwrap();
}

/// One rescue pass (the maintenance job's, with its lease taken by hand):
/// how many late tasks out of attempts it failed.
async fn rescue(db: &TestDb) -> u64 {
    use leasekeeper_core::lease::store as leases;
    use leasekeeper_core::maintenance::RESOURCE;
    use leasekeeper_core::queue::rescuer::{self, Fence};
    let me = holder("maintainer");
    let lease = leases::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &crate::common::resource(RESOURCE),
        &me,
        TTL,
    )
    .await
    .unwrap()
    .into_lease();
    let fence = Fence {
        resource: RESOURCE,
        holder: &me,
        token: lease.fencing_token,
    };
    rescuer::rescue_once(&db.pool, fence, 100, || true)
        .await
        .unwrap()
        .failed
}

#[tokio::test]
async fn claim_heartbeat_complete_happy_path() {
    let db = TestDb::new().await;
    let ids = enqueue(&db, 2).await;
    let mut conn = db.pool.acquire().await.unwrap();
    let w = holder("w1");
    let task = store::claim_next(&mut conn, &Default::default(), &w, TTL)
        .await
        .unwrap()
        .expect("a task");
    assert_eq!(task.id, ids[0], "oldest first");
    assert_eq!(task.status, TaskStatus::Started);
    assert_eq!(task.attempts, 1);
    assert_eq!(task.fencing_token, Some(1));
    assert!(task.heartbeat_in_ms.unwrap() > 29_000);
    let term: (String, i64) = sqlx::query_as(
        "SELECT holder, fencing_token FROM lease_events WHERE resource = $1 AND kind = 'acquired'",
    )
    .bind(format!("task:{}", task.id))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(term, ("w1".to_string(), 1), "the claim's term is on record");

    let beat = store::heartbeat(&mut conn, &Default::default(), task.id, &w, 1, TTL)
        .await
        .unwrap();
    assert!(beat.must_heartbeat_before >= task.must_heartbeat_before);
    let done = store::complete(
        &mut conn,
        &Default::default(),
        task.id,
        &w,
        1,
        Some(&json!({"ok": true})),
    )
    .await
    .unwrap();
    assert_eq!(done.status, TaskStatus::Processed);
    assert_eq!(done.task_output, Some(json!({"ok": true})));
    assert_eq!(
        event_kinds(&db.pool, &format!("task:{}", task.id)).await,
        ["acquired", "renewed", "released"]
    );
    // Completing twice is refused.
    let again = store::complete(&mut conn, &Default::default(), task.id, &w, 1, None).await;
    assert!(
        matches!(&again, Err(TaskError::Stale { reason, .. }) if reason == "already processed"),
        "{again:?}"
    );
}

#[tokio::test]
async fn nothing_to_claim_returns_none_and_delayed_tasks_wait() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    assert!(
        store::claim_next(&mut conn, &Default::default(), &holder("w"), TTL)
            .await
            .unwrap()
            .is_none()
    );
    store::enqueue(
        &mut conn,
        &Default::default(),
        &leasekeeper_core::queue::NewTask::new(
            leasekeeper_core::worker::simulated::KIND,
            json!({}),
        )
        .max_attempts(3)
        .delay(Duration::from_secs(60)),
    )
    .await
    .unwrap();
    assert!(
        store::claim_next(&mut conn, &Default::default(), &holder("w"), TTL)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_stale_completion_after_takeover_is_refused_and_recorded() {
    let db = TestDb::new().await;
    let ids = enqueue(&db, 1).await;
    let mut conn = db.pool.acquire().await.unwrap();
    let (old, new) = (holder("paused"), holder("rescuer"));
    let first = store::claim_next(&mut conn, &Default::default(), &old, TTL)
        .await
        .unwrap()
        .unwrap();
    expire(&db, ids[0]).await;
    let second = store::claim_next(&mut conn, &Default::default(), &new, TTL)
        .await
        .unwrap()
        .expect("takeover of the late task");
    assert_eq!(second.id, first.id);
    assert_eq!(second.fencing_token, Some(2));
    assert_eq!(second.attempts, 2);

    // The paused processor wakes up and tries everything with its old token.
    let hb = store::heartbeat(&mut conn, &Default::default(), first.id, &old, 1, TTL).await;
    assert!(matches!(&hb, Err(TaskError::Stale { .. })), "{hb:?}");
    let done = store::complete(
        &mut conn,
        &Default::default(),
        first.id,
        &old,
        1,
        Some(&json!("late")),
    )
    .await;
    assert!(
        matches!(&done, Err(TaskError::Stale { reason, .. }) if reason.contains("token 1 is not current")),
        "{done:?}"
    );
    let failed = store::fail(
        &mut conn,
        &Default::default(),
        first.id,
        &old,
        1,
        "boom",
        RetryPolicy::default(),
    )
    .await;
    assert!(
        matches!(&failed, Err(TaskError::Stale { .. })),
        "{failed:?}"
    );

    let task = store::get(&mut conn, &Default::default(), first.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(task.status, TaskStatus::Started);
    assert_eq!(task.processor.as_deref(), Some("rescuer"));
    assert_eq!(task.task_output, None);
    let refused: Vec<(String, i64, serde_json::Value)> = sqlx::query_as(
        "SELECT holder, fencing_token, detail FROM lease_events
          WHERE resource = $1 AND kind = 'stale_write_refused' ORDER BY id",
    )
    .bind(format!("task:{}", first.id))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let ops: Vec<_> = refused
        .iter()
        .map(|(_, _, d)| d["op"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ops, ["heartbeat", "complete", "fail"]);
    assert!(
        refused
            .iter()
            .all(|(h, t, d)| h == "paused" && *t == 1 && d["current_token"] == 2)
    );

    store::complete(
        &mut conn,
        &Default::default(),
        first.id,
        &new,
        2,
        Some(&json!("done")),
    )
    .await
    .unwrap();
    let kinds = event_kinds(&db.pool, &format!("task:{}", first.id)).await;
    assert_eq!(
        kinds.iter().filter(|k| *k == "taken_over").count(),
        1,
        "{kinds:?}"
    );
}

#[tokio::test]
async fn a_writer_past_its_deadline_is_refused_even_before_a_takeover() {
    let db = TestDb::new().await;
    let ids = enqueue(&db, 1).await;
    let mut conn = db.pool.acquire().await.unwrap();
    let w = holder("slow");
    store::claim_next(&mut conn, &Default::default(), &w, TTL)
        .await
        .unwrap()
        .unwrap();
    expire(&db, ids[0]).await;
    let done = store::complete(&mut conn, &Default::default(), ids[0], &w, 1, None).await;
    assert!(
        matches!(&done, Err(TaskError::Stale { reason, .. }) if reason == "its lease expired"),
        "{done:?}"
    );
}

#[tokio::test]
async fn failures_back_off_and_stop_at_max_attempts() {
    let db = TestDb::new().await;
    let ids = enqueue(&db, 1).await; // max_attempts = 3
    let mut conn = db.pool.acquire().await.unwrap();
    let w = holder("w");
    let policy = RetryPolicy::exponential(Duration::from_millis(200), Duration::from_millis(300));
    for attempt in 1..=3 {
        let task = store::claim_next(&mut conn, &Default::default(), &w, TTL)
            .await
            .unwrap()
            .expect("claimable again");
        assert_eq!(task.attempts, attempt);
        let failed = store::fail(
            &mut conn,
            &Default::default(),
            task.id,
            &w,
            task.fencing_token.unwrap(),
            "boom",
            policy,
        )
        .await
        .unwrap();
        assert_eq!(failed.last_error.as_deref(), Some("boom"));
        if attempt < 3 {
            assert_eq!(failed.status, TaskStatus::Pending);
            // Backed off: not claimable at once.
            assert!(
                store::claim_next(&mut conn, &Default::default(), &w, TTL)
                    .await
                    .unwrap()
                    .is_none()
            );
            let wait: f64 = sqlx::query_scalar(
                "SELECT EXTRACT(EPOCH FROM scheduled_at - now())::float8 FROM tasks WHERE id = $1",
            )
            .bind(task.id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
            let expected = if attempt == 1 { 0.2 } else { 0.3 };
            assert!(
                (wait - expected).abs() < 0.1,
                "attempt {attempt}: waits {wait} s, expected {expected}"
            );
            tokio::time::sleep(Duration::from_millis(350)).await;
        } else {
            assert_eq!(failed.status, TaskStatus::Failed);
            assert!(failed.failed_at.is_some());
        }
    }
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(
        store::claim_next(&mut conn, &Default::default(), &w, TTL)
            .await
            .unwrap()
            .is_none(),
        "failed is final"
    );
    let task = store::get(&mut conn, &Default::default(), ids[0])
        .await
        .unwrap()
        .unwrap();
    assert_eq!((task.status, task.attempts), (TaskStatus::Failed, 3));
}

#[tokio::test]
async fn a_task_whose_processors_keep_dying_is_failed_not_lost() {
    let db = TestDb::new().await;
    let ids = enqueue(&db, 1).await; // max_attempts = 3
    let mut conn = db.pool.acquire().await.unwrap();
    for n in 0..3 {
        store::claim_next(
            &mut conn,
            &Default::default(),
            &holder(&format!("doomed{n}")),
            TTL,
        )
        .await
        .unwrap()
        .unwrap();
        expire(&db, ids[0]).await;
    }
    // The claim takes it no more (and leaves it to the rescuer)...
    assert!(
        store::claim_next(&mut conn, &Default::default(), &holder("next"), TTL)
            .await
            .unwrap()
            .is_none()
    );
    // ...whose pass fails it.
    assert_eq!(rescue(&db).await, 1);
    let task = store::get(&mut conn, &Default::default(), ids[0])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(task.status, TaskStatus::Failed);
    assert!(task.last_error.unwrap().contains("attempt 3 of 3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_claimers_never_share_a_task() {
    let db = TestDb::with_connections(40).await;
    let ids = enqueue(&db, 300).await;
    let barrier = Arc::new(Barrier::new(32));
    let mut workers = Vec::new();
    for w in 0..32 {
        let pool = db.pool.clone();
        let barrier = barrier.clone();
        workers.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            let me = holder(&format!("w{w}"));
            barrier.wait().await;
            let mut mine = Vec::new();
            while let Some(task) = store::claim_next(&mut conn, &Default::default(), &me, TTL)
                .await
                .unwrap()
            {
                store::complete(
                    &mut conn,
                    &Default::default(),
                    task.id,
                    &me,
                    task.fencing_token.unwrap(),
                    None,
                )
                .await
                .unwrap();
                mine.push(task.id);
            }
            mine
        }));
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    for w in workers {
        for id in w.await.unwrap() {
            total += 1;
            assert!(seen.insert(id), "task {id} claimed twice");
        }
    }
    assert_eq!(total, ids.len());
    let processed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tasks WHERE status = 'processed' AND attempts = 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(processed, 300);
}

#[tokio::test]
async fn a_task_s_claim_is_its_task_row_and_the_lease_store_refuses_its_name() {
    use leasekeeper_core::lease::Resource;
    use leasekeeper_core::lease::store::{self as leases, LeaseError};
    let db = TestDb::new().await;
    let ids = enqueue(&db, 1).await;
    let mut conn = db.pool.acquire().await.unwrap();
    let resource = Resource::parse(format!("task:{}", ids[0])).unwrap();
    // Nobody takes a task's name through the lease store: the claim owns it.
    let refused = leases::acquire(
        &mut conn,
        &Default::default(),
        &resource,
        &holder("by-hand"),
        TTL,
    )
    .await;
    assert!(
        matches!(refused, Err(LeaseError::TaskClaim(ref name)) if *name == resource.to_string()),
        "{refused:?}"
    );
    // Claimed, taken over and completed: no lease or fencing row, tokens 1 and 2
    // from the task row, and the history of its terms as for any lease.
    let first = store::claim_next(&mut conn, &Default::default(), &holder("w1"), TTL)
        .await
        .unwrap()
        .expect("claimable");
    assert_eq!(first.fencing_token, Some(1));
    store::heartbeat(
        &mut conn,
        &Default::default(),
        ids[0],
        &holder("w1"),
        1,
        TTL,
    )
    .await
    .unwrap();
    sqlx::query("UPDATE tasks SET must_heartbeat_before = now() - interval '1 ms' WHERE id = $1")
        .bind(ids[0])
        .execute(&mut *conn)
        .await
        .unwrap();
    let second = store::claim_next(&mut conn, &Default::default(), &holder("w2"), TTL)
        .await
        .unwrap()
        .expect("late, so claimable");
    assert_eq!((second.id, second.fencing_token), (ids[0], Some(2)));
    store::complete(
        &mut conn,
        &Default::default(),
        ids[0],
        &holder("w2"),
        2,
        None,
    )
    .await
    .unwrap();
    let rows: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM leases WHERE resource = $1),
                (SELECT count(*) FROM lease_fencing WHERE resource = $1)",
    )
    .bind(resource.as_str())
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(rows, (0, 0), "no lease or fencing row for a task");
    /// kind, holder, token, previous holder
    type Event = (String, Option<String>, Option<i64>, Option<String>);
    let history: Vec<Event> = sqlx::query_as(
        "SELECT kind, holder, fencing_token, previous_holder FROM lease_events WHERE resource = $1 ORDER BY id",
    )
    .bind(resource.as_str())
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let w = |s: &str| Some(s.to_string());
    assert_eq!(
        history,
        [
            ("acquired".to_string(), w("w1"), Some(1), None),
            ("renewed".to_string(), w("w1"), Some(1), None),
            ("taken_over".to_string(), w("w2"), Some(2), w("w1")),
            ("released".to_string(), w("w2"), Some(2), None),
        ]
    );
    // A token never goes back (an older version's claim, a hand-made
    // change): refused whole by the tasks trigger.
    let back = sqlx::query("UPDATE tasks SET fencing_token = 1 WHERE id = $1")
        .bind(ids[0])
        .execute(&mut *conn)
        .await
        .unwrap_err();
    let sqlx::Error::Database(e) = &back else {
        panic!("{back}")
    };
    assert_eq!(e.code().as_deref(), Some("23514"), "{back}");
    assert_eq!(
        store::get(&mut conn, &Default::default(), ids[0])
            .await
            .unwrap()
            .unwrap()
            .fencing_token,
        Some(2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_claims_never_share_a_task_and_stale_batch_completions_are_refused() {
    let db = TestDb::with_connections(12).await;
    let mut conn = db.pool.acquire().await.unwrap();
    sqlx::query(
        "INSERT INTO tasks (kind, task_data, max_attempts) SELECT 'sleep', jsonb_build_object('n', n), 3 FROM generate_series(1, 2000) n",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    assert!(matches!(
        store::claim_batch(&mut conn, &Default::default(), &holder("w"), TTL, 0).await,
        Err(TaskError::BadInput(_))
    ));
    let barrier = Arc::new(Barrier::new(8));
    let mut workers = Vec::new();
    for w in 0..8 {
        let (pool, barrier) = (db.pool.clone(), barrier.clone());
        workers.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            let me = holder(&format!("b{w}"));
            barrier.wait().await;
            let mut mine = Vec::new();
            loop {
                let batch = store::claim_batch(&mut conn, &Default::default(), &me, TTL, 50)
                    .await
                    .unwrap();
                if batch.is_empty() {
                    break;
                }
                assert!(batch.len() <= 50);
                let claims: Vec<(i64, i64)> = batch
                    .iter()
                    .map(|t| (t.id, t.fencing_token.unwrap()))
                    .collect();
                let done =
                    store::complete_all_of(&mut conn, &Default::default(), &me, &claims, None)
                        .await
                        .unwrap();
                assert_eq!(done.len(), claims.len(), "every current claim completes");
                assert!(done.iter().all(|t| t.status == TaskStatus::Processed));
                mine.extend(claims.iter().map(|(id, _)| *id));
            }
            mine
        }));
    }
    let mut seen = HashSet::new();
    for w in workers {
        for id in w.await.unwrap() {
            assert!(seen.insert(id), "task {id} claimed twice");
        }
    }
    assert_eq!(seen.len(), 2000);
    let (processed, live_leases): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM tasks WHERE status = 'processed' AND attempts = 1),
                (SELECT count(*) FROM leases WHERE released_at IS NULL AND expires_at > now())",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (processed, live_leases),
        (2000, 0),
        "all done, every lease released"
    );

    // A batch with one stale claim: the current one completes, the stale
    // one (taken over meanwhile) is refused and recorded, not written.
    sqlx::query("INSERT INTO tasks (kind, task_data) VALUES ('sleep', '{}'), ('sleep', '{}')")
        .execute(&mut *conn)
        .await
        .unwrap();
    let old = holder("old");
    let claimed = store::claim_batch(&mut conn, &Default::default(), &old, TTL, 2)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    let (a, b) = (&claimed[0], &claimed[1]);
    expire(&db, b.id).await;
    let new = store::claim_next(&mut conn, &Default::default(), &holder("new"), TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((new.id, new.fencing_token), (b.id, Some(2)));
    let done = store::complete_all_of(
        &mut conn,
        &Default::default(),
        &old,
        &[(a.id, a.fencing_token.unwrap()), (b.id, 1)],
        Some(&json!("late")),
    )
    .await
    .unwrap();
    assert_eq!(done.iter().map(|t| t.id).collect::<Vec<_>>(), [a.id]);
    let b_now = store::get(&mut conn, &Default::default(), b.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (b_now.status, b_now.processor.as_deref()),
        (TaskStatus::Started, Some("new"))
    );
    assert_eq!(
        event_kinds(&db.pool, &format!("task:{}", b.id)).await,
        ["acquired", "taken_over", "stale_write_refused"]
    );
}

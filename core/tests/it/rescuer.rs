//! The rescuer against a real database: a late task that used its attempts
//! is taken by no claim and failed by a rescue pass, recorded as the claim
//! recorded it; a pass leaves a task whose claim is extended meanwhile (a
//! heartbeat in flight, raced for real) or whose lease is held by hand;
//! a pass from a replica that lost the maintenance lease writes nothing;
//! and the maintenance job runs the passes.

use crate::common::{TestDb, event_kinds, holder, resource};
use leasekeeper_core::lease::client::LeaseTiming;
use leasekeeper_core::lease::{Holder, store as leases};
use leasekeeper_core::maintenance::{self, Maintenance, MaintenanceConfig};
use leasekeeper_core::queue::rescuer::{self, Fence, Rescued};
use leasekeeper_core::queue::store;
use leasekeeper_core::queue::{ClaimFilter, NewTask, TaskStatus};
use serde_json::json;
use sqlx::{Connection, PgPool};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

/// A task of `max_attempts` attempts whose processors all died: claimed
/// that many times, each claim run out (task deadline and lease).
async fn out_of_attempts(pool: &PgPool, max_attempts: i32) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    let id = store::enqueue(
        &mut conn,
        &Default::default(),
        &NewTask::new("k", json!({})).max_attempts(max_attempts),
    )
    .await
    .unwrap()
    .id;
    for n in 0..max_attempts {
        let task = store::claim_next(
            &mut conn,
            &Default::default(),
            &holder(&format!("dead{n}")),
            TTL,
        )
        .await
        .unwrap()
        .expect("claimable while it has attempts left");
        assert_eq!(task.id, id);
        expire(pool, id).await;
    }
    id
}

/// Moves task `id`'s deadline and its lease into the past.
async fn expire(pool: &PgPool, id: i64) {
    sqlx::query("UPDATE tasks SET must_heartbeat_before = now() - interval '1 ms' WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("UPDATE leases SET expires_at = now() - interval '1 ms' WHERE resource = $1")
        .bind(format!("task:{id}"))
        .execute(pool)
        .await
        .unwrap();
}

/// Takes the maintenance job's lease by hand as `name`; answers its token.
async fn hold_maintenance(pool: &PgPool, name: &str) -> i64 {
    leases::acquire(
        &mut pool.acquire().await.unwrap(),
        &Default::default(),
        &resource(maintenance::RESOURCE),
        &holder(name),
        TTL,
    )
    .await
    .unwrap()
    .into_lease()
    .fencing_token
}

/// One rescue pass as `me` with `token` on the maintenance lease.
async fn pass(pool: &PgPool, me: &Holder, token: i64) -> Rescued {
    let fence = Fence {
        resource: maintenance::RESOURCE,
        holder: me,
        token,
    };
    rescuer::rescue_once(pool, fence, 100, || true)
        .await
        .unwrap()
}

async fn status(pool: &PgPool, id: i64) -> TaskStatus {
    sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn no_claim_takes_or_fails_a_late_task_out_of_attempts_and_a_pass_fails_it() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let doomed = out_of_attempts(pool, 2).await;
    let behind = store::enqueue(
        &mut pool.acquire().await.unwrap(),
        &Default::default(),
        &NewTask::new("k", json!({})),
    )
    .await
    .unwrap()
    .id;
    let history = event_kinds(pool, &format!("task:{doomed}")).await;

    // Every way a task is claimed passes it over, and fails nothing: the
    // one-task claim, a batch, a runtime's claim for its workers.
    let mut conn = pool.acquire().await.unwrap();
    let next = store::claim_next(&mut conn, &Default::default(), &holder("w1"), TTL)
        .await
        .unwrap()
        .expect("the pending task behind it");
    assert_eq!(next.id, behind);
    let batch = store::claim_batch(&mut conn, &Default::default(), &holder("w2"), TTL, 10)
        .await
        .unwrap();
    assert!(batch.is_empty(), "{batch:?}");
    let claimed = store::claim_for(
        &mut conn,
        &Default::default(),
        &[holder("w3"), holder("w4")],
        TTL,
        &ClaimFilter::default(),
    )
    .await
    .unwrap();
    assert!(claimed.tasks.is_empty(), "{claimed:?}");
    let still = store::get(&mut conn, &Default::default(), doomed)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (still.status, still.attempts),
        (TaskStatus::Started, 2),
        "the claims left it as it was"
    );

    // A pass fails it, as the claim used to: status, error, attempt,
    // counters; its lease and history untouched.
    let me = holder("replica-a");
    let token = hold_maintenance(pool, "replica-a").await;
    let rescued = pass(pool, &me, token).await;
    assert_eq!(
        rescued,
        Rescued {
            failed: 1,
            refused: false,
            resumed: 0
        }
    );
    let failed = store::get(&mut conn, &Default::default(), doomed)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(failed.status, TaskStatus::Failed);
    assert!(failed.failed_at.is_some());
    assert_eq!(failed.must_heartbeat_before, None);
    assert_eq!(
        failed.last_error.as_deref(),
        Some("lease expired on attempt 2 of 2 without completion")
    );
    let attempts: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT outcome, error FROM attempts WHERE task_id = $1 ORDER BY number")
            .bind(doomed)
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        attempts,
        [
            ("taken_over".to_string(), None),
            (
                "failed".to_string(),
                Some("lease expired on attempt 2 of 2 without completion".to_string())
            )
        ]
    );
    let counts = leasekeeper_core::counts::counts(&mut conn, &Default::default())
        .await
        .unwrap();
    assert_eq!(
        (counts.tasks_failed, counts.tasks_started, counts.tasks_late),
        (1, 1, 0),
        "the counters moved it from started to failed"
    );
    assert_eq!(event_kinds(pool, &format!("task:{doomed}")).await, history);
    // A second pass finds nothing.
    assert_eq!(pass(pool, &me, token).await.failed, 0);
    assert_eq!(status(pool, next.id).await, TaskStatus::Started);
}

/// The race beside the rescuer's statement: a heartbeat that began before
/// the deadline (so its guard let it through) is still open when the pass
/// runs after the deadline, and commits while the pass is running. The
/// pass must not fail the task: the heartbeat extended the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_leaves_a_task_whose_claim_a_heartbeat_extends_meanwhile() {
    let db = TestDb::with_connections(4).await;
    let pool = &db.pool;
    let me = holder("replica-a");
    let token = hold_maintenance(pool, "replica-a").await;
    let mut conn = pool.acquire().await.unwrap();
    let id = store::enqueue(
        &mut conn,
        &Default::default(),
        &NewTask::new("k", json!({})).max_attempts(1),
    )
    .await
    .unwrap()
    .id;
    let worker = holder("w");
    let claim = store::claim_next(
        &mut conn,
        &Default::default(),
        &worker,
        Duration::from_millis(400),
    )
    .await
    .unwrap()
    .unwrap();
    let token_of_claim = claim.fencing_token.unwrap();

    // The heartbeat, on a connection of its own, in an open transaction:
    // the task row's guarded update (judged at its transaction's start,
    // before the deadline) and the lease's renewal, not yet committed.
    let mut beat = pool.acquire().await.unwrap().detach();
    let mut tx = beat.begin().await.unwrap();
    let extended = sqlx::query(
        "UPDATE tasks SET last_heartbeat_at = now(), must_heartbeat_before = now() + interval '30 s'
          WHERE id = $1 AND processor = $2 AND fencing_token = $3
            AND status = 'started' AND must_heartbeat_before > now()",
    )
    .bind(id)
    .bind(worker.as_str())
    .bind(token_of_claim)
    .execute(&mut *tx)
    .await
    .unwrap();
    assert_eq!(
        extended.rows_affected(),
        1,
        "the heartbeat's guard let it through"
    );
    sqlx::query(
        "UPDATE leases SET renewed_at = now(), expires_at = now() + interval '30 s'
          WHERE resource = $1 AND holder = $2 AND fencing_token = $3",
    )
    .bind(format!("task:{id}"))
    .bind(worker.as_str())
    .bind(token_of_claim)
    .execute(&mut *tx)
    .await
    .unwrap();
    // The deadline passes while the heartbeat is in flight: to any other
    // snapshot the task is late and out of attempts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let late: bool =
        sqlx::query_scalar("SELECT must_heartbeat_before <= now() FROM tasks WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(late, "the pass's snapshot sees the old deadline");

    // The pass runs on another connection while the heartbeat commits.
    let rescue = {
        let (pool, me) = (pool.clone(), me.clone());
        tokio::spawn(async move { pass(&pool, &me, token).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    tx.commit().await.unwrap();
    let rescued = rescue.await.unwrap();
    assert_eq!(rescued.failed, 0, "the pass failed a task being extended");
    // And after the commit, a pass sees the new deadline.
    assert_eq!(pass(pool, &me, token).await.failed, 0);
    let task = store::get(&mut conn, &Default::default(), id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (task.status, task.processor.as_deref()),
        (TaskStatus::Started, Some("w"))
    );
    // Its processor completes it with its token.
    let done = store::complete(
        &mut conn,
        &Default::default(),
        id,
        &worker,
        token_of_claim,
        None,
    )
    .await
    .unwrap();
    assert_eq!(done.status, TaskStatus::Processed);
}

#[tokio::test]
async fn a_pass_from_a_replica_that_lost_the_maintenance_lease_writes_nothing() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let id = out_of_attempts(pool, 1).await;
    let old = holder("replica-a");
    let old_token = hold_maintenance(pool, "replica-a").await;
    // replica-a's lease runs out and replica-b takes the job over.
    sqlx::query("UPDATE leases SET expires_at = now() - interval '1 ms' WHERE resource = $1")
        .bind(maintenance::RESOURCE)
        .execute(pool)
        .await
        .unwrap();
    let new_token = hold_maintenance(pool, "replica-b").await;
    assert!(new_token > old_token);
    let rescued = pass(pool, &old, old_token).await;
    assert_eq!(
        rescued,
        Rescued {
            failed: 0,
            refused: true,
            resumed: 0
        }
    );
    assert_eq!(status(pool, id).await, TaskStatus::Started);
    assert_eq!(
        event_kinds(pool, maintenance::RESOURCE)
            .await
            .last()
            .map(String::as_str),
        Some("stale_write_refused")
    );
    assert_eq!(pass(pool, &holder("replica-b"), new_token).await.failed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_maintenance_job_fails_a_late_task_out_of_attempts_within_its_rescue_interval() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let config = MaintenanceConfig {
        timing: LeaseTiming::from_ttl(Duration::from_millis(900)),
        retry: Duration::from_millis(100),
        // Pruning rarely, rescuing often: the rescue has its own cadence.
        interval: Duration::from_secs(3600),
        rescue_interval: Duration::from_millis(100),
        ..MaintenanceConfig::default()
    };
    let job = Maintenance::spawn(pool.clone(), holder("replica-a"), config);
    let progress = job.progress();
    // Started after the job's first pass, so only a later one can fail it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let id = out_of_attempts(pool, 1).await;
    let started = tokio::time::Instant::now();
    crate::common::until("the rescue", Duration::from_secs(5), || async {
        status(pool, id).await == TaskStatus::Failed
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    crate::common::until("the progress", Duration::from_secs(2), || async {
        progress.borrow().rescued == 1
    })
    .await;
    assert_eq!(progress.borrow().passes, 1, "one prune pass only");
    job.shutdown().await;
}

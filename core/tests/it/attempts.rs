//! A task's attempts on record (`queue::store::attempts`), each outcome
//! produced by the code path that causes it: the store's claim, complete,
//! fail and snooze, an operator's cancel, the worker runtime's time limit
//! and shutdown, a takeover after a lease ran out, a bulk claim, and
//! retention pruning them with their task.

use crate::common::{TestDb, holder, until};
use leasekeeper_core::maintenance::prune_once;
use leasekeeper_core::queue::control;
use leasekeeper_core::queue::store::{self, RetryPolicy, TaskError};
use leasekeeper_core::queue::{Attempt, AttemptOutcome, NewTask, Task, TaskStatus};
use leasekeeper_core::worker::handler::{Done, HandlerResult, Job, TaskContext};
use leasekeeper_core::worker::runtime::Runtime;
use serde_json::json;
use sqlx::PgPool;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);
/// Retries at once, so a test claims the retry without waiting.
const NO_BACKOFF: RetryPolicy = RetryPolicy {
    base: Duration::from_millis(1),
    max: Duration::from_millis(1),
    max_attempts: None,
    jitter: 0.0,
};

async fn enqueue(pool: &PgPool, new: NewTask) -> Task {
    store::enqueue(
        &mut pool.acquire().await.unwrap(),
        &Default::default(),
        &new,
    )
    .await
    .unwrap()
}

async fn claim(pool: &PgPool, by: &str, ttl: Duration) -> Task {
    store::claim_next(
        &mut pool.acquire().await.unwrap(),
        &Default::default(),
        &holder(by),
        ttl,
    )
    .await
    .unwrap()
    .expect("a claimable task")
}

async fn attempts(pool: &PgPool, id: i64) -> Vec<Attempt> {
    store::attempts(&mut pool.acquire().await.unwrap(), &Default::default(), id)
        .await
        .unwrap()
}

async fn task(pool: &PgPool, id: i64) -> Task {
    store::get(&mut pool.acquire().await.unwrap(), &Default::default(), id)
        .await
        .unwrap()
        .unwrap()
}

fn outcomes(attempts: &[Attempt]) -> Vec<AttemptOutcome> {
    attempts.iter().map(|a| a.outcome).collect()
}

#[tokio::test]
async fn a_claim_opens_a_running_attempt_and_its_completion_closes_it() {
    let db = TestDb::new().await;
    let t = enqueue(&db.pool, NewTask::new("k", json!({}))).await;
    assert!(attempts(&db.pool, t.id).await.is_empty(), "never claimed");
    let claimed = claim(&db.pool, "w1", TTL).await;
    let running = attempts(&db.pool, t.id).await;
    assert_eq!(running.len(), 1);
    let a = &running[0];
    assert_eq!(
        (
            a.number,
            a.processor.as_str(),
            Some(a.fencing_token),
            a.outcome
        ),
        (1, "w1", claimed.fencing_token, AttemptOutcome::Running)
    );
    assert_eq!(Some(a.claimed_at), claimed.started_at);
    assert_eq!((a.ended_at, a.error.as_deref()), (None, None));

    let done = store::complete(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        t.id,
        &holder("w1"),
        claimed.fencing_token.unwrap(),
        None,
    )
    .await
    .unwrap();
    let ended = attempts(&db.pool, t.id).await;
    assert_eq!(outcomes(&ended), [AttemptOutcome::Completed]);
    assert_eq!(ended[0].ended_at, done.processed_at);
    // A refused second completion records nothing.
    let again = store::complete(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        t.id,
        &holder("w1"),
        claimed.fencing_token.unwrap(),
        None,
    )
    .await;
    assert!(matches!(again, Err(TaskError::Stale { .. })));
    assert_eq!(attempts(&db.pool, t.id).await, ended);
}

#[tokio::test]
async fn failed_attempts_keep_their_errors_in_order_until_the_task_fails() {
    let db = TestDb::new().await;
    let t = enqueue(&db.pool, NewTask::new("k", json!({})).max_attempts(2)).await;
    for (by, error) in [("w1", "first boom"), ("w2", "second boom")] {
        until("the retry is due", Duration::from_secs(5), || async {
            task(&db.pool, t.id).await.scheduled_at <= chrono::Utc::now()
        })
        .await;
        let claimed = claim(&db.pool, by, TTL).await;
        store::fail(
            &mut db.pool.acquire().await.unwrap(),
            &Default::default(),
            t.id,
            &holder(by),
            claimed.fencing_token.unwrap(),
            error,
            NO_BACKOFF,
        )
        .await
        .unwrap();
    }
    assert_eq!(task(&db.pool, t.id).await.status, TaskStatus::Failed);
    let all = attempts(&db.pool, t.id).await;
    let seen: Vec<(i32, &str, AttemptOutcome, Option<&str>)> = all
        .iter()
        .map(|a| {
            (
                a.number,
                a.processor.as_str(),
                a.outcome,
                a.error.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (1, "w1", AttemptOutcome::Failed, Some("first boom")),
            (2, "w2", AttemptOutcome::Failed, Some("second boom")),
        ]
    );
    assert!(all[0].fencing_token < all[1].fencing_token);
    assert!(all.iter().all(|a| a.ended_at.is_some()));
}

/// The takeover: the first claim's lease runs out, another claim takes the
/// task with a higher token, and the first attempt is closed as taken over
/// in that claim's transaction; the old holder's late completion is refused
/// and changes no attempt.
#[tokio::test]
async fn a_claim_after_the_lease_ran_out_closes_the_old_attempt_as_taken_over() {
    let db = TestDb::new().await;
    let t = enqueue(&db.pool, NewTask::new("k", json!({}))).await;
    let first = claim(&db.pool, "w1", Duration::from_millis(300)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = claim(&db.pool, "w2", TTL).await;
    assert_eq!(second.id, t.id, "the late task was taken over");
    let all = attempts(&db.pool, t.id).await;
    assert_eq!(
        outcomes(&all),
        [AttemptOutcome::TakenOver, AttemptOutcome::Running]
    );
    assert_eq!(
        (all[0].processor.as_str(), Some(all[0].fencing_token)),
        ("w1", first.fencing_token)
    );
    assert_eq!(
        (all[1].processor.as_str(), Some(all[1].fencing_token)),
        ("w2", second.fencing_token)
    );
    assert!(all[0].fencing_token < all[1].fencing_token);
    assert_eq!(all[0].ended_at, Some(all[1].claimed_at));

    let late = store::complete(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        t.id,
        &holder("w1"),
        first.fencing_token.unwrap(),
        None,
    )
    .await;
    assert!(matches!(late, Err(TaskError::Stale { .. })));
    assert_eq!(attempts(&db.pool, t.id).await, all);
}

/// A task whose lease runs out on its last attempt is taken by no claim and
/// failed by the rescuer's next pass: its attempt fails with the reason.
#[tokio::test]
async fn a_lease_that_ran_out_on_the_last_attempt_fails_it() {
    let db = TestDb::new().await;
    let t = enqueue(&db.pool, NewTask::new("k", json!({})).max_attempts(1)).await;
    claim(&db.pool, "w1", Duration::from_millis(200)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let none = store::claim_next(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &holder("w2"),
        TTL,
    )
    .await
    .unwrap();
    assert!(none.is_none());
    assert_eq!(task(&db.pool, t.id).await.status, TaskStatus::Started);
    let me = holder("maintainer");
    let lease = leasekeeper_core::lease::store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &crate::common::resource(leasekeeper_core::maintenance::RESOURCE),
        &me,
        TTL,
    )
    .await
    .unwrap()
    .into_lease();
    let fence = leasekeeper_core::queue::rescuer::Fence {
        resource: leasekeeper_core::maintenance::RESOURCE,
        holder: &me,
        token: lease.fencing_token,
    };
    let rescued = leasekeeper_core::queue::rescuer::rescue_once(&db.pool, fence, 10, || true)
        .await
        .unwrap();
    assert_eq!(rescued.failed, 1);
    assert_eq!(task(&db.pool, t.id).await.status, TaskStatus::Failed);
    let all = attempts(&db.pool, t.id).await;
    assert_eq!(outcomes(&all), [AttemptOutcome::Failed]);
    assert!(
        all[0]
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("lease expired"),
        "{all:?}"
    );
}

#[tokio::test]
async fn an_operators_cancel_of_a_started_task_closes_its_attempt_as_cancelled() {
    let db = TestDb::new().await;
    let t = enqueue(&db.pool, NewTask::new("k", json!({}))).await;
    claim(&db.pool, "w1", TTL).await;
    let cancelled = control::cancel(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        t.id,
        "ops",
    )
    .await
    .unwrap();
    let all = attempts(&db.pool, t.id).await;
    assert_eq!(outcomes(&all), [AttemptOutcome::Cancelled]);
    assert_eq!(all[0].ended_at, cancelled.cancelled_at);
    // A retry starts a new attempt, numbered after the cancelled one.
    control::retry(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        t.id,
        "ops",
    )
    .await
    .unwrap();
    claim(&db.pool, "w2", TTL).await;
    let all = attempts(&db.pool, t.id).await;
    assert_eq!(
        all.iter()
            .map(|a| (a.number, a.outcome))
            .collect::<Vec<_>>(),
        [(1, AttemptOutcome::Cancelled), (2, AttemptOutcome::Running)]
    );
}

#[tokio::test]
async fn a_snooze_closes_the_attempt_as_snoozed_and_the_next_claim_numbers_on() {
    let db = TestDb::new().await;
    let t = enqueue(&db.pool, NewTask::new("k", json!({}))).await;
    let claimed = claim(&db.pool, "w1", TTL).await;
    store::snooze(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        t.id,
        &holder("w1"),
        claimed.fencing_token.unwrap(),
        Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(task(&db.pool, t.id).await.attempts, 0, "not counted");
    let again = claim(&db.pool, "w1", TTL).await;
    let all = attempts(&db.pool, t.id).await;
    assert_eq!(
        all.iter()
            .map(|a| (a.number, a.outcome))
            .collect::<Vec<_>>(),
        [(1, AttemptOutcome::Snoozed), (2, AttemptOutcome::Running)]
    );
    assert_eq!(Some(all[1].fencing_token), again.fencing_token);
    assert_eq!(all[0].error, None);
}

/// The runtime's time limit and its shutdown: each a failed attempt for
/// the queue, told apart on record; a claim given back unstarted is
/// `given_back`, the one the shutdown interrupted `interrupted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_records_a_time_out_as_timed_out_and_a_shutdown_as_interrupted() {
    let db = TestDb::new().await;
    let hang = enqueue(
        &db.pool,
        NewTask::new("hang", json!({}))
            .max_attempts(1)
            .timeout(Duration::from_millis(300)),
    )
    .await;
    let slow = enqueue(&db.pool, NewTask::new("slow", json!({}))).await;
    // Its handler says when it runs: a task claimed ahead (prefetch) shows
    // `started` while it waits.
    let slow_running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let running = slow_running.clone();
    let runtime = Runtime::builder(db.pool.clone())
        .id("rt-attempts")
        .scheduler(None)
        .queue("default", 2)
        .shutdown_grace(Duration::from_millis(200))
        .handler("hang", |_: Job, ctx: TaskContext| async move {
            ctx.cancelled().await;
            HandlerResult::Ok(Done::empty())
        })
        .handler("slow", move |_: Job, _: TaskContext| {
            running.store(true, std::sync::atomic::Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                HandlerResult::Ok(Done::empty())
            }
        })
        .start()
        .await
        .unwrap();
    until("the hang timed out", Duration::from_secs(10), || async {
        task(&db.pool, hang.id).await.status == TaskStatus::Failed
            && slow_running.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    runtime.shutdown().await;

    let timed_out = attempts(&db.pool, hang.id).await;
    assert_eq!(outcomes(&timed_out), [AttemptOutcome::TimedOut]);
    assert_eq!(timed_out[0].error.as_deref(), Some("timed out after 300ms"));
    assert!(timed_out[0].processor.starts_with("rt-attempts"));

    assert_eq!(task(&db.pool, slow.id).await.status, TaskStatus::Pending);
    // Claimed ahead behind the hang by the same worker, it may have been
    // given back unstarted first, for the idle worker to run (each such
    // attempt says so); its last attempt is the one the shutdown ended.
    let slow_attempts = attempts(&db.pool, slow.id).await;
    let (last, ahead) = slow_attempts.split_last().expect("an attempt");
    assert!(
        ahead.iter().all(|a| a.outcome == AttemptOutcome::GivenBack
            && a.error
                .as_deref()
                .unwrap_or_default()
                .contains("claimed ahead")),
        "{slow_attempts:?}"
    );
    assert_eq!(
        last.outcome,
        AttemptOutcome::Interrupted,
        "{slow_attempts:?}"
    );
    assert!(
        last.error
            .as_deref()
            .unwrap_or_default()
            .contains("stopped before finishing"),
        "{slow_attempts:?}"
    );
}

/// `fail_as` names only a failure's kinds.
#[tokio::test]
async fn fail_as_refuses_an_outcome_that_is_not_a_failure() {
    let db = TestDb::new().await;
    let t = enqueue(&db.pool, NewTask::new("k", json!({}))).await;
    let claimed = claim(&db.pool, "w1", TTL).await;
    let wrong = store::fail_as(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        t.id,
        &holder("w1"),
        claimed.fencing_token.unwrap(),
        "x",
        NO_BACKOFF,
        AttemptOutcome::Completed,
    )
    .await;
    assert!(matches!(wrong, Err(TaskError::BadInput(_))), "{wrong:?}");
    assert_eq!(
        outcomes(&attempts(&db.pool, t.id).await),
        [AttemptOutcome::Running]
    );
}

/// `given_back` means an attempt not used: a worker of an earlier version
/// that fails an attempt "given back" (it stopped mid-task) has it
/// recorded as `interrupted`, the attempt spent.
#[tokio::test]
async fn fail_as_records_an_earlier_versions_given_back_as_interrupted() {
    let db = TestDb::new().await;
    let t = enqueue(&db.pool, NewTask::new("k", json!({})).max_attempts(3)).await;
    let claimed = claim(&db.pool, "w1", TTL).await;
    let failed = store::fail_as(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        t.id,
        &holder("w1"),
        claimed.fencing_token.unwrap(),
        "worker w1 stopped before finishing",
        NO_BACKOFF,
        AttemptOutcome::GivenBack,
    )
    .await
    .unwrap();
    assert_eq!(failed.attempts, 1, "the attempt is spent");
    assert_eq!(
        outcomes(&attempts(&db.pool, t.id).await),
        [AttemptOutcome::Interrupted]
    );
}

#[tokio::test]
async fn an_unknown_task_has_no_attempts_to_read() {
    let db = TestDb::new().await;
    let missing = store::attempts(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        424242,
    )
    .await;
    assert!(
        matches!(missing, Err(TaskError::NotFound(424242))),
        "{missing:?}"
    );
}

/// A bulk claim of a thousand tasks opens a thousand attempts (one INSERT
/// in the claim's statement trigger), each with its task's token.
#[tokio::test]
async fn a_bulk_claim_records_every_attempt() {
    let db = TestDb::new().await;
    let news: Vec<NewTask> = (0..1000)
        .map(|i| NewTask::new("k", json!({ "i": i })))
        .collect();
    store::enqueue_many(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &news,
    )
    .await
    .unwrap();
    let claimed = store::claim_batch(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &holder("bulk"),
        TTL,
        1000,
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 1000);
    let mismatched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tasks t
           LEFT JOIN attempts a ON a.task_id = t.id AND a.number = 1
          WHERE a.task_id IS NULL OR a.fencing_token <> t.fencing_token
             OR a.processor <> 'bulk' OR a.outcome <> 'running'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!((recorded, mismatched), (1000, 0));
}

/// Retention deletes a finished task's attempts with it, and leaves a
/// young task's alone.
#[tokio::test]
async fn retention_prunes_the_attempts_with_their_task() {
    let db = TestDb::new().await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let t = enqueue(&db.pool, NewTask::new("k", json!({}))).await;
        let claimed = claim(&db.pool, "w1", TTL).await;
        store::complete(
            &mut db.pool.acquire().await.unwrap(),
            &Default::default(),
            t.id,
            &holder("w1"),
            claimed.fencing_token.unwrap(),
            None,
        )
        .await
        .unwrap();
        ids.push(t.id);
    }
    let (old, young) = (ids[0], ids[1]);
    sqlx::query("UPDATE tasks SET processed_at = processed_at - interval '2 hours' WHERE id = $1")
        .bind(old)
        .execute(&db.pool)
        .await
        .unwrap();
    prune_once(&db.pool, Duration::from_secs(3600), 100, || true)
        .await
        .unwrap();
    let left: Vec<i64> = sqlx::query_scalar("SELECT task_id FROM attempts ORDER BY task_id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, [young]);
}

/// Rows of `attempts` read so far in the transaction of `conn`, by any
/// scan (PostgreSQL's own counters of this backend's open transaction).
async fn attempts_rows_read(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT (coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0))::int8
           FROM pg_stat_xact_user_tables WHERE relid = 'attempts'::regclass",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

/// The attempts trigger's statements are planned once per session and
/// kept. A session that first fired it while `attempts` was empty (a fresh
/// deployment, or a truncated table) must not keep a plan that reads the
/// whole table: `attempts` grows by a row per claim, and such a plan made
/// every claim and completion slower than the last (issue 27's long
/// benchmark windows fell from 2,700 to 1,000 tasks/s in ten seconds).
/// Here the session plans on an empty, analyzed table; the table then gets
/// 20,000 rows of other tasks; the same session's claim of 20 tasks and
/// their completion read only those tasks' attempts.
#[tokio::test]
async fn the_attempts_trigger_reads_by_task_even_on_plans_made_when_the_table_was_empty() {
    let db = TestDb::new().await;
    let schema = Default::default();
    let worker = holder("w1");
    sqlx::query("ANALYZE attempts")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut session = db.pool.acquire().await.unwrap();
    // The trigger's plans, made now in this session: a claim and a completion.
    enqueue(&db.pool, NewTask::new("k", json!({}))).await;
    let first = store::claim_batch(&mut session, &schema, &worker, TTL, 1)
        .await
        .unwrap();
    store::complete_all_of(
        &mut session,
        &schema,
        &worker,
        &[(first[0].id, first[0].fencing_token.unwrap())],
        None,
    )
    .await
    .unwrap();
    // The table grows, from another session: attempts of 20,000 other tasks.
    sqlx::query(
        "INSERT INTO attempts (task_id, number, processor, fencing_token, claimed_at, ended_at, outcome)
         SELECT -g, 1, 'elsewhere', 1, now(), now(), 'completed' FROM generate_series(1, 20000) g",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let news: Vec<NewTask> = (0..20)
        .map(|i| NewTask::new("k", json!({ "i": i })))
        .collect();
    store::enqueue_many(&mut db.pool.acquire().await.unwrap(), &schema, &news)
        .await
        .unwrap();
    // The same session, in one transaction so its counters add up.
    let mut tx = sqlx::Connection::begin(&mut *session).await.unwrap();
    let claimed = store::claim_batch(&mut tx, &schema, &worker, TTL, 20)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 20);
    let after_claim = attempts_rows_read(&mut tx).await;
    let claims: Vec<(i64, i64)> = claimed
        .iter()
        .map(|t| (t.id, t.fencing_token.unwrap()))
        .collect();
    let done = store::complete_all_of(&mut tx, &schema, &worker, &claims, None)
        .await
        .unwrap();
    assert_eq!(done.len(), 20);
    let after_completion = attempts_rows_read(&mut tx).await;
    tx.commit().await.unwrap();
    // A claim reads at most each task's last attempt; a completion, the
    // attempt it closes. A scan of the table would read 20,000 or more.
    assert!(
        after_claim <= 20 && after_completion - after_claim <= 20,
        "rows of attempts read: {after_claim} by the claim, {} by the completion",
        after_completion - after_claim
    );
    let closed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM attempts WHERE task_id = ANY($1) AND outcome = 'completed'",
    )
    .bind(claims.iter().map(|c| c.0).collect::<Vec<_>>())
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(closed, 20, "every completion closed its attempt");
}

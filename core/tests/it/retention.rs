//! Retention (`leasekeeper_core::maintenance`) against a real database:
//! what goes and what stays, rising tokens after pruning, the job on
//! exactly one replica, and the races: an operator's retry against the
//! pruner, and a claim against an open pruning batch.

use crate::common::{TestDb, backend_pid, connection_on_old_shard_of, holder, resource};
use leasekeeper_core::lease::client::LeaseTiming;
use leasekeeper_core::lease::singleton::State;
use leasekeeper_core::lease::store as leases;
use leasekeeper_core::maintenance::{self, Maintenance, MaintenanceConfig, prune_once, store};
use leasekeeper_core::queue::store::{self as tasks, RetryPolicy};
use leasekeeper_core::queue::{NewTask, TaskStatus};
use serde_json::json;
use sqlx::{Connection, PgConnection, PgPool};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);
const TTL: Duration = Duration::from_secs(30);

async fn enqueue(pool: &PgPool, max_attempts: i32) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    let new = NewTask::new("sleep", json!({})).max_attempts(max_attempts);
    tasks::enqueue(&mut conn, &Default::default(), &new)
        .await
        .unwrap()
        .id
}

/// Claims task `id` (the only claimable one) and answers its token.
async fn claim(pool: &PgPool, id: i64, by: &str) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    let task = tasks::claim_next(&mut conn, &Default::default(), &holder(by), TTL)
        .await
        .unwrap()
        .expect("a claimable task");
    assert_eq!(task.id, id);
    task.fencing_token.unwrap()
}

async fn processed(pool: &PgPool) -> i64 {
    let id = enqueue(pool, 5).await;
    let token = claim(pool, id, "w").await;
    let mut conn = pool.acquire().await.unwrap();
    tasks::complete(
        &mut conn,
        &Default::default(),
        id,
        &holder("w"),
        token,
        None,
    )
    .await
    .unwrap();
    id
}

async fn failed(pool: &PgPool) -> i64 {
    let id = enqueue(pool, 1).await;
    let token = claim(pool, id, "w").await;
    let mut conn = pool.acquire().await.unwrap();
    let task = tasks::fail(
        &mut conn,
        &Default::default(),
        id,
        &holder("w"),
        token,
        "boom",
        RetryPolicy::default(),
    )
    .await
    .unwrap();
    assert_eq!(task.status, TaskStatus::Failed);
    id
}

/// Moves task `id`'s finishing moment `ago` into the past.
async fn finished_ago(pool: &PgPool, id: i64, ago: Duration) {
    sqlx::query(
        "UPDATE tasks
            SET processed_at = processed_at - make_interval(secs => $2),
                failed_at = failed_at - make_interval(secs => $2),
                cancelled_at = cancelled_at - make_interval(secs => $2)
          WHERE id = $1",
    )
    .bind(id)
    .bind(ago.as_secs_f64())
    .execute(pool)
    .await
    .unwrap();
}

/// Rows of task `id` in tasks, leases, lease_events and lease_fencing.
async fn rows_of(pool: &PgPool, id: i64) -> [i64; 4] {
    let r = format!("task:{id}");
    let count = |sql: &'static str| {
        let r = r.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(r)
                .fetch_one(pool)
                .await
                .unwrap()
        }
    };
    [
        sqlx::query_scalar("SELECT count(*) FROM tasks WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap(),
        count("SELECT count(*) FROM leases WHERE resource = $1").await,
        count("SELECT count(*) FROM lease_events WHERE resource = $1").await,
        count("SELECT count(*) FROM lease_fencing WHERE resource = $1").await,
    ]
}

/// The counters agree with the rows, status by status.
async fn assert_counts_match_rows(pool: &PgPool) {
    let mismatched: Vec<(String, i64, i64)> = sqlx::query_as(
        "WITH counted AS (
            SELECT sum(pending) AS pending, sum(started) AS started, sum(processed) AS processed,
                   sum(failed) AS failed, sum(cancelled) AS cancelled FROM task_counts),
         statuses(status, counted) AS (
            SELECT s.status, s.n::bigint FROM counted c CROSS JOIN LATERAL (VALUES
                ('pending', c.pending), ('started', c.started), ('processed', c.processed),
                ('failed', c.failed), ('cancelled', c.cancelled)) AS s(status, n))
         SELECT s.status, s.counted, (SELECT count(*) FROM tasks t WHERE t.status = s.status)
           FROM statuses s
          WHERE s.counted <> (SELECT count(*) FROM tasks t WHERE t.status = s.status)",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        mismatched.is_empty(),
        "(status, counted, rows): {mismatched:?}"
    );
}

#[tokio::test]
async fn old_finished_tasks_go_with_their_leases_and_history_and_the_rest_stays() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let old_processed = processed(pool).await;
    let old_failed = failed(pool).await;
    let old_cancelled = enqueue(pool, 5).await;
    sqlx::query("UPDATE tasks SET status = 'cancelled', cancelled_at = now() WHERE id = $1")
        .bind(old_cancelled)
        .execute(pool)
        .await
        .unwrap();
    let recent_processed = processed(pool).await;
    let started = enqueue(pool, 5).await;
    claim(pool, started, "w").await;
    let pending = enqueue(pool, 5).await;
    for id in [old_processed, old_failed, old_cancelled] {
        finished_ago(pool, id, 2 * HOUR).await;
    }
    // Unfinished tasks are never pruned, however old.
    sqlx::query(
        "UPDATE tasks SET created_at = now() - interval '1 day', scheduled_at = now() - interval '1 day'
          WHERE id IN ($1, $2)",
    )
    .bind(started)
    .bind(pending)
    .execute(pool)
    .await
    .unwrap();
    let before_recent = rows_of(pool, recent_processed).await;
    let before_started = rows_of(pool, started).await;

    // Batches of 2: the three old tasks take two batches.
    let pruned = prune_once(pool, HOUR, 2, || true).await.unwrap();

    assert_eq!(pruned.tasks, 3, "{pruned:?}");
    assert_eq!(
        pruned.leases, 0,
        "a task's claim has no lease row: {pruned:?}"
    );
    for id in [old_processed, old_failed, old_cancelled] {
        assert_eq!(rows_of(pool, id).await, [0, 0, 0, 0], "task {id}");
    }
    assert_eq!(rows_of(pool, recent_processed).await, before_recent);
    assert_eq!(rows_of(pool, started).await, before_started);
    assert_eq!(rows_of(pool, pending).await[0], 1);
    // Pruning wrote no history of its own.
    let deleted: i64 =
        sqlx::query_scalar("SELECT count(*) FROM lease_events WHERE kind = 'deleted'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(deleted, 0);
    assert_counts_match_rows(pool).await;
    // The throughput chart's totals do not shrink: pruned tasks still count.
    let (processed_ever, failed_ever): (i64, i64) = sqlx::query_as(
        "SELECT sum(processed + pruned_processed)::bigint, sum(failed + pruned_failed)::bigint
           FROM task_counts",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!((processed_ever, failed_ever), (2, 1));

    // A second pass finds nothing more.
    let again = prune_once(pool, HOUR, 2, || true).await.unwrap();
    assert_eq!(again.total(), 0, "{again:?}");
}

#[tokio::test]
async fn a_deletion_outside_pruning_is_still_recorded() {
    let db = TestDb::new().await;
    let r = resource("api:thing");
    let mut conn = db.pool.acquire().await.unwrap();
    let lease = leases::acquire(&mut conn, &Default::default(), &r, &holder("a"), TTL)
        .await
        .unwrap()
        .into_lease();
    sqlx::query("DELETE FROM leases WHERE id = $1")
        .bind(lease.id)
        .execute(&mut *conn)
        .await
        .unwrap();
    let kinds = crate::common::event_kinds(&db.pool, "api:thing").await;
    assert_eq!(kinds, ["acquired", "deleted"]);
}

#[tokio::test]
async fn tokens_keep_rising_for_a_resource_whose_lease_row_and_history_were_pruned() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let r = resource("singleton:nightly");
    let mut conn = pool.acquire().await.unwrap();
    for who in ["a", "b"] {
        leases::acquire(&mut conn, &Default::default(), &r, &holder(who), TTL)
            .await
            .unwrap();
        leases::release(&mut conn, &Default::default(), &r, &holder(who), None)
            .await
            .unwrap();
    }
    // Both terms ended two hours ago, and their history is that old.
    sqlx::query(
        "UPDATE leases SET expires_at = expires_at - interval '2 hours' WHERE resource = $1",
    )
    .bind(r.as_str())
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("UPDATE lease_events SET at = at - interval '2 hours'")
        .execute(pool)
        .await
        .unwrap();

    let pruned = prune_once(pool, HOUR, 1000, || true).await.unwrap();
    assert_eq!(pruned.leases, 1, "{pruned:?}");
    assert!(pruned.lease_events >= 4, "{pruned:?}");
    assert!(
        leases::get_by_resource(&mut conn, &Default::default(), &r)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        crate::common::event_kinds(pool, r.as_str())
            .await
            .is_empty()
    );

    let next = leases::acquire(&mut conn, &Default::default(), &r, &holder("c"), TTL)
        .await
        .unwrap()
        .into_lease();
    assert_eq!(next.fencing_token, 3, "tokens must not start again at 1");
}

#[tokio::test]
async fn live_leases_and_young_history_and_live_processes_stay() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let mut conn = pool.acquire().await.unwrap();
    // A lease held for a long time: its term began long ago, but it is live.
    let held = resource("singleton:held");
    leases::acquire(&mut conn, &Default::default(), &held, &holder("a"), TTL)
        .await
        .unwrap();
    sqlx::query("UPDATE leases SET acquired_at = now() - interval '1 day'")
        .execute(pool)
        .await
        .unwrap();
    leasekeeper_core::instance::store::register(
        &mut conn,
        &Default::default(),
        "i-alive",
        "127.0.0.1:1",
    )
    .await
    .unwrap();
    leasekeeper_core::instance::store::register(
        &mut conn,
        &Default::default(),
        "i-dead",
        "127.0.0.1:2",
    )
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO workers (id, instance_id, kind, state, last_seen_at)
         VALUES ('w-alive', 'i-alive', 'simulated', 'idle', now()),
                ('w-dead', 'i-dead', 'simulated', 'crashed', now() - interval '2 hours'),
                ('w-silent', 'i-dead', 'http', 'working', now() - interval '2 hours')",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE instances SET last_seen_at = now() - interval '2 hours', stopped_at = now() - interval '2 hours'
          WHERE id = 'i-dead'",
    )
    .execute(pool)
    .await
    .unwrap();

    let pruned = prune_once(pool, HOUR, 1000, || true).await.unwrap();
    assert_eq!(
        (
            pruned.leases,
            pruned.lease_events,
            pruned.instances,
            pruned.workers
        ),
        (0, 0, 1, 2),
        "{pruned:?}"
    );
    assert!(
        leases::get_by_resource(&mut conn, &Default::default(), &held)
            .await
            .unwrap()
            .is_some()
    );
    let instances: Vec<String> = sqlx::query_scalar("SELECT id FROM instances ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(instances, ["i-alive"]);
    let workers: Vec<String> = sqlx::query_scalar("SELECT id FROM workers ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(workers, ["w-alive"]);
}

async fn wait_until(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} not within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_replica_runs_the_job_and_another_takes_over() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let config = MaintenanceConfig {
        timing: LeaseTiming::from_ttl(Duration::from_millis(900)),
        retry: Duration::from_millis(100),
        interval: Duration::from_millis(50),
        retention: HOUR,
        failed_retention: HOUR,
        batch: 100,
        rescue_interval: Duration::from_millis(50),
    };
    let old = processed(pool).await;
    finished_ago(pool, old, 2 * HOUR).await;

    let a = Maintenance::spawn(pool.clone(), holder("replica-a"), config);
    let mut a_state = a.singleton().watch_state();
    tokio::time::timeout(
        Duration::from_secs(5),
        a_state.wait_for(|s| *s == State::Working),
    )
    .await
    .expect("a works")
    .unwrap();
    let b = Maintenance::spawn(pool.clone(), holder("replica-b"), config);
    let (a_progress, b_progress) = (a.progress(), b.progress());
    wait_until("ten passes on a", Duration::from_secs(10), || {
        a_progress.borrow().passes >= 10
    })
    .await;
    // a did the work; b, all the while, did no pass.
    assert_eq!(a_progress.borrow().pruned.tasks, 1);
    assert_eq!(rows_of(pool, old).await, [0, 0, 0, 0]);
    assert_eq!(b_progress.borrow().passes, 0);
    assert!(
        matches!(b.singleton().state(), State::Waiting | State::Acquiring),
        "{:?}",
        b.singleton().state()
    );
    let mut conn = pool.acquire().await.unwrap();
    let lease = leases::get_by_resource(
        &mut conn,
        &Default::default(),
        &resource(maintenance::RESOURCE),
    )
    .await
    .unwrap()
    .expect("the maintenance lease");
    assert_eq!(lease.holder.as_deref(), Some("replica-a"));
    let a_token = a.singleton().token().expect("a holds a term");

    // a stops (releasing): b takes over, in a higher term, and prunes.
    let newer = processed(pool).await;
    finished_ago(pool, newer, 2 * HOUR).await;
    a.shutdown().await;
    wait_until("a pass on b", Duration::from_secs(5), || {
        b_progress.borrow().pruned.tasks >= 1
    })
    .await;
    assert!(b.singleton().token().expect("b holds a term") > a_token);
    assert_eq!(rows_of(pool, newer).await, [0, 0, 0, 0]);
    b.shutdown().await;
}

/// An operator's retry of a failed or cancelled task, through the real
/// control (`leasekeeper_core::queue::control::retry`): true when it
/// retried the task, false when it found it gone (pruned) or already
/// pending again (another operator's retry won).
async fn retry(conn: &mut PgConnection, id: i64) -> bool {
    use leasekeeper_core::queue::store::TaskError;
    match leasekeeper_core::queue::control::retry(conn, &Default::default(), id, "retention-test")
        .await
    {
        Ok(_) => true,
        Err(TaskError::NotFound(_) | TaskError::Stale { .. }) => false,
        Err(e) => panic!("retry of task {id}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_racing_the_pruner_leaves_each_task_whole_or_gone() {
    let db = TestDb::with_connections(12).await;
    let pool = db.pool.clone();
    const N: i32 = 240;
    let mut ids = Vec::new();
    for _ in 0..N {
        ids.push(failed(&pool).await);
    }
    sqlx::query("UPDATE tasks SET failed_at = failed_at - interval '2 hours'")
        .execute(&pool)
        .await
        .unwrap();
    let mut history_before = std::collections::BTreeMap::new();
    for id in &ids {
        history_before.insert(*id, rows_of(&pool, *id).await);
    }

    // Operators retry every task, from four connections, each in its own
    // order; claimers take the retried tasks at once (a claim upserts the
    // task's lease and writes its history) and complete them; meanwhile
    // the pruner deletes in batches of 5.
    let pruning_done = Arc::new(AtomicBool::new(false));
    let mut retriers = Vec::new();
    for r in 0..4usize {
        let pool = pool.clone();
        let mut order = ids.clone();
        order.rotate_left(r * ids.len() / 4);
        if r % 2 == 1 {
            order.reverse();
        }
        retriers.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            let mut retried = BTreeSet::new();
            for id in order {
                if retry(&mut conn, id).await {
                    retried.insert(id);
                }
            }
            retried
        }));
    }
    let mut claimers = Vec::new();
    for c in 0..3 {
        let pool = pool.clone();
        let done = pruning_done.clone();
        claimers.push(tokio::spawn(async move {
            let me = holder(&format!("claimer-{c}"));
            let mut conn = pool.acquire().await.unwrap();
            loop {
                match tasks::claim_next(&mut conn, &Default::default(), &me, TTL)
                    .await
                    .unwrap()
                {
                    Some(task) => {
                        tasks::complete(
                            &mut conn,
                            &Default::default(),
                            task.id,
                            &me,
                            task.fencing_token.unwrap(),
                            None,
                        )
                        .await
                        .unwrap();
                    }
                    None if done.load(Ordering::SeqCst) => return,
                    None => tokio::time::sleep(Duration::from_millis(2)).await,
                }
            }
        }));
    }
    let pruner = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            let mut pruned = 0;
            loop {
                let batch = store::prune_tasks(&mut conn, &Default::default(), HOUR, 5)
                    .await
                    .unwrap();
                pruned += batch.tasks;
                // Stop once no failed task is left to decide about.
                let left: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'failed'")
                        .fetch_one(&mut *conn)
                        .await
                        .unwrap();
                if batch.tasks == 0 && left == 0 {
                    return pruned;
                }
            }
        })
    };
    let mut retried = BTreeSet::new();
    for r in retriers {
        retried.extend(r.await.unwrap());
    }
    let pruned = pruner.await.unwrap();
    pruning_done.store(true, Ordering::SeqCst);
    for c in claimers {
        c.await.unwrap();
    }

    // The race happened: some tasks went, some were retried first.
    assert!(
        pruned > 0 && !retried.is_empty(),
        "pruned {pruned}, retried {}",
        retried.len()
    );
    assert_eq!(pruned as usize + retried.len(), N as usize);
    for id in &ids {
        let [task, lease, events, fencing] = rows_of(&pool, *id).await;
        if retried.contains(id) {
            // Whole: the retry was answered, so the task and all its past
            // stay, and it ran again (a new term on the same lease row).
            let [_, lease_before, events_before, fencing_before] = history_before[id];
            assert_eq!(
                (task, lease, fencing),
                (1, lease_before, fencing_before),
                "task {id}"
            );
            assert!(events > events_before, "task {id}: {events} events");
        } else {
            // Gone: nothing of it is left.
            assert_eq!([task, lease, events, fencing], [0, 0, 0, 0], "task {id}");
        }
    }
    let left: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, status FROM tasks WHERE status <> 'processed'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(left.is_empty(), "every retried task ran: {left:?}");
    assert_counts_match_rows(&pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_does_not_wait_on_an_open_pruning_batch() {
    let db = TestDb::with_connections(4).await;
    let pool = db.pool.clone();
    let old = processed(&pool).await;
    finished_ago(&pool, old, 2 * HOUR).await;
    // Hold the pruning batch open for 3 s after it deleted the task (and
    // counted the deletion): a statement trigger that sleeps, in pruning
    // transactions only, after the counter trigger (triggers fire in name
    // order).
    sqlx::query(
        "CREATE FUNCTION zz_slow() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF pruning() THEN PERFORM pg_sleep(3); END IF;
             RETURN NULL;
         END $$",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("CREATE TRIGGER zz_slow AFTER DELETE ON tasks FOR EACH STATEMENT EXECUTE FUNCTION zz_slow()")
        .execute(&pool)
        .await
        .unwrap();

    let mut pruner_conn = pool.acquire().await.unwrap().detach();
    let pruner_pid = backend_pid(&mut pruner_conn).await;
    // A claimer on the pruner's connection's counter shard as it was
    // (pg_backend_pid() % 16) before counters were sharded by transaction
    // (migration 20261203000001): the one whose counter row a pruner
    // counting like any writer could have locked.
    let mut claimer = connection_on_old_shard_of(&pool, pruner_pid).await;
    let pruning = tokio::spawn(async move {
        let pruned = store::prune_tasks(&mut pruner_conn, &Default::default(), HOUR, 100)
            .await
            .unwrap();
        pruner_conn.close().await.unwrap();
        pruned
    });
    // Let the batch reach its sleep.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!pruning.is_finished());

    let started = std::time::Instant::now();
    let task = tasks::enqueue(
        &mut claimer,
        &Default::default(),
        &NewTask::new("sleep", json!({})),
    )
    .await
    .unwrap();
    let claimed = tasks::claim_next(&mut claimer, &Default::default(), &holder("w2"), TTL)
        .await
        .unwrap()
        .expect("the new task");
    assert_eq!(claimed.id, task.id);
    tasks::complete(
        &mut claimer,
        &Default::default(),
        task.id,
        &holder("w2"),
        claimed.fencing_token.unwrap(),
        None,
    )
    .await
    .unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "enqueue, claim and complete waited for the pruner: {took:?}"
    );
    assert!(!pruning.is_finished(), "the batch was still open");
    assert_eq!(pruning.await.unwrap().tasks, 1);
    assert_counts_match_rows(&pool).await;
}

#[tokio::test]
async fn old_schedule_ticks_go_and_the_schedule_keeps_its_place() {
    use leasekeeper_core::schedule::{NewSchedule, store as schedules};
    let db = TestDb::new().await;
    let pool = &db.pool;
    let mut conn = pool.acquire().await.unwrap();
    let schema = leasekeeper_core::db::Schema::default();
    schedules::upsert(
        &mut conn,
        &schema,
        &NewSchedule::new("s", "0 2 * * *", "k"),
        "t",
    )
    .await
    .unwrap();
    // Two ticks on record, one fired two hours ago and one just now.
    sqlx::query(
        "INSERT INTO schedule_ticks (schedule, tick_at, task_id, holder, fencing_token, fired_at, caught_up)
         VALUES ('s', now() - interval '2 hours', 1, 'h', 1, now() - interval '2 hours', false),
                ('s', now(), 2, 'h', 1, now(), false)",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("UPDATE schedules SET last_tick_at = now() WHERE name = 's'")
        .execute(pool)
        .await
        .unwrap();
    let pruned = prune_once(pool, HOUR, 1000, || true).await.unwrap();
    assert_eq!(pruned.schedule_ticks, 1);
    let left: Vec<i64> = sqlx::query_scalar("SELECT task_id FROM schedule_ticks")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(left, [2]);
    let s = schedules::get(&mut conn, &schema, "s")
        .await
        .unwrap()
        .unwrap();
    assert!(
        s.last_tick_at.is_some(),
        "the schedule keeps its newest tick's time"
    );
}

/// Queues left without tasks are pruned, except paused ones; a queue with a
/// task stays. Race: an enqueue into an empty queue, in flight (its
/// transaction open) while the prune runs, keeps its queue: the prune gives
/// up on the lock every enqueue holds until its commit, and the queue is
/// still there with its task afterwards.
#[tokio::test]
async fn queues_without_tasks_are_pruned_except_paused_ones_and_an_enqueue_in_flight_keeps_its_own()
{
    use leasekeeper_core::queue::queues;
    let db = TestDb::new().await;
    let pool = &db.pool;
    let schema = Default::default();
    let mut conn = pool.acquire().await.unwrap();
    tasks::enqueue(
        &mut conn,
        &schema,
        &NewTask::new("sleep", json!({})).queue("busy"),
    )
    .await
    .unwrap();
    queues::pause(&mut conn, &schema, "held", "ops")
        .await
        .unwrap();
    for name in ["lonely", "later"] {
        sqlx::query("INSERT INTO queues (name) VALUES ($1)")
            .bind(name)
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    // An enqueue into `later`, not yet committed.
    let mut enqueuer = pool.acquire().await.unwrap();
    let mut tx = enqueuer.begin().await.unwrap();
    tasks::enqueue(
        &mut tx,
        &schema,
        &NewTask::new("sleep", json!({})).queue("later"),
    )
    .await
    .unwrap();
    let names = async |pool: &PgPool| -> Vec<String> {
        sqlx::query_scalar("SELECT name FROM queues ORDER BY name")
            .fetch_all(pool)
            .await
            .unwrap()
    };
    let pruned = store::prune_queues(&mut conn, &schema, 100).await.unwrap();
    assert_eq!(
        pruned.queues, 0,
        "the enqueue in flight holds the queues off"
    );
    assert_eq!(names(pool).await, ["busy", "held", "later", "lonely"]);
    tx.commit().await.unwrap();
    let pruned = prune_once(pool, HOUR, 100, || true).await.unwrap();
    assert_eq!(pruned.queues, 1, "{pruned:?}");
    assert_eq!(names(pool).await, ["busy", "held", "later"]);
    // Used again, a pruned queue comes back with its task.
    tasks::enqueue(
        &mut conn,
        &schema,
        &NewTask::new("sleep", json!({})).queue("lonely"),
    )
    .await
    .unwrap();
    assert_eq!(names(pool).await, ["busy", "held", "later", "lonely"]);
}

#[tokio::test]
async fn failed_tasks_outlive_processed_ones_by_their_own_retention() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let (done, dead) = (processed(pool).await, failed(pool).await);
    finished_ago(pool, done, 2 * HOUR).await;
    finished_ago(pool, dead, 2 * HOUR).await;
    let kept = leasekeeper_core::maintenance::Retention::new(HOUR, 3 * HOUR);
    let pruned = prune_once(pool, kept, 100, || true).await.unwrap();
    assert_eq!(pruned.tasks, 1);
    assert_eq!(
        rows_of(pool, done).await[0],
        0,
        "the processed task is gone"
    );
    assert_eq!(rows_of(pool, dead).await[0], 1, "the failed one is kept");
    finished_ago(pool, dead, 2 * HOUR).await;
    let pruned = prune_once(pool, kept, 100, || true).await.unwrap();
    assert_eq!((pruned.tasks, rows_of(pool, dead).await[0]), (1, 0));
    // A failed retention below the other is raised to it.
    assert_eq!(
        leasekeeper_core::maintenance::Retention::new(3 * HOUR, HOUR).failed,
        3 * HOUR
    );
}

#[tokio::test]
async fn a_workflow_is_pruned_only_once_every_task_of_it_finished() {
    use leasekeeper_core::workflow::{NewWorkflow, WorkflowTask, store as flows};
    let db = TestDb::new().await;
    let pool = &db.pool;
    let step = |r: &str| WorkflowTask::new(r, NewTask::new("s", json!({})));
    let flow = flows::enqueue_workflow(
        &mut pool.acquire().await.unwrap(),
        &Default::default(),
        &NewWorkflow::new("w")
            .task(step("a"))
            .task(step("b").after(["a"])),
    )
    .await
    .unwrap();
    let (a, b) = (flow.tasks[0].id, flow.tasks[1].id);
    let token = claim(pool, a, "w").await;
    tasks::complete(
        &mut pool.acquire().await.unwrap(),
        &Default::default(),
        a,
        &holder("w"),
        token,
        Some(&json!("out")),
    )
    .await
    .unwrap();
    finished_ago(pool, a, 2 * HOUR).await;
    // b is pending: a stays, old as it is.
    let pruned = prune_once(pool, HOUR, 100, || true).await.unwrap();
    assert_eq!(pruned.tasks, 0);
    let token = claim(pool, b, "w").await;
    tasks::complete(
        &mut pool.acquire().await.unwrap(),
        &Default::default(),
        b,
        &holder("w"),
        token,
        None,
    )
    .await
    .unwrap();
    // Now finished: a goes (old enough), b stays (young), the workflow too.
    let pruned = prune_once(pool, HOUR, 100, || true).await.unwrap();
    assert_eq!(pruned.tasks, 1);
    let edges: i64 = sqlx::query_scalar("SELECT count(*) FROM task_parents")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(edges, 1, "b's edge stays with b");
    finished_ago(pool, b, 2 * HOUR).await;
    let pruned = prune_once(pool, HOUR, 100, || true).await.unwrap();
    assert_eq!(pruned.tasks, 1);
    let left: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM task_parents), (SELECT count(*) FROM workflows)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        left,
        (0, 0),
        "the edges and the workflow go with the last task"
    );
}

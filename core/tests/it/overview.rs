//! The overview's readings against a real database: counter-table counts
//! exact under concurrent claimers, the split-brain check (positive and
//! negative), the task lists' plans with a million tasks, and (ignored, run
//! by hand) the counter trigger's cost on claim + complete throughput.

use crate::common::{TestDb, backend_pid, connection_on_old_shard_of, holder, resource};
use leasekeeper_core::counts::{self, Counts};
use leasekeeper_core::db::Schema;
use leasekeeper_core::lease::history::split_brain::{self, SplitBrain};
use leasekeeper_core::lease::store as leases;
use leasekeeper_core::queue::store::{self, RetryPolicy};
use leasekeeper_core::queue::{TaskSearch, TaskStatus};
use serde_json::{Value, json};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;

const TTL: Duration = Duration::from_secs(30);

/// The counts computed the expensive way, for comparison.
async fn real_counts(pool: &PgPool) -> Counts {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'pending')   AS tasks_pending,
                count(*) FILTER (WHERE status = 'started')   AS tasks_started,
                count(*) FILTER (WHERE status = 'processed') AS tasks_processed,
                count(*) FILTER (WHERE status = 'failed')    AS tasks_failed,
                count(*) FILTER (WHERE status = 'cancelled') AS tasks_cancelled,
                count(*) FILTER (WHERE status = 'waiting')   AS tasks_waiting,
                count(*) FILTER (WHERE status = 'started' AND must_heartbeat_before <= now()) AS tasks_late,
                (SELECT count(*) FROM leases WHERE released_at IS NULL AND expires_at > now()) AS leases_active
           FROM tasks",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn cheap_counts(pool: &PgPool) -> Counts {
    counts::counts(&mut pool.acquire().await.unwrap(), &Default::default())
        .await
        .unwrap()
}

async fn insert_tasks(pool: &PgPool, n: i32, max_attempts: i32) {
    sqlx::query(
        "INSERT INTO tasks (kind, task_data, max_attempts)
         SELECT 'sleep', jsonb_build_object('n', g), $2 FROM generate_series(1, $1) g",
    )
    .bind(n)
    .bind(max_attempts)
    .execute(pool)
    .await
    .unwrap();
}

/// Race prevented: two connections changing task statuses at once, one
/// holding its change uncommitted, on connections whose backend pids fall
/// on one counter shard (the shard was `pg_backend_pid() % 16` until
/// migration `20261203000001`: a runtime's claimer and completer met like
/// this for the whole life of their connections, each waiting for the
/// other's commit). The second claims while the first's transaction is
/// open, without waiting for its counter row; and the counts stay exact.
#[tokio::test]
async fn a_status_change_does_not_wait_for_another_connection_s_counter_row() {
    let db = TestDb::new().await;
    insert_tasks(&db.pool, 2, 5).await;
    let mut first = db.pool.acquire().await.unwrap().detach();
    let first_pid = backend_pid(&mut first).await;
    let mut second = connection_on_old_shard_of(&db.pool, first_pid).await;
    let schema = Schema::default();
    let mut tx = sqlx::Connection::begin(&mut first).await.unwrap();
    store::claim_next(&mut tx, &schema, &holder("w1"), TTL)
        .await
        .unwrap()
        .expect("a task for the first");
    // Waiting for the first's counter row would end in this error.
    sqlx::query("SET lock_timeout = '3s'")
        .execute(&mut second)
        .await
        .unwrap();
    let claimed = store::claim_next(&mut second, &schema, &holder("w2"), TTL).await;
    assert!(
        matches!(claimed, Ok(Some(_))),
        "the second claim waited for the first's transaction: {claimed:?}"
    );
    tx.commit().await.unwrap();
    assert_eq!(cheap_counts(&db.pool).await, real_counts(&db.pool).await);
    assert_eq!(cheap_counts(&db.pool).await.tasks_started, 2);
}

/// Race prevented: a transaction left open after a status change (a
/// replica frozen before its commit) holding the counter shard of its
/// transaction id, while others claim. Forty claims, each its own
/// transaction, run through consecutive transaction ids and so through
/// every shard, the open one's too (until migration `20261204000001` one
/// of them waited for it); none may wait, and the counts stay exact.
#[tokio::test]
async fn no_status_change_waits_for_a_transaction_left_open() {
    let db = TestDb::new().await;
    insert_tasks(&db.pool, 41, 5).await;
    let schema = Schema::default();
    let mut open = db.pool.acquire().await.unwrap().detach();
    let mut tx = sqlx::Connection::begin(&mut open).await.unwrap();
    store::claim_next(&mut tx, &schema, &holder("frozen"), TTL)
        .await
        .unwrap()
        .expect("a task for the open transaction");
    let mut other = db.pool.acquire().await.unwrap().detach();
    // Waiting for the open transaction's counter row would end in this error.
    sqlx::query("SET lock_timeout = '2s'")
        .execute(&mut other)
        .await
        .unwrap();
    for n in 0..40 {
        let claimed = store::claim_next(&mut other, &schema, &holder("w"), TTL).await;
        assert!(
            matches!(claimed, Ok(Some(_))),
            "claim {n} waited for the open transaction: {claimed:?}"
        );
    }
    tx.commit().await.unwrap();
    assert_eq!(cheap_counts(&db.pool).await, real_counts(&db.pool).await);
    assert_eq!(cheap_counts(&db.pool).await.tasks_started, 41);
}

/// 16 concurrent claimers claim 500 tasks; every fifth attempt fails (back
/// to pending, or failed after its second attempt), the rest complete.
/// Then some claims are left
/// started and some late. The counter table must match count(*) exactly,
/// also after deleting tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counts_stay_exact_under_sixteen_concurrent_claimers() {
    let db = TestDb::with_connections(24).await;
    insert_tasks(&db.pool, 500, 2).await;
    assert_eq!(cheap_counts(&db.pool).await.tasks_pending, 500);
    let barrier = Arc::new(Barrier::new(16));
    let claimers = spawn_claimers(&db.pool, Some(5), barrier);
    for c in claimers {
        c.await.unwrap();
    }
    let real = real_counts(&db.pool).await;
    assert!(
        real.tasks_processed > 300 && real.tasks_failed > 0,
        "{real:?}"
    );
    assert_eq!(cheap_counts(&db.pool).await, real);

    // Started, late, enqueued one by one, and deleted tasks are counted too.
    insert_tasks(&db.pool, 10, 3).await;
    let mut conn = db.pool.acquire().await.unwrap();
    for _ in 0..3 {
        store::claim_next(&mut conn, &Default::default(), &holder("stuck"), TTL)
            .await
            .unwrap()
            .unwrap();
    }
    store::enqueue(
        &mut conn,
        &Default::default(),
        &leasekeeper_core::queue::NewTask::new(
            leasekeeper_core::worker::simulated::KIND,
            json!({}),
        )
        .max_attempts(3),
    )
    .await
    .unwrap();
    sqlx::query(
        "UPDATE tasks SET must_heartbeat_before = now() - interval '1 s'
          WHERE id IN (SELECT id FROM tasks WHERE status = 'started' ORDER BY id LIMIT 2)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("DELETE FROM tasks WHERE id % 7 = 0")
        .execute(&db.pool)
        .await
        .unwrap();
    // A lease of the lease store is counted (a task's claim is its task row,
    // counted as started).
    leases::acquire(
        &mut conn,
        &Default::default(),
        &resource("job:counted"),
        &holder("h"),
        TTL,
    )
    .await
    .unwrap();
    let real = real_counts(&db.pool).await;
    let cheap = cheap_counts(&db.pool).await;
    assert_eq!(cheap, real);
    assert!(
        cheap.tasks_late >= 1 && cheap.leases_active >= 1,
        "{cheap:?}"
    );
}

/// Appends an event to `lease_events` by hand, `at_ms`/`expires_ms` relative to now.
async fn event(
    pool: &PgPool,
    resource: &str,
    holder: &str,
    token: i64,
    kind: &str,
    at_ms: i64,
    expires_ms: i64,
) {
    sqlx::query(
        "INSERT INTO lease_events (resource, holder, fencing_token, kind, at, expires_at)
         VALUES ($1, $2, $3, $4,
                 now() + make_interval(secs => $5::float8 / 1000),
                 now() + make_interval(secs => $6::float8 / 1000))",
    )
    .bind(resource)
    .bind(holder)
    .bind(token)
    .bind(kind)
    .bind(at_ms)
    .bind(expires_ms)
    .execute(pool)
    .await
    .unwrap();
}

async fn check(pool: &PgPool) -> SplitBrain {
    split_brain::check(
        &mut pool.acquire().await.unwrap(),
        &Default::default(),
        split_brain::WINDOW,
        split_brain::MAX_EVENTS,
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_clean_history_shows_no_split_brain() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    // Real terms through the lease store: acquire, renew, release,
    // reacquire by another holder, and a takeover after expiry.
    let r = resource("job:clean");
    leases::acquire(&mut conn, &Default::default(), &r, &holder("a"), TTL)
        .await
        .unwrap();
    leases::renew(&mut conn, &Default::default(), &r, &holder("a"), None, None)
        .await
        .unwrap();
    leases::release(&mut conn, &Default::default(), &r, &holder("a"), None)
        .await
        .unwrap();
    leases::acquire(
        &mut conn,
        &Default::default(),
        &r,
        &holder("b"),
        Duration::from_millis(50),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    leases::acquire(&mut conn, &Default::default(), &r, &holder("c"), TTL)
        .await
        .unwrap();
    // Hand-made history: a takeover just after the old term ran out, and a
    // reacquire after a release.
    event(&db.pool, "job:x", "a", 1, "acquired", -10_000, -3_000).await;
    event(&db.pool, "job:x", "a", 1, "renewed", -6_000, -2_000).await;
    event(&db.pool, "job:x", "b", 2, "taken_over", -2_000, 8_000).await;
    event(&db.pool, "job:y", "a", 1, "acquired", -10_000, 10_000).await;
    event(&db.pool, "job:y", "a", 1, "released", -5_000, -5_000).await;
    event(&db.pool, "job:y", "b", 2, "acquired", -4_000, 10_000).await;
    // A claimed task agrees with its lease.
    insert_tasks(&db.pool, 1, 3).await;
    store::claim_next(&mut conn, &Default::default(), &holder("w"), TTL)
        .await
        .unwrap()
        .unwrap();
    let found = check(&db.pool).await;
    assert!(found.overlaps.is_empty(), "{:?}", found.overlaps);
    assert!(found.events_checked >= 10, "{found:?}");
    assert_eq!(found.covered_secs, split_brain::WINDOW.as_secs() as i64);
}

#[tokio::test]
async fn overlapping_terms_are_flagged() {
    let db = TestDb::new().await;
    // b's term starts while a's renewed term still runs for 5 s.
    event(&db.pool, "job:twice", "a", 1, "acquired", -20_000, -10_000).await;
    event(&db.pool, "job:twice", "a", 1, "renewed", -12_000, 5_000).await;
    event(&db.pool, "job:twice", "b", 2, "taken_over", -1_000, 10_000).await;
    // Unrelated clean resource.
    event(&db.pool, "job:fine", "a", 1, "acquired", -20_000, -10_000).await;
    event(&db.pool, "job:fine", "b", 2, "taken_over", -5_000, 10_000).await;
    let found = check(&db.pool).await;
    let mut flagged: Vec<(String, String)> = found
        .overlaps
        .iter()
        .map(|o| (o.source.clone(), o.resource.clone()))
        .collect();
    flagged.sort();
    assert_eq!(
        flagged,
        vec![("lease_events".to_string(), "job:twice".to_string())]
    );
    let o = &found.overlaps[0];
    assert_eq!(
        (o.holder.as_deref(), o.other_holder.as_deref()),
        (Some("b"), Some("a"))
    );
    assert_eq!((o.fencing_token, o.other_token), (Some(2), Some(1)));

    // Out of the window: not flagged any more.
    let mut conn = db.pool.acquire().await.unwrap();
    let narrow = split_brain::check(
        &mut conn,
        &Default::default(),
        Duration::from_millis(500),
        1000,
    )
    .await
    .unwrap();
    assert!(
        narrow.overlaps.iter().all(|o| o.source == "tasks"),
        "{narrow:?}"
    );
}

/// Every node of an EXPLAIN (FORMAT JSON) plan.
fn plan_nodes<'a>(node: &'a Value, out: &mut Vec<&'a Value>) {
    out.push(node);
    if let Some(children) = node["Plans"].as_array() {
        for child in children {
            plan_nodes(child, out);
        }
    }
}

/// With a million tasks (nearly all processed, the failed ones the oldest),
/// each status filter's list query reads through an index, under a custom
/// and a generic plan, and reads little: a query that walked the primary
/// key and filtered by status would read the whole table to find the
/// newest failed tasks.
#[tokio::test]
async fn task_lists_use_an_index_with_a_million_tasks() {
    let db = TestDb::new().await;
    sqlx::query(
        "INSERT INTO tasks (kind, task_data, status, processor, fencing_token, must_heartbeat_before,
                            started_at, processed_at, failed_at)
         SELECT 'sleep', jsonb_build_object('n', g, 'customer', g % 100000), s,
                CASE WHEN s = 'started' THEN 'w' END,
                CASE WHEN s = 'started' THEN 1 END,
                CASE WHEN s = 'started' THEN now() + interval '1 minute' END,
                CASE WHEN s IN ('started', 'processed') THEN now() END,
                CASE WHEN s = 'processed' AND g > 2100 THEN now() - interval '1 hour'
                     WHEN s = 'processed' THEN now() END,
                CASE WHEN s = 'failed' THEN now() END
           FROM generate_series(1, 1000000) g,
                LATERAL (SELECT CASE WHEN g <= 1000 THEN 'failed'
                                     WHEN g <= 1100 THEN 'started'
                                     WHEN g > 999000 THEN 'pending'
                                     ELSE 'processed' END AS s) st",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE tasks")
        .execute(&db.pool)
        .await
        .unwrap();
    let counts = cheap_counts(&db.pool).await;
    assert_eq!(
        (
            counts.tasks_failed,
            counts.tasks_started,
            counts.tasks_pending,
            counts.tasks_processed
        ),
        (1000, 100, 1000, 997_900),
        "the statement-level insert trigger counted the bulk insert"
    );

    let mut conn = db.pool.acquire().await.unwrap();
    let mut filters: Vec<Option<TaskStatus>> = vec![None];
    filters.extend(TaskStatus::ALL.map(Some));
    let mut prepared = 0;
    for mode in ["force_custom_plan", "force_generic_plan"] {
        sqlx::query(&format!("SET plan_cache_mode = {mode}"))
            .execute(&mut *conn)
            .await
            .unwrap();
        for status in &filters {
            for newest_first in [true, false] {
                let sql = Schema::default().sql(&store::sql::list(&(*status).into(), newest_first));
                prepared += 1;
                sqlx::query(&format!("PREPARE q{prepared} AS {sql}"))
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                let name = status.map(TaskStatus::as_str);
                let args = if newest_first {
                    "9223372036854775807, 100"
                } else {
                    "0, 100"
                };
                let plan: Value = sqlx::query_scalar(&format!(
                    "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE q{prepared}({args})"
                ))
                .fetch_one(&mut *conn)
                .await
                .unwrap();
                let mut nodes = Vec::new();
                plan_nodes(&plan[0]["Plan"], &mut nodes);
                let what = format!("{mode}, status {name:?}, newest first {newest_first}");
                assert!(
                    nodes.iter().all(|n| n["Node Type"] != "Seq Scan"),
                    "{what}: seq scan in {plan:#}"
                );
                let removed: i64 = nodes
                    .iter()
                    .map(|n| n["Rows Removed by Filter"].as_i64().unwrap_or(0))
                    .sum();
                assert!(
                    removed <= 10_000,
                    "{what}: read {removed} rows only to drop them: {plan:#}"
                );
            }
        }
        // A data filter matching ten tasks among the million, alone and
        // with a status or kind: the GIN index finds them, in a plan made
        // with the filter's value. A generic plan cannot know how few match
        // and walks the primary key (580 ms): the store never prepares a
        // search by data (`a_search_by_data_is_never_a_prepared_statement`).
        if mode == "force_generic_plan" {
            continue;
        }
        let data = serde_json::json!({"customer": 4242}).as_object().cloned();
        let searches = [
            TaskSearch {
                data: data.clone(),
                ..TaskSearch::default()
            },
            TaskSearch {
                status: Some(TaskStatus::Processed),
                data: data.clone(),
                ..TaskSearch::default()
            },
            TaskSearch {
                kind: Some("sleep".into()),
                data: data.clone(),
                ..TaskSearch::default()
            },
        ];
        for search in &searches {
            let sql = Schema::default().sql(&store::sql::list(search, true));
            prepared += 1;
            sqlx::query(&format!("PREPARE q{prepared} AS {sql}"))
                .execute(&mut *conn)
                .await
                .unwrap();
            let args = match search.kind {
                Some(_) => "9223372036854775807, 100, 'sleep', '{\"customer\": 4242}'",
                None => "9223372036854775807, 100, '{\"customer\": 4242}'",
            };
            let plan: Value = sqlx::query_scalar(&format!(
                "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE q{prepared}({args})"
            ))
            .fetch_one(&mut *conn)
            .await
            .unwrap();
            let mut nodes = Vec::new();
            plan_nodes(&plan[0]["Plan"], &mut nodes);
            let what = format!("{mode}, {search:?}");
            assert!(
                nodes.iter().any(|n| n["Index Name"] == "tasks_data_idx"),
                "{what}: the data index is not used: {plan:#}"
            );
            let found = plan[0]["Plan"]["Actual Rows"].as_i64();
            assert_eq!(found, Some(10), "{what}: {plan:#}");
        }
    }
    // The queues' figures count the pending, started and failed tasks by
    // index, in the generic plan still set on this session: the started
    // ones from an index that holds only them (`tasks_started_idx`, or
    // `tasks_started_key_idx`, as small: which one the planner takes turns
    // on the sampled statistics; the status index does not hold them),
    // the others from `tasks_status_id_idx`; the thousand processed in the
    // last minute from `tasks_finished_idx`, not by reading all million.
    // (They finish again now, so they are recent however long the plans
    // above took.)
    sqlx::query("UPDATE tasks SET processed_at = now() WHERE id BETWEEN 1101 AND 2100")
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let queues = leasekeeper_core::queue::queues::list(&mut tx, &Schema::default())
        .await
        .unwrap();
    let scans: (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT pg_stat_get_xact_numscans('tasks_status_id_idx'::regclass)::int8,
                pg_stat_get_xact_numscans('tasks_started_idx'::regclass)::int8
                  + pg_stat_get_xact_numscans('tasks_started_key_idx'::regclass)::int8,
                pg_stat_get_xact_numscans('tasks_finished_idx'::regclass)::int8,
                seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'tasks'::regclass",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    // What the figure must be, counted the plain way (a whole read) after
    // the reads above were counted, in the same transaction's clock.
    let recent: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tasks
          WHERE status = 'processed' AND processed_at > now() - interval '1 minute'",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let default = queues
        .iter()
        .find(|q| q.name == "default")
        .expect("the default queue");
    assert_eq!(
        (default.pending, default.started, default.failed),
        (1000, 100, 1000),
        "the queue's figures"
    );
    assert_eq!((default.completed_last_minute, recent), (1000, 1000));
    assert!(
        scans.0 >= 1 && scans.1 >= 1 && scans.2 >= 1 && scans.3 == 0,
        "scans of tasks_status_id_idx, the started tasks' indexes, tasks_finished_idx, \
         and whole reads of tasks: {scans:?}"
    );
}

/// 16 claimers, each on its own connection (so on many counter shards),
/// released together by `barrier`, claiming until nothing is left. Every
/// `fail_every`-th attempt of a claimer fails (back to pending after a
/// millisecond, or failed after its last attempt), the rest complete.
fn spawn_claimers(
    pool: &PgPool,
    fail_every: Option<u32>,
    barrier: Arc<Barrier>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let policy = RetryPolicy::exponential(Duration::from_millis(1), Duration::from_millis(1));
    (0..16)
        .map(|w| {
            let pool = pool.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                let me = holder(&format!("w{w}"));
                barrier.wait().await;
                // Failed attempts come back after their backoff: look again
                // a few times before deciding the queue is empty.
                let patience = if fail_every.is_some() { 20 } else { 1 };
                let (mut idle_rounds, mut n) = (0, 0);
                while idle_rounds < patience {
                    let Some(task) = store::claim_next(&mut conn, &Default::default(), &me, TTL)
                        .await
                        .unwrap()
                    else {
                        idle_rounds += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    idle_rounds = 0;
                    n += 1;
                    let token = task.fencing_token.unwrap();
                    if fail_every.is_some_and(|every| n % every == 0) {
                        store::fail(
                            &mut conn,
                            &Default::default(),
                            task.id,
                            &me,
                            token,
                            "boom",
                            policy,
                        )
                        .await
                        .unwrap();
                    } else {
                        store::complete(&mut conn, &Default::default(), task.id, &me, token, None)
                            .await
                            .unwrap();
                    }
                }
            })
        })
        .collect()
}

/// Claims and completes `n` tasks with 16 concurrent claimers; tasks/s.
async fn claim_complete_rate(db: &TestDb, n: i32) -> f64 {
    insert_tasks(&db.pool, n, 3).await;
    let barrier = Arc::new(Barrier::new(17));
    let claimers = spawn_claimers(&db.pool, None, barrier.clone());
    barrier.wait().await;
    let started = Instant::now();
    for c in claimers {
        c.await.unwrap();
    }
    f64::from(n) / started.elapsed().as_secs_f64()
}

/// The counter triggers' cost on the queue's hot path: claim + complete
/// throughput with and without them, alternating, five rounds each.
/// Run by hand: `cargo test --features ssr --test it counter_trigger_cost -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement, run by hand"]
async fn counter_trigger_cost() {
    let mut with = Vec::new();
    let mut without = Vec::new();
    for round in 0..5 {
        for triggers in [round % 2 == 0, round % 2 != 0] {
            let db = TestDb::with_connections(20).await;
            if !triggers {
                sqlx::query("ALTER TABLE tasks DISABLE TRIGGER task_counts_move")
                    .execute(&db.pool)
                    .await
                    .unwrap();
            }
            let rate = claim_complete_rate(&db, 2000).await;
            println!("round {round}: triggers {triggers}: {rate:.0} tasks/s");
            if triggers {
                with.push(rate)
            } else {
                without.push(rate)
            }
        }
    }
    with.sort_by(f64::total_cmp);
    without.sort_by(f64::total_cmp);
    let ratio = with[2] / without[2];
    println!(
        "median with trigger {:.0}/s, without {:.0}/s: ratio {ratio:.3}",
        with[2], without[2]
    );
    assert!(
        ratio >= 0.9,
        "the counter trigger costs more than 10 %: {ratio:.3}"
    );
}

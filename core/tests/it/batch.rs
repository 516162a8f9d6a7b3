//! The batched statements a runtime's producer, completer, heartbeater and
//! reporter use (`queue::store::{claim_for, complete_each,
//! heartbeat_each}`, `worker::registry::record_each`), raced for real, and
//! the runtime's batching seen from the database.

use crate::common::{TestDb, holder};
use leasekeeper_core::lease::Holder;
use leasekeeper_core::queue::Task;
use leasekeeper_core::queue::control;
use leasekeeper_core::queue::store::{self, Completion, TaskError};
use leasekeeper_core::queue::{ClaimFilter, TaskStatus};
use leasekeeper_core::worker::handler::{Done, Job, TaskContext};
use leasekeeper_core::worker::registry;
use leasekeeper_core::worker::runtime::Runtime;
use leasekeeper_core::worker::{Report, WorkerKind, WorkerState};
use rand::Rng;
use serde_json::json;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

const TTL: Duration = Duration::from_secs(30);

pub(crate) async fn add_tasks(pool: &PgPool, kind: &str, n: i32) {
    sqlx::query("INSERT INTO tasks (kind, task_data) SELECT $1, '{}' FROM generate_series(1, $2)")
        .bind(kind)
        .bind(n)
        .execute(pool)
        .await
        .unwrap();
}

fn holders(prefix: &str, n: usize) -> Vec<Holder> {
    (0..n).map(|i| holder(&format!("{prefix}{i}"))).collect()
}

/// Makes the claims on `ids` run out `offset_ms` from now, by the database clock.
async fn expire_in(pool: &PgPool, ids: &[i64], offset_ms: i64) {
    sqlx::query(
        "UPDATE tasks SET must_heartbeat_before = now() + make_interval(secs => $2::float8 / 1000)
          WHERE id = ANY($1)",
    )
    .bind(ids)
    .bind(offset_ms)
    .execute(pool)
    .await
    .unwrap();
}

/// `kind` events recorded for the task leases of `ids`.
pub(crate) async fn events(pool: &PgPool, kind: &str, ids: &[i64]) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM lease_events
          WHERE kind = $1 AND resource = ANY(SELECT 'task:' || unnest($2::int4[]))",
    )
    .bind(kind)
    .bind(ids)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Takes over whatever of the queue is late, for up to 150 ms.
async fn take_over(pool: PgPool, round: usize, n: usize) -> Vec<(i64, i64)> {
    let takers = holders(&format!("b{round}-"), n);
    let start = tokio::time::Instant::now();
    let mut taken = Vec::new();
    while start.elapsed() < Duration::from_millis(150) && taken.len() < n {
        let mut conn = pool.acquire().await.unwrap();
        let free: Vec<Holder> = takers[taken.len()..].to_vec();
        let got = store::claim_for(
            &mut conn,
            &Default::default(),
            &free,
            TTL,
            &ClaimFilter::default(),
        )
        .await
        .unwrap();
        taken.extend(got.tasks.iter().map(|t| (t.id, t.fencing_token.unwrap())));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    taken
}

/// Claims `n` fresh tasks for `n` holders of round `round`.
pub(crate) async fn claim_round(pool: &PgPool, round: usize, n: usize) -> Vec<(i64, i64, Holder)> {
    add_tasks(pool, "sleep", n as i32).await;
    let mut conn = pool.acquire().await.unwrap();
    let old = holders(&format!("a{round}-"), n);
    // Longer than any deadline `expire_in` sets, so that moving it is never
    // a renewal in the history.
    let claimed = store::claim_for(
        &mut conn,
        &Default::default(),
        &old,
        Duration::from_secs(60),
        &ClaimFilter::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        claimed.tasks.len(),
        n,
        "round {round}: every holder got a task"
    );
    claimed
        .tasks
        .iter()
        .map(|t| {
            let who = holder(t.processor.as_deref().unwrap());
            (t.id, t.fencing_token.unwrap(), who)
        })
        .collect()
}

/// Completes the tasks a round's taker took (`(id, token)`), so the next
/// round's claims find only their own tasks.
pub(crate) async fn finish_round(pool: &PgPool, taken: &[(i64, i64)]) {
    let mut each = Vec::new();
    for &(id, token) in taken {
        let processor: String = sqlx::query_scalar("SELECT processor FROM tasks WHERE id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
        each.push(Completion::new(id, token, holder(&processor), None));
    }
    let mut conn = pool.acquire().await.unwrap();
    for outcome in store::complete_each(&mut conn, &Default::default(), &each)
        .await
        .unwrap()
    {
        outcome.unwrap();
    }
}

pub(crate) type Outcomes = Vec<Result<Task, TaskError>>;

/// One round of a race at the deadline: the round's `claims` run out 0 to
/// 12 ms from now; then, released together by a barrier, `write` (one
/// batched statement over the claims, on a connection of its own) races a
/// taker claiming whatever is late. Answers the write's outcomes and what
/// the taker took (`(id, token)`).
pub(crate) async fn race_at_deadline<F, Fut>(
    pool: &PgPool,
    round: usize,
    claims: &[(i64, i64, Holder)],
    write: F,
) -> (Outcomes, Vec<(i64, i64)>)
where
    F: FnOnce(PoolConnection<Postgres>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Outcomes> + Send,
{
    let ids: Vec<i64> = claims.iter().map(|c| c.0).collect();
    // Mostly at the deadline (0 to 12 ms away), where the race is real; one
    // round in ten already late and one in ten far off, so that both
    // outcomes occur however slow or fast the machine is (on a loaded one,
    // the taker once never won a 0-12 ms race in 30 rounds).
    let offset = match round % 10 {
        0 => -1_000,
        5 => 10_000,
        _ => rand::rng().random_range(0..=12),
    };
    expire_in(pool, &ids, offset).await;
    let barrier = Arc::new(Barrier::new(2));
    let writing = {
        let (barrier, pool) = (barrier.clone(), pool.clone());
        tokio::spawn(async move {
            let conn = pool.acquire().await.unwrap();
            barrier.wait().await;
            write(conn).await
        })
    };
    let taking = {
        let (barrier, pool, n) = (barrier.clone(), pool.clone(), claims.len());
        tokio::spawn(async move {
            barrier.wait().await;
            take_over(pool, round, n).await
        })
    };
    (writing.await.unwrap(), taking.await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batched_completion_raced_with_takeovers_at_the_deadline_never_lets_both_win() {
    // Each round: 6 tasks claimed by 6 holders in one statement; their
    // claims run out 0 to 12 ms from now; then, released together by a
    // barrier, one completion statement for all 6 races a taker claiming
    // whatever is late. Per task: the completion was accepted and the task
    // not taken over, or it was taken over (next token) and the completion
    // refused and recorded; never both, never neither.
    let db = TestDb::with_connections(8).await;
    let n = 6;
    let (mut completed, mut taken_over) = (0, 0);
    for round in 0..30 {
        let claims = claim_round(&db.pool, round, n).await;
        let ids: Vec<i64> = claims.iter().map(|c| c.0).collect();
        let each: Vec<Completion> = claims
            .iter()
            .map(|(id, token, who)| {
                Completion::new(*id, *token, who.clone(), Some(json!({"by": who.as_str()})))
            })
            .collect();
        let (outcomes, taken) = race_at_deadline(&db.pool, round, &claims, |mut conn| async move {
            store::complete_each(&mut conn, &Default::default(), &each)
                .await
                .unwrap()
        })
        .await;
        let taken_ids: HashMap<i64, i64> = taken.iter().copied().collect();
        for ((id, token, who), outcome) in claims.iter().zip(&outcomes) {
            match (outcome, taken_ids.get(id)) {
                (Ok(task), None) => {
                    completed += 1;
                    assert_eq!(task.status, TaskStatus::Processed);
                    assert_eq!(task.task_output, Some(json!({"by": who.as_str()})));
                }
                (Err(TaskError::Stale { .. }), Some(new_token)) => {
                    taken_over += 1;
                    assert_eq!(*new_token, token + 1, "round {round}: the next token");
                }
                other => panic!("round {round}, task {id}: both or neither won: {other:?}"),
            }
        }
        // Every refusal and every takeover is in the history.
        let refused = outcomes.iter().filter(|o| o.is_err()).count() as i64;
        assert_eq!(events(&db.pool, "stale_write_refused", &ids).await, refused);
        assert_eq!(
            events(&db.pool, "taken_over", &ids).await,
            taken.len() as i64
        );
        finish_round(&db.pool, &taken).await;
    }
    assert!(
        completed > 0 && taken_over > 0,
        "both outcomes must occur: completed {completed}, taken over {taken_over}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_heartbeats_raced_with_takeovers_at_the_deadline_never_let_both_win() {
    // As above, with one heartbeat statement for the 6 claims: a renewed
    // claim is not taken over (its lease now lasts 30 s), a refused one is,
    // with the next token; the refusal is recorded.
    let db = TestDb::with_connections(8).await;
    let n = 6;
    let (mut renewed, mut taken_over) = (0, 0);
    for round in 0..30 {
        let claims = claim_round(&db.pool, round, n).await;
        let ids: Vec<i64> = claims.iter().map(|c| c.0).collect();
        let beats = claims.clone();
        let (outcomes, taken) = race_at_deadline(&db.pool, round, &claims, |mut conn| async move {
            store::heartbeat_each(&mut conn, &Default::default(), &beats, TTL)
                .await
                .unwrap()
        })
        .await;
        let taken_ids: HashMap<i64, i64> = taken.iter().copied().collect();
        for ((id, token, _), outcome) in claims.iter().zip(&outcomes) {
            match (outcome, taken_ids.get(id)) {
                (Ok(task), None) => {
                    renewed += 1;
                    assert!(task.heartbeat_in_ms.unwrap() > 20_000, "{task:?}");
                }
                (Err(TaskError::Stale { .. }), Some(new_token)) => {
                    taken_over += 1;
                    assert_eq!(*new_token, token + 1);
                }
                other => panic!("round {round}, task {id}: both or neither won: {other:?}"),
            }
        }
        let refused = outcomes.iter().filter(|o| o.is_err()).count() as i64;
        assert_eq!(events(&db.pool, "stale_write_refused", &ids).await, refused);
        // The renewed leases say so in the history, one event each.
        assert_eq!(
            events(&db.pool, "renewed", &ids).await,
            outcomes.iter().filter(|o| o.is_ok()).count() as i64
        );
        // Finish the round: the renewed claims by their holders, the rest by the takers.
        let mut conn = db.pool.acquire().await.unwrap();
        let mut each = Vec::new();
        for ((id, token, who), outcome) in claims.iter().zip(&outcomes) {
            if outcome.is_ok() {
                each.push(Completion::new(*id, *token, who.clone(), None));
            }
        }
        for outcome in store::complete_each(&mut conn, &Default::default(), &each)
            .await
            .unwrap()
        {
            outcome.unwrap();
        }
        finish_round(&db.pool, &taken).await;
    }
    assert!(
        renewed > 0 && taken_over > 0,
        "both outcomes must occur: renewed {renewed}, taken over {taken_over}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn producers_claiming_for_many_holders_at_once_never_share_a_task() {
    // 4 producers, each claiming for its 8 holders at a time and
    // completing in batches, race through 2,000 tasks: each task is
    // claimed once, completed once, by the holder its lease names, with
    // exactly one acquired and one released event.
    let db = TestDb::with_connections(12).await;
    add_tasks(&db.pool, "sleep", 2000).await;
    let mut producers = Vec::new();
    for p in 0..4 {
        let pool = db.pool.clone();
        producers.push(tokio::spawn(async move {
            let mine = holders(&format!("p{p}-"), 8);
            let mut done = Vec::new();
            let mut conn = pool.acquire().await.unwrap();
            loop {
                let claimed = store::claim_for(
                    &mut conn,
                    &Default::default(),
                    &mine,
                    TTL,
                    &ClaimFilter::default(),
                )
                .await
                .unwrap();
                if claimed.tasks.is_empty() {
                    break;
                }
                let names: HashSet<&str> = claimed
                    .tasks
                    .iter()
                    .map(|t| t.processor.as_deref().unwrap())
                    .collect();
                assert_eq!(names.len(), claimed.tasks.len(), "one task per holder");
                let each: Vec<Completion> = claimed
                    .tasks
                    .iter()
                    .map(|t| {
                        Completion::new(
                            t.id,
                            t.fencing_token.unwrap(),
                            holder(t.processor.as_deref().unwrap()),
                            Some(json!(p)),
                        )
                    })
                    .collect();
                for outcome in store::complete_each(&mut conn, &Default::default(), &each)
                    .await
                    .unwrap()
                {
                    done.push(outcome.unwrap().id);
                }
            }
            done
        }));
    }
    let mut all = Vec::new();
    for p in producers {
        all.extend(p.await.unwrap());
    }
    let distinct: HashSet<i64> = all.iter().copied().collect();
    assert_eq!((all.len(), distinct.len()), (2000, 2000));
    let per_kind: Vec<(String, i64)> =
        sqlx::query_as("SELECT kind, count(*) FROM lease_events GROUP BY kind ORDER BY kind")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        per_kind,
        vec![
            ("acquired".to_string(), 2000),
            ("released".to_string(), 2000)
        ]
    );
    let mismatched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tasks t
          WHERE t.status <> 'processed'
             OR NOT EXISTS (SELECT 1 FROM lease_events e
                             WHERE e.resource = 'task:' || t.id AND e.kind = 'released'
                               AND e.holder = t.processor AND e.fencing_token = t.fencing_token)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(mismatched, 0);
    let counted: i64 = sqlx::query_scalar("SELECT sum(processed)::int8 FROM task_counts")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        counted, 2000,
        "the statement-level counter trigger counted every completion"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batched_reports_racing_a_kill_never_revive_the_killed_worker() {
    // A reporter's batch that a worker sent before the fleet marked it
    // crashed lands after the mark: it must not bring the worker back.
    // Only a fresh run's report may. A worker of another kind's report
    // never takes the row over.
    let db = TestDb::with_connections(8).await;
    let ttl = Duration::from_secs(10);
    let report = |state, fresh| Report {
        state,
        task_id: None,
        fencing_token: None,
        heartbeat: false,
        tasks_done: 0,
        tasks_abandoned: 0,
        fresh,
    };
    for round in 0..40 {
        let who = holder(&format!("w{round}"));
        let mut conn = db.pool.acquire().await.unwrap();
        registry::record_each(
            &mut conn,
            &Default::default(),
            WorkerKind::Simulated,
            Some("i1"),
            &[(who.clone(), report(WorkerState::Idle, true))],
        )
        .await
        .unwrap();
        let barrier = Arc::new(Barrier::new(2));
        let reporting = {
            let (barrier, pool, who) = (barrier.clone(), db.pool.clone(), who.clone());
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                barrier.wait().await;
                for _ in 0..5 {
                    registry::record_each(
                        &mut conn,
                        &Default::default(),
                        WorkerKind::Simulated,
                        Some("i1"),
                        &[(who.clone(), report(WorkerState::Working, false))],
                    )
                    .await
                    .unwrap();
                }
            })
        };
        let killing = {
            let (barrier, pool, who) = (barrier.clone(), db.pool.clone(), who.clone());
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                let delay = Duration::from_micros(rand::rng().random_range(0..3000));
                barrier.wait().await;
                tokio::time::sleep(delay).await;
                registry::mark(
                    &mut conn,
                    &Default::default(),
                    who.as_str(),
                    WorkerState::Crashed,
                )
                .await
                .unwrap();
            })
        };
        reporting.await.unwrap();
        killing.await.unwrap();
        let row = registry::get(&mut conn, &Default::default(), who.as_str(), ttl)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.state, WorkerState::Crashed, "round {round}: {row:?}");
        // A report of the other kind under the same id is refused.
        let written = registry::record_each(
            &mut conn,
            &Default::default(),
            WorkerKind::Http,
            None,
            &[(who.clone(), report(WorkerState::Idle, true))],
        )
        .await
        .unwrap();
        assert_eq!(written, 0);
        // A fresh run of the same worker revives it.
        registry::record_each(
            &mut conn,
            &Default::default(),
            WorkerKind::Simulated,
            Some("i1"),
            &[(who.clone(), report(WorkerState::Idle, true))],
        )
        .await
        .unwrap();
        let row = registry::get(&mut conn, &Default::default(), who.as_str(), ttl)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (row.state, row.kind),
            (WorkerState::Idle, WorkerKind::Simulated)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_batches_its_claims_and_completions_and_loses_nothing() {
    // 600 no-op tasks through a runtime of 16: each processed exactly once,
    // with one acquired and one released event; far fewer claim and
    // completion statements than tasks (a statement's rows share its
    // transaction's now(): started_at and processed_at); and, after the
    // shutdown, the workers' rows count every completion.
    let db = TestDb::with_connections(20).await;
    add_tasks(&db.pool, "noop", 600).await;
    let runtime = Runtime::builder(db.pool.clone())
        .id("batchrt")
        .queue("default", 16)
        .handler("noop", |job: Job, _ctx: TaskContext| async move {
            Ok(Done::output(json!({ "id": job.id })))
        })
        .start()
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    loop {
        let processed: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'processed'")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        if processed == 600 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{processed} of 600 processed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    runtime.shutdown().await;
    let (claims, completions, wrong_output): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(DISTINCT started_at), count(DISTINCT processed_at),
                count(*) FILTER (WHERE task_output <> jsonb_build_object('id', id))
           FROM tasks",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(wrong_output, 0, "each task kept its own handler's output");
    assert!(
        claims < 300 && completions < 300,
        "600 tasks took {claims} claim and {completions} completion statements"
    );
    let per_task: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT kind, count(*), count(DISTINCT resource) FROM lease_events
          WHERE resource LIKE 'task:%' GROUP BY kind ORDER BY kind",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    // A claim taken ahead (prefetch, on by default) may be given back
    // unstarted and claimed again (a worker stalled on the loaded machine
    // while another was idle): one more acquired and released each, and
    // never an attempt more (below, `attempts`).
    let count = |kind: &str| {
        per_task
            .iter()
            .find(|(k, ..)| k == kind)
            .map_or((0, 0), |(_, n, resources)| (*n, *resources))
    };
    let given_back = count("given_back").0;
    assert_eq!(count("acquired"), (600 + given_back, 600), "{per_task:?}");
    assert_eq!(count("released"), (600 + given_back, 600), "{per_task:?}");
    assert_eq!(
        per_task.len(),
        2 + usize::from(given_back > 0),
        "{per_task:?}"
    );
    let attempts: Vec<i32> = sqlx::query_scalar("SELECT DISTINCT attempts FROM tasks")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(attempts, [1], "each task ran once");
    let done: i64 = sqlx::query_scalar(
        "SELECT sum(tasks_done)::int8 FROM workers WHERE instance_id = 'batchrt' AND state = 'stopped'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        done, 600,
        "every worker's last report was written and counts its completions"
    );
}

/// Scans so far, in the transaction of `conn`, of the indexes `names`.
async fn index_scans(conn: &mut sqlx::PgConnection, names: &[&str]) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(pg_stat_get_xact_numscans(c.oid)), 0)::int8
           FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
          WHERE i.indrelid IN ('tasks'::regclass, 'leases'::regclass) AND c.relname = ANY($1)",
    )
    .bind(names)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// Scans so far, in the transaction of `conn`, of the two indexes that
/// hold started tasks (`tasks_started_idx`; `tasks_status_id_idx` held
/// them too until migration `20261202000002`).
async fn started_index_reads(conn: &mut sqlx::PgConnection) -> i64 {
    index_scans(conn, &["tasks_status_id_idx", "tasks_started_idx"]).await
}

/// A batch's claim reads late claims by deadline, and its completion,
/// heartbeat and give-back find their tasks by primary key, even in the
/// generic plan PostgreSQL keeps for a prepared statement, made on
/// statistics taken while no task was started: such a plan read every
/// `started` entry of the status indexes instead, dead ones included (one
/// per task finished since the last vacuum), so each claim and completion
/// read more than the last (issue 27's benchmark: a runtime falling from
/// 14,000 to 3,600 tasks/s within one run).
#[tokio::test]
async fn batches_of_claims_find_their_tasks_by_key_in_a_generic_plan_on_stale_statistics() {
    let db = TestDb::new().await;
    let schema = Default::default();
    let w = holder("w");
    add_tasks(&db.pool, "k", 1_300).await;
    sqlx::query("ANALYZE tasks")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut session = db.pool.acquire().await.unwrap();
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *session)
        .await
        .unwrap();
    let claims = |tasks: &[Task]| -> Vec<(i64, i64, Holder)> {
        tasks
            .iter()
            .map(|t| (t.id, t.fencing_token.unwrap(), w.clone()))
            .collect()
    };
    // A thousand tasks claimed and finished: as many dead `started` entries.
    for _ in 0..10 {
        let batch = store::claim_batch(&mut session, &schema, &w, TTL, 100)
            .await
            .unwrap();
        let pairs: Vec<(i64, i64)> = claims(&batch).iter().map(|c| (c.0, c.1)).collect();
        store::complete_all_of(&mut session, &schema, &w, &pairs, None)
            .await
            .unwrap();
    }
    let mut tx = sqlx::Connection::begin(&mut *session).await.unwrap();
    // The claim's look-up of late claims reads them by deadline
    // (`tasks_started_idx`), not every started entry of the status index.
    let before = index_scans(&mut tx, &["tasks_status_id_idx"]).await;
    let claimed = store::claim_batch(&mut tx, &schema, &w, TTL, 300)
        .await
        .unwrap();
    let claim_reads = index_scans(&mut tx, &["tasks_status_id_idx"]).await - before;
    assert_eq!(claimed.len(), 300);
    let (done, beat, back) = (
        claims(&claimed[..100]),
        claims(&claimed[100..200]),
        claims(&claimed[200..]),
    );
    let mut reads = Vec::new();
    let before = started_index_reads(&mut tx).await;
    let completions: Vec<(i64, i64)> = done.iter().map(|c| (c.0, c.1)).collect();
    let completed = store::complete_all_of(&mut tx, &schema, &w, &completions, None)
        .await
        .unwrap();
    reads.push(started_index_reads(&mut tx).await - before);
    let before = started_index_reads(&mut tx).await;
    let renewed = store::heartbeat_each(&mut tx, &schema, &beat, TTL)
        .await
        .unwrap();
    reads.push(started_index_reads(&mut tx).await - before);
    let before = started_index_reads(&mut tx).await;
    let given = store::give_back_each(&mut tx, &schema, &back, "test")
        .await
        .unwrap();
    reads.push(started_index_reads(&mut tx).await - before);
    let cancelled = control::cancel(&mut tx, &schema, beat[0].0, "ops")
        .await
        .unwrap();
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    // The renewed claims are live, but the one cancelled.
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tasks WHERE status = 'started' AND must_heartbeat_before > now()",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        live, 99,
        "live claims after 100 completions, 100 renewals, 100 give-backs and a cancel of 300 claims"
    );
    assert_eq!(
        (
            completed.len(),
            renewed.iter().filter(|r| r.is_ok()).count(),
            given.iter().filter(|r| r.is_ok()).count()
        ),
        (100, 100, 100)
    );
    assert_eq!(
        (claim_reads, reads),
        (0, vec![0, 0, 0]),
        "scans of the status index by the claim; of the status indexes by the completion, heartbeat and give-back"
    );
}

//! A runtime's local queue (`Runtime::builder(..).prefetch(n)`, see
//! `worker::batch`): prefetched claims are claims like any other, each with
//! its own lease and token; they are renewed while they wait, given back
//! unstarted (no attempt used, `given_back` on record) on a graceful stop
//! and past their bound, and taken over after a kill; and the give-back
//! statement raced against takeovers at the deadline.

use crate::batch::{add_tasks, claim_round, events, finish_round, race_at_deadline};
use crate::common::{TestDb, until};
use leasekeeper_core::queue::store::{self, Completion, TaskError};
use leasekeeper_core::worker::handler::{Done, Job, TaskContext};
use leasekeeper_core::worker::runtime::Runtime;
use serde_json::json;
use sqlx::PgPool;
use std::collections::HashSet;
use std::time::Duration;

/// A handler that never finishes by itself: its worker keeps its task.
async fn block(_job: Job, _ctx: TaskContext) -> leasekeeper_core::worker::handler::HandlerResult {
    tokio::time::sleep(Duration::from_secs(3600)).await;
    Ok(Done::output(json!({})))
}

/// `(id, processor, token, attempts)` of the started tasks.
async fn started(pool: &PgPool) -> Vec<(i64, String, i64, i32)> {
    sqlx::query_as(
        "SELECT id, processor, fencing_token, attempts FROM tasks WHERE status = 'started' ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The outcomes of task `id`'s attempts, in order.
async fn outcomes(pool: &PgPool, id: i64) -> Vec<String> {
    sqlx::query_scalar("SELECT outcome FROM attempts WHERE task_id = $1 ORDER BY number")
        .bind(id)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// The tasks the runtime's workers show as running (their reports).
async fn running(pool: &PgPool) -> HashSet<i64> {
    sqlx::query_scalar::<_, Option<i64>>("SELECT task_id FROM workers WHERE state = 'working'")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .flatten()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetched_claims_have_their_own_leases_and_a_graceful_stop_gives_them_back_unused() {
    // Two workers whose handlers never finish, prefetching: more tasks are
    // started than run, each claim in a worker's name with its own live
    // lease and token. A graceful stop gives every waiting one back:
    // pending, no attempt used, `given_back` in its attempts and history.
    let db = TestDb::with_connections(10).await;
    add_tasks(&db.pool, "block", 20).await;
    let runtime = Runtime::builder(db.pool.clone())
        .id("pf")
        .queue("default", 2)
        .prefetch(4)
        .prefetch_wait(Duration::from_secs(60))
        .shutdown_grace(Duration::from_millis(100))
        .handler("block", block)
        .start()
        .await
        .unwrap();
    until(
        "the workers run a task each and some wait",
        Duration::from_secs(10),
        || async { started(&db.pool).await.len() > 2 && running(&db.pool).await.len() == 2 },
    )
    .await;
    let held = started(&db.pool).await;
    let workers: HashSet<&str> = held.iter().map(|t| t.1.as_str()).collect();
    assert!(
        workers
            .iter()
            .all(|w| *w == "pf-default-1" || *w == "pf-default-2"),
        "{held:?}"
    );
    for (id, processor, token, attempts) in &held {
        assert_eq!(*attempts, 1);
        // Each claim its own term: in the history under its own token, and
        // live by the task row (its lease).
        let term: (String, i64, bool) = sqlx::query_as(
            "SELECT e.holder, e.fencing_token, t.must_heartbeat_before > now()
               FROM lease_events e JOIN tasks t ON t.id = $1
              WHERE e.resource = 'task:' || $1 AND e.kind = 'acquired'",
        )
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(term, (processor.clone(), *token, true), "task {id}");
    }
    let runs = running(&db.pool).await;
    let waiting: Vec<i64> = held
        .iter()
        .map(|t| t.0)
        .filter(|id| !runs.contains(id))
        .collect();
    assert!(!waiting.is_empty());
    // One claim statement claimed for both workers' runs and queues.
    let statements: i64 =
        sqlx::query_scalar("SELECT count(DISTINCT started_at) FROM tasks WHERE status = 'started'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        statements < held.len() as i64,
        "{statements} statements for {} claims",
        held.len()
    );

    runtime.shutdown().await;
    for id in &waiting {
        let (status, attempts): (String, i32) =
            sqlx::query_as("SELECT status, attempts FROM tasks WHERE id = $1")
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!((status.as_str(), attempts), ("pending", 0), "task {id}");
        assert_eq!(outcomes(&db.pool, *id).await, ["given_back"], "task {id}");
        let kinds =
            leasekeeper_core::db::testing::event_kinds(&db.pool, &format!("task:{id}")).await;
        assert_eq!(kinds, ["acquired", "released", "given_back"], "task {id}");
    }
    // Nothing is left started, and nothing was taken over or refused.
    assert!(started(&db.pool).await.is_empty());
    let all: Vec<i64> = sqlx::query_scalar("SELECT id FROM tasks")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(events(&db.pool, "stale_write_refused", &all).await, 0);
    assert_eq!(events(&db.pool, "taken_over", &all).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_claims_are_renewed_in_bulk_then_given_back_past_their_bound() {
    // One busy worker, a lease of 2 s and a bound of 5 s: the claims
    // waiting in its queue outlive their first lease (renewed, same
    // token, `renewed` on record), then go back at the bound, unused,
    // while the running task stays its worker's.
    let db = TestDb::with_connections(10).await;
    add_tasks(&db.pool, "block", 10).await;
    let runtime = Runtime::builder(db.pool.clone())
        .id("pfw")
        .queue("default", 1)
        .lease(Duration::from_secs(2), Duration::from_millis(600))
        .prefetch(3)
        .prefetch_wait(Duration::from_secs(5))
        .shutdown_grace(Duration::from_millis(100))
        .handler("block", block)
        .start()
        .await
        .unwrap();
    until(
        "a task runs and some wait",
        Duration::from_secs(10),
        || async { started(&db.pool).await.len() > 1 && running(&db.pool).await.len() == 1 },
    )
    .await;
    let first = started(&db.pool).await;
    let runs = running(&db.pool).await;
    let waiting: Vec<(i64, i64)> = first
        .iter()
        .filter(|t| !runs.contains(&t.0))
        .map(|t| (t.0, t.2))
        .collect();
    let ids: Vec<i64> = waiting.iter().map(|w| w.0).collect();
    tokio::time::sleep(Duration::from_millis(3200)).await;
    // Past their first lease: still held, under the same token.
    let now: Vec<(i64, String, i64, i32)> = started(&db.pool).await;
    for (id, token) in &waiting {
        assert!(
            now.iter().any(|t| t.0 == *id && t.2 == *token),
            "task {id} lost its claim: {now:?}"
        );
    }
    assert!(events(&db.pool, "renewed", &ids).await >= ids.len() as i64);
    assert_eq!(events(&db.pool, "taken_over", &ids).await, 0);
    until(
        "the waiting claims are given back at their bound",
        Duration::from_secs(8),
        || async {
            let pending: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM tasks WHERE id = ANY($1) AND status = 'pending' AND attempts = 0",
        )
        .bind(&ids)
        .fetch_one(&db.pool)
        .await
        .unwrap();
            pending == ids.len() as i64
        },
    )
    .await;
    for id in &ids {
        assert_eq!(outcomes(&db.pool, *id).await, ["given_back"], "task {id}");
    }
    assert_eq!(events(&db.pool, "given_back", &ids).await, ids.len() as i64);
    // The running task was not touched.
    let run: Vec<i64> = runs.into_iter().collect();
    let still: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tasks WHERE id = ANY($1) AND status = 'started'")
            .bind(&run)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(still, 1);
    runtime.shutdown().await;
}

#[test]
fn a_killed_prefetching_runtime_leaves_its_claims_to_be_taken_over_and_each_done_once() {
    // A prefetching runtime on a tokio runtime of its own, killed (the
    // tokio runtime dropped: its tasks stop dead, its connections close,
    // nothing more is written) while it runs tasks and holds others in its
    // local queues. A second runtime takes every claim over when its lease
    // runs out and completes each task exactly once.
    let outer = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let db = outer.block_on(TestDb::with_connections(10));
    outer.block_on(add_tasks(&db.pool, "job", 40));
    let options = db.options.clone();
    let victim = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(6)
                .connect_with(options)
                .await
                .unwrap();
            let runtime = Runtime::builder(pool.clone())
                .id("victim")
                .queue("default", 3)
                .lease(Duration::from_secs(1), Duration::from_millis(300))
                .prefetch(4)
                .prefetch_wait(Duration::from_secs(60))
                .scheduler(None)
                .handler("job", block)
                .start()
                .await
                .unwrap();
            until(
                "the victim runs 3 and holds more",
                Duration::from_secs(10),
                || async { started(&pool).await.len() > 3 && running(&pool).await.len() == 3 },
            )
            .await;
            // Leaked: nothing of it may run on a graceful path.
            std::mem::forget(runtime);
        });
        drop(rt);
    });
    victim.join().unwrap();
    outer.block_on(async {
        let held = started(&db.pool).await;
        assert!(held.len() > 3, "{held:?}");
        let runtime = Runtime::builder(db.pool.clone())
            .id("heir")
            .queue("default", 4)
            .prefetch(4)
            .handler("job", |job: Job, _ctx: TaskContext| async move {
                Ok(Done::output(json!({ "id": job.id })))
            })
            .start()
            .await
            .unwrap();
        until("every task is processed", Duration::from_secs(30), || async {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'processed'")
                .fetch_one(&db.pool)
                .await
                .unwrap();
            n == 40
        })
        .await;
        runtime.shutdown().await;
        // Each task completed once, by the heir; each of the victim's
        // claims ended taken over (never given back: it was killed).
        let completed: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT task_id, count(*) FILTER (WHERE outcome = 'completed') FROM attempts GROUP BY task_id",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap();
        assert_eq!(completed.len(), 40);
        assert!(completed.iter().all(|c| c.1 == 1), "{completed:?}");
        for (id, ..) in &held {
            assert_eq!(outcomes(&db.pool, *id).await, ["taken_over", "completed"], "task {id}");
        }
        let ids: Vec<i64> = held.iter().map(|t| t.0).collect();
        assert_eq!(events(&db.pool, "taken_over", &ids).await, ids.len() as i64);
        let output_ok: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM tasks WHERE task_output = jsonb_build_object('id', id)",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(output_ok, 40);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_give_back_raced_with_takeovers_at_the_deadline_never_lets_both_win() {
    // Each round: 6 claims run out 0 to 12 ms from now; one give-back
    // statement for all 6 races a taker claiming whatever is late (or,
    // once given back, pending). Per task, the old claim ends either given
    // back (accepted: `given_back` attempt and event, the attempt not
    // counted) or taken over (refused and recorded), never both, never
    // neither.
    let db = TestDb::with_connections(8).await;
    let n = 6;
    let (mut given_back, mut taken_over) = (0, 0);
    for round in 0..30 {
        let claims = claim_round(&db.pool, round, n).await;
        let ids: Vec<i64> = claims.iter().map(|c| c.0).collect();
        let back = claims.clone();
        let (answers, taken) = race_at_deadline(&db.pool, round, &claims, |mut conn| async move {
            store::give_back_each(&mut conn, &Default::default(), &back, "race")
                .await
                .unwrap()
        })
        .await;
        for ((id, token, _), answer) in claims.iter().zip(&answers) {
            let ended: String = sqlx::query_scalar(
                "SELECT outcome FROM attempts WHERE task_id = $1 AND fencing_token = $2",
            )
            .bind(id)
            .bind(token)
            .fetch_one(&db.pool)
            .await
            .unwrap();
            let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM tasks WHERE id = $1")
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .unwrap();
            let retaken = taken.iter().any(|t| t.0 == *id);
            match (answer, ended.as_str()) {
                (Ok(_), "given_back") => {
                    given_back += 1;
                    // Not counted: the taker's fresh claim, if any, is attempt 1.
                    assert_eq!(attempts, i32::from(retaken), "task {id}");
                }
                (Err(TaskError::Stale { .. }), "taken_over") => {
                    taken_over += 1;
                    assert!(retaken);
                    assert_eq!(attempts, 2, "task {id}");
                }
                other => panic!("round {round}, task {id}: both or neither won: {other:?}"),
            }
        }
        let accepted = answers.iter().filter(|a| a.is_ok()).count() as i64;
        assert_eq!(events(&db.pool, "given_back", &ids).await, accepted);
        assert_eq!(
            events(&db.pool, "stale_write_refused", &ids).await,
            n as i64 - accepted
        );
        // The round's pending leftovers and the taker's claims are finished,
        // so that the next round's claims find only their own tasks.
        finish_round(&db.pool, &taken).await;
        let left: Vec<i64> =
            sqlx::query_scalar("SELECT id FROM tasks WHERE id = ANY($1) AND status = 'pending'")
                .bind(&ids)
                .fetch_all(&db.pool)
                .await
                .unwrap();
        let mut conn = db.pool.acquire().await.unwrap();
        for id in left {
            let task = store::claim_next(
                &mut conn,
                &Default::default(),
                &crate::common::holder("sweeper"),
                Duration::from_secs(30),
            )
            .await
            .unwrap()
            .unwrap();
            assert_eq!(task.id, id);
            let done = Completion::new(
                id,
                task.fencing_token.unwrap(),
                crate::common::holder("sweeper"),
                None,
            );
            store::complete_each(&mut conn, &Default::default(), &[done])
                .await
                .unwrap()[0]
                .as_ref()
                .unwrap();
        }
    }
    assert!(
        given_back > 0 && taken_over > 0,
        "both outcomes must occur: given back {given_back}, taken over {taken_over}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_queue_keeps_the_queues_order() {
    // One worker prefetching: the tasks claimed ahead in one statement run
    // in the queue's order (priority, then enqueue), not in id order.
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    // Each task more urgent than the one before: any two claimed in one
    // statement are out of id order.
    for (n, priority) in [(0, 0), (1, -1), (2, -2), (3, -3), (4, -4), (5, -5)] {
        store::enqueue(
            &mut conn,
            &Default::default(),
            &leasekeeper_core::queue::NewTask::new("note", json!({ "n": n })).priority(priority),
        )
        .await
        .unwrap();
    }
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = order.clone();
    let runtime = Runtime::builder(db.pool.clone())
        .id("pfo")
        .queue("default", 1)
        .prefetch(8)
        .handler("note", move |job: Job, _: TaskContext| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(job.data["n"].as_i64().unwrap());
                Ok(Done::output(json!({})))
            }
        })
        .start()
        .await
        .unwrap();
    until("six notes", Duration::from_secs(10), || async {
        order.lock().unwrap().len() == 6
    })
    .await;
    runtime.shutdown().await;
    assert_eq!(*order.lock().unwrap(), vec![5, 4, 3, 2, 1, 0]);
    // More than one task per claim statement: the worker did take ahead.
    let statements: i64 = sqlx::query_scalar("SELECT count(DISTINCT started_at) FROM tasks")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(statements < 6, "{statements} claim statements for 6 tasks");
}

/// Enqueues `(kind, priority)` in order; answers their ids.
async fn enqueue_kinds(pool: &PgPool, tasks: &[(&str, i16)]) -> Vec<i64> {
    let mut conn = pool.acquire().await.unwrap();
    let mut ids = Vec::new();
    for (kind, priority) in tasks {
        let t = store::enqueue(
            &mut conn,
            &Default::default(),
            &leasekeeper_core::queue::NewTask::new(*kind, json!({})).priority(*priority),
        )
        .await
        .unwrap();
        ids.push(t.id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_gets_the_claims_waiting_behind_a_slow_task_at_once() {
    // A slow task first in the queue, then quick ones: whichever worker
    // claims the slow one also claims a quick one ahead, which then waits
    // behind it. Once the other worker has run the rest and finds nothing
    // to claim, the waiting claim is given back and it runs there, long
    // before the bound (a minute here).
    let db = TestDb::new().await;
    let ids = enqueue_kinds(
        &db.pool,
        &[("slow", -1), ("quick", 0), ("quick", 0), ("quick", 0)],
    )
    .await;
    let runtime = Runtime::builder(db.pool.clone())
        .id("pfs")
        .queue("default", 2)
        .prefetch(4)
        .prefetch_wait(Duration::from_secs(60))
        .handler("slow", block)
        .handler("quick", |_: Job, _: TaskContext| async {
            Ok(Done::output(json!({})))
        })
        .start()
        .await
        .unwrap();
    let pool = db.pool.clone();
    until(
        "every quick task done while the slow one runs",
        Duration::from_secs(5),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM tasks WHERE kind = 'quick' AND status = 'processed'",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
                == 3
        },
    )
    .await;
    // At least one quick task was claimed behind the slow one, given back
    // unstarted, and run by the other worker (the slow one's stays busy).
    let mut given_back = 0;
    for id in &ids[1..] {
        let o = outcomes(&db.pool, *id).await;
        if o.first().map(String::as_str) == Some("given_back") {
            given_back += 1;
            assert_eq!(o, ["given_back", "completed"], "task {id}");
        }
    }
    assert!(given_back >= 1, "no quick task waited behind the slow one");
    let slow_holder: String = sqlx::query_scalar("SELECT processor FROM tasks WHERE id = $1")
        .bind(ids[0])
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let quick_holders: HashSet<String> = sqlx::query_scalar(
        "SELECT DISTINCT a.processor FROM attempts a JOIN tasks t ON t.id = a.task_id
          WHERE t.kind = 'quick' AND a.outcome = 'completed'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert!(!quick_holders.contains(&slow_holder), "{quick_holders:?}");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_tasks_take_long_claims_no_further_ahead_than_it_can_run() {
    // Tasks of 700 ms and a bound of 1 s: a second task claimed ahead
    // would wait 1.4 s and be given back. Once the worker has run one, the
    // local queue's depth is capped by what it can start within half the
    // bound (none here): nothing is given back, every task runs once.
    let db = TestDb::new().await;
    let ids = enqueue_kinds(&db.pool, &[("steady", 0); 5]).await;
    let runtime = Runtime::builder(db.pool.clone())
        .id("pfc")
        .queue("default", 1)
        .prefetch(8)
        .handler("steady", |_: Job, _: TaskContext| async {
            tokio::time::sleep(Duration::from_millis(700)).await;
            Ok(Done::output(json!({})))
        })
        .start()
        .await
        .unwrap();
    let pool = db.pool.clone();
    until("five tasks done", Duration::from_secs(15), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM tasks WHERE status = 'processed'")
            .fetch_one(&pool)
            .await
            .unwrap()
            == 5
    })
    .await;
    runtime.shutdown().await;
    for id in ids {
        assert_eq!(outcomes(&db.pool, id).await, ["completed"], "task {id}");
    }
}

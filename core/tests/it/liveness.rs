//! Liveness sessions against a real database: a crashed holder's claims
//! and singleton leases are taken over within a second at the default TTL;
//! a live session is never judged dead; sessions of another server
//! incarnation are left to the TTL; a session cut while its process lives
//! is noticed, registered again, and its old claims ended; and registering
//! again races a reaper for real without ending a claim of the new session.

use crate::common::{TestDb, event_kinds, holder, resource, until};
use leasekeeper_core::db::Schema;
use leasekeeper_core::lease::store as leases;
use leasekeeper_core::liveness::{Liveness, LivenessSignal, store as liveness};
use leasekeeper_core::queue::NewTask;
use leasekeeper_core::queue::store::{self, TaskError};
use serde_json::json;
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;

/// The runtime's default lease TTL: nothing here waits it out.
const TTL: Duration = Duration::from_secs(15);

async fn enqueue(pool: &PgPool) -> i64 {
    store::enqueue(
        &mut pool.acquire().await.unwrap(),
        &Schema::default(),
        &NewTask::new("k", json!({})),
    )
    .await
    .unwrap()
    .id
}

/// Claims the next task as `name`; answers its id and token.
async fn claim(pool: &PgPool, name: &str) -> Option<(i64, i64)> {
    store::claim_next(
        &mut pool.acquire().await.unwrap(),
        &Schema::default(),
        &holder(name),
        TTL,
    )
    .await
    .unwrap()
    .map(|t| (t.id, t.fencing_token.unwrap()))
}

async fn start(pool: &PgPool, id: &str, holders: &[&str]) -> Liveness {
    Liveness::start(
        (*pool.connect_options()).clone(),
        Schema::default(),
        Arc::from(id),
        holders.iter().map(|h| h.to_string()).collect(),
    )
    .await
    .unwrap()
}

async fn registered_pid(pool: &PgPool, id: &str) -> Option<i32> {
    sqlx::query_scalar("SELECT pid FROM liveness WHERE instance_id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// No registration is found dead, and even asked to judge instance `a`,
/// the reaper ends nothing.
async fn nothing_judged_dead(conn: &mut PgConnection) {
    let suspects = liveness::suspects(conn, &Schema::default()).await.unwrap();
    assert!(suspects.is_empty(), "{suspects:?}");
    let done = liveness::end_dead(conn, &Schema::default(), &["a".to_string()])
        .await
        .unwrap();
    assert!(!done.any(), "{done:?}");
}

/// Singleton `name`, its lease held by `a` for the whole TTL.
async fn held_by_a(pool: &PgPool, name: &str) -> leasekeeper_core::lease::Resource {
    let singleton = resource(name);
    leases::acquire(
        &mut pool.acquire().await.unwrap(),
        &Schema::default(),
        &singleton,
        &holder("a"),
        TTL,
    )
    .await
    .unwrap();
    singleton
}

/// Whether task `id`'s claim is past its deadline (ended).
async fn ended(pool: &PgPool, id: i64) -> bool {
    sqlx::query_scalar("SELECT must_heartbeat_before <= now() FROM tasks WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_crashed_holder_s_claims_and_singleton_are_taken_over_within_a_second() {
    let db = TestDb::new().await;
    let pool = db.pool(8).await;
    let a = start(&pool, "a", &["a-w1", "a-w2"]).await;
    let first = enqueue(&pool).await;
    let second = enqueue(&pool).await;
    let (t1, token1) = claim(&pool, "a-w1").await.unwrap();
    let (t2, _) = claim(&pool, "a-w2").await.unwrap();
    assert_eq!((t1, t2), (first, second));
    // The instance itself holds a singleton lease, for the whole TTL.
    let singleton = held_by_a(&pool, "singleton:generator").await;
    // Another process, idle, whose own liveness loop is the reaper.
    let b = start(&pool, "b", &["b-w1"]).await;
    assert_eq!(claim(&pool, "b-w1").await, None, "nothing is free yet");

    // The crash: the connection closes without a goodbye.
    let killed = Instant::now();
    a.abort();
    let mut rescued = Vec::new();
    while rescued.len() < 2 {
        assert!(
            killed.elapsed() < Duration::from_secs(1),
            "not rescued within a second: {rescued:?}"
        );
        if let Some(got) = claim(&pool, "b-w1").await {
            rescued.push(got);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rescued.sort();
    assert_eq!(
        rescued.iter().map(|r| r.0).collect::<Vec<_>>(),
        [first, second]
    );
    assert!(
        rescued.iter().all(|r| r.1 == 2),
        "a new term each: {rescued:?}"
    );
    let singleton_moved = leases::acquire(
        &mut pool.acquire().await.unwrap(),
        &Schema::default(),
        &singleton,
        &holder("b"),
        TTL,
    )
    .await;
    assert!(
        matches!(singleton_moved, Ok(leases::Acquired::New(ref l)) if l.fencing_token == 2),
        "the singleton moved too: {singleton_moved:?}"
    );
    // The history says how each term ended: by the session, then taken over.
    assert_eq!(
        event_kinds(&pool, "singleton:generator").await,
        ["acquired", "session_ended", "taken_over"]
    );
    assert_eq!(
        event_kinds(&pool, &format!("task:{first}")).await,
        ["acquired", "session_ended", "taken_over"]
    );
    // Had the holder lived after all, its write is refused by the fence.
    let late = store::complete(
        &mut pool.acquire().await.unwrap(),
        &Schema::default(),
        t1,
        &holder("a-w1"),
        token1,
        None,
    )
    .await;
    assert!(matches!(late, Err(TaskError::Stale { .. })), "{late:?}");
    assert_eq!(
        registered_pid(&pool, "a").await,
        None,
        "the dead registration is gone"
    );
    b.shutdown().await;
    assert_eq!(
        registered_pid(&pool, "b").await,
        None,
        "a clean shutdown deregisters"
    );
}

#[tokio::test]
async fn a_live_session_is_never_judged_dead() {
    let db = TestDb::new().await;
    let pool = db.pool(8).await;
    let a = start(&pool, "a", &["a-w1"]).await;
    let task = enqueue(&pool).await;
    assert_eq!(claim(&pool, "a-w1").await.map(|c| c.0), Some(task));
    let mut conn = pool.acquire().await.unwrap();
    for _ in 0..20 {
        nothing_judged_dead(&mut conn).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!ended(&pool, task).await);
    assert_eq!(claim(&pool, "b-w1").await, None);
    a.shutdown().await;
}

#[tokio::test]
async fn a_session_of_another_server_incarnation_is_left_to_the_ttl() {
    let db = TestDb::new().await;
    let pool = db.pool(8).await;
    let a = start(&pool, "a", &["a-w1"]).await;
    let task = enqueue(&pool).await;
    claim(&pool, "a-w1").await.unwrap();
    // As after a restart or failover: the row was registered with another
    // server, whose sessions all ended with it.
    sqlx::query("UPDATE liveness SET server_started_at = server_started_at - interval '1 hour'")
        .execute(&pool)
        .await
        .unwrap();
    a.abort();
    let mut conn = pool.acquire().await.unwrap();
    until("the session to end", Duration::from_secs(5), || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity a JOIN liveness l ON l.pid = a.pid)",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    })
    .await;
    nothing_judged_dead(&mut conn).await;
    assert!(!ended(&pool, task).await, "the TTL rules");
    assert_eq!(claim(&pool, "b-w1").await, None);
}

#[tokio::test]
async fn a_session_cut_while_its_process_lives_is_noticed_registered_again_and_its_claims_ended() {
    let db = TestDb::new().await;
    let pool = db.pool(8).await;
    let a = start(&pool, "a", &["a-w1"]).await;
    let mut signal = a.signal();
    assert_eq!(signal.session(), Some(1));
    let task = enqueue(&pool).await;
    claim(&pool, "a-w1").await.unwrap();
    let pid = registered_pid(&pool, "a").await.unwrap();
    let cut = Instant::now();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&pool)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(1), signal.ended(1))
        .await
        .expect("the loss noticed within a second");
    let again = tokio::time::timeout(Duration::from_secs(3), signal.up())
        .await
        .expect("registered again");
    assert_eq!(again, 2);
    assert_ne!(registered_pid(&pool, "a").await, Some(pid));
    // The claim of the lost session is ended (by the registration itself,
    // or by the reaper before it), and taken over.
    until(
        "the old claim taken over",
        Duration::from_secs(1),
        || async { claim(&pool, "b-w1").await.is_some() },
    )
    .await;
    assert!(
        cut.elapsed() < Duration::from_secs(2),
        "{:?}",
        cut.elapsed()
    );
    let (processor, token): (String, i64) =
        sqlx::query_as("SELECT processor, fencing_token FROM tasks WHERE id = $1")
            .bind(task)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (processor.as_str(), token),
        ("b-w1", 2),
        "the old claim, taken over"
    );
    // Still serving: a new claim under the new session stands.
    let next = enqueue(&pool).await;
    assert_eq!(claim(&pool, "a-w1").await.map(|c| c.0), Some(next));
    tokio::time::sleep(3 * leasekeeper_core::liveness::CHECK_EVERY).await;
    assert!(!ended(&pool, next).await);
    a.shutdown().await;
}

#[tokio::test]
async fn without_liveness_a_signal_is_always_up() {
    let mut none = LivenessSignal::none();
    assert_eq!(none.session(), Some(0));
    assert_eq!(none.up().await, 0);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), none.ended(0))
            .await
            .is_err()
    );
}

/// One connection of its own (not pooled), like a liveness session.
async fn session(pool: &PgPool) -> PgConnection {
    (*pool.connect_options()).clone().connect().await.unwrap()
}

#[tokio::test]
async fn registering_again_races_the_reaper_and_never_ends_a_claim_of_the_new_session() {
    let db = TestDb::new().await;
    let pool = db.pool(8).await;
    let schema = Schema::default();
    let id = "a".to_string();
    let holders = vec!["a-w1".to_string(), "a-w2".to_string()];
    for round in 0..30 {
        // The old session registers and claims, then dies.
        let mut old = session(&pool).await;
        liveness::register(&mut old, &schema, &id, &holders)
            .await
            .unwrap();
        let old_task = enqueue(&pool).await;
        assert_eq!(claim(&pool, "a-w1").await.map(|c| c.0), Some(old_task));
        old.close_hard().await.unwrap();
        until("the old session to end", Duration::from_secs(5), || async {
            let mut conn = pool.acquire().await.unwrap();
            !liveness::suspects(&mut conn, &schema)
                .await
                .unwrap()
                .is_empty()
        })
        .await;
        let new_task = enqueue(&pool).await;

        // The process registers again and claims under the new session,
        // while another process's reaper judges the old registration.
        let barrier = Arc::new(Barrier::new(2));
        let mut new = session(&pool).await;
        let mut reaper = session(&pool).await;
        let (registering, reaping) = tokio::join!(
            {
                let barrier = barrier.clone();
                let (schema, id, holders, pool) = (&schema, &id, &holders, &pool);
                async move {
                    barrier.wait().await;
                    liveness::register(&mut new, schema, id, holders)
                        .await
                        .unwrap();
                    let claimed = claim(pool, "a-w2").await;
                    (new, claimed)
                }
            },
            {
                let barrier = barrier.clone();
                let (schema, id) = (&schema, &id);
                async move {
                    barrier.wait().await;
                    liveness::end_dead(&mut reaper, schema, std::slice::from_ref(id))
                        .await
                        .unwrap()
                }
            }
        );
        let (mut new, claimed) = registering;
        // The new session's claim: the old task (ended, so late, so first
        // in the claim's order) or the new one.
        let (claimed, token) = claimed.unwrap_or_else(|| panic!("round {round}: {reaping:?}"));
        assert!(claimed == old_task || claimed == new_task);
        // A later pass of any reaper finds the new session alive.
        let mut conn = pool.acquire().await.unwrap();
        liveness::end_dead(&mut conn, &schema, std::slice::from_ref(&id))
            .await
            .unwrap();
        let claim_of = |task: i64| {
            let pool = pool.clone();
            async move {
                sqlx::query_as::<_, (String, i64, bool)>(
                    "SELECT processor, fencing_token, must_heartbeat_before > now()
                       FROM tasks WHERE id = $1",
                )
                .bind(task)
                .fetch_one(&pool)
                .await
                .unwrap()
            }
        };
        assert_eq!(
            claim_of(claimed).await,
            ("a-w2".to_string(), token, true),
            "round {round}: the new session's claim stands ({reaping:?})"
        );
        if claimed != old_task {
            assert_eq!(
                claim_of(old_task).await,
                ("a-w1".to_string(), 1, false),
                "round {round}: the old session's claim is ended ({reaping:?})"
            );
        }
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut new)
            .await
            .unwrap();
        assert_eq!(registered_pid(&pool, &id).await, Some(pid), "round {round}");
        sqlx::query("DELETE FROM tasks")
            .execute(&pool)
            .await
            .unwrap();
        new.close().await.unwrap();
    }
}

/// The next thing a handler said, within 5 s.
async fn next(seen: &mut tokio::sync::mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(Duration::from_secs(5), seen.recv())
        .await
        .expect("the handler said nothing in time")
        .unwrap()
}

/// What the runtime's handler went through.
#[derive(Debug, PartialEq)]
enum Seen {
    Started(i64, i64),
    Cancelled(i64, i64),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_whose_session_is_cut_gives_its_claims_up_and_goes_on_serving() {
    use leasekeeper_core::{Done, Job, Runtime, TaskContext};
    let db = TestDb::new().await;
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let runtime = Runtime::builder(db.pool.clone())
        .id("rt-a")
        .queue("default", 2)
        // Each long task on a worker of its own: with claims ahead, one
        // worker could take both, and the second, waiting in its local
        // queue, would be given back and claimed again (token 2) before
        // the cut (seen once in CI).
        .prefetch(0)
        .scheduler(None)
        .handler("long", move |job: Job, ctx: TaskContext| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(Seen::Started(job.id, job.fencing_token));
                if job.fencing_token > 1 {
                    // The rescue's run: done at once.
                    return Ok(Done::empty());
                }
                ctx.cancelled().await;
                let _ = tx.send(Seen::Cancelled(job.id, job.fencing_token));
                Err::<Done, _>("cancelled".into())
            }
        })
        .handler("quick", |_job: Job, _ctx: TaskContext| async {
            Ok(Done::empty())
        })
        .start()
        .await
        .unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    let mut long = Vec::new();
    for _ in 0..2 {
        let task = store::enqueue(
            &mut conn,
            &Schema::default(),
            &NewTask::new("long", json!({})),
        )
        .await
        .unwrap();
        long.push(task.id);
    }
    let mut started = vec![next(&mut seen).await, next(&mut seen).await];
    started.sort_by_key(|s| format!("{s:?}"));
    assert!(
        started.iter().all(|s| matches!(s, Seen::Started(_, 1))),
        "{started:?}"
    );

    let pid = registered_pid(&db.pool, "rt-a").await.unwrap();
    let cut = Instant::now();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&db.pool)
        .await
        .unwrap();
    // Both handlers told at once.
    let mut cancelled = Vec::new();
    while cancelled.len() < 2 {
        match next(&mut seen).await {
            Seen::Cancelled(id, 1) => cancelled.push(id),
            Seen::Started(..) => {}
            other => panic!("{other:?}"),
        }
    }
    assert!(
        cut.elapsed() < Duration::from_secs(1),
        "cancelled after {:?}",
        cut.elapsed()
    );
    // Taken over within 2 s of the cut (here by the runtime itself, once
    // registered again), and processed once, by the new term.
    until(
        "both taken over and processed",
        Duration::from_secs(2),
        || async {
            let tokens: Vec<i64> = sqlx::query_scalar(
                "SELECT fencing_token FROM tasks WHERE id = ANY($1) AND status = 'processed'",
            )
            .bind(&long)
            .fetch_all(&db.pool)
            .await
            .unwrap();
            tokens.len() == 2 && tokens.iter().all(|&t| t >= 2)
        },
    )
    .await;
    // Alive and working: a new task is processed, once.
    let quick = store::enqueue(
        &mut conn,
        &Schema::default(),
        &NewTask::new("quick", json!({})),
    )
    .await
    .unwrap()
    .id;
    until(
        "the quick task processed",
        Duration::from_secs(10),
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT status = 'processed' AND attempts = 1 FROM tasks WHERE id = $1",
            )
            .bind(quick)
            .fetch_one(&db.pool)
            .await
            .unwrap()
        },
    )
    .await;
    assert_ne!(registered_pid(&db.pool, "rt-a").await, Some(pid));
    runtime.shutdown().await;
    assert_eq!(registered_pid(&db.pool, "rt-a").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_singleton_whose_session_is_cut_ends_its_term_at_once() {
    use leasekeeper_core::lease::client::LeaseTiming;
    use leasekeeper_core::lease::singleton::{Singleton, State, TermWork};
    let db = TestDb::new().await;
    let pool = db.pool(8).await;
    let s = start(&pool, "s", &[]).await;
    let work: TermWork = Arc::new(|term| Box::pin(async move { term.stop().cancelled().await }));
    let job = Singleton::spawn_job(
        pool.clone(),
        "singleton:liveness-test",
        holder("s"),
        LeaseTiming::from_ttl(TTL),
        Duration::from_millis(100),
        work,
    );
    job.start();
    until("the term to begin", Duration::from_secs(5), || async {
        job.state() == State::Working
    })
    .await;
    assert_eq!(job.token(), Some(1));
    let pid = registered_pid(&pool, "s").await.unwrap();
    let cut = Instant::now();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&pool)
        .await
        .unwrap();
    // Its work told to stop within a second (the renewals, 5 s apart,
    // would not have told it yet)...
    until("the term to end", Duration::from_secs(1), || async {
        job.token() != Some(1)
    })
    .await;
    // ...and a new term, here its own once registered again, with the
    // next token: the old lease was ended, not waited out.
    until("a new term", Duration::from_secs(2), || async {
        job.token().is_some_and(|t| t >= 2)
    })
    .await;
    assert!(cut.elapsed() < Duration::from_secs(3));
    job.shutdown().await;
    s.shutdown().await;
}

/// The holders the registration of `id` vouches for.
async fn holders_of(pool: &PgPool, id: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT holders FROM liveness WHERE instance_id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .unwrap()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_disowned_worker_s_claims_end_at_once_and_a_goodbye_ends_nothing() {
    let db = TestDb::new().await;
    let pool = db.pool(8).await;
    let a = start(&pool, "a", &[]).await;
    let voucher = a.voucher();
    assert!(voucher.vouch("a-w1", TTL).await);
    assert!(voucher.vouch("a-w2", TTL).await);
    let dead = enqueue(&pool).await;
    let done = enqueue(&pool).await;
    assert_eq!(claim(&pool, "a-w1").await.map(|c| c.0), Some(dead));
    assert_eq!(claim(&pool, "a-w2").await.map(|c| c.0), Some(done));

    // a-w1 is killed: its claim ends now, not in 15 s.
    let killed = Instant::now();
    assert!(voucher.disown("a-w1", true, TTL).await);
    assert!(ended(&pool, dead).await);
    assert!(
        killed.elapsed() < Duration::from_millis(500),
        "{:?}",
        killed.elapsed()
    );
    assert_eq!(
        claim(&pool, "b-w1").await,
        Some((dead, 2)),
        "taken over with a new token"
    );
    assert_eq!(
        event_kinds(&pool, &format!("task:{dead}")).await,
        ["acquired", "session_ended", "taken_over"]
    );
    assert_eq!(holders_of(&pool, "a").await, ["a", "a-w2"]);

    // a-w2 says goodbye: nothing of it is ended (its claim, here still
    // live, stays its own until its TTL).
    assert!(voucher.disown("a-w2", false, TTL).await);
    assert!(!ended(&pool, done).await);
    assert_eq!(holders_of(&pool, "a").await, ["a"]);
    a.shutdown().await;
}

#[tokio::test]
async fn adopting_a_worker_ends_its_earlier_term_and_its_old_voucher_ends_nothing_after() {
    let db = TestDb::new().await;
    let pool = db.pool(8).await;
    let a = start(&pool, "a", &[]).await;
    let b = start(&pool, "b", &[]).await;
    // Worker process p streams to instance a and claims.
    assert!(a.voucher().adopt("p", TTL).await);
    let old = enqueue(&pool).await;
    assert_eq!(claim(&pool, "p").await, Some((old, 1)));
    // Its stream breaks; it gives its claim up and streams to b, which
    // adopts it as a new term: the old claim ends at once.
    assert!(b.voucher().adopt("p", TTL).await);
    assert!(ended(&pool, old).await);
    assert_eq!(holders_of(&pool, "a").await, ["a"]);
    assert_eq!(holders_of(&pool, "b").await, ["b", "p"]);
    // p claims under its new term (the old task, late, comes first).
    assert_eq!(claim(&pool, "p").await, Some((old, 2)));
    // a notices the old stream's close only now: it ends nothing of the
    // new term.
    assert!(a.voucher().disown("p", true, TTL).await);
    assert!(!ended(&pool, old).await, "the new term's claim was ended");
    assert_eq!(holders_of(&pool, "b").await, ["b", "p"]);
    // And b's own disown (p died) ends it.
    assert!(b.voucher().disown("p", true, TTL).await);
    assert!(ended(&pool, old).await);
    a.shutdown().await;
    b.shutdown().await;
}

/// The race of [`liveness::disown`] against [`liveness::adopt`], for real:
/// worker p's old instance notices its stream closed at the moment its new
/// instance adopts it and p claims again. Over 30 rounds behind a barrier,
/// the new term's claim is never ended and the old one always is.
#[tokio::test]
async fn disowning_races_adopting_and_never_ends_a_claim_of_the_new_term() {
    let db = TestDb::new().await;
    let pool = db.pool(8).await;
    let schema = Schema::default();
    let mut a = session(&pool).await;
    liveness::register(&mut a, &schema, "a", &[]).await.unwrap();
    let mut b = session(&pool).await;
    liveness::register(&mut b, &schema, "b", &[]).await.unwrap();
    for round in 0..30 {
        // p streams to a (every other round to b first: both orders of
        // the rows' ids) and claims.
        let (old_voucher, new_voucher) = if round % 2 == 0 {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        let (old_id, new_id) = if round % 2 == 0 {
            ("a", "b")
        } else {
            ("b", "a")
        };
        assert!(
            liveness::adopt(old_voucher, &schema, old_id, "p")
                .await
                .unwrap()
                .registered
        );
        let old_task = enqueue(&pool).await;
        let (claimed, _) = claim(&pool, "p").await.unwrap();
        assert_eq!(claimed, old_task, "round {round}");
        let new_task = enqueue(&pool).await;

        let barrier = Arc::new(Barrier::new(2));
        let (disowned, new_claim) = tokio::join!(
            {
                let barrier = barrier.clone();
                let schema = &schema;
                async move {
                    barrier.wait().await;
                    liveness::disown(old_voucher, schema, old_id, "p", true)
                        .await
                        .unwrap()
                }
            },
            {
                let barrier = barrier.clone();
                let (schema, pool) = (&schema, &pool);
                async move {
                    barrier.wait().await;
                    liveness::adopt(&mut *new_voucher, schema, new_id, "p")
                        .await
                        .unwrap();
                    // Claims under the new term as soon as adopted: the
                    // old task (ended, so late, so first) or the new one.
                    (claim(pool, "p").await.unwrap(), new_voucher)
                }
            }
        );
        assert!(disowned.registered);
        let ((got, token), new_voucher) = new_claim;
        assert!(got == old_task || got == new_task, "round {round}");
        assert!(
            !ended(&pool, got).await,
            "round {round}: the new term's claim of {got} (token {token}) was ended: {disowned:?}"
        );
        // Whichever came first, p is vouched for by the new instance only.
        assert!(!holders_of(&pool, old_id).await.contains(&"p".to_string()));
        assert!(holders_of(&pool, new_id).await.contains(&"p".to_string()));
        // Finish the round: p's claims done, nothing left to claim.
        sqlx::query("DELETE FROM tasks")
            .execute(&pool)
            .await
            .unwrap();
        liveness::disown(new_voucher, &schema, new_id, "p", false)
            .await
            .unwrap();
    }
}

/// A singleton waiting out a long retry pause behind a holder that
/// crashes tries again the moment its own process's liveness check ended
/// the dead holder's lease: it moves within a second, not a retry pause
/// later. Without that wake-up, this test waits the whole minute.
#[tokio::test]
async fn a_waiting_singleton_moves_within_a_second_of_its_holder_s_crash() {
    use leasekeeper_core::lease::client::{LeaseClient, LeaseTiming};
    use leasekeeper_core::lease::singleton::{Singleton, State, Work};
    let db = TestDb::new().await;
    let pool = db.pool(8).await;
    let a = start(&pool, "a", &[]).await;
    let singleton = held_by_a(&pool, "singleton:nightly").await;
    let b = start(&pool, "b", &[]).await;
    let (started, mut terms) = tokio::sync::mpsc::unbounded_channel();
    let work: Work = Arc::new(move |token, stop| {
        let started = started.clone();
        Box::pin(async move {
            let _ = started.send(token);
            stop.cancelled().await;
        })
    });
    let client = LeaseClient::new(
        pool.clone(),
        singleton.clone(),
        holder("b"),
        LeaseTiming::from_ttl(TTL),
    );
    // A retry pause far beyond the test's patience.
    let waiting = Singleton::spawn(client, Duration::from_secs(60), work);
    waiting.start();
    tokio::time::timeout(
        Duration::from_secs(10),
        waiting.watch_state().wait_for(|s| *s == State::Waiting),
    )
    .await
    .unwrap()
    .unwrap();

    let killed = Instant::now();
    a.abort();
    let token = tokio::time::timeout(Duration::from_secs(5), terms.recv())
        .await
        .expect("the waiting singleton took the lease over")
        .unwrap();
    assert_eq!(token, 2);
    assert!(
        killed.elapsed() < Duration::from_secs(1),
        "moved after {:?}",
        killed.elapsed()
    );
    waiting.shutdown().await;
    b.shutdown().await;
}

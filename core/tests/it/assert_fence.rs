//! `assert_fence(resource, token)`, the fencing token for a host's own
//! writes: it passes only for the live term, raises SQLSTATE LK001
//! otherwise (released, expired, taken over, never issued), works from a
//! host's plain connection and from a host's own trigger, and holds the
//! term open under the caller's transaction: a takeover waits for the
//! fenced transaction to commit, and once it has taken over, no write of
//! the old term passes, raced for real.

use crate::common::{TestDb, holder, resource};
use leasekeeper_core::db::Schema;
use leasekeeper_core::lease::fence::{self, FenceError, STALE_FENCE_SQLSTATE};
use leasekeeper_core::lease::store::{self, Acquired, LeaseError};
use leasekeeper_core::lease::{Holder, Resource};
use sqlx::{Connection, PgConnection, PgPool};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

async fn acquire(pool: &PgPool, res: &Resource, who: &Holder, ttl: Duration) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    match store::acquire(&mut conn, &Schema::default(), res, who, ttl)
        .await
        .unwrap()
    {
        Acquired::New(lease) => lease.fencing_token,
        other => panic!("expected a new term, got {other:?}"),
    }
}

async fn check(conn: &mut PgConnection, res: &str, token: i64) -> Result<(), FenceError> {
    fence::assert_fence(conn, &Schema::default(), res, token).await
}

fn is_stale(r: Result<(), FenceError>) -> bool {
    matches!(r, Err(FenceError::Stale(_)))
}

#[tokio::test]
async fn only_the_live_term_passes() {
    let db = TestDb::new().await;
    let res = resource("singleton:fenced");
    let token = acquire(&db.pool, &res, &holder("a"), Duration::from_secs(30)).await;
    let mut conn = db.pool.acquire().await.unwrap();

    check(&mut conn, res.as_str(), token).await.unwrap();
    // A token of no term, above or below.
    assert!(is_stale(check(&mut conn, res.as_str(), token + 1).await));
    assert!(is_stale(check(&mut conn, res.as_str(), token - 1).await));
    // A resource never leased.
    assert!(is_stale(check(&mut conn, "singleton:never", 1).await));

    // Released: the term is over.
    store::release(
        &mut conn,
        &Schema::default(),
        &res,
        &holder("a"),
        Some(token),
    )
    .await
    .unwrap();
    let refused = check(&mut conn, res.as_str(), token).await;
    let Err(FenceError::Stale(message)) = refused else {
        panic!("a released term passed: {refused:?}");
    };
    assert!(
        message.contains(&format!("stale fencing token {token} for singleton:fenced")),
        "{message}"
    );

    // Expired, by the database clock.
    let res2 = resource("singleton:short");
    let t2 = acquire(&db.pool, &res2, &holder("a"), Duration::from_millis(300)).await;
    check(&mut conn, res2.as_str(), t2).await.unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(is_stale(check(&mut conn, res2.as_str(), t2).await));

    // Taken over: the old token is stale, the new one passes, and the
    // message names the live term.
    let t3 = acquire(&db.pool, &res2, &holder("b"), Duration::from_secs(30)).await;
    assert_eq!(t3, t2 + 1);
    let Err(FenceError::Stale(message)) = check(&mut conn, res2.as_str(), t2).await else {
        panic!("a taken-over term passed");
    };
    assert!(
        message.contains(&format!("the live term is token {t3}, held by b")),
        "{message}"
    );
    check(&mut conn, res2.as_str(), t3).await.unwrap();
}

#[tokio::test]
async fn a_hosts_plain_connection_and_trigger_get_lk001() {
    let db = TestDb::new().await;
    // A task's claim: its term is the task row (no lease row).
    let (res, token) = {
        use leasekeeper_core::queue::{NewTask, Task, store as tasks};
        let mut conn = db.pool.acquire().await.unwrap();
        let schema = Schema::default();
        tasks::enqueue(
            &mut conn,
            &schema,
            &NewTask::new("t", serde_json::json!({})),
        )
        .await
        .unwrap();
        let claimed = tasks::claim_next(&mut conn, &schema, &holder("w"), Duration::from_secs(30))
            .await
            .unwrap()
            .expect("claimed");
        (
            Task::resource_name(claimed.id),
            claimed.fencing_token.unwrap(),
        )
    };
    // The host's own connection: search_path is its own, the function is
    // named with leasekeeper's schema.
    let mut host = PgConnection::connect_with(&db.plain).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE public.shipments (order_id bigint PRIMARY KEY, resource text NOT NULL, token bigint NOT NULL);
         CREATE FUNCTION public.shipments_fenced() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM leasekeeper.assert_fence(NEW.resource, NEW.token);
             RETURN NEW;
         END $$;
         CREATE TRIGGER shipments_fenced BEFORE INSERT OR UPDATE ON public.shipments
             FOR EACH ROW EXECUTE FUNCTION public.shipments_fenced();",
    )
    .execute(&mut host)
    .await
    .unwrap();

    sqlx::query("SELECT leasekeeper.assert_fence($1, $2)")
        .bind(&res)
        .bind(token)
        .execute(&mut host)
        .await
        .unwrap();
    sqlx::query("INSERT INTO public.shipments VALUES (1, $2, $1)")
        .bind(token)
        .bind(&res)
        .execute(&mut host)
        .await
        .unwrap();

    let stale = sqlx::query("INSERT INTO public.shipments VALUES (2, $2, $1)")
        .bind(token + 1)
        .bind(&res)
        .execute(&mut host)
        .await
        .unwrap_err();
    assert!(fence::is_stale_fence(&stale), "{stale}");
    let sqlx::Error::Database(e) = &stale else {
        panic!("{stale}")
    };
    assert_eq!(e.code().as_deref(), Some(STALE_FENCE_SQLSTATE));
    // NULLs are refused too, with the same code, not passed.
    let null = sqlx::query("SELECT leasekeeper.assert_fence(NULL, NULL)")
        .execute(&mut host)
        .await
        .unwrap_err();
    assert!(fence::is_stale_fence(&null), "{null}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM public.shipments")
        .fetch_one(&mut host)
        .await
        .unwrap();
    assert_eq!(rows, 1, "the stale insert wrote nothing");
}

/// Race: the fenced transaction holds the term open. The old holder checks
/// its fence, then stalls past its TTL inside the transaction; a takeover
/// attempted meanwhile waits for that transaction, and begins only after
/// it committed, so the old term's write is never inside the new term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_waits_for_the_fenced_transaction() {
    let db = TestDb::new().await;
    let res = resource("singleton:held-open");
    let ttl = Duration::from_millis(400);
    let token = acquire(&db.pool, &res, &holder("old"), ttl).await;

    let mut conn = db.pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    check(&mut tx, res.as_str(), token).await.unwrap();

    let committed = Arc::new(AtomicBool::new(false));
    let taker = {
        let (pool, res, committed) = (db.pool.clone(), res.clone(), committed.clone());
        tokio::spawn(async move {
            // Past the old term's expiry: the takeover is allowed by time,
            // but must wait for the lock.
            tokio::time::sleep(ttl + Duration::from_millis(150)).await;
            let mut conn = pool.acquire().await.unwrap();
            loop {
                match store::acquire(
                    &mut conn,
                    &Schema::default(),
                    &res,
                    &holder("new"),
                    ttl * 10,
                )
                .await
                {
                    Ok(Acquired::New(lease)) => {
                        return (lease.fencing_token, committed.load(Ordering::SeqCst));
                    }
                    Err(LeaseError::Held { .. }) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    other => panic!("takeover: {other:?}"),
                }
            }
        })
    };
    // Stall well past the TTL with the fence held, then write and commit.
    tokio::time::sleep(ttl * 3).await;
    assert!(
        !taker.is_finished(),
        "the takeover did not wait for the fenced transaction"
    );
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    committed.store(true, Ordering::SeqCst);
    tx.commit().await.unwrap();
    let (new_token, after_commit) = tokio::time::timeout(Duration::from_secs(5), taker)
        .await
        .expect("the takeover proceeds once the fenced transaction commits")
        .unwrap();
    assert!(
        after_commit,
        "the new term began before the old term's write committed"
    );
    assert_eq!(new_token, token + 1);
    // And from now on the old term is refused.
    assert!(is_stale(check(&mut conn, res.as_str(), token).await));
}

/// Race, many rounds: an old holder writes through the fence in a tight
/// loop (each write a transaction: fence, insert, commit) while its lease
/// runs out and a successor takes over. No write of the old term whose
/// fence was checked after the takeover returned may succeed, and the old
/// holder's writes end refused with LK001, never with another error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_old_term_write_passes_after_a_takeover() {
    let db = TestDb::with_connections(8).await;
    sqlx::raw_sql("CREATE TABLE public.effects (round int NOT NULL, token bigint NOT NULL)")
        .execute(&db.pool)
        .await
        .unwrap();
    for round in 0..12 {
        let res = resource(&format!("singleton:race-{round}"));
        let ttl = Duration::from_millis(200);
        let old = acquire(&db.pool, &res, &holder("old"), ttl).await;
        let taken_at: Arc<std::sync::Mutex<Option<Instant>>> = Default::default();
        let late_successes = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (pool, res, taken_at, late) = (
                db.pool.clone(),
                res.clone(),
                taken_at.clone(),
                late_successes.clone(),
            );
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                let mut written = 0;
                loop {
                    let began = Instant::now();
                    let mut tx = conn.begin().await.unwrap();
                    match fence::assert_fence(&mut tx, &Schema::default(), res.as_str(), old).await
                    {
                        Ok(()) => {
                            sqlx::query("INSERT INTO public.effects VALUES ($1, $2)")
                                .bind(round)
                                .bind(old)
                                .execute(&mut *tx)
                                .await
                                .unwrap();
                            tx.commit().await.unwrap();
                            written += 1;
                            if taken_at.lock().unwrap().is_some_and(|t| began > t) {
                                late.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        Err(FenceError::Stale(_)) => return written,
                        Err(e) => panic!("round {round}: not a fence refusal: {e}"),
                    }
                }
            })
        };
        let new = loop {
            let mut conn = db.pool.acquire().await.unwrap();
            match store::acquire(
                &mut conn,
                &Schema::default(),
                &res,
                &holder("new"),
                ttl * 50,
            )
            .await
            {
                Ok(Acquired::New(lease)) => {
                    *taken_at.lock().unwrap() = Some(Instant::now());
                    break lease.fencing_token;
                }
                Err(LeaseError::Held { .. }) => tokio::time::sleep(Duration::from_millis(7)).await,
                other => panic!("round {round}: takeover: {other:?}"),
            }
        };
        assert_eq!(new, old + 1);
        let written = tokio::time::timeout(Duration::from_secs(5), writer)
            .await
            .expect("the old holder is refused")
            .unwrap();
        assert!(written > 0, "round {round}: the old term never wrote");
        assert_eq!(
            late_successes.load(Ordering::SeqCst),
            0,
            "round {round}: an old-term write passed after the takeover"
        );
    }
}

/// Race: a claim taking over a late task while the old claim's fenced
/// transaction is open. The claim skips that task (its row is locked by
/// the fence) instead of waiting for the transaction, so a stalled host
/// transaction never stalls the queue's claims; once it commits, the task
/// is taken over with the next token, and the old token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_skips_a_task_under_a_fenced_transaction() {
    use leasekeeper_core::queue::NewTask;
    use leasekeeper_core::queue::store as tasks;
    let db = TestDb::new().await;
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    tasks::enqueue(
        &mut conn,
        &schema,
        &NewTask::new("t", serde_json::json!({})),
    )
    .await
    .unwrap();
    let ttl = Duration::from_millis(300);
    let first = tasks::claim_next(&mut conn, &schema, &holder("old"), ttl)
        .await
        .unwrap()
        .expect("claimed");
    let token = first.fencing_token.unwrap();

    let mut fenced = db.pool.acquire().await.unwrap();
    let mut tx = fenced.begin().await.unwrap();
    check(
        &mut tx,
        &leasekeeper_core::queue::Task::resource_name(first.id),
        token,
    )
    .await
    .unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;

    // Late now, but under the fence: skipped at once, not waited for.
    let began = Instant::now();
    let none = tokio::time::timeout(
        Duration::from_secs(2),
        tasks::claim_next(&mut conn, &schema, &holder("new"), ttl * 20),
    )
    .await
    .expect("the claim did not wait for the fenced transaction")
    .unwrap();
    assert!(none.is_none(), "claimed a task under a fenced transaction");
    assert!(began.elapsed() < Duration::from_secs(1));

    tx.commit().await.unwrap();
    let taken = tasks::claim_next(&mut conn, &schema, &holder("new"), ttl * 20)
        .await
        .unwrap()
        .expect("taken over once the fenced transaction ended");
    assert_eq!(taken.id, first.id);
    assert_eq!(taken.fencing_token, Some(token + 1));
    assert!(is_stale(
        check(
            &mut conn,
            &leasekeeper_core::queue::Task::resource_name(first.id),
            token
        )
        .await
    ));
    check(
        &mut conn,
        &leasekeeper_core::queue::Task::resource_name(taken.id),
        token + 1,
    )
    .await
    .unwrap();
}

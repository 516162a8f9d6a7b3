//! The acquire race, for real: 64 contenders, each on its own connection,
//! released by a barrier at the same instant, over many rounds from every
//! starting state. Exactly one may win a free, released or expired lease, and
//! its token must be the previous one + 1; nobody may win a live lease.

use crate::common::{TestDb, holder, resource};
use leasekeeper_core::lease::store::{self, Acquired, LeaseError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

const CONTENDERS: usize = 64;
const ROUNDS_PER_STATE: usize = 12;
const TTL: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
enum Start {
    /// No row at all (deleted).
    Free,
    /// The last holder released it.
    Released,
    /// The last holder's lease ran out.
    Expired,
    /// Someone holds it right now.
    Live,
}

/// Outcome counts of one round.
#[derive(Default, Debug)]
struct Round {
    new: Vec<(String, i64)>,
    already_held: usize,
    held_by_other: usize,
}

async fn race(db: &TestDb, round: usize) -> Round {
    let barrier = Arc::new(Barrier::new(CONTENDERS));
    let mut tasks = Vec::new();
    for i in 0..CONTENDERS {
        let barrier = barrier.clone();
        let pool = db.pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await.expect("connection");
            // Warm the connection so the barrier, not the connect, sets the start.
            sqlx::query("SELECT 1")
                .execute(&mut *conn)
                .await
                .expect("warm-up");
            let who = holder(&format!("h{round}-{i}"));
            barrier.wait().await;
            let outcome = store::acquire(
                &mut conn,
                &Default::default(),
                &resource("contested"),
                &who,
                TTL,
            )
            .await;
            (who.to_string(), outcome)
        }));
    }
    let mut result = Round::default();
    for task in tasks {
        let (who, outcome) = task.await.expect("contender task");
        match outcome {
            Ok(Acquired::New(lease)) => {
                assert_eq!(lease.holder.as_deref(), Some(who.as_str()));
                result.new.push((who, lease.fencing_token));
            }
            Ok(Acquired::AlreadyHeld(_)) => result.already_held += 1,
            Err(LeaseError::Held { .. }) => result.held_by_other += 1,
            Err(e) => panic!("round {round}: contender {who} failed: {e}"),
        }
    }
    result
}

async fn prepare(db: &TestDb, start: Start) {
    let r = resource("contested");
    let current = store::get_by_resource(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
    )
    .await
    .unwrap();
    match (start, current) {
        (Start::Free, Some(lease)) => {
            sqlx::query("DELETE FROM leases WHERE id = $1")
                .bind(lease.id)
                .execute(&db.pool)
                .await
                .unwrap();
        }
        (Start::Free, None) => {}
        (Start::Released, Some(lease)) => {
            let h = holder(lease.holder.as_deref().unwrap());
            store::release(
                &mut db.pool.acquire().await.unwrap(),
                &Default::default(),
                &r,
                &h,
                None,
            )
            .await
            .unwrap();
        }
        (Start::Expired, Some(_)) => {
            sqlx::query("UPDATE leases SET expires_at = now() - interval '1 ms' WHERE resource = 'contested'")
                .execute(&db.pool)
                .await
                .unwrap();
        }
        (Start::Live, Some(_)) => {}
        (start, None) => {
            // Needs a prior holder: create one.
            store::acquire(
                &mut db.pool.acquire().await.unwrap(),
                &Default::default(),
                &r,
                &holder("setup"),
                TTL,
            )
            .await
            .unwrap();
            if !matches!(start, Start::Live) {
                Box::pin(prepare(db, start)).await;
            }
        }
    }
}

async fn last_token(db: &TestDb) -> i64 {
    sqlx::query_scalar(
        "SELECT COALESCE(max(last_token), 0) FROM lease_fencing WHERE resource = 'contested'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_one_of_64_contenders_wins_each_round() {
    let db = TestDb::with_connections(CONTENDERS as u32 + 4).await;
    let mut round = 0;
    for start in [Start::Free, Start::Released, Start::Expired, Start::Live] {
        for _ in 0..ROUNDS_PER_STATE {
            round += 1;
            prepare(&db, start).await;
            let before = store::get_by_resource(
                &mut db.pool.acquire().await.unwrap(),
                &Default::default(),
                &resource("contested"),
            )
            .await
            .unwrap();
            let previous = last_token(&db).await;
            let outcome = race(&db, round).await;
            let after = store::get_by_resource(
                &mut db.pool.acquire().await.unwrap(),
                &Default::default(),
                &resource("contested"),
            )
            .await
            .unwrap()
            .unwrap();
            match start {
                Start::Live => {
                    let before = before.unwrap();
                    assert!(
                        outcome.new.is_empty(),
                        "round {round} ({start:?}): {outcome:?}"
                    );
                    assert_eq!(outcome.held_by_other, CONTENDERS, "round {round}");
                    assert_eq!(after.holder, before.holder);
                    assert_eq!(after.fencing_token, before.fencing_token);
                }
                _ => {
                    assert_eq!(
                        outcome.new.len(),
                        1,
                        "round {round} ({start:?}): {outcome:?}"
                    );
                    assert_eq!(outcome.held_by_other, CONTENDERS - 1, "round {round}");
                    let (winner, token) = &outcome.new[0];
                    assert_eq!(*token, previous + 1, "round {round} ({start:?})");
                    assert_eq!(after.holder.as_deref(), Some(winner.as_str()));
                    assert_eq!(after.fencing_token, *token);
                }
            }
        }
    }
    // The history shows one new term per won round, with consecutive tokens.
    let tokens: Vec<i64> = sqlx::query_scalar(
        "SELECT fencing_token FROM lease_events
          WHERE resource = 'contested' AND kind IN ('acquired', 'taken_over') ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(tokens.windows(2).all(|w| w[1] == w[0] + 1), "{tokens:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renew_racing_a_takeover_never_leaves_two_holders() {
    // The old holder renews at the same instant a contender tries to take
    // over the just-expired lease: either the renew fails, or the takeover
    // does, never both succeed.
    let db = TestDb::with_connections(8).await;
    let r = resource("raced");
    store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("old"),
        TTL,
    )
    .await
    .unwrap();
    for round in 0..100 {
        sqlx::query(
            "UPDATE leases SET expires_at = now() + interval '2 ms' WHERE resource = 'raced'",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        let current = store::get_by_resource(
            &mut db.pool.acquire().await.unwrap(),
            &Default::default(),
            &r,
        )
        .await
        .unwrap()
        .unwrap();
        let old = holder(current.holder.as_deref().unwrap());
        let new = holder(&format!("new{round}"));
        let barrier = Arc::new(Barrier::new(2));
        let (b1, b2) = (barrier.clone(), barrier.clone());
        let (p1, p2) = (db.pool.clone(), db.pool.clone());
        let (r1, r2) = (r.clone(), r.clone());
        let old2 = old.clone();
        let renew = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            b1.wait().await;
            store::renew(
                &mut p1.acquire().await.unwrap(),
                &Default::default(),
                &r1,
                &old2,
                None,
                None,
            )
            .await
        });
        let take = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            b2.wait().await;
            store::acquire(
                &mut p2.acquire().await.unwrap(),
                &Default::default(),
                &r2,
                &new,
                TTL,
            )
            .await
        });
        let renewed = renew.await.unwrap().is_ok();
        let took = matches!(take.await.unwrap(), Ok(Acquired::New(_)));
        assert!(
            !(renewed && took),
            "round {round}: both the renew and the takeover succeeded"
        );
        let after = store::get_by_resource(
            &mut db.pool.acquire().await.unwrap(),
            &Default::default(),
            &r,
        )
        .await
        .unwrap()
        .unwrap();
        if took {
            assert_ne!(after.holder.as_deref(), Some(old.as_str()));
            assert_eq!(after.fencing_token, current.fencing_token + 1);
        } else {
            assert_eq!(after.fencing_token, current.fencing_token);
        }
    }
}

//! The task claim raced for real, 500 rounds: the old processor's
//! completion (even rounds) or heartbeat (odd rounds) is released by a
//! barrier at the same instant as another worker's claim, just as the
//! claim's deadline runs out (0 to 12 ms after it is set, random per
//! round). Whatever the timing, never both: either the old processor's
//! write is accepted and the task is not taken over, or the takeover wins
//! (with the next fencing token) and the old write is refused and recorded.
//! Every takeover and every refusal must be in `lease_events`.

use crate::common::{TestDb, holder};
use leasekeeper::queue::TaskStatus;
use leasekeeper::queue::store;
use rand::Rng;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

const ROUNDS: usize = 500;
const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_takeover_racing_the_old_holders_write_never_lets_both_win() {
    let db = TestDb::with_connections(8).await;
    let (mut old_won, mut new_won, mut neither) = (0, 0, 0);
    let mut refusals_expected = 0i64;
    for round in 0..ROUNDS {
        let mut conn = db.pool.acquire().await.unwrap();
        let task = store::enqueue(&mut conn, &json!({"round": round}), 5, None)
            .await
            .unwrap();
        let old = holder(&format!("old{round}"));
        let claimed = store::claim_next(&mut conn, &old, TTL)
            .await
            .unwrap()
            .expect("the new task is claimable");
        assert_eq!(
            claimed.id, task.id,
            "round {round}: earlier tasks were all finished"
        );
        let token = claimed.fencing_token.unwrap();
        // The claim runs out a few milliseconds from now, by the database clock.
        let offset_ms = rand::rng().random_range(0..=12);
        sqlx::query(
            "WITH t AS (UPDATE tasks SET must_heartbeat_before = now() + make_interval(secs => $2::float8 / 1000)
                         WHERE id = $1 RETURNING must_heartbeat_before)
             UPDATE leases SET expires_at = (SELECT must_heartbeat_before FROM t)
              WHERE resource = 'task:' || $1",
        )
        .bind(task.id)
        .bind(offset_ms)
        .execute(&mut *conn)
        .await
        .unwrap();
        drop(conn);

        let barrier = Arc::new(Barrier::new(2));
        let completing = round % 2 == 0;
        let write = {
            let (pool, barrier, old) = (db.pool.clone(), barrier.clone(), old.clone());
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
                barrier.wait().await;
                if completing {
                    store::complete(&mut conn, task.id, &old, token, None)
                        .await
                        .is_ok()
                } else {
                    store::heartbeat(&mut conn, task.id, &old, token, TTL)
                        .await
                        .is_ok()
                }
            })
        };
        let take = {
            let (pool, barrier) = (db.pool.clone(), barrier.clone());
            let new = holder(&format!("new{round}"));
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
                barrier.wait().await;
                store::claim_next(&mut conn, &new, TTL).await.unwrap()
            })
        };
        let accepted = write.await.unwrap();
        let taken = take.await.unwrap();
        let took = taken.as_ref().is_some_and(|t| t.id == task.id);
        assert!(
            taken.is_none() || took,
            "round {round}: the claimer got another task"
        );
        assert!(
            !(accepted && took),
            "round {round}: the old processor's write and the takeover both succeeded"
        );
        let mut conn = db.pool.acquire().await.unwrap();
        let now = store::get(&mut conn, task.id).await.unwrap().unwrap();
        if took {
            new_won += 1;
            assert_eq!(now.fencing_token, Some(token + 1), "round {round}");
            assert_eq!(
                now.processor.as_deref(),
                Some(format!("new{round}").as_str())
            );
            assert_eq!(now.status, TaskStatus::Started);
            refusals_expected += 1;
        } else if accepted {
            old_won += 1;
            assert_eq!(now.fencing_token, Some(token));
            let want = if completing {
                TaskStatus::Processed
            } else {
                TaskStatus::Started
            };
            assert_eq!(now.status, want, "round {round}");
        } else {
            // The write came after the deadline, the claim just before it.
            neither += 1;
            refusals_expected += 1;
            assert_eq!(now.fencing_token, Some(token));
        }
        // Finish the task by hand so the next round's claims see only its own.
        sqlx::query(
            "UPDATE tasks SET status = 'processed', processed_at = now(), must_heartbeat_before = NULL
              WHERE id = $1 AND status <> 'processed'",
        )
        .bind(task.id)
        .execute(&mut *conn)
        .await
        .unwrap();
    }
    eprintln!(
        "{ROUNDS} rounds: old write won {old_won}, takeover won {new_won}, neither {neither}"
    );
    // Both outcomes happened: the race was real, not decided by the setup.
    assert!(
        old_won > 0 && new_won > 0,
        "old {old_won}, new {new_won}, neither {neither}"
    );
    let (takeovers, refusals): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE kind = 'taken_over'),
                count(*) FILTER (WHERE kind = 'stale_write_refused')
           FROM lease_events WHERE resource LIKE 'task:%'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(takeovers, new_won as i64, "every takeover recorded");
    assert_eq!(refusals, refusals_expected, "every refused write recorded");
}

//! Fenced transactional completion: a handler's own writes commit with its
//! completion, and only if the completion is accepted. A stale holder (its
//! claim taken over while it was paused) has its writes rolled back with
//! its refused completion; raced for real at the moment the lease runs out.

use crate::common::{TestDb, event_kinds, holder};
use leasekeeper_core::queue::store::{self, FencedTransaction, TaskError};
use leasekeeper_core::queue::{NewTask, TaskStatus};
use leasekeeper_core::worker::in_process::DEFAULT_HOST_SEARCH_PATH;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

/// The host service's own table, in its own schema (`public`).
async fn ledger(db: &TestDb) {
    sqlx::query(
        "CREATE TABLE public.ledger (task_id int NOT NULL, holder text NOT NULL, token bigint NOT NULL)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
}

/// The ledger rows of task `id`: (holder, token).
async fn effects(db: &TestDb, id: i64) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT holder, token FROM public.ledger WHERE task_id = $1 ORDER BY token")
        .bind(id)
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

/// A handler's write: one ledger row, unqualified, as a host writes it.
async fn write_effect(tx: &mut FencedTransaction, id: i64, who: &str, token: i64) {
    sqlx::query("INSERT INTO ledger (task_id, holder, token) VALUES ($1, $2, $3)")
        .bind(id)
        .bind(who)
        .bind(token)
        .execute(&mut **tx)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_paused_holders_writes_roll_back_with_its_refused_completion() {
    let db = TestDb::new().await;
    ledger(&db).await;
    let mut conn = db.pool.acquire().await.unwrap();
    let task = store::enqueue(
        &mut conn,
        &Default::default(),
        &NewTask::new("pay", json!({"cents": 100})),
    )
    .await
    .unwrap();
    let (a, b) = (holder("a"), holder("b"));
    let ttl = Duration::from_millis(300);
    let claim_a = store::claim_next(&mut conn, &Default::default(), &a, ttl)
        .await
        .unwrap()
        .unwrap();
    let token_a = claim_a.fencing_token.unwrap();

    // a writes its effect, then "pauses" past its lease with the
    // transaction open; b takes the task over and finishes it.
    let mut tx_a = FencedTransaction::begin(&db.pool, DEFAULT_HOST_SEARCH_PATH)
        .await
        .unwrap();
    write_effect(&mut tx_a, task.id, "a", token_a).await;
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let claim_b = store::claim_next(&mut conn, &Default::default(), &b, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("b takes the late task over");
    let token_b = claim_b.fencing_token.unwrap();
    assert_eq!(token_b, token_a + 1);
    let mut tx_b = FencedTransaction::begin(&db.pool, DEFAULT_HOST_SEARCH_PATH)
        .await
        .unwrap();
    write_effect(&mut tx_b, task.id, "b", token_b).await;
    let done = tx_b
        .complete(task.id, &b, token_b, Some(&json!("paid by b")))
        .await
        .unwrap();
    assert_eq!(done.status, TaskStatus::Processed);

    // a wakes up and completes: refused, and its write is gone.
    let refused = tx_a
        .complete(task.id, &a, token_a, Some(&json!("paid by a")))
        .await;
    assert!(
        matches!(&refused, Err(TaskError::Stale { reason, .. }) if reason.contains("already processed")),
        "{refused:?}"
    );
    assert_eq!(
        effects(&db, task.id).await,
        vec![("b".to_string(), token_b)]
    );
    let stored = store::get(&mut conn, &Default::default(), task.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.processor.as_deref(), Some("b"));
    assert_eq!(stored.task_output, Some(json!("paid by b")));
    let kinds = event_kinds(&db.pool, &format!("task:{}", task.id)).await;
    assert_eq!(
        kinds.iter().filter(|k| *k == "stale_write_refused").count(),
        1,
        "{kinds:?}"
    );
    // The refusal names the op and the holder.
    let (who, detail): (String, serde_json::Value) = sqlx::query_as(
        "SELECT holder, detail FROM lease_events WHERE kind = 'stale_write_refused' AND resource = $1",
    )
    .bind(format!("task:{}", task.id))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(who, "a");
    assert_eq!(detail["op"], "complete");
}

#[tokio::test]
async fn an_expired_but_not_taken_over_claim_cannot_commit_its_writes() {
    // The transaction began while the claim was live; the deadline is
    // judged when the completion runs, not when the transaction began.
    let db = TestDb::new().await;
    ledger(&db).await;
    let mut conn = db.pool.acquire().await.unwrap();
    let task = store::enqueue(
        &mut conn,
        &Default::default(),
        &NewTask::new("pay", json!({})),
    )
    .await
    .unwrap();
    let a = holder("a");
    let claim = store::claim_next(
        &mut conn,
        &Default::default(),
        &a,
        Duration::from_millis(300),
    )
    .await
    .unwrap()
    .unwrap();
    let token = claim.fencing_token.unwrap();
    let mut tx = FencedTransaction::begin(&db.pool, DEFAULT_HOST_SEARCH_PATH)
        .await
        .unwrap();
    write_effect(&mut tx, task.id, "a", token).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = tx.complete(task.id, &a, token, None).await;
    assert!(
        matches!(&refused, Err(TaskError::Stale { reason, .. }) if reason.contains("expired")),
        "{refused:?}"
    );
    assert!(effects(&db, task.id).await.is_empty());
    let stored = store::get(&mut conn, &Default::default(), task.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, TaskStatus::Started, "left for a takeover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn completion_and_takeover_raced_at_the_deadline_never_both_win() {
    // Each round: a claims with a short lease and writes its effect; at
    // the moment the lease runs out, a completes while b tries to take the
    // task over, released together by a barrier. Whoever wins, the task
    // has exactly the effects of the holder that completed it, and a
    // refused a is never both refused and recorded.
    let db = TestDb::with_connections(8).await;
    ledger(&db).await;
    // Long enough that a's set-up (transaction, write) is surely done
    // before the firing moment even on a loaded machine; the offsets are
    // wide enough that each side surely wins some rounds.
    let ttl = Duration::from_millis(1000);
    let (mut a_won, mut b_won) = (0, 0);
    for round in 0..28 {
        let mut conn = db.pool.acquire().await.unwrap();
        let task = store::enqueue(
            &mut conn,
            &Default::default(),
            &NewTask::new("pay", json!({ "round": round })),
        )
        .await
        .unwrap();
        let a = holder("a");
        let claimed_at = tokio::time::Instant::now();
        let claim = store::claim_next(&mut conn, &Default::default(), &a, ttl)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(claim.id, task.id);
        let token_a = claim.fencing_token.unwrap();
        let mut tx = FencedTransaction::begin(&db.pool, DEFAULT_HOST_SEARCH_PATH)
            .await
            .unwrap();
        write_effect(&mut tx, task.id, "a", token_a).await;
        // Fire within 150 ms either side of the deadline (the claim's
        // request was sent at `claimed_at`, so the lease ends a little later).
        let offset = [-150i64, -60, -20, 0, 20, 60, 150][round % 7];
        let deadline = claimed_at + ttl;
        let at = if offset < 0 {
            deadline - Duration::from_millis(offset.unsigned_abs())
        } else {
            deadline + Duration::from_millis(offset as u64)
        };
        tokio::time::sleep_until(at).await;
        let barrier = Arc::new(Barrier::new(2));
        let completing = {
            let barrier = barrier.clone();
            let a = a.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                tx.complete(task.id, &a, token_a, None).await
            })
        };
        let taking_over = {
            let barrier = barrier.clone();
            let pool = db.pool.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                // Keep trying until the lease has surely run out.
                let start = tokio::time::Instant::now();
                loop {
                    let mut conn = pool.acquire().await.unwrap();
                    let got = store::claim_next(
                        &mut conn,
                        &Default::default(),
                        &holder("b"),
                        Duration::from_secs(30),
                    )
                    .await
                    .unwrap();
                    if got.is_some() || start.elapsed() > Duration::from_millis(400) {
                        return got;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        };
        let completed = completing.await.unwrap();
        let took_over = taking_over.await.unwrap();
        let stored = store::get(&mut conn, &Default::default(), task.id)
            .await
            .unwrap()
            .unwrap();
        let effects = effects(&db, task.id).await;
        match (&completed, &took_over) {
            (Ok(_), None) => {
                a_won += 1;
                assert_eq!(stored.status, TaskStatus::Processed);
                assert_eq!(effects, vec![("a".to_string(), token_a)]);
            }
            (Err(TaskError::Stale { .. }), Some(b)) => {
                b_won += 1;
                assert_eq!(b.fencing_token, Some(token_a + 1));
                assert_eq!(stored.processor.as_deref(), Some("b"));
                assert!(effects.is_empty(), "a's write rolled back: {effects:?}");
            }
            other => panic!("round {round}: both or neither won: {other:?}"),
        }
        // Clean up b's claim so the next round's claim finds the new task.
        if stored.status == TaskStatus::Started {
            store::complete(
                &mut conn,
                &Default::default(),
                task.id,
                &holder("b"),
                stored.fencing_token.unwrap(),
                None,
            )
            .await
            .unwrap();
        }
    }
    // Both outcomes happened, so the race was really run at the deadline.
    assert!(a_won > 0 && b_won > 0, "a won {a_won}, b won {b_won}");
}

//! A service calling the store directly is held to the task's limits as a
//! REST client is: `enqueue`, `enqueue_outcome` and `enqueue_many` run
//! `NewTask::validate`, so an over-long delay, a bad name or an
//! out-of-range unique period is refused with the REST API's words, and
//! nothing is added.

use crate::common::TestDb;
use leasekeeper_core::db::Schema;
use leasekeeper_core::queue::store::{self, TaskError};
use leasekeeper_core::queue::{MAX_DELAY, NewTask, UNIQUE_PERIODS};
use serde_json::json;
use std::time::Duration;

fn task() -> NewTask {
    NewTask::new("email", json!({"to": "ada@example.org"}))
}

/// The store's refusal of `tasks`: its words.
async fn refused(db: &TestDb, tasks: &[NewTask]) -> String {
    let mut conn = db.pool.acquire().await.unwrap();
    match store::enqueue_many(&mut conn, &Schema::default(), tasks).await {
        Err(TaskError::BadInput(words)) => words,
        other => panic!("not refused as bad input: {other:?}"),
    }
}

async fn stored(db: &TestDb) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn an_embedders_delay_past_a_day_is_refused_as_over_rest() {
    let db = TestDb::new().await;
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    let late = task().delay(MAX_DELAY + Duration::from_secs(1));
    let err = store::enqueue(&mut conn, &schema, &late)
        .await
        .expect_err("a delay past a day");
    assert!(
        matches!(&err, TaskError::BadInput(m) if m == "delay_seconds must be between 0 and 86400"),
        "{err:?}"
    );
    assert_eq!(stored(&db).await, 0, "nothing added");
    let at_limit = store::enqueue(&mut conn, &schema, &task().delay(MAX_DELAY))
        .await
        .expect("a delay of a day");
    assert!(at_limit.scheduled_at > at_limit.created_at + chrono::Duration::hours(23));
}

#[tokio::test]
async fn a_bad_name_or_unique_period_in_a_batch_is_refused_by_its_index() {
    let db = TestDb::new().await;
    // Past the size where the batch goes by COPY: the check comes first
    // whatever the path.
    let mut tasks: Vec<NewTask> = (0..100).map(|_| task()).collect();
    tasks[70] = task().delay(Duration::from_secs(90_000));
    assert_eq!(
        refused(&db, &tasks).await,
        "tasks[70]: delay_seconds must be between 0 and 86400"
    );
    let mut tasks = vec![task(), task(), NewTask::new("e\u{1b}mail", json!({}))];
    assert_eq!(
        refused(&db, &tasks).await,
        "tasks[2]: kind must not contain control characters"
    );
    tasks[2] = task().queue("q".repeat(129));
    assert_eq!(
        refused(&db, &tasks).await,
        "tasks[2]: queue must be 1 to 128 characters, got 129"
    );
    for period in [
        Duration::from_millis(999),
        UNIQUE_PERIODS.1 + Duration::from_secs(1),
    ] {
        tasks[2] = task().unique_for("k", period);
        assert_eq!(
            refused(&db, &tasks).await,
            "tasks[2]: unique_period_seconds must be between 1 and 31622400",
            "{period:?}"
        );
    }
    tasks[2] = task().timeout(Duration::ZERO);
    assert_eq!(
        refused(&db, &tasks).await,
        "tasks[2]: timeout_seconds must be between 0.001 and 86400"
    );
    assert_eq!(stored(&db).await, 0, "nothing added");
}

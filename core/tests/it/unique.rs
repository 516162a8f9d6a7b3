//! Unique tasks and bulk enqueue against a real database: the unique index
//! decides (64 enqueues of one key at once make one task), the scopes, the
//! key freed when its holder finishes, a retry that would double a key
//! refused, and a batch in one statement, in order, all or nothing.

use crate::common::{TestDb, holder};
use leasekeeper_core::db::Schema;
use leasekeeper_core::queue::control;
use leasekeeper_core::queue::store::{self, Enqueued, TaskError};
use leasekeeper_core::queue::{NewTask, TaskStatus, UniqueScope};
use serde_json::json;
use sqlx::Connection;
use std::time::Duration;

/// The bulk filter of every cancelled `sync` task.
fn cancelled_syncs() -> control::TaskFilter {
    control::TaskFilter {
        status: TaskStatus::Cancelled,
        kind: Some("sync".into()),
        queue: None,
        data: None,
        error_group: None,
    }
}

fn sync(customer: i64) -> NewTask {
    NewTask::new("sync", json!({ "customer": customer })).unique(format!("customer-{customer}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_enqueues_of_one_key_make_one_task() {
    let db = TestDb::with_connections(70).await;
    // All 64 start together: each waits at the barrier with its connection
    // in hand, so the inserts really race in the database.
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let mut racers = Vec::new();
    for _ in 0..64 {
        let pool = db.pool.clone();
        let barrier = barrier.clone();
        racers.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            barrier.wait().await;
            store::enqueue_outcome(&mut conn, &Schema::default(), &sync(7))
                .await
                .unwrap()
        }));
    }
    let mut outcomes = Vec::new();
    for r in racers {
        outcomes.push(r.await.unwrap());
    }
    let new: Vec<_> = outcomes.iter().filter(|o| o.is_new()).collect();
    assert_eq!(new.len(), 1, "exactly one enqueue added the task");
    let id = new[0].task().id;
    assert!(
        outcomes.iter().all(|o| o.task().id == id),
        "all answered the one task"
    );
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(count, 1);
    let task = new[0].task();
    assert_eq!(task.unique_key.as_deref(), Some("customer-7"));
    assert_eq!(task.unique_scope, Some(UniqueScope::Active));
}

#[tokio::test]
async fn an_active_key_is_free_again_once_its_task_finishes() {
    let db = TestDb::new().await;
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    let first = store::enqueue_outcome(&mut conn, &schema, &sync(1))
        .await
        .unwrap();
    assert!(first.is_new());
    // Another key, or another kind with the same key: not the same.
    assert!(
        store::enqueue_outcome(&mut conn, &schema, &sync(2))
            .await
            .unwrap()
            .is_new()
    );
    let other_kind = NewTask::new("mail", json!({})).unique("customer-1");
    assert!(
        store::enqueue_outcome(&mut conn, &schema, &other_kind)
            .await
            .unwrap()
            .is_new()
    );
    // Started still holds it.
    let w = holder("w");
    let claimed = store::claim_next(&mut conn, &schema, &w, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, first.task().id);
    let again = store::enqueue_outcome(&mut conn, &schema, &sync(1))
        .await
        .unwrap();
    assert_eq!(again, Enqueued::Existing(again.task().clone()));
    assert_eq!(again.task().id, first.task().id);
    assert_eq!(again.task().status, TaskStatus::Started);
    // Processed: the key is free.
    store::complete(
        &mut conn,
        &schema,
        claimed.id,
        &w,
        claimed.fencing_token.unwrap(),
        None,
    )
    .await
    .unwrap();
    let after = store::enqueue_outcome(&mut conn, &schema, &sync(1))
        .await
        .unwrap();
    assert!(after.is_new());
    assert_ne!(after.task().id, first.task().id);
    // Cancelled frees it too.
    control::cancel(&mut conn, &schema, after.task().id, "test")
        .await
        .unwrap();
    let third = store::enqueue_outcome(&mut conn, &schema, &sync(1))
        .await
        .unwrap();
    assert!(third.is_new());
    // A retry of the cancelled one would give the key a second holder.
    let refused = control::retry(&mut conn, &schema, after.task().id, "test").await;
    assert!(
        matches!(&refused, Err(TaskError::Conflict(_))),
        "{refused:?}"
    );
    let status: String = sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1")
        .bind(after.task().id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(status, "cancelled", "the refused retry changed nothing");
    // The bulk retry leaves it too, and retries what it can.
    let filter = cancelled_syncs();
    assert_eq!(
        control::retry_matching(&db.pool, &schema, &filter, "test")
            .await
            .unwrap(),
        0
    );
    // Once the holder is gone, the retry goes through.
    control::cancel(&mut conn, &schema, third.task().id, "test")
        .await
        .unwrap();
    assert_eq!(
        control::retry_matching(&db.pool, &schema, &filter, "test")
            .await
            .unwrap(),
        1
    );
}

#[tokio::test]
async fn period_and_always_scopes_hold_the_key_whatever_the_state() {
    let db = TestDb::new().await;
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    // A 366-day period: the two enqueues fall in the same one unless they
    // straddle a period boundary (counted from the Unix epoch), a chance of
    // about one in 30 million.
    let yearly =
        NewTask::new("digest", json!({})).unique_for("d", Duration::from_secs(366 * 24 * 3600));
    let a = store::enqueue_outcome(&mut conn, &schema, &yearly)
        .await
        .unwrap();
    control::cancel(&mut conn, &schema, a.task().id, "test")
        .await
        .unwrap();
    let b = store::enqueue_outcome(&mut conn, &schema, &yearly)
        .await
        .unwrap();
    assert!(!b.is_new(), "the period holds the key even once cancelled");
    assert_eq!(b.task().unique_scope, Some(UniqueScope::Always));
    // One-second periods: a later period takes a new task.
    let brief = NewTask::new("digest", json!({})).unique_for("s", Duration::from_secs(1));
    assert!(
        store::enqueue_outcome(&mut conn, &schema, &brief)
            .await
            .unwrap()
            .is_new()
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(
        store::enqueue_outcome(&mut conn, &schema, &brief)
            .await
            .unwrap()
            .is_new()
    );
    // Always: even a processed task keeps it.
    let once = NewTask::new("migrate", json!({})).unique_always("v2");
    let first = store::enqueue_outcome(&mut conn, &schema, &once)
        .await
        .unwrap();
    control::cancel(&mut conn, &schema, first.task().id, "test")
        .await
        .unwrap();
    let again = store::enqueue_outcome(&mut conn, &schema, &once)
        .await
        .unwrap();
    assert_eq!(again.task().id, first.task().id);
    assert!(!again.is_new());
}

#[tokio::test]
async fn bad_unique_keys_and_periods_are_refused() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    let long = "k".repeat(257);
    for (task, says) in [
        (NewTask::new("k", json!({})).unique(""), "unique_key"),
        (NewTask::new("k", json!({})).unique(long), "unique_key"),
        (NewTask::new("k", json!({})).unique("a\0b"), "NUL"),
        (
            NewTask::new("k", json!({})).unique_for("p", Duration::ZERO),
            "period",
        ),
    ] {
        let e = store::enqueue(&mut conn, &Schema::default(), &task)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, TaskError::BadInput(m) if m.contains(says)),
            "{e:?}"
        );
    }
}

#[tokio::test]
async fn a_batch_is_one_statement_in_order_all_or_nothing() {
    let db = TestDb::new().await;
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    let held = store::enqueue(&mut conn, &schema, &sync(9)).await.unwrap();
    let mut batch: Vec<NewTask> = (0..1000)
        .map(|i| NewTask::new("bulk", json!({ "i": i })).priority((i % 7) as i16))
        .collect();
    batch[10] = sync(9); // held by a committed task
    batch[20] = sync(10); // new ...
    batch[30] = sync(10); // ... and again in the same batch
    let out = store::enqueue_many(&mut conn, &schema, &batch)
        .await
        .unwrap();
    assert_eq!(out.len(), 1000);
    for (i, o) in out.iter().enumerate() {
        match i {
            10 => assert_eq!(o, &Enqueued::Existing(o.task().clone())),
            30 => {
                assert!(!o.is_new());
                assert_eq!(o.task().id, out[20].task().id);
            }
            _ => {
                assert!(o.is_new(), "{i}");
                if i != 20 {
                    assert_eq!(o.task().task_data, json!({ "i": i }), "in order");
                }
            }
        }
    }
    assert_eq!(out[10].task().id, held.id);
    // Ids follow the order of the batch.
    let ids: Vec<i64> = out
        .iter()
        .filter(|o| o.is_new())
        .map(|o| o.task().id)
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids ascend with the batch"
    );

    // One bad task: nothing added, its index named.
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let mut bad: Vec<NewTask> = (0..5)
        .map(|i| NewTask::new("bulk", json!({ "i": i })))
        .collect();
    bad[3].max_attempts = 0;
    let e = store::enqueue_many(&mut conn, &schema, &bad)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, TaskError::BadInput(m) if m.starts_with("tasks[3]: ")),
        "{e:?}"
    );
    // In the caller's transaction: rolled back, nothing stays.
    let mut tx = conn.begin().await.unwrap();
    store::enqueue_many(&mut tx, &schema, &bad[..3])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(after, before);
    // Too many at once.
    let many = vec![NewTask::new("bulk", json!({})); store::MAX_ENQUEUE_BATCH + 1];
    assert!(matches!(
        store::enqueue_many(&mut conn, &schema, &many).await,
        Err(TaskError::BadInput(_))
    ));
}

/// A batch without unique keys takes the plain insert (or, from 64 tasks,
/// COPY), whose answer is built from the input rather than read back: it
/// must be exactly what a read of each task gives, field by field, numbers
/// written with an exponent included (jsonb keeps them as plain digits).
#[tokio::test]
async fn a_plain_batch_answers_what_a_read_gives_back() {
    answers_what_a_read_gives_back(0).await;
}

/// The same through COPY, with the characters its text format escapes
/// (backslash, tab, newline, carriage return, and `\N`, its NULL) in the
/// data and in the names: stored and answered as sent.
#[tokio::test]
async fn a_copied_batch_answers_what_a_read_gives_back_special_characters_and_all() {
    answers_what_a_read_gives_back(100).await;
}

/// Enqueues three chosen tasks and `more` tasks with special characters
/// in one batch, checks each answer against a read, and the order of ids.
async fn answers_what_a_read_gives_back(more: usize) {
    let db = TestDb::new().await;
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    let data = serde_json::from_str::<serde_json::Value>(
        r#"{"big": 1e16, "small": 2.5e-7, "n": [1, 2.5, -3e30, "x", null], "o": {"z": true}}"#,
    )
    .unwrap();
    let mut batch = vec![
        NewTask::new("plain", data.clone()),
        NewTask::new("plain", json!({ "i": 2 }))
            .queue("elsewhere")
            .priority(-4)
            .max_attempts(9)
            .delay(Duration::from_secs(30))
            .timeout(Duration::from_millis(1500)),
        NewTask::new("other", json!([])),
    ];
    let odd = "back\\slash \\N tab\t nl\n cr\r é☃ quote\" end\\";
    for i in 0..more {
        batch.push(
            NewTask::new(
                format!("kind \\N\\{i}"),
                json!({ "s": odd, "k\tey\n": [i, odd], "\\N": null }),
            )
            .queue("q\\ \\t")
            .delay(Duration::from_millis(i as u64)),
        );
    }
    let out = store::enqueue_many(&mut conn, &schema, &batch)
        .await
        .unwrap();
    assert_eq!(out.len(), batch.len());
    for (o, input) in out.iter().zip(&batch) {
        assert!(o.is_new());
        let read = store::get(&mut conn, &schema, o.task().id)
            .await
            .unwrap()
            .expect("stored");
        assert_eq!(o.task(), &read, "answered as stored");
        assert_eq!(read.kind, input.kind);
        assert_eq!(read.queue, input.queue);
        assert_eq!(
            read.task_data,
            leasekeeper_core::json::as_stored(&input.data)
        );
    }
    assert_eq!(
        out[0].task().task_data["big"],
        json!(10_000_000_000_000_000_u64)
    );
    assert!(
        out[1].task().scheduled_at > out[0].task().scheduled_at + chrono::Duration::seconds(29)
    );
    assert!(
        out.windows(2).all(|w| w[0].task().id < w[1].task().id),
        "ids in the input's order"
    );
    if more > 0 {
        let last = out.last().unwrap().task();
        assert_eq!(last.task_data["s"], json!(odd));
        assert_eq!(
            last.scheduled_at - out[3].task().scheduled_at,
            chrono::Duration::milliseconds(more as i64 - 1),
            "each delay from one clock"
        );
    }
}

/// A batch the database refuses (one task's data is over the stored
/// limit, which only the database measures: compressed) adds nothing, by
/// the plain insert and by COPY alike, and the connection goes on to
/// enqueue the good tasks.
#[tokio::test]
async fn a_batch_the_database_refuses_adds_nothing_and_the_connection_goes_on() {
    let db = TestDb::new().await;
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    // 1.5 million pseudo-random letters: too many for pglz to squeeze
    // under the 512 KiB limit.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let noise: String = (0..1_500_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    for size in [3, 100] {
        let mut batch: Vec<NewTask> = (0..size)
            .map(|i| NewTask::new("fine", json!({ "i": i })))
            .collect();
        batch[size / 2] = NewTask::new("huge", json!({ "noise": noise }));
        let refused = store::enqueue_many(&mut conn, &schema, &batch).await;
        match refused {
            Err(TaskError::Db(sqlx::Error::Database(e))) => {
                assert_eq!(e.constraint(), Some("tasks_task_data_size"), "{e}")
            }
            other => panic!("a batch of {size}: {other:?}"),
        }
        let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(stored, 0, "a batch of {size}: nothing added");
        batch.remove(size / 2);
        let added = store::enqueue_many(&mut conn, &schema, &batch)
            .await
            .unwrap();
        assert!(added.iter().all(Enqueued::is_new) && added.len() == size - 1);
        sqlx::query("DELETE FROM tasks")
            .execute(&mut *conn)
            .await
            .unwrap();
    }
}

/// A bulk retry skips a task whose key a task of scope `always` holds, in
/// whatever status that one is: the unique index keeps an `always` key
/// for good, so retrying the active-scoped task beside it would break the
/// key (the batch failed with a conflict, 409, until Schemathesis found
/// it: an active-scoped task cancelled, then the same key taken for good).
#[tokio::test]
async fn a_bulk_retry_skips_a_task_whose_key_an_always_task_holds() {
    let db = TestDb::new().await;
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    let active = store::enqueue_outcome(&mut conn, &schema, &sync(3))
        .await
        .unwrap();
    control::cancel(&mut conn, &schema, active.task().id, "test")
        .await
        .unwrap();
    let always = NewTask::new("sync", json!({ "customer": 3 })).unique_always("customer-3");
    let held = store::enqueue_outcome(&mut conn, &schema, &always)
        .await
        .unwrap();
    assert!(held.is_new(), "the cancelled task released its active key");
    control::cancel(&mut conn, &schema, held.task().id, "test")
        .await
        .unwrap();
    // Both cancelled; the `always` one still holds the key.
    let filter = cancelled_syncs();
    assert_eq!(
        control::retry_matching(&db.pool, &schema, &filter, "test")
            .await
            .unwrap(),
        1,
        "the `always` task is retried (its key is its own), the active one skipped"
    );
    let statuses: Vec<(i64, String)> = sqlx::query_as("SELECT id, status FROM tasks ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        statuses,
        [
            (active.task().id, "cancelled".into()),
            (held.task().id, "pending".into())
        ]
    );
}

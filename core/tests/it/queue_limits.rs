//! Queue limits against a real database (issue 39): the caps per queue and
//! per key on every claim path, raced for real by claimers behind a
//! barrier; the fleet's token bucket; fairness between keys; takeovers,
//! pauses and the switch between limited and unlimited claims; the setting
//! of limits (ranges, audit, an unchanged set) and their figures.

use crate::common::{TestDb, holder};
use leasekeeper_core::queue::queue_limits::QueueLimits;
use leasekeeper_core::queue::queues::{self, QueueError};
use leasekeeper_core::queue::store;
use leasekeeper_core::queue::{ClaimFilter, NewTask, Task};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;

const TTL: Duration = Duration::from_secs(30);

fn schema() -> leasekeeper_core::db::Schema {
    Default::default()
}

async fn limit(db: &TestDb, queue: &str, limits: QueueLimits) {
    queues::set_limits(
        &mut db.pool.acquire().await.unwrap(),
        &schema(),
        queue,
        &limits,
        "test",
    )
    .await
    .unwrap();
}

async fn enqueue_keyed(db: &TestDb, queue: &str, key: Option<&str>, n: usize) -> Vec<Task> {
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| {
            let t = NewTask::new("note", json!({ "i": i })).queue(queue);
            match key {
                Some(k) => t.concurrency_key(k),
                None => t,
            }
        })
        .collect();
    store::enqueue_many(&mut db.pool.acquire().await.unwrap(), &schema(), &tasks)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.into_task())
        .collect()
}

async fn claim_up_to(db: &TestDb, queue: &str, who: &str, n: usize) -> Vec<Task> {
    claimed(db, queue, who, n, None).await.tasks
}

/// A claim of `n` tasks of `queue` (of `kinds`, or any) for `who`.
async fn claimed(
    db: &TestDb,
    queue: &str,
    who: &str,
    n: usize,
    kinds: Option<Vec<String>>,
) -> store::Claimed {
    store::claim_for(
        &mut db.pool.acquire().await.unwrap(),
        &schema(),
        &vec![holder(who); n],
        TTL,
        &ClaimFilter {
            queue: queue.into(),
            kinds,
        },
    )
    .await
    .unwrap()
}

async fn finish(db: &TestDb, task: &Task) {
    store::complete(
        &mut db.pool.acquire().await.unwrap(),
        &schema(),
        task.id,
        &holder(task.processor.as_deref().unwrap()),
        task.fencing_token.unwrap(),
        None,
    )
    .await
    .unwrap();
}

/// Started tasks of `queue`, per key (keyless under ""), by the database.
async fn started_by_key(db: &TestDb, queue: &str) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT coalesce(concurrency_key, ''), count(*) FROM tasks
          WHERE queue = $1 AND status = 'started' GROUP BY 1 ORDER BY 1",
    )
    .bind(queue)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

fn keys(tasks: &[Task]) -> Vec<String> {
    let mut k: Vec<String> = tasks
        .iter()
        .map(|t| t.concurrency_key.clone().unwrap_or_default())
        .collect();
    k.sort();
    k
}

#[tokio::test]
async fn a_batch_claim_takes_at_most_the_per_key_cap_of_each_key() {
    let db = TestDb::new().await;
    enqueue_keyed(&db, "sync", Some("acme"), 10).await;
    enqueue_keyed(&db, "sync", Some("globex"), 10).await;
    enqueue_keyed(&db, "sync", None, 3).await;
    limit(
        &db,
        "sync",
        QueueLimits {
            max_started_per_key: Some(2),
            ..Default::default()
        },
    )
    .await;
    let first = claim_up_to(&db, "sync", "w", 50).await;
    // Two of each key, and every keyless task (no cap per key for them).
    assert_eq!(
        keys(&first),
        ["", "", "", "acme", "acme", "globex", "globex"]
    );
    assert!(
        claim_up_to(&db, "sync", "w", 50)
            .await
            .iter()
            .all(|t| t.concurrency_key.is_none())
    );
    // One acme task ends: exactly one acme slot frees.
    let acme = first
        .iter()
        .find(|t| t.concurrency_key.as_deref() == Some("acme"))
        .unwrap();
    finish(&db, acme).await;
    let next = claim_up_to(&db, "sync", "w", 50).await;
    assert_eq!(keys(&next), ["acme"]);
    assert_eq!(
        started_by_key(&db, "sync").await,
        [("".into(), 3), ("acme".into(), 2), ("globex".into(), 2)]
    );
}

#[tokio::test]
async fn max_started_caps_the_queue_across_claims() {
    let db = TestDb::new().await;
    enqueue_keyed(&db, "q", None, 20).await;
    limit(
        &db,
        "q",
        QueueLimits {
            max_started: Some(3),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(claim_up_to(&db, "q", "a", 2).await.len(), 2);
    assert_eq!(claim_up_to(&db, "q", "b", 5).await.len(), 1);
    assert!(claim_up_to(&db, "q", "c", 5).await.is_empty());
    // Every single-task way of claiming obeys it too.
    let mut conn = db.pool.acquire().await.unwrap();
    assert!(
        store::claim_next_in(
            &mut conn,
            &schema(),
            &holder("d"),
            TTL,
            &ClaimFilter::queue("q")
        )
        .await
        .unwrap()
        .is_none()
    );
}

/// The race the limit's lock prevents: claimers each seeing the last free
/// slot (of the queue, or of a key). 24 claimers behind a barrier, each
/// claiming 1 to 3 tasks at a time in a loop and holding them a moment,
/// over 40 keys; by the database's history no instant had more than the
/// caps started, and every task was claimed once. (Without the lock, two
/// claimers that both see one free slot of the queue take two different
/// keys' tasks: seen here, 33 to 36 started at once against a cap of 5.)
#[tokio::test]
async fn claimers_racing_for_the_last_slots_never_pass_the_caps() {
    let db = TestDb::new().await;
    const PER_KEY: i64 = 2;
    const QUEUE: i64 = 5;
    let mut tasks = 0;
    for k in 0..40 {
        enqueue_keyed(&db, "race", Some(&format!("k{k:02}")), 4).await;
        tasks += 4;
    }
    limit(
        &db,
        "race",
        QueueLimits {
            max_started_per_key: Some(PER_KEY as i32),
            max_started: Some(QUEUE as i32),
            ..Default::default()
        },
    )
    .await;
    let barrier = Arc::new(Barrier::new(24));
    let mut claimers = Vec::new();
    for c in 0..24 {
        let pool = db.pool.clone();
        let barrier = barrier.clone();
        claimers.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut mine = Vec::new();
            let mut idle = 0;
            while idle < 20 {
                let mut conn = pool.acquire().await.unwrap();
                let got = store::claim_for(
                    &mut conn,
                    &schema(),
                    &vec![holder(&format!("c{c}")); 1 + c % 3],
                    TTL,
                    &ClaimFilter::queue("race"),
                )
                .await
                .unwrap()
                .tasks;
                if got.is_empty() {
                    idle += 1;
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
                for task in got {
                    mine.push(task.id);
                    store::complete(
                        &mut conn,
                        &schema(),
                        task.id,
                        &holder(task.processor.as_deref().unwrap()),
                        task.fencing_token.unwrap(),
                        None,
                    )
                    .await
                    .unwrap();
                }
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for c in claimers {
        all.extend(c.await.unwrap());
    }
    let total = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), total, "a task was claimed twice");
    assert_eq!(total, tasks, "every task claimed once");
    // At each claim's instant, the tasks between their claim and their end
    // (the claim itself included), in the queue and in the claim's key.
    let (queue, key): (i64, i64) = sqlx::query_as(
        "SELECT max((SELECT count(*) FROM tasks o
                      WHERE o.queue = 'race' AND o.started_at <= t.started_at
                        AND o.processed_at > t.started_at)),
                max((SELECT count(*) FROM tasks o
                      WHERE o.queue = 'race' AND o.concurrency_key = t.concurrency_key
                        AND o.started_at <= t.started_at AND o.processed_at > t.started_at))
           FROM tasks t WHERE t.queue = 'race'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        queue <= QUEUE,
        "{queue} tasks were started at one instant, cap {QUEUE}"
    );
    assert!(
        key <= PER_KEY,
        "{key} tasks of one key were started at one instant, cap {PER_KEY}"
    );
    assert_eq!(
        queue, QUEUE,
        "the race never filled the queue: it tested nothing"
    );
}

#[tokio::test]
async fn a_key_with_one_task_starts_at_the_next_free_slot_whatever_the_backlog() {
    let db = TestDb::new().await;
    enqueue_keyed(&db, "fair", Some("big-a"), 200).await;
    enqueue_keyed(&db, "fair", Some("big-b"), 200).await;
    limit(
        &db,
        "fair",
        QueueLimits {
            max_started: Some(2),
            ..Default::default()
        },
    )
    .await;
    let mut running = claim_up_to(&db, "fair", "w", 2).await;
    assert_eq!(keys(&running), ["big-a", "big-b"], "one of each key first");
    let small = enqueue_keyed(&db, "fair", Some("small"), 1).await.remove(0);
    // Each freed slot goes to the key with the fewest started: after at most
    // two ends (a tie with the key that just freed one is decided by age),
    // the small key's task runs, while 396 others wait.
    let mut started_small = false;
    for _ in 0..2 {
        let done = running.remove(0);
        finish(&db, &done).await;
        let got = claim_up_to(&db, "fair", "w", 1).await;
        assert_eq!(got.len(), 1);
        started_small |= got[0].id == small.id;
        running.extend(got);
        if started_small {
            break;
        }
    }
    assert!(started_small, "the small key waited behind the backlog");
    // Within a key, priority still orders.
    let db = TestDb::new().await;
    let tasks = vec![
        NewTask::new("note", json!({}))
            .queue("p")
            .concurrency_key("k")
            .priority(5),
        NewTask::new("note", json!({}))
            .queue("p")
            .concurrency_key("k")
            .priority(-5),
    ];
    let added = store::enqueue_many(&mut db.pool.acquire().await.unwrap(), &schema(), &tasks)
        .await
        .unwrap();
    limit(
        &db,
        "p",
        QueueLimits {
            max_started_per_key: Some(1),
            ..Default::default()
        },
    )
    .await;
    let got = claim_up_to(&db, "p", "w", 2).await;
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].id,
        added[1].clone().into_task().id,
        "the urgent one first"
    );
}

/// Of keys with as many tasks started, the claim goes round-robin from
/// the queue's cursor (the key it last took), keyless tasks as one more
/// key: three slots freed at once over four groups serve each group three
/// times in four claims. Ordered by key alone, `c` would never run; by
/// age alone (it was enqueued first), only `c` and the next two would.
#[tokio::test]
async fn keys_of_equal_turn_take_free_slots_round_robin() {
    let db = TestDb::new().await;
    for key in [Some("c"), Some("b"), Some("a"), None] {
        enqueue_keyed(&db, "rr", key, 10).await;
    }
    limit(
        &db,
        "rr",
        QueueLimits {
            max_started: Some(3),
            ..Default::default()
        },
    )
    .await;
    let mut served = Vec::new();
    for _ in 0..4 {
        let got = claim_up_to(&db, "rr", "w", 3).await;
        served.push(keys(&got));
        for task in &got {
            finish(&db, task).await;
        }
    }
    assert_eq!(
        served,
        [
            vec!["", "a", "b"],
            vec!["", "a", "c"],
            vec!["", "b", "c"],
            vec!["a", "b", "c"]
        ],
        "claims of three slots over four groups of equal turn"
    );
    let cursor: Option<String> =
        sqlx::query_scalar("SELECT served_key FROM queues WHERE name = 'rr'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(cursor.as_deref(), Some("c"), "the last key served");
}

/// A claim the limits cut short says it was held back (and its runtime
/// asks again within milliseconds) only when due tasks of the kinds it
/// claims wait: a claimer of another kind is answered "nothing" and polls.
#[tokio::test]
async fn a_claim_is_held_back_only_by_due_tasks_of_its_kinds() {
    let db = TestDb::new().await;
    let tasks = [
        NewTask::new("a", json!({})).queue("kq"),
        NewTask::new("a", json!({})).queue("kq"),
    ];
    store::enqueue_many(&mut db.pool.acquire().await.unwrap(), &schema(), &tasks)
        .await
        .unwrap();
    limit(
        &db,
        "kq",
        QueueLimits {
            max_started: Some(1),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(claim_up_to(&db, "kq", "w", 1).await.len(), 1);
    let claim_n = |kinds: Option<Vec<String>>, n: usize| claimed(&db, "kq", "x", n, kinds);
    let claim = |kinds| claim_n(kinds, 1);
    let of_a = claim(Some(vec!["a".into()])).await;
    assert!(
        of_a.tasks.is_empty() && of_a.deferred,
        "a due `a` waits: held back"
    );
    let any = claim(None).await;
    assert!(
        any.tasks.is_empty() && any.deferred,
        "a due task waits: held back"
    );
    let of_b = claim(Some(vec!["b".into()])).await;
    assert!(of_b.tasks.is_empty());
    assert!(!of_b.deferred, "no `b` waits: nothing held back");
    // A claim that took some and was cut short tells from its own scans.
    store::enqueue_many(&mut db.pool.acquire().await.unwrap(), &schema(), &tasks)
        .await
        .unwrap();
    let two = QueueLimits {
        max_started: Some(2),
        ..Default::default()
    };
    limit(&db, "kq", two).await;
    let some = claim_n(Some(vec!["a".into()]), 3).await;
    assert_eq!(some.tasks.len(), 1, "one slot free");
    assert!(some.deferred, "two `a` left due: held back");
    let ten = QueueLimits {
        max_started: Some(10),
        ..Default::default()
    };
    limit(&db, "kq", ten).await;
    let rest = claim_n(Some(vec!["a".into()]), 5).await;
    assert_eq!(rest.tasks.len(), 2, "the rest");
    assert!(!rest.deferred, "none left: nothing held back");
}

/// A keyed claim tells from its own statement whether a key's cap held a
/// due task back: a key cut short by its cap, or at its cap, with a due
/// task waiting is held back; one whose only task left is not due yet is
/// not, whether the key has a free slot or none.
#[tokio::test]
async fn a_keyed_claim_is_held_back_only_by_due_tasks_of_keys_at_their_cap() {
    let db = TestDb::new().await;
    let hour = std::time::Duration::from_secs(3600);
    let keyed = |key: &str| {
        NewTask::new("note", json!({}))
            .queue("hk")
            .concurrency_key(key)
    };
    let tasks = [
        keyed("a"),
        keyed("a"),
        keyed("b"),
        keyed("c"),
        keyed("c").delay(hour),
    ];
    store::enqueue_many(&mut db.pool.acquire().await.unwrap(), &schema(), &tasks)
        .await
        .unwrap();
    limit(
        &db,
        "hk",
        QueueLimits {
            max_started_per_key: Some(1),
            ..Default::default()
        },
    )
    .await;
    let claim = || claimed(&db, "hk", "x", 5, None);
    let first = claim().await;
    let mut keys: Vec<_> = first
        .tasks
        .iter()
        .map(|t| t.concurrency_key.clone().unwrap_or_default())
        .collect();
    keys.sort();
    assert_eq!(keys, ["a", "b", "c"], "one of each key");
    assert!(
        first.deferred,
        "a's second task is due: held back by a's cap"
    );
    let second = claim().await;
    assert!(second.tasks.is_empty(), "every key at its cap");
    assert!(second.deferred, "a's second task still waits");
    // Key `a` done: what is left is c's task of an hour from now.
    let a = first
        .tasks
        .iter()
        .find(|t| t.concurrency_key.as_deref() == Some("a"))
        .unwrap();
    finish(&db, a).await;
    let third = claim().await;
    assert_eq!(third.tasks.len(), 1, "a's second task");
    assert!(
        !third.deferred,
        "c is at its cap, but its task left is not due: nothing held back"
    );
    let fourth = claim().await;
    assert!(fourth.tasks.is_empty());
    assert!(!fourth.deferred, "nothing due anywhere");
}

#[tokio::test]
async fn the_rate_is_shared_by_every_claimer_and_refills_with_time() {
    let db = TestDb::new().await;
    enqueue_keyed(&db, "api", None, 500).await;
    limit(
        &db,
        "api",
        QueueLimits {
            rate_per_second: Some(20.0),
            rate_burst: Some(5),
            ..Default::default()
        },
    )
    .await;
    // The bucket starts full: the burst, then nothing.
    assert_eq!(claim_up_to(&db, "api", "a", 50).await.len(), 5);
    assert!(claim_up_to(&db, "api", "b", 50).await.len() <= 1);
    // Four claimers hammering for 1.5 s take at most burst + rate x t.
    let started = std::time::Instant::now();
    let mut claimers = Vec::new();
    for c in 0..4 {
        let pool = db.pool.clone();
        claimers.push(tokio::spawn(async move {
            let mut n = 0;
            while started.elapsed() < Duration::from_millis(1500) {
                let mut conn = pool.acquire().await.unwrap();
                n += store::claim_for(
                    &mut conn,
                    &schema(),
                    &vec![holder(&format!("h{c}")); 10],
                    TTL,
                    &ClaimFilter::queue("api"),
                )
                .await
                .unwrap()
                .tasks
                .len();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            n
        }));
    }
    let mut total = 0;
    for c in claimers {
        total += c.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    // Since the bucket was emptied: at most 1 + 20 x t (and it did refill).
    assert!(
        total as f64 <= 1.0 + 20.0 * secs + 1.0,
        "{total} claims in {secs:.2} s"
    );
    assert!(total >= 20, "only {total} claims in {secs:.2} s at 20/s");
    // The window test from the claims' own times, every window from a claim.
    let worst: f64 = sqlx::query_scalar(
        "SELECT max((SELECT count(*) FROM tasks c
                      WHERE c.queue = 'api' AND c.started_at BETWEEN a.started_at AND b.started_at)
                    - 20 * EXTRACT(EPOCH FROM (b.started_at - a.started_at))::float8)
           FROM tasks a JOIN tasks b ON b.started_at >= a.started_at
          WHERE a.queue = 'api' AND b.queue = 'api'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        worst <= 5.0 + 1e-6,
        "a window held {worst} claims over the rate's allowance (burst 5)"
    );
}

#[tokio::test]
async fn a_late_task_of_a_limited_queue_is_taken_over_and_keeps_its_slot() {
    let db = TestDb::new().await;
    enqueue_keyed(&db, "t", Some("k"), 3).await;
    limit(
        &db,
        "t",
        QueueLimits {
            max_started_per_key: Some(1),
            ..Default::default()
        },
    )
    .await;
    let mut conn = db.pool.acquire().await.unwrap();
    let filter = ClaimFilter::queue("t");
    let first = store::claim_next_in(
        &mut conn,
        &schema(),
        &holder("old"),
        Duration::from_millis(200),
        &filter,
    )
    .await
    .unwrap()
    .unwrap();
    assert!(
        store::claim_next_in(&mut conn, &schema(), &holder("new"), TTL, &filter)
            .await
            .unwrap()
            .is_none()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let taken = store::claim_next_in(&mut conn, &schema(), &holder("new"), TTL, &filter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        taken.id, first.id,
        "the late task is taken over, not a second task of the key"
    );
    assert!(taken.fencing_token > first.fencing_token);
    assert_eq!(started_by_key(&db, "t").await, [("k".into(), 1)]);
}

#[tokio::test]
async fn limits_set_or_cleared_between_claims_take_effect_at_the_next_claim() {
    let db = TestDb::new().await;
    enqueue_keyed(&db, "s", Some("k"), 10).await;
    // Unlimited: this process learns the queue as unlimited.
    assert_eq!(claim_up_to(&db, "s", "a", 2).await.len(), 2);
    limit(
        &db,
        "s",
        QueueLimits {
            max_started_per_key: Some(3),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        claim_up_to(&db, "s", "a", 5).await.len(),
        1,
        "the new cap, at once"
    );
    // A paused limited queue gives nothing.
    let mut conn = db.pool.acquire().await.unwrap();
    queues::pause(&mut conn, &schema(), "s", "test")
        .await
        .unwrap();
    limit(
        &db,
        "s",
        QueueLimits {
            max_started_per_key: Some(10),
            ..Default::default()
        },
    )
    .await;
    assert!(claim_up_to(&db, "s", "a", 5).await.is_empty());
    queues::resume(&mut conn, &schema(), "s", "test")
        .await
        .unwrap();
    assert_eq!(claim_up_to(&db, "s", "a", 3).await.len(), 3);
    // Cleared: this process thought it limited; it claims as any queue.
    limit(&db, "s", QueueLimits::default()).await;
    assert_eq!(claim_up_to(&db, "s", "a", 10).await.len(), 4);
}

#[tokio::test]
async fn limits_are_checked_audited_once_and_shown_with_the_busiest_keys() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    for (bad, field) in [
        (
            QueueLimits {
                max_started: Some(0),
                ..Default::default()
            },
            "max_started",
        ),
        (
            QueueLimits {
                max_started_per_key: Some(100_001),
                ..Default::default()
            },
            "max_started_per_key",
        ),
        (
            QueueLimits {
                rate_per_second: Some(0.0),
                ..Default::default()
            },
            "rate_per_second",
        ),
        (
            QueueLimits {
                rate_per_second: Some(f64::NAN),
                ..Default::default()
            },
            "rate_per_second",
        ),
        (
            QueueLimits {
                rate_per_second: Some(1.0),
                rate_burst: Some(0),
                ..Default::default()
            },
            "rate_burst",
        ),
        (
            QueueLimits {
                rate_burst: Some(3),
                ..Default::default()
            },
            "rate_burst",
        ),
    ] {
        match queues::set_limits(&mut conn, &schema(), "x", &bad, "test").await {
            Err(QueueError::BadInput(e)) => assert!(e.starts_with(field), "{e} names {field}"),
            other => panic!("{bad:?} answered {other:?}"),
        }
    }
    assert!(
        queues::get(&mut conn, &schema(), "x")
            .await
            .unwrap()
            .is_none(),
        "nothing written"
    );
    let limits = QueueLimits {
        max_started: Some(100_000),
        max_started_per_key: Some(1),
        rate_per_second: Some(1_000_000.0),
        rate_burst: Some(1_000_000),
    };
    let q = queues::set_limits(&mut conn, &schema(), "x", &limits, "ops")
        .await
        .unwrap();
    assert_eq!(q.limits, limits);
    queues::set_limits(&mut conn, &schema(), "x", &limits, "ops")
        .await
        .unwrap();
    let audits: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM lease_events WHERE resource = 'queue:x' AND detail->>'action' = 'queue_limits'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(audits, 1, "an unchanged set is not audited again");
    drop(conn);
    enqueue_keyed(&db, "x", Some("a"), 1).await;
    enqueue_keyed(&db, "x", Some("b"), 1).await;
    claim_up_to(&db, "x", "w", 5).await;
    let q = queues::get(&mut db.pool.acquire().await.unwrap(), &schema(), "x")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(q.busiest_keys.len(), 2);
    assert!(q.busiest_keys.iter().all(|k| k.started == 1));
    // Seven keys started (one each, the cap): by name, at most
    // BUSIEST_KEYS shown.
    for key in ["c", "d", "e", "f", "g"] {
        enqueue_keyed(&db, "x", Some(key), 1).await;
    }
    claim_up_to(&db, "x", "w", 10).await;
    let q = queues::get(&mut db.pool.acquire().await.unwrap(), &schema(), "x")
        .await
        .unwrap()
        .unwrap();
    let shown: Vec<(&str, i64)> = q
        .busiest_keys
        .iter()
        .map(|k| (k.key.as_str(), k.started))
        .collect();
    assert_eq!(
        shown,
        [("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1)],
        "{} of the seven keys started",
        leasekeeper_core::queue::queue_limits::BUSIEST_KEYS
    );
    // Limits keep a queue's row from the retention's prune.
    let listed = queues::list(&mut db.pool.acquire().await.unwrap(), &schema())
        .await
        .unwrap();
    assert_eq!(listed[0].limits, limits);
}

/// Two runtimes prefetching from one limited queue: the handlers of a key
/// never run more than its cap at once, and the database never had more
/// started (prefetched claims waiting in a local queue count), across both
/// runtimes; every task runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_prefetching_runtimes_share_the_caps() {
    use leasekeeper_core::worker::handler::{Done, Job, TaskContext};
    use leasekeeper_core::worker::runtime::Runtime;
    use std::collections::HashMap;
    use std::sync::Mutex;
    let db = TestDb::with_connections(20).await;
    for k in 0..4 {
        enqueue_keyed(&db, "keyed", Some(&format!("tenant-{k}")), 15).await;
    }
    limit(
        &db,
        "keyed",
        QueueLimits {
            max_started_per_key: Some(2),
            max_started: Some(6),
            ..Default::default()
        },
    )
    .await;
    // Running handlers per key, the most of one key and the most in all.
    type Running = (HashMap<String, i64>, i64, i64);
    let running: Arc<Mutex<Running>> = Arc::default();
    let mut runtimes = Vec::new();
    for id in ["rt-a", "rt-b"] {
        let running = running.clone();
        let pool = db.pool.clone();
        let handler = move |job: Job, _ctx: TaskContext| {
            let running = running.clone();
            let pool = pool.clone();
            async move {
                let key: String =
                    sqlx::query_scalar("SELECT concurrency_key FROM tasks WHERE id = $1")
                        .bind(job.id)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                {
                    let mut r = running.lock().unwrap();
                    let n = r.0.entry(key.clone()).or_default();
                    *n += 1;
                    let n = *n;
                    r.1 = r.1.max(n);
                    let all: i64 = r.0.values().sum();
                    r.2 = r.2.max(all);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                *running.lock().unwrap().0.get_mut(&key).unwrap() -= 1;
                Ok(Done::output(json!({})))
            }
        };
        runtimes.push(
            Runtime::builder(db.pool.clone())
                .id(id)
                .queue("keyed", 5)
                .prefetch(3)
                .handler("note", handler)
                .start()
                .await
                .unwrap(),
        );
    }
    crate::common::until("every task processed", Duration::from_secs(60), || async {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status <> 'processed'")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        left == 0
    })
    .await;
    for rt in runtimes {
        rt.shutdown().await;
    }
    let (_, per_key, all) = running.lock().unwrap().clone();
    assert!(per_key <= 2, "{per_key} handlers of one key ran at once");
    assert!(all <= 6, "{all} handlers ran at once");
    let once: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts WHERE outcome = 'completed'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(once, 60, "each task completed once");
    // In the database, at each claim's instant (prefetched ones included).
    let (queue, key): (i64, i64) = sqlx::query_as(
        "SELECT max((SELECT count(*) FROM attempts o JOIN tasks ot ON ot.id = o.task_id
                      WHERE ot.queue = 'keyed' AND o.claimed_at <= a.claimed_at
                        AND coalesce(o.ended_at, 'infinity') > a.claimed_at)),
                max((SELECT count(*) FROM attempts o JOIN tasks ot ON ot.id = o.task_id
                      WHERE ot.queue = 'keyed' AND ot.concurrency_key = t.concurrency_key
                        AND o.claimed_at <= a.claimed_at
                        AND coalesce(o.ended_at, 'infinity') > a.claimed_at))
           FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE t.queue = 'keyed'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        queue <= 6 && key <= 2,
        "started at once: {queue} in the queue, {key} of a key"
    );
}

/// The limited claim writes its candidates into their rows by looking each
/// up by its key, however many tasks the table holds: the planner is told
/// the claim's size (a constant `LIMIT`). With the room's bound as a
/// computed `LIMIT` it guessed a thousand candidates and joined them by
/// reading the table from its first id (a sequential scan, or a merge join
/// over the whole primary key), a cost that grew with the table.
#[tokio::test]
async fn the_limited_claim_looks_its_candidates_up_by_key() {
    let db = TestDb::new().await;
    sqlx::query(
        "INSERT INTO tasks (kind, queue, task_data, concurrency_key)
         SELECT 'note', 'lq', '{}', 'k' || (g % 100) FROM generate_series(1, 60000) g",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    limit(
        &db,
        "lq",
        QueueLimits {
            max_started_per_key: Some(5),
            ..Default::default()
        },
    )
    .await;
    for table in ["tasks", "queues"] {
        sqlx::query(&format!("ANALYZE {table}"))
            .execute(&db.pool)
            .await
            .unwrap();
    }
    let plan = crate::common::explain(
        &db.pool,
        &store::sql::limited_claim(256, false),
        &[
            ("$1", "array_fill('w'::text, ARRAY[256])"),
            ("$2", "30000"),
            ("$3", "'lq'"),
        ],
    )
    .await;
    assert!(
        !plan.contains("Seq Scan on tasks") && !plan.contains("Merge Join"),
        "no read of the tasks table from its first id:\n{plan}"
    );
    assert!(
        plan.contains("Index Scan using tasks_pkey"),
        "each candidate by its key:\n{plan}"
    );
    // The plan the claim runs: made once for any queue and any size up to
    // the planned one (`sql::LOCK_LIMITED` asks for the generic plan).
    let generic = crate::common::explain_generic(
        &db.pool,
        &store::sql::limited_claim(200, false),
        &["text[]", "bigint", "text"],
        &["array_fill('w'::text, ARRAY[200])", "30000", "'lq'"],
    )
    .await;
    assert!(
        !generic.contains("Seq Scan on tasks") && !generic.contains("Merge Join"),
        "the generic plan reads no table from its first row either:\n{generic}"
    );
    assert!(
        generic.contains("Index Scan using tasks_pkey")
            && generic.contains("tasks_pending_key_idx"),
        "each key's candidates by the key's index, each candidate by its key:\n{generic}"
    );
}

//! Dead letters you can act on (issue 40): the failed tasks grouped by
//! kind, queue and error read alike (ids and numbers apart), and a group
//! retried at once, audited, leaving the other groups failed.

use crate::common::{TestDb, holder};
use leasekeeper_core::db::Schema;
use leasekeeper_core::queue::control::{self, TaskFilter};
use leasekeeper_core::queue::failed;
use leasekeeper_core::queue::store::{self, RetryPolicy};
use leasekeeper_core::queue::{NewTask, TaskStatus};
use serde_json::json;
use std::time::Duration;

/// A task of `kind` failed for good with `error`.
async fn failed_with(db: &TestDb, kind: &str, error: &str) -> i64 {
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    let t = store::enqueue(
        &mut conn,
        &schema,
        &NewTask::new(kind, json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    let c = store::claim_next(&mut conn, &schema, &holder("w"), Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.id, t.id);
    let f = store::fail(
        &mut conn,
        &schema,
        t.id,
        &holder("w"),
        c.fencing_token.unwrap(),
        error,
        RetryPolicy::default(),
    )
    .await
    .unwrap();
    assert_eq!(f.status, TaskStatus::Failed);
    t.id
}

#[tokio::test]
async fn failed_tasks_are_grouped_by_their_error_and_a_group_is_retried() {
    let db = TestDb::new().await;
    let mut timeouts = Vec::new();
    for n in [17, 4242, 9] {
        timeouts.push(
            failed_with(
                &db,
                "charge",
                &format!("timeout after {n} ms on order 5f2c9a7e-1b3d-4c5e-8f90-123456789abc"),
            )
            .await,
        );
    }
    let declined = failed_with(&db, "charge", "card declined").await;
    failed_with(
        &db,
        "email",
        "timeout after 3 ms on order 00000000-0000-0000-0000-000000000000",
    )
    .await;

    let mut conn = db.pool.acquire().await.unwrap();
    let groups = failed::summary(&mut conn, &Schema::default())
        .await
        .unwrap();
    assert_eq!(groups.len(), 3, "{groups:#?}");
    assert_eq!(groups[0].kind, "charge");
    assert_eq!(groups[0].count, 3);
    assert_eq!(
        groups[0].error_group,
        "timeout after <n> ms on order <uuid>"
    );
    assert!(
        groups[0]
            .example
            .as_deref()
            .unwrap()
            .starts_with("timeout after 9 ms")
    );
    assert!(groups[0].oldest <= groups[0].newest);
    assert!(groups.iter().any(|g| g.kind == "email" && g.count == 1));

    let retried = control::retry_matching(
        &db.pool,
        &Schema::default(),
        &TaskFilter {
            status: TaskStatus::Failed,
            kind: Some("charge".into()),
            queue: Some("default".into()),
            data: None,
            error_group: Some(groups[0].error_group.clone()),
        },
        "ops",
    )
    .await
    .unwrap();
    assert_eq!(retried, 3);
    for id in timeouts {
        let t = store::get(&mut conn, &Schema::default(), id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(t.status, TaskStatus::Pending);
    }
    let t = store::get(&mut conn, &Schema::default(), declined)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(t.status, TaskStatus::Failed, "another group stays failed");
    let after = failed::summary(&mut conn, &Schema::default())
        .await
        .unwrap();
    assert_eq!(after.len(), 2);
    let bad = control::retry_matching(
        &db.pool,
        &Schema::default(),
        &TaskFilter {
            status: TaskStatus::Failed,
            kind: None,
            queue: None,
            data: None,
            error_group: Some("nul\0".into()),
        },
        "ops",
    )
    .await;
    assert!(bad.is_err());
}

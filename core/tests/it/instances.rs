//! Instances: registration, heartbeat, clean stop, and death by silence,
//! all judged by the database clock.

use crate::common::TestDb;
use leasekeeper_core::instance::{Instance, Registration, alive_window, new_id, store};
use std::time::Duration;

const WINDOW: Duration = Duration::from_secs(3);

async fn list(db: &TestDb) -> Vec<Instance> {
    store::list(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        WINDOW,
    )
    .await
    .unwrap()
}

fn find<'a>(all: &'a [Instance], id: &str) -> &'a Instance {
    all.iter()
        .find(|i| i.id == id)
        .unwrap_or_else(|| panic!("{id} not listed in {all:?}"))
}

#[test]
fn ids_are_readable_and_unique_per_process() {
    let a = new_id(3010);
    assert!(
        a.starts_with("i-3010-") && a.len() == "i-3010-".len() + 4,
        "{a}"
    );
    let many: std::collections::HashSet<String> = (0..20).map(|_| new_id(3010)).collect();
    assert!(many.len() > 1, "random suffix");
    assert_eq!(
        alive_window(Duration::from_millis(500)),
        Duration::from_secs(2)
    );
}

#[tokio::test]
async fn registered_instances_are_alive_until_stopped_or_silent() {
    let db = TestDb::new().await;
    let a = Registration::start(
        db.pool.clone(),
        "i-1-aaaa".into(),
        "127.0.0.1:1",
        Duration::from_millis(200),
    )
    .await
    .unwrap();
    let b = Registration::start(
        db.pool.clone(),
        "i-2-bbbb".into(),
        "127.0.0.1:2",
        Duration::from_millis(200),
    )
    .await
    .unwrap();
    let all = list(&db).await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(find(&all, "i-1-aaaa").alive);
    assert_eq!(find(&all, "i-2-bbbb").address, "127.0.0.1:2");
    assert!(find(&all, "i-2-bbbb").alive);
    assert!(!find(&all, "i-2-bbbb").holds_generator);

    // The heartbeat moves last_seen_at forward.
    let first_seen = find(&all, "i-1-aaaa").last_seen_at;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let all = list(&db).await;
    assert!(find(&all, "i-1-aaaa").last_seen_at > first_seen, "{all:?}");

    // A clean stop: not alive any more, and the heartbeat does not revive it.
    b.shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let all = list(&db).await;
    let stopped = find(&all, "i-2-bbbb");
    assert!(!stopped.alive, "{stopped:?}");
    assert!(stopped.stopped_at.is_some());
    assert!(find(&all, "i-1-aaaa").alive);

    // A crash: the heartbeat stops, the row goes stale, then counts as dead.
    a.abort();
    sqlx::query(
        "UPDATE instances SET last_seen_at = now() - interval '10 seconds' WHERE id = 'i-1-aaaa'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let all = list(&db).await;
    let silent = find(&all, "i-1-aaaa");
    assert!(!silent.alive, "{silent:?}");
    assert!(silent.stopped_at.is_none());
    assert!(silent.last_seen_ms_ago >= 10_000, "{silent:?}");
}

async fn alive_within(conn: &mut sqlx::PgConnection, secs: u64) -> bool {
    store::list(conn, &Default::default(), Duration::from_secs(secs))
        .await
        .unwrap()[0]
        .alive
}

#[tokio::test]
async fn alive_is_judged_against_the_window() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    store::register(&mut conn, &Default::default(), "i-9-cccc", "h:9")
        .await
        .unwrap();
    sqlx::query("UPDATE instances SET last_seen_at = now() - interval '2 seconds'")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert!(alive_within(&mut conn, 3).await);
    assert!(!alive_within(&mut conn, 1).await);
    // A heartbeat makes it alive again; a stopped instance's heartbeat does nothing.
    assert!(
        store::heartbeat(&mut conn, &Default::default(), "i-9-cccc")
            .await
            .unwrap()
    );
    assert!(alive_within(&mut conn, 1).await);
    store::mark_stopped(&mut conn, &Default::default(), "i-9-cccc")
        .await
        .unwrap();
    assert!(
        !store::heartbeat(&mut conn, &Default::default(), "i-9-cccc")
            .await
            .unwrap()
    );
    assert!(!alive_within(&mut conn, 3).await);
}

//! The lease client: background renewal, the early step-down of `is_held`,
//! and the loss notification.

use crate::common::{TestDb, holder, resource};
use leasekeeper_core::lease::client::{LeaseClient, LeaseTiming};
use leasekeeper_core::lease::store;
use std::time::Duration;
use tokio::time::Instant;

fn timing(ttl_ms: u64) -> LeaseTiming {
    LeaseTiming::from_ttl(Duration::from_millis(ttl_ms))
}

#[tokio::test]
async fn renewal_keeps_the_lease_past_several_ttls() {
    let db = TestDb::new().await;
    let client = LeaseClient::new(db.pool.clone(), resource("r"), holder("a"), timing(600));
    let held = client.acquire().await.unwrap().expect("free lease");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(held.is_held());
    let lease = store::get_by_resource(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &resource("r"),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(lease.fencing_token, held.token());
    assert!(
        lease.renew_count >= 4,
        "renewed only {} times",
        lease.renew_count
    );
    assert!(lease.expires_in_ms > 0);

    // A second client for another holder cannot get it meanwhile.
    let rival = LeaseClient::new(db.pool.clone(), resource("r"), holder("b"), timing(600));
    assert!(rival.acquire().await.unwrap().is_none());

    assert!(held.release().await.unwrap());
    let lease = store::get_by_resource(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &resource("r"),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(lease.released_at.is_some());
    assert!(rival.acquire().await.unwrap().is_some());
}

#[tokio::test]
async fn is_held_turns_false_before_the_database_expires_the_lease() {
    let db = TestDb::new().await;
    // The client's own pool, which we close to cut it off from the database.
    let client_pool = db.pool(2).await;
    let client = LeaseClient::new(
        client_pool.clone(),
        resource("r"),
        holder("a"),
        timing(1000),
    );
    let held = client.acquire().await.unwrap().expect("free lease");
    let acquired = Instant::now();
    client_pool.close().await;

    while held.is_held() {
        assert!(
            acquired.elapsed() < Duration::from_secs(2),
            "never stepped down"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // At the moment the client stops trusting the lease, the database must
    // still consider it live: nobody else can have it yet.
    let live: bool =
        sqlx::query_scalar("SELECT expires_at > now() FROM leases WHERE resource = 'r'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        live,
        "the client trusted the lease after the database expired it"
    );
    let stepped_down_after = acquired.elapsed();
    assert!(
        stepped_down_after >= Duration::from_millis(850),
        "{stepped_down_after:?}"
    );
    tokio::time::timeout(Duration::from_millis(200), held.lost())
        .await
        .expect("loss is notified once the trust deadline passes");
}

#[tokio::test]
async fn losing_the_lease_to_a_takeover_is_notified() {
    let db = TestDb::new().await;
    let client = LeaseClient::new(db.pool.clone(), resource("r"), holder("a"), timing(900));
    let held = client.acquire().await.unwrap().expect("free lease");
    let lost = held.lost_token();
    // Simulate the holder having stalled past its TTL: the database lets it expire.
    sqlx::query("UPDATE leases SET expires_at = now() - interval '1 ms' WHERE resource = 'r'")
        .execute(&db.pool)
        .await
        .unwrap();
    let taken = store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &resource("r"),
        &holder("b"),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    assert_eq!(taken.lease().fencing_token, held.token() + 1);
    // The next renewal (within renew_interval = 300 ms, plus jitter) is refused.
    tokio::time::timeout(Duration::from_millis(600), lost.cancelled())
        .await
        .expect("loss notified after the refused renewal");
    assert!(!held.is_held());
    // Releasing a lost lease is not an error, and does not touch b's lease.
    assert!(!held.release().await.unwrap());
    let lease = store::get_by_resource(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &resource("r"),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(lease.holder.as_deref(), Some("b"));
    assert!(lease.released_at.is_none());
}

#[tokio::test]
async fn dropping_a_held_lease_stops_renewal_without_releasing() {
    let db = TestDb::new().await;
    let client = LeaseClient::new(db.pool.clone(), resource("r"), holder("a"), timing(500));
    let held = client.acquire().await.unwrap().expect("free lease");
    drop(held);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let lease = store::get_by_resource(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &resource("r"),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(lease.renew_count, 0);
    assert!(lease.released_at.is_none());
    assert_eq!(lease.state, leasekeeper_core::lease::LeaseState::Expired);
}

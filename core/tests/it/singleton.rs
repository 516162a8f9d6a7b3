//! The singleton driver against a real database: one worker at a time,
//! failover after a crash, and a clean stop that releases.

use crate::common::{TestDb, holder, resource};
use leasekeeper_core::lease::client::{LeaseClient, LeaseTiming};
use leasekeeper_core::lease::singleton::{Singleton, State, Work};
use leasekeeper_core::lease::store;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Work that records (holder, token) while it runs, and whether it overlapped another.
fn recording_work(
    name: &'static str,
    log: Arc<Mutex<Vec<(String, i64, bool)>>>,
    running: Arc<Mutex<Option<String>>>,
) -> Work {
    Arc::new(move |token, stop| {
        let log = log.clone();
        let running = running.clone();
        Box::pin(async move {
            let overlapped = {
                let mut r = running.lock().unwrap();
                let overlapped = r.is_some();
                *r = Some(name.to_string());
                overlapped
            };
            log.lock()
                .unwrap()
                .push((name.to_string(), token, overlapped));
            stop.cancelled().await;
            *running.lock().unwrap() = None;
        })
    })
}

async fn wait_for(s: &Singleton, state: State, within: Duration) {
    let mut w = s.watch_state();
    tokio::time::timeout(within, w.wait_for(|st| *st == state))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "state {state:?} not reached within {within:?}; now {:?}",
                s.state()
            )
        })
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_works_and_another_takes_over_after_a_crash() {
    let db = TestDb::new().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let running = Arc::new(Mutex::new(None));
    let timing = LeaseTiming::from_ttl(Duration::from_millis(900));
    let make = |name: &'static str| {
        let client = LeaseClient::new(
            db.pool.clone(),
            resource("singleton:test"),
            holder(name),
            timing,
        );
        Singleton::spawn(
            client,
            Duration::from_millis(200),
            recording_work(name, log.clone(), running.clone()),
        )
    };
    let a = make("a");
    a.start();
    wait_for(&a, State::Working, Duration::from_secs(2)).await;
    let b = make("b");
    b.start();
    wait_for(&b, State::Waiting, Duration::from_secs(2)).await;
    // a keeps renewing: b stays out for several TTLs.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    // b keeps retrying (waiting, and briefly acquiring) but never holds it.
    assert!(
        matches!(b.state(), State::Waiting | State::Acquiring),
        "{:?}",
        b.state()
    );
    assert_eq!(b.token(), None);
    assert!(matches!(a.state(), State::Working | State::Renewing));

    // Crash a: no release. Its work stops only because we emulate the process dying.
    let crashed_token = a.token().unwrap();
    a.abort();
    *running.lock().unwrap() = None;
    let crashed = tokio::time::Instant::now();
    wait_for(&b, State::Working, Duration::from_secs(3)).await;
    // Takeover needs the TTL to run out, then at most one retry pause.
    assert!(
        crashed.elapsed() <= Duration::from_millis(900 + 200 + 500),
        "{:?}",
        crashed.elapsed()
    );
    assert_eq!(b.token(), Some(crashed_token + 1));

    b.shutdown().await;
    let lease = store::get_by_resource(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &resource("singleton:test"),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(lease.released_at.is_some(), "a clean stop releases");
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(log.iter().all(|(_, _, overlapped)| !overlapped), "{log:?}");
}

#[tokio::test]
async fn stop_releases_and_start_acquires_again() {
    let db = TestDb::new().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let running = Arc::new(Mutex::new(None));
    let client = LeaseClient::new(
        db.pool.clone(),
        resource("singleton:x"),
        holder("a"),
        LeaseTiming::from_ttl(Duration::from_secs(5)),
    );
    let s = Singleton::spawn(
        client,
        Duration::from_millis(100),
        recording_work("a", log.clone(), running.clone()),
    );
    assert_eq!(s.state(), State::Idle);
    s.start();
    wait_for(&s, State::Working, Duration::from_secs(2)).await;
    s.stop();
    wait_for(&s, State::Idle, Duration::from_secs(2)).await;
    assert!(running.lock().unwrap().is_none(), "work stopped");
    let lease = store::get_by_resource(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &resource("singleton:x"),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(lease.released_at.is_some());
    s.start();
    wait_for(&s, State::Working, Duration::from_secs(2)).await;
    assert_eq!(s.token(), Some(2));
    s.shutdown().await;
}

#[tokio::test]
async fn a_lost_lease_pauses_the_work_then_waits() {
    let db = TestDb::new().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let running = Arc::new(Mutex::new(None));
    let client = LeaseClient::new(
        db.pool.clone(),
        resource("singleton:y"),
        holder("a"),
        LeaseTiming::from_ttl(Duration::from_millis(900)),
    );
    let s = Singleton::spawn(
        client,
        Duration::from_secs(30),
        recording_work("a", log.clone(), running.clone()),
    );
    s.start();
    wait_for(&s, State::Working, Duration::from_secs(2)).await;
    // Another holder takes the lease over behind a's back (as after a long pause).
    sqlx::query(
        "UPDATE leases SET expires_at = now() - interval '1 ms' WHERE resource = 'singleton:y'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &resource("singleton:y"),
        &holder("b"),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    wait_for(&s, State::Waiting, Duration::from_secs(2)).await;
    assert!(running.lock().unwrap().is_none(), "the work was paused");
    assert_eq!(s.token(), None);
    s.shutdown().await;
}

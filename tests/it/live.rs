//! Live updates: a change committed through one instance reaches another
//! instance's listener, and the event stream hands it to browsers.

use crate::api::Api;
use crate::common::{TestDb, holder};
use axum::body::Body;
use http_body_util::BodyExt;
use leasekeeper_core::generator::Desired;
use leasekeeper_core::generator::runtime as generator;
use leasekeeper_core::live::{LiveHub, Topics};
use leasekeeper_core::queue::store as tasks;
use serde_json::json;
use std::time::Duration;
use tokio::sync::broadcast::Receiver;

/// Waits up to `within` for an announcement containing `want`.
async fn expect_topic(rx: &mut Receiver<Topics>, want: Topics, within: Duration) {
    let got = tokio::time::timeout(within, async {
        loop {
            match rx.recv().await {
                Ok(t) if t.contains(want) => return,
                Ok(_) => continue,
                Err(e) => panic!("announcements stopped: {e}"),
            }
        }
    })
    .await;
    assert!(got.is_ok(), "no {want:?} announcement within {within:?}");
}

/// Proves the NOTIFY -> LISTEN path between two instances' pools. Every
/// announcer in this process forwards every store's announcements, so this
/// alone does not prove that `enqueue` announces; the two-instance
/// Playwright tests do (the browser's fallback poll is 5 s, the budget 1 s).
#[tokio::test]
async fn a_task_enqueued_through_one_instance_reaches_the_other() {
    let db = TestDb::new().await;
    // Two instances on one database, each with its own pool and hub.
    let a = LiveHub::start(db.pool(4).await);
    let b = LiveHub::start(db.pool(4).await);
    let mut seen_by_b = b.subscribe();
    // Both hubs first say "everything" when their LISTEN connection opens.
    expect_topic(&mut seen_by_b, Topics::ALL, Duration::from_secs(5)).await;

    let mut conn = db.pool.acquire().await.unwrap();
    tasks::enqueue(
        &mut conn,
        &Default::default(),
        &leasekeeper_core::queue::NewTask::new(
            leasekeeper_core::worker::simulated::KIND,
            json!({"sleep_duration_seconds": 1}),
        )
        .max_attempts(3),
    )
    .await
    .unwrap();
    expect_topic(&mut seen_by_b, Topics::TASKS, Duration::from_secs(1)).await;
    a.shutdown();
    b.shutdown();
}

#[tokio::test]
async fn generator_changes_are_announced_by_the_trigger_even_without_an_announcer() {
    let db = TestDb::new().await;
    let b = LiveHub::start(db.pool(2).await);
    let mut rx = b.subscribe();
    expect_topic(&mut rx, Topics::ALL, Duration::from_secs(5)).await;
    // A plain SQL connection, no announcer involved: the trigger announces.
    sqlx::query("UPDATE generator_state SET desired = 'running'")
        .execute(&db.pool)
        .await
        .unwrap();
    expect_topic(&mut rx, Topics::GENERATOR, Duration::from_secs(1)).await;
    let mut conn = db.pool.acquire().await.unwrap();
    let me = holder("i-live");
    generator::request(
        &mut conn,
        &Default::default(),
        Desired::Stopped,
        me.as_str(),
        None,
    )
    .await
    .unwrap();
    expect_topic(&mut rx, Topics::GENERATOR, Duration::from_secs(1)).await;
    b.shutdown();
}

#[tokio::test]
async fn a_rolled_back_change_is_not_announced_by_triggers() {
    let db = TestDb::new().await;
    let b = LiveHub::start(db.pool(2).await);
    let mut rx = b.subscribe();
    expect_topic(&mut rx, Topics::ALL, Duration::from_secs(5)).await;
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("UPDATE generator_state SET desired = 'running'")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let got = tokio::time::timeout(Duration::from_millis(500), async {
        loop {
            if let Ok(t) = rx.recv().await
                && t.contains(Topics::GENERATOR)
            {
                return;
            }
        }
    })
    .await;
    assert!(got.is_err(), "a rolled-back change was announced");
    b.shutdown();
}

/// The next SSE frame of `body` as text, within `within`.
async fn next_frame(body: &mut Body, within: Duration) -> String {
    let frame = tokio::time::timeout(within, body.frame())
        .await
        .expect("no event in time")
        .expect("stream ended")
        .expect("stream failed");
    String::from_utf8(frame.into_data().expect("a data frame").to_vec()).unwrap()
}

#[tokio::test]
async fn the_event_stream_says_ready_then_sends_only_the_topics_asked_for() {
    let api = Api::new().await;
    let resp = api.open("/api/events?topics=generator,tasks").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let ready = next_frame(&mut body, Duration::from_secs(2)).await;
    assert!(ready.contains("event: ready"), "{ready}");
    assert!(ready.contains("data: tasks,generator"), "{ready}");

    api.live.publish(Topics::LEASES);
    api.live.publish(Topics::GENERATOR | Topics::WORKERS);
    let change = next_frame(&mut body, Duration::from_secs(2)).await;
    assert!(change.contains("event: change"), "{change}");
    assert!(change.contains("data: generator\n"), "{change}");
}

#[tokio::test]
async fn a_burst_of_changes_reaches_a_browser_as_few_events() {
    let api = Api::new().await;
    let mut body = api.open("/api/events").await.into_body();
    next_frame(&mut body, Duration::from_secs(2)).await; // ready
    api.live.publish(Topics::TASKS);
    let first = next_frame(&mut body, Duration::from_secs(2)).await;
    assert!(first.contains("data: tasks\n"), "{first}");
    // 500 changes within a few ms: gathered into one or two events.
    for i in 0..500 {
        api.live.publish(if i % 2 == 0 {
            Topics::LEASES
        } else {
            Topics::WORKERS
        });
    }
    let second = next_frame(&mut body, Duration::from_secs(2)).await;
    assert!(second.contains("data: leases,workers\n"), "{second}");
    api.live.shutdown();
    // After shutdown the stream ends, so a graceful stop need not wait.
    let end = tokio::time::timeout(Duration::from_secs(2), body.frame()).await;
    assert!(matches!(end, Ok(None)), "the stream did not end: {end:?}");
}

//! A request whose client goes away half-way still runs to its end
//! (`http::run_to_completion`): its transaction commits (or rolls back)
//! instead of being left open, holding row locks, on a pooled connection.

use crate::common::TestDb;
use axum::Router;
use axum::extract::State;
use axum::routing::post;
use sqlx::{Connection, PgPool};
use std::time::Duration;

async fn slow_write(State(pool): State<PgPool>) -> &'static str {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("UPDATE abandoned SET v = v + 1 WHERE id = 1")
        .execute(&mut *tx)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    tx.commit().await.unwrap();
    "done"
}

async fn serve(pool: PgPool) -> String {
    let app = Router::new()
        .route("/slow", post(slow_write))
        .layer(axum::middleware::from_fn(
            leasekeeper::http::run_to_completion,
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app.with_state(pool)).await });
    format!("http://{addr}/slow")
}

/// Sends the request, gives up after 100 ms (the client "dies"), then
/// answers whether the write committed and the row is free, 1.5 s later.
async fn abandon(db: &TestDb) -> (i32, bool) {
    let url = serve(db.pool.clone()).await;
    let client = reqwest::Client::new();
    let sent = client
        .post(&url)
        .timeout(Duration::from_millis(100))
        .send()
        .await;
    assert!(sent.is_err(), "the client gave up before the answer");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let v: i32 = sqlx::query_scalar("SELECT v FROM abandoned WHERE id = 1")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    // Another connection that must not find the row locked.
    let mut other = sqlx::PgConnection::connect_with(&db.options).await.unwrap();
    let free = sqlx::query("SELECT 1 FROM abandoned WHERE id = 1 FOR UPDATE NOWAIT")
        .execute(&mut other)
        .await
        .is_ok();
    (v, free)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_request_still_commits_and_frees_its_rows() {
    let db = TestDb::with_connections(4).await;
    sqlx::query("CREATE TABLE abandoned (id int PRIMARY KEY, v int NOT NULL)")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO abandoned VALUES (1, 0)")
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(abandon(&db).await, (1, true));
}

//! Test harness: a real PostgreSQL server and a fresh database per test,
//! from the library's harness (`leasekeeper_core::db::testing`, shared with
//! its doc-tests and both crates' integration tests): the server is
//! `LEASEKEEPER_TEST_DATABASE_URL` when set, otherwise the embedded cluster
//! in `target/leasekeeper-test-db`, started on first use and left running.

pub use leasekeeper_core::db::testing::{TestDb, event_kinds, holder, resource};

/// Waits up to `within` for `check` to hold, polling every 25 ms; panics
/// naming `what` when it does not.
pub async fn until<F, Fut>(what: &str, within: std::time::Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    while !check().await {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

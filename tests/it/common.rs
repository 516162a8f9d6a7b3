//! Test harness: a real PostgreSQL server and a fresh database per test.
//!
//! The databases come from the library's harness
//! (`leasekeeper_core::db::testing`, shared with its doc-tests): the server
//! is `LEASEKEEPER_TEST_DATABASE_URL` when set (any superuser URL, e.g. a
//! local server for a quick inner loop); otherwise the embedded cluster in
//! `target/leasekeeper-test-db`, started on first use and left running for
//! the next run (`leasekeeper db stop --data-dir ...` stops it). Databases
//! are cloned from a template migrated once per test process.

pub use leasekeeper::db::testing::TestDb;
use sqlx::PgPool;

/// Shorthand for a validated resource name.
pub fn resource(name: &str) -> leasekeeper::lease::Resource {
    leasekeeper::lease::Resource::parse(name).expect("valid resource")
}

/// Shorthand for a validated holder name.
pub fn holder(name: &str) -> leasekeeper::lease::Holder {
    leasekeeper::lease::Holder::parse(name).expect("valid holder")
}

/// The kinds of `resource`'s events in order, oldest first.
pub async fn event_kinds(pool: &PgPool, resource: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT kind FROM lease_events WHERE resource = $1 ORDER BY id")
        .bind(resource)
        .fetch_all(pool)
        .await
        .expect("reading lease events")
}

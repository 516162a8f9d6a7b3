//! Test harness: a real PostgreSQL server and a fresh database per test,
//! from the library's harness (`leasekeeper_core::db::testing`, shared with
//! its doc-tests and both crates' integration tests): the server is
//! `LEASEKEEPER_TEST_DATABASE_URL` when set, otherwise the embedded cluster
//! in `target/leasekeeper-test-db`, started on first use and left running.

pub use leasekeeper_core::db::testing::{TestDb, event_kinds, holder, resource};

//! The library's integration tests, in one binary (one link step). Each test
//! gets a fresh database cloned from a migrated template; see `common` for
//! where the PostgreSQL server comes from. `cargo test -p leasekeeper-core`
//! runs them; the dashboard's own tests (REST, pages, server) live in the
//! repository root's `tests/`.

mod assert_fence;
mod attempts;
mod batch;
mod bouncer;
mod cancel;
mod common;
mod dead_letters;
mod fenced;
mod functions;
mod host;
mod import_circles;
mod instances;
mod lease_client;
mod lease_race;
mod lease_store;
mod liveness;
mod overview;
mod pooler;
mod prefetch;
mod queue_limits;
mod queues;
mod rescuer;
mod retention;
mod retry;
mod schedules;
mod search;
mod singleton;
mod task_limits;
mod task_store;
mod unique;
mod waits;
mod workflows;

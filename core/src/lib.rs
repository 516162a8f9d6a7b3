//! leasekeeper-core: time-bound leases in PostgreSQL, and a task queue whose
//! every claim is one.
//!
//! A *lease* is a row saying "holder owns resource until `expires_at`",
//! judged only by the database clock. Every acquisition gets a *fencing
//! token* that strictly increases per resource, and protected writes carry
//! it, so a holder that lost its lease (paused, partitioned, slow) has its
//! late writes refused by the database.
//!
//! - [`lease`]: the lease store (SQL), the lease client with automatic
//!   renewal, and the singleton state machine.
//! - [`queue`]: the task store: enqueue, claim (each claim a lease on
//!   `task:<id>`), heartbeat, complete, fail, retry with backoff.
//! - [`worker`]: the worker loop and its transports.
//! - [`instance`]: replicas registering themselves, so an operator sees them.
//! - [`db`]: the schema of its own (never `public`), the pool, migrations,
//!   and an embedded local PostgreSQL.
//!
//! Without default features only the plain data types are compiled (they
//! build for `wasm32`, which the dashboard's browser bundle uses).

pub mod generator;
pub mod instance;
pub mod lease;
pub mod live;
pub mod queue;
pub mod worker;

#[cfg(feature = "postgres")]
pub mod db;

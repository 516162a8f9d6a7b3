//! leasekeeper-core: time-bound leases in PostgreSQL, and a task queue whose
//! every claim is one.
//!
//! This is the library behind the leasekeeper dashboard, for services that
//! want leases, singletons and leased, fenced background work inside their
//! own process, on the PostgreSQL database they already have. It has no web
//! framework in its dependency tree: everything is plain async Rust over a
//! [`sqlx::PgPool`] or a connection.
//!
//! # The lease model
//!
//! A *lease* is a row saying "`holder` owns `resource` until `expires_at`".
//! Whether it is still owned is decided by the **database clock** alone
//! (`now()` inside the statement that acquires, renews or checks it), never
//! by the clock of the process that asks, so replicas whose clocks disagree
//! still agree on who holds what. A lease that is not renewed runs out, and
//! anyone may take it over: a crashed holder needs no clean-up.
//!
//! Every acquisition begins a new *term* and gets a **fencing token** that
//! strictly increases per resource (it survives releases and even deleted
//! rows). Protected writes carry the token and are refused unless it is the
//! current term's, so a holder that lost its lease without noticing (paused,
//! partitioned, slow) has its late writes refused by the database instead of
//! overwriting its successor's. Locally, a holder trusts its lease for less
//! time than the database grants it (measured on the monotonic clock from
//! before the request was sent, minus a safety margin), so it steps down
//! before anyone else can be granted the lease.
//!
//! The task queue is built on the same rules: claiming a task takes the
//! lease `task:<id>` in the same transaction, heartbeats renew it, and only
//! the processor holding the current claim, with its token and before its
//! deadline, may complete or fail the task; so each task completes at most
//! once, and a task whose processor died is taken over when its lease runs
//! out.
//!
//! # Modules
//!
//! - [`lease`]: the lease types and validated names; the lease store (the
//!   SQL: acquire, renew, release), the lease client that renews in the
//!   background and says whether the lease is still safe to act on, and the
//!   singleton (run one piece of work on exactly one replica, with failover).
//! - [`queue`]: the task types and the task store: enqueue, claim (a lease
//!   per claim), heartbeat, complete, fail, and retry with backoff; and the
//!   wake-up signal idle workers wait on.
//! - [`worker`]: what a service embeds: [`Runtime`] (queues with their own
//!   concurrency, handlers by task kind), the [`handler`](worker::handler)
//!   API (a task, a lease-lost signal, fenced transactional effects); the
//!   worker loop that claims, heartbeats and completes, over a transport
//!   (in-process over a pool, or over an instance's REST API), and the
//!   `workers` table it reports to.
//! - [`instance`]: replicas registering and heartbeating themselves, so an
//!   operator sees which are alive.
//! - [`generator`]: the table behind the dashboard's lease-guarded task
//!   generator (whether it should run, and its fenced inserts).
//! - [`live`]: change announcements on a PostgreSQL channel, batched, so
//!   listeners (the dashboard, idle workers) hear about changes at once.
//! - [`schedule`]: cron-declared periodic tasks, each tick fired once by
//!   the holder of `singleton:scheduler`, fenced, with a catch-up policy
//!   for ticks missed while nobody led.
//! - [`maintenance`]: retention, on one replica (a singleton): deletes
//!   finished tasks with their leases and history, old history and dead
//!   instances/workers, in small batches that never hold up a claim.
//! - [`db`]: the schema of its own (never `public`), the connection pool
//!   and the migrations (safe from many replicas at once), and an embedded
//!   local PostgreSQL cluster for when no database URL is given.
//!
//! The examples in these docs run against a real PostgreSQL server, each on
//! a fresh, migrated database of its own.
//!
//! # Feature flags
//!
//! - `postgres` (default): everything that touches the database or the async
//!   runtime: the stores, the lease client, the singleton, the worker loop,
//!   change announcements, the pool, migrations and the embedded cluster
//!   (sqlx, tokio). Without it only the plain data types (leases, tasks,
//!   workers, instances and their states, with serde) are compiled; they
//!   build for `wasm32`, which the dashboard's browser bundle uses.
//! - `http-client` (implies `postgres`): the worker transport that talks to
//!   a leasekeeper instance over its REST API instead of to the database
//!   (reqwest, with rustls for `https://`), for workers in separate
//!   processes. When the instance is locked (`LEASEKEEPER_WORKER_TOKEN` or
//!   `LEASEKEEPER_ADMIN_TOKEN` set), give the transport the worker token
//!   with `worker::http::Http::with_token`; a refused credential (401/403)
//!   stops the worker loop with `worker::run::Exit::Unauthorized` instead
//!   of retrying.

#![deny(missing_docs)]

pub mod counts;
pub mod generator;
pub mod instance;
pub mod json;
pub mod lease;
pub mod live;
#[cfg(feature = "postgres")]
pub mod liveness;
pub mod paging;
pub mod queue;
pub mod schedule;
pub mod worker;
pub mod workflow;

mod text;

#[cfg(feature = "postgres")]
pub mod db;
#[cfg(feature = "postgres")]
pub mod maintenance;
#[cfg(feature = "postgres")]
pub mod metrics;
#[cfg(feature = "postgres")]
pub mod session;

// The items a service uses most, at the crate's root.
#[cfg(feature = "postgres")]
pub use db::Schema;
#[cfg(feature = "postgres")]
pub use lease::client::LeaseTiming;
#[cfg(feature = "postgres")]
pub use queue::store::{
    Enqueued, FencedTransaction, RetryPolicy, enqueue, enqueue_many, enqueue_outcome,
};
pub use queue::{NewTask, Task, Unique, UniqueScope};
pub use schedule::{CatchUp, NewSchedule};
#[cfg(feature = "postgres")]
pub use worker::batch::{Batching, Prefetch};
#[cfg(feature = "postgres")]
pub use worker::handler::{Done, HandlerError, HandlerResult, Job, TaskContext};
#[cfg(feature = "postgres")]
pub use worker::runtime::Runtime;

/// The Rust examples of the README and of the guides under `docs/`,
/// compiled as doc-tests so they stay true. A guide that gains Rust code
/// gets its line here. The files lie outside this crate's package, so they
/// are read only when doc-tests are collected (`cfg(doctest)`), never by a
/// build of the packaged crate.
#[cfg(doctest)]
pub mod guides {
    /// `README.md`: embedding in twenty-five lines.
    #[doc = include_str!("../../README.md")]
    pub struct Readme;

    /// `docs/embedding.md`: the runtime in full, schedules.
    #[doc = include_str!("../../docs/embedding.md")]
    pub struct Embedding;

    /// `docs/operations.md`: behind a connection pooler.
    #[doc = include_str!("../../docs/operations.md")]
    pub struct Operations;
}

//! The lease-guarded task generator: inserts a task every interval, on
//! exactly one instance at a time.
//!
//! Whether it should run is the one row of `generator_state` (`desired`),
//! so any instance can start or stop it and every instance reports the same.
//! Who actually runs it is decided by the `singleton:generator` lease: every
//! instance runs the singleton state machine for it while `desired` is
//! `running` and stops it (releasing the lease if held) while it is
//! `stopped`. When the holder dies, the lease expires and another instance
//! takes the generator over, with no operator action.
//!
//! Every insert is fenced twice: locally (only while the term's lease is
//! still trusted, see [`HeldTerm::is_held`](crate::lease::singleton::HeldTerm::is_held))
//! and in the database (only while the lease row still names this instance
//! with this term's fencing token, see [`store::insert_task`]). Each task
//! records the term that produced it (`generator`, `generator_token`).
//!
//! This module holds the types the server and the browser share, the SQL
//! ([`store`]) and the per-instance runtime ([`runtime`]), a
//! [`Singleton`](crate::lease::singleton::Singleton) job like the library's
//! [maintenance](crate::maintenance).

#[cfg(feature = "postgres")]
pub mod runtime;
#[cfg(feature = "postgres")]
pub mod store;

use crate::text::text_enum;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The lease resource that decides which instance runs the generator.
pub const RESOURCE: &str = "singleton:generator";

text_enum! {
    stored;
    /// Whether the generator should run (the operator's wish, not who runs it).
    pub enum Desired {
        /// Some instance should hold the lease and generate tasks.
        Running = "running",
        /// Nobody should; the holder releases the lease.
        Stopped = "stopped",
    }
}

/// The generator as `GET /api/generator/status` shows it.
///
/// Everything but `answered_by` and `local_state` comes from the database
/// (the desired state and the live `singleton:generator` lease), so every
/// instance gives the same answer. The lease fields are null while nobody
/// holds a live lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GeneratorStatus {
    /// Whether it should run.
    pub desired: Desired,
    /// When `desired` last changed hands.
    pub updated_at: DateTime<Utc>,
    /// The instance that last set `desired`.
    pub updated_by: Option<String>,
    /// The instance holding the live lease, if any.
    pub holder: Option<String>,
    /// The fencing token of the holder's term.
    pub fencing_token: Option<i64>,
    /// When the holder's lease runs out unless renewed.
    pub expires_at: Option<DateTime<Utc>>,
    /// Milliseconds until then, by the database clock at read time.
    pub expires_in_ms: Option<i64>,
    /// The instance that answered.
    #[cfg_attr(feature = "postgres", sqlx(skip))]
    pub answered_by: Option<String>,
    /// The answering instance's own singleton state (idle, acquiring,
    /// working, renewing, pausing, waiting, releasing); differs per instance.
    #[cfg_attr(feature = "postgres", sqlx(skip))]
    pub local_state: Option<String>,
}

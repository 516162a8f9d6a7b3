//! Instances: the running leasekeeper processes (replicas) sharing one database.
//!
//! Each process registers a row in `instances` at start-up, heartbeats its
//! `last_seen_at`, and sets `stopped_at` on a clean shutdown. Whether an
//! instance is alive is judged by the database clock, like a lease: a process
//! that was killed stops heartbeating and drops out after the alive window.
//!
//! This module holds the type the server and the browser share; the SQL
//! ([`store`]) and the heartbeat ([`Registration`]) are server-only.

#[cfg(feature = "postgres")]
pub mod store;

#[cfg(feature = "postgres")]
mod registration;

#[cfg(feature = "postgres")]
pub use registration::Registration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One instance as the API and the dashboard show it.
///
/// `alive` and `last_seen_ms_ago` are computed by the database at read time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Instance {
    /// Unique per process, e.g. `i-3010-5f2c`.
    pub id: String,
    /// The address it serves on, `host:port`.
    pub address: String,
    /// When it registered.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub last_seen_at: DateTime<Utc>,
    /// When it shut down cleanly, if it did.
    pub stopped_at: Option<DateTime<Utc>>,
    /// Not stopped, and seen within the alive window (database clock).
    pub alive: bool,
    /// Milliseconds since its last heartbeat, at read time.
    pub last_seen_ms_ago: i64,
    /// Whether it holds the live `singleton:generator` lease right now.
    pub holds_generator: bool,
    /// Its place in the order instances registered: the cursor the
    /// instances list pages by.
    pub seq: i64,
}

/// A fresh instance id: `i-<port>-<4 random hex digits>`. Readable in logs
/// and on the dashboard, and unique per process even when a port is reused.
#[cfg(feature = "postgres")]
pub fn new_id(port: u16) -> String {
    format!("i-{port}-{:04x}", rand::random::<u16>())
}

/// The ids of the instances in `instances` that are not alive (found dead,
/// or stopped): their simulated workers are gone with them (see
/// [`crate::worker::WorkerInfo::alive_given`]).
pub fn dead_ids(instances: &[Instance]) -> Vec<String> {
    instances
        .iter()
        .filter(|i| !i.alive)
        .map(|i| i.id.clone())
        .collect()
}

/// How long after its last heartbeat an instance still counts as alive: two
/// missed heartbeats and a second of slack, so one slow heartbeat does not
/// flap it to dead.
#[cfg(feature = "postgres")]
pub fn alive_window(heartbeat_interval: std::time::Duration) -> std::time::Duration {
    heartbeat_interval * 2 + std::time::Duration::from_secs(1)
}

//! Task workers: one worker loop, its two transports, and the `workers` table.
//!
//! A worker claims a task (taking its lease), works on it in one-second
//! ticks while heartbeating the lease on its own timer, and completes it with
//! the claim's fencing token. It abandons the work the moment the lease is
//! lost: a refused heartbeat, or its *local* deadline passing. The deadline
//! is measured on the monotonic clock from before the claim or heartbeat
//! request was sent, plus what the database said was left of the lease,
//! minus a safety margin; so it passes before the database could consider
//! the lease expired, whatever the process clocks say.
//!
//! The same loop ([`run::Worker`]) runs
//! - inside each instance, as simulated workers over the in-process
//!   transport ([`in_process::InProcess`]), managed by the dashboard's fleet,
//!   which can spawn, pause and kill them; and
//! - as a separate `leasekeeper worker --server URL` process over the REST
//!   API (`http::Http`, feature `http-client`; `http://` or `https://`,
//!   presenting the worker token), where `kill -9` is the real crash.
//!
//! This module holds the types the server and the browser share (a row of
//! the `workers` table); the loop itself is server-only.

#[cfg(feature = "postgres")]
pub mod batch;
#[cfg(feature = "postgres")]
pub mod chaos;
#[cfg(feature = "postgres")]
pub mod handler;
#[cfg(feature = "http-client")]
pub mod http;
#[cfg(feature = "postgres")]
pub mod in_process;
#[cfg(feature = "postgres")]
pub mod registry;
#[cfg(feature = "postgres")]
pub mod run;
#[cfg(feature = "postgres")]
pub mod runtime;
#[cfg(feature = "postgres")]
pub mod simulated;
#[cfg(feature = "postgres")]
pub mod transport;

use crate::text::text_enum;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

text_enum! {
    stored;
    /// What a worker is doing, as the `workers` table records it.
    ///
    /// - `idle`: polling for work.
    /// - `working`: holds the claim on `task_id` with `fencing_token`.
    /// - `paused`: frozen by an operator (no ticks, no heartbeats); it resumes by
    ///   trying to complete its task, which the fencing token then refuses if
    ///   the claim was taken over meanwhile.
    /// - `crashed`: stopped dead (chaos or a kill) without completing or
    ///   releasing anything; its lease runs out and another worker takes over.
    /// - `stopped`: shut down gracefully.
    pub enum WorkerState {
        /// Polling for work.
        Idle = "idle",
        /// Working on a claimed task.
        Working = "working",
        /// Frozen by an operator.
        Paused = "paused",
        /// Stopped dead, without a goodbye.
        Crashed = "crashed",
        /// Shut down gracefully.
        Stopped = "stopped",
    }
}

text_enum! {
    stored;
    /// Where a worker runs.
    pub enum WorkerKind {
        /// Inside an instance, over the in-process transport.
        Simulated = "simulated",
        /// A separate `leasekeeper worker` process, over the REST API.
        Http = "http",
        /// A worker of a service's own [`runtime::Runtime`]: in-process, doing
        /// the service's real work.
        Embedded = "embedded",
    }
}

/// One worker as the API and the dashboard show it. The ages and `alive`
/// are computed by the database at read time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkerInfo {
    /// `{instance_id}-w{n}` for simulated workers; `--id` or generated for processes.
    pub id: String,
    /// The instance running it (simulated workers only).
    pub instance_id: Option<String>,
    /// Simulated or a separate process.
    pub kind: WorkerKind,
    /// What it is doing.
    pub state: WorkerState,
    /// The task it holds (or held when it crashed).
    pub task_id: Option<i64>,
    /// The fencing token of that claim.
    pub fencing_token: Option<i64>,
    /// Its last accepted claim or heartbeat.
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// Its last report of any kind.
    pub last_seen_at: DateTime<Utc>,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Tasks it completed.
    pub tasks_done: i64,
    /// Tasks it gave up because its claim was lost (refused write or local deadline).
    pub tasks_abandoned: i64,
    /// Milliseconds since `last_heartbeat_at` at read time.
    pub heartbeat_age_ms: Option<i64>,
    /// Milliseconds since `last_seen_at` at read time.
    pub last_seen_age_ms: i64,
    /// Not crashed or stopped, and seen within two lease TTLs.
    pub alive: bool,
    /// Its place in the order workers were first recorded: the cursor
    /// the workers list pages by.
    pub seq: i64,
}

impl WorkerInfo {
    /// Whether it is alive, given the instances judged dead: a simulated
    /// worker dies with its instance, at once, not only when its own row
    /// goes stale.
    pub fn alive_given(&self, dead_instances: &[String]) -> bool {
        self.alive
            && !(self.kind == WorkerKind::Simulated
                && self
                    .instance_id
                    .as_ref()
                    .is_some_and(|i| dead_instances.contains(i)))
    }
}

/// What a worker tells the `workers` table about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Report {
    /// What it is doing.
    pub state: WorkerState,
    /// The task it holds, if any.
    #[serde(default, deserialize_with = "crate::json::opt_int")]
    pub task_id: Option<i64>,
    /// That claim's fencing token.
    #[serde(default, deserialize_with = "crate::json::opt_int")]
    pub fencing_token: Option<i64>,
    /// True when this report follows an accepted claim or heartbeat.
    #[serde(default)]
    pub heartbeat: bool,
    /// Tasks completed so far by this run.
    #[serde(default, deserialize_with = "crate::json::int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    pub tasks_done: i64,
    /// Tasks abandoned so far by this run.
    #[serde(default, deserialize_with = "crate::json::int")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    pub tasks_abandoned: i64,
    /// True for the first report of a run: it replaces whatever an earlier
    /// run under the same id left (even `crashed` or `stopped`).
    #[serde(default)]
    pub fresh: bool,
}

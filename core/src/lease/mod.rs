//! Leases: "holder owns resource until expires_at", judged by the database clock.
//!
//! This module holds the types the server and the browser share (a lease as
//! it travels in JSON, its state, the list filters, the validated names).
//! The server-only parts are the SQL store ([`store`]), the in-process lease
//! client with automatic renewal ([`client`]) and the singleton state machine
//! ([`singleton`]).

pub mod history;
pub mod names;

#[cfg(feature = "postgres")]
pub mod client;
#[cfg(feature = "postgres")]
pub mod fence;
#[cfg(feature = "postgres")]
pub mod singleton;
#[cfg(feature = "postgres")]
pub mod stopwatch;
#[cfg(feature = "postgres")]
pub mod store;

use crate::text::text_enum;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use names::{Holder, NAME_PATTERN, NameError, RESERVED_PREFIXES, Resource};

text_enum! {
    stored;
    /// Where a lease stands right now, by the database clock.
    ///
    /// - `active`: held; `released_at` is null and `expires_at` is in the future.
    /// - `expired`: the holder stopped renewing; anyone may take it over.
    /// - `released`: the holder gave it up; anyone may acquire it.
    pub enum LeaseState {
        /// Held and not yet expired.
        Active = "active",
        /// Past `expires_at` without a release.
        Expired = "expired",
        /// Released by its holder (or an operator).
        Released = "released",
    }
}

/// One lease row as the API and the dashboard show it.
///
/// `state` and `expires_in_ms` are computed by the database at read time, so
/// they agree with the clock that decides ownership; a negative
/// `expires_in_ms` says how long ago the lease ran out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Lease {
    /// Row id, stable for the life of the row.
    pub id: i64,
    /// The thing owned, e.g. `task:42` or `singleton:generator`.
    pub resource: String,
    /// Who holds (or last held) it.
    pub holder: Option<String>,
    /// When the row was first created.
    pub created_at: DateTime<Utc>,
    /// When the current term began (the last successful acquisition).
    pub acquired_at: DateTime<Utc>,
    /// When the current term was last renewed.
    pub renewed_at: Option<DateTime<Utc>>,
    /// When the holder released it, if it did.
    pub released_at: Option<DateTime<Utc>>,
    /// When the lease runs out unless renewed.
    pub expires_at: DateTime<Utc>,
    /// The TTL each acquisition or renewal grants, in milliseconds.
    pub ttl_ms: i64,
    /// Strictly increasing per resource with every successful acquisition.
    pub fencing_token: i64,
    /// Renewals in the current term.
    pub renew_count: i32,
    /// State by the database clock at read time.
    pub state: LeaseState,
    /// Milliseconds until expiry at read time (negative once expired).
    pub expires_in_ms: i64,
}

text_enum! {
    /// Which leases a list shows.
    #[derive(Default, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum LeaseFilter {
        /// Every lease.
        #[default]
        All = "all",
        /// Held and not expired.
        Active = "active",
        /// Ran out without a release.
        Expired = "expired",
        /// Renewed at least once in the current term.
        Renewed = "renewed",
        /// Released by the holder.
        Released = "released",
    }
}

/// One entry of a resource's ownership history (`lease_events`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LeaseEvent {
    /// Position in the append-only history.
    pub id: i64,
    /// The resource the event concerns.
    pub resource: String,
    /// The holder the event concerns.
    pub holder: Option<String>,
    /// The fencing token of the term the event belongs to.
    pub fencing_token: Option<i64>,
    /// acquired, renewed, released, taken_over, session_ended (its holder's
    /// liveness was found gone and the term ended then: see
    /// [`crate::liveness`]), deleted, stale_write_refused or operator.
    pub kind: String,
    /// For a takeover, who held it before.
    pub previous_holder: Option<String>,
    /// The lease's expiry after the event.
    pub expires_at: Option<DateTime<Utc>>,
    /// Extra facts (e.g. the refused token of a stale write).
    pub detail: Option<serde_json::Value>,
    /// Database time of the event.
    pub at: DateTime<Utc>,
}

/// A lease with its recent history, for the detail view.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeaseDetail {
    /// The lease itself.
    pub lease: Lease,
    /// Its most recent events, newest first.
    pub history: Vec<LeaseEvent>,
}

/// One failover, as the stopwatch shows it: from a kill (or, for a silent
/// death, the old holder's last sign of life) to the first term with a
/// higher fencing token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
pub struct Failover {
    /// `killed` (from the dashboard) or `found_dead`.
    pub cause: String,
    /// The killed worker or instance (for a silent death, the old holder).
    pub subject: Option<String>,
    /// The lease that had to fail over.
    pub resource: String,
    /// Who held it.
    pub old_holder: Option<String>,
    /// The term that was cut short.
    pub old_token: Option<i64>,
    /// When the stopwatch started.
    pub started_at: DateTime<Utc>,
    /// When another holder's term began, if it has.
    pub taken_at: Option<DateTime<Utc>>,
    /// Who took over.
    pub new_holder: Option<String>,
    /// The new term's token.
    pub new_token: Option<i64>,
    /// How it ended without a takeover, when it did: `task failed` (the
    /// task ran out of attempts, so nobody took its lease) or
    /// `task cancelled`.
    pub ended: Option<String>,
    /// Which rule ended the old term, once taken over: `session` (its
    /// holder was found dead: its process's liveness session closed, its
    /// worker killed, its stream to the instance closed; see
    /// [`crate::liveness`]) or `ttl` (it ran out unrenewed: a pause, a
    /// partition, or a holder nothing vouched for).
    pub rule: Option<String>,
    /// Start to takeover, when taken over.
    pub elapsed_ms: Option<i64>,
    /// Start to now (database clock), for the running stopwatch.
    pub since_ms: i64,
}

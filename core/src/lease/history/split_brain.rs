//! The split-brain check: did two holders ever hold one resource at once?
//!
//! A lease term begins with an `acquired` or `taken_over` event carrying a
//! new fencing token. It overlaps the term before it when, at the moment it
//! began, that earlier term of another holder was still valid according to
//! its own last event: not released or deleted, and its last `expires_at`
//! (from its acquisition or latest renewal) later than the new term's start.
//! The acquire statement makes this impossible (`WHERE expires_at <= now()`
//! on the locked row), so any hit means a bug or a hand-made change.
//!
//! A task's claims are terms of `task:<id>` like any other (their events
//! are written by the tasks trigger, in the statement that claims, renews
//! or ends them), so they are checked the same way.
//!
//! Bounded: the check reads at most [`MAX_EVENTS`] of the newest events and
//! only those within [`WINDOW`], and looks each term start's predecessor up
//! by the `(resource, id)` index. The report says how far back it really
//! read.
//!
//! Known limit: a term's validity is taken from its events, so an
//! `UPDATE leases SET expires_at = ...` made by hand (which records no
//! event) followed by a takeover is reported as an overlap.

#[cfg(feature = "postgres")]
use crate::db::Schema;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
#[cfg(feature = "postgres")]
use sqlx::PgConnection;
use std::time::Duration;

/// Two live holders of one resource at the same moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Overlap {
    /// The resource held twice.
    pub resource: String,
    /// The holder whose term began while the other's was live.
    pub holder: Option<String>,
    /// That term's fencing token.
    pub fencing_token: Option<i64>,
    /// The holder whose term was still live.
    pub other_holder: Option<String>,
    /// That term's token.
    pub other_token: Option<i64>,
    /// When the two terms overlapped (the newer term's start).
    pub at: DateTime<Utc>,
    /// Until when the older term was still valid.
    pub other_expires_at: Option<DateTime<Utc>>,
    /// What saw it: `lease_events` (the one source since a task's claim is
    /// its task row; `tasks` named the comparison of a task row with its
    /// lease row, which no longer exists).
    pub source: String,
}

/// The result of the split-brain check.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SplitBrain {
    /// Every overlap found (empty: none seen).
    pub overlaps: Vec<Overlap>,
    /// The window checked, in seconds.
    pub window_secs: i64,
    /// How many events the check read (it reads at most a fixed number).
    pub events_checked: i64,
    /// How far back the check really reached, in seconds: the whole window,
    /// unless more events happened in it than one check reads.
    pub covered_secs: i64,
    /// Database time of the check.
    pub checked_at: Option<DateTime<Utc>>,
}

/// How far back the check looks.
pub const WINDOW: Duration = Duration::from_secs(10 * 60);
/// The most events one check reads (the newest ones).
pub const MAX_EVENTS: i64 = 50_000;
/// The most overlaps one check reports.
#[cfg(feature = "postgres")]
const MAX_OVERLAPS: i64 = 100;

/// Runs the check over the newest `max_events` events within `window`.
#[cfg(feature = "postgres")]
pub async fn check(
    conn: &mut PgConnection,
    schema: &Schema,
    window: Duration,
    max_events: i64,
) -> sqlx::Result<SplitBrain> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<SplitBrain>,
        async {
            let window_secs = window.as_secs_f64();
            // Bounded by id, not by a scan: ids grow with time, and the primary key
            // finds the newest max_events directly (gaps from rolled-back inserts
            // only make the batch smaller).
            // `cut`: whether an event older than the batch still lies within the
            // window (then the check covers less than the window, and says so).
            let (events_checked, oldest, cut, checked_at): (
            i64,
            Option<DateTime<Utc>>,
            bool,
            DateTime<Utc>,
        ) = schema
            .query_as(
                "WITH bound AS (SELECT coalesce(max(id), 0) - $2 AS id FROM $schema.lease_events)
                 SELECT count(*), min(at),
                        coalesce((SELECT e.at > now() - make_interval(secs => $1)
                                    FROM $schema.lease_events e WHERE e.id <= (SELECT id FROM bound)
                                   ORDER BY e.id DESC LIMIT 1), false),
                        now()::timestamptz(3)
                   FROM $schema.lease_events
                  WHERE id > (SELECT id FROM bound)
                    AND at > now() - make_interval(secs => $1)",
            )
            .bind(window_secs)
            .bind(max_events)
            .fetch_one(&mut *conn)
            .await?;
            let covered_secs = match oldest {
                Some(oldest) if cut => (checked_at - oldest).num_seconds(),
                _ => window.as_secs() as i64,
            };
            let overlaps: Vec<Overlap> = schema
                .query_as(
                    "SELECT s.resource, s.holder, s.fencing_token,
                    p.holder AS other_holder, p.fencing_token AS other_token,
                    s.at, p.expires_at AS other_expires_at, 'lease_events' AS source
               FROM $schema.lease_events s
              CROSS JOIN LATERAL (
                    SELECT e.holder, e.fencing_token, e.kind, e.expires_at
                      FROM $schema.lease_events e
                     WHERE e.resource = s.resource AND e.id < s.id
                       AND e.kind IN ('acquired', 'renewed', 'released', 'taken_over', 'deleted',
                                      'session_ended')
                     ORDER BY e.id DESC
                     LIMIT 1) p
              WHERE s.id > (SELECT coalesce(max(id), 0) FROM $schema.lease_events) - $2
                AND s.at > now() - make_interval(secs => $1)
                AND s.kind IN ('acquired', 'taken_over')
                AND p.fencing_token IS DISTINCT FROM s.fencing_token
                AND p.holder IS DISTINCT FROM s.holder
                AND p.kind NOT IN ('released', 'deleted')
                AND p.expires_at > s.at
              ORDER BY s.id DESC
              LIMIT $3",
                )
                .bind(window_secs)
                .bind(max_events)
                .bind(MAX_OVERLAPS)
                .fetch_all(&mut *conn)
                .await?;
            Ok(SplitBrain {
                overlaps,
                window_secs: window.as_secs() as i64,
                events_checked,
                covered_secs,
                checked_at: Some(checked_at),
            })
        }
        .await
    )
}

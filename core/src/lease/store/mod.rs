//! The lease store: acquiring, renewing, releasing and reading leases, and
//! their history in `lease_events`. (The queue claims and ends task leases
//! in its own statements, `queue::store`; retention deletes old rows,
//! `maintenance`.)
//!
//! Each statement that decides who owns what is a single statement whose
//! WHERE clause is re-checked by PostgreSQL on the newest row version under
//! the row lock (READ COMMITTED's re-evaluation for UPDATE and
//! `ON CONFLICT DO UPDATE`). That, and only the database clock (`now()`),
//! decides ownership; no process clock takes part. History rows in
//! `lease_events` are written by a trigger inside the same statement.
//!
//! Acquire, renew and release, by hand (the [`client`](super::client)
//! renews in the background for you):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pool = leasekeeper_core::db::testing::fresh_pool().await;
//! use leasekeeper_core::lease::store::{self, Acquired, LeaseError};
//! use leasekeeper_core::lease::{Holder, LeaseState, Resource};
//! use std::time::Duration;
//!
//! let mut conn = pool.acquire().await?;
//! let schema = leasekeeper_core::db::Schema::default(); // where the tables are
//! let report = Resource::parse("report:daily")?;
//! let (alice, bob) = (Holder::parse("alice")?, Holder::parse("bob")?);
//! let ttl = Duration::from_secs(30);
//!
//! // Alice acquires the free lease: a new term, fencing token 1.
//! let first = store::acquire(&mut conn, &schema, &report, &alice, ttl).await?;
//! assert!(matches!(first, Acquired::New(_)));
//! let token = first.lease().fencing_token;
//! assert_eq!(token, 1);
//!
//! // Bob is refused while Alice's lease is live.
//! match store::acquire(&mut conn, &schema, &report, &bob, ttl).await {
//!     Err(LeaseError::Held { holder, .. }) => assert_eq!(holder, "alice"),
//!     other => panic!("expected Held, got {other:?}"),
//! }
//!
//! // Alice renews her term (only the term with her token), then releases it.
//! let renewed = store::renew(&mut conn, &schema, &report, &alice, Some(token), None).await?;
//! assert_eq!(renewed.renew_count, 1);
//! let released = store::release(&mut conn, &schema, &report, &alice, Some(token)).await?;
//! assert_eq!(released.state, LeaseState::Released);
//!
//! // Bob gets it at once, in a new term with a higher token ...
//! let second = store::acquire(&mut conn, &schema, &report, &bob, ttl).await?.into_lease();
//! assert_eq!(second.fencing_token, 2);
//!
//! // ... and Alice's old term is over: her late renewal changes nothing.
//! let late = store::renew(&mut conn, &schema, &report, &alice, Some(token), None).await;
//! assert!(matches!(late, Err(LeaseError::NotFound(_))));
//! # Ok(())
//! # }
//! ```

use super::{Holder, Lease, Resource};
use crate::db::Schema;
use sqlx::PgConnection;
use std::time::Duration;

mod read;
pub use read::*;

/// Columns of a [`Lease`], with the state and time-to-expiry computed by the
/// database clock. Usable after `SELECT` and after `RETURNING`.
pub(crate) const LEASE_COLUMNS: &str = "id, resource, holder, created_at, acquired_at, \
    renewed_at, released_at, expires_at, ttl_ms, fencing_token, renew_count, \
    CASE WHEN released_at IS NOT NULL THEN 'released' \
         WHEN expires_at > now() THEN 'active' ELSE 'expired' END AS state, \
    (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::bigint AS expires_in_ms";

/// The longest TTL a lease may be granted: one day.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// How many times a statement is retried after a serialization failure
/// raised by the fencing-token guard (see the leases migration).
const SERIALIZATION_RETRIES: usize = 5;

/// Why a lease operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another holder has a live lease on the resource.
    #[error("{resource} is held by {holder} for another {expires_in_ms} ms")]
    Held {
        /// The contested resource.
        resource: String,
        /// Its current holder.
        holder: String,
        /// How long the current term still runs.
        expires_in_ms: i64,
    },
    /// No live lease of that holder on that resource (or no such lease at all).
    #[error("{0}")]
    NotFound(String),
    /// A TTL of zero or over [`MAX_TTL`].
    #[error("ttl must be more than 0 and at most {} seconds", MAX_TTL.as_secs())]
    BadTtl,
    /// The resource names a task's claim (`task:<id>`): its lease is the
    /// task row, taken by claiming the task (`queue::store::claim_next`),
    /// never through the lease store. A lease row of that name would be a
    /// second, unrelated term of the same name in the history.
    #[error("{0} is a task's claim: its lease is the task row; claim the task instead")]
    TaskClaim(String),
    /// The database failed.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

/// The result of a successful acquire.
#[derive(Debug, Clone, PartialEq)]
pub enum Acquired {
    /// A new term began: the lease was free, released or expired. Carries a new fencing token.
    New(Lease),
    /// The same holder already held it; nothing changed (acquire is idempotent).
    AlreadyHeld(Lease),
}

impl Acquired {
    /// The lease, whichever way it was obtained.
    pub fn lease(&self) -> &Lease {
        match self {
            Acquired::New(l) | Acquired::AlreadyHeld(l) => l,
        }
    }

    /// Consumes the outcome, returning the lease.
    pub fn into_lease(self) -> Lease {
        match self {
            Acquired::New(l) | Acquired::AlreadyHeld(l) => l,
        }
    }
}

pub(crate) fn ttl_ms(ttl: Duration) -> Result<i64, LeaseError> {
    if ttl.is_zero() || ttl > MAX_TTL {
        return Err(LeaseError::BadTtl);
    }
    // At least one millisecond: the column is in milliseconds.
    Ok(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1))
}

pub(crate) fn is_serialization_failure(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some("40001"))
}

/// Acquires `resource` for `holder` for `ttl`.
///
/// Succeeds when the lease is free, released or expired (a new term with the
/// next fencing token), or when `holder` already holds it (returned as is).
/// Fails with [`LeaseError::Held`] while another holder's lease is live,
/// and with [`LeaseError::TaskClaim`] for `task:<id>` (a task's claim is its
/// task row).
pub async fn acquire(
    conn: &mut PgConnection,
    schema: &Schema,
    resource: &Resource,
    holder: &Holder,
    ttl: Duration,
) -> Result<Acquired, LeaseError> {
    crate::db::atomically!(
        conn,
        schema,
        async {
            let _announced = crate::live::announce_on_return(crate::live::Topics::LEASES);
            let ttl_ms = ttl_ms(ttl)?;
            if resource.reserved_prefix() == Some("task:") {
                return Err(LeaseError::TaskClaim(resource.to_string()));
            }
            for attempt in 0.. {
                match try_acquire(&mut *conn, schema, resource, holder, ttl_ms).await {
                    Ok(Some(outcome)) => return Ok(outcome),
                    // The lease expired between our upsert and our read: try again.
                    Ok(None) => continue,
                    Err(LeaseError::Db(e))
                        if is_serialization_failure(&e) && attempt < SERIALIZATION_RETRIES =>
                    {
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            unreachable!("the loop only ends by returning")
        }
        .await
    )
}

async fn try_acquire(
    conn: &mut PgConnection,
    schema: &Schema,
    resource: &Resource,
    holder: &Holder,
    ttl_ms: i64,
) -> Result<Option<Acquired>, LeaseError> {
    crate::db::atomically!(conn, schema, async {
        // Race prevented: many acquirers of one resource at once, and an acquirer
        // racing the holder's renew. The unique index on `resource` makes
        // concurrent INSERTs conflict; ON CONFLICT DO UPDATE takes the row lock
        // and re-checks `expires_at <= now()` on the newest version, so exactly
        // one contender starts a new term (the others see the winner's live row
        // and update nothing), and a renew that committed first keeps the lease.
        // The token is the last issued + 1: from the live row when there is one,
        // else from lease_fencing (the row may have been deleted).
        // `prev` only reads, for the takeover metric: whether the term this
        // statement replaces ran out unreleased, and how long its holder had
        // been silent (the snapshot at the statement's start; it decides
        // nothing).
        let sql = format!(
            "WITH prev AS (
                SELECT released_at IS NULL AND expires_at <= now() AS lapsed,
                       (EXTRACT(EPOCH FROM (now() - COALESCE(renewed_at, acquired_at))) * 1000)::bigint AS silent_ms
                  FROM $schema.leases WHERE resource = $1
             )
             INSERT INTO $schema.leases AS l (resource, holder, acquired_at, expires_at, ttl_ms, fencing_token)
             VALUES ($1, $2, now(), now() + make_interval(secs => $3::float8 / 1000), $3,
                     COALESCE((SELECT f.last_token FROM $schema.lease_fencing f WHERE f.resource = $1), 0) + 1)
             ON CONFLICT (resource) DO UPDATE
                SET holder = EXCLUDED.holder,
                    acquired_at = now(),
                    renewed_at = NULL,
                    released_at = NULL,
                    expires_at = EXCLUDED.expires_at,
                    ttl_ms = EXCLUDED.ttl_ms,
                    renew_count = 0,
                    fencing_token = GREATEST(l.fencing_token, EXCLUDED.fencing_token - 1) + 1
              WHERE l.expires_at <= now()
             RETURNING {LEASE_COLUMNS}, (SELECT lapsed FROM prev) AS took_over,
                       (SELECT silent_ms FROM prev) AS silent_ms"
        );
        let won = schema
            .query(&sql)
            .bind(resource.as_str())
            .bind(holder.as_str())
            .bind(ttl_ms)
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(row) = won {
            use sqlx::Row;
            let lease = <Lease as sqlx::FromRow<_>>::from_row(&row)?;
            if row.try_get::<Option<bool>, _>("took_over")? == Some(true) {
                crate::metrics::took_over(row.try_get::<Option<i64>, _>("silent_ms")?.unwrap_or(0));
            }
            return Ok(Some(Acquired::New(lease)));
        }
        // Someone holds a live lease. If it is us, acquire is idempotent.
        let Some(current) = get_by_resource(&mut *conn, schema, resource).await? else {
            // Deleted in between: go round again.
            return Ok(None);
        };
        if current.state != super::LeaseState::Active {
            return Ok(None);
        }
        if current.holder.as_deref() == Some(holder.as_str()) {
            return Ok(Some(Acquired::AlreadyHeld(current)));
        }
        Err(LeaseError::Held {
            resource: current.resource,
            holder: current.holder.unwrap_or_default(),
            expires_in_ms: current.expires_in_ms,
        })
    }
    .await)
}

/// Extends `holder`'s live lease on `resource` by its TTL (or `ttl` when
/// given). When `token` is given, only the term with that fencing token is
/// renewed. Fails with [`LeaseError::NotFound`] when there is no such live
/// lease: an expired lease cannot be revived, it must be acquired again.
pub async fn renew(
    conn: &mut PgConnection,
    schema: &Schema,
    resource: &Resource,
    holder: &Holder,
    token: Option<i64>,
    ttl: Option<Duration>,
) -> Result<Lease, LeaseError> {
    crate::db::atomically!(
        conn,
        schema,
        async {
            let _announced = crate::live::announce_on_return(crate::live::Topics::LEASES);
            let ttl_ms = ttl.map(ttl_ms).transpose()?;
            // Race prevented: a renew racing a takeover of the same lease. UPDATE
            // locks the row and re-checks holder, token, release and expiry on the
            // newest version: if the takeover committed first the holder (and token)
            // no longer match and nothing is renewed; if the renew committed first
            // the lease is live again and the takeover's WHERE fails.
            let sql = format!(
                "UPDATE $schema.leases
                SET renewed_at = now(),
                    ttl_ms = COALESCE($4, ttl_ms),
                    expires_at = now() + make_interval(secs => COALESCE($4, ttl_ms)::float8 / 1000),
                    renew_count = renew_count + 1
              WHERE resource = $1 AND holder = $2
                AND ($3::bigint IS NULL OR fencing_token = $3)
                AND released_at IS NULL AND expires_at > now()
             RETURNING {LEASE_COLUMNS}"
            );
            let started = std::time::Instant::now();
            let renewed: Option<Lease> = schema
                .query_as(&sql)
                .bind(resource.as_str())
                .bind(holder.as_str())
                .bind(token)
                .bind(ttl_ms)
                .fetch_optional(&mut *conn)
                .await?;
            if renewed.is_some() {
                crate::metrics::renewed(started.elapsed(), 1);
            }
            renewed.ok_or_else(|| no_live_lease(resource, holder))
        }
        .await
    )
}

/// Releases `holder`'s live lease on `resource` now: `released_at` and
/// `expires_at` become the database's `now()`, so anyone may acquire it at
/// once. Fails with [`LeaseError::NotFound`] when there is no such live lease.
pub async fn release(
    conn: &mut PgConnection,
    schema: &Schema,
    resource: &Resource,
    holder: &Holder,
    token: Option<i64>,
) -> Result<Lease, LeaseError> {
    crate::db::atomically!(
        conn,
        schema,
        async {
            let _announced = crate::live::announce_on_return(crate::live::Topics::LEASES);
            // expires_at is truncated, not rounded, to the column's milliseconds, so
            // a released lease is free at once (rounding up could leave it "live"
            // for half a millisecond).
            // Race prevented: a late release by a holder whose lease already expired
            // and was taken over. The row lock and the re-checked WHERE make sure a
            // release only ends the caller's own live term, never the new holder's.
            let sql = format!(
                "UPDATE $schema.leases
                SET released_at = now(), expires_at = date_trunc('milliseconds', now())
              WHERE resource = $1 AND holder = $2
                AND ($3::bigint IS NULL OR fencing_token = $3)
                AND released_at IS NULL AND expires_at > now()
             RETURNING {LEASE_COLUMNS}"
            );
            let released: Option<Lease> = schema
                .query_as(&sql)
                .bind(resource.as_str())
                .bind(holder.as_str())
                .bind(token)
                .fetch_optional(&mut *conn)
                .await?;
            released.ok_or_else(|| no_live_lease(resource, holder))
        }
        .await
    )
}

/// Deletes lease row `id` if it names `resource` and `holder` (and, when
/// `token` is given, is still in term `token`). The fencing counter
/// survives in `lease_fencing`, so a later acquisition still gets a higher
/// token. Fails with [`LeaseError::NotFound`] otherwise.
pub async fn delete(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    resource: &Resource,
    holder: &Holder,
    token: Option<i64>,
) -> Result<Lease, LeaseError> {
    crate::db::atomically!(
        conn,
        schema,
        async {
            let _announced = crate::live::announce_on_return(crate::live::Topics::LEASES);
            // Races prevented: deleting a lease that was just taken over by someone
            // else, and (with a token) deleting a newer term the same holder began
            // since (a re-acquisition after its old term ended). DELETE re-checks
            // `holder` and `fencing_token` on the newest row version, so a row
            // whose holder or term changed under us is left alone.
            let sql = format!(
                "DELETE FROM $schema.leases WHERE id = $1 AND resource = $2 AND holder = $3
                AND ($4::bigint IS NULL OR fencing_token = $4)
             RETURNING {LEASE_COLUMNS}"
            );
            let deleted: Option<Lease> = schema
                .query_as(&sql)
                .bind(id)
                .bind(resource.as_str())
                .bind(holder.as_str())
                .bind(token)
                .fetch_optional(&mut *conn)
                .await?;
            deleted.ok_or_else(|| {
                LeaseError::NotFound(match token {
                    Some(t) => format!("no lease {id} on {resource} held by {holder} in term #{t}"),
                    None => format!("no lease {id} on {resource} held by {holder}"),
                })
            })
        }
        .await
    )
}

/// Writes an operator action (a kill, a force-release, a generator switch)
/// to `lease_events` as an `operator` row about `resource`: `by` is the
/// instance that carried it out, `detail` gets `action` and `by` added.
/// Call it in the transaction of the action, so the audit trail has exactly
/// the actions that happened.
pub async fn record_operator_action(
    conn: &mut PgConnection,
    schema: &Schema,
    resource: &str,
    by: &str,
    action: &str,
    detail: serde_json::Value,
) -> sqlx::Result<()> {
    crate::db::atomically!(conn, schema, async {
        let mut detail = match detail {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        detail.insert("action".into(), action.into());
        detail.insert("by".into(), by.into());
        schema.query(
            "INSERT INTO $schema.lease_events (resource, holder, kind, detail) VALUES ($1, $2, 'operator', $3)",
        )
        .bind(resource)
        .bind(by)
        .bind(serde_json::Value::Object(detail))
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
    .await)
}

/// The fenced check of a singleton's protected write: in the caller's
/// transaction, answers the database clock when `holder` still holds the
/// live lease on `resource` with fencing token `token`, and locks the lease
/// row (FOR SHARE) until that transaction ends. When it does not, answers
/// `None` and records the refusal (`stale_write_refused`, naming `op` and
/// who holds the lease now) in the same transaction; the caller commits
/// that and writes nothing.
///
/// Race prevented: two holders writing at once around a failover. The old
/// holder checked its lease locally, then stalls (GC pause, overloaded
/// host, slow network) past its lease's expiry; meanwhile another replica
/// takes the lease over and starts writing. Without this check the old
/// holder's write would land in the new term. With it, a takeover (an
/// UPDATE of the locked row) waits for the old holder's transaction to
/// commit, and if the takeover committed first, the row no longer matches
/// holder and token (READ COMMITTED re-reads the newest version under the
/// lock) and nothing is written. So every write of term N commits before
/// term N+1 begins. clock_timestamp(), not now(): now() is the
/// transaction's start, a little earlier.
pub async fn fence(
    conn: &mut PgConnection,
    schema: &Schema,
    resource: &str,
    holder: &Holder,
    token: i64,
    op: &str,
) -> sqlx::Result<Option<chrono::DateTime<chrono::Utc>>> {
    let live: Option<chrono::DateTime<chrono::Utc>> = schema
        .query_scalar(
            "SELECT clock_timestamp() FROM $schema.leases
              WHERE resource = $1 AND holder = $2 AND fencing_token = $3
                AND released_at IS NULL AND expires_at > clock_timestamp()
              FOR SHARE",
        )
        .bind(resource)
        .bind(holder.as_str())
        .bind(token)
        .fetch_optional(&mut *conn)
        .await?;
    if live.is_some() {
        return Ok(live);
    }
    let current: Option<(Option<String>, i64)> = schema
        .query_as(
            "SELECT holder, fencing_token FROM $schema.leases
              WHERE resource = $1 AND released_at IS NULL AND expires_at > now()",
        )
        .bind(resource)
        .fetch_optional(&mut *conn)
        .await?;
    let (current_holder, current_token) = current.unzip();
    schema
        .query(
            "INSERT INTO $schema.lease_events (resource, holder, fencing_token, kind, detail)
             VALUES ($1, $2, $3, 'stale_write_refused', $4)",
        )
        .bind(resource)
        .bind(holder.as_str())
        .bind(token)
        .bind(serde_json::json!({
            "op": op,
            "reason": format!("the lease on {resource} is not held with this token"),
            "current_holder": current_holder.flatten(),
            "current_token": current_token,
        }))
        .execute(&mut *conn)
        .await?;
    crate::metrics::refused(crate::metrics::Refused::Singleton);
    Ok(None)
}

fn no_live_lease(resource: &Resource, holder: &Holder) -> LeaseError {
    LeaseError::NotFound(format!("{holder} holds no live lease on {resource}"))
}

/// Ends the live term of lease `id` whose fencing token is `token` now,
/// whoever holds it (an operator's force-release). Answers the ended lease,
/// or `None` when that term is not live any more (it ended, or another term
/// began), and then nothing changes. Meant for a transaction with the
/// action's audit row, so it announces nothing: the caller announces
/// [`Topics::LEASES`](crate::live::Topics::LEASES) after its commit.
pub async fn force_release(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    token: i64,
) -> Result<Option<Lease>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<Lease>, sqlx::Error>,
        async {
            // Race prevented: releasing a term other than the one the operator saw.
            // The token in the WHERE (re-checked on the newest row version after any
            // concurrent renew or takeover commits) makes a release of term #7 a
            // no-op once #8 has begun; the holder's own renew, racing this, either
            // commits first (and we still end its term, same token) or finds the
            // lease released and steps down.
            schema
                .query_as(&format!(
                    "UPDATE $schema.leases
                SET released_at = now(), expires_at = date_trunc('milliseconds', now())
              WHERE id = $1 AND fencing_token = $2
                AND released_at IS NULL AND expires_at > now()
             RETURNING {LEASE_COLUMNS}"
                ))
                .bind(id)
                .bind(token)
                .fetch_optional(&mut *conn)
                .await
        }
        .await
    )
}

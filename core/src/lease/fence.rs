//! The fencing token for a host's own writes, the ones that never pass
//! through leasekeeper's completion.
//!
//! **In the database**: the SQL function `<schema>.assert_fence(resource,
//! token)` raises SQLSTATE [`STALE_FENCE_SQLSTATE`] (`LK001`) unless `token`
//! is the current, unexpired, unreleased term of `resource` by the database
//! clock, and locks that lease row until the caller's transaction ends, so
//! the term cannot end under the caller's writes. Call it first in any
//! transaction of the host's (a statement, a trigger, a function), from any
//! connection; [`assert_fence`] is the same call from Rust. A task's claim
//! is a lease on `task:<id>` ([`Job::resource`](crate::worker::handler::Job::resource))
//! with the token [`Job::fencing_token`](crate::worker::handler::Job::fencing_token);
//! a singleton's term is a lease on its resource with
//! [`HeldTerm::token`](crate::lease::singleton::HeldTerm::token).
//!
//! ```sql
//! BEGIN;
//! SELECT leasekeeper.assert_fence('task:42', 7);  -- raises LK001 once the term is over
//! INSERT INTO shop.shipments (order_id, token) VALUES (42, 7);
//! COMMIT;
//! ```
//!
//! The lock delays that lease's renewals and takeovers until the caller
//! commits: keep a fenced transaction short (well under a third of the TTL).
//! A refusal rolls the caller's transaction back, so, unlike a refused
//! completion, it leaves no `stale_write_refused` row in the history; it
//! is counted in `leasekeeper_stale_writes_refused_total` when it goes
//! through [`assert_fence`].
//!
//! **Outside the database** (an HTTP call, a file, a message), the receiver
//! fences: every request carries the resource and the token, and the
//! receiver keeps the highest token it has seen per resource, refusing
//! lower ones ([`TokenGate`], the whole recipe in a dozen lines). A term
//! that stalled past its lease and wakes up after its successor has spoken
//! is refused there. The receiver's memory of tokens must live as long as
//! the effects it guards (in its own database, in the same transaction as
//! the effect, when it restarts).

use crate::db::Schema;
use sqlx::PgConnection;
use std::collections::HashMap;

/// The SQLSTATE `assert_fence` raises for a stale token: class `LK`,
/// leasekeeper's own. Not class 40 (transaction rollback), on purpose: no
/// driver, pooler or retry loop should retry it, because the same token can
/// never pass again. Write nothing; the current holder will.
pub const STALE_FENCE_SQLSTATE: &str = "LK001";

/// True when `err` is `assert_fence`'s refusal (SQLSTATE
/// [`STALE_FENCE_SQLSTATE`]), from whatever statement raised it: a host's
/// own statement, trigger or function that called `assert_fence`.
pub fn is_stale_fence(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.code().as_deref() == Some(STALE_FENCE_SQLSTATE))
}

/// Why [`assert_fence`] refused.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// `token` is not the live term of the resource (expired, taken over,
    /// released, or never issued). The caller's transaction is aborted:
    /// roll it back and write nothing.
    #[error("{0}")]
    Stale(String),
    /// The database failed.
    #[error("database: {0}")]
    Db(sqlx::Error),
}

impl From<sqlx::Error> for FenceError {
    fn from(err: sqlx::Error) -> Self {
        if is_stale_fence(&err) {
            let message = match &err {
                sqlx::Error::Database(db) => db.message().to_string(),
                _ => err.to_string(),
            };
            FenceError::Stale(message)
        } else {
            FenceError::Db(err)
        }
    }
}

/// `SELECT <schema>.assert_fence(resource, token)` on `conn`, which should
/// be inside the caller's transaction (the lease row stays locked until it
/// ends; on a bare connection the lock ends with the statement, which only
/// tells whether the term was live a moment ago).
///
/// Race prevented: a stalled holder writing into its successor's term. The
/// check and the `FOR SHARE` row lock are one statement in the function
/// (see the migration `assert_fence`): a takeover waits for the caller's
/// commit, and a takeover that committed first makes the check fail.
pub async fn assert_fence(
    conn: &mut PgConnection,
    schema: &Schema,
    resource: &str,
    token: i64,
) -> Result<(), FenceError> {
    let checked = schema
        .query("SELECT $schema.assert_fence($1, $2)")
        .bind(resource)
        .bind(token)
        .execute(&mut *conn)
        .await;
    match checked {
        Ok(_) => Ok(()),
        Err(e) => {
            let err = FenceError::from(e);
            if matches!(err, FenceError::Stale(_)) {
                crate::metrics::refused(crate::metrics::Refused::AssertFence);
            }
            Err(err)
        }
    }
}

/// A receiver's fence for effects outside the database: remembers the
/// highest fencing token seen per resource and refuses lower ones. The
/// same token passes again (one term may retry its own request); a higher
/// one is a newer term and becomes the bar.
///
/// ```
/// use leasekeeper_core::lease::fence::TokenGate;
///
/// let mut gate = TokenGate::default();
/// assert!(gate.admit("task:42", 7).is_ok());
/// assert!(gate.admit("task:42", 8).is_ok()); // a takeover's term
/// assert_eq!(gate.admit("task:42", 7).unwrap_err().highest, 8); // the stalled one
/// ```
///
/// In memory only: a receiver that restarts must keep the bar in its own
/// store, updated in the same transaction as the effect.
#[derive(Debug, Default, Clone)]
pub struct TokenGate {
    highest: HashMap<String, i64>,
}

/// A token below the highest one a [`TokenGate`] has seen for its resource.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {token} for {resource}: token {highest} has been seen")]
pub struct StaleToken {
    /// The resource the request was for.
    pub resource: String,
    /// The token it carried.
    pub token: i64,
    /// The highest token seen for that resource.
    pub highest: i64,
}

impl TokenGate {
    /// Admits a request of `resource` carrying `token` (and raises the bar
    /// to it), or refuses it when a higher token has been seen.
    pub fn admit(&mut self, resource: &str, token: i64) -> Result<(), StaleToken> {
        match self.highest.get_mut(resource) {
            Some(highest) if *highest > token => Err(StaleToken {
                resource: resource.to_string(),
                token,
                highest: *highest,
            }),
            Some(highest) => {
                *highest = token;
                Ok(())
            }
            None => {
                self.highest.insert(resource.to_string(), token);
                Ok(())
            }
        }
    }

    /// The highest token seen for `resource`, if any.
    pub fn highest(&self, resource: &str) -> Option<i64> {
        self.highest.get(resource).copied()
    }
}

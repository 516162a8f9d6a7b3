//! The in-process lease client: acquire once, then keep the lease renewed in
//! the background and always know whether it is still safe to act on it.
//!
//! The rule taken from River's leader election: trust a lease for less time
//! than the database grants it. Every acquire or renew is timed on the
//! monotonic clock from *before* the request is sent; the database computes
//! `expires_at` from its own `now()`, which is later than that. So the local
//! deadline `sent + ttl - safety_margin` passes before the database could
//! consider the lease expired, and [`HeldLease::is_held`] turns false first.
//!
//! Two replicas contend for one lease; the holder keeps it renewed past its
//! TTL, and hands it over by releasing it:
//!
//! ```
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pool = leasekeeper_core::db::testing::fresh_pool().await;
//! use leasekeeper_core::lease::client::{LeaseClient, LeaseTiming};
//! use leasekeeper_core::lease::{Holder, Resource};
//! use std::time::Duration;
//!
//! let mailer = Resource::parse("mailer")?;
//! // A two-second lease, renewed every third of that.
//! let timing = LeaseTiming::from_ttl(Duration::from_secs(2));
//! let a = LeaseClient::new(pool.clone(), mailer.clone(), Holder::parse("replica-a")?, timing);
//! let b = LeaseClient::new(pool.clone(), mailer, Holder::parse("replica-b")?, timing);
//!
//! let held = a.acquire().await?.expect("the lease is free");
//! assert!(b.acquire().await?.is_none(), "replica-a holds it");
//!
//! // Work that must stop the moment the lease is lost watches this token.
//! let lost = held.lost_token();
//!
//! // Past its TTL the lease is still held: the client renewed it.
//! tokio::time::sleep(Duration::from_millis(2500)).await;
//! assert!(held.is_held() && !lost.is_cancelled());
//! assert!(b.acquire().await?.is_none(), "still replica-a's");
//!
//! // Releasing hands it over at once, to a new term with a higher token.
//! let token = held.token();
//! assert!(held.release().await?);
//! let taken = b.acquire().await?.expect("released, so free");
//! assert!(taken.token() > token);
//! # Ok(())
//! # }
//! ```

use super::store::{self, Acquired, LeaseError};
use super::{Holder, Lease, Resource};
use crate::db::Schema;
use rand::Rng;
use sqlx::PgPool;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How a held lease is doing, as published by its renewal task.
#[derive(Clone, Debug, PartialEq)]
pub enum LeaseStatus {
    /// Held; safe to act on until `deadline` (monotonic clock).
    Held {
        /// The term's fencing token.
        token: i64,
        /// The local trust deadline.
        deadline: Instant,
    },
    /// A renewal is in flight; the previous deadline still applies.
    Renewing {
        /// The term's fencing token.
        token: i64,
        /// The local trust deadline from the last successful renewal.
        deadline: Instant,
    },
    /// Lost: renewal was refused, failed past the deadline, or it was released.
    Lost,
}

impl LeaseStatus {
    /// True while it is safe to act as the holder: not lost, and the local
    /// trust deadline (which passes before the database's expiry) is ahead.
    pub fn is_trusted(&self) -> bool {
        match self {
            LeaseStatus::Held { deadline, .. } | LeaseStatus::Renewing { deadline, .. } => {
                Instant::now() < *deadline
            }
            LeaseStatus::Lost => false,
        }
    }
}

/// Timing of a [`LeaseClient`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeaseTiming {
    /// What each acquire and renew asks for.
    pub ttl: Duration,
    /// How often the lease is renewed (before jitter). Must be below `ttl`.
    pub renew_interval: Duration,
    /// How much earlier than `sent + ttl` the client stops trusting the lease.
    pub safety_margin: Duration,
}

impl LeaseTiming {
    /// Renew every `ttl / 3`, and stop trusting the lease `ttl / 10` early.
    pub fn from_ttl(ttl: Duration) -> Self {
        LeaseTiming {
            ttl,
            renew_interval: ttl / 3,
            safety_margin: ttl / 10,
        }
    }
}

/// Acquires one resource for one holder, and renews it while it is held.
#[derive(Clone, Debug)]
pub struct LeaseClient {
    pool: PgPool,
    /// The pool's schema ([`Schema::of`]).
    schema: Schema,
    resource: Resource,
    holder: Holder,
    timing: LeaseTiming,
}

impl LeaseClient {
    /// A client for `resource` held as `holder`.
    pub fn new(pool: PgPool, resource: Resource, holder: Holder, timing: LeaseTiming) -> Self {
        LeaseClient {
            schema: Schema::of(&pool),
            pool,
            resource,
            holder,
            timing,
        }
    }

    /// The resource this client acquires.
    pub fn resource(&self) -> &Resource {
        &self.resource
    }

    /// The holder name this client acquires as.
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// Tries to acquire the lease. `Ok(None)` when another holder has it.
    /// On success a background task renews it every `renew_interval` (with
    /// up to 10% jitter either way, so many clients do not renew in step).
    pub async fn acquire(&self) -> Result<Option<HeldLease>, LeaseError> {
        let sent = Instant::now();
        let outcome = async {
            let mut conn = self.pool.acquire().await?;
            store::acquire(
                &mut conn,
                &self.schema,
                &self.resource,
                &self.holder,
                self.timing.ttl,
            )
            .await
        }
        .await;
        let lease = match outcome {
            Ok(Acquired::New(lease)) => lease,
            Ok(Acquired::AlreadyHeld(lease)) => {
                // Idempotent re-acquire: the term started earlier than `sent`,
                // so trust it only as long as the database says it runs.
                let remaining = Duration::from_millis(lease.expires_in_ms.max(0) as u64);
                return Ok(Some(self.hold(lease, sent, remaining)));
            }
            Err(LeaseError::Held { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(self.hold(lease, sent, self.timing.ttl)))
    }

    fn hold(&self, lease: Lease, sent: Instant, granted: Duration) -> HeldLease {
        let token = lease.fencing_token;
        let deadline = trust_deadline(sent, granted, self.timing.safety_margin);
        let (status_tx, status_rx) = watch::channel(LeaseStatus::Held { token, deadline });
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let task = tokio::spawn(renew_loop(
            self.clone(),
            token,
            deadline,
            status_tx,
            lost.clone(),
            stop.clone(),
        ));
        HeldLease {
            client: self.clone(),
            lease,
            status: status_rx,
            lost,
            stop,
            task,
        }
    }
}

fn trust_deadline(sent: Instant, granted: Duration, margin: Duration) -> Instant {
    sent + granted.saturating_sub(margin)
}

fn jittered(interval: Duration) -> Duration {
    let factor = rand::rng().random_range(0.9..=1.1);
    interval.mul_f64(factor)
}

async fn renew_loop(
    client: LeaseClient,
    token: i64,
    mut deadline: Instant,
    status: watch::Sender<LeaseStatus>,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let timing = client.timing;
    let mut next_renew = Instant::now() + jittered(timing.renew_interval);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!(resource = %client.resource, holder = %client.holder, token,
                    "lease trust deadline passed without a successful renewal; stepping down");
                break;
            }
            _ = tokio::time::sleep_until(next_renew) => {}
        }
        status.send_replace(LeaseStatus::Renewing { token, deadline });
        let sent = Instant::now();
        let renewal = async {
            let mut conn = client.pool.acquire().await?;
            store::renew(
                &mut conn,
                &client.schema,
                &client.resource,
                &client.holder,
                Some(token),
                Some(timing.ttl),
            )
            .await
        };
        let result = tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!(resource = %client.resource, holder = %client.holder, token,
                    "lease renewal did not answer before the trust deadline; stepping down");
                break;
            }
            result = renewal => result,
        };
        match result {
            Ok(_) => {
                deadline = trust_deadline(sent, timing.ttl, timing.safety_margin);
                next_renew = Instant::now() + jittered(timing.renew_interval);
                status.send_replace(LeaseStatus::Held { token, deadline });
            }
            Err(LeaseError::NotFound(_)) => {
                tracing::warn!(resource = %client.resource, holder = %client.holder, token,
                    "lease renewal refused: the lease expired or was taken over");
                break;
            }
            Err(e) => {
                // The database is unreachable or failing: keep trying until
                // the deadline, a little more often than usual.
                tracing::warn!(resource = %client.resource, holder = %client.holder, token,
                    error = %e, "lease renewal failed; retrying until the trust deadline");
                next_renew = Instant::now() + jittered(timing.renew_interval / 4);
                status.send_replace(LeaseStatus::Held { token, deadline });
            }
        }
    }
    status.send_replace(LeaseStatus::Lost);
    lost.cancel();
}

/// A lease this process holds. Renewal runs in the background until the
/// lease is released, lost, or this value is dropped (dropping stops renewal
/// without releasing: the lease then simply expires, as after a crash).
#[derive(Debug)]
pub struct HeldLease {
    client: LeaseClient,
    lease: Lease,
    status: watch::Receiver<LeaseStatus>,
    lost: CancellationToken,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl HeldLease {
    /// The lease as acquired.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The fencing token of this term; protected writes must carry it.
    pub fn token(&self) -> i64 {
        self.lease.fencing_token
    }

    /// True while it is safe to act as the holder: the lease was not lost and
    /// the local trust deadline, which passes before the database's expiry,
    /// has not passed.
    pub fn is_held(&self) -> bool {
        self.status.borrow().is_trusted()
    }

    /// A watch on the renewal status, for code that wants every change.
    pub fn status(&self) -> watch::Receiver<LeaseStatus> {
        self.status.clone()
    }

    /// A token cancelled the moment the lease is lost; hand it to work that
    /// must stop when ownership ends.
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Resolves when the lease is lost.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// Stops renewal and releases the lease. `Ok(false)` when it was no longer
    /// held (already expired or taken over), which is not an error.
    pub async fn release(self) -> Result<bool, LeaseError> {
        self.stop.cancel();
        self.lost.cancel();
        let released = async {
            let mut conn = self.client.pool.acquire().await?;
            store::release(
                &mut conn,
                &self.client.schema,
                &self.client.resource,
                &self.client.holder,
                Some(self.token()),
            )
            .await
        }
        .await;
        match released {
            Ok(_) => Ok(true),
            Err(LeaseError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.stop.cancel();
        self.task.abort();
    }
}

//! The rescuer: fails the late tasks that used all their attempts, apart
//! from the claim.
//!
//! A task is late when its claim's deadline passed without a heartbeat or
//! a completion (its processor died, stalled or lost the network). A late
//! task with an attempt left is taken over by the next claim (the claim
//! rule, [`crate::queue::store::sql::claim`]); one that used its attempts is
//! no candidate of any claim, and waits here: a pass of the rescuer marks
//! it failed, visibly, with the error `lease expired on attempt N of N
//! without completion`. The attempt closes as failed with that error, the
//! counters move from started to failed, and no lease is touched, so the
//! outcome is the one a claim recorded before the rescue moved here.
//!
//! The pass runs on the maintenance job's singleton (`singleton:maintenance`,
//! see [`crate::maintenance`]) every 5 s (the maintenance configuration's
//! `rescue_interval`, [`crate::maintenance::DEFAULT_RESCUE_INTERVAL`]), so
//! such a task stays started at most that long (plus one pass) after its
//! deadline, on a deployment that runs the maintenance job; no other replica
//! and no claim fails it. Each batch is one short transaction, fenced on the
//! singleton's lease ([`crate::lease::store::fence`]): a replica that lost
//! the lease without noticing yet writes nothing, and its attempt is on
//! record as `stale_write_refused`.
//!
//! One pass by hand, holding the maintenance lease:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pool = leasekeeper_core::db::testing::fresh_pool().await;
//! use leasekeeper_core::db::Schema;
//! use leasekeeper_core::lease::{Holder, Resource, store as leases};
//! use leasekeeper_core::maintenance::RESOURCE;
//! use leasekeeper_core::queue::rescuer::{self, Fence};
//! use std::time::Duration;
//!
//! let me = Holder::parse("replica-1")?;
//! let mut conn = pool.acquire().await?;
//! let lease = leases::acquire(&mut conn, &Schema::of(&pool), &Resource::parse(RESOURCE)?,
//!                             &me, Duration::from_secs(15)).await?.into_lease();
//! let fence = Fence { resource: RESOURCE, holder: &me, token: lease.fencing_token };
//! let rescued = rescuer::rescue_once(&pool, fence, 500, || true).await?;
//! assert_eq!(rescued.failed, 0); // no task is late
//! # Ok(())
//! # }
//! ```

use crate::db::Schema;
use crate::lease::Holder;
use crate::lease::singleton::HeldTerm;
use sqlx::{Connection, PgConnection, PgPool};
use std::time::Duration;

/// The singleton term a rescue writes under: the lease `resource` held by
/// `holder` with fencing token `token`. Every batch checks it in the
/// database, in the batch's own transaction.
#[derive(Clone, Copy, Debug)]
pub struct Fence<'a> {
    /// The singleton's lease (the maintenance job's: `singleton:maintenance`).
    pub resource: &'a str,
    /// Who holds it.
    pub holder: &'a Holder,
    /// The term's fencing token.
    pub token: i64,
}

/// What a rescue pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rescued {
    /// Late tasks out of attempts marked failed.
    pub failed: u64,
    /// The fence refused a batch (the lease is no longer this term's): the
    /// pass stopped there, having written nothing in that batch.
    pub refused: bool,
    /// Waiting tasks whose wait for a signal timed out, made pending
    /// ([`resume_timed_out`](crate::queue::store::resume_timed_out)).
    pub resumed: u64,
}

/// One batch: fails up to `batch` late tasks that used their attempts, the
/// longest late first, in one transaction fenced on `fence`. Answers the
/// ids failed, or `None` when the fence refused (nothing written, the
/// refusal recorded).
pub async fn rescue(
    conn: &mut PgConnection,
    schema: &Schema,
    fence: Fence<'_>,
    batch: usize,
) -> sqlx::Result<Option<Vec<i64>>> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<Option<Vec<i64>>>,
        async {
            let mut tx = conn.begin().await?;
            // Race prevented: two rescuers around a failover of the maintenance
            // job (see `lease::store::fence`): the check and the writes share
            // one transaction, so every batch of term N commits before term N+1
            // begins, and a holder that lost the lease writes nothing.
            let held = crate::lease::store::fence(
                &mut tx,
                schema,
                fence.resource,
                fence.holder,
                fence.token,
                "rescue",
            )
            .await?;
            if held.is_none() {
                tx.commit().await?;
                return Ok(None);
            }
            // Race prevented: a task whose claim is extended between the read
            // that finds it late and the write that fails it. Its processor's
            // heartbeat began before the deadline (the heartbeat's guard, see
            // `HOLDS_CLAIM`, judges by its own transaction's start) and commits
            // after this statement's snapshot, which still shows the old
            // deadline. `doomed` locks each row it picks (FOR UPDATE) and skips
            // rows another transaction holds (SKIP LOCKED: a heartbeat in flight
            // keeps its task, and the rescuer never waits on a worker); a row
            // changed and committed since the snapshot is re-checked on its
            // newest version, so a task whose deadline moved into the future, or
            // that was completed, failed or cancelled, is not picked. A claim
            // never races this: a late task out of attempts is no
            // candidate of the claim rule.
            //
            // Ordered by tasks_started_idx, so a batch reads the late tasks only.
            let failed: Vec<i64> = schema
                .query_scalar(
                    "WITH doomed AS (
                        SELECT id FROM $schema.tasks
                         WHERE status = 'started' AND must_heartbeat_before <= now()
                           AND attempts >= max_attempts
                         ORDER BY must_heartbeat_before, id
                         LIMIT $1
                           FOR UPDATE SKIP LOCKED
                     )
                     UPDATE $schema.tasks t
                        SET status = 'failed', failed_at = now(), must_heartbeat_before = NULL,
                            last_error = format('lease expired on attempt %s of %s without completion',
                                                t.attempts, t.max_attempts)
                       FROM doomed d
                      WHERE t.id = d.id
                     RETURNING t.id",
                )
                .bind(i64::try_from(batch.max(1)).unwrap_or(i64::MAX))
                .fetch_all(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(Some(failed))
        }
        .await
    )
}

/// One pass: every batch there is, while `keep_going()` answers true (asked
/// before each batch), until a batch short of full or a refusal. Each batch
/// is [`rescue`], one short transaction of its own; an error ends the
/// pass, keeping what earlier batches did.
pub async fn rescue_once(
    pool: &PgPool,
    fence: Fence<'_>,
    batch: usize,
    keep_going: impl Fn() -> bool,
) -> sqlx::Result<Rescued> {
    let schema = Schema::of(pool);
    let batch = batch.max(1);
    let mut conn = pool.acquire().await?;
    let mut rescued = Rescued::default();
    while keep_going() {
        let Some(failed) = rescue(&mut conn, &schema, fence, batch).await? else {
            rescued.refused = true;
            break;
        };
        if !failed.is_empty() {
            // The dashboards' task lists and counts change.
            crate::live::announce(crate::live::Topics::TASKS);
            tracing::info!(tasks = ?failed, "failed late tasks that used their attempts");
        }
        rescued.failed += failed.len() as u64;
        if failed.len() < batch {
            break;
        }
    }
    // The waits for a signal that timed out: pending again, without it.
    // Not fenced: it decides no claim (a waiting task has none), and two
    // passes at once each take rows the other does not (SKIP LOCKED).
    while !rescued.refused && keep_going() {
        let n = crate::queue::store::resume_timed_out(&mut conn, &schema, batch as i64).await?;
        rescued.resumed += n;
        if n < batch as u64 {
            break;
        }
    }
    Ok(rescued)
}

/// The rescuer's part of a singleton's term: a pass at once, then one every
/// `interval`, until the term ends; `on_pass` hears what each pass did.
pub(crate) async fn run_term(
    pool: &PgPool,
    resource: &str,
    holder: &Holder,
    term: &HeldTerm,
    interval: Duration,
    batch: usize,
    on_pass: impl Fn(Rescued),
) {
    let fence = Fence {
        resource,
        holder,
        token: term.token(),
    };
    loop {
        match rescue_once(pool, fence, batch, || term.is_held()).await {
            Ok(rescued) => on_pass(rescued),
            // Tried again next interval; the tasks stay started until then.
            Err(e) => tracing::warn!(error = %e, "rescue pass failed"),
        }
        tokio::select! {
            _ = term.stop().cancelled() => break,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

//! Claiming: each claim writes its holder, a new fencing token and its
//! deadline into the task row, which is the claim's lease (there is no
//! other lease row to disagree with it); one statement claims many.

use super::{MAX_BATCH, TaskError, sql};
use crate::db::Schema;
use crate::lease::Holder;
use crate::lease::store as leases;
use crate::queue::{ClaimFilter, Task};
use sqlx::{Connection, PgConnection, Row};
use std::time::Duration;

/// Claims the oldest claimable task for `processor`, taking its lease for
/// `ttl` in the same transaction. Late tasks (started, lease expired) are
/// taken over first, then pending ones in `scheduled_at` order. A late task
/// that has used up its attempts is not claimed: the rescuer fails it
/// ([`crate::queue::rescuer`]). `None` when nothing is claimable.
///
/// One statement, one round trip and one commit ([`sql::claim`] with a
/// limit of one).
pub async fn claim_next(
    conn: &mut PgConnection,
    schema: &Schema,
    processor: &Holder,
    ttl: Duration,
) -> Result<Option<Task>, TaskError> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<Task>, TaskError>,
        async { claim_next_in(conn, schema, processor, ttl, &ClaimFilter::default()).await }.await
    )
}

/// [`claim_next`] among the tasks `filter` lets through (one queue, and
/// some kinds or all): what a runtime serving that queue with handlers for
/// those kinds claims. Within the queue, late tasks first, then pending
/// ones by priority (lower first), then `scheduled_at`, then id.
pub async fn claim_next_in(
    conn: &mut PgConnection,
    schema: &Schema,
    processor: &Holder,
    ttl: Duration,
    filter: &ClaimFilter,
) -> Result<Option<Task>, TaskError> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<Task>, TaskError>,
        async {
            let _announced = crate::live::announce_on_return(
                crate::live::Topics::TASKS | crate::live::Topics::LEASES,
            );
            let holders = [processor.as_str()];
            let claimed = claim_up_to(conn, schema, &holders, ttl, filter).await?;
            Ok(claimed.into_iter().next())
        }
        .await
    )
}

/// Claims up to `limit` claimable tasks for `processor` in one statement
/// (one round trip, one commit), each with its own lease and fencing token,
/// in the order [`claim_next`] would claim them. Fewer than `limit` (or
/// none) when there is not that much work.
pub async fn claim_batch(
    conn: &mut PgConnection,
    schema: &Schema,
    processor: &Holder,
    ttl: Duration,
    limit: usize,
) -> Result<Vec<Task>, TaskError> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Vec<Task>, TaskError>,
        async {
            let _announced = crate::live::announce_on_return(
                crate::live::Topics::TASKS | crate::live::Topics::LEASES,
            );
            if !(1..=MAX_BATCH).contains(&limit) {
                return Err(TaskError::BadInput(format!(
                    "a batch claims 1 to {MAX_BATCH} tasks, not {limit}"
                )));
            }
            let holders = vec![processor.as_str(); limit];
            claim_up_to(conn, schema, &holders, ttl, &ClaimFilter::default()).await
        }
        .await
    )
}

/// What [`claim_for`] did: the tasks it claimed, each with its holder as
/// `processor`.
#[derive(Debug, Default)]
pub struct Claimed {
    /// The tasks claimed, in claim order (late ones first, then by
    /// priority, due time and id).
    pub tasks: Vec<Task>,
    /// The queue's limits held back some of what was asked while due
    /// tasks waited ([`crate::queue::queue_limits`]): a slot or a token
    /// may free any moment, so the caller may ask again soon rather than
    /// at its next poll.
    pub deferred: bool,
}

/// Claims up to one task for each entry of `holders` among the tasks
/// `filter` lets through, in one statement (one round trip, one commit),
/// each task with its own lease and fencing token: what a runtime's
/// producer does for its free workers. A name may come more than once: it
/// then gets up to that many tasks, each a claim of its own (a runtime
/// that prefetches claims its workers' local queues this way, see
/// [`crate::worker::batch`]). The n-th task claimed goes to the n-th entry,
/// so when there is less work than entries, the first entries get it.
pub async fn claim_for(
    conn: &mut PgConnection,
    schema: &Schema,
    holders: &[Holder],
    ttl: Duration,
    filter: &ClaimFilter,
) -> Result<Claimed, TaskError> {
    crate::db::atomically!(conn, schema, Result<Claimed, TaskError>, async {
        let _announced =
            crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
        if !(1..=MAX_BATCH).contains(&holders.len()) {
            return Err(TaskError::BadInput(format!(
                "a claim is for 1 to {MAX_BATCH} holders, not {}",
                holders.len()
            )));
        }
        let names: Vec<&str> = holders.iter().map(Holder::as_str).collect();
        let (tasks, deferred) = claim_deferring(conn, schema, &names, ttl, filter).await?;
        Ok(Claimed { tasks, deferred })
    }
    .await)
}

/// [`claim_deferring`] without telling whether limits held tasks back.
async fn claim_up_to(
    conn: &mut PgConnection,
    schema: &Schema,
    holders: &[&str],
    ttl: Duration,
    filter: &ClaimFilter,
) -> Result<Vec<Task>, TaskError> {
    Ok(claim_deferring(conn, schema, holders, ttl, filter).await?.0)
}

/// Runs the claim statement ([`sql::claim`], or [`sql::limited_claim`]
/// for a limited queue) for `holders`: every way a task is claimed comes
/// here. Answers the tasks, and whether the queue's limits held some back
/// while due tasks waited.
async fn claim_deferring(
    conn: &mut PgConnection,
    schema: &Schema,
    holders: &[&str],
    ttl: Duration,
    filter: &ClaimFilter,
) -> Result<(Vec<Task>, bool), TaskError> {
    crate::db::atomically!(
        conn,
        schema,
        Result<(Vec<Task>, bool), TaskError>,
        async {
            let ttl_ms = leases::ttl_ms(ttl)?;
            // Races prevented, all in one statement:
            // - two workers claiming the same task: the claim statement's row locks (`sql::claim`) lock
            //   each candidate row until commit and makes every other claimer move
            //   on to the next row instead of queueing behind it (claims never
            //   serialize; no OFFSET scan). PostgreSQL re-checks the WHERE on the
            //   locked row's newest version, so a task that a committed transaction
            //   just finished or re-claimed is not taken.
            // - a takeover racing the old holder's heartbeat or completion: a late
            //   task's row is locked here, and their UPDATEs re-check the deadline
            //   and token on the newest version (see `HOLDS_CLAIM`).
            // - two claims issuing one token: the token is the locked row's own
            //   `fencing_token + 1` (see `sql::claim`).
            // - a takeover racing the rescuer: a late task out of attempts is no
            //   candidate at all, so a claim never takes what the rescuer fails.
            // Late claims go first (they are older than anything pending); pending
            // tasks are looked at only when no late one is.
            let limit = holders.len().clamp(1, MAX_BATCH);
            let by_kind = filter.kinds.is_some();
            let mut limited = limited::known(schema, &filter.queue);
            if !limited {
                let rows = run(
                    conn,
                    schema,
                    &sql::claim(limit, by_kind),
                    holders,
                    ttl_ms,
                    filter,
                )
                .await?;
                if !rows.is_empty() {
                    return Ok((finish(&rows)?, false));
                }
                // Nothing: an idle queue, or a limited one, which that
                // statement leaves alone (`sql::RUNNING`).
                limited = schema
                    .query_scalar(
                        "SELECT EXISTS (SELECT 1 FROM $schema.queues WHERE name = $1 AND limited)",
                    )
                    .bind(&filter.queue)
                    .fetch_one(&mut *conn)
                    .await?;
                if !limited {
                    return Ok((Vec::new(), false));
                }
            }
            // A limited queue: its claims take turns on its row's lock (see
            // `sql::LOCK_LIMITED` and `sql::limited_claim` for the races).
            let mut tx = conn.begin().await?;
            let locked = schema
                .query(sql::LOCK_LIMITED)
                .bind(&filter.queue)
                .fetch_optional(&mut *tx)
                .await?
                .is_some();
            limited::remember(schema, &filter.queue, locked);
            let statement = if locked {
                sql::limited_claim(limit, by_kind)
            } else {
                sql::claim(limit, by_kind)
            };
            let mut rows = run(&mut tx, schema, &statement, holders, ttl_ms, filter).await?;
            tx.commit().await?;
            if !locked {
                return Ok((finish(&rows)?, false));
            }
            // The limited claim answers at least one row: with nothing
            // claimed, one of NULL task columns, for `held_back`, the due
            // tasks of this claimer's kinds it saw and did not take.
            let held: i64 = match rows.first() {
                Some(row) => row.try_get("held_back")?,
                None => 0,
            };
            rows.retain(|row| matches!(row.try_get::<Option<i64>, _>("id"), Ok(Some(_))));
            let short = holders.len().saturating_sub(rows.len()) as i64;
            let deferred = short > 0 && held > 0;
            if deferred {
                crate::metrics::deferred(&filter.queue, short.min(held) as u64);
            }
            Ok((finish(&rows)?, deferred))
        }
        .await
    )
}

/// Runs claim statement `statement` for `holders` on `conn`.
async fn run(
    conn: &mut PgConnection,
    schema: &Schema,
    statement: &str,
    holders: &[&str],
    ttl_ms: i64,
    filter: &ClaimFilter,
) -> Result<Vec<sqlx::postgres::PgRow>, TaskError> {
    let mut query = schema
        .query(statement)
        .bind(holders)
        .bind(ttl_ms)
        .bind(&filter.queue);
    if let Some(kinds) = &filter.kinds {
        query = query.bind(kinds);
    }
    Ok(query.fetch_all(&mut *conn).await?)
}

/// The tasks of a claim statement's rows, counted in the metrics.
fn finish(rows: &[sqlx::postgres::PgRow]) -> Result<Vec<Task>, TaskError> {
    let mut claimed = Vec::with_capacity(rows.len());
    for row in rows {
        claimed.push(<Task as sqlx::FromRow<_>>::from_row(row)?);
        if row.try_get::<bool, _>("took_over")? {
            crate::metrics::took_over(row.try_get::<Option<i64>, _>("silent_ms")?.unwrap_or(0));
        }
    }
    crate::metrics::claimed(&claimed);
    Ok(claimed)
}

/// The queues this process has found limited, by schema and name: their
/// claims go straight to the limited statement. Only a shortcut: a queue
/// wrongly thought unlimited is claimed by a statement that claims nothing
/// of a limited queue, and a queue wrongly thought limited is found out by
/// the lock statement, which answers no row for it; each corrects this.
mod limited {
    use crate::db::Schema;
    use std::collections::HashSet;
    use std::sync::{LazyLock, Mutex};

    static LIMITED: LazyLock<Mutex<HashSet<(String, String)>>> =
        LazyLock::new(|| Mutex::new(HashSet::new()));

    /// Whether queue `name` of `schema` was limited when last claimed here.
    pub(super) fn known(schema: &Schema, name: &str) -> bool {
        LIMITED
            .lock()
            .map(|set| set.contains(&(schema.as_str().to_string(), name.to_string())))
            .unwrap_or(false)
    }

    /// Remembers whether queue `name` of `schema` is `limited`.
    pub(super) fn remember(schema: &Schema, name: &str, limited: bool) {
        if let Ok(mut set) = LIMITED.lock() {
            let key = (schema.as_str().to_string(), name.to_string());
            if limited {
                set.insert(key);
            } else {
                set.remove(&key);
            }
        }
    }
}

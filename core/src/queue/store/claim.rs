//! Claiming: each claim takes the task's lease (`task:<id>`) with a new
//! fencing token in the transaction that marks the task started, so the
//! task row and its lease never disagree; one statement claims many.

use super::{MAX_BATCH, TASK_COLUMNS, TaskError, sql, task_resource};
use crate::db::Schema;
use crate::lease::Holder;
use crate::lease::store::{self as leases, LeaseError};
use crate::queue::{ClaimFilter, Task, TaskStatus};
use sqlx::{Connection, PgConnection};
use std::time::Duration;

/// How many candidates one claim looks at before giving up (a candidate is
/// passed over only when someone took its lease by hand through the API).
const CLAIM_CANDIDATES: usize = 8;

/// A claim candidate: enough of the row to decide what to do with it.
#[derive(sqlx::FromRow)]
struct Candidate {
    id: i64,
    status: TaskStatus,
    attempts: i32,
    max_attempts: i32,
}

/// Claims the oldest claimable task for `processor`, taking its lease for
/// `ttl` in the same transaction. Late tasks (started, lease expired) are
/// taken over first, then pending ones in `scheduled_at` order. A late task
/// that has used up its attempts is marked failed instead. `None` when
/// nothing is claimable.
///
/// The common case is one statement, one round trip and one commit
/// ([`claim_batch`] with a limit of one). Only when that statement found a
/// candidate it could not claim (a late task out of attempts, or a task
/// whose lease someone holds by hand) does the claim go the careful way,
/// statement by statement.
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
            let batch = claim_up_to(conn, schema, &[processor.as_str()], ttl, filter).await?;
            if let Some(task) = batch.claimed.into_iter().next() {
                return Ok(Some(task));
            }
            if batch.candidates == 0 {
                return Ok(None);
            }
            claim_carefully(conn, schema, processor, ttl, filter).await
        }
        .await
    )
}

/// What one claim statement did: the tasks it claimed, and how many
/// candidates it locked (more than claimed means some need the careful path).
struct ClaimBatch {
    claimed: Vec<Task>,
    candidates: i64,
}

/// Claims up to `limit` claimable tasks for `processor` in one statement
/// (one round trip, one commit), each with its own lease and fencing token,
/// in the order [`claim_next`] would claim them. Candidates the statement
/// cannot claim (see [`claim_next`]) are left for it. Fewer than `limit`
/// (or none) when there is not that much work.
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
            Ok(
                claim_up_to(conn, schema, &holders, ttl, &ClaimFilter::default())
                    .await?
                    .claimed,
            )
        }
        .await
    )
}

/// What [`claim_for`] did: the tasks it claimed (each with its holder as
/// `processor`), and whether it passed over candidates it could not claim
/// in one statement (a late task out of attempts, or a task whose lease
/// someone holds by hand), which [`claim_next_in`] then handles.
#[derive(Debug, Default)]
pub struct Claimed {
    /// The tasks claimed, in claim order (late ones first, then by
    /// priority, due time and id).
    pub tasks: Vec<Task>,
    /// Candidates were left for the careful path.
    pub passed_over: bool,
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
        let batch = claim_up_to(conn, schema, &names, ttl, filter).await?;
        Ok(Claimed {
            passed_over: batch.candidates > batch.claimed.len() as i64,
            tasks: batch.claimed,
        })
    }
    .await)
}

async fn claim_up_to(
    conn: &mut PgConnection,
    schema: &Schema,
    holders: &[&str],
    ttl: Duration,
    filter: &ClaimFilter,
) -> Result<ClaimBatch, TaskError> {
    crate::db::atomically!(conn, schema, Result<ClaimBatch, TaskError>, async {
        let ttl_ms = leases::ttl_ms(ttl)?;
        // Races prevented, all in one statement:
        // - two workers claiming the same task: `FOR UPDATE SKIP LOCKED` locks
        //   each candidate row until commit and makes every other claimer move
        //   on to the next row instead of queueing behind it (claims never
        //   serialize; no OFFSET scan). PostgreSQL re-checks the WHERE on the
        //   locked row's newest version, so a task that a committed transaction
        //   just finished or re-claimed is not taken.
        // - a takeover racing the old holder's heartbeat or completion: a late
        //   task's row is locked here, and their UPDATEs re-check the deadline
        //   and token on the newest version (see `HOLDS_CLAIM`).
        // - two terms of one task lease: the lease upsert below is the lease
        //   store's acquire (`ON CONFLICT ... WHERE l.expires_at <= now()`,
        //   re-checked under the row lock), so a live lease held by hand is
        //   left alone; its candidate is counted but not claimed.
        // Late claims go first (they are older than anything pending); pending
        // tasks are looked at only when no late one is.
        let sql = sql::claim(holders.len().clamp(1, MAX_BATCH), filter.kinds.is_some());
        for attempt in 0.. {
            let mut query = schema
                .query(&sql)
                .bind(holders)
                .bind(ttl_ms)
                .bind(&filter.queue);
            if let Some(kinds) = &filter.kinds {
                query = query.bind(kinds);
            }
            let rows = query.fetch_all(&mut *conn).await;
            match rows {
                Ok(rows) => {
                    use sqlx::Row;
                    // Always one row at least: the count, and no task when
                    // nothing was claimed.
                    let candidates = match rows.first() {
                        Some(row) => row.try_get("candidates")?,
                        None => 0,
                    };
                    let mut claimed = Vec::with_capacity(rows.len());
                    for row in &rows {
                        if row.try_get::<Option<i64>, _>("id")?.is_some() {
                            claimed.push(<Task as sqlx::FromRow<_>>::from_row(row)?);
                            if row.try_get::<Option<bool>, _>("took_over")? == Some(true) {
                                crate::metrics::took_over(
                                    row.try_get::<Option<i64>, _>("silent_ms")?.unwrap_or(0),
                                );
                            }
                        }
                    }
                    crate::metrics::claimed(&claimed);
                    return Ok(ClaimBatch {
                        claimed,
                        candidates,
                    });
                }
                // The fencing-token guard (see the leases migration) refused a
                // token computed from an old snapshot: run it again.
                Err(e) if leases::is_serialization_failure(&e) && attempt < 5 => continue,
                Err(e) => return Err(e.into()),
            }
        }
        unreachable!("the loop only ends by returning")
    }
    .await)
}

/// The careful claim: candidate by candidate, in one transaction, failing
/// late tasks that are out of attempts and passing over tasks whose lease
/// is held by hand.
async fn claim_carefully(
    conn: &mut PgConnection,
    schema: &Schema,
    processor: &Holder,
    ttl: Duration,
    filter: &ClaimFilter,
) -> Result<Option<Task>, TaskError> {
    crate::db::atomically!(conn, schema, Result<Option<Task>, TaskError>, async {
        // An absent kind filter is every kind: NULL makes the condition true.
        let kinds = filter.kinds.as_deref();
        let mut tx = conn.begin().await?;
        let mut passed_over: Vec<i64> = Vec::new();
        for _ in 0..CLAIM_CANDIDATES {
            // Race prevented: two workers claiming the same task. FOR UPDATE
            // locks the candidate row until commit, and SKIP LOCKED makes every
            // other claimer move on to the next row instead of queueing behind
            // it (claims never serialize, and no OFFSET scan is needed). The
            // WHERE is re-checked on the locked row version, so a task that a
            // committed transaction just finished or re-claimed is not taken.
            // Late claims first: they are older than anything pending. A
            // paused queue gives nothing (`sql::RUNNING` says why it is
            // tested per statement).
            let late: Option<Candidate> = schema
                .query_as(
                    "SELECT id, status, attempts, max_attempts FROM $schema.tasks
                  WHERE status = 'started' AND must_heartbeat_before <= now() AND id <> ALL($1)
                    AND queue = $2 AND ($3::text[] IS NULL OR kind = ANY($3))
                    AND NOT EXISTS (SELECT 1 FROM $schema.queues q WHERE q.name = $2 AND q.paused)
                  ORDER BY must_heartbeat_before, id
                  LIMIT 1 FOR UPDATE SKIP LOCKED",
                )
                .bind(&passed_over)
                .bind(&filter.queue)
                .bind(kinds)
                .fetch_optional(&mut *tx)
                .await?;
            let candidate = match late {
                Some(c) => Some(c),
                None => {
                    // Same race, same guard, for fresh work.
                    schema
                        .query_as(
                            "SELECT id, status, attempts, max_attempts FROM $schema.tasks
                          WHERE status = 'pending' AND scheduled_at <= now() AND id <> ALL($1)
                            AND queue = $2 AND ($3::text[] IS NULL OR kind = ANY($3))
                            AND NOT EXISTS (SELECT 1 FROM $schema.queues q WHERE q.name = $2 AND q.paused)
                          ORDER BY priority, scheduled_at, id
                          LIMIT 1 FOR UPDATE SKIP LOCKED",
                        )
                        .bind(&passed_over)
                        .bind(&filter.queue)
                        .bind(kinds)
                        .fetch_optional(&mut *tx)
                        .await?
                }
            };
            let Some(candidate) = candidate else {
                tx.commit().await?;
                return Ok(None);
            };
            if candidate.status == TaskStatus::Started && candidate.attempts >= candidate.max_attempts {
                // Its processors kept dying: give up, visibly.
                schema.query(
                    "UPDATE $schema.tasks SET status = 'failed', failed_at = now(), must_heartbeat_before = NULL,
                            last_error = format('lease expired on attempt %s of %s without completion',
                                                attempts, max_attempts)
                      WHERE id = $1",
                )
                .bind(candidate.id)
                .execute(&mut *tx)
                .await?;
                passed_over.push(candidate.id);
                continue;
            }
            let resource = task_resource(candidate.id)?;
            let lease = match leases::acquire(&mut tx, schema, &resource, processor, ttl).await {
                Ok(acquired) => acquired.into_lease(),
                // Someone holds task:<id> by hand (through the lease API): leave it.
                Err(LeaseError::Held { .. }) => {
                    passed_over.push(candidate.id);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let task: Task = schema
                .query_as(&format!(
                    "UPDATE $schema.tasks
                    SET status = 'started', processor = $2, fencing_token = $3,
                        started_at = now(), last_heartbeat_at = now(),
                        must_heartbeat_before = $4, attempts = attempts + 1
                  WHERE id = $1
                 RETURNING {TASK_COLUMNS}"
                ))
                .bind(candidate.id)
                .bind(processor.as_str())
                .bind(lease.fencing_token)
                .bind(lease.expires_at)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
            // (A takeover here was counted by the lease store's acquire.)
            crate::metrics::claimed(std::slice::from_ref(&task));
            return Ok(Some(task));
        }
        tx.commit().await?;
        Ok(None)
    }
    .await)
}

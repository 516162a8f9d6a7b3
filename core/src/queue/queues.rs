//! Queues as things an operator sees and pauses: one row per queue name in
//! `queues`, created with the queue's first task (a trigger on `tasks`), or
//! by a pause of a name no task has used yet, so the queue is paused when
//! its first task arrives.
//!
//! - **Pause** is effective at the next claim, in the database: every claim
//!   statement reads the flag itself (see
//!   [`store::sql::RUNNING`](crate::queue::store::sql::RUNNING)), so no
//!   runtime, simulated worker or REST claimer anywhere takes a task of a
//!   paused queue once the pause has committed; nothing has to be told.
//!   Tasks already started run on and finish normally (their heartbeats,
//!   completions and failure reports are not affected); a task whose
//!   claim runs out while its queue is paused waits for the resume like a
//!   pending one.
//! - **Resume** clears the flag and announces
//!   [`Topics::WORK`](crate::live::Topics::WORK) after its commit, so idle
//!   workers of every instance claim at once instead of at their next poll.
//!
//! Each change writes an `operator` row to `lease_events` on resource
//! `queue:<name>` (action `queue_pause` or `queue_resume`) in the same
//! transaction; pausing a paused queue (or resuming a running one) changes
//! nothing and writes nothing.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), leasekeeper_core::queue::queues::QueueError> {
//! use leasekeeper_core::queue::queues;
//! let mut conn = pool.acquire().await?;
//! let schema = leasekeeper_core::db::Schema::of(&pool);
//! let mail = queues::pause(&mut conn, &schema, "mail", "ops@example").await?;
//! assert!(mail.paused);
//! // ... mail's started tasks finish; nothing new of `mail` is claimed ...
//! queues::resume(&mut conn, &schema, "mail", "ops@example").await?;
//! for q in queues::list(&mut conn, &schema).await? {
//!     println!("{}: {} pending, oldest {:?} ms", q.name, q.pending, q.oldest_pending_age_ms);
//! }
//! # Ok(()) }
//! ```

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A queue and its figures now (the type is shared with the browser).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueInfo {
    /// The queue's name (what tasks name in `queue`).
    pub name: String,
    /// Claims skip the queue's tasks while true.
    pub paused: bool,
    /// When the current pause began; null while running.
    pub paused_at: Option<DateTime<Utc>>,
    /// Tasks waiting to be claimed (due now or later).
    pub pending: i64,
    /// Tasks claimed and running.
    pub started: i64,
    /// Tasks that gave up after their attempts (until pruned).
    pub failed: i64,
    /// How long the longest-waiting due pending task has been due, in
    /// milliseconds (by the database clock); null when none is due.
    pub oldest_pending_age_ms: Option<i64>,
    /// Tasks of the queue completed in the last 60 seconds.
    pub completed_last_minute: i64,
    /// Workers running a task of the queue now (distinct processors of its
    /// started tasks).
    pub workers: i64,
    /// Its limits ([`crate::queue::queue_limits`]); each null when not set.
    #[cfg_attr(feature = "postgres", sqlx(flatten))]
    pub limits: crate::queue::queue_limits::QueueLimits,
    /// Its concurrency keys with the most started tasks, busiest first (at
    /// most [`BUSIEST_KEYS`](crate::queue::queue_limits::BUSIEST_KEYS)).
    #[cfg_attr(feature = "postgres", sqlx(json))]
    pub busiest_keys: Vec<crate::queue::queue_limits::KeyStarted>,
}

/// The lease-history resource an operator's change of a queue is recorded
/// on: `queue:<name>`.
pub fn resource(name: &str) -> String {
    format!("queue:{name}")
}

#[cfg(feature = "postgres")]
pub use db::*;

#[cfg(feature = "postgres")]
mod db {
    use super::{QueueInfo, resource};
    use crate::db::Schema;
    use crate::live::{self, Topics};
    use crate::queue::queue_limits::QueueLimits;
    use serde_json::json;
    use sqlx::{Connection, PgConnection};

    /// Why a queue operation did not happen.
    #[derive(Debug, thiserror::Error)]
    pub enum QueueError {
        /// No task ever used that name, and nobody paused it.
        #[error("no queue named {0:?}")]
        NotFound(String),
        /// Not a queue name (the rules of [`crate::queue::check_name`]).
        #[error("{0}")]
        BadInput(String),
        /// The database failed.
        #[error("database: {0}")]
        Db(#[from] sqlx::Error),
    }

    /// The cap the REST server applies when its `max_queues` setting is
    /// not given. The library itself applies none unless asked
    /// ([`MAX_QUEUES_SETTING`] unset: no cap), so a host with many queues
    /// of its own naming is not refused on upgrade.
    pub const DEFAULT_MAX_QUEUES: u32 = 1000;

    /// The PostgreSQL setting the queue cap is read from when an enqueue
    /// names a queue not seen before: transaction-local by
    /// [`limit_queues`], or a default of the role or database (`ALTER ROLE
    /// app SET leasekeeper.max_queues = 5000`, which works through a
    /// transaction pooler too). Unset: no cap.
    pub const MAX_QUEUES_SETTING: &str = "leasekeeper.max_queues";

    /// The SQLSTATE of an enqueue refused because its new queue names would
    /// pass the cap (class LK, leasekeeper's own): the whole statement and
    /// its transaction roll back, nothing is inserted.
    pub const TOO_MANY_QUEUES_SQLSTATE: &str = "LK002";

    /// Caps the queues at `max` for the rest of the transaction `conn` is
    /// in (it must be in one: outside, the setting ends with this
    /// statement). Enqueues of known queues are not affected; one naming a
    /// new queue when `max` exist is refused
    /// ([`TaskError::QueueCap`](crate::queue::store::TaskError::QueueCap)).
    pub async fn limit_queues(conn: &mut PgConnection, max: u32) -> sqlx::Result<()> {
        sqlx::query("SELECT set_config($1, $2, true)")
            .bind(MAX_QUEUES_SETTING)
            .bind(max.to_string())
            .execute(conn)
            .await?;
        Ok(())
    }

    /// Refuses what cannot be a queue's name.
    pub fn check(name: &str) -> Result<(), QueueError> {
        crate::queue::check_name("queue", name).map_err(QueueError::BadInput)
    }

    /// The figures of every queue (`$1` null) or of queue `$1`, by name,
    /// after the name `$2`, at most `$3`, each with its `$4` busiest keys.
    /// Reads the pending and failed tasks (`tasks_status_id_idx`), the
    /// started ones (`tasks_started_idx` or `tasks_started_key_idx`, both
    /// partial on them: the status index does not hold
    /// them, see migration `20261202000002`; hence two reads, not one `IN`
    /// of three statuses, which no index could serve) and the tasks
    /// finished in the last minute (`tasks_finished_idx`), never the
    /// processed history. The finished tasks' upper bound, which excludes
    /// nothing, is there for the planner: one inequality on the index's
    /// expression it guesses matches a third of the table (it has no
    /// statistics that compare with `now()`), and a parallel scan of every
    /// task looks cheaper than that index (and takes 165 ms on a million tasks); a range of two it
    /// guesses at half a percent, and reads the index (0.5 ms).
    const SELECT: &str = "
        WITH live AS (
            SELECT queue,
                   count(*) FILTER (WHERE status = 'pending') AS pending,
                   count(*) FILTER (WHERE status = 'started') AS started,
                   count(*) FILTER (WHERE status = 'failed') AS failed,
                   min(scheduled_at) FILTER (WHERE status = 'pending' AND scheduled_at <= now()) AS oldest_due,
                   count(DISTINCT processor) FILTER (WHERE status = 'started') AS workers
              FROM (SELECT queue, status, scheduled_at, processor FROM $schema.tasks
                     WHERE status IN ('pending', 'failed') AND ($1::text IS NULL OR queue = $1)
                    UNION ALL
                    SELECT queue, status, scheduled_at, processor FROM $schema.tasks
                     WHERE status = 'started' AND ($1::text IS NULL OR queue = $1)) live_tasks
             GROUP BY queue
        ), recent AS (
            SELECT queue, count(*) AS completed
              FROM $schema.tasks
             WHERE greatest(processed_at, failed_at, cancelled_at) > now() - interval '1 minute'
               AND greatest(processed_at, failed_at, cancelled_at) <= 'infinity'
               AND status = 'processed' AND ($1::text IS NULL OR queue = $1)
             GROUP BY queue
        )
        SELECT q.name, q.paused, q.paused_at,
               coalesce(live.pending, 0) AS pending, coalesce(live.started, 0) AS started,
               coalesce(live.failed, 0) AS failed,
               (EXTRACT(EPOCH FROM (now() - live.oldest_due)) * 1000)::bigint AS oldest_pending_age_ms,
               coalesce(recent.completed, 0) AS completed_last_minute,
               coalesce(live.workers, 0) AS workers,
               q.max_started, q.max_started_per_key, q.rate_per_second, q.rate_burst,
               coalesce((SELECT jsonb_agg(jsonb_build_object('key', k.key, 'started', k.started)
                                          ORDER BY k.started DESC, k.key)
                           FROM (SELECT s.concurrency_key AS key, count(*) AS started
                                   FROM $schema.tasks s
                                  WHERE s.queue = q.name AND s.status = 'started'
                                    AND s.concurrency_key IS NOT NULL
                                  GROUP BY s.concurrency_key
                                  ORDER BY count(*) DESC, s.concurrency_key
                                  LIMIT $4) k), '[]') AS busiest_keys
          FROM $schema.queues q
          LEFT JOIN live ON live.queue = q.name
          LEFT JOIN recent ON recent.queue = q.name
         WHERE ($1::text IS NULL OR q.name = $1)
           AND ($2::text IS NULL OR q.name > $2)
         ORDER BY q.name
         LIMIT $3";

    /// Every queue, by name, with its figures.
    pub async fn list(
        conn: &mut PgConnection,
        schema: &Schema,
    ) -> Result<Vec<QueueInfo>, QueueError> {
        crate::db::atomically!(
            conn,
            schema,
            Result<Vec<QueueInfo>, QueueError>,
            async {
                Ok(schema
                    .query_as(SELECT)
                    .bind(None::<&str>)
                    .bind(None::<&str>)
                    .bind(None::<i64>)
                    .bind(crate::queue::queue_limits::BUSIEST_KEYS)
                    .fetch_all(&mut *conn)
                    .await?)
            }
            .await
        )
    }

    /// A page of the queues, by name: at most `limit` (100 when `None`; 1
    /// to [`Cursor::MAX_LIMIT`](crate::paging::Cursor::MAX_LIMIT)) after
    /// the name `after`, with the name the next page begins after when
    /// more remain.
    pub async fn list_page(
        conn: &mut PgConnection,
        schema: &Schema,
        after: Option<&str>,
        limit: Option<i64>,
    ) -> Result<QueuePage, QueueError> {
        use crate::paging::Cursor;
        if let Some(after) = after {
            check(after)?;
        }
        let limit = limit
            .unwrap_or(Cursor::DEFAULT_LIMIT)
            .clamp(1, Cursor::MAX_LIMIT);
        crate::db::atomically!(
            conn,
            schema,
            Result<QueuePage, QueueError>,
            async {
                // One more than the page, to know whether another follows.
                let mut items: Vec<QueueInfo> = schema
                    .query_as(SELECT)
                    .bind(None::<&str>)
                    .bind(after)
                    .bind(limit + 1)
                    .bind(crate::queue::queue_limits::BUSIEST_KEYS)
                    .fetch_all(&mut *conn)
                    .await?;
                let more = items.len() as i64 > limit;
                items.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
                let next = more.then(|| items.last().map(|q| q.name.clone())).flatten();
                Ok(QueuePage { items, next })
            }
            .await
        )
    }

    /// One page of the queues, by name.
    #[derive(Clone, Debug, PartialEq)]
    pub struct QueuePage {
        /// The queues of the page.
        pub items: Vec<QueueInfo>,
        /// The name the next page begins after; `None` on the last.
        pub next: Option<String>,
    }

    /// Queue `name` with its figures; `None` when no task ever used the
    /// name and nobody paused it. A bad name is [`QueueError::BadInput`].
    pub async fn get(
        conn: &mut PgConnection,
        schema: &Schema,
        name: &str,
    ) -> Result<Option<QueueInfo>, QueueError> {
        check(name)?;
        crate::db::atomically!(
            conn,
            schema,
            Result<Option<QueueInfo>, QueueError>,
            async {
                Ok(schema
                    .query_as(SELECT)
                    .bind(name)
                    .bind(None::<&str>)
                    .bind(None::<i64>)
                    .bind(crate::queue::queue_limits::BUSIEST_KEYS)
                    .fetch_optional(&mut *conn)
                    .await?)
            }
            .await
        )
    }

    /// Pauses queue `name` on behalf of `by` (creating its row when no task
    /// used it yet); see the module. Answers the queue.
    pub async fn pause(
        conn: &mut PgConnection,
        schema: &Schema,
        name: &str,
        by: &str,
    ) -> Result<QueueInfo, QueueError> {
        set_paused(conn, schema, name, true, by).await
    }

    /// Resumes queue `name` on behalf of `by` and wakes idle workers; see
    /// the module. [`QueueError::NotFound`] for a name never used.
    pub async fn resume(
        conn: &mut PgConnection,
        schema: &Schema,
        name: &str,
        by: &str,
    ) -> Result<QueueInfo, QueueError> {
        set_paused(conn, schema, name, false, by).await
    }

    /// [`pause`] (`paused`) or [`resume`] queue `name`.
    pub async fn set_paused(
        conn: &mut PgConnection,
        schema: &Schema,
        name: &str,
        paused: bool,
        by: &str,
    ) -> Result<QueueInfo, QueueError> {
        check(name)?;
        crate::db::atomically!(
            conn,
            schema,
            async {
                // The page's rows change either way; a resume is new work too.
                let _announced = live::announce_on_return(Topics::TASKS);
                let mut tx = conn.begin().await?;
                // Race prevented: two operators (or an operator and the first
                // enqueue of the queue) changing one queue at once. The upsert
                // locks the row (or inserts it, meeting the enqueue's trigger on
                // the primary key); the flag test `paused <> $2` is re-checked on
                // the newest version under that lock, so exactly one of two
                // pauses changes the row and writes the audit row, the other
                // changes nothing. A resume of a name never used inserts nothing.
                let changed: Option<String> = if paused {
                    schema
                        .query_scalar(
                            "INSERT INTO $schema.queues AS q (name, paused, paused_at, updated_at)
                         VALUES ($1, true, now(), now())
                         ON CONFLICT (name) DO UPDATE
                            SET paused = true, paused_at = now(), updated_at = now()
                          WHERE NOT q.paused
                         RETURNING name",
                        )
                        .bind(name)
                        .fetch_optional(&mut *tx)
                        .await?
                } else {
                    schema
                        .query_scalar(
                            "UPDATE $schema.queues
                            SET paused = false, paused_at = NULL, updated_at = now()
                          WHERE name = $1 AND paused
                         RETURNING name",
                        )
                        .bind(name)
                        .fetch_optional(&mut *tx)
                        .await?
                };
                if changed.is_some() {
                    crate::lease::store::record_operator_action(
                        &mut tx,
                        schema,
                        &resource(name),
                        by,
                        if paused {
                            "queue_pause"
                        } else {
                            "queue_resume"
                        },
                        json!({ "queue": name }),
                    )
                    .await?;
                }
                let queue: Option<QueueInfo> = schema
                    .query_as(SELECT)
                    .bind(name)
                    .bind(None::<&str>)
                    .bind(None::<i64>)
                    .bind(crate::queue::queue_limits::BUSIEST_KEYS)
                    .fetch_optional(&mut *tx)
                    .await?;
                tx.commit().await?;
                let queue = queue.ok_or_else(|| QueueError::NotFound(name.to_string()))?;
                if !paused && changed.is_some() {
                    // After the commit: a worker woken now sees the flag cleared.
                    live::announce(Topics::WORK);
                }
                Ok(queue)
            }
            .await
        )
    }

    /// Sets queue `name`'s limits to `limits` (each `None` clears it) on
    /// behalf of `by`, creating the queue's row when no task used it yet,
    /// and answers the queue. Audited (`queue_limits` on `queue:<name>`) in
    /// the same transaction when anything changed; an unchanged set writes
    /// nothing. A new or changed rate starts with a full bucket. Idle
    /// workers are woken after the commit: a raised limit frees slots.
    pub async fn set_limits(
        conn: &mut PgConnection,
        schema: &Schema,
        name: &str,
        limits: &QueueLimits,
        by: &str,
    ) -> Result<QueueInfo, QueueError> {
        check(name)?;
        limits
            .validate()
            .map_err(|e| QueueError::BadInput(e.reason))?;
        crate::db::atomically!(
            conn,
            schema,
            async {
                let _announced = live::announce_on_return(Topics::TASKS);
                let mut tx = conn.begin().await?;
                // Race prevented: a change of the limits racing a claim of the
                // queue, or another change. The upsert locks the queue row, so
                // it waits for a limited claim in progress (which holds that
                // lock, see `sql::LOCK_LIMITED`), and the claims after it read
                // the new limits; of two changes, the second re-checks
                // `IS DISTINCT FROM` on the first's row and audits only if it
                // changes something. The bucket is reset only when the rate or
                // burst changes, so re-declaring the same limits (every
                // runtime's start) does not refill it.
                let changed: Option<String> = schema
                    .query_scalar(
                        "INSERT INTO $schema.queues AS q
                                (name, max_started, max_started_per_key, rate_per_second, rate_burst,
                                 rate_tokens, rate_at, limits_updated_at)
                         VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $4 IS NOT NULL THEN now() END, now())
                         ON CONFLICT (name) DO UPDATE
                            SET max_started = $2, max_started_per_key = $3,
                                rate_per_second = $4, rate_burst = $5,
                                rate_tokens = CASE
                                    WHEN $4 IS NULL THEN NULL
                                    WHEN q.rate_per_second = $4 AND q.rate_burst IS NOT DISTINCT FROM $5
                                    THEN q.rate_tokens ELSE $6 END,
                                rate_at = CASE
                                    WHEN $4 IS NULL THEN NULL
                                    WHEN q.rate_per_second = $4 AND q.rate_burst IS NOT DISTINCT FROM $5
                                    THEN q.rate_at ELSE now() END,
                                limits_updated_at = now()
                          WHERE (q.max_started, q.max_started_per_key, q.rate_per_second, q.rate_burst)
                                IS DISTINCT FROM ($2, $3, $4, $5)
                         RETURNING name",
                    )
                    .bind(name)
                    .bind(limits.max_started)
                    .bind(limits.max_started_per_key)
                    .bind(limits.rate_per_second)
                    .bind(limits.rate_burst)
                    .bind(limits.burst().map(f64::from))
                    .fetch_optional(&mut *tx)
                    .await?;
                if changed.is_some() {
                    crate::lease::store::record_operator_action(
                        &mut tx,
                        schema,
                        &resource(name),
                        by,
                        "queue_limits",
                        json!({ "queue": name, "limits": limits }),
                    )
                    .await?;
                }
                let queue = get(&mut tx, schema, name)
                    .await?
                    .ok_or_else(|| QueueError::NotFound(name.to_string()))?;
                tx.commit().await?;
                if changed.is_some() {
                    live::announce(Topics::WORK);
                }
                Ok(queue)
            }
            .await
        )
    }
}

//! Counts of the queue and the leases that stay cheap with a million
//! tasks: by task status from `task_counts`, a sharded counter table kept
//! by triggers on `tasks` (migration `…000006_task_counts`), summing 16 rows
//! instead of counting a million; "late" capped over the small partial
//! index of started tasks; live leases by a range scan. And the totals of
//! finished tasks ever, which a throughput sampler differences.

#[cfg(feature = "postgres")]
use crate::db::Schema;
use serde::{Deserialize, Serialize};
#[cfg(feature = "postgres")]
use sqlx::PgConnection;

/// "late" is counted up to this many (a larger number only says "a lot").
pub const LATE_CAP: i64 = 10_000;

/// How many things are in each state, right now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Counts {
    /// Tasks waiting to be claimed.
    pub tasks_pending: i64,
    /// Tasks claimed (late ones included).
    pub tasks_started: i64,
    /// Started tasks past their heartbeat deadline, up to [`LATE_CAP`].
    pub tasks_late: i64,
    /// Tasks completed.
    pub tasks_processed: i64,
    /// Tasks given up after their last attempt.
    pub tasks_failed: i64,
    /// Tasks an operator cancelled (or a workflow parent's failure did).
    pub tasks_cancelled: i64,
    /// Tasks waiting for their workflow parents or for a signal.
    #[serde(default)]
    pub tasks_waiting: i64,
    /// Leases not released and not expired.
    pub leases_active: i64,
}

impl Counts {
    /// Every task, whatever its status.
    pub fn tasks_total(&self) -> i64 {
        self.tasks_pending
            + self.tasks_started
            + self.tasks_processed
            + self.tasks_failed
            + self.tasks_cancelled
            + self.tasks_waiting
    }
}

/// Counts by state. Task counts are sums over `task_counts` (16 rows); "late" is counted over the partial index of started tasks and
/// stops at [`LATE_CAP`]; active leases are a range scan of
/// `leases_expires_at_idx` (released and expired leases lie before now()).
/// One statement, so all counts come from one snapshot.
#[cfg(feature = "postgres")]
pub async fn counts(conn: &mut PgConnection, schema: &Schema) -> sqlx::Result<Counts> {
    crate::db::atomically!(conn, schema, async {
        schema
            .query_as(
                "SELECT coalesce(sum(pending), 0)::bigint   AS tasks_pending,
                    coalesce(sum(started), 0)::bigint   AS tasks_started,
                    coalesce(sum(processed), 0)::bigint AS tasks_processed,
                    coalesce(sum(failed), 0)::bigint    AS tasks_failed,
                    coalesce(sum(cancelled), 0)::bigint AS tasks_cancelled,
                    coalesce(sum(waiting), 0)::bigint   AS tasks_waiting,
                    (SELECT count(*) FROM (SELECT 1 FROM $schema.tasks
                                            WHERE status = 'started' AND must_heartbeat_before <= now()
                                            LIMIT $1) late) AS tasks_late,
                    (SELECT count(*) FROM $schema.leases
                      WHERE expires_at > now() AND released_at IS NULL) AS leases_active
               FROM $schema.task_counts",
            )
            .bind(LATE_CAP)
            .fetch_one(&mut *conn)
            .await
    }
    .await)
}

/// The totals of processed and failed tasks ever (those still there and
/// those the maintenance job pruned, so the totals only grow), with the
/// database time in milliseconds: what the throughput sampler reads every
/// second.
#[cfg(feature = "postgres")]
pub async fn finished_totals(
    conn: &mut PgConnection,
    schema: &Schema,
) -> sqlx::Result<(i64, i64, i64)> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<(i64, i64, i64)>,
        async {
            schema
                .query_as(
                    "SELECT (EXTRACT(EPOCH FROM now()) * 1000)::bigint,
                    coalesce(sum(processed + pruned_processed), 0)::bigint,
                    coalesce(sum(failed + pruned_failed), 0)::bigint
               FROM $schema.task_counts",
                )
                .fetch_one(&mut *conn)
                .await
        }
        .await
    )
}

//! Dead letters you can act on (issue 40): the failed tasks grouped by
//! kind, queue and error, the error read as a group
//! (`task_error_group`: numbers, UUIDs and hex made alike), each group
//! with its count and its oldest and newest failure; an operator retries
//! a group at once ([`crate::queue::control::retry_failed_group`]).
//! Failed tasks are kept by a retention of their own
//! ([`crate::maintenance::Retention`], 30 days by default).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The most groups a summary answers (the largest first).
pub const MAX_GROUPS: i64 = 200;

/// One group of failed tasks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FailedGroup {
    /// Their kind.
    pub kind: String,
    /// Their queue.
    pub queue: String,
    /// Their error as a group: numbers `<n>`, UUIDs `<uuid>`, hex `<hex>`,
    /// at most 200 characters (empty when they have none).
    pub error_group: String,
    /// One of their errors as written (the newest).
    pub example: Option<String>,
    /// How many.
    pub count: i64,
    /// The first failure.
    pub oldest: DateTime<Utc>,
    /// The last failure.
    pub newest: DateTime<Utc>,
}

/// The failed tasks, grouped by kind, queue and error group, the largest
/// groups first (at most [`MAX_GROUPS`]). Reads every failed task (by the
/// status index): failed tasks are few beside the rest, and retention
/// bounds them.
#[cfg(feature = "postgres")]
pub async fn summary(
    conn: &mut sqlx::PgConnection,
    schema: &crate::db::Schema,
) -> Result<Vec<FailedGroup>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Vec<FailedGroup>, sqlx::Error>,
        async {
            schema
                .query_as(
                    "SELECT kind, queue, $schema.task_error_group(last_error) AS error_group,
                        (array_agg(last_error ORDER BY failed_at DESC, id DESC))[1] AS example,
                        count(*) AS count, min(failed_at) AS oldest, max(failed_at) AS newest
                   FROM $schema.tasks
                  WHERE status = 'failed'
                  GROUP BY 1, 2, 3
                  ORDER BY count(*) DESC, max(failed_at) DESC
                  LIMIT $1",
                )
                .bind(MAX_GROUPS)
                .fetch_all(&mut *conn)
                .await
        }
        .await
    )
}

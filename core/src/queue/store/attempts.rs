//! Reading a task's attempts on record (the attempts migration's triggers
//! write them, in the transaction of each claim and of its end).

use super::TaskError;
use crate::db::Schema;
use crate::queue::{Attempt, AttemptOutcome};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// A row of the read: the task was found, and one of its attempts if any.
#[derive(sqlx::FromRow)]
struct Row {
    number: Option<i32>,
    processor: Option<String>,
    fencing_token: Option<i64>,
    claimed_at: Option<DateTime<Utc>>,
    ended_at: Option<DateTime<Utc>>,
    outcome: Option<AttemptOutcome>,
    error: Option<String>,
}

/// Every attempt on record of task `id`, oldest first; empty for a task
/// never claimed. [`TaskError::NotFound`] when there is no such task.
pub async fn attempts(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
) -> Result<Vec<Attempt>, TaskError> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Vec<Attempt>, TaskError>,
        async {
            // One statement, so "no such task" and "no attempts yet" are told
            // apart in one snapshot: one row with no attempt for a task never
            // claimed, no row for no task.
            let rows: Vec<Row> = schema
                .query_as(
                    "SELECT a.number, a.processor, a.fencing_token, a.claimed_at, a.ended_at,
                        a.outcome, a.error
                   FROM $schema.tasks t
                   LEFT JOIN $schema.attempts a ON a.task_id = t.id
                  WHERE t.id = $1
                  ORDER BY a.number",
                )
                .bind(id)
                .fetch_all(&mut *conn)
                .await?;
            if rows.is_empty() {
                return Err(TaskError::NotFound(id));
            }
            Ok(rows
                .into_iter()
                .filter_map(|r| {
                    Some(Attempt {
                        number: r.number?,
                        processor: r.processor?,
                        fencing_token: r.fencing_token?,
                        claimed_at: r.claimed_at?,
                        ended_at: r.ended_at,
                        outcome: r.outcome?,
                        error: r.error,
                    })
                })
                .collect())
        }
        .await
    )
}

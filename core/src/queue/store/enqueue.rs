//! Enqueueing: a task added, in the caller's transaction when it is one.

use super::{TASK_COLUMNS, TaskError, millis};
use crate::db::Schema;
use crate::queue::{NewTask, Task, check_name};
use sqlx::PgConnection;

/// Adds `task` and answers it as stored. Refuses (with
/// [`TaskError::BadInput`]) an empty or over-long kind or queue and
/// `max_attempts` outside 1 to 1000. In the caller's transaction when
/// `conn` is one, so a service can enqueue together with its own writes.
pub async fn enqueue(
    conn: &mut PgConnection,
    schema: &Schema,
    task: &NewTask,
) -> Result<Task, TaskError> {
    crate::db::atomically!(conn, schema, Result<Task, TaskError>, async {
        let _announced =
            crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::WORK);
        if !(1..=1000).contains(&task.max_attempts) {
            return Err(TaskError::BadInput(
                "max_attempts must be between 1 and 1000".into(),
            ));
        }
        check_name("kind", &task.kind).map_err(TaskError::BadInput)?;
        check_name("queue", &task.queue).map_err(TaskError::BadInput)?;
        crate::json::storable(&task.data, "task_data").map_err(TaskError::BadInput)?;
        let delay_ms = millis(task.delay.unwrap_or_default());
        // scheduled_at is truncated to the column's milliseconds, not rounded:
        // rounded up, a task enqueued without delay was "not yet due" for up to
        // half a millisecond, and a worker woken by its announcement could find
        // nothing to claim and go back to sleep.
        let task = schema.query_as(&format!(
            "INSERT INTO $schema.tasks (task_data, max_attempts, scheduled_at, kind, queue, priority)
             VALUES ($1, $2, date_trunc('milliseconds', now() + make_interval(secs => $3::float8 / 1000)),
                     $4, $5, $6)
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(&task.data)
        .bind(task.max_attempts)
        .bind(delay_ms)
        .bind(&task.kind)
        .bind(&task.queue)
        .bind(task.priority)
        .fetch_one(&mut *conn)
        .await?;
        Ok(task)
    }
    .await)
}

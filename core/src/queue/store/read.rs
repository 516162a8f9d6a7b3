//! Reading tasks: one by id, and the lists, oldest or newest first.

use super::{TASK_COLUMNS, sql};
use crate::db::Schema;
use crate::lease::store::Page;
use crate::queue::{Task, TaskStatus};
use sqlx::PgConnection;

/// Task `id`, if any.
pub async fn get(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
) -> Result<Option<Task>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<Task>, sqlx::Error>,
        async {
            schema
                .query_as(&format!(
                    "SELECT {TASK_COLUMNS} FROM $schema.tasks WHERE id = $1"
                ))
                .bind(id)
                .fetch_optional(&mut *conn)
                .await
        }
        .await
    )
}

/// Tasks with `status` (all when `None`), ordered by id, one page at a time.
pub async fn list(
    conn: &mut PgConnection,
    schema: &Schema,
    status: Option<TaskStatus>,
    page: Page,
) -> Result<Vec<Task>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Vec<Task>, sqlx::Error>,
        async {
            schema
                .query_as(&sql::list(status, false))
                .bind(page.after_id)
                .bind(page.limit)
                .fetch_all(&mut *conn)
                .await
        }
        .await
    )
}

/// A page of the tasks with `status` (all when `None`), newest first:
/// what the dashboard shows and `GET /api/tasks?before=` answers.
pub async fn list_page(
    conn: &mut PgConnection,
    schema: &Schema,
    status: Option<TaskStatus>,
    cursor: crate::paging::Cursor,
) -> Result<crate::paging::Paged<Task>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<crate::paging::Paged<Task>, sqlx::Error>,
        async {
            let rows = schema
                .query_as(&sql::list(status, true))
                .bind(cursor.bound())
                .bind(cursor.limit)
                .fetch_all(&mut *conn)
                .await?;
            Ok(crate::paging::Paged::of(rows, cursor, |t: &Task| t.id))
        }
        .await
    )
}

//! Reading tasks: one by id, and the lists, oldest or newest first.

use super::{TASK_COLUMNS, sql};
use crate::lease::store::Page;
use crate::queue::{Task, TaskStatus};
use sqlx::PgConnection;

/// Task `id`, if any.
pub async fn get(conn: &mut PgConnection, id: i32) -> Result<Option<Task>, sqlx::Error> {
    sqlx::query_as(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1"))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await
}

/// Tasks with `status` (all when `None`), ordered by id, one page at a time.
pub async fn list(
    conn: &mut PgConnection,
    status: Option<TaskStatus>,
    page: Page,
) -> Result<Vec<Task>, sqlx::Error> {
    sqlx::query_as(&sql::list(status, false))
        .bind(page.after_id)
        .bind(page.limit)
        .fetch_all(&mut *conn)
        .await
}

/// A page of the tasks with `status` (all when `None`), newest first:
/// what the dashboard shows and `GET /api/tasks?before=` answers.
pub async fn list_page(
    conn: &mut PgConnection,
    status: Option<TaskStatus>,
    cursor: crate::paging::Cursor,
) -> Result<crate::paging::Paged<Task>, sqlx::Error> {
    let rows = sqlx::query_as(&sql::list(status, true))
        .bind(i32::try_from(cursor.bound()).unwrap_or(i32::MAX))
        .bind(cursor.limit)
        .fetch_all(&mut *conn)
        .await?;
    Ok(crate::paging::Paged::of(rows, cursor, |t: &Task| {
        i64::from(t.id)
    }))
}

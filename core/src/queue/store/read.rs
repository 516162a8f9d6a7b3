//! Reading tasks: one by id, and the lists, oldest or newest first.

use super::{TASK_COLUMNS, sql};
use crate::db::Schema;
use crate::lease::store::Page;
use crate::queue::{Task, TaskSearch};
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

/// The tasks `search` finds (a `TaskSearch`, or just an
/// `Option<TaskStatus>`: all when `None`), ordered by id, one page at a time.
pub async fn list(
    conn: &mut PgConnection,
    schema: &Schema,
    search: impl Into<TaskSearch>,
    page: Page,
) -> Result<Vec<Task>, sqlx::Error> {
    let search = search.into();
    crate::db::atomically!(
        conn,
        schema,
        Result<Vec<Task>, sqlx::Error>,
        async {
            bind_search(
                schema
                    .query_as(&sql::list(&search, false))
                    .bind(page.after_id)
                    .bind(page.limit),
                &search,
            )
            .fetch_all(&mut *conn)
            .await
        }
        .await
    )
}

/// A page of the tasks `search` finds (all when it is `None` or
/// [`TaskSearch::is_any`]), newest first: what the dashboard shows and
/// `GET /api/tasks?before=` answers. The cursor is a task id, and the
/// search is the same on every page, so paging through a search skips and
/// repeats no task (new tasks land before the first page).
pub async fn list_page(
    conn: &mut PgConnection,
    schema: &Schema,
    search: impl Into<TaskSearch>,
    cursor: crate::paging::Cursor,
) -> Result<crate::paging::Paged<Task>, sqlx::Error> {
    let search = search.into();
    crate::db::atomically!(
        conn,
        schema,
        Result<crate::paging::Paged<Task>, sqlx::Error>,
        async {
            let rows = bind_search(
                schema
                    .query_as(&sql::list(&search, true))
                    .bind(cursor.bound())
                    .bind(cursor.limit),
                &search,
            )
            .fetch_all(&mut *conn)
            .await?;
            Ok(crate::paging::Paged::of(rows, cursor, |t: &Task| t.id))
        }
        .await
    )
}

/// Binds `search`'s kind, queue and data, those it has, in the order
/// [`sql::list`] numbers them.
///
/// A search by data runs as an unnamed statement, planned anew with its
/// values every time, never prepared and cached: after a few runs of a
/// prepared statement PostgreSQL may switch to its generic plan, and a
/// generic plan cannot know that `task_data @> $n` matches ten tasks among
/// a million; it walks the primary key and reads the whole table (measured:
/// 580 ms instead of a millisecond; `core/tests/it/overview.rs`). Planning
/// costs a fraction of a millisecond.
pub(crate) fn bind_search<'q, O>(
    mut query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    search: &TaskSearch,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    if search.data.is_some() {
        query = query.persistent(false);
    }
    if let Some(kind) = &search.kind {
        query = query.bind(kind.clone());
    }
    if let Some(queue) = &search.queue {
        query = query.bind(queue.clone());
    }
    if let Some(data) = &search.data {
        query = query.bind(serde_json::Value::Object(data.clone()));
    }
    query
}

//! The instance store: registering, heartbeating and reading instances.
//! (Retention deletes dead ones: `maintenance`.)

use super::Instance;
use crate::db::Schema;
use crate::generator::RESOURCE as GENERATOR;
use crate::paging::{Cursor, Paged};
use sqlx::PgConnection;
use std::time::Duration;

/// Registers instance `id` serving on `address` (or re-registers it: a
/// restart with the same id starts afresh).
pub async fn register(
    conn: &mut PgConnection,
    schema: &Schema,
    id: &str,
    address: &str,
) -> sqlx::Result<()> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<()>,
        async {
            schema
                .query(
                    "INSERT INTO $schema.instances (id, address) VALUES ($1, $2)
             ON CONFLICT (id) DO UPDATE
                SET address = EXCLUDED.address, started_at = now(),
                    last_seen_at = now(), stopped_at = NULL",
                )
                .bind(id)
                .bind(address)
                .execute(&mut *conn)
                .await?;
            Ok(())
        }
        .await
    )
}

/// Records that instance `id` is alive now. `false` when it is not
/// registered or already stopped (then nothing changes).
pub async fn heartbeat(conn: &mut PgConnection, schema: &Schema, id: &str) -> sqlx::Result<bool> {
    crate::db::atomically!(conn, schema, async {
        let done = schema.query(
            "UPDATE $schema.instances SET last_seen_at = now() WHERE id = $1 AND stopped_at IS NULL",
        )
        .bind(id)
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }
    .await)
}

/// Records a clean shutdown of instance `id`.
pub async fn mark_stopped(conn: &mut PgConnection, schema: &Schema, id: &str) -> sqlx::Result<()> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<()>,
        async {
            schema
                .query(
                    "UPDATE $schema.instances SET stopped_at = now(), last_seen_at = now()
              WHERE id = $1 AND stopped_at IS NULL",
                )
                .bind(id)
                .execute(&mut *conn)
                .await?;
            Ok(())
        }
        .await
    )
}

/// The newest [`Cursor::MAX_LIMIT`] instances (dead ones are pruned by
/// retention), newest first, with `alive` judged by the database clock:
/// not stopped and seen within `alive_within`.
pub async fn list(
    conn: &mut PgConnection,
    schema: &Schema,
    alive_within: Duration,
) -> sqlx::Result<Vec<Instance>> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<Vec<Instance>>,
        async {
            Ok(list_page(
                conn,
                schema,
                alive_within,
                Cursor::new(None, Some(Cursor::MAX_LIMIT)),
            )
            .await?
            .items)
        }
        .await
    )
}

/// A page of the instances, newest (registered last) first, judged as
/// [`list`] does.
pub async fn list_page(
    conn: &mut PgConnection,
    schema: &Schema,
    alive_within: Duration,
    cursor: Cursor,
) -> sqlx::Result<Paged<Instance>> {
    crate::db::atomically!(conn, schema, async {
        let window_ms = i64::try_from(alive_within.as_millis()).unwrap_or(i64::MAX);
        let rows = schema
            .query_as(
                "SELECT i.id, i.seq, i.address, i.started_at, i.last_seen_at, i.stopped_at,
                    (i.stopped_at IS NULL
                     AND i.last_seen_at > now() - make_interval(secs => $1::float8 / 1000)) AS alive,
                    (EXTRACT(EPOCH FROM (now() - i.last_seen_at)) * 1000)::bigint AS last_seen_ms_ago,
                    EXISTS (SELECT 1 FROM $schema.leases l
                             WHERE l.resource = $2 AND l.holder = i.id
                               AND l.released_at IS NULL AND l.expires_at > now()) AS holds_generator
               FROM $schema.instances i
              WHERE i.seq < $3
              ORDER BY i.seq DESC
              LIMIT $4",
            )
            .bind(window_ms)
            .bind(GENERATOR)
            .bind(cursor.bound())
            .bind(cursor.limit)
            .fetch_all(&mut *conn)
            .await?;
        Ok(Paged::of(rows, cursor, |i: &Instance| i.seq))
    }
    .await)
}

/// Whether instance `id` is running (registered and not stopped); `None`
/// when there is no such instance.
pub async fn is_running(
    conn: &mut PgConnection,
    schema: &Schema,
    id: &str,
) -> sqlx::Result<Option<bool>> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<Option<bool>>,
        async {
            schema
                .query_scalar("SELECT stopped_at IS NULL FROM $schema.instances WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *conn)
                .await
        }
        .await
    )
}

/// The address instance `id` serves on, if it is registered and not stopped.
pub async fn address_if_running(
    conn: &mut PgConnection,
    schema: &Schema,
    id: &str,
) -> sqlx::Result<Option<String>> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<Option<String>>,
        async {
            schema
                .query_scalar(
                    "SELECT address FROM $schema.instances WHERE id = $1 AND stopped_at IS NULL",
                )
                .bind(id)
                .fetch_optional(&mut *conn)
                .await
        }
        .await
    )
}

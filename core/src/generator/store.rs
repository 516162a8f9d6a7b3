//! The generator store: the SQL for `generator_state` and the fenced insert
//! of generated tasks.

use super::{Desired, GeneratorStatus, RESOURCE};
use crate::db::Schema;
use crate::lease::Holder;
use crate::queue::store::{self as tasks, TaskError};
use crate::queue::{NewTask, Task};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};

/// The desired state.
pub async fn desired(conn: &mut PgConnection, schema: &Schema) -> sqlx::Result<Desired> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<Desired>,
        async {
            schema
                .query_scalar("SELECT desired FROM $schema.generator_state WHERE id")
                .fetch_one(&mut *conn)
                .await
        }
        .await
    )
}

/// Sets the desired state on behalf of instance `by`, and records the
/// operator action in `lease_events` in the same transaction. Returns the
/// previous desired state.
pub async fn set_desired(
    conn: &mut PgConnection,
    schema: &Schema,
    desired: Desired,
    by: &str,
) -> sqlx::Result<Desired> {
    crate::db::atomically!(conn, schema, async {
        let mut tx = conn.begin().await?;
        let previous: Desired = schema
            .query_scalar("SELECT desired FROM $schema.generator_state WHERE id FOR UPDATE")
            .fetch_one(&mut *tx)
            .await?;
        schema.query(
            "UPDATE $schema.generator_state SET desired = $1, updated_at = now(), updated_by = $2 WHERE id",
        )
        .bind(desired)
        .bind(by)
        .execute(&mut *tx)
        .await?;
        let action = match desired {
            Desired::Running => "generator_start",
            Desired::Stopped => "generator_stop",
        };
        crate::lease::store::record_operator_action(
            &mut tx,
            schema,
            RESOURCE,
            by,
            action,
            json!({"previous": previous.as_str()}),
        )
        .await?;
        tx.commit().await?;
        Ok(previous)
    }
    .await)
}

/// The desired state and the live lease, the same for every instance.
pub async fn status(conn: &mut PgConnection, schema: &Schema) -> sqlx::Result<GeneratorStatus> {
    crate::db::atomically!(
        conn,
        schema,
        sqlx::Result<GeneratorStatus>,
        async {
            schema
                .query_as(
                    "SELECT g.desired, g.updated_at, g.updated_by,
                    l.holder, l.fencing_token, l.expires_at,
                    (EXTRACT(EPOCH FROM (l.expires_at - now())) * 1000)::bigint AS expires_in_ms
               FROM $schema.generator_state g
               LEFT JOIN $schema.leases l
                 ON l.resource = $1 AND l.released_at IS NULL AND l.expires_at > now()
              WHERE g.id",
                )
                .bind(RESOURCE)
                .fetch_one(&mut *conn)
                .await
        }
        .await
    )
}

/// Inserts one generated task, but only if `holder` still holds the live
/// `singleton:generator` lease with fencing token `token`. `Ok(None)` when
/// it does not: nothing is inserted and the refusal is recorded in
/// `lease_events` as `stale_write_refused`.
///
/// The task's data gets `generator` and `generator_token` added, naming
/// the term that produced it.
pub async fn insert_task(
    conn: &mut PgConnection,
    schema: &Schema,
    holder: &Holder,
    token: i64,
    mut task: NewTask,
) -> Result<Option<Task>, TaskError> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<Task>, TaskError>,
        async {
            let _announced = crate::live::announce_on_return(crate::live::Topics::TASKS);
            if let Value::Object(map) = &mut task.data {
                map.insert("generator".into(), json!(holder.as_str()));
                map.insert("generator_token".into(), json!(token));
            }
            let mut tx = conn.begin().await?;
            // Race prevented: two generators inserting at once around a failover
            // (see `lease::store::fence`): the check and the insert share one
            // transaction, so every task of term N commits before term N+1 begins.
            let held = crate::lease::store::fence(
                &mut tx,
                schema,
                RESOURCE,
                holder,
                token,
                "generator_insert",
            )
            .await?;
            if held.is_none() {
                tx.commit().await?;
                return Ok(None);
            }
            let task = tasks::enqueue(&mut tx, schema, &task).await?;
            tx.commit().await?;
            Ok(Some(task))
        }
        .await
    )
}

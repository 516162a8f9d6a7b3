//! The guard every processor write shares (the claim is current: this
//! processor, this token, before its deadline) and the record of a write
//! it refused (`stale_write_refused` in `lease_events`).

use super::{TASK_COLUMNS, TaskError};
use crate::db::Schema;
use crate::lease::Holder;
use crate::queue::{Task, TaskStatus};
use serde_json::json;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryAs;
use sqlx::{Connection, PgConnection, Postgres, Transaction};

/// The guard every processor write shares: the task is started, claimed by
/// `processor` with `token`, and its deadline has not passed.
pub(super) const HOLDS_CLAIM: &str = "id = $1 AND processor = $2 AND fencing_token = $3 \
    AND status = 'started' AND must_heartbeat_before > now()";

/// Records a refused write and says why it was refused. Runs in the
/// caller's transaction, which must then commit.
pub(super) async fn refuse(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    processor: &Holder,
    token: i64,
    op: &str,
) -> Result<TaskError, TaskError> {
    crate::db::atomically!(
        conn,
        schema,
        async {
            let current: Option<Task> = schema
                .query_as(&format!(
                    "SELECT {TASK_COLUMNS} FROM $schema.tasks WHERE id = $1"
                ))
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?;
            let Some(current) = current else {
                return Ok(TaskError::NotFound(id));
            };
            let reason = if current.status == TaskStatus::Processed {
                "already processed".to_string()
            } else if current.status != TaskStatus::Started {
                format!("not started (it is {})", current.status.as_str())
            } else if current.fencing_token != Some(token) {
                format!(
                    "fencing token {token} is not current (the current claim has {})",
                    current.fencing_token.unwrap_or_default()
                )
            } else if current.processor.as_deref() != Some(processor.as_str()) {
                format!(
                    "claimed by {}, not {processor}",
                    current.processor.as_deref().unwrap_or("nobody")
                )
            } else {
                "its lease expired".to_string()
            };
            schema
            .query(
                "INSERT INTO $schema.lease_events (resource, holder, fencing_token, kind, detail)
             VALUES ($1, $2, $3, 'stale_write_refused', $4)",
            )
            .bind(Task::resource_name(id))
            .bind(processor.as_str())
            .bind(token)
            .bind(json!({
                "op": op,
                "task_id": id,
                "reason": reason,
                "current_token": current.fencing_token,
                "current_processor": current.processor,
            }))
            .execute(&mut *conn)
            .await?;
            crate::metrics::refused(crate::metrics::Refused::Task(&current));
            Ok(TaskError::Stale { id, reason })
        }
        .await
    )
}

/// [`refuse`] in a transaction of its own.
pub(super) async fn refuse_alone(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    processor: &Holder,
    token: i64,
    op: &str,
) -> Result<TaskError, TaskError> {
    crate::db::atomically!(
        conn,
        schema,
        async {
            let mut tx = conn.begin().await?;
            let err = refuse(&mut tx, schema, id, processor, token, op).await?;
            tx.commit().await?;
            Ok(err)
        }
        .await
    )
}

/// The write of one claim that heartbeat and fail share: in a transaction
/// of its own, `UPDATE tasks SET {set} WHERE` [`HOLDS_CLAIM`], binding `$1`
/// the task, `$2` the processor, `$3` the token and, from `$4` on, what
/// `bind` adds. Answers the open transaction and the updated task, for the
/// caller to change the lease in the same transaction and commit; when the
/// guard refuses, records the refusal ([`refuse`]), commits it and answers
/// [`TaskError::Stale`] (or [`TaskError::NotFound`]).
///
/// Race prevented (for every caller): a write from a processor whose claim
/// expired or was taken over, racing the takeover. The UPDATE locks the
/// task row and re-checks processor, token, status and deadline on its
/// newest version, so once the deadline passed or a takeover committed
/// (new token), the old processor's write changes nothing.
#[expect(
    clippy::too_many_arguments,
    reason = "the claim (id, processor, token), what to set and bind, and the schema: each is needed, and a struct would only rename them"
)]
pub(super) async fn update_claim<'c>(
    conn: &'c mut PgConnection,
    schema: &Schema,
    id: i64,
    processor: &Holder,
    token: i64,
    op: &str,
    set: &str,
    bind: impl for<'q> FnOnce(
        QueryAs<'q, Postgres, Task, PgArguments>,
    ) -> QueryAs<'q, Postgres, Task, PgArguments>,
) -> Result<(Transaction<'c, Postgres>, Task), TaskError> {
    let mut tx = conn.begin().await?;
    let sql =
        format!("UPDATE $schema.tasks SET {set} WHERE {HOLDS_CLAIM} RETURNING {TASK_COLUMNS}");
    let query = schema
        .query_as(&sql)
        .bind(id)
        .bind(processor.as_str())
        .bind(token);
    let updated: Option<Task> = bind(query).fetch_optional(&mut *tx).await?;
    match updated {
        Some(task) => Ok((tx, task)),
        None => {
            let err = refuse(&mut tx, schema, id, processor, token, op).await?;
            tx.commit().await?;
            Err(err)
        }
    }
}

/// Records in task `id`'s history (`lease_events`, `task:<id>`) that
/// `processor`'s claim of token `token` ended as `kind` (`snoozed`,
/// `waiting`), with `detail`; in the transaction of that end.
pub(super) async fn record_end(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    processor: &Holder,
    token: i64,
    kind: &str,
    detail: serde_json::Value,
) -> sqlx::Result<()> {
    schema
        .query(
            "INSERT INTO $schema.lease_events (resource, holder, fencing_token, kind, detail)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(Task::resource_name(id))
        .bind(processor.as_str())
        .bind(token)
        .bind(kind)
        .bind(detail)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

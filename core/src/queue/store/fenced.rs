//! The fenced transaction: a handler's own writes, committed only together
//! with its task's completion, and only if the completion is accepted.

use super::complete::completion_arrays;
use super::guard::refuse;
use super::{Completion, TaskError, sql};
use crate::db::Schema;
use crate::lease::Holder;
use crate::queue::Task;
use serde_json::Value;
use sqlx::PgConnection;

/// The savepoint a [`FencedTransaction`] rolls back to when its completion
/// is refused: everything the handler wrote comes after it.
const FENCE_SAVEPOINT: &str = "leasekeeper_fence";

/// A transaction for a handler's own writes that commits only together
/// with the task's completion, and only if the completion is accepted:
/// exactly-once effects in the database.
///
/// It runs on a connection of the queue's pool with the host's
/// `search_path` (so the handler's SQL names its own tables as usual; the
/// completion names leasekeeper's schema, so it needs no other), and
/// a savepoint taken before the first write. [`FencedTransaction::complete`]
/// then runs the fenced completion in the same transaction: accepted, and
/// everything commits at once; refused (a stale holder: the claim was taken
/// over, or its lease ran out), and the handler's writes are rolled back to
/// the savepoint, the refusal is recorded in `lease_events`, and that alone
/// commits.
///
/// Begin it when the handler is ready to write, not at its start: the
/// transaction holds a connection of the pool while it is open.
pub struct FencedTransaction {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    /// The pool's schema ([`Schema::of`]), where the completion goes.
    schema: Schema,
}

/// Sets `search_path` for the rest of the current transaction.
async fn set_search_path(
    conn: &mut PgConnection,
    schema: &Schema,
    search_path: &str,
) -> Result<(), sqlx::Error> {
    schema
        .query("SELECT set_config('search_path', $1, true)")
        .bind(search_path)
        .execute(conn)
        .await?;
    Ok(())
}

impl std::fmt::Debug for FencedTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedTransaction")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl FencedTransaction {
    /// Begins a transaction on `pool` whose statements see `search_path`
    /// (the host's, e.g. `"$user", public`).
    pub async fn begin(pool: &sqlx::PgPool, search_path: &str) -> Result<Self, sqlx::Error> {
        let schema = Schema::of(pool);
        let mut tx = pool.begin().await?;
        set_search_path(&mut tx, &schema, search_path).await?;
        sqlx::query(&format!("SAVEPOINT {FENCE_SAVEPOINT}"))
            .execute(&mut *tx)
            .await?;
        Ok(FencedTransaction { tx, schema })
    }

    /// Completes task `id` of `processor`'s claim with `token` and commits
    /// the handler's writes with it; see the type's documentation. Answers
    /// [`TaskError::Stale`] when refused (nothing of the handler's stays).
    pub async fn complete(
        mut self,
        id: i64,
        processor: &Holder,
        token: i64,
        output: Option<&Value>,
    ) -> Result<Task, TaskError> {
        let _announced = crate::live::announce_on_return(
            crate::live::Topics::TASKS | crate::live::Topics::LEASES,
        );
        // Race prevented: a stale holder's effects committing. The handler
        // wrote in this transaction; the completion below locks the task
        // row and re-checks the claim (processor, token, status, deadline)
        // on its newest version, as `complete` does. Accepted, the row
        // stays locked until the commit, so no takeover can begin between
        // the check and the commit of the handler's writes (a claim skips
        // the locked row; heartbeats and refusals wait). The deadline is
        // judged at this statement's start, not the transaction's, which
        // may have begun long before (`now()` would accept a completion
        // made after the lease ran out).
        let sql = sql::complete_at("statement_timestamp()");
        let (ids, tokens, processors, outputs) = completion_arrays(&[Completion::new(
            id,
            token,
            processor.clone(),
            output.cloned(),
        )]);
        let done: Option<Task> = self
            .schema
            .query_as(&sql)
            .bind(&ids)
            .bind(&tokens)
            .bind(&processors)
            .bind(&outputs)
            .fetch_optional(&mut *self.tx)
            .await?;
        if let Some(task) = done {
            self.tx.commit().await?;
            crate::metrics::completed(&task);
            return Ok(task);
        }
        // Refused: undo the handler's writes, record the refusal, commit that.
        sqlx::query(&format!("ROLLBACK TO SAVEPOINT {FENCE_SAVEPOINT}"))
            .execute(&mut *self.tx)
            .await?;
        let err = refuse(&mut self.tx, &self.schema, id, processor, token, "complete").await?;
        self.tx.commit().await?;
        Err(err)
    }
}

impl std::ops::Deref for FencedTransaction {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for FencedTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

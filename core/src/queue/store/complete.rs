//! Completion: a task processed at most once, by the holder of its current
//! claim, its lease released in the same statement; one claim or many.

use super::guard::refuse_alone;
use super::{MAX_BATCH, TaskError, sql};
use crate::db::Schema;
use crate::lease::Holder;
use crate::queue::Task;
use serde_json::Value;
use sqlx::PgConnection;

/// Completes task `id` with `output`. Accepted only from the processor that
/// holds the current claim with `token`, before its deadline; a task is
/// therefore completed at most once. The task's lease is released. One
/// statement (one round trip, one commit) when accepted.
pub async fn complete(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    processor: &Holder,
    token: i64,
    output: Option<&Value>,
) -> Result<Task, TaskError> {
    crate::db::atomically!(
        conn,
        schema,
        async {
            let _announced = crate::live::announce_on_return(
                crate::live::Topics::TASKS | crate::live::Topics::LEASES,
            );
            let done = complete_claims(
                conn,
                schema,
                &[Completion::new(
                    id,
                    token,
                    processor.clone(),
                    output.cloned(),
                )],
            )
            .await?;
            if let Some(task) = done.into_iter().next() {
                return Ok(task);
            }
            Err(refuse_alone(conn, schema, id, processor, token, "complete").await?)
        }
        .await
    )
}

/// Completes many claims of `processor` at once, each `(task id, fencing
/// token)`, all with `output`: one statement, one commit. Answers the
/// tasks completed; each claim that was not current is refused and
/// recorded like a refused [`complete`], and left out of the answer.
pub async fn complete_all_of(
    conn: &mut PgConnection,
    schema: &Schema,
    processor: &Holder,
    claims: &[(i64, i64)],
    output: Option<&Value>,
) -> Result<Vec<Task>, TaskError> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Vec<Task>, TaskError>,
        async {
            let each: Vec<Completion> = claims
                .iter()
                .map(|&(id, token)| Completion::new(id, token, processor.clone(), output.cloned()))
                .collect();
            Ok(complete_each(conn, schema, &each)
                .await?
                .into_iter()
                .filter_map(Result::ok)
                .collect())
        }
        .await
    )
}

/// One completion of [`complete_each`]: task `id` of `processor`'s claim
/// with fencing token `token`, and its output.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The task.
    pub id: i64,
    /// The claim's fencing token.
    pub token: i64,
    /// Who claimed it.
    pub processor: Holder,
    /// What the task produced (`task_output`).
    pub output: Option<Value>,
}

impl Completion {
    /// Task `id`, completed by `processor` with `token` and `output`.
    pub fn new(id: i64, token: i64, processor: Holder, output: Option<Value>) -> Self {
        Completion {
            id,
            token,
            processor,
            output,
        }
    }
}

/// Completes each of `completions` (of any processors, with outputs of
/// their own) in one statement and one commit: what a runtime's completer
/// writes. Answers each completion's outcome, in their order: the task
/// completed, or why it was refused (stale token, lost lease, finished
/// task), each refusal recorded like a refused [`complete`].
pub async fn complete_each(
    conn: &mut PgConnection,
    schema: &Schema,
    completions: &[Completion],
) -> Result<Vec<Result<Task, TaskError>>, TaskError> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Vec<Result<Task, TaskError>>, TaskError>,
        async {
            let _announced = crate::live::announce_on_return(
                crate::live::Topics::TASKS | crate::live::Topics::LEASES,
            );
            if completions.len() > MAX_BATCH {
                return Err(TaskError::BadInput(format!(
                    "a batch completes at most {MAX_BATCH} tasks, not {}",
                    completions.len()
                )));
            }
            let done = complete_claims(conn, schema, completions).await?;
            let mut accepted: std::collections::HashMap<(i64, i64), Task> = done
                .into_iter()
                .map(|t| ((t.id, t.fencing_token.unwrap_or_default()), t))
                .collect();
            let mut outcomes = Vec::with_capacity(completions.len());
            for c in completions {
                outcomes.push(match accepted.remove(&(c.id, c.token)) {
                    Some(task) => Ok(task),
                    None => {
                        Err(
                            refuse_alone(conn, schema, c.id, &c.processor, c.token, "complete")
                                .await?,
                        )
                    }
                });
            }
            Ok(outcomes)
        }
        .await
    )
}

/// The columns of `completions` as the arrays [`sql::complete`] binds, in
/// task id order.
pub(super) fn completion_arrays(
    completions: &[Completion],
) -> (Vec<i64>, Vec<i64>, Vec<String>, Vec<Option<Value>>) {
    let mut ordered: Vec<&Completion> = completions.iter().collect();
    ordered.sort_unstable_by_key(|c| (c.id, c.token));
    let mut arrays = (
        Vec::with_capacity(ordered.len()),
        Vec::with_capacity(ordered.len()),
        Vec::with_capacity(ordered.len()),
        Vec::with_capacity(ordered.len()),
    );
    for c in ordered {
        arrays.0.push(c.id);
        arrays.1.push(c.token);
        arrays.2.push(c.processor.as_str().to_string());
        arrays.3.push(c.output.clone());
    }
    arrays
}

async fn complete_claims(
    conn: &mut PgConnection,
    schema: &Schema,
    completions: &[Completion],
) -> Result<Vec<Task>, TaskError> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Vec<Task>, TaskError>,
        async {
            // Race prevented: a paused processor waking up and completing a task
            // that was taken over meanwhile (the "stale completion"). The UPDATE
            // locks each row and re-checks the claim (processor, token, status,
            // deadline) on its newest version: a new token, a finished task or a
            // passed deadline means nothing is written for that task. The lease is
            // released in the same statement, only for the terms just completed
            // (same holder and token), so a late release never ends a newer term.
            // Rows are locked in id order, so two batches never deadlock; one
            // batch naming a task twice completes it at most once (the second
            // row finds it processed).
            let sql = sql::complete();
            let (ids, tokens, processors, outputs) = completion_arrays(completions);
            let done: Vec<Task> = schema
                .query_as(&sql)
                .bind(&ids)
                .bind(&tokens)
                .bind(&processors)
                .bind(&outputs)
                .fetch_all(&mut *conn)
                .await?;
            done.iter().for_each(crate::metrics::completed);
            Ok(done)
        }
        .await
    )
}

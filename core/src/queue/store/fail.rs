//! Failure: an attempt reported failed, the task back to pending after the
//! retry policy's backoff or failed for good, the claim released.

use super::guard::update_claim;
use super::{RetryPolicy, TaskError, millis};
use crate::db::Schema;
use crate::lease::Holder;
use crate::queue::{AttemptOutcome, Task};
use sqlx::PgConnection;
use std::borrow::Cow;

pub use crate::queue::{MAX_ERROR_CHARS, MAX_SNOOZE};

/// `error` cut to [`MAX_ERROR_CHARS`], ending in `…` when cut.
pub fn bounded_error(error: &str) -> Cow<'_, str> {
    if error.chars().nth(MAX_ERROR_CHARS).is_none() {
        return Cow::Borrowed(error);
    }
    let mut cut: String = error.chars().take(MAX_ERROR_CHARS - 1).collect();
    cut.push('…');
    Cow::Owned(cut)
}

/// Reports that an attempt at task `id` failed with `error`. The task goes
/// back to pending after the policy's backoff (less its jitter), or to
/// failed once it has used its max attempts (the policy's, else its own). Accepted only from the current claim's holder.
/// An `error` past [`MAX_ERROR_CHARS`] is kept cut (a simulated worker's
/// message quotes the bad task data it got, which may be long).
pub async fn fail(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    processor: &Holder,
    token: i64,
    error: &str,
    policy: RetryPolicy,
) -> Result<Task, TaskError> {
    fail_as(
        conn,
        schema,
        id,
        processor,
        token,
        error,
        policy,
        AttemptOutcome::Failed,
    )
    .await
}

/// [`fail`], with the attempt on record ending as `outcome`: `Failed` (the
/// handler failed), `TimedOut` (the worker stopped it at its time limit) or
/// `Interrupted` (the worker let go of it unfinished). For the queue each
/// is a failed attempt; only the record tells them apart. `GivenBack`, which
/// a worker of an earlier version sends for `Interrupted`, is recorded as
/// `Interrupted`: a given-back attempt is one not used
/// ([`give_back_each`](super::give_back_each)). Any other outcome is
/// [`TaskError::BadInput`].
#[expect(
    clippy::too_many_arguments,
    reason = "fail's claim, error and policy, and the outcome: a struct would only rename them"
)]
pub async fn fail_as(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    processor: &Holder,
    token: i64,
    error: &str,
    policy: RetryPolicy,
    outcome: AttemptOutcome,
) -> Result<Task, TaskError> {
    let outcome = match outcome {
        AttemptOutcome::GivenBack => AttemptOutcome::Interrupted,
        AttemptOutcome::Failed | AttemptOutcome::TimedOut | AttemptOutcome::Interrupted => outcome,
        _ => {
            return Err(TaskError::BadInput(format!(
                "a failed attempt ends as failed, timed_out or interrupted, not {}",
                outcome.as_str()
            )));
        }
    };
    crate::db::atomically!(conn, schema, async {
        let _announced =
            crate::live::announce_on_return(crate::live::Topics::TASKS | crate::live::Topics::LEASES);
        // Race prevented: a late failure report from a processor that lost the
        // claim, which would otherwise reset a task another worker now holds.
        // Same guard as complete, re-checked on the locked row (see
        // `update_claim`).
        policy.check().map_err(TaskError::BadInput)?;
        let (base, max) = (millis(policy.base), millis(policy.max));
        let error = bounded_error(error).into_owned();
        // The policy's max attempts ($8), when it has one, replaces the
        // task's own (every expression here reads the row as it was).
        // The delay: the backoff less up to the jitter's fraction ($7) of it.
        let (mut tx, task) = update_claim(
            conn,
            schema,
            id,
            processor,
            token,
            "fail",
            "status = CASE WHEN attempts >= COALESCE($8::int4, max_attempts) THEN 'failed' ELSE 'pending' END,
             failed_at = CASE WHEN attempts >= COALESCE($8::int4, max_attempts) THEN now() END,
             scheduled_at = CASE WHEN attempts >= COALESCE($8::int4, max_attempts) THEN scheduled_at
                 ELSE now() + make_interval(secs =>
                     LEAST($5::float8, $4::float8 * power(2, GREATEST(attempts - 1, 0)))
                     * (1 - $7::float8 * random()) / 1000) END,
             max_attempts = COALESCE($8::int4, max_attempts),
             must_heartbeat_before = NULL,
             last_error = $6",
            |q| {
                q.bind(base)
                    .bind(max)
                    .bind(error)
                    .bind(policy.jitter)
                    .bind(policy.max_attempts)
            },
        )
        .await?;
        if outcome != AttemptOutcome::Failed {
            // The trigger recorded the attempt's end as a failure; say which
            // kind, in the same transaction (the token names the attempt).
            schema
                .query(
                    "UPDATE $schema.attempts SET outcome = $3
                      WHERE task_id = $1 AND fencing_token = $2 AND outcome = 'failed'",
                )
                .bind(id)
                .bind(token)
                .bind(outcome)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        crate::metrics::failed(&task);
        Ok(task)
    }
    .await)
}

/// Puts claimed task `id` back to pending, due in `delay`, without using up
/// an attempt (its attempt count goes back by one), which ends the claim;
/// the task's history records the snooze (`snoozed`, with
/// `{"for_ms": …}`). Accepted only from the current claim's holder, as
/// [`fail`] is.
pub async fn snooze(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    processor: &Holder,
    token: i64,
    delay: std::time::Duration,
) -> Result<Task, TaskError> {
    if delay > MAX_SNOOZE {
        return Err(TaskError::BadInput(
            "a snooze must be at most 366 days".into(),
        ));
    }
    crate::db::atomically!(conn, schema, async {
        let _announced = crate::live::announce_on_return(
            crate::live::Topics::TASKS | crate::live::Topics::LEASES | crate::live::Topics::WORK,
        );
        // Race prevented: a snooze from a processor that lost the claim
        // (its lease ran out and another worker took the task over); it
        // would put a task another worker holds back to pending. Same guard
        // as complete and fail, re-checked on the locked row.
        let delay_ms = millis(delay);
        let (mut tx, task) = update_claim(
            conn,
            schema,
            id,
            processor,
            token,
            "snooze",
            "status = 'pending', attempts = GREATEST(attempts - 1, 0),
             scheduled_at = date_trunc('milliseconds', now() + make_interval(secs => $4::float8 / 1000)),
             must_heartbeat_before = NULL",
            |q| q.bind(delay_ms as f64),
        )
        .await?;
        super::guard::record_end(
            &mut tx,
            schema,
            id,
            processor,
            token,
            "snoozed",
            serde_json::json!({ "for_ms": delay_ms }),
        )
        .await?;
        tx.commit().await?;
        Ok(task)
    }
    .await)
}

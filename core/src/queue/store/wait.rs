//! Durable waits (issue 40): a running handler ends its attempt waiting for
//! a named signal ([`wait_for`]); a producer's [`signal`] makes the task
//! pending again with the signal's payload in its `signals`; at the wait's
//! timeout the rescuer's pass makes it pending without it
//! ([`resume_timed_out`]). A waiting task is only a row: it survives
//! restarts and failovers, and the claim rule never takes it.

use super::guard::update_claim;
use super::{TASK_COLUMNS, TaskError, millis};
use crate::db::Schema;
use crate::lease::Holder;
use crate::live::{self, Topics};
use crate::queue::{Task, TaskName, TaskStatus};
use serde_json::Value;
use sqlx::PgConnection;
use std::time::Duration;

pub use crate::queue::MAX_WAIT;

/// Checks a signal's name (1 to 128 characters, no control characters)
/// and a wait's timeout (1 ms to [`MAX_WAIT`]).
fn check(signal: &str, timeout: Option<Duration>) -> Result<(), TaskError> {
    TaskName::check("signal", signal).map_err(TaskError::BadInput)?;
    if let Some(t) = timeout
        && (t < Duration::from_millis(1) || t > MAX_WAIT)
    {
        return Err(TaskError::BadInput(
            "timeout_seconds must be between 0.001 and 31622400".into(),
        ));
    }
    Ok(())
}

/// Ends `processor`'s claim of task `id` (token `token`) waiting for the
/// signal `signal`, for at most `timeout`: the task becomes `waiting`
/// (never claimed), its attempt given back (the next claim has the same
/// number), its claim released. Refused like a completion
/// ([`TaskError::Stale`], recorded) when the claim is not current.
pub async fn wait_for(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    processor: &Holder,
    token: i64,
    signal: &str,
    timeout: Duration,
) -> Result<Task, TaskError> {
    check(signal, Some(timeout))?;
    crate::db::atomically!(conn, schema, async {
        let _announced = live::announce_on_return(Topics::TASKS | Topics::LEASES);
        // Race prevented: a wait from a processor that lost the claim (its
        // lease ran out and another worker took the task over); it would
        // take a task another worker runs out of the queue. Same guard as
        // complete, fail and snooze, re-checked on the locked row.
        let timeout_ms = millis(timeout);
        let (mut tx, task) = update_claim(
            conn,
            schema,
            id,
            processor,
            token,
            "wait",
            "status = 'waiting', attempts = GREATEST(attempts - 1, 0),
             wait_signal = $4,
             wait_until = date_trunc('milliseconds', now() + make_interval(secs => $5::float8 / 1000)),
             must_heartbeat_before = NULL",
            |q| q.bind(signal.to_string()).bind(timeout_ms as f64),
        )
        .await?;
        super::guard::record_end(
            &mut tx,
            schema,
            id,
            processor,
            token,
            "waiting",
            serde_json::json!({ "signal": signal, "timeout_ms": timeout_ms }),
        )
        .await?;
        tx.commit().await?;
        Ok(task)
    }
    .await)
}

/// Signals task `id`: when it is waiting for `name`, it becomes pending at
/// once with `payload` under `name` in its `signals`, and idle workers are
/// woken. [`TaskError::NotFound`] without such a task;
/// [`TaskError::Conflict`] when it is not waiting for `name` (another
/// signal, no signal, finished, or its wait timed out first), saying what
/// it is doing instead; nothing changes then.
pub async fn signal(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
    name: &str,
    payload: &Value,
) -> Result<Task, TaskError> {
    check(name, None)?;
    crate::json::storable(payload, "payload").map_err(TaskError::BadInput)?;
    crate::db::atomically!(conn, schema, Result<Task, TaskError>, async {
        let _announced = live::announce_on_return(Topics::TASKS | Topics::WORK);
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        // Race prevented: two signals, or a signal and the wait's timeout,
        // reaching one waiting task at once. The update locks the row and
        // re-checks `status = 'waiting' AND wait_signal = $2` on its newest
        // version: the first makes the task pending, the second finds it
        // pending and changes nothing (409), so a wait ends once.
        let woken: Option<Task> = schema
            .query_as(&format!(
                "UPDATE $schema.tasks
                    SET status = 'pending', scheduled_at = date_trunc('milliseconds', now()),
                        signals = coalesce(signals, '{{}}'::jsonb) || jsonb_build_object($2::text, $3::jsonb),
                        wait_signal = NULL, wait_until = NULL
                  WHERE id = $1 AND status = 'waiting' AND wait_signal = $2
                 RETURNING {TASK_COLUMNS}"
            ))
            .bind(id)
            .bind(name)
            .bind(payload)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(task) = woken else {
            let now: Option<(TaskStatus, Option<String>, i32)> = schema
                .query_as("SELECT status, wait_signal, parents_left FROM $schema.tasks WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            // Ended here, not when the connection is next used: the update
            // that found the task no longer waiting still holds its row
            // lock, and a claim would skip the task until it goes.
            tx.rollback().await?;
            return Err(match now {
                None => TaskError::NotFound(id),
                Some((TaskStatus::Waiting, Some(other), _)) => TaskError::Conflict(format!(
                    "task {id} waits for the signal {other:?}, not {name:?}; nothing changed"
                )),
                Some((TaskStatus::Waiting, None, left)) => TaskError::Conflict(format!(
                    "task {id} waits for {left} parent(s) in its workflow, not for a signal; nothing changed"
                )),
                Some((status, ..)) => TaskError::Conflict(format!(
                    "task {id} is {}, not waiting for a signal; nothing changed",
                    status.as_str()
                )),
            });
        };
        schema
            .query(
                "INSERT INTO $schema.lease_events (resource, kind, detail)
                 VALUES ($1, 'signalled', jsonb_build_object('signal', $2::text))",
            )
            .bind(Task::resource_name(id))
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(task)
    }
    .await)
}

/// Makes pending the waiting tasks whose wait for a signal timed out (up
/// to `batch`), without the signal: their handler finds it missing from
/// `signals`, and the signal it waited for in
/// [`Job::wait_timed_out`](crate::worker::handler::Job::wait_timed_out)
/// (the task keeps `wait_signal` and `wait_until`), and decides. Answers how many. Run by the rescuer's pass
/// (every `rescue_interval`), so a timeout takes effect within that long.
pub async fn resume_timed_out(
    conn: &mut PgConnection,
    schema: &Schema,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    crate::db::atomically!(conn, schema, Result<u64, sqlx::Error>, async {
        // The race it prevents (a signal for the same task) is named
        // beside the statement, in `sql::resume_timed_out`.
        let n = schema
            .query(
                &super::sql::resume_timed_out(),
            )
            .bind(batch)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if n > 0 {
            live::announce(Topics::TASKS | Topics::WORK);
        }
        Ok(n)
    }
    .await)
}

//! Enqueueing: tasks added, one or many in one statement, in the caller's
//! transaction when it is one; a unique key answered with the task that
//! holds it.

use super::{TASK_COLUMNS, TaskError, millis};
use crate::db::Schema;
use crate::queue::{NewTask, Task, TaskStatus};
use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgConnection, Row};

pub use crate::queue::{MAX_ENQUEUE_BATCH, MAX_UNIQUE_KEY_CHARS, UNIQUE_PERIODS};

/// What an enqueue did: added the task, or found the task that holds its
/// unique key (then nothing was added).
#[derive(Clone, Debug, PartialEq)]
pub enum Enqueued {
    /// The task was added.
    New(Task),
    /// A task of the same kind already holds the unique key: this one.
    Existing(Task),
}

impl Enqueued {
    /// The task added or found.
    pub fn task(&self) -> &Task {
        match self {
            Enqueued::New(t) | Enqueued::Existing(t) => t,
        }
    }

    /// The task added or found.
    pub fn into_task(self) -> Task {
        match self {
            Enqueued::New(t) | Enqueued::Existing(t) => t,
        }
    }

    /// True when the task was added.
    pub fn is_new(&self) -> bool {
        matches!(self, Enqueued::New(_))
    }
}

/// Adds `task` and answers it as stored; with a unique key that a task of
/// its kind already holds, adds nothing and answers that task (see
/// [`enqueue_outcome`] to tell which). Refuses (with
/// [`TaskError::BadInput`]) a task outside its fields' limits
/// ([`NewTask::validate`]: a bad kind or queue, `max_attempts` outside 1
/// to 1000, a delay past 24 hours, a bad timeout, unique key or period). In
/// the caller's transaction when `conn` is one, so a service can enqueue
/// together with its own writes.
pub async fn enqueue(
    conn: &mut PgConnection,
    schema: &Schema,
    task: &NewTask,
) -> Result<Task, TaskError> {
    Ok(enqueue_outcome(conn, schema, task).await?.into_task())
}

/// [`enqueue`], telling a new task from the one that already held its
/// unique key.
pub async fn enqueue_outcome(
    conn: &mut PgConnection,
    schema: &Schema,
    task: &NewTask,
) -> Result<Enqueued, TaskError> {
    let mut all = enqueue_many(conn, schema, std::slice::from_ref(task)).await?;
    Ok(all.pop().expect("one outcome per task"))
}

/// Adds every task of `tasks` (at most [`MAX_ENQUEUE_BATCH`]) in one statement,
/// in the caller's transaction when `conn` is one, and answers one outcome
/// per task, in order. Nothing is added when any task is bad (the error
/// names its index: `tasks[3]: …`).
///
/// Unique keys are honoured as by [`enqueue`]: a task whose key a task of
/// its kind already holds (committed, or earlier in the same batch) is not
/// added, and its outcome is that task.
pub async fn enqueue_many(
    conn: &mut PgConnection,
    schema: &Schema,
    tasks: &[NewTask],
) -> Result<Vec<Enqueued>, TaskError> {
    if tasks.len() > MAX_ENQUEUE_BATCH {
        return Err(TaskError::BadInput(crate::queue::wire::too_many(
            tasks.len(),
        )));
    }
    // The one check of every field's limits (`NewTask::validate`), here
    // where every enqueue passes: a service calling the store is refused
    // as a REST client is.
    for (i, task) in tasks.iter().enumerate() {
        task.validate().map_err(|e| {
            TaskError::BadInput(if tasks.len() == 1 {
                e.to_string()
            } else {
                format!("tasks[{i}]: {e}")
            })
        })?;
    }
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    crate::db::atomically!(
        conn,
        schema,
        Result<Vec<Enqueued>, TaskError>,
        async {
            let _announced = crate::live::announce_on_return(
                crate::live::Topics::TASKS | crate::live::Topics::WORK,
            );
            insert_all(conn, schema, tasks).await
        }
        .await
    )
    .map_err(queue_cap)
}

/// The queue cap's refusal (raised by the queues trigger) as its own error.
pub(crate) fn queue_cap(e: TaskError) -> TaskError {
    match e {
        TaskError::Db(sqlx::Error::Database(db))
            if db.code().as_deref() == Some(crate::queue::queues::TOO_MANY_QUEUES_SQLSTATE) =>
        {
            TaskError::QueueCap(db.message().to_string())
        }
        e => e,
    }
}

/// The columns of a batch, as arrays bound to one statement.
#[derive(Default)]
struct Columns {
    data: Vec<serde_json::Value>,
    max_attempts: Vec<i32>,
    delay_ms: Vec<f64>,
    kind: Vec<String>,
    queue: Vec<String>,
    priority: Vec<i16>,
    unique_key: Vec<Option<String>>,
    unique_scope: Vec<Option<&'static str>>,
    period_s: Vec<Option<f64>>,
    schedule: Vec<Option<String>>,
    tick_at: Vec<Option<chrono::DateTime<chrono::Utc>>>,
    timeout_ms: Vec<Option<i32>>,
    concurrency_key: Vec<Option<String>>,
}

impl Columns {
    fn of(tasks: &[NewTask]) -> Self {
        let mut c = Columns::default();
        for t in tasks {
            c.data.push(t.data.clone());
            c.max_attempts.push(t.max_attempts);
            c.delay_ms.push(millis(t.delay.unwrap_or_default()) as f64);
            c.kind.push(t.kind.clone());
            c.queue.push(t.queue.clone());
            c.priority.push(t.priority);
            c.unique_key.push(t.unique.as_ref().map(|u| u.key.clone()));
            c.unique_scope
                .push(t.unique.as_ref().map(|u| u.scope.as_str()));
            c.period_s.push(
                t.unique
                    .as_ref()
                    .and_then(|u| u.period)
                    .map(|p| p.as_secs_f64().floor()),
            );
            c.schedule
                .push(t.scheduled_by.as_ref().map(|(s, _)| s.clone()));
            c.tick_at
                .push(t.scheduled_by.as_ref().and_then(|(_, t)| *t));
            c.timeout_ms.push(timeout_ms(t));
            c.concurrency_key.push(t.concurrency_key.clone());
        }
        c
    }
}

/// A batch without unique keys: nothing in it can conflict, so one plain
/// insert adds every task, with no arbiter index, no look-up and no join,
/// and the answer is built here from the input and the three columns the
/// database decides (id, scheduled_at by its clock, created_at). Half the
/// statement's time of the general path at 10,000 tasks, and none of the
/// 10,000 rows (data and all) sent back and parsed again.
async fn insert_plain(
    conn: &mut PgConnection,
    schema: &Schema,
    tasks: &[NewTask],
) -> Result<Vec<Enqueued>, TaskError> {
    let c = Columns::of(tasks);
    // Decides no ownership (a new task has no claim and no key to hold).
    // Ids are drawn in the input's order (`nextval` is evaluated after the
    // ordinality's order), so sorted ids match the input one to one,
    // whatever order RETURNING answers in. scheduled_at is truncated as in
    // the general path (see there why not rounded).
    let mut rows: Vec<(i64, DateTime<Utc>, DateTime<Utc>)> = schema
        .query_as(
            "INSERT INTO $schema.tasks (id, task_data, max_attempts, scheduled_at, kind, queue,
                                        priority, schedule, tick_at, timeout_ms, concurrency_key)
             SELECT nextval('$schema.tasks_id_seq'), i.task_data, i.max_attempts,
                    date_trunc('milliseconds', now() + make_interval(secs => i.delay_ms / 1000)),
                    i.kind, i.queue, i.priority, i.schedule, i.tick_at, i.timeout_ms,
                    i.concurrency_key
               FROM unnest($1::jsonb[], $2::int4[], $3::float8[], $4::text[], $5::text[],
                           $6::int2[], $7::text[], $8::timestamptz[], $9::int4[], $10::text[])
                    WITH ORDINALITY
                    AS i(task_data, max_attempts, delay_ms, kind, queue, priority, schedule,
                         tick_at, timeout_ms, concurrency_key, n)
              ORDER BY i.n
             RETURNING id, scheduled_at, created_at",
        )
        .bind(&c.data)
        .bind(&c.max_attempts)
        .bind(&c.delay_ms)
        .bind(&c.kind)
        .bind(&c.queue)
        .bind(&c.priority)
        .bind(&c.schedule)
        .bind(&c.tick_at)
        .bind(&c.timeout_ms)
        .bind(&c.concurrency_key)
        .fetch_all(&mut *conn)
        .await?;
    if rows.len() != tasks.len() {
        return Err(TaskError::Db(sqlx::Error::Protocol(format!(
            "{} tasks inserted, {} answered",
            tasks.len(),
            rows.len()
        ))));
    }
    rows.sort_unstable_by_key(|(id, ..)| *id);
    Ok(tasks
        .iter()
        .zip(rows)
        .map(|(t, (id, scheduled_at, created_at))| {
            Enqueued::New(new_task(t, id, scheduled_at, created_at))
        })
        .collect())
}

/// The tasks of workflow `workflow` (checked by its caller, none with a
/// unique key): `tasks[i]` under `refs[i]`, waiting for `parents[i]`
/// parents (pending when none) with `on_failure[i]` (null when none).
/// Answers the ids in the input's order. Decides no ownership: a new task
/// has no claim; a waiting one is not claimable until its parents end
/// (`tasks_parents_ended`).
pub(crate) async fn insert_workflow_tasks(
    conn: &mut PgConnection,
    schema: &Schema,
    workflow: i64,
    tasks: &[NewTask],
    refs: &[String],
    parents: &[i32],
    on_failure: &[Option<&'static str>],
) -> Result<Vec<i64>, TaskError> {
    let c = Columns::of(tasks);
    // Ids in the input's order, as in insert_plain.
    let mut ids: Vec<i64> = schema
        .query_scalar(
            "INSERT INTO $schema.tasks (id, task_data, max_attempts, scheduled_at, kind, queue,
                                        priority, timeout_ms, concurrency_key, status,
                                        workflow_id, workflow_ref, parents_left, on_parent_failure)
             SELECT nextval('$schema.tasks_id_seq'), i.task_data, i.max_attempts,
                    date_trunc('milliseconds', now() + make_interval(secs => i.delay_ms / 1000)),
                    i.kind, i.queue, i.priority, i.timeout_ms, i.concurrency_key,
                    CASE WHEN i.parents > 0 THEN 'waiting' ELSE 'pending' END,
                    $11, i.ref, i.parents, i.on_failure
               FROM unnest($1::jsonb[], $2::int4[], $3::float8[], $4::text[], $5::text[],
                           $6::int2[], $7::int4[], $8::text[], $9::text[], $10::int4[],
                           $12::text[])
                    WITH ORDINALITY
                    AS i(task_data, max_attempts, delay_ms, kind, queue, priority, timeout_ms,
                         concurrency_key, ref, parents, on_failure, n)
              ORDER BY i.n
             RETURNING id",
        )
        .bind(&c.data)
        .bind(&c.max_attempts)
        .bind(&c.delay_ms)
        .bind(&c.kind)
        .bind(&c.queue)
        .bind(&c.priority)
        .bind(&c.timeout_ms)
        .bind(&c.concurrency_key)
        .bind(refs)
        .bind(parents)
        .bind(workflow)
        .bind(on_failure)
        .fetch_all(&mut *conn)
        .await?;
    ids.sort_unstable();
    Ok(ids)
}

/// `t` as stored without a unique key under `id`, before anything claimed it.
fn new_task(t: &NewTask, id: i64, scheduled_at: DateTime<Utc>, created_at: DateTime<Utc>) -> Task {
    Task {
        id,
        kind: t.kind.clone(),
        queue: t.queue.clone(),
        priority: t.priority,
        task_data: crate::json::as_stored(&t.data),
        scheduled_at,
        processor: None,
        last_heartbeat_at: None,
        must_heartbeat_before: None,
        started_at: None,
        processed_at: None,
        task_output: None,
        status: TaskStatus::Pending,
        attempts: 0,
        max_attempts: t.max_attempts,
        fencing_token: None,
        last_error: None,
        failed_at: None,
        cancelled_at: None,
        created_at,
        heartbeat_in_ms: None,
        unique_key: None,
        unique_scope: None,
        schedule: t.scheduled_by.as_ref().map(|(s, _)| s.clone()),
        tick_at: t.scheduled_by.as_ref().and_then(|(_, at)| *at),
        timeout_ms: timeout_ms(t),
        concurrency_key: t.concurrency_key.clone(),
        workflow_id: None,
        workflow_ref: None,
        parents_left: 0,
        on_parent_failure: None,
        parent_outputs: None,
        wait_signal: None,
        wait_until: None,
        signals: None,
    }
}

/// `t`'s timeout as the column stores it.
fn timeout_ms(t: &NewTask) -> Option<i32> {
    t.timeout
        .map(|d| i32::try_from(d.as_millis()).unwrap_or(i32::MAX))
}

/// The fewest tasks without unique keys that [`insert_copy`] adds; fewer
/// go by [`insert_plain`], one round trip instead of two (not tuned).
const COPY_MIN: usize = 64;

/// A large batch without unique keys, by `COPY … FROM STDIN`: the rows go
/// as text the server parses straight into the table, with no arrays to
/// take apart and no expression per row (River inserts many jobs the same
/// way). Two round trips: the ids and the database's clock first, then the
/// rows, sent in chunks as they are written (the server parses one while
/// the next is written); the answer is built here, as in [`insert_plain`],
/// while the server inserts the last rows (and commits them, outside a
/// caller's transaction). The threshold is not tuned: below it the one
/// round trip of the plain insert is worth more than COPY's cheaper rows.
async fn insert_copy(
    conn: &mut PgConnection,
    schema: &Schema,
    tasks: &[NewTask],
) -> Result<Vec<Enqueued>, TaskError> {
    use crate::db::copy::{Field, Rows};
    use chrono::{DurationRound, TimeDelta};
    /// Rows per chunk sent.
    const CHUNK: usize = 1000;
    let count = i32::try_from(tasks.len()).expect("a batch is at most MAX_ENQUEUE_BATCH");
    let mut delays = Vec::with_capacity(tasks.len());
    for (i, t) in tasks.iter().enumerate() {
        delays.push(
            TimeDelta::try_milliseconds(millis(t.delay.unwrap_or_default()))
                .ok_or_else(|| TaskError::BadInput(format!("tasks[{i}]: the delay is too long")))?,
        );
    }
    // Decides no ownership (a new task has no claim and no key to hold).
    // The ids are drawn before the rows exist, sorted so that they follow
    // the input's order; the clock is the database's, as a default of the
    // table would be (the same value all through the caller's transaction,
    // when there is one).
    let (now, mut ids): (DateTime<Utc>, Vec<i64>) = schema
        .query_as(
            "SELECT now(), ARRAY(SELECT nextval('$schema.tasks_id_seq')
                                   FROM generate_series(1, $1))",
        )
        .bind(count)
        .fetch_one(&mut *conn)
        .await?;
    if ids.len() != tasks.len() {
        return Err(TaskError::Db(sqlx::Error::Protocol(format!(
            "{} ids drawn for {} tasks",
            ids.len(),
            tasks.len()
        ))));
    }
    ids.sort_unstable();
    // Truncated to the column's milliseconds, as insert_plain does (see
    // the general path why not rounded); created_at as well, so the answer
    // is what is stored.
    let now = now
        .duration_trunc(TimeDelta::milliseconds(1))
        .expect("a database timestamp truncates to milliseconds");
    let mut scheduled = Vec::with_capacity(tasks.len());
    for (i, delay) in delays.into_iter().enumerate() {
        scheduled
            .push(now.checked_add_signed(delay).ok_or_else(|| {
                TaskError::BadInput(format!("tasks[{i}]: the delay is too long"))
            })?);
    }
    let mut copy_in = conn
        .copy_in_raw(schema.sql(
            "COPY $schema.tasks (id, task_data, max_attempts, scheduled_at, kind, queue, priority,
                                 schedule, tick_at, timeout_ms, created_at, concurrency_key)
             FROM STDIN",
        ))
        .await?;
    let mut rows = Rows::with_capacity(CHUNK.min(tasks.len()), 128);
    for (n, ((t, id), at)) in tasks.iter().zip(&ids).zip(&scheduled).enumerate() {
        rows.push(&[
            Field::Int(*id),
            Field::Json(&t.data),
            Field::Int(t.max_attempts.into()),
            Field::Time(Some(*at)),
            Field::Text(Some(&t.kind)),
            Field::Text(Some(&t.queue)),
            Field::Int(t.priority.into()),
            Field::Text(t.scheduled_by.as_ref().map(|(s, _)| s.as_str())),
            Field::Time(t.scheduled_by.as_ref().and_then(|(_, at)| *at)),
            Field::OptInt(timeout_ms(t).map(Into::into)),
            Field::Time(Some(now)),
            Field::Text(t.concurrency_key.as_deref()),
        ]);
        if (n + 1) % CHUNK == 0 || n + 1 == tasks.len() {
            copy_in.send(rows.take()).await?;
        }
    }
    let answer = async {
        tasks
            .iter()
            .zip(ids)
            .zip(scheduled)
            .map(|((t, id), scheduled_at)| Enqueued::New(new_task(t, id, scheduled_at, now)))
            .collect::<Vec<_>>()
    };
    // `finish` sends the end of the rows and waits for the server, which
    // leaves the answer its time to be built.
    let (added, answer) = tokio::join!(copy_in.finish(), answer);
    let added = added?;
    if added != tasks.len() as u64 {
        return Err(TaskError::Db(sqlx::Error::Protocol(format!(
            "{} tasks copied, {added} added",
            tasks.len()
        ))));
    }
    Ok(answer)
}

/// How often a unique key whose holder disappeared between the insert and
/// the look-up (it finished, or its transaction rolled back) is tried again.
const UNIQUE_ROUNDS: usize = 5;

async fn insert_all(
    conn: &mut PgConnection,
    schema: &Schema,
    tasks: &[NewTask],
) -> Result<Vec<Enqueued>, TaskError> {
    if tasks.iter().all(|t| t.unique.is_none()) {
        return if tasks.len() >= COPY_MIN {
            insert_copy(conn, schema, tasks).await
        } else {
            insert_plain(conn, schema, tasks).await
        };
    }
    let mut outcomes: Vec<Option<Enqueued>> = vec![None; tasks.len()];
    // Indices still to insert: all of them, then those whose key's holder
    // could not be found.
    let mut todo: Vec<usize> = (0..tasks.len()).collect();
    for _ in 0..UNIQUE_ROUNDS {
        let batch: Vec<NewTask> = todo.iter().map(|&i| tasks[i].clone()).collect();
        let c = Columns::of(&batch);
        // Race prevented: two enqueues of one unique key at once (64 in the
        // test). The unique index decides, not a look before the insert:
        // the second insert waits for the first's transaction; if that
        // commits, ON CONFLICT DO NOTHING adds nothing, and the holder is
        // read below by a statement of its own (a new snapshot, in which the
        // committed row is visible). If it rolls back, the second is added.
        // A key repeated within the batch is added once: the later rows
        // conflict with the earlier row of the same statement.
        //
        // Ids are drawn in the input's order before the insert, so each row
        // of the answer is matched to its input by id (`n`).
        //
        // scheduled_at is truncated to the column's milliseconds, not
        // rounded: rounded up, a task enqueued without delay was "not yet
        // due" for up to half a millisecond, and a worker woken by its
        // announcement could find nothing to claim and go back to sleep.
        let rows = schema
            .query(&format!(
                "WITH input AS MATERIALIZED (
                    SELECT i.*, nextval('$schema.tasks_id_seq') AS id,
                           CASE WHEN i.period_s IS NOT NULL
                                THEN i.unique_key || '@'
                                     || (floor(EXTRACT(EPOCH FROM now()) / i.period_s) * i.period_s)::bigint
                                ELSE i.unique_key END AS slot
                      FROM unnest($1::jsonb[], $2::int4[], $3::float8[], $4::text[], $5::text[],
                                  $6::int2[], $7::text[], $8::text[], $9::float8[], $10::text[],
                                  $11::timestamptz[], $12::int4[], $13::text[])
                           WITH ORDINALITY
                           AS i(task_data, max_attempts, delay_ms, kind, queue, priority,
                                unique_key, unique_scope, period_s, schedule, tick_at,
                                timeout_ms, concurrency_key, n)
                     ORDER BY i.n
                 ), added AS (
                    INSERT INTO $schema.tasks (id, task_data, max_attempts, scheduled_at, kind, queue,
                                               priority, unique_key, unique_scope, unique_slot,
                                               schedule, tick_at, timeout_ms, concurrency_key)
                    SELECT id, task_data, max_attempts,
                           date_trunc('milliseconds', now() + make_interval(secs => delay_ms / 1000)),
                           kind, queue, priority, unique_key, unique_scope, slot, schedule, tick_at,
                           timeout_ms, concurrency_key
                      FROM input ORDER BY n
                    ON CONFLICT (kind, unique_slot)
                       WHERE unique_slot IS NOT NULL
                         AND (unique_scope <> 'active' OR status IN ('pending', 'started', 'waiting'))
                       DO NOTHING
                    RETURNING {TASK_COLUMNS}
                 )
                 SELECT input.n, input.slot AS wanted_slot, added.*
                   FROM input LEFT JOIN added ON added.id = input.id
                  ORDER BY input.n"
            ))
            .bind(&c.data)
            .bind(&c.max_attempts)
            .bind(&c.delay_ms)
            .bind(&c.kind)
            .bind(&c.queue)
            .bind(&c.priority)
            .bind(&c.unique_key)
            .bind(&c.unique_scope)
            .bind(&c.period_s)
            .bind(&c.schedule)
            .bind(&c.tick_at)
            .bind(&c.timeout_ms)
            .bind(&c.concurrency_key)
            .fetch_all(&mut *conn)
            .await?;
        let mut taken: Vec<(usize, String)> = Vec::new();
        for row in &rows {
            let n: i64 = row.try_get("n")?;
            let index = todo[usize::try_from(n - 1).expect("ordinals start at 1")];
            let added: Option<i64> = row.try_get("id")?;
            if added.is_some() {
                outcomes[index] = Some(Enqueued::New(Task::from_row(row)?));
            } else {
                let slot: String = row.try_get("wanted_slot")?;
                taken.push((index, slot));
            }
        }
        if taken.is_empty() {
            break;
        }
        // The holders of the keys that were taken, each as it is now.
        let kinds: Vec<String> = taken.iter().map(|(i, _)| tasks[*i].kind.clone()).collect();
        let slots: Vec<String> = taken.iter().map(|(_, s)| s.clone()).collect();
        let holders = schema
            .query(&format!(
                "SELECT w.n, t.* FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS w(kind, slot, n)
                   JOIN LATERAL (
                        SELECT {TASK_COLUMNS} FROM $schema.tasks
                         WHERE kind = w.kind AND unique_slot = w.slot
                           AND (unique_scope <> 'active' OR status IN ('pending', 'started', 'waiting'))
                   ) t ON true"
            ))
            .bind(&kinds)
            .bind(&slots)
            .fetch_all(&mut *conn)
            .await?;
        for row in &holders {
            let n: i64 = row.try_get("n")?;
            let index = taken[usize::try_from(n - 1).expect("ordinals start at 1")].0;
            let holder = Task::from_row(row)?;
            // A key repeated in the batch: the holder is the batch's own
            // earlier task (new in its own outcome).
            outcomes[index] = Some(Enqueued::Existing(holder));
        }
        todo = taken
            .iter()
            .map(|(i, _)| *i)
            .filter(|i| outcomes[*i].is_none())
            .collect();
        if todo.is_empty() {
            break;
        }
    }
    if let Some(i) = outcomes.iter().position(Option::is_none) {
        return Err(TaskError::Conflict(format!(
            "the unique key {:?} is held by a task this transaction cannot see; try again",
            tasks[i].unique.as_ref().map(|u| u.key.as_str())
        )));
    }
    Ok(outcomes
        .into_iter()
        .map(|o| o.expect("every task answered"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::testing::TestDb;
    use chrono::{DurationRound, TimeDelta};

    /// The columns a schedule sets (only the scheduler can), through
    /// both plain paths: stored and answered alike.
    #[tokio::test]
    async fn a_schedule_and_its_tick_are_stored_as_answered_by_copy_and_by_insert() {
        let db = TestDb::new().await;
        let schema = Schema::default();
        let mut conn = db.pool.acquire().await.unwrap();
        let at = Utc::now()
            .duration_trunc(TimeDelta::milliseconds(1))
            .unwrap();
        let batch: Vec<NewTask> = (0..COPY_MIN)
            .map(|i| {
                let mut t = NewTask::new("tick", serde_json::json!({ "i": i }));
                t.scheduled_by = Some((format!("nightly \\N {i}"), (i % 2 == 0).then_some(at)));
                t
            })
            .collect();
        for tasks in [&batch[..], &batch[..2]] {
            let out = enqueue_many(&mut conn, &schema, tasks).await.unwrap();
            for (o, input) in out.iter().zip(tasks) {
                let read = super::super::get(&mut conn, &schema, o.task().id)
                    .await
                    .unwrap()
                    .expect("stored");
                assert_eq!(o.task(), &read);
                assert_eq!(
                    (read.schedule.as_ref(), read.tick_at),
                    input
                        .scheduled_by
                        .as_ref()
                        .map(|(s, at)| (Some(s), *at))
                        .unwrap()
                );
            }
        }
    }
}

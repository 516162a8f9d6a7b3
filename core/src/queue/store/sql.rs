//! The queue's hot statements as text: what a claim, a completion and a
//! list run, for a DBA to `EXPLAIN` against their own data or load-test
//! with pgbench (the benchmark's raw ceilings do exactly that, and a test
//! checks the lists' plans), without reading this crate's source. The store
//! runs these very strings, with the schema put in for `$schema`
//! ([`crate::db::Schema::sql`]).

use super::TASK_COLUMNS;

/// The one statement that claims up to `limit` tasks of queue `$3`, the
/// n-th task claimed for the n-th holder of the array `$1` (which has
/// `limit` names; one name repeated for a batch of one holder), with a
/// lease of `$2` milliseconds each (see [`claim_batch`](super::claim_batch),
/// [`claim_for`](super::claim_for) and [`claim_next`](super::claim_next));
/// with `by_kind`, only tasks whose kind is in the array `$4`. The rows
/// come in claim order (late tasks first, then by priority, due time and
/// id), so that a holder given several (a worker's local queue, see
/// [`crate::worker::batch`]) runs them in the queue's order.
///
/// **The claim rule**, the only place it is written: a task is claimable
/// when it is pending and due, or late (started, its deadline passed) with
/// an attempt left; its queue is not paused ([`RUNNING`]); and nobody holds
/// its lease `task:<id>` (the lease store's acquire decides, see
/// [`claim_past_held`]). A late task that used its attempts is never
/// claimed: the rescuer fails it ([`crate::queue::rescuer`]). A new rule
/// (a limit per key, say) is a condition here, in both candidate sets.
///
/// The limit is written into the statement, not bound: with a bound limit
/// PostgreSQL cannot tell a one-task claim from a thousand-task one when it
/// plans the prepared statement, finds its generic plan too dear, and plans
/// the statement anew on every claim (measured: 1,400 claims/s instead of
/// 2,600). One cached statement per batch size instead.
///
/// The kind filter is written in or left out, not bound as `($4 IS NULL OR
/// kind = ANY($4))`, for the same reason: a generic plan could not tell.
///
/// A paused queue ([`crate::queue::queues`]) gives nothing: the statement
/// reads the flag itself ([`RUNNING`]), so a pause is effective at the next
/// claim, in the database, on every runtime at once.
pub fn claim(limit: usize, by_kind: bool) -> String {
    claim_statement(limit, by_kind, false)
}

/// [`claim`] that also passes over the tasks whose lease someone holds by
/// hand (through the lease API): what [`claim_next`](super::claim_next)
/// runs when [`claim`] found only such candidates. [`claim`] takes them as
/// candidates and leaves them unclaimed (its lease upsert is the lease
/// store's acquire, which leaves a live lease alone), so with a limit of
/// one a held task at the head of the queue would hide every task behind
/// it. This variant reads each candidate's lease first; [`claim`] does not,
/// so the hot path pays nothing for a case that needs a person.
///
/// The test is written so that it runs per candidate, by the lease's
/// unique resource: a scalar subquery, which PostgreSQL never turns into a
/// join, and `lease_live`, which no index on the deadline can serve (see
/// there: a join could otherwise read every live lease for each claim).
pub fn claim_past_held(limit: usize, by_kind: bool) -> String {
    claim_statement(limit, by_kind, true)
}

/// The text of [`claim`] and [`claim_past_held`]: one rule, the lease test
/// written in or left out.
fn claim_statement(limit: usize, by_kind: bool, past_held: bool) -> String {
    let kinds = if by_kind { "AND kind = ANY($4)" } else { "" };
    let unheld = if past_held {
        format!(
            "AND NOT COALESCE((SELECT {live} FROM $schema.leases l
                                WHERE l.resource = 'task:' || tasks.id), false)",
            live = lease_live("now()")
        )
    } else {
        String::new()
    };
    format!(
        "WITH late AS (
            SELECT id, true AS late, last_heartbeat_at AS last_seen FROM $schema.tasks
             WHERE status = 'started' AND must_heartbeat_before <= now()
               AND attempts < max_attempts
               AND queue = $3 {kinds} {RUNNING} {unheld}
             ORDER BY must_heartbeat_before, id
             LIMIT {limit} FOR UPDATE SKIP LOCKED
         ), fresh AS (
            SELECT id, false AS late, NULL::timestamptz AS last_seen FROM $schema.tasks
             WHERE status = 'pending' AND scheduled_at <= now()
               AND queue = $3 {kinds} {RUNNING} {unheld}
               AND NOT EXISTS (SELECT 1 FROM late)
             ORDER BY priority, scheduled_at, id
             LIMIT {limit} FOR UPDATE SKIP LOCKED
         ), candidate AS (
            SELECT c.*, row_number() OVER () AS n
              FROM (SELECT * FROM late UNION ALL SELECT * FROM fresh) c
         ), holder AS (
            SELECT h.name, h.n FROM unnest($1::text[]) WITH ORDINALITY AS h(name, n)
         ), lease AS (
            INSERT INTO $schema.leases AS l (resource, holder, acquired_at, expires_at, ttl_ms, fencing_token)
            SELECT 'task:' || c.id, h.name, now(), now() + make_interval(secs => $2::float8 / 1000), $2,
                   COALESCE((SELECT f.last_token FROM $schema.lease_fencing f
                              WHERE f.resource = 'task:' || c.id), 0) + 1
              FROM candidate c JOIN holder h ON h.n = c.n
             ORDER BY c.id
            ON CONFLICT (resource) DO UPDATE
               SET holder = EXCLUDED.holder, acquired_at = now(), renewed_at = NULL,
                   released_at = NULL, expires_at = EXCLUDED.expires_at,
                   ttl_ms = EXCLUDED.ttl_ms, renew_count = 0,
                   fencing_token = GREATEST(l.fencing_token, EXCLUDED.fencing_token - 1) + 1
             WHERE l.expires_at <= now()
            RETURNING resource, holder, fencing_token, expires_at
         ), claimed AS (
            UPDATE $schema.tasks t
               SET status = 'started', processor = lease.holder, fencing_token = lease.fencing_token,
                   started_at = now(), last_heartbeat_at = now(),
                   must_heartbeat_before = lease.expires_at, attempts = t.attempts + 1
              FROM candidate c JOIN lease ON lease.resource = 'task:' || c.id
             WHERE t.id = c.id
            RETURNING t.*, c.late AS took_over, c.n AS claim_order,
                      (EXTRACT(EPOCH FROM (now() - c.last_seen)) * 1000)::bigint AS silent_ms
         )
         SELECT n.candidates, claimed.*
           FROM (SELECT count(*) AS candidates FROM candidate) n
           LEFT JOIN (SELECT {TASK_COLUMNS}, took_over, silent_ms, claim_order FROM claimed) claimed ON true
          ORDER BY claimed.claim_order"
    )
}

/// The claims' test that queue `$3` is not paused (see
/// [`crate::queue::queues`]): tasks of a paused queue, pending or late, are
/// not claimed. The queue is the statement's parameter, not the row's
/// column, so PostgreSQL evaluates the test once per statement (a one-time
/// filter above the index scan), not once per candidate row; the claim's
/// plan stays the index scan it was (checked with `EXPLAIN` in a test).
///
/// Race prevented: a claim racing a pause. The claim reads the flag in its
/// own statement's snapshot; a pause that committed before the claim began
/// is seen, so no claim that starts after a pause returns takes a task of
/// that queue. (A claim already running when the pause commits may still
/// take its tasks: that claim began before the pause, as a claim that
/// finished a moment earlier would have.)
pub const RUNNING: &str =
    "AND NOT EXISTS (SELECT 1 FROM $schema.queues q WHERE q.name = $3 AND q.paused)";

/// The test, in the statements that act on a batch of claims by id
/// (completion, heartbeat, give-back), that the task row `t` is still
/// started, written so that no index can serve it: those statements must
/// find their tasks by primary key. With `t.status = 'started'` a generic
/// plan (the one PostgreSQL keeps for a prepared statement after five
/// runs) could read instead every entry of `tasks_started_idx` (and of
/// `tasks_status_id_idx`, which held the started tasks too until
/// migration `20261202000002`) and hash-join them to the batch: cheap by
/// statistics taken while few tasks were started, but each task claimed
/// and finished since the last vacuum leaves a dead entry there, so every
/// completion read more than the last (seen in issue 27's benchmark:
/// completions of 500 tasks taking 30 ms and more, a runtime falling from
/// 14,000 to 3,600 tasks/s in one run). `status` is never NULL, so the
/// test means the same.
pub(super) const STARTED: &str = "t.status || '' = 'started'";

/// The test, in the same statements and in an operator's cancel, that the
/// lease row `l` of a claim is still live at `clock`, written so that no
/// index can serve it: they must find each lease by its resource (a unique
/// key). With `l.expires_at > clock` a plan could read every live lease by
/// `leases_expires_at_idx` instead and compare each with every task of the
/// batch: statistics are always taken before the live leases' deadlines,
/// which are the column's newest values, so the planner guesses that one
/// lease is live (seen in issue 27's benchmark: completions of 100 tasks
/// taking 21 ms instead of 4 with some thousand leases live, a runtime at
/// 4,600 tasks/s instead of 20,000). Adding no time changes no answer.
pub(crate) fn lease_live(clock: &str) -> String {
    format!("l.released_at IS NULL AND l.expires_at + interval '0 s' > {clock}")
}

/// The one statement that completes the claims `($1 ids, $2 tokens, $3
/// processors)` with outputs `$4` (see [`complete_each`](super::complete_each)).
pub fn complete() -> String {
    complete_at("now()")
}

/// [`complete`] judging the deadline by `clock`: `now()` (the
/// transaction's start, which for a one-statement transaction is the
/// statement's) or `statement_timestamp()` for a transaction that began
/// earlier (see [`FencedTransaction`](super::FencedTransaction)).
pub(super) fn complete_at(clock: &str) -> String {
    format!(
        "WITH claim AS (
            SELECT * FROM unnest($1::int8[], $2::int8[], $3::text[], $4::jsonb[])
                       AS c(id, token, processor, output)
         ), done AS (
            UPDATE $schema.tasks t
               SET status = 'processed', processed_at = {clock}, task_output = claim.output,
                   must_heartbeat_before = NULL
              FROM claim
             WHERE t.id = claim.id AND t.fencing_token = claim.token AND t.processor = claim.processor
               AND {STARTED} AND t.must_heartbeat_before > {clock}
            RETURNING t.*
         ), released AS (
            UPDATE $schema.leases l
               SET released_at = {clock}, expires_at = date_trunc('milliseconds', {clock})
              FROM done
             WHERE l.resource = 'task:' || done.id AND l.holder = done.processor
               AND l.fencing_token = done.fencing_token
               AND {live}
         )
         SELECT {TASK_COLUMNS} FROM done ORDER BY id",
        live = lease_live(clock)
    )
}

/// The SQL of [`list`](super::list) (`$1` after id, `$2` limit) and of [`list_page`](super::list_page)
/// (`$1` before id, `$2` limit) for `search`: then, numbered from `$3` in
/// this order, the search's kind, queue and data (`jsonb`), each only when
/// the search has it (the store binds them in that order).
///
/// The status is written into the statement as a literal (it comes from
/// the enum, never from input), one statement per status, rather than
/// bound as `($1 IS NULL OR status = $1)`: a prepared statement may get a
/// generic plan, and a generic plan cannot know that failed or pending
/// tasks are rare among a million processed ones; it walks the primary key
/// and filters by status, reading the whole table to find a page. With the
/// literal, the planner picks `tasks_status_id_idx (status, id)` when the
/// status is rare, and `tasks_started_idx` for the started tasks, which
/// the status index does not hold (tested with a million rows in
/// `tests/it/overview.rs`).
/// Kind, queue and data are written in or left out for the same reason
/// (one statement per combination), and bound: they come from input. A
/// data filter is `task_data @> $n`, which the GIN index `tasks_data_idx`
/// (`jsonb_path_ops`) answers: a filter matching few tasks among millions
/// reads those few, not the table (same test); but only in a plan made
/// with the filter's value, so the store never prepares a search by data
/// (see `bind_search`). Kind and queue have no
/// index of their own: a list reads the newest tasks first and there are
/// few kinds and queues, so a page of one is found near the top; a rare
/// kind among millions of others reads far, and is best searched with its
/// status or data too.
pub fn list(search: &crate::queue::TaskSearch, newest_first: bool) -> String {
    let mut and = String::new();
    if let Some(s) = search.status {
        and.push_str(&format!(" AND status = '{}'", s.as_str()));
    }
    let mut n = 2;
    let mut param = |test: bool, clause: &str, and: &mut String| {
        if test {
            n += 1;
            and.push_str(&clause.replace("$n", &format!("${n}")));
        }
    };
    param(search.kind.is_some(), " AND kind = $n", &mut and);
    param(search.queue.is_some(), " AND queue = $n", &mut and);
    param(
        search.data.is_some(),
        " AND task_data @> $n::jsonb",
        &mut and,
    );
    if newest_first {
        format!(
            "SELECT {TASK_COLUMNS} FROM $schema.tasks WHERE id < $1{and} ORDER BY id DESC LIMIT $2"
        )
    } else {
        format!("SELECT {TASK_COLUMNS} FROM $schema.tasks WHERE id > $1{and} ORDER BY id LIMIT $2")
    }
}

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
/// **The claim rule**, written once ([`late_rule`], [`fresh_rule`]) and
/// used by both claim statements (this one and [`limited_claim`]): a task
/// is claimable when it is pending and due, or late (started, its deadline
/// passed) with an attempt left; and its queue is not paused ([`RUNNING`]).
/// A late task that used its attempts is never claimed: the rescuer fails
/// it ([`crate::queue::rescuer`]). A task `waiting` (for its workflow's
/// parents, or for a signal) is neither pending nor started, so no claim
/// takes it: a workflow's child is made pending only by the statement
/// that ends its last parent (the tasks trigger `tasks_parents_ended`,
/// [`crate::workflow`]), and a wait only by its signal or its timeout.
/// A queue with limits is claimed by
/// [`limited_claim`] alone: this statement claims nothing of it
/// ([`RUNNING`]).
///
/// **The task row is the claim's lease** (issue 41): the claim writes its
/// holder (`processor`), its fencing token (the task's last token + 1) and
/// its deadline (`must_heartbeat_before`, now + `$2` ms) into the row, and
/// nothing else: no `leases` or `lease_fencing` row. The history
/// (`lease_events` under `task:<id>`) and the attempt are written by the
/// tasks trigger `tasks_record_attempts` in the same statement.
///
/// Races prevented:
/// - **Two claimers, one task** (two runtimes, a REST claim and a runtime,
///   a prefetch and a takeover): each candidate row is locked `FOR UPDATE
///   SKIP LOCKED`; a claimer that finds it locked passes over it, and one
///   that locks it after another claim committed re-checks the candidate
///   set's condition on the newest row version (READ COMMITTED), where the
///   task is started with a deadline ahead: not late, so not claimed.
/// - **Two claims issuing one token**: the token is the row's own
///   `fencing_token + 1`, computed by the `UPDATE` on the newest version
///   of the row it holds locked, so each claim of a task issues a token
///   above every earlier one, however many claims race.
/// - **A takeover racing the late holder's completion or heartbeat**: both
///   lock the row; the holder's write re-checks its token and the deadline
///   on the newest version (see [`complete`]) and is refused once the
///   deadline passed or the token moved.
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
    let kinds = if by_kind { "AND kind = ANY($4)" } else { "" };
    let late = late_rule("", "now()");
    let fresh = fresh_rule("", "now()");
    let take = take("now()");
    format!(
        "WITH late AS (
            SELECT id, true AS late, last_heartbeat_at AS last_seen FROM $schema.tasks
             WHERE {late} AND queue = $3 {kinds} {RUNNING}
             ORDER BY must_heartbeat_before, id
             LIMIT {limit} FOR UPDATE SKIP LOCKED
         ), fresh AS (
            SELECT id, false AS late, NULL::timestamptz AS last_seen FROM $schema.tasks
             WHERE {fresh} AND queue = $3 {kinds} {RUNNING}
               AND NOT EXISTS (SELECT 1 FROM late)
             ORDER BY priority, scheduled_at, id
             LIMIT {limit} FOR UPDATE SKIP LOCKED
         ), {take}
         SELECT {TASK_COLUMNS}, took_over, silent_ms FROM claimed ORDER BY claim_order"
    )
}

/// **The claim rule's first half**: a late task (started, its deadline
/// passed by `clock`, an attempt left) may be taken over. The rescuer
/// fails a late task whose attempts are used ([`crate::queue::rescuer`]).
/// `t` is the table's alias with its dot (`"t."`), or empty.
pub fn late_rule(t: &str, clock: &str) -> String {
    format!(
        "{t}status = 'started' AND {t}must_heartbeat_before <= {clock} \
         AND {t}attempts < {t}max_attempts"
    )
}

/// **The claim rule's second half**: a pending task due by `clock` may be
/// claimed. `t` as in [`late_rule`].
pub fn fresh_rule(t: &str, clock: &str) -> String {
    format!("{t}status = 'pending' AND {t}scheduled_at <= {clock}")
}

/// The end every claim statement shares: the candidates (`late`, then
/// `fresh`, each a CTE of `id, late, last_seen` in claim order) numbered,
/// paired with the holders `$1` in order, and written into their task rows
/// as of `clock` (`claimed`): holder, a token one above the task's last,
/// the deadline `$2` ms on, one more attempt.
fn take(clock: &str) -> String {
    format!(
        "candidate AS (
            SELECT c.*, row_number() OVER () AS n
              FROM (SELECT id, late, last_seen FROM late
                    UNION ALL SELECT id, late, last_seen FROM fresh) c
         ), holder AS (
            SELECT h.name, h.n FROM unnest($1::text[]) WITH ORDINALITY AS h(name, n)
         ), claimed AS (
            UPDATE $schema.tasks t
               SET status = 'started', processor = holder.name,
                   fencing_token = COALESCE(t.fencing_token, 0) + 1,
                   started_at = {clock}, last_heartbeat_at = {clock},
                   must_heartbeat_before = {clock} + make_interval(secs => $2::float8 / 1000),
                   attempts = t.attempts + 1
              FROM candidate c JOIN holder ON holder.n = c.n
             WHERE t.id = c.id
            RETURNING t.*, c.late AS took_over, c.n AS claim_order,
                      (EXTRACT(EPOCH FROM ({clock} - c.last_seen)) * 1000)::bigint AS silent_ms
         )"
    )
}

/// The statement that locks queue `$1`'s row when the queue has limits
/// (`max_started`, `max_started_per_key` or a rate), answering a row then
/// and none otherwise: the first statement of a claim of a limited queue
/// ([`limited_claim`]), in the claim's transaction. The lock is held to
/// its commit, so the claims of a limited queue take turns; a change of
/// its limits or its pause waits for the claim in progress.
///
/// It also turns JIT compilation off for the rest of the transaction: the
/// planner's estimate of the limited claim (a lateral scan per key, each
/// guessed at hundreds of rows) passes `jit_above_cost`, and compiling its
/// 145 expressions took 67 ms of a 97 ms claim that runs in 4 ms without
/// (measured with `EXPLAIN ANALYZE` at 60,000 keyed tasks); the claims of a
/// limited queue take turns, so every claim of the fleet paid it.
///
/// And it makes the claim run its prepared statement's generic plan,
/// planned once, not planned afresh for its parameters at every claim:
/// planning the limited claim took 1.4 ms of a 10 ms claim (the median
/// `bind` in the server's log of a `bench limits` run), on the queue's
/// lock, where every claim of the fleet waits for it. Its plan does not
/// turn on its parameters' values: every scan is an index probe by queue
/// and key (checked with `EXPLAIN` of the generic plan in a test).
pub const LOCK_LIMITED: &str = "SELECT set_config('jit', 'off', true),
              set_config('plan_cache_mode', 'force_generic_plan', true)
       FROM $schema.queues WHERE name = $1 AND limited FOR UPDATE";

/// The claim of a queue with limits (issue 39): [`claim`]'s rule, with its
/// holders `$1`, lease `$2` ms, queue `$3` and kinds `$4`, and the queue's
/// limits on top: at most `max_started` of its tasks started at once, at
/// most `max_started_per_key` per concurrency key, at most the tokens of
/// its bucket claimed (a takeover is a claim and takes a token; it needs
/// no slot, its task already holds one). Pending tasks are served fairly
/// between keys: each candidate's turn is its key's started tasks plus
/// its rank within the key (by priority, due time, id), and the lowest
/// turns go first, so a key with one task waiting and none running goes
/// before the next task of a key with many running, whatever the backlog;
/// of equal turns, keys go round-robin: those after the queue's cursor
/// (`served_key`, the key of the last task the claim before took fresh,
/// written here) first, then the rest from the first key on, so keys
/// that free slots in turn cannot take every slot from a third; within a
/// key, priority orders as in every queue. Keyless tasks are one group
/// (key `''`, which no key can be) for fairness and have no per-key cap.
/// The claim takes its time from `statement_timestamp()`, the moment its
/// turn began, not the transaction's start. Each key's started count is
/// read once (`keyed` is materialized: inlined, it was read again for
/// every candidate of the key; and a `LATERAL` count: as a subquery in
/// the select list beside the allowance that uses it, it ran twice); the
/// queue's are counted only when it has a `max_started` (behind a `CASE`:
/// as an operand of `-` beside a NULL, the count ran anyway, 0.4 ms of a
/// keyed claim with 130 started).
///
/// The walk over the keys (`keys`, one index probe a key, skipping from
/// one key to the next) answers each key's first pending task, and the
/// key's scan for candidates starts at that task (a row comparison on
/// `tasks_pending_key_idx`), not at the key's first index entry: the
/// entries of the tasks claimed since the last vacuum lie dead at the
/// front of every key, and both probes walked past them.
///
/// **Whether the limits held due tasks back** is answered by the claim
/// itself, in the `held_back` column (the same in every row; with nothing
/// claimed, the statement answers one row of NULL task columns for it):
/// each key's scan takes one candidate more than the key may start
/// (`spare`), and `held_back` is the candidates not claimed: a key cut
/// short by its cap, or at its cap (it may start none, and its scan
/// takes the one), with a due task of the claimer's kinds counts it, and
/// so do candidates past the queue's room or its tokens. A key whose
/// tasks left are not due counts nothing. Before, a count of the queue's
/// due tasks ran after every short claim: a walk of the pending index
/// from its front, past the dead entries, and a round trip of its own.
///
/// The bucket and the cursor are written in one update of the queue's row
/// (`queue`), which [`LOCK_LIMITED`] already holds; none when the claim
/// took nothing fresh and the queue has no rate (one row written a claim,
/// where a row a key served was, before migration `20261210000001`).
///
/// `ranked` ends with a constant `LIMIT` (the claim's [planned
/// size](planned_size)) and the room's bound as a filter, not as a computed
/// `LIMIT`: the planner cannot estimate a computed one and took a tenth of
/// its input (a thousand rows), and for that many candidates it wrote them
/// into their rows by a join that reads the tasks table from its first id:
/// a hash join over a sequential scan (19 ms of a 38 ms claim at 60,000
/// tasks) or, with sequential scans off, a merge join over the whole
/// primary key (10 ms of a 26 ms claim of 250, and growing with the table:
/// `EXPLAIN ANALYZE` of the claim replayed, 60 claims, the later ones
/// slower). Estimated at the claim's size, it looks each candidate up by
/// its key, as [`claim`] does.
///
/// It runs after [`LOCK_LIMITED`] in the same transaction and nothing else
/// does: that is what makes the limits exact. Races prevented:
/// - **Two claimers each seeing the last free slot** (of the queue or of a
///   key): the queue row's lock makes the limited claims take turns, and
///   under READ COMMITTED each statement reads a snapshot taken when it
///   starts, so this statement, begun after the lock was granted, counts
///   every task the claims before it started (they committed before
///   releasing the lock). Tasks that end meanwhile only free slots. A
///   limit is never exceeded by claims made after it was set; tasks
///   started before a limit was lowered run on and finish.
/// - **Two claimers each spending the bucket's last token**, or each
///   reading the same cursor and serving the same key first: the bucket
///   and the cursor are read and written (`queue`) under the same lock, in
///   the statement that claims.
/// - **A claim that does not know the queue is limited**: [`claim`] claims
///   nothing of a limited queue ([`RUNNING`]), and its caller then takes
///   this way.
/// - Two claimers, one task, and the token: as in [`claim`] (each
///   candidate row locked `FOR UPDATE SKIP LOCKED` and re-checked on its
///   newest version, the token the locked row's own + 1).
pub fn limited_claim(limit: usize, by_kind: bool) -> String {
    let kinds = if by_kind { "AND kind = ANY($4)" } else { "" };
    let t_kinds = if by_kind { "AND t.kind = ANY($4)" } else { "" };
    let clock = "statement_timestamp()";
    let late = late_rule("", clock);
    let fresh = fresh_rule("t.", clock);
    let take = take(clock);
    let planned = planned_size(limit);
    format!(
        "WITH RECURSIVE q AS (
            SELECT max_started, max_started_per_key, served_key,
                   CASE WHEN rate_per_second IS NOT NULL THEN
                        LEAST(COALESCE(rate_burst, GREATEST(1, ceil(rate_per_second)))::float8,
                              rate_tokens + rate_per_second
                                * GREATEST(0, EXTRACT(EPOCH FROM ({clock} - rate_at))::float8))
                   END AS tokens
              FROM $schema.queues WHERE name = $3 AND limited AND NOT paused
         ), room AS (
            SELECT LEAST(cardinality($1::text[])::bigint,
                         CASE WHEN q.max_started IS NOT NULL
                              THEN q.max_started - (SELECT count(*) FROM $schema.tasks s
                                                     WHERE s.queue = $3 AND s.status = 'started')
                              END,
                         floor(q.tokens)::bigint) AS slots,
                   LEAST(cardinality($1::text[])::bigint, floor(q.tokens)::bigint) AS tokens,
                   q.max_started_per_key AS per_key
              FROM q
         ), late AS (
            SELECT id, true AS late, last_heartbeat_at AS last_seen FROM $schema.tasks
             WHERE {late} AND queue = $3 {kinds}
             ORDER BY must_heartbeat_before, id
             LIMIT COALESCE((SELECT GREATEST(tokens, 0) FROM room), 0)
             FOR UPDATE SKIP LOCKED
         ), keys AS (
            (SELECT t.concurrency_key AS k, t.priority AS p, t.scheduled_at AS s, t.id AS i
               FROM $schema.tasks t
              WHERE t.queue = $3 AND t.status = 'pending' AND t.concurrency_key IS NOT NULL
              ORDER BY t.concurrency_key, t.priority, t.scheduled_at, t.id LIMIT 1)
            UNION ALL
            SELECT n.k, n.p, n.s, n.i FROM keys CROSS JOIN LATERAL (
                   SELECT t.concurrency_key AS k, t.priority AS p, t.scheduled_at AS s, t.id AS i
                     FROM $schema.tasks t
                    WHERE t.queue = $3 AND t.status = 'pending' AND t.concurrency_key > keys.k
                    ORDER BY t.concurrency_key, t.priority, t.scheduled_at, t.id LIMIT 1
                   ) n
         ), keyed AS MATERIALIZED (
            SELECT keys.*, c.started,
                   GREATEST(0, LEAST(room.slots, COALESCE(room.per_key - c.started, room.slots)))
                     AS allowance
              FROM room, keys CROSS JOIN LATERAL (
                   SELECT count(*) AS started FROM $schema.tasks s
                    WHERE s.queue = $3 AND s.status = 'started' AND s.concurrency_key = keys.k
                   ) c
         ), pool AS (
            SELECT p.id, p.priority, p.scheduled_at, g.started + p.rank AS turn, g.k AS key,
                   p.rank > g.allowance AS spare
              FROM keyed g CROSS JOIN LATERAL (
                   SELECT t.id, t.priority, t.scheduled_at,
                          row_number() OVER (ORDER BY t.priority, t.scheduled_at, t.id) AS rank
                     FROM $schema.tasks t
                    WHERE t.queue = $3 AND t.concurrency_key = g.k
                      AND (t.priority, t.scheduled_at, t.id) >= (g.p, g.s, g.i)
                      AND {fresh} {t_kinds}
                    ORDER BY t.priority, t.scheduled_at, t.id
                    LIMIT g.allowance + 1
                   ) p
            UNION ALL
            SELECT p.id, p.priority, p.scheduled_at,
                   (SELECT count(*) FROM $schema.tasks s
                     WHERE s.queue = $3 AND s.status = 'started' AND s.concurrency_key IS NULL) + p.rank,
                   '', p.rank > GREATEST(0, room.slots)
              FROM room CROSS JOIN LATERAL (
                   SELECT t.id, t.priority, t.scheduled_at,
                          row_number() OVER (ORDER BY t.priority, t.scheduled_at, t.id) AS rank
                     FROM $schema.tasks t
                    WHERE t.queue = $3 AND t.concurrency_key IS NULL
                      AND {fresh} {t_kinds}
                    ORDER BY t.priority, t.scheduled_at, t.id
                    LIMIT GREATEST(0, room.slots) + 1
                   ) p
         ), ranked AS MATERIALIZED (
            SELECT r.id, r.ord
              FROM (SELECT pool.id,
                           row_number() OVER (ORDER BY pool.turn,
                                                       pool.key <= (SELECT served_key FROM q),
                                                       pool.key, pool.priority, pool.scheduled_at,
                                                       pool.id) AS ord
                      FROM pool
                     WHERE NOT pool.spare AND NOT EXISTS (SELECT 1 FROM late)) r
             WHERE r.ord <= (SELECT slots FROM room)
             ORDER BY r.ord
             LIMIT {planned}
         ), fresh AS (
            SELECT t.id, false AS late, NULL::timestamptz AS last_seen
              FROM ranked JOIN $schema.tasks t ON t.id = ranked.id
             WHERE {fresh} AND t.queue = $3
             ORDER BY ranked.ord
             FOR UPDATE OF t SKIP LOCKED
         ), {take}, served AS (
            SELECT coalesce(c.concurrency_key, '') AS key FROM claimed c
             WHERE NOT c.took_over
             ORDER BY c.claim_order DESC
             LIMIT 1
         ), queue AS (
            UPDATE $schema.queues qs
               SET rate_tokens = CASE WHEN q.tokens IS NOT NULL
                                      THEN q.tokens - (SELECT count(*) FROM claimed)
                                      ELSE qs.rate_tokens END,
                   rate_at = CASE WHEN q.tokens IS NOT NULL THEN {clock} ELSE qs.rate_at END,
                   served_key = coalesce((SELECT key FROM served), qs.served_key)
              FROM q
             WHERE qs.name = $3 AND (q.tokens IS NOT NULL OR EXISTS (SELECT 1 FROM served))
         ), held AS (
            SELECT (SELECT count(*) FROM pool)
                   - (SELECT count(*) FROM claimed WHERE NOT took_over) AS held_back
         )
         SELECT {TASK_COLUMNS}, took_over, silent_ms, held_back
           FROM held LEFT JOIN claimed ON true ORDER BY claim_order"
    )
}

/// The size a limited claim of `limit` tasks is planned for: the next power
/// of two (at most [`MAX_BATCH`](super::MAX_BATCH)), so that a runtime's
/// claims, of every size up to its workers' room, share at most eleven
/// statements (for each way of filtering kinds), each prepared once and
/// planned once ([`LOCK_LIMITED`]). The claim takes
/// at most as many as it has holders (`$1`) whatever it was planned for.
pub fn planned_size(limit: usize) -> usize {
    limit.max(1).next_power_of_two().min(super::MAX_BATCH)
}

/// [`claim`]'s test that queue `$3` is not paused (see
/// [`crate::queue::queues`]) and has no limits: tasks of a paused queue,
/// pending or late, are not claimed, and those of a limited queue are
/// claimed only by [`limited_claim`] (which reads the pause itself). The queue is the statement's parameter, not the row's
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
    "AND NOT EXISTS (SELECT 1 FROM $schema.queues q WHERE q.name = $3 AND (q.paused OR q.limited))";

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

/// The one statement that completes the claims `($1 ids, $2 tokens, $3
/// processors)` with outputs `$4` (see [`complete_each`](super::complete_each)).
///
/// Race prevented: a completion racing the takeover of its late claim (a
/// paused or partitioned holder's write arriving after its deadline). The
/// `UPDATE` locks each task row and re-checks processor, token, status and
/// deadline on its newest version: once the deadline passed or another
/// claim committed (a new token), the old holder's completion changes
/// nothing and is refused. The claim's lease is the task row, so ending
/// the row's claim ends its term; the `released` history row is the
/// trigger's.
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
         )
         SELECT {TASK_COLUMNS} FROM done ORDER BY id"
    )
}

/// The statement that makes pending the waiting tasks whose wait for a
/// signal timed out, up to `$1` of them, due at their timeout, keeping
/// `wait_signal` (what they waited for) for the handler (see
/// [`resume_timed_out`](super::resume_timed_out)).
///
/// Race prevented: the timeout against a signal for the same task. Rows
/// are locked (SKIP LOCKED: a signal in flight keeps its task, and is
/// answered first) and `status = 'waiting'` re-checked on the newest
/// version: a task a signal woke first is not touched, so a wait ends once.
pub fn resume_timed_out() -> String {
    "WITH due AS (
        SELECT id FROM $schema.tasks
         WHERE status = 'waiting' AND wait_until <= now()
         ORDER BY wait_until, id
         LIMIT $1
           FOR UPDATE SKIP LOCKED
     )
     UPDATE $schema.tasks t
        SET status = 'pending', scheduled_at = t.wait_until
       FROM due
      WHERE t.id = due.id AND t.status = 'waiting'"
        .to_string()
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

//! The liveness statements: registering a session, finding sessions
//! PostgreSQL no longer lists, and ending the claims and leases of the
//! holders they vouched for. Each runs on a liveness connection (direct,
//! never through a transaction pooler: a session means nothing there).

use crate::db::Schema;
use chrono::{DateTime, Utc};
use sqlx::{Connection, PgConnection};

/// What a pass of [`end_dead`] ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ended {
    /// Registrations whose session was gone, deleted.
    pub sessions: u64,
    /// Live leases of their holders (singletons, tasks), ended now.
    pub leases: u64,
    /// Started tasks of their holders, made late now (claimable by the
    /// claim rule as if their deadline had passed).
    pub tasks: u64,
}

impl Ended {
    /// Whether anything was ended.
    pub fn any(&self) -> bool {
        self.sessions + self.leases + self.tasks > 0
    }
}

/// The test that the session registered in row `l` is still listed by
/// PostgreSQL. A row of `pg_stat_activity` with its pid and start time is
/// the session; a row with its pid whose start time is hidden (a role
/// without `pg_read_all_stats` sees no start time of another role's
/// sessions) counts as alive too: unsure, the TTL rules.
const LISTED: &str = "EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a
                              WHERE a.pid = l.pid
                                AND (a.backend_start = l.backend_start OR a.backend_start IS NULL))";

/// The ending of every live claim and lease of the holders in a CTE
/// `holder (name, instance_id)` that the statement defines before it:
/// their started tasks made late now (`late`: a task row is its claim's
/// lease) and their leases ended now, each ended term
/// recorded in the history as `session_ended` with the instance whose
/// session vouched for it (`recorded`). One text for every way a holder
/// is found dead: its process's session gone ([`end_dead`]), its stream
/// to the instance closed or its simulated worker killed ([`disown`]), a
/// new term of the same holder ([`adopt`]).
///
/// Races prevented (each caller names its own too):
/// - **A completion or heartbeat racing the rescue.** Both lock the task's
///   row: a completion first leaves the task processed (not `started`,
///   so it is not touched here); the rescue first sets the deadline to
///   now, and the completion's or heartbeat's own deadline test refuses
///   it, as after an expiry. The takeover that follows is the claim
///   rule's, which moves the fencing token as always.
/// - **A lease already taken over** by someone else holds another holder
///   name and is not touched; one released stays released.
const ENDING: &str = "late AS (
                UPDATE $schema.tasks t SET must_heartbeat_before = now()
                 WHERE t.status = 'started' AND t.processor IN (SELECT name FROM holder)
                   AND t.must_heartbeat_before > now()
                RETURNING 'task:' || t.id AS resource, t.processor AS holder, t.fencing_token,
                          t.must_heartbeat_before AS expires_at
             ), other_leases AS (
                UPDATE $schema.leases l SET expires_at = now()
                 WHERE l.expires_at > now()
                   AND l.released_at IS NULL AND l.holder IN (SELECT name FROM holder)
                RETURNING l.resource, l.holder, l.fencing_token, l.expires_at
             ), ended AS (
                SELECT * FROM late UNION ALL SELECT * FROM other_leases
             ), recorded AS (
                -- The history says how each term ended, like a release: a
                -- reader of lease_events (the timeline, the split-brain
                -- check) sees it end now, not at its old expiry.
                INSERT INTO $schema.lease_events (resource, holder, fencing_token, kind, expires_at, detail)
                SELECT e.resource, e.holder, e.fencing_token, 'session_ended', e.expires_at,
                       jsonb_build_object('instance', h.instance_id)
                  FROM ended e JOIN holder h ON h.name = e.holder
                 ORDER BY e.resource
                RETURNING 1
             )";

/// Registers (or registers again) the session of `conn` as the liveness of
/// instance `id`, vouching for `holders`. A registration of `id` left by
/// an earlier session that PostgreSQL no longer lists is ended first (its
/// holders' claims and leases, as [`end_dead`] would), so registering
/// again after a lost session never hides the old session's claims.
///
/// Race prevented: a reaper judging the old registration while this one
/// replaces it. The old row is locked first; a reaper already holding it
/// finishes (and ends the old claims) before this registration proceeds,
/// and a reaper that comes after sees the new session, which is alive.
///
/// Answers the start time of the server the session is on (its
/// incarnation).
pub async fn register(
    conn: &mut PgConnection,
    schema: &Schema,
    id: &str,
    holders: &[String],
) -> sqlx::Result<DateTime<Utc>> {
    let mut tx = conn.begin().await?;
    lock(&mut tx, schema, &[id.to_string()]).await?;
    end_locked(&mut tx, schema, &[id.to_string()]).await?;
    let server = schema
        .query_scalar(
            "INSERT INTO $schema.liveness AS l
                    (instance_id, holders, pid, backend_start, server_started_at)
             SELECT $1, $2, pg_backend_pid(), a.backend_start, pg_catalog.pg_postmaster_start_time()
               FROM pg_catalog.pg_stat_activity a WHERE a.pid = pg_backend_pid()
             ON CONFLICT (instance_id) DO UPDATE
                SET holders = EXCLUDED.holders, pid = EXCLUDED.pid,
                    backend_start = EXCLUDED.backend_start,
                    server_started_at = EXCLUDED.server_started_at, registered_at = now()
             RETURNING l.server_started_at",
        )
        .bind(id)
        .bind(holders)
        .fetch_one(&mut *tx)
        .await?;
    // Registrations of another server incarnation (before a restart or a
    // failover) are never judged; an hour on, their leases ran out long
    // ago and the rows only take room.
    schema
        .query(
            "DELETE FROM $schema.liveness
              WHERE server_started_at <> pg_catalog.pg_postmaster_start_time()
                AND registered_at < now() - interval '1 hour'",
        )
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(server)
}

/// Adds `holder` to those instance `id`'s session vouches for (a worker
/// added after start). Only by that session itself: a registration since
/// replaced by another session is left alone, and the answer is `false`.
pub async fn vouch(
    conn: &mut PgConnection,
    schema: &Schema,
    id: &str,
    holder: &str,
) -> sqlx::Result<bool> {
    let done = schema
        .query(
            "UPDATE $schema.liveness
                SET holders = array_append(holders, $2)
              WHERE instance_id = $1 AND pid = pg_backend_pid() AND NOT ($2 = ANY(holders))",
        )
        .bind(id)
        .bind(holder)
        .execute(&mut *conn)
        .await?;
    if done.rows_affected() == 1 {
        return Ok(true);
    }
    schema
        .query_scalar(
            "SELECT EXISTS (SELECT 1 FROM $schema.liveness
                             WHERE instance_id = $1 AND pid = pg_backend_pid())",
        )
        .bind(id)
        .fetch_one(&mut *conn)
        .await
}

/// What [`disown`] and [`adopt`] answer: whether this session's
/// registration was found (and changed as asked), and what was ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// This session's registration exists (it was not replaced by
    /// another session); when `false`, nothing was done.
    pub registered: bool,
    /// What was ended of the holder's earlier claims and leases.
    pub ended: Ended,
}

/// Vouches for `holder` under instance `id`'s session from now on, as a
/// **new term** of that holder: whatever it held before (claims made
/// through an earlier stream to this instance or another, by a process
/// that used its name before) is ended now, and any other registration
/// that vouched for it stops. What an instance runs when a worker process
/// opens its session stream: the worker gave up every claim of its
/// earlier stream when that broke, and claims again only once this has
/// committed. Only by the session of `id` itself.
///
/// Race prevented: **the holder's old voucher disowning it while the new
/// one adopts it** (a worker whose stream broke reconnects to another
/// instance before the first noticed). Every registration that vouches for
/// the holder is locked first, with this session's own, in id order: a
/// [`disown`] that locked first ends the old claims and drops the holder,
/// and this statement then finds no one else vouching; one that comes
/// after finds the holder no longer in its row and ends nothing, so no
/// claim of the new term is ever ended by the old stream's close.
pub async fn adopt(
    conn: &mut PgConnection,
    schema: &Schema,
    id: &str,
    holder: &str,
) -> sqlx::Result<Moved> {
    let mut tx = conn.begin().await?;
    schema
        .query(
            "SELECT 1 FROM $schema.liveness
              WHERE instance_id = $1 OR $2 = ANY(holders)
              ORDER BY instance_id FOR UPDATE",
        )
        .bind(id)
        .bind(holder)
        .execute(&mut *tx)
        .await?;
    let (registered, leases, tasks): (bool, i64, i64) = schema
        .query_as(&moving(
            "elsewhere AS (
                UPDATE $schema.liveness l SET holders = array_remove(l.holders, $2)
                 WHERE l.instance_id <> $1 AND $2 = ANY(l.holders) AND EXISTS (SELECT 1 FROM mine)
                RETURNING l.instance_id
             ), added AS (
                UPDATE $schema.liveness l SET holders = array_append(l.holders, $2)
                 WHERE l.instance_id = $1 AND l.pid = pg_backend_pid() AND NOT ($2 = ANY(l.holders))
                RETURNING l.instance_id
             ), holder AS (
                SELECT $2::text AS name, mine.instance_id FROM mine
             )",
        ))
        .bind(id)
        .bind(holder)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(moved(registered, leases, tasks))
}

/// Stops vouching for `holder` under instance `id`'s session; with `end`,
/// also ends its live claims and leases now, as if its own session had
/// gone (its stream to this instance closed without a goodbye, or the
/// simulated worker was killed or crashed: it is certainly not working).
/// Only by the session of `id` itself.
///
/// Race prevented: **a new term adopted elsewhere** ([`adopt`]). The
/// holder is dropped from this registration only if it is still there,
/// judged on the row's latest version under its lock; an adoption that
/// committed first removed it, so nothing of the new term is ended.
pub async fn disown(
    conn: &mut PgConnection,
    schema: &Schema,
    id: &str,
    holder: &str,
    end: bool,
) -> sqlx::Result<Moved> {
    let (registered, leases, tasks): (bool, i64, i64) = schema
        .query_as(&moving(
            "dropped AS (
                UPDATE $schema.liveness l SET holders = array_remove(l.holders, $2)
                 WHERE l.instance_id = $1 AND l.pid = pg_backend_pid() AND $2 = ANY(l.holders)
                RETURNING l.instance_id
             ), holder AS (
                SELECT $2::text AS name, dropped.instance_id FROM dropped WHERE $3
             )",
        ))
        .bind(id)
        .bind(holder)
        .bind(end)
        .fetch_one(&mut *conn)
        .await?;
    Ok(moved(registered, leases, tasks))
}

/// The statement of [`adopt`] and [`disown`]: `mine` (this session's own
/// registration of `$1`), then `changes` (which must define the `holder`
/// CTE), then [`ENDING`]; answers whether `mine` was found, the terms
/// recorded as ended, and the tasks made late.
fn moving(changes: &str) -> String {
    format!(
        "WITH mine AS (
            SELECT l.instance_id FROM $schema.liveness l
             WHERE l.instance_id = $1 AND l.pid = pg_backend_pid()
         ), {changes}, {ENDING}
         SELECT EXISTS (SELECT 1 FROM mine),
                (SELECT count(*) FROM recorded),
                (SELECT count(*) FROM late)"
    )
}

fn moved(registered: bool, leases: i64, tasks: i64) -> Moved {
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    Moved {
        registered,
        ended: Ended {
            sessions: 0,
            leases: n(leases),
            tasks: n(tasks),
        },
    }
}

/// Ends the registration of instance `id` on a clean shutdown (its claims
/// were given back or completed; its leases released). Only by its own
/// session.
pub async fn deregister(conn: &mut PgConnection, schema: &Schema, id: &str) -> sqlx::Result<()> {
    schema
        .query("DELETE FROM $schema.liveness WHERE instance_id = $1 AND pid = pg_backend_pid()")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The instances whose registered session PostgreSQL does not list, among
/// the registrations of the server incarnation that answers: cheap, no
/// lock, the question each process asks a few times a second.
///
/// Race prevented: a session registered after this statement's snapshot
/// is not seen at all, so it cannot look dead. A registration visible in
/// the snapshot committed before it was taken, so its session was already
/// in PostgreSQL's list of sessions, which the statement reads later: a
/// session listed there is alive at least until then.
pub async fn suspects(conn: &mut PgConnection, schema: &Schema) -> sqlx::Result<Vec<String>> {
    schema
        .query_scalar(&format!(
            "SELECT l.instance_id FROM $schema.liveness l
              WHERE l.server_started_at = pg_catalog.pg_postmaster_start_time() AND NOT {LISTED}
              ORDER BY l.instance_id"
        ))
        .fetch_all(&mut *conn)
        .await
}

/// Ends every live claim and lease of the holders that the sessions of
/// `ids` vouched for, for those of `ids` whose session PostgreSQL no longer
/// lists (judged again here, under lock), and deletes their registrations.
/// The claim rule then takes the tasks over as if their deadline had
/// passed; the singletons go to the next instance that asks.
pub async fn end_dead(
    conn: &mut PgConnection,
    schema: &Schema,
    ids: &[String],
) -> sqlx::Result<Ended> {
    let mut tx = conn.begin().await?;
    lock(&mut tx, schema, ids).await?;
    let ended = end_locked(&mut tx, schema, ids).await?;
    tx.commit().await?;
    Ok(ended)
}

/// Locks the registrations of `ids`, in id order (two reapers never
/// deadlock). Reads no session list: see [`end_locked`].
async fn lock(conn: &mut PgConnection, schema: &Schema, ids: &[String]) -> sqlx::Result<()> {
    schema
        .query(
            "SELECT 1 FROM $schema.liveness WHERE instance_id = ANY($1)
              ORDER BY instance_id FOR UPDATE",
        )
        .bind(ids)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The ending itself, in a transaction that already locked the rows of
/// `ids` ([`lock`]).
///
/// Races prevented:
/// - **A session registered again while it is judged.** The rows are
///   locked before PostgreSQL's list of sessions is first read in this
///   transaction (PostgreSQL reads that list once per transaction, at its
///   first use), so the version judged here, the latest, was committed
///   before the list was read: if its session is alive, the list has it.
///   A registration that replaces it waits for this transaction.
/// - **A restart or a failover**, every session gone at once: a row is
///   judged only when its server incarnation is the one answering
///   (`server_started_at`); otherwise the TTL rules.
/// - the races of [`ENDING`].
async fn end_locked(
    conn: &mut PgConnection,
    schema: &Schema,
    ids: &[String],
) -> sqlx::Result<Ended> {
    let (sessions, leases, tasks): (i64, i64, i64) = schema
        .query_as(&format!(
            "WITH dead AS (
                DELETE FROM $schema.liveness l
                 WHERE l.instance_id = ANY($1)
                   AND l.server_started_at = pg_catalog.pg_postmaster_start_time()
                   AND NOT {LISTED}
                RETURNING l.instance_id, l.holders
             ), holder AS (
                SELECT DISTINCT ON (h.name) h.name, dead.instance_id
                  FROM dead CROSS JOIN LATERAL unnest(dead.holders) AS h(name)
             ), {ENDING}
             SELECT (SELECT count(*) FROM dead),
                    (SELECT count(*) FROM recorded),
                    (SELECT count(*) FROM late)"
        ))
        .bind(ids)
        .fetch_one(&mut *conn)
        .await?;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(Ended {
        sessions: n(sessions),
        leases: n(leases),
        tasks: n(tasks),
    })
}

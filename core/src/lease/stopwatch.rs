//! The failover stopwatch's store: a dashboard kill records, by the
//! database clock, every lease the victim held; each is then timed until
//! another holder's term (a higher fencing token) begins. Takeovers nobody
//! caused from the dashboard (a crash, a `kill -9`) are timed too, from the
//! old holder's last sign of life (its last acquisition or renewal).

use super::Failover;
use crate::db::Schema;
use sqlx::PgConnection;

/// Records that `subject` (a worker or an instance) was just killed, with
/// every live lease and task claim held by any of `holders` (the worker's
/// id; an instance's id and its workers' ids). Returns how many it held.
pub async fn record_kill(
    conn: &mut PgConnection,
    schema: &Schema,
    subject_kind: &str,
    subject: &str,
    holders: &[String],
) -> sqlx::Result<u64> {
    crate::db::atomically!(conn, schema, async {
        // Only reads leases and claims to decide nothing about ownership: it
        // snapshots who held what at the kill. Run right after the kill, before
        // the terms can expire, it sees every term the victim left behind: its
        // leases, and its tasks' claims (a claim's lease is its task row).
        let done = schema.query(
            "INSERT INTO $schema.failover_kills (subject_kind, subject, resource, holder, fencing_token)
             SELECT $1, $2, resource, holder, fencing_token FROM $schema.leases
              WHERE holder = ANY($3) AND released_at IS NULL AND expires_at > now()
             UNION ALL
             SELECT $1, $2, 'task:' || id, processor, fencing_token FROM $schema.tasks
              WHERE status = 'started' AND processor = ANY($3) AND must_heartbeat_before > now()",
        )
        .bind(subject_kind)
        .bind(subject)
        .bind(holders)
        .execute(&mut *conn)
        .await?;
        Ok(done.rows_affected())
    }
    .await)
}

/// How long a dashboard kill stays listed after it resolved, however many
/// failovers came after it: long enough for its operator to read it.
pub const KILL_SHOWN_FOR_SECS: i64 = 300;

/// The newest `limit` failovers (dashboard kills, taken over or still
/// waiting, and, from the last ten minutes, takeovers after a silent death),
/// plus every dashboard kill from the last hour that is unresolved (no
/// takeover yet, and its task has not ended) or resolved less than
/// [`KILL_SHOWN_FOR_SECS`] ago: a burst of chaos crashes never pushes an
/// operator's own kill out of view before its outcome shows. A kill whose
/// task ended without a takeover (it ran out of attempts) says so in
/// `ended`.
pub async fn recent(
    conn: &mut PgConnection,
    schema: &Schema,
    limit: i64,
) -> sqlx::Result<Vec<Failover>> {
    crate::db::atomically!(conn, schema, async {
        schema.query_as(
            "WITH killed AS (
                SELECT 'killed' AS cause, k.subject, k.resource, k.holder AS old_holder,
                       k.fencing_token AS old_token, k.killed_at AS started_at,
                       t.at AS taken_at, t.holder AS new_holder, t.fencing_token AS new_token,
                       CASE WHEN t.at IS NULL THEN task.ended END AS ended
                  FROM (SELECT * FROM $schema.failover_kills ORDER BY id DESC LIMIT 200) k
                  LEFT JOIN LATERAL (
                        SELECT e.at, e.holder, e.fencing_token FROM $schema.lease_events e
                         WHERE e.resource = k.resource AND e.fencing_token > k.fencing_token
                           AND e.kind IN ('acquired', 'taken_over')
                         ORDER BY e.id LIMIT 1) t ON true
                  LEFT JOIN LATERAL (
                        SELECT 'task ' || s.status AS ended FROM $schema.tasks s
                         WHERE s.id = CASE WHEN k.resource ~ '^task:[0-9]{1,18}$'
                                           THEN substr(k.resource, 6)::bigint END
                           AND s.status IN ('failed', 'cancelled')) task ON true
                 WHERE k.killed_at > now() - interval '1 hour'
             ), silent AS (
                SELECT 'found_dead' AS cause, e.previous_holder AS subject, e.resource,
                       e.previous_holder AS old_holder, last.fencing_token AS old_token,
                       last.at AS started_at, e.at AS taken_at, e.holder AS new_holder,
                       e.fencing_token AS new_token, NULL::text AS ended
                  FROM $schema.lease_events e
                  JOIN LATERAL (
                        SELECT p.at, p.fencing_token FROM $schema.lease_events p
                         WHERE p.resource = e.resource AND p.id < e.id
                           AND p.kind IN ('acquired', 'taken_over', 'renewed')
                         ORDER BY p.id DESC LIMIT 1) last ON true
                 WHERE e.kind = 'taken_over' AND e.at > now() - interval '10 minutes'
                   AND NOT EXISTS (SELECT 1 FROM $schema.failover_kills k
                                    WHERE k.resource = e.resource AND k.fencing_token = last.fencing_token)
                   -- A term an operator released (a task's claim, which is
                   -- taken over after it) did not die silently.
                   AND NOT EXISTS (SELECT 1 FROM $schema.lease_events r
                                    WHERE r.resource = e.resource AND r.fencing_token = last.fencing_token
                                      AND r.kind = 'released')
                 ORDER BY e.at DESC LIMIT $1
             ), everything AS (
                SELECT * FROM killed UNION ALL SELECT * FROM silent
             ), shown AS (
                (SELECT * FROM everything ORDER BY started_at DESC LIMIT $1)
                UNION
                (SELECT * FROM everything
                  WHERE cause = 'killed'
                    AND ((taken_at IS NULL AND ended IS NULL)
                         OR taken_at > now() - make_interval(secs => $2)
                         OR (ended IS NOT NULL AND started_at > now() - make_interval(secs => $2))))
             )
             SELECT cause, subject, resource, old_holder, old_token, started_at, taken_at,
                    new_holder, new_token, ended,
                    CASE WHEN taken_at IS NULL THEN NULL
                         WHEN EXISTS (SELECT 1 FROM $schema.lease_events s
                                       WHERE s.resource = shown.resource
                                         AND s.fencing_token = shown.old_token
                                         AND s.kind = 'session_ended') THEN 'session'
                         ELSE 'ttl' END AS rule,
                    (EXTRACT(EPOCH FROM (taken_at - started_at)) * 1000)::bigint AS elapsed_ms,
                    (EXTRACT(EPOCH FROM (now() - started_at)) * 1000)::bigint AS since_ms
               FROM shown
              ORDER BY started_at DESC",
        )
        .bind(limit)
        .bind(KILL_SHOWN_FOR_SECS as f64)
        .fetch_all(&mut *conn)
        .await
    }
    .await)
}

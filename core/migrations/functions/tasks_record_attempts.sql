-- Trigger function (AFTER UPDATE ON tasks, per statement): a task's claims
-- on record. The task row is the claim's lease (issue 41: its processor,
-- fencing token and deadline; no `leases` row), so this writes what the
-- lease triggers wrote for it, in the transaction of the change, so no path
-- (a claim of one task or a thousand, a completion, the REST API, an
-- operator's cancel, a hand-written UPDATE in psql) changes a task's claim
-- unrecorded, and a bulk claim costs one INSERT per table:
--
-- * the attempts: a new claim (status becomes started, or a started task
--   gets a new fencing token) opens an attempt ('running'), and the claim
--   it ends closes the previous one: started -> started (a takeover)
--   'taken_over', -> processed 'completed', -> cancelled 'cancelled', ->
--   pending with one attempt less (a snooze) 'snoozed', -> waiting with
--   one attempt less (a durable wait) 'waited', otherwise 'failed'
--   ('timed_out' and 'given_back' are named by the store afterwards, in the
--   same transaction);
-- * the term's history in lease_events, under the resource `task:<id>`, as
--   for any lease: 'acquired' (a pending task claimed), 'taken_over' (a
--   started task claimed again: its term ran out, or its session ended),
--   'released' (a live claim ended: completed, failed, snoozed, given back,
--   cancelled), 'renewed' (a heartbeat moved the deadline on). A claim that
--   ends after its deadline passed (the rescuer failing a late task) ended
--   at its deadline and gets no 'released'; a deadline moved back (a
--   session ended, an operator ending the claim) is recorded by the
--   statement that moved it.
--
-- Its plans are key look-ups on any statistics: a plpgsql statement is
-- planned once per session, and a session that first fired this while
-- `attempts` was empty kept a plan that scanned the whole table, so every
-- claim read more rows than the last. Hence enable_seqscan = off (the next
-- attempt's number is the primary key's last entry for its task), the ids
-- of the attempts it closes as an array (the scan reads their entries
-- only), and enable_nestloop = off (the changed tasks are joined by merge
-- or hash, not read again for each). Tested in tests/it/attempts.rs.
CREATE OR REPLACE FUNCTION tasks_record_attempts() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_seqscan = off
SET enable_nestloop = off
AS $$
BEGIN
    -- Race prevented: a claim issuing a token the task already had. Every
    -- claim of this version moves the token up under the row's lock (see
    -- the claim statement); a claim by an older version still running
    -- through the upgrade (which took its token from `lease_fencing`, no
    -- longer kept for tasks) or a hand-made UPDATE could move it back,
    -- and a write fenced by the old token would then pass. Refused whole.
    IF EXISTS (SELECT 1 FROM old_rows o JOIN new_rows n ON n.id = o.id
                WHERE n.fencing_token < o.fencing_token) THEN
        RAISE EXCEPTION 'a task''s fencing token may only rise: this change moves one back'
            USING ERRCODE = 'check_violation',
                  HINT = 'stop every runtime, worker and instance older than migration 20261208000001';
    END IF;
    -- One statement for the whole change: the rows whose claim began,
    -- ended or was renewed (any other update of a task passes by), the
    -- attempts they closed, the attempts they opened, and their history.
    -- A takeover does both to one attempt: closes the old (by its token)
    -- and opens the next (numbered after the task's last one; the task
    -- row's lock, held by the claim, keeps two claims from numbering at
    -- once).
    WITH changed AS (
        SELECT n.id, o.status AS was, n.status, o.fencing_token AS old_token,
               o.processor AS old_processor, o.must_heartbeat_before AS old_deadline,
               n.fencing_token, n.processor, n.started_at, n.must_heartbeat_before AS deadline,
               n.attempts < o.attempts AS gave_back_attempt,
               n.processed_at, n.cancelled_at, n.failed_at, n.last_error,
               (n.status IS DISTINCT FROM o.status
                OR n.fencing_token IS DISTINCT FROM o.fencing_token) AS claim_changed
          FROM old_rows o JOIN new_rows n ON n.id = o.id
         WHERE (o.status = 'started' OR n.status = 'started')
           AND (n.status IS DISTINCT FROM o.status
                OR n.fencing_token IS DISTINCT FROM o.fencing_token
                OR n.must_heartbeat_before > o.must_heartbeat_before)
    ), ended AS (
        SELECT c.*,
               CASE WHEN c.status = 'started'   THEN 'taken_over'
                    WHEN c.status = 'processed' THEN 'completed'
                    WHEN c.status = 'cancelled' THEN 'cancelled'
                    WHEN c.status = 'pending' AND c.gave_back_attempt THEN 'snoozed'
                    WHEN c.status = 'waiting' AND c.gave_back_attempt THEN 'waited'
                    ELSE 'failed' END AS outcome,
               CASE WHEN c.status = 'processed' THEN c.processed_at
                    WHEN c.status = 'cancelled' THEN c.cancelled_at
                    WHEN c.status = 'failed'    THEN c.failed_at
                    -- A takeover ends the old attempt when the new one
                    -- begins: at the claim's own time, which for a claim
                    -- of a limited queue is after its turn on the queue's
                    -- lock, later than its transaction's start (now()).
                    WHEN c.status = 'started'   THEN COALESCE(c.started_at, now())
                    ELSE now() END AS ended_at
          FROM changed c WHERE c.was = 'started' AND c.claim_changed
    ), closed AS (
        UPDATE attempts a
           SET outcome = e.outcome, ended_at = e.ended_at,
               error = CASE WHEN e.outcome = 'failed' THEN e.last_error END
          FROM ended e
         WHERE a.task_id = ANY (ARRAY(SELECT e.id FROM ended e))
           AND a.task_id = e.id AND a.fencing_token = e.old_token AND a.outcome = 'running'
    ), opened AS (
        INSERT INTO attempts (task_id, number, processor, fencing_token, claimed_at, outcome)
        SELECT c.id,
               COALESCE((SELECT max(a.number) FROM attempts a WHERE a.task_id = c.id), 0) + 1,
               c.processor, c.fencing_token, COALESCE(c.started_at, now()), 'running'
          FROM changed c
         WHERE c.status = 'started' AND c.claim_changed
         ORDER BY c.id
    )
    -- A claim's history is stamped with the claim's own time (the task's
    -- started_at), as its attempt is: a claim of a limited queue runs
    -- after waiting its turn on the queue's lock, and stamped with its
    -- transaction's start it would show a takeover before the lease it
    -- took over had ended (seen by the fault harness: 3.5 s early under
    -- a frozen claim). Every other change is stamped now().
    INSERT INTO lease_events (resource, holder, fencing_token, kind, previous_holder, expires_at, at)
    SELECT 'task:' || c.id, e.holder, e.token, e.kind, e.previous_holder, e.expires_at, e.at
      FROM changed c
     CROSS JOIN LATERAL (SELECT
             CASE WHEN c.status = 'started' AND c.claim_changed
                      THEN CASE WHEN c.was = 'started' THEN 'taken_over' ELSE 'acquired' END
                  WHEN c.status = 'started' THEN 'renewed'
                  WHEN c.old_deadline > now() THEN 'released'
             END AS kind,
             CASE WHEN c.status = 'started' THEN c.processor ELSE c.old_processor END AS holder,
             CASE WHEN c.status = 'started' THEN c.fencing_token ELSE c.old_token END AS token,
             CASE WHEN c.status = 'started' AND c.was = 'started' AND c.claim_changed
                  THEN c.old_processor END AS previous_holder,
             CASE WHEN c.status = 'started' THEN c.deadline
                  ELSE date_trunc('milliseconds', now()) END AS expires_at,
             CASE WHEN c.status = 'started' AND c.claim_changed
                  THEN COALESCE(c.started_at, now()) ELSE now() END AS at) e
     WHERE e.kind IS NOT NULL
     ORDER BY c.id;
    RETURN NULL;
END;
$$;

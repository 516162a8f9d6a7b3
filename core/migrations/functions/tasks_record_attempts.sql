-- Trigger function (AFTER UPDATE ON tasks, per statement): the attempts on
-- record. A new claim (status becomes started, or a started task gets a
-- new fencing token) opens an attempt ('running'), and the claim it ends
-- closes the previous one: started -> started (a takeover) 'taken_over',
-- -> processed 'completed', -> cancelled 'cancelled', -> pending with one
-- attempt less (a snooze) 'snoozed', otherwise 'failed' ('timed_out' and
-- 'given_back' are named by the store afterwards, in the same
-- transaction). In the transaction of the change, so no path changes a
-- task's claim unrecorded, and a bulk claim costs one INSERT.
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
    -- One statement for the whole change: the rows whose claim began or
    -- ended (a heartbeat, or any update of a task that is neither
    -- started nor was, passes by), the attempts they closed, and the
    -- attempts they opened. A takeover does both to one task: closes the
    -- old attempt (by its token) and opens the next (numbered after the
    -- task's last one; the task row's lock, held by the claim, keeps two
    -- claims from numbering at once).
    WITH changed AS (
        SELECT n.id, o.status AS was, n.status, o.fencing_token AS old_token,
               n.fencing_token, n.processor, n.started_at, n.attempts < o.attempts AS gave_back_attempt,
               n.processed_at, n.cancelled_at, n.failed_at, n.last_error
          FROM old_rows o JOIN new_rows n ON n.id = o.id
         WHERE (o.status = 'started' OR n.status = 'started')
           AND (n.status IS DISTINCT FROM o.status OR n.fencing_token IS DISTINCT FROM o.fencing_token)
    ), closed AS (
        UPDATE attempts a
           SET outcome = e.outcome, ended_at = e.ended_at,
               error = CASE WHEN e.outcome = 'failed' THEN e.last_error END
          FROM (SELECT c.*,
                       CASE WHEN c.status = 'started'   THEN 'taken_over'
                            WHEN c.status = 'processed' THEN 'completed'
                            WHEN c.status = 'cancelled' THEN 'cancelled'
                            WHEN c.status = 'pending' AND c.gave_back_attempt THEN 'snoozed'
                            ELSE 'failed' END AS outcome,
                       CASE WHEN c.status = 'processed' THEN c.processed_at
                            WHEN c.status = 'cancelled' THEN c.cancelled_at
                            WHEN c.status = 'failed'    THEN c.failed_at
                            ELSE now() END AS ended_at
                  FROM changed c WHERE c.was = 'started') e
         WHERE a.task_id = ANY (ARRAY(SELECT c.id FROM changed c WHERE c.was = 'started'))
           AND a.task_id = e.id AND a.fencing_token = e.old_token AND a.outcome = 'running'
    )
    INSERT INTO attempts (task_id, number, processor, fencing_token, claimed_at, outcome)
    SELECT c.id,
           COALESCE((SELECT max(a.number) FROM attempts a WHERE a.task_id = c.id), 0) + 1,
           c.processor, c.fencing_token, COALESCE(c.started_at, now()), 'running'
      FROM changed c
     WHERE c.status = 'started'
     ORDER BY c.id;
    RETURN NULL;
END;
$$;

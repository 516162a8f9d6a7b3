-- The attempts trigger (issue 26's tasks_record_attempts) reads attempts by
-- task id only, whatever the planner believed of the table when it planned.
--
-- Found by issue 27's long benchmark runs collapsing: a plpgsql statement is
-- planned once per session and its plan kept until the table's statistics
-- change. A session that first fired the trigger while `attempts` was empty
-- (a fresh deployment, or after a TRUNCATE) kept a plan that scans the whole
-- table: a sequential scan for the attempt it closes and for the number of
-- the one it opens. `attempts` grows by a row per claim, so every claim and
-- completion of that session read more rows than the last (seen: 2,700
-- tasks/s falling to 1,000 within ten seconds), until autovacuum's next
-- ANALYZE of the table made the session plan again.
--
-- Three changes make its plans key look-ups on any
-- statistics:
--   enable_seqscan = off       the planner takes an index where there is
--                              one: the number of the next attempt is the
--                              primary key's last entry for its task;
--   task_id = ANY (ARRAY(...)) for the attempts it closes: with the setting
--                              alone, the plan read the whole primary key
--                              with the join as a filter; with the ids as an
--                              array, the scan reads their entries only (as
--                              tasks_delete_attempts already does);
--   enable_nestloop = off      and joins those rows to the changed tasks by
--                              merge or hash, not by reading the changed
--                              rows again for each (a planner that expects
--                              one changed row would, and a claim of 1,000
--                              tasks would compare a million pairs).
-- Otherwise the function is as before. Tested in tests/it/attempts.rs (a
-- session whose plans were made on an empty table reads only the rows of its
-- tasks after the table has grown).

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

-- Attempts on record (issue 26): every attempt of a task, who ran it, under
-- which fencing token, and how it ended.
--
-- Written by statement-level triggers on tasks, in the transaction of the
-- change, so no path (a claim of one task or a thousand, a completion, the
-- REST API, an operator's cancel, a hand-written UPDATE in psql) changes a
-- task's claim unrecorded, and a bulk claim costs one INSERT, not one per
-- task. How a change of the task row reads:
--
--   a new claim (status becomes started, or a started task gets a new
--   fencing token)           opens an attempt: outcome 'running'
--   and the claim it ends    closes the previous one:
--     started -> started (a new token: its lease ran out, another claim
--                took the task)                        'taken_over'
--     started -> processed                             'completed'
--     started -> cancelled                             'cancelled'
--     started -> failed (out of attempts, or its
--                lease ran out on its last attempt)    'failed'
--     started -> pending with one attempt less (a
--                handler's snooze gives its attempt back) 'snoozed'
--     started -> pending otherwise (a failed attempt,
--                retried after the backoff)            'failed'
--
-- 'timed_out' and 'given_back' are failures too (the task goes back to
-- pending or to failed, as for 'failed'); only the worker knows which it
-- was, so the store's fail names it in the same transaction
-- (queue::store::fail_as), after the trigger wrote 'failed'.
--
-- Pruned with the task: a statement trigger on task deletions deletes their
-- attempts, one DELETE per statement (a foreign key would add a per-row
-- check to every claim's INSERT here, and a per-row cascade to every
-- pruning batch). Tasks that were started before this migration have no
-- row for that attempt; their later attempts are recorded.

CREATE TABLE attempts (
    task_id       bigint NOT NULL,
    number        integer NOT NULL CHECK (number >= 1),
    processor     text NOT NULL,
    fencing_token bigint NOT NULL,
    claimed_at    timestamptz(3) NOT NULL,
    ended_at      timestamptz(3),
    outcome       text NOT NULL CHECK (outcome IN (
                      'running', 'completed', 'failed', 'taken_over',
                      'cancelled', 'timed_out', 'snoozed', 'given_back')),
    error         text,
    PRIMARY KEY (task_id, number),
    CHECK ((outcome = 'running') = (ended_at IS NULL))
);

CREATE FUNCTION tasks_record_attempts() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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
         WHERE a.task_id = e.id AND a.fencing_token = e.old_token AND a.outcome = 'running'
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

CREATE TRIGGER tasks_record_attempts
    AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_record_attempts();

CREATE FUNCTION tasks_delete_attempts() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- By the primary key's index, one probe per deleted task, whatever the
    -- planner guesses of the transition table (it has no statistics; a
    -- join was planned as a merge over the whole index).
    DELETE FROM attempts a WHERE a.task_id = ANY (ARRAY(SELECT o.id FROM old_rows o));
    RETURN NULL;
END;
$$;

CREATE TRIGGER tasks_delete_attempts
    AFTER DELETE ON tasks
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_delete_attempts();

CREATE FUNCTION tasks_truncate_attempts() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    TRUNCATE attempts;
    RETURN NULL;
END;
$$;

CREATE TRIGGER tasks_truncate_attempts
    AFTER TRUNCATE ON tasks
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_truncate_attempts();

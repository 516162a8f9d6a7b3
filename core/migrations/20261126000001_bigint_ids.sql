-- Ids that last: every id that grows per claim (a lease row is inserted per
-- claim) or per task is bigint, and so are the sequences behind them. As
-- serial (int4) both sequences passed 2^31 in about four days at 7,000
-- tasks/s, and then every claim and every singleton acquire failed
-- ("nextval: reached maximum value of sequence"): retention deletes rows,
-- never sequence values.
--
-- Cost on an existing database: each ALTER COLUMN ... TYPE rewrites its
-- table and its indexes under an ACCESS EXCLUSIVE lock (no claim, no
-- enqueue, no read of that table until the migration commits), about as
-- long as copying the table: seconds per million rows. The README says how
-- to plan for it.

ALTER TABLE tasks ALTER COLUMN id TYPE bigint;
ALTER TABLE leases ALTER COLUMN id TYPE bigint;
-- A worker's current task, and its lifetime counters (one worker doing all
-- the work at peak rate passes 2^31 tasks in under four days too).
ALTER TABLE workers
    ALTER COLUMN task_id TYPE bigint,
    ALTER COLUMN tasks_done TYPE bigint,
    ALTER COLUMN tasks_abandoned TYPE bigint;

-- A serial column's sequence is `AS integer`, capped at 2^31 - 1 whatever
-- its column's type; `AS bigint` lifts the cap to bigint's.
DO $$
DECLARE
    seq text;
BEGIN
    FOREACH seq IN ARRAY ARRAY[pg_get_serial_sequence('tasks', 'id'),
                               pg_get_serial_sequence('leases', 'id')] LOOP
        EXECUTE format('ALTER SEQUENCE %s AS bigint', seq);
    END LOOP;
END
$$;

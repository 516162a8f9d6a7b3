-- Task controls (issue 14): an operator may cancel a task, pending or
-- started, and retry a failed or cancelled one.
--
--   cancelled  an operator took it out of the queue; kept with cancelled_at
--              (and last_error naming who did it). If it was started, its
--              claim's lease ended in the same transaction, so its holder's
--              later heartbeats and completion are refused and recorded as
--              stale writes.
--
-- A retry puts a failed or cancelled task back to pending with attempts 0.

ALTER TABLE tasks DROP CONSTRAINT tasks_status_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_status_check
    CHECK (status IN ('pending', 'started', 'processed', 'failed', 'cancelled'));
ALTER TABLE tasks ADD COLUMN cancelled_at timestamptz(3);
ALTER TABLE tasks ADD CONSTRAINT tasks_cancelled_at_check
    CHECK (status <> 'cancelled' OR cancelled_at IS NOT NULL);

-- The counters learn the new status: a column, and every trigger function
-- that moves them.
ALTER TABLE task_counts ADD COLUMN cancelled bigint NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION task_counts_move() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE task_counts c
       SET pending   = c.pending   + d.pending,
           started   = c.started   + d.started,
           processed = c.processed + d.processed,
           failed    = c.failed    + d.failed,
           cancelled = c.cancelled + d.cancelled
      FROM (SELECT count(*) AS moved,
                   sum((n.status = 'pending')::int   - (o.status = 'pending')::int)   AS pending,
                   sum((n.status = 'started')::int   - (o.status = 'started')::int)   AS started,
                   sum((n.status = 'processed')::int - (o.status = 'processed')::int) AS processed,
                   sum((n.status = 'failed')::int    - (o.status = 'failed')::int)    AS failed,
                   sum((n.status = 'cancelled')::int - (o.status = 'cancelled')::int) AS cancelled
              FROM new_rows n JOIN old_rows o ON o.id = n.id
             WHERE n.status IS DISTINCT FROM o.status) d
     WHERE c.shard = pg_backend_pid() % 16 AND d.moved > 0;
    RETURN NULL;
END;
$$;

DROP FUNCTION task_counts_rows() CASCADE;
DROP FUNCTION task_counts_add(int, bigint, bigint, bigint, bigint);

CREATE FUNCTION task_counts_add(sign int, pending bigint, started bigint,
                                processed bigint, failed bigint, cancelled bigint) RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    UPDATE task_counts c
       SET pending   = c.pending   + sign * task_counts_add.pending,
           started   = c.started   + sign * task_counts_add.started,
           processed = c.processed + sign * task_counts_add.processed,
           failed    = c.failed    + sign * task_counts_add.failed,
           cancelled = c.cancelled + sign * task_counts_add.cancelled
     WHERE c.shard = pg_backend_pid() % 16;
$$;

CREATE FUNCTION task_counts_rows() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM task_counts_add(1,
            count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'started'),
            count(*) FILTER (WHERE status = 'processed'), count(*) FILTER (WHERE status = 'failed'),
            count(*) FILTER (WHERE status = 'cancelled'))
           FROM new_rows;
    ELSE
        PERFORM task_counts_add(-1,
            count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'started'),
            count(*) FILTER (WHERE status = 'processed'), count(*) FILTER (WHERE status = 'failed'),
            count(*) FILTER (WHERE status = 'cancelled'))
           FROM old_rows;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER task_counts_insert
    AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION task_counts_rows();

CREATE TRIGGER task_counts_delete
    AFTER DELETE ON tasks
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION task_counts_rows();

CREATE OR REPLACE FUNCTION task_counts_truncate() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE task_counts SET pending = 0, started = 0, processed = 0, failed = 0, cancelled = 0;
    RETURN NULL;
END;
$$;

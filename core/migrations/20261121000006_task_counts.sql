-- task_counts: how many tasks are in each status, kept by triggers so the
-- overview never counts a million-row table.
--
-- Sharded: 16 rows, one per shard, each with a column per status; a writer
-- adds to the row of shard pg_backend_pid() % 16, so concurrent claimers and
-- completers rarely update the same row (a single counter row would make
-- every completion wait for the previous one's commit). A reader sums 16
-- rows. Every counter change commits or rolls back with the task change
-- that caused it.
--
-- One row per shard, not one per (status, shard): a status change then
-- locks exactly one counter row. With a row per status, a move locked two
-- rows, in whatever order the scan met them, and two claimers on one shard
-- (pending -> started, started -> processed) deadlocked; the 32-claimer
-- task store test hit it.
--
-- Cost (16 concurrent claimers claiming and completing 2000 tasks through
-- the real statements, with and without the trigger: `cargo test --features
-- ssr --test it counter_trigger_cost -- --ignored --nocapture`): see the
-- README, "The overview".

CREATE TABLE task_counts (
    shard     smallint PRIMARY KEY CHECK (shard BETWEEN 0 AND 15),
    pending   bigint NOT NULL DEFAULT 0,
    started   bigint NOT NULL DEFAULT 0,
    processed bigint NOT NULL DEFAULT 0,
    failed    bigint NOT NULL DEFAULT 0
);

-- Every row exists up front, so a trigger only ever UPDATEs (no insert race).
INSERT INTO task_counts (shard) SELECT generate_series(0, 15);

-- Seed from the rows already there.
UPDATE task_counts
   SET pending   = (SELECT count(*) FROM tasks WHERE status = 'pending'),
       started   = (SELECT count(*) FROM tasks WHERE status = 'started'),
       processed = (SELECT count(*) FROM tasks WHERE status = 'processed'),
       failed    = (SELECT count(*) FROM tasks WHERE status = 'failed')
 WHERE shard = 0;

-- A status change of one row: the hot path (claim, complete, fail). The
-- trigger's WHEN clause keeps heartbeats and takeovers (started -> started)
-- from calling it at all.
CREATE FUNCTION task_counts_move() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE task_counts
       SET pending   = pending   + (NEW.status = 'pending')::int   - (OLD.status = 'pending')::int,
           started   = started   + (NEW.status = 'started')::int   - (OLD.status = 'started')::int,
           processed = processed + (NEW.status = 'processed')::int - (OLD.status = 'processed')::int,
           failed    = failed    + (NEW.status = 'failed')::int    - (OLD.status = 'failed')::int
     WHERE shard = pg_backend_pid() % 16;
    RETURN NULL;
END;
$$;

CREATE TRIGGER task_counts_move
    AFTER UPDATE OF status ON tasks
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION task_counts_move();

-- Inserts and deletes are counted per statement, from the transition table:
-- one counter update whether the statement wrote one row (an enqueue) or a
-- million (INSERT ... SELECT generate_series).
CREATE FUNCTION task_counts_add(sign int, pending bigint, started bigint,
                                processed bigint, failed bigint) RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    UPDATE task_counts c
       SET pending   = c.pending   + sign * task_counts_add.pending,
           started   = c.started   + sign * task_counts_add.started,
           processed = c.processed + sign * task_counts_add.processed,
           failed    = c.failed    + sign * task_counts_add.failed
     WHERE c.shard = pg_backend_pid() % 16;
$$;

-- Each trigger defines only its own transition table (new_rows for an
-- insert, old_rows for a delete), hence the two branches.
CREATE FUNCTION task_counts_rows() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM task_counts_add(1,
            count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'started'),
            count(*) FILTER (WHERE status = 'processed'), count(*) FILTER (WHERE status = 'failed'))
           FROM new_rows;
    ELSE
        PERFORM task_counts_add(-1,
            count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'started'),
            count(*) FILTER (WHERE status = 'processed'), count(*) FILTER (WHERE status = 'failed'))
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

CREATE FUNCTION task_counts_truncate() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE task_counts SET pending = 0, started = 0, processed = 0, failed = 0;
    RETURN NULL;
END;
$$;

CREATE TRIGGER task_counts_truncate
    AFTER TRUNCATE ON tasks
    FOR EACH STATEMENT EXECUTE FUNCTION task_counts_truncate();

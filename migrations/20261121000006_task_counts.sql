-- task_counts: how many tasks are in each status, kept by triggers so the
-- overview never counts a million-row table.
--
-- Sharded: each status has 16 rows, and a writer adds to the row of shard
-- pg_backend_pid() % 16. Concurrent claimers and completers therefore rarely
-- update the same row (a single counter row per status would make every
-- completion wait for the previous one's commit). A reader sums at most 64
-- rows. Counts include uncommitted work of nobody: every change to a counter
-- commits or rolls back with the task change that caused it.
--
-- Cost (measured with 16 concurrent claimers completing 2000 tasks through
-- the real claim and complete statements, see tests/it/overview.rs
-- `counter_trigger_cost`): about 1.0 (see the README, "The overview").

CREATE TABLE task_counts (
    status text NOT NULL CHECK (status IN ('pending', 'started', 'processed', 'failed')),
    shard  smallint NOT NULL CHECK (shard BETWEEN 0 AND 15),
    n      bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (status, shard)
);

-- Every row exists up front, so a trigger only ever UPDATEs (no insert race).
INSERT INTO task_counts (status, shard, n)
SELECT s, g, 0
  FROM unnest(ARRAY['pending', 'started', 'processed', 'failed']) AS s,
       generate_series(0, 15) AS g;

-- Seed from the rows already there.
UPDATE task_counts c
   SET n = x.n
  FROM (SELECT status, count(*) AS n FROM tasks GROUP BY status) x
 WHERE c.status = x.status AND c.shard = 0;

-- A status change of one row: the hot path (claim, complete, fail). The
-- trigger's WHEN clause keeps heartbeats and takeovers (started -> started)
-- from calling it at all.
CREATE FUNCTION task_counts_move() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE task_counts
       SET n = n + CASE WHEN status = NEW.status THEN 1 ELSE -1 END
     WHERE shard = pg_backend_pid() % 16 AND status IN (OLD.status, NEW.status);
    RETURN NULL;
END;
$$;

CREATE TRIGGER task_counts_move
    AFTER UPDATE OF status ON tasks
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION task_counts_move();

-- Inserts and deletes are counted per statement, from the transition table:
-- one counter update per status touched, whether the statement wrote one
-- row (an enqueue) or a million (INSERT ... SELECT generate_series).
CREATE FUNCTION task_counts_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE task_counts c
           SET n = c.n + x.n
          FROM (SELECT status, count(*) AS n FROM new_rows GROUP BY status) x
         WHERE c.status = x.status AND c.shard = pg_backend_pid() % 16;
    ELSE
        UPDATE task_counts c
           SET n = c.n - x.n
          FROM (SELECT status, count(*) AS n FROM old_rows GROUP BY status) x
         WHERE c.status = x.status AND c.shard = pg_backend_pid() % 16;
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
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE task_counts SET n = 0 WHERE n <> 0;
    RETURN NULL;
END;
$$;

CREATE TRIGGER task_counts_truncate
    AFTER TRUNCATE ON tasks
    FOR EACH STATEMENT EXECUTE FUNCTION task_counts_truncate();

-- queues: one row per queue name, created on first use, with the operator's
-- paused flag (issue 26).
--
-- name       a queue's name, as tasks.queue (the same length rule).
-- paused     claims skip the queue's tasks while true: every claim statement
--            checks the flag itself, so a pause is effective at the next
--            claim, in the database, on every runtime at once. Tasks already
--            started run on and finish normally.
-- paused_at  when the current pause began (null while running).
-- updated_at the last pause or resume (or the row's creation).
--
-- A row appears with the first task of its queue (the trigger below), or
-- with an operator's pause of a name no task has used yet, so the queue is
-- paused when its first task arrives. Rows are never deleted: a queue whose
-- tasks were all pruned keeps its flag.

CREATE TABLE queues (
    name       text PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 128),
    paused     boolean NOT NULL DEFAULT false,
    paused_at  timestamptz(3),
    updated_at timestamptz(3) NOT NULL DEFAULT now(),
    CHECK (paused = (paused_at IS NOT NULL))
);

-- Once per INSERT statement (one enqueue or 10,000), from the transition
-- table: only the names not yet in `queues`, so the common case (every queue
-- known) is a read of the primary key per distinct name and writes nothing.
-- Measured (EXPLAIN ANALYZE, PostgreSQL 15, a busy 2-core machine): 0.05 ms
-- for a one-task enqueue (the task counter's trigger: 0.2 ms), 4-11 ms for
-- 10,000 tasks in 10 queues, of a 200-280 ms statement.
--
-- Races prevented:
-- - two enqueues of the same new queue at once: ON CONFLICT DO NOTHING; the
--   second waits for the first's row, then skips it (no unique violation).
-- - a deadlock of two enqueues each naming two new queues (a, b) and (b, a):
--   both insert the names in sorted order, so the one that waits always
--   waits for a name the other took first, never the reverse. (Two host
--   transactions that each enqueue into two brand-new queues in opposite
--   order, in separate statements, can still deadlock once, as any two
--   transactions inserting the same new keys in opposite order can;
--   PostgreSQL ends one of them and the host retries it.)
-- - an enqueue racing a pause of its (new) queue: the pause's upsert and
--   this insert meet on the same key; whichever commits second finds the
--   first's row (a pause sets the flag on it either way).
CREATE FUNCTION queues_on_first_use() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO queues (name)
    SELECT d.queue FROM (SELECT DISTINCT n.queue FROM new_rows n) d
     WHERE NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = d.queue)
     ORDER BY d.queue
    ON CONFLICT (name) DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE TRIGGER queues_on_first_use
    AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION queues_on_first_use();

-- The queues used before this migration.
INSERT INTO queues (name)
SELECT DISTINCT queue FROM tasks ORDER BY queue
ON CONFLICT (name) DO NOTHING;

-- Trigger function (AFTER UPDATE ON tasks, per statement): moves the
-- status changes the statement made between the columns of task_counts, on
-- this transaction's counter row (task_counts_add, task_counts_shard);
-- writes nothing when it made none (a heartbeat, a takeover: started ->
-- started). One counter update per statement, however many tasks it
-- changed. A new status is a column here.
--
-- Each status's change is the new rows counted up and the old rows counted
-- down: an UPDATE keeps every row's id, so a row whose status stayed
-- cancels out. The two transition tables are never joined: a join is
-- planned without knowing their size (a cached plan guessed one row each)
-- and was a nested loop, a claim of 368 tasks comparing 135,000 pairs for
-- 40 ms of its 53 (auto_explain on the bench's runtime, issue 39); this is
-- one pass over each.
CREATE OR REPLACE FUNCTION task_counts_move() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    d record;
BEGIN
    SELECT coalesce(sum(s.pending), 0)   AS pending,
           coalesce(sum(s.started), 0)   AS started,
           coalesce(sum(s.processed), 0) AS processed,
           coalesce(sum(s.failed), 0)    AS failed,
           coalesce(sum(s.cancelled), 0) AS cancelled,
           coalesce(sum(s.waiting), 0)   AS waiting
      INTO d
      FROM (SELECT (n.status = 'pending')::int   AS pending,
                   (n.status = 'started')::int   AS started,
                   (n.status = 'processed')::int AS processed,
                   (n.status = 'failed')::int    AS failed,
                   (n.status = 'cancelled')::int AS cancelled,
                   (n.status = 'waiting')::int   AS waiting
              FROM new_rows n
            UNION ALL
            SELECT -(o.status = 'pending')::int,
                   -(o.status = 'started')::int,
                   -(o.status = 'processed')::int,
                   -(o.status = 'failed')::int,
                   -(o.status = 'cancelled')::int,
                   -(o.status = 'waiting')::int
              FROM old_rows o) s;
    IF (d.pending, d.started, d.processed, d.failed, d.cancelled, d.waiting) <> (0, 0, 0, 0, 0, 0) THEN
        PERFORM task_counts_add(1, d.pending, d.started, d.processed, d.failed, d.cancelled,
                                d.waiting);
    END IF;
    RETURN NULL;
END;
$$;

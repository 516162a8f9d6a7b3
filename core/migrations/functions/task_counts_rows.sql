-- Trigger function (AFTER INSERT and AFTER DELETE ON tasks, per
-- statement): counts the inserted or deleted tasks per status from the
-- transition table (each trigger defines only its own: new_rows for an
-- insert, old_rows for a delete, hence the branches). A pruning deletion
-- (pruning()) counts on the pruner's own row, shard 16, which no claimer or
-- completer updates (so pruning holds no lock a claimer waits on), and adds
-- the pruned processed and failed tasks to pruned_processed/pruned_failed,
-- so the overview's throughput totals only grow. A new status is a count
-- here.
CREATE OR REPLACE FUNCTION task_counts_rows() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM task_counts_add(1,
            count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'started'),
            count(*) FILTER (WHERE status = 'processed'), count(*) FILTER (WHERE status = 'failed'),
            count(*) FILTER (WHERE status = 'cancelled'), count(*) FILTER (WHERE status = 'waiting'))
           FROM new_rows;
    ELSIF pruning() THEN
        UPDATE task_counts c
           SET pending          = c.pending   - d.pending,
               started          = c.started   - d.started,
               processed        = c.processed - d.processed,
               failed           = c.failed    - d.failed,
               cancelled        = c.cancelled - d.cancelled,
               waiting          = c.waiting   - d.waiting,
               pruned_processed = c.pruned_processed + d.processed,
               pruned_failed    = c.pruned_failed + d.failed
          FROM (SELECT count(*) FILTER (WHERE status = 'pending')   AS pending,
                       count(*) FILTER (WHERE status = 'started')   AS started,
                       count(*) FILTER (WHERE status = 'processed') AS processed,
                       count(*) FILTER (WHERE status = 'failed')    AS failed,
                       count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
                       count(*) FILTER (WHERE status = 'waiting')   AS waiting
                  FROM old_rows) d
         WHERE c.shard = 16;
    ELSE
        PERFORM task_counts_add(-1,
            count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'started'),
            count(*) FILTER (WHERE status = 'processed'), count(*) FILTER (WHERE status = 'failed'),
            count(*) FILTER (WHERE status = 'cancelled'), count(*) FILTER (WHERE status = 'waiting'))
           FROM old_rows;
    END IF;
    RETURN NULL;
END;
$$;

-- Trigger function (AFTER UPDATE ON tasks, per statement): moves the
-- status changes the statement made between the columns of task_counts, on
-- this transaction's counter row (task_counts_shard); writes nothing when
-- it made none (a heartbeat, a takeover: started -> started). One counter
-- update per statement, however many tasks it changed. A new status is a
-- column here.
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
     WHERE c.shard = task_counts_shard() AND d.moved > 0;
    RETURN NULL;
END;
$$;

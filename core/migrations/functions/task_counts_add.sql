-- Adds (sign 1) or subtracts (sign -1) a statement's inserted or deleted
-- tasks, per status, to this transaction's counter row (task_counts_shard).
-- Called once per statement by task_counts_rows, from the transition
-- table: one counter update whether the statement wrote one row or a
-- million. A new status is a new argument here (so a versioned migration
-- drops the old signature) and a column of task_counts.
CREATE OR REPLACE FUNCTION task_counts_add(sign int, pending bigint, started bigint,
                                           processed bigint, failed bigint, cancelled bigint,
                                           waiting bigint)
RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    UPDATE task_counts c
       SET pending   = c.pending   + sign * task_counts_add.pending,
           started   = c.started   + sign * task_counts_add.started,
           processed = c.processed + sign * task_counts_add.processed,
           failed    = c.failed    + sign * task_counts_add.failed,
           cancelled = c.cancelled + sign * task_counts_add.cancelled,
           waiting   = c.waiting   + sign * task_counts_add.waiting
     WHERE c.shard = task_counts_shard();
$$;

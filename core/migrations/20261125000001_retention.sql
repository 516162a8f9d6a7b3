-- Retention (issue 14): the maintenance job (core/src/maintenance/) deletes
-- finished tasks with their lease rows, history and fencing rows, ended
-- leases of other resources, history, failover kills and dead
-- instances/workers older than retention_secs, in small batches, each its
-- own short transaction. What it needs of the schema:
--
-- 1. Pruning must not write history. The statement trigger on leases
--    deletions (leases_deleted) records a 'deleted' event for every deleted
--    lease row: pruning a million task leases would write a million fresh
--    events, which the next run would prune, and so on. A pruning
--    transaction says who it is with a transaction-local setting,
--    `SELECT set_config('leasekeeper.pruning', 'on', true)` (SET LOCAL: it
--    ends with the transaction, so it cannot leak to the next user of a
--    pooled connection), and the trigger records nothing then. Every other
--    deletion (the REST API, psql) is recorded as before. Whoever can set
--    it can already delete rows of these tables by hand; it is no privilege.
--
-- 2. Pruning must not hold a lock a claimer waits on. The delete trigger on
--    tasks subtracts the deleted tasks from task_counts, on the shard row of
--    the deleting backend (pg_backend_pid() % 16): a claimer on the same
--    shard would wait for the pruning transaction to commit before its own
--    status change could count. A pruning transaction counts on a row of
--    its own instead, shard 16, which no claimer or completer ever updates;
--    readers sum every row as before.
--
-- 3. The overview's throughput chart reads the growth of the processed
--    and failed sums each second; pruning makes them shrink (counts are of
--    the rows present), which the chart would read as a second without
--    completions. Pruned tasks are added to pruned_processed/pruned_failed
--    on shard 16, and the chart reads processed + pruned_processed (and
--    failed likewise): totals that only grow.
--
-- 4. Finding what is old must not read what is young. tasks_finished_idx
--    orders finished tasks by when they finished (the latest of their
--    processed_at, failed_at, cancelled_at), so a batch reads its oldest
--    rows first and stops at the cutoff, however many young finished tasks
--    there are. It costs a completion one more index entry (a completion
--    changes status, so it is never a HOT update and every index already
--    gets an entry). leases_ended_idx does the same for the few leases of
--    resources other than tasks (partial: a task lease never enters it).
--    lease_events needs none: its ids follow its times, so its oldest rows
--    are read by primary key (see core/src/maintenance/store.rs).

-- 2 and 3: the pruner's own counter row.
ALTER TABLE task_counts DROP CONSTRAINT task_counts_shard_check;
ALTER TABLE task_counts ADD CONSTRAINT task_counts_shard_check CHECK (shard BETWEEN 0 AND 16);
ALTER TABLE task_counts
    ADD COLUMN pruned_processed bigint NOT NULL DEFAULT 0,
    ADD COLUMN pruned_failed bigint NOT NULL DEFAULT 0;
INSERT INTO task_counts (shard) VALUES (16);

-- Whether this transaction is the maintenance job's (see 1).
CREATE FUNCTION pruning() RETURNS boolean
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT coalesce(current_setting('leasekeeper.pruning', true), '') = 'on';
$$;

-- 1: no 'deleted' event for a lease row the pruner deletes.
CREATE OR REPLACE FUNCTION leases_deleted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF pruning() THEN
        RETURN NULL;
    END IF;
    INSERT INTO lease_events (resource, holder, fencing_token, kind, expires_at)
    SELECT resource, holder, fencing_token, 'deleted', expires_at FROM old_rows ORDER BY id;
    RETURN NULL;
END;
$$;

-- 2 and 3: a pruning deletion counts on shard 16 and keeps the totals.
CREATE OR REPLACE FUNCTION task_counts_rows() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM task_counts_add(1,
            count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'started'),
            count(*) FILTER (WHERE status = 'processed'), count(*) FILTER (WHERE status = 'failed'),
            count(*) FILTER (WHERE status = 'cancelled'))
           FROM new_rows;
    ELSIF pruning() THEN
        UPDATE task_counts c
           SET pending          = c.pending   - d.pending,
               started          = c.started   - d.started,
               processed        = c.processed - d.processed,
               failed           = c.failed    - d.failed,
               cancelled        = c.cancelled - d.cancelled,
               pruned_processed = c.pruned_processed + d.processed,
               pruned_failed    = c.pruned_failed + d.failed
          FROM (SELECT count(*) FILTER (WHERE status = 'pending')   AS pending,
                       count(*) FILTER (WHERE status = 'started')   AS started,
                       count(*) FILTER (WHERE status = 'processed') AS processed,
                       count(*) FILTER (WHERE status = 'failed')    AS failed,
                       count(*) FILTER (WHERE status = 'cancelled') AS cancelled
                  FROM old_rows) d
         WHERE c.shard = 16;
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

-- 4: the oldest finished tasks first; the oldest ended non-task leases.
CREATE INDEX tasks_finished_idx ON tasks (greatest(processed_at, failed_at, cancelled_at), id)
    WHERE status IN ('processed', 'failed', 'cancelled');
CREATE INDEX leases_ended_idx ON leases (expires_at) WHERE resource NOT LIKE 'task:%';

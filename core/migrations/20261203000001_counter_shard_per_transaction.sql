-- task_counts: the shard a change counts on is chosen per transaction, by
-- its transaction id, no longer per connection by pg_backend_pid() % 16.
--
-- Found by issue 27's benchmark: a runtime keeps two connections writing
-- at once, its claimer's and its completer's. When their two backend pids
-- fell on the same shard (one runtime in sixteen, or more with several
-- connections), every claim waited for the completion in flight to commit
-- and every completion for the claim, for as long as both connections
-- lived: a whole run at 1,000-3,900 tasks/s instead of 10,000-17,000, with
-- the counter's UPDATE taking 20 ms and more (seen with auto_explain: the
-- two pids were 31502 and 31518, both shard 14).
--
-- Transaction ids are handed out in order, so two transactions that write
-- at the same moment have ids close together and, most of the time,
-- different shards; when they do meet, it is for one transaction, not for
-- the connection's life. A transaction still counts on exactly one row
-- (its id does not change), so the property the sharding was built on
-- holds: a status change locks one counter row, and no two counter rows
-- are locked in two orders. Pruning keeps its own shard (16).

CREATE OR REPLACE FUNCTION task_counts_shard() RETURNS smallint
LANGUAGE sql VOLATILE SET search_path FROM CURRENT AS $$
    SELECT (pg_current_xact_id()::text::bigint % 16)::smallint;
$$;

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

CREATE OR REPLACE FUNCTION task_counts_add(sign int, pending bigint, started bigint,
                                           processed bigint, failed bigint, cancelled bigint)
RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    UPDATE task_counts c
       SET pending   = c.pending   + sign * task_counts_add.pending,
           started   = c.started   + sign * task_counts_add.started,
           processed = c.processed + sign * task_counts_add.processed,
           failed    = c.failed    + sign * task_counts_add.failed,
           cancelled = c.cancelled + sign * task_counts_add.cancelled
     WHERE c.shard = task_counts_shard();
$$;

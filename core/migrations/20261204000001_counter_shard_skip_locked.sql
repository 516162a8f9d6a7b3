-- task_counts: a transaction counts on a shard no other open transaction
-- holds, so one transaction left open (a replica frozen by SIGSTOP or a
-- long GC pause between a status change and its commit, a handler's long
-- transaction after its completion) stalls nobody else's claims and
-- completions.
--
-- Found by the ledger example's test (a replica stopped with SIGSTOP past
-- its TTL while it holds tasks): the stopped replica had a completion's
-- transaction open on shard k = its transaction id % 16; within sixteen
-- transactions the surviving replica's claim fell on shard k and waited
-- for that row lock, and its claimer with it, so it took over none of the
-- stopped replica's tasks until the stopped one resumed (pg_locks: every
-- claim and completion of the survivor queued on one task_counts tuple).
--
-- Race prevented: two transactions changing task statuses at once, one of
-- them holding its change uncommitted for as long as it likes. The shard
-- is now the first shard from (transaction id % 16) on that no other
-- transaction holds (FOR UPDATE SKIP LOCKED), so transactions that write
-- at the same moment still spread over the shards as before; only when
-- all sixteen are held does one wait, on its own shard. The choice is
-- remembered for the rest of the transaction in a transaction-local
-- setting (one per schema), so a transaction still locks exactly one
-- counter row and no two counter rows are ever locked in two orders (the
-- property the sharding was built on). The setting is transaction-local,
-- so it works behind PgBouncer in transaction mode. Pruning keeps its own
-- shard (16), outside the choice.

CREATE OR REPLACE FUNCTION task_counts_shard() RETURNS smallint
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    setting CONSTANT text := 'leasekeeper.counter_shard_' || md5(current_schema());
    chosen text := current_setting(setting, true);
    preferred CONSTANT smallint := (pg_current_xact_id()::text::bigint % 16)::smallint;
    free smallint;
BEGIN
    IF chosen IS NOT NULL AND chosen <> '' THEN
        RETURN chosen::smallint;
    END IF;
    SELECT c.shard INTO free
      FROM task_counts c
     WHERE c.shard < 16
     ORDER BY (c.shard - preferred + 16) % 16
     LIMIT 1
       FOR UPDATE SKIP LOCKED;
    free := COALESCE(free, preferred);
    PERFORM set_config(setting, free::text, true);
    RETURN free;
END;
$$;

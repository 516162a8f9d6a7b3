-- The task_counts row (shard 0-15) this transaction counts on.
--
-- Race prevented: two transactions changing task statuses at once, one of
-- them holding its change uncommitted for as long as it likes (a replica
-- frozen by SIGSTOP between a status change and its commit, a handler's
-- long transaction). The shard is the first one from (transaction id % 16)
-- on that no other transaction holds (FOR UPDATE SKIP LOCKED), so
-- transactions that write at the same moment spread over the shards; only
-- when all sixteen are held does one wait, on its own shard. The choice is
-- remembered for the rest of the transaction in a transaction-local
-- setting (one per schema), so a transaction locks exactly one counter row
-- and no two counter rows are ever locked in two orders (two claimers
-- locking two rows in opposite orders deadlocked). Transaction-local, so it
-- works behind PgBouncer in transaction mode. Pruning keeps its own shard
-- (16), outside the choice.
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

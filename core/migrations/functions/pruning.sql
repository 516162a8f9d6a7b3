-- Whether this transaction is the maintenance job's: a pruning transaction
-- says so with the transaction-local setting leasekeeper.pruning = 'on'
-- (set_config(..., true): it ends with the transaction, so it cannot leak
-- to the next user of a pooled connection). Deletions it makes write no
-- history (leases_deleted) and count on the pruner's own counter row
-- (task_counts_rows). Whoever can set it can already delete rows of these
-- tables by hand; it is no privilege.
CREATE OR REPLACE FUNCTION pruning() RETURNS boolean
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT coalesce(current_setting('leasekeeper.pruning', true), '') = 'on';
$$;

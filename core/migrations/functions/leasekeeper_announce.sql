-- Trigger function: announces a rare change (generator, instances, operator
-- rows of lease_events) on changes_channel(), in the same transaction as
-- the change, so it is delivered only if that commits. TG_ARGV[0] is the
-- topics the table's changes touch. Hot paths are announced by the
-- application after commit, batched (see core/src/live/): a NOTIFY inside
-- every write transaction would serialise their commits.
CREATE OR REPLACE FUNCTION leasekeeper_announce() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- TG_ARGV[0]: the topic names this table's changes touch.
    PERFORM pg_notify(changes_channel(), TG_ARGV[0]);
    RETURN NULL;
END;
$$;

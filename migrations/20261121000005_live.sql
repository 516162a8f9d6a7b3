-- Live updates: rare changes announce themselves on the channel
-- 'leasekeeper_changes' from triggers, in the same transaction as the change
-- (delivered only if it commits). Hot paths (claims, renewals, completions,
-- worker reports) are announced by the application after commit, batched:
-- a NOTIFY inside every write transaction would serialise their commits
-- (see src/live/mod.rs for the measurement).

CREATE FUNCTION leasekeeper_announce() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- TG_ARGV[0]: the topic names this table's changes touch.
    PERFORM pg_notify('leasekeeper_changes', TG_ARGV[0]);
    RETURN NULL;
END;
$$;

CREATE TRIGGER generator_state_announce
    AFTER INSERT OR UPDATE OR DELETE ON generator_state
    FOR EACH STATEMENT EXECUTE FUNCTION leasekeeper_announce('generator');

CREATE TRIGGER instances_announce
    AFTER INSERT OR UPDATE OR DELETE ON instances
    FOR EACH STATEMENT EXECUTE FUNCTION leasekeeper_announce('instances');

-- Operator actions (force-release, kills, generator switches) are rare and
-- written to lease_events as 'operator' rows; the WHEN clause keeps the
-- trigger off the hot path of ordinary lease events.
CREATE TRIGGER lease_events_announce_operator
    AFTER INSERT ON lease_events
    FOR EACH ROW WHEN (NEW.kind = 'operator')
    EXECUTE FUNCTION leasekeeper_announce('leases,tasks,workers,instances,generator');

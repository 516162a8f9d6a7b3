-- Live updates: rare changes announce themselves on the channel
-- changes_channel() from triggers, in the same transaction as the change
-- (delivered only if it commits). Hot paths (claims, renewals, completions,
-- worker reports) are announced by the application after commit, batched:
-- a NOTIFY inside every write transaction would serialise their commits
-- (see core/src/live/mod.rs for the measurement).

-- The channel: '<schema>_changes' ('leasekeeper_changes' by default), one
-- per schema, so two leasekeeper schemas in one database (channels are
-- database-wide) do not wake each other's listeners. current_schema() is
-- the schema this function was created in, pinned by its search_path.
-- The application's announcer and listener ask this function too, so the
-- name is decided here alone.
CREATE FUNCTION changes_channel() RETURNS text
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT current_schema() || '_changes';
$$;

CREATE FUNCTION leasekeeper_announce() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- TG_ARGV[0]: the topic names this table's changes touch.
    PERFORM pg_notify(changes_channel(), TG_ARGV[0]);
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

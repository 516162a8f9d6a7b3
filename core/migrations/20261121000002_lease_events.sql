-- lease_events: the append-only history of every lease, written by a trigger
-- in the same transaction as the change it records, so no path (REST, the
-- in-process client, a hand-written UPDATE) can change a lease unrecorded.

CREATE TABLE lease_events (
    id              bigserial PRIMARY KEY,
    resource        text NOT NULL,
    holder          text,
    fencing_token   bigint,
    kind            text NOT NULL CHECK (kind IN (
                        'acquired', 'renewed', 'released', 'taken_over',
                        'deleted', 'stale_write_refused', 'operator')),
    previous_holder text,
    expires_at      timestamptz(3),
    detail          jsonb,
    at              timestamptz(3) NOT NULL DEFAULT now()
);

CREATE INDEX lease_events_resource_idx ON lease_events (resource, id);

CREATE FUNCTION leases_record_event() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO lease_events (resource, holder, fencing_token, kind, expires_at)
        VALUES (NEW.resource, NEW.holder, NEW.fencing_token, 'acquired', NEW.expires_at);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO lease_events (resource, holder, fencing_token, kind, expires_at)
        VALUES (OLD.resource, OLD.holder, OLD.fencing_token, 'deleted', OLD.expires_at);
    ELSIF NEW.fencing_token <> OLD.fencing_token THEN
        -- A new term. It is a takeover when the old term ended by expiry
        -- rather than by release.
        INSERT INTO lease_events (resource, holder, fencing_token, kind, previous_holder, expires_at)
        VALUES (NEW.resource, NEW.holder, NEW.fencing_token,
                CASE WHEN OLD.released_at IS NULL THEN 'taken_over' ELSE 'acquired' END,
                OLD.holder, NEW.expires_at);
    ELSIF NEW.released_at IS NOT NULL AND OLD.released_at IS NULL THEN
        INSERT INTO lease_events (resource, holder, fencing_token, kind, expires_at)
        VALUES (NEW.resource, NEW.holder, NEW.fencing_token, 'released', NEW.expires_at);
    ELSIF NEW.renew_count > OLD.renew_count THEN
        INSERT INTO lease_events (resource, holder, fencing_token, kind, expires_at)
        VALUES (NEW.resource, NEW.holder, NEW.fencing_token, 'renewed', NEW.expires_at);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER leases_record_event
    AFTER INSERT OR UPDATE OR DELETE ON leases
    FOR EACH ROW EXECUTE FUNCTION leases_record_event();

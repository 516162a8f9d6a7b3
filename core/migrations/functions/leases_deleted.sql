-- Trigger function (AFTER DELETE ON leases, per statement): a 'deleted'
-- event for every deleted lease row, except when the maintenance job
-- prunes (pruning()): pruning a million task leases would otherwise write a
-- million fresh events, which the next run would prune, and so on.
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

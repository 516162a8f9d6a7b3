-- Trigger function (AFTER INSERT ON leases, per statement): every new
-- lease row is a new term: its token passes the fencing guard
-- (leases_advance_fencing) and it gets its 'acquired' event in
-- lease_events, in the same transaction, so no path (the claim, the REST
-- API, a hand-written INSERT) acquires a lease unrecorded. An INSERT ... ON
-- CONFLICT DO UPDATE (a claim's lease upsert) fires this with only the rows
-- it inserted.
CREATE OR REPLACE FUNCTION leases_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_rows) THEN
        RETURN NULL;
    END IF;
    PERFORM leases_advance_fencing(array_agg(resource), array_agg(fencing_token))
       FROM new_rows;
    INSERT INTO lease_events (resource, holder, fencing_token, kind, expires_at)
    SELECT resource, holder, fencing_token, 'acquired', expires_at FROM new_rows ORDER BY id;
    RETURN NULL;
END;
$$;

-- Trigger function (AFTER UPDATE ON leases, per statement): a new term
-- (the token moved) passes the fencing guard like an insert, and every
-- changed row gets its event: 'taken_over' when the old term ended by
-- expiry rather than by release, 'acquired' after a release, 'released',
-- 'renewed'; nothing for other changes. One INSERT ... SELECT for the whole
-- statement, not a call per row.
CREATE OR REPLACE FUNCTION leases_updated() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    changed bigint;
    issued bigint;
BEGIN
    -- Nothing changed (the UPDATE half of a claim's upsert that only
    -- inserted fires too): nothing to do.
    SELECT count(*), count(*) FILTER (WHERE n.fencing_token <> o.fencing_token)
      INTO changed, issued
      FROM new_rows n JOIN old_rows o ON o.id = n.id;
    IF changed = 0 THEN
        RETURN NULL;
    END IF;
    -- A new term (the token moved): the same fencing guard as an insert.
    IF issued > 0 THEN
        PERFORM leases_advance_fencing(array_agg(n.resource), array_agg(n.fencing_token))
           FROM new_rows n JOIN old_rows o ON o.id = n.id
          WHERE n.fencing_token <> o.fencing_token;
    END IF;
    -- One event per changed row, as the row trigger wrote it: a new term
    -- is a takeover when the old term ended by expiry rather than by
    -- release; otherwise a release or a renewal; nothing for other
    -- changes.
    INSERT INTO lease_events (resource, holder, fencing_token, kind, previous_holder, expires_at)
    SELECT n.resource, n.holder, n.fencing_token, e.kind,
           CASE WHEN n.fencing_token <> o.fencing_token THEN o.holder END, n.expires_at
      FROM new_rows n JOIN old_rows o ON o.id = n.id
     CROSS JOIN LATERAL (SELECT CASE
             WHEN n.fencing_token <> o.fencing_token
                 THEN CASE WHEN o.released_at IS NULL THEN 'taken_over' ELSE 'acquired' END
             WHEN n.released_at IS NOT NULL AND o.released_at IS NULL THEN 'released'
             WHEN n.renew_count > o.renew_count THEN 'renewed'
         END AS kind) e
     WHERE e.kind IS NOT NULL
     ORDER BY n.id;
    RETURN NULL;
END;
$$;

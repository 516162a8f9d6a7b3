-- Set-based history, fencing and counters (issue 13, speed).
--
-- The triggers of the first migrations ran a PL/pgSQL function per row:
-- a claim of 16 tasks called the history trigger 16 times, the fencing
-- trigger 16 times and the counter trigger 16 times, each call its own
-- INSERT or UPDATE. These are the same triggers made statement-level with
-- transition tables: one call per statement, one INSERT ... SELECT over
-- every row the statement changed. What they guarantee is unchanged:
--   - no path (the claim, the REST API, a hand-written UPDATE in psql) can
--     change a lease without its lease_events row, in the same transaction;
--   - every fencing token issued is above the last one ever issued for its
--     resource, or the statement fails with serialization_failure;
--   - task_counts moves with every status change, in the same transaction.
--
-- PostgreSQL allows transition tables only on single-event triggers with
-- no column list, hence a trigger per event, and a counter trigger on
-- every UPDATE of tasks (heartbeats included): it finds no status change
-- there and writes nothing.
--
-- An INSERT ... ON CONFLICT DO UPDATE (a claim's lease upsert) fires both
-- the INSERT and the UPDATE statement triggers, each with only the rows
-- its action changed.

DROP TRIGGER leases_record_event ON leases;
DROP TRIGGER leases_advance_fencing ON leases;
DROP FUNCTION leases_record_event();
DROP FUNCTION leases_advance_fencing();

-- Race prevented (as before, per statement): two acquisitions of one
-- resource issuing the same token. An insert that computed its token from
-- a snapshot taken before a concurrent delete-and-reacquire committed
-- would go back; every token issued passes through its lease_fencing row
-- (locked by the upsert, judged on its newest version) and must be above
-- the last one. When any row of the statement fails that, the whole
-- statement fails with serialization_failure and the caller retries it
-- with a fresh snapshot. Called by the insert and update triggers below
-- with the tokens their statement issued (resource i got token i).
CREATE FUNCTION leases_advance_fencing(resources text[], tokens bigint[]) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    advanced bigint;
BEGIN
    INSERT INTO lease_fencing AS f (resource, last_token)
    SELECT r, t FROM unnest(resources, tokens) AS issued(r, t) ORDER BY r
    ON CONFLICT (resource) DO UPDATE
        SET last_token = EXCLUDED.last_token
        WHERE f.last_token < EXCLUDED.last_token;
    GET DIAGNOSTICS advanced = ROW_COUNT;
    IF advanced < cardinality(resources) THEN
        RAISE EXCEPTION '% of % fencing tokens issued are not above the last one issued',
            cardinality(resources) - advanced, cardinality(resources)
            USING ERRCODE = 'serialization_failure';
    END IF;
END;
$$;

CREATE FUNCTION leases_inserted() RETURNS trigger
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

CREATE FUNCTION leases_updated() RETURNS trigger
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

CREATE FUNCTION leases_deleted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO lease_events (resource, holder, fencing_token, kind, expires_at)
    SELECT resource, holder, fencing_token, 'deleted', expires_at FROM old_rows ORDER BY id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER leases_record_insert
    AFTER INSERT ON leases
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION leases_inserted();

CREATE TRIGGER leases_record_event
    AFTER UPDATE ON leases
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION leases_updated();

CREATE TRIGGER leases_record_delete
    AFTER DELETE ON leases
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION leases_deleted();

-- task_counts: one counter update per statement (on this backend's shard
-- row), from the status changes the statement made; none when it made
-- none (a heartbeat, a takeover: started -> started).
DROP TRIGGER task_counts_move ON tasks;
DROP FUNCTION task_counts_move();

CREATE FUNCTION task_counts_move() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE task_counts c
       SET pending   = c.pending   + d.pending,
           started   = c.started   + d.started,
           processed = c.processed + d.processed,
           failed    = c.failed    + d.failed
      FROM (SELECT count(*) AS moved,
                   sum((n.status = 'pending')::int   - (o.status = 'pending')::int)   AS pending,
                   sum((n.status = 'started')::int   - (o.status = 'started')::int)   AS started,
                   sum((n.status = 'processed')::int - (o.status = 'processed')::int) AS processed,
                   sum((n.status = 'failed')::int    - (o.status = 'failed')::int)    AS failed
              FROM new_rows n JOIN old_rows o ON o.id = n.id
             WHERE n.status IS DISTINCT FROM o.status) d
     WHERE c.shard = pg_backend_pid() % 16 AND d.moved > 0;
    RETURN NULL;
END;
$$;

CREATE TRIGGER task_counts_move
    AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION task_counts_move();

-- Race prevented: two acquisitions of one resource issuing the same token.
-- An insert that computed its token from a snapshot taken before a
-- concurrent delete-and-reacquire committed would go back; every token
-- issued passes through its lease_fencing row (locked by the upsert, judged
-- on its newest version) and must be above the last one. When any row of
-- the statement fails that, the whole statement fails with
-- serialization_failure and the caller retries it with a fresh snapshot.
-- Called by the insert and update triggers of leases (leases_inserted,
-- leases_updated) with the tokens their statement issued (resource i got
-- token i).
CREATE OR REPLACE FUNCTION leases_advance_fencing(resources text[], tokens bigint[]) RETURNS void
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

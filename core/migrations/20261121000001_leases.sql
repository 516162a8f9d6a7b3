-- Leases: "holder owns resource until expires_at", judged by the database clock.
--
-- One row per resource. A lease is live while released_at IS NULL and
-- expires_at > now(); anything else may be acquired by anyone. Every successful
-- acquisition gets a fencing token one higher than the last one ever issued
-- for that resource; lease_fencing remembers that number even when the lease
-- row is deleted, so tokens never go back.
--
-- Where: every table, function and trigger of leasekeeper lives in the
-- schema these migrations run in (db::migrate runs them with search_path
-- set to that schema alone: `leasekeeper` unless configured), so nothing
-- here names a schema, and nothing lands in public. Every function pins
-- that search_path (SET search_path FROM CURRENT): a trigger fired from a
-- session with another search_path (an operator in psql, a host's own
-- transaction) still reads and writes this schema's tables, never a
-- same-named table elsewhere.

CREATE TABLE leases (
    id            serial PRIMARY KEY,
    resource      text NOT NULL UNIQUE
                  CHECK (char_length(resource) BETWEEN 1 AND 256),
    holder        text CHECK (char_length(holder) BETWEEN 1 AND 256),
    created_at    timestamptz(3) NOT NULL DEFAULT now(),
    acquired_at   timestamptz(3) NOT NULL DEFAULT now(),
    renewed_at    timestamptz(3),
    released_at   timestamptz(3),
    expires_at    timestamptz(3) NOT NULL,
    ttl_ms        bigint NOT NULL CHECK (ttl_ms > 0),
    fencing_token bigint NOT NULL CHECK (fencing_token > 0),
    renew_count   integer NOT NULL DEFAULT 0 CHECK (renew_count >= 0)
);

CREATE INDEX leases_expires_at_idx ON leases (expires_at);

-- The highest fencing token ever issued per resource. Never deleted.
CREATE TABLE lease_fencing (
    resource   text PRIMARY KEY,
    last_token bigint NOT NULL CHECK (last_token > 0)
);

-- Race prevented: two acquisitions of one resource issuing the same token.
-- The common paths cannot do that (the unique resource row serializes them),
-- but an insert that computed its token from a snapshot taken before a
-- concurrent delete-and-reacquire committed could. Every token issued passes
-- through this row lock and must be strictly greater than the last one; if
-- not, the statement fails with serialization_failure and the caller retries
-- with a fresh snapshot.
CREATE FUNCTION leases_advance_fencing() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.fencing_token = OLD.fencing_token THEN
        RETURN NULL;
    END IF;
    INSERT INTO lease_fencing AS f (resource, last_token)
    VALUES (NEW.resource, NEW.fencing_token)
    ON CONFLICT (resource) DO UPDATE
        SET last_token = EXCLUDED.last_token
        WHERE f.last_token < EXCLUDED.last_token;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fencing token % for % is not above the last one issued',
            NEW.fencing_token, NEW.resource
            USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER leases_advance_fencing
    AFTER INSERT OR UPDATE OF fencing_token ON leases
    FOR EACH ROW EXECUTE FUNCTION leases_advance_fencing();

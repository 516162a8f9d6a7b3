-- assert_fence(resource, token): raises unless `token` is the live term of
-- `resource` (a lease row with this token, not released, not expired by the
-- database clock; for `task:<id>`, the task row: started under this token,
-- its deadline ahead), and keeps that term from ending (that row locked FOR
-- SHARE) while the caller's writes are uncommitted. Usable in a host's own statements, triggers and
-- transactions:
--
--     BEGIN;
--     SELECT leasekeeper.assert_fence('task:42', 7);
--     INSERT INTO shop.shipments ...;
--     COMMIT;
--
-- The error has SQLSTATE LK001 (class LK, leasekeeper's own; not class 40,
-- so no driver or pooler retries it as a serialization failure): the term
-- is over, retrying the same token can never succeed.
--
-- Race prevented: a holder that checked its lease and then stalled (a GC
-- pause, SIGSTOP, a slow network) past its expiry while another holder took
-- the resource over; its write would land in the new term. The check and
-- the FOR SHARE lock are one statement: a takeover, renewal, release or
-- force-release is an UPDATE of that row and waits for the caller's commit,
-- and if the takeover committed first, READ COMMITTED re-reads the newest
-- row version under the lock, where the token no longer matches, so the
-- caller raises and writes nothing. clock_timestamp(), not now(): now() is
-- the caller's transaction start. The cost: while the caller's transaction
-- is open, that lease's renewals wait for it too; keep fenced transactions
-- short.
CREATE OR REPLACE FUNCTION assert_fence(resource text, token bigint) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    current_holder text;
    current_token bigint;
BEGIN
    IF resource IS NULL OR token IS NULL THEN
        RAISE EXCEPTION 'assert_fence needs a resource and a token, got % and %',
            coalesce(resource, 'NULL'), coalesce(token::text, 'NULL')
            USING ERRCODE = 'LK001';
    END IF;
    -- A task's claim (`task:<id>`): its lease is the task row (issue 41),
    -- checked and locked FOR SHARE in one statement: started, this token,
    -- its deadline ahead. A claim taking the task over locks the row FOR
    -- UPDATE SKIP LOCKED, so while this transaction is open such a claim
    -- skips the task (a stalled host transaction never stalls the queue),
    -- and the holder's own completion or heartbeat waits for its commit.
    IF resource ~ '^task:[0-9]{1,18}$' THEN
        PERFORM 1 FROM tasks t
          WHERE t.id = substr(resource, 6)::bigint
            AND t.status = 'started'
            AND t.fencing_token = assert_fence.token
            AND t.must_heartbeat_before > clock_timestamp()
          FOR SHARE;
        IF FOUND THEN
            RETURN;
        END IF;
        SELECT t.processor, t.fencing_token INTO current_holder, current_token
          FROM tasks t
         WHERE t.id = substr(resource, 6)::bigint
           AND t.status = 'started' AND t.must_heartbeat_before > clock_timestamp();
    ELSE
        PERFORM 1 FROM leases l
          WHERE l.resource = assert_fence.resource
            AND l.fencing_token = assert_fence.token
            AND l.released_at IS NULL
            AND l.expires_at > clock_timestamp()
          FOR SHARE;
        IF FOUND THEN
            RETURN;
        END IF;
        SELECT l.holder, l.fencing_token INTO current_holder, current_token
          FROM leases l
         WHERE l.resource = assert_fence.resource
           AND l.released_at IS NULL AND l.expires_at > clock_timestamp();
    END IF;
    RAISE EXCEPTION 'stale fencing token % for %: %', token, resource,
        CASE WHEN current_token IS NULL
             THEN 'no term of it is live'
             ELSE format('the live term is token %s, held by %s', current_token, current_holder)
        END
        USING ERRCODE = 'LK001',
              HINT = 'the lease was lost (expired, taken over or released): write nothing, the current holder will';
END;
$$;

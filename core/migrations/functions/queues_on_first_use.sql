-- Trigger function (AFTER INSERT ON tasks, per statement): a queues row for
-- each queue name not seen before, from the transition table, within the
-- cap on queues: the transaction-local setting leasekeeper.max_queues
-- (set_config(..., true), or a role's or database's default); no cap when
-- unset (a library's host names its own queues; the REST server always sets
-- it, from its max_queues setting). An enqueue naming new queues past the cap is refused with
-- SQLSTATE LK002 and the whole statement (and its transaction) rolls back:
-- nothing is inserted. The common case (every queue known) reads the
-- primary key once per distinct name, takes one shared advisory lock (in
-- memory, no row written) and writes nothing.
--
-- Races prevented:
-- - two enqueues of new names at once, each seeing the cap minus one: only
--   an enqueue that must create a name takes the advisory lock "queue
--   names" (transaction-scoped, so held until its commit), then counts the
--   queues and looks for its new names again, each in a statement of its
--   own (a fresh snapshot under READ COMMITTED): the second waits for the
--   first to commit and then counts the first's names too. Existing names
--   never take it. (In a host's REPEATABLE READ transaction the count is
--   of the transaction's snapshot, so concurrent transactions can pass the
--   cap by their new names; bounded by their number.)
-- - an enqueue of a known name racing the retention's prune of that queue
--   (maintenance's prune_queues): every enqueue holds the advisory lock
--   "queues in use" in shared mode from here to its commit, the prune
--   takes it exclusively before it deletes; so the prune either waits for
--   the enqueue's commit and then sees its task, or deletes first, and
--   this function, which takes the lock before it looks, finds the name
--   gone and creates it again.
-- - two enqueues of the same new queue at once: ON CONFLICT DO NOTHING; the
--   second waits for the first's row, then skips it (no unique violation).
-- - a deadlock of two enqueues each naming two new queues (a, b) and (b, a):
--   both insert the names in sorted order, so the one that waits always
--   waits for a name the other took first, never the reverse.
-- - an enqueue racing a pause of its (new) queue: the pause's upsert and
--   this insert meet on the same key; whichever commits second finds the
--   first's row (a pause sets the flag on it either way). A pause of a new
--   name is an operator's and is not counted against the cap.
CREATE OR REPLACE FUNCTION queues_on_first_use() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    fresh text[];
    cap bigint;
    known bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('leasekeeper queues in use'),
                                         hashtext(current_schema()));
    SELECT array_agg(d.queue ORDER BY d.queue) INTO fresh
      FROM (SELECT DISTINCT n.queue FROM new_rows n) d
     WHERE NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = d.queue);
    IF fresh IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('leasekeeper queue names'),
                                  hashtext(current_schema()));
    SELECT array_agg(f ORDER BY f) INTO fresh
      FROM unnest(fresh) f
     WHERE NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = f);
    IF fresh IS NULL THEN
        RETURN NULL;
    END IF;
    cap := nullif(current_setting('leasekeeper.max_queues', true), '')::bigint;
    IF cap IS NOT NULL THEN
        SELECT count(*) INTO known FROM queues;
    END IF;
    IF cap IS NOT NULL AND known + cardinality(fresh) > cap THEN
        RAISE EXCEPTION 'too many queues: % exist, the most allowed is %, and this enqueue names % new (%)',
                known, cap, cardinality(fresh),
                array_to_string(fresh[1:3], ', ') || CASE WHEN cardinality(fresh) > 3 THEN ', …' ELSE '' END
            USING ERRCODE = 'LK002';
    END IF;
    INSERT INTO queues (name)
    SELECT f FROM unnest(fresh) f
     ORDER BY f
    ON CONFLICT (name) DO NOTHING;
    RETURN NULL;
END;
$$;

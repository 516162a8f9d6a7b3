-- Trigger function (AFTER INSERT ON tasks, per statement): a queues row for
-- each queue name not seen before, from the transition table: the common
-- case (every queue known) is a read of the primary key per distinct name
-- and writes nothing.
--
-- Races prevented:
-- - two enqueues of the same new queue at once: ON CONFLICT DO NOTHING; the
--   second waits for the first's row, then skips it (no unique violation).
-- - a deadlock of two enqueues each naming two new queues (a, b) and (b, a):
--   both insert the names in sorted order, so the one that waits always
--   waits for a name the other took first, never the reverse.
-- - an enqueue racing a pause of its (new) queue: the pause's upsert and
--   this insert meet on the same key; whichever commits second finds the
--   first's row (a pause sets the flag on it either way).
CREATE OR REPLACE FUNCTION queues_on_first_use() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO queues (name)
    SELECT d.queue FROM (SELECT DISTINCT n.queue FROM new_rows n) d
     WHERE NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = d.queue)
     ORDER BY d.queue
    ON CONFLICT (name) DO NOTHING;
    RETURN NULL;
END;
$$;

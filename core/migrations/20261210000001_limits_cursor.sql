-- Fairness between keys of equal turn by a cursor in the queue's row, in
-- place of a row per key (issue 39).
--
-- queues.served_key  the key of the last task a limited claim of the
--        queue took fresh (keyless tasks under ''): of candidates of equal
--        turn, those whose key comes after it go first, then the others
--        from the first key on, so keys that free slots in turn are served
--        round-robin and two busy keys cannot take every free slot from a
--        third. NULL: none served yet.
--
-- queue_keys held a `served_at` per key, written by every limited claim
-- for every key it served (a hundred rows a claim with a hundred keys, none
-- of them HOT: `served_at` was indexed) and never pruned, so it grew with
-- every key a queue ever saw. One column of a row the claim already
-- locks replaces it.

ALTER TABLE queues ADD COLUMN served_key text;

DROP TABLE queue_keys;

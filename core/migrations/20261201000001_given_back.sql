-- Prefetch (issue 27): a runtime claims ahead of its free workers into a
-- local queue, and gives back the claims it did not start on (on a
-- graceful stop, or when one waited longer than its bound).
--
-- given_back  A claim given back unstarted (queue::store::give_back_each):
--             the task is pending again at its old place in the queue, its
--             attempt not counted (the attempt's outcome is 'given_back'),
--             its claim's lease released; the history of `task:<id>` says
--             so with a row of this kind (detail: `{"reason": …}`) right
--             after the `released` one.

ALTER TABLE lease_events DROP CONSTRAINT lease_events_kind_check;
ALTER TABLE lease_events ADD CONSTRAINT lease_events_kind_check CHECK (kind IN (
    'acquired', 'renewed', 'released', 'taken_over',
    'deleted', 'stale_write_refused', 'operator', 'snoozed', 'given_back'));

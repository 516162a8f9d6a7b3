-- Handlers that snooze and time out (issue 25).
--
-- snoozed   A handler answered `Done::snooze(d)`: the task is pending
--           again, due in `d`, its attempt not counted, its claim's lease
--           released; the history of `task:<id>` says so with a row of this
--           kind (detail: `{"for_ms": …}`) right after the `released` one.
-- timeout_ms  A task's own time limit per attempt (null: the runtime's
--           per-kind default, or none). At the limit the worker cancels the
--           handler's context and fails the attempt ("timed out after …").

ALTER TABLE lease_events DROP CONSTRAINT lease_events_kind_check;
ALTER TABLE lease_events ADD CONSTRAINT lease_events_kind_check CHECK (kind IN (
    'acquired', 'renewed', 'released', 'taken_over',
    'deleted', 'stale_write_refused', 'operator', 'snoozed'));

ALTER TABLE tasks
    ADD COLUMN timeout_ms integer CHECK (timeout_ms BETWEEN 1 AND 86400000);

-- The task row is its claim's lease (issue 41). A claim already wrote the
-- holder, fencing token and deadline into the task row; it also wrote a
-- `leases` row `task:<id>` with the same facts and a `lease_fencing` row
-- with the same token, three rows a claim that said one thing. From this
-- migration on:
--
-- * a claim's token is the task's own last token + 1 (`tasks.fencing_token`,
--   moved under the task row's lock by the claim), its deadline is
--   `tasks.must_heartbeat_before`, its holder `tasks.processor`;
-- * no `leases` or `lease_fencing` row is written for a task; a `task:`
--   row in `leases` guards nothing (the REST lease API already refuses the
--   prefix; the migration deletes the ones there are);
-- * the term's history stays in `lease_events` under `task:<id>`, written
--   by the tasks trigger `tasks_record_attempts` (its new body is in
--   migrations/functions/tasks_record_attempts.sql, which also keeps the
--   attempts), so every reader of the history reads what it read.
--
-- Upgrading: stop every runtime, worker and instance of an older version
-- before this migration runs (they would still write task leases and take
-- tokens from `lease_fencing`).

-- A task's token never goes back: take the higher of the two.
UPDATE tasks t SET fencing_token = f.last_token
  FROM lease_fencing f
 WHERE f.resource = 'task:' || t.id AND f.last_token > COALESCE(t.fencing_token, 0);

-- Not history: no 'deleted' events for rows that only repeated the tasks.
SET LOCAL leasekeeper.pruning = 'on';
DELETE FROM leases WHERE resource LIKE 'task:%';
DELETE FROM lease_fencing WHERE resource LIKE 'task:%';
RESET leasekeeper.pruning;

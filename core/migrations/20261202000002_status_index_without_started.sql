-- tasks_status_id_idx (status, id) no longer holds the started tasks; they
-- are found by tasks_started_idx (must_heartbeat_before, id), which holds
-- them alone, or by primary key.
--
-- Found by issue 27's long benchmark runs: the claim's look-up of late
-- claims (status = 'started' AND must_heartbeat_before <= now()) has two
-- indexes to choose from, and a generic plan made on statistics that saw few
-- started tasks chose this one: it read every `started` entry, dead ones
-- included (each task claimed and finished since the last vacuum leaves
-- one), on every claim, so a runtime slowed as it worked (14,000 tasks/s in
-- one run, 3,600 in the next with the same settings). A statement cannot
-- steer that choice: tasks_started_idx needs the very test `status =
-- 'started'` that makes this index usable too. Without the started tasks in
-- it, the only index that holds them is the one that reads late claims by
-- deadline.
--
-- What reads this index is unchanged: a list or bulk action of one status
-- (the status is a literal, so the planner proves it is not 'started'), and
-- the queues' figures, whose started tasks come from tasks_started_idx
-- (queue::queues). Lists of started tasks read tasks_started_idx: there are
-- as many as claims in flight.
--
-- Cost of the migration: the index is built again, in the migration's
-- transaction, with writes to tasks blocked while it builds (seconds for a
-- million tasks; tasks are pruned by retention, so the table stays that
-- order of size).

DROP INDEX tasks_status_id_idx;
CREATE INDEX tasks_status_id_idx ON tasks (status, id) WHERE status <> 'started';

-- Workflows and durable waits (issue 40).
--
-- A workflow is tasks enqueued together, some waiting for others: a task
-- with parents is not claimable until every parent ended. One new status
-- says why a task is not claimable while not finished either:
--
--   waiting   for its parents (parents_left > 0), or for a signal its
--             handler asked to wait for (wait_signal). The claim rule takes
--             pending tasks only, so a waiting task is never claimed; the
--             statement that ends its last parent, or that signals it, makes
--             it pending in the same transaction (tasks_parents_ended,
--             queue::store::signal), and a signal's timeout by the rescuer's
--             pass (queue::rescuer).
--
-- workflows          one row per workflow: its name and when it was made.
--                    Its status is derived from its tasks.
-- tasks.workflow_id  the workflow a task belongs to, and its ref in it.
-- task_parents       one row per edge: the child, its parent, the parent's
--                    ref, and how and when the parent's end closed it (NULL
--                    until it does). The edge's outcome is written once,
--                    under the child row's lock, so a parent ending twice
--                    (failed, retried, processed) is counted once; a retry
--                    that brings the child back opens it again.
-- tasks.parents_left the edges not ended yet; the child becomes pending
--                    when it reaches 0 (or cancelled, see below).
-- tasks.on_parent_failure  'cancel' (a parent failed or cancelled cancels
--                    the child, and so on down) or 'run' (the child runs
--                    anyway once every parent ended: cleanup).
-- tasks.parent_outputs  the outputs of its processed parents, by ref,
--                    written by each parent's completion: a child's claim
--                    carries them whatever retention did to the parents.
-- tasks.cascaded_from  the parent whose failure or cancel cancelled this
--                    task through the workflow (the cascade), NULL for any
--                    other status or cancel: a retry of that parent brings
--                    such tasks back to waiting (tasks_parents_ended).
-- tasks.wait_signal, wait_until, signals  a durable wait: the signal the
--                    task waits for and until when; the signals it got.

CREATE TABLE workflows (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 128),
    created_at timestamptz(3) NOT NULL DEFAULT now()
);
CREATE INDEX workflows_created_idx ON workflows (created_at, id);

ALTER TABLE tasks DROP CONSTRAINT tasks_status_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_status_check
    CHECK (status IN ('pending', 'started', 'processed', 'failed', 'cancelled', 'waiting'));

ALTER TABLE tasks
    ADD COLUMN workflow_id bigint REFERENCES workflows (id),
    ADD COLUMN workflow_ref text CHECK (char_length(workflow_ref) BETWEEN 1 AND 128),
    ADD COLUMN parents_left integer NOT NULL DEFAULT 0 CHECK (parents_left >= 0),
    ADD COLUMN on_parent_failure text CHECK (on_parent_failure IN ('cancel', 'run')),
    ADD COLUMN parent_outputs jsonb,
    ADD COLUMN cascaded_from bigint,
    ADD COLUMN wait_signal text CHECK (char_length(wait_signal) BETWEEN 1 AND 128),
    ADD COLUMN wait_until timestamptz(3),
    ADD COLUMN signals jsonb,
    ADD CONSTRAINT tasks_workflow_whole CHECK ((workflow_id IS NULL) = (workflow_ref IS NULL)),
    ADD CONSTRAINT tasks_waiting_why CHECK (
        status <> 'waiting' OR parents_left > 0 OR wait_signal IS NOT NULL);

-- A workflow's tasks, for its page, its cancel and retention's test that
-- it is finished; also the foreign key's check when a workflow is deleted.
CREATE INDEX tasks_workflow_idx ON tasks (workflow_id, id) WHERE workflow_id IS NOT NULL;
-- The signal waits whose time is up, for the rescuer's pass.
CREATE INDEX tasks_wait_until_idx ON tasks (wait_until, id)
    WHERE status = 'waiting' AND wait_until IS NOT NULL;

-- No foreign keys to tasks: TRUNCATE tasks stays possible, and retention
-- deletes a workflow's edges with its tasks.
CREATE TABLE task_parents (
    task_id    bigint NOT NULL,
    parent_id  bigint NOT NULL,
    parent_ref text NOT NULL CHECK (char_length(parent_ref) BETWEEN 1 AND 128),
    outcome    text CHECK (outcome IN ('processed', 'failed', 'cancelled')),
    ended_at   timestamptz(3),
    CONSTRAINT task_parents_ended_whole CHECK ((outcome IS NULL) = (ended_at IS NULL)),
    PRIMARY KEY (task_id, parent_id)
);
CREATE INDEX task_parents_parent_idx ON task_parents (parent_id, task_id);

-- A task waiting for a signal is still active for its unique key.
DROP INDEX tasks_unique_idx;
CREATE UNIQUE INDEX tasks_unique_idx ON tasks (kind, unique_slot)
    WHERE unique_slot IS NOT NULL
      AND (unique_scope <> 'active' OR status IN ('pending', 'started', 'waiting'));

-- A wait ends its attempt: 'waited' (not counted, like a snooze).
ALTER TABLE attempts DROP CONSTRAINT attempts_outcome_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_outcome_check CHECK (outcome IN (
    'running', 'completed', 'failed', 'taken_over',
    'cancelled', 'timed_out', 'snoozed', 'given_back', 'interrupted', 'waited'));

-- The counters learn the new status (the files task_counts_* count it).
ALTER TABLE task_counts ADD COLUMN waiting bigint NOT NULL DEFAULT 0;
DROP FUNCTION task_counts_add(int, bigint, bigint, bigint, bigint, bigint);

-- The parents' ends reach their children (the file
-- tasks_parents_ended.sql holds the body).
CREATE FUNCTION tasks_parents_ended() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER tasks_parents_ended AFTER UPDATE ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION tasks_parents_ended();

-- A durable wait and its signal in a task's history: 'waiting' (its
-- handler ended the attempt waiting for a signal, the claim released) and
-- 'signalled' (a producer's signal made it pending again).
ALTER TABLE lease_events DROP CONSTRAINT lease_events_kind_check;
ALTER TABLE lease_events ADD CONSTRAINT lease_events_kind_check CHECK (kind IN (
    'acquired', 'renewed', 'released', 'taken_over',
    'deleted', 'stale_write_refused', 'operator', 'snoozed', 'given_back',
    'session_ended', 'waiting', 'signalled'));

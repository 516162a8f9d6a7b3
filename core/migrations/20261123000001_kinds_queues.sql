-- Task kinds, queues and priorities (the library's handler API).
--
-- kind      which handler runs the task (`email`, `sleep`, ...); a runtime
--           claims only the kinds it has handlers for, so a service never
--           takes work it cannot do (and burns its attempts).
-- queue     a runtime serves a set of queues, each with its own
--           concurrency (`default` unless the enqueue says otherwise).
-- priority  lower runs first (0 by default, -32768 to 32767); claims honour
--           priority, then scheduled_at, then id.
--
-- Tasks that existed before kinds were the dashboard's simulated work,
-- kind `sleep`; the column keeps no default (every enqueue names its kind).

ALTER TABLE tasks
    ADD COLUMN kind text NOT NULL DEFAULT 'sleep'
        CHECK (char_length(kind) BETWEEN 1 AND 128),
    ADD COLUMN queue text NOT NULL DEFAULT 'default'
        CHECK (char_length(queue) BETWEEN 1 AND 128),
    ADD COLUMN priority smallint NOT NULL DEFAULT 0;
ALTER TABLE tasks ALTER COLUMN kind DROP DEFAULT;

-- Claim order for fresh work within one queue: priority, then due time.
DROP INDEX tasks_pending_idx;
CREATE INDEX tasks_pending_idx ON tasks (queue, priority, scheduled_at, id) WHERE status = 'pending';

-- Workers of a service's own runtime (the library embedded in another
-- program): in-process like the simulated ones, but doing real work, and
-- not controllable from the dashboard.
ALTER TABLE workers DROP CONSTRAINT workers_kind_check;
ALTER TABLE workers ADD CONSTRAINT workers_kind_check
    CHECK (kind IN ('simulated', 'http', 'embedded'));

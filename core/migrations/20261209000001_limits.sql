-- Limits and fairness (issue 39): a task may carry a concurrency key; a
-- queue may cap its started tasks (in all, and per key) and its claims per
-- second. The claim enforces them (core/src/queue/store/sql.rs, `claim`
-- and `LIMITED_CLAIM`): every claim of a limited queue first locks the
-- queue's row, so those claims take turns, and each counts the started
-- tasks in a snapshot taken after its turn began.
--
-- tasks.concurrency_key  the task's key (a tenant, an account, an API):
--        `max_started_per_key` counts the started tasks of each key; tasks
--        of a limited queue are served fairly between keys. NULL: no key
--        (the task counts toward `max_started` only).
--
-- queues.max_started          at most this many tasks of the queue started
--        at once (claimed and running, or waiting in a runtime's local
--        queue); NULL: no cap.
-- queues.max_started_per_key  at most this many per concurrency key.
-- queues.rate_per_second, rate_burst  a token bucket shared by the fleet:
--        in any window of t seconds, at most burst + rate x t claims of the
--        queue (a takeover of a late task is a claim). Burst NULL: one
--        second's worth, at least 1.
-- queues.rate_tokens, rate_at  the bucket: tokens left at rate_at (the
--        claim statement's time of the claim that last took some, or the
--        time the rate was set, when the bucket starts full).
-- queues.limited  any limit set: claims of the queue take the limited way.
-- queues.limits_updated_at  the last change of the limits.

ALTER TABLE tasks
    ADD COLUMN concurrency_key text
        CONSTRAINT tasks_concurrency_key_length CHECK (char_length(concurrency_key) BETWEEN 1 AND 256);

ALTER TABLE queues
    ADD COLUMN max_started integer CHECK (max_started BETWEEN 1 AND 100000),
    ADD COLUMN max_started_per_key integer CHECK (max_started_per_key BETWEEN 1 AND 100000),
    ADD COLUMN rate_per_second float8 CHECK (rate_per_second > 0 AND rate_per_second <= 1000000),
    ADD COLUMN rate_burst integer CHECK (rate_burst BETWEEN 1 AND 1000000),
    ADD COLUMN rate_tokens float8,
    ADD COLUMN rate_at timestamptz,
    ADD COLUMN limits_updated_at timestamptz(3),
    ADD COLUMN limited boolean NOT NULL GENERATED ALWAYS AS
        (max_started IS NOT NULL OR max_started_per_key IS NOT NULL OR rate_per_second IS NOT NULL) STORED,
    ADD CONSTRAINT queues_burst_needs_rate CHECK (rate_burst IS NULL OR rate_per_second IS NOT NULL),
    ADD CONSTRAINT queues_bucket_with_rate
        CHECK ((rate_per_second IS NULL) = (rate_tokens IS NULL AND rate_at IS NULL));

-- The keys with pending tasks of a queue, one index probe each (the
-- limited claim walks them in order, skipping from one key to the next),
-- and each key's pending tasks in claim order; the keyless ones under
-- NULL, so that a keyed queue's claim finds in one probe that it has none
-- (without them, it read every pending task of the queue to find none:
-- 5 ms of a 25 ms claim at 60,000 tasks). One more index entry per task
-- enqueued, keyed or not.
CREATE INDEX tasks_pending_key_idx ON tasks (queue, concurrency_key, priority, scheduled_at, id)
    WHERE status = 'pending';

-- The started tasks of a queue and of each key (keyless ones under NULL),
-- counted by the limited claim and by the Queues page's busiest keys.
CREATE INDEX tasks_started_key_idx ON tasks (queue, concurrency_key) WHERE status = 'started';

-- When a limited claim last took a task of each key of a queue (keyless
-- tasks under ''): of two keys with as many tasks started, the one served
-- longer ago goes first, so two busy keys that free slots in turn do not
-- take them all from a third. Written only by the limited claim (the
-- queue's claims take turns, so one writer per queue at a time); rows not
-- served for an hour are pruned by the maintenance job (a key forgotten
-- counts as served long ago, which it was).
CREATE TABLE queue_keys (
    queue     text NOT NULL,
    key       text NOT NULL,
    served_at timestamptz NOT NULL,
    PRIMARY KEY (queue, key)
);
CREATE INDEX queue_keys_served_idx ON queue_keys (served_at);

-- tasks: the queue. Every claim is a lease on resource 'task:<id>' taken in
-- the same transaction; the claim's fencing token is copied here, and every
-- heartbeat, completion and failure must carry it.
--
-- Lifecycle (status):
--   pending   waiting to be claimed, not before scheduled_at (retry backoff
--             moves scheduled_at into the future)
--   started   claimed; the processor holds the lease until
--             must_heartbeat_before. Past that moment it is "late": any
--             worker may take it over (with a new token), and the old
--             processor's writes are refused.
--   processed completed exactly once, by the holder of the current token
--   failed    gave up after max_attempts; kept with last_error, never lost

CREATE TABLE tasks (
    id                    serial PRIMARY KEY,
    task_data             jsonb NOT NULL,
    scheduled_at          timestamptz(3) NOT NULL DEFAULT now(),
    processor             text CHECK (char_length(processor) BETWEEN 1 AND 256),
    last_heartbeat_at     timestamptz(3),
    must_heartbeat_before timestamptz(3),
    started_at            timestamptz(3),
    processed_at          timestamptz(3),
    task_output           jsonb,
    status                text NOT NULL DEFAULT 'pending'
                          CHECK (status IN ('pending', 'started', 'processed', 'failed')),
    attempts              integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts          integer NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 1000),
    fencing_token         bigint,
    last_error            text,
    failed_at             timestamptz(3),
    created_at            timestamptz(3) NOT NULL DEFAULT now(),
    CHECK (status <> 'started'
           OR (processor IS NOT NULL AND must_heartbeat_before IS NOT NULL AND fencing_token IS NOT NULL)),
    CHECK (status <> 'processed' OR processed_at IS NOT NULL),
    CHECK (status <> 'failed' OR failed_at IS NOT NULL)
);

-- Claim order for fresh work, and the quick look for late (expired) claims.
CREATE INDEX tasks_pending_idx ON tasks (scheduled_at, id) WHERE status = 'pending';
CREATE INDEX tasks_started_idx ON tasks (must_heartbeat_before, id) WHERE status = 'started';
CREATE INDEX tasks_status_id_idx ON tasks (status, id);

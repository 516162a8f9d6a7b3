-- instances: every running leasekeeper process (replica) registers here and
-- heartbeats last_seen_at; an instance not seen for a while is dead.
CREATE TABLE instances (
    id           text PRIMARY KEY CHECK (char_length(id) BETWEEN 1 AND 256),
    address      text NOT NULL,
    started_at   timestamptz(3) NOT NULL DEFAULT now(),
    last_seen_at timestamptz(3) NOT NULL DEFAULT now(),
    stopped_at   timestamptz(3)
);

-- workers: task workers, simulated inside an instance or separate `worker`
-- processes talking HTTP. What each is doing, for the dashboard.
CREATE TABLE workers (
    id                text PRIMARY KEY CHECK (char_length(id) BETWEEN 1 AND 256),
    instance_id       text,
    kind              text NOT NULL CHECK (kind IN ('simulated', 'http')),
    state             text NOT NULL CHECK (state IN ('idle', 'working', 'paused', 'crashed', 'stopped')),
    task_id           integer,
    fencing_token     bigint,
    last_heartbeat_at timestamptz(3),
    last_seen_at      timestamptz(3) NOT NULL DEFAULT now(),
    started_at        timestamptz(3) NOT NULL DEFAULT now(),
    tasks_done        integer NOT NULL DEFAULT 0,
    tasks_abandoned   integer NOT NULL DEFAULT 0
);
CREATE INDEX workers_instance_idx ON workers (instance_id);

-- generator_state: the one row holding whether the task generator should
-- run. Every instance reads it, so any instance can start or stop it and all
-- report the same; who actually runs it is the 'singleton:generator' lease.
CREATE TABLE generator_state (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    desired    text NOT NULL DEFAULT 'stopped' CHECK (desired IN ('running', 'stopped')),
    updated_at timestamptz(3) NOT NULL DEFAULT now(),
    updated_by text
);
INSERT INTO generator_state (id, desired) VALUES (true, 'stopped');

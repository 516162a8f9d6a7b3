-- Schedules and unique tasks (issue 25).
--
-- 1. Unique tasks. A task may carry a key (`unique_key`, the caller's) and a
--    scope (`unique_scope`):
--      active  unique among the pending and started tasks of its kind (the
--              default: once processed, failed or cancelled the key is free);
--      always  unique among every task of its kind still in the table;
--    and, either way, a period: then unique only among the tasks enqueued
--    in the same period (fixed buckets: `unique_slot` is the key with the
--    bucket's start; without a period it is the key).
--    The database enforces it, one partial unique index on (kind,
--    unique_slot): enqueue inserts with ON CONFLICT DO NOTHING, so 64
--    enqueues of one key at once make one task (the others wait for the
--    first insert's transaction, then find its row). An active-scoped task
--    leaves the index when it finishes, so its key is free again; a retry
--    that would bring a second holder of a key back is refused.
--
-- 2. Schedules: cron-declared periodic tasks. The holder of the lease
--    `singleton:scheduler` fires each schedule's ticks: for every tick, in
--    ONE transaction, under the fenced check (the lease row, still naming
--    this holder with this token and unexpired, locked FOR SHARE), it
--    inserts the task (with `schedule` and `tick_at`), a row of
--    schedule_ticks (unique per schedule and tick time) and moves
--    `last_tick_at` on. So a tick fires at most once, a stale leader
--    inserts nothing, and a new leader starts after the newest tick that
--    committed.
--
--    Ticks at or before `fire_after` never fire: it is set when the
--    schedule is created, when it is resumed (paused time is not caught
--    up) and when its cron or time zone changes (the old expression's ticks
--    are not the new one's missed ticks).

ALTER TABLE tasks
    ADD COLUMN unique_key text CHECK (char_length(unique_key) BETWEEN 1 AND 256),
    ADD COLUMN unique_scope text CHECK (unique_scope IN ('active', 'always')),
    ADD COLUMN unique_slot text CHECK (char_length(unique_slot) BETWEEN 1 AND 300),
    ADD COLUMN schedule text CHECK (char_length(schedule) BETWEEN 1 AND 128),
    ADD COLUMN tick_at timestamptz,
    ADD CONSTRAINT tasks_unique_whole CHECK (
        (unique_key IS NULL) = (unique_scope IS NULL) AND (unique_key IS NULL) = (unique_slot IS NULL));

CREATE UNIQUE INDEX tasks_unique_idx ON tasks (kind, unique_slot)
    WHERE unique_slot IS NOT NULL AND (unique_scope <> 'active' OR status IN ('pending', 'started'));

CREATE TABLE schedules (
    name         text PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 128),
    cron         text NOT NULL CHECK (char_length(cron) BETWEEN 1 AND 256),
    time_zone    text NOT NULL DEFAULT 'UTC' CHECK (char_length(time_zone) BETWEEN 1 AND 64),
    kind         text NOT NULL CHECK (char_length(kind) BETWEEN 1 AND 128),
    queue        text NOT NULL DEFAULT 'default' CHECK (char_length(queue) BETWEEN 1 AND 128),
    task_data    jsonb NOT NULL DEFAULT '{}',
    priority     smallint NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 1000),
    catch_up     text NOT NULL DEFAULT 'latest' CHECK (catch_up IN ('all', 'latest', 'none')),
    paused       boolean NOT NULL DEFAULT false,
    fire_after   timestamptz NOT NULL DEFAULT now(),
    last_tick_at timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    updated_by   text CHECK (char_length(updated_by) BETWEEN 1 AND 256)
);

CREATE TABLE schedule_ticks (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    schedule      text NOT NULL REFERENCES schedules (name) ON DELETE CASCADE,
    tick_at       timestamptz NOT NULL,
    -- No foreign key: retention deletes old tasks, and the tick stays on
    -- record until it is as old.
    task_id       bigint NOT NULL,
    holder        text NOT NULL,
    fencing_token bigint NOT NULL,
    fired_at      timestamptz NOT NULL,
    -- Fired late, after a gap nobody led through (or the cap cut it).
    caught_up     boolean NOT NULL,
    UNIQUE (schedule, tick_at)
);
CREATE INDEX schedule_ticks_page_idx ON schedule_ticks (schedule, id);
CREATE INDEX schedule_ticks_fired_idx ON schedule_ticks (fired_at);

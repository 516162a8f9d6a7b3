-- failover_kills: what a dashboard kill left behind. One row per lease the
-- killed worker or instance held at the moment of the kill (by the database
-- clock); the stopwatch then looks up, in lease_events, the first term of
-- that resource with a higher fencing token: the takeover.
CREATE TABLE failover_kills (
    id            bigserial PRIMARY KEY,
    subject_kind  text NOT NULL CHECK (subject_kind IN ('worker', 'instance')),
    subject       text NOT NULL CHECK (char_length(subject) BETWEEN 1 AND 256),
    resource      text NOT NULL CHECK (char_length(resource) BETWEEN 1 AND 256),
    holder        text NOT NULL CHECK (char_length(holder) BETWEEN 1 AND 256),
    fencing_token bigint NOT NULL,
    killed_at     timestamptz(3) NOT NULL DEFAULT now()
);
CREATE INDEX failover_kills_recent_idx ON failover_kills (id DESC);
CREATE INDEX lease_events_takeovers_idx ON lease_events (at) WHERE kind = 'taken_over';

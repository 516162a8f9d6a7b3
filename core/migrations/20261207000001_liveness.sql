-- Liveness sessions (issue 38): a process that crashes is rescued by its
-- closed database session, not by waiting out its leases.
--
-- Each process (a runtime, a dashboard instance) keeps one dedicated,
-- direct connection open, its application_name `leasekeeper liveness
-- <instance id>`, and registers that session here: its backend's pid and
-- start time, the start time of the server (postmaster) that hosts it,
-- and the lease holders it vouches for (its workers and the instance
-- itself, which holds its singleton leases). While the session is open,
-- nothing here changes how a lease ends: the TTL rules. Once PostgreSQL
-- itself no longer lists the session (pg_stat_activity), every live claim
-- and lease of those holders is ended at once (core/src/liveness/store.rs),
-- and the claim rule takes them over as it would expired ones.
--
-- server_started_at is the incarnation test: after a restart or a
-- failover every session is gone at once, and nobody is dead; a row is
-- judged only by the server that hosted its session (the same postmaster
-- start time), and otherwise left to the TTL.
CREATE TABLE liveness (
    instance_id       text PRIMARY KEY CHECK (char_length(instance_id) BETWEEN 1 AND 256),
    holders           text[] NOT NULL DEFAULT '{}',
    pid               integer NOT NULL,
    backend_start     timestamptz NOT NULL,
    server_started_at timestamptz NOT NULL,
    registered_at     timestamptz NOT NULL DEFAULT now()
);

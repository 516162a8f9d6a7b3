-- Liveness (issue 38): a term ended early because its holder's liveness
-- session is gone (core/src/liveness/store.rs) is recorded in the history
-- like a release, by the statement that ends it:
--
-- session_ended  The holder's process's session is no longer listed by
--                PostgreSQL: the term ended at `expires_at` (now), before
--                its TTL; detail: `{"instance": <the session's instance id>}`.
--                The next grant is a takeover, with the next token.
ALTER TABLE lease_events DROP CONSTRAINT lease_events_kind_check;
ALTER TABLE lease_events ADD CONSTRAINT lease_events_kind_check CHECK (kind IN (
    'acquired', 'renewed', 'released', 'taken_over',
    'deleted', 'stale_write_refused', 'operator', 'snoozed', 'given_back',
    'session_ended'));

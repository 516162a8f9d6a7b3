-- The audit log (GET /api/audit, the dashboard's audit page) is every
-- operator row of lease_events, newest first, a page at a time. This
-- partial index holds only those rows, so paging the log never scans the
-- millions of lease events around them.
CREATE INDEX lease_events_operator_idx ON lease_events (id) WHERE kind = 'operator';

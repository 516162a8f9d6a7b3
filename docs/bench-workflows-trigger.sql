BEGIN;
EXPLAIN (ANALYZE, SUMMARY ON) WITH c AS (SELECT id FROM leasekeeper.tasks WHERE status = 'pending' AND queue = 'default' ORDER BY priority, scheduled_at, id LIMIT 200 FOR UPDATE SKIP LOCKED)
UPDATE leasekeeper.tasks t SET status = 'started', processor = 'x', fencing_token = coalesce(t.fencing_token, 0) + 1, started_at = now(), last_heartbeat_at = now(), must_heartbeat_before = now() + interval '30 s', attempts = t.attempts + 1 FROM c WHERE t.id = c.id;
EXPLAIN (ANALYZE, SUMMARY ON) UPDATE leasekeeper.tasks t SET status = 'processed', processed_at = now(), task_output = '{"ok": true}', must_heartbeat_before = NULL WHERE t.status = 'started' AND t.processor = 'x';
ROLLBACK;

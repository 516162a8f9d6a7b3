-- Trigger function (AFTER UPDATE ON tasks, per statement): a workflow
-- task's end reaches its children (issue 40). For every task the statement
-- ended (processed, failed or cancelled) whose edges to its children are
-- open (task_parents.outcome NULL), in the statement that ended it, so no
-- path (a completion batch, a failure, the rescuer, an operator's cancel,
-- a fenced transaction, psql) ends a parent and leaves its children
-- waiting:
--
-- * each open edge records how its parent ended (once: an edge closed is
--   never counted again, so a parent failed, retried and then processed
--   does not count twice);
-- * each child counts it off parents_left, and a processed parent's output
--   is added to its parent_outputs under the parent's ref;
-- * a waiting child whose parent failed or was cancelled is cancelled, its
--   last_error naming the parent, unless it runs on parent failure ('run');
--   so are its waiting descendants that cancel on a parent's failure, in
--   the same update (however deep the workflow);
-- * a waiting child with no parent left and no signal to wait for becomes
--   pending: claimable by the next claim (the claim rule takes pending
--   tasks only, so it never takes a child before this).
--
-- Races prevented:
-- * Two parents of one child ending at once, on two instances: each
--   statement locks the child row before it reads or closes the child's
--   edges, so the second waits for the first to commit and then (a new
--   snapshot per statement here, READ COMMITTED) sees its edge closed and
--   parents_left counted down: the child becomes pending exactly once,
--   after its last parent, never while one is unfinished.
-- * Two statements ending parents of the same children in different
--   orders (two completion batches): the children are locked in id order
--   first, so the two cannot each hold a child the other waits for.
--
-- Most statements end no workflow task (a claim, a heartbeat, a batch of
-- plain completions): the first test answers them from the transition
-- table alone.
CREATE OR REPLACE FUNCTION tasks_parents_ended() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    woken bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_rows n
                    WHERE n.workflow_id IS NOT NULL
                      AND n.status IN ('processed', 'failed', 'cancelled')) THEN
        RETURN NULL;
    END IF;

    -- The rows this may change, locked in id order: the children of the
    -- parents that ended, and, below a parent that failed or was
    -- cancelled, every waiting descendant that cancels on a parent's
    -- failure.
    PERFORM 1 FROM tasks c
     WHERE c.id IN (
           WITH RECURSIVE hit(id, bad) AS (
               SELECT p.task_id, n.status <> 'processed'
                 FROM new_rows n JOIN task_parents p ON p.parent_id = n.id
                WHERE n.workflow_id IS NOT NULL
                  AND n.status IN ('processed', 'failed', 'cancelled')
                  AND p.outcome IS NULL
               UNION
               SELECT p.task_id, true
                 FROM hit h JOIN tasks t ON t.id = h.id
                 JOIN task_parents p ON p.parent_id = h.id
                WHERE h.bad AND t.status = 'waiting' AND t.on_parent_failure = 'cancel'
           )
           SELECT id FROM hit)
     ORDER BY c.id
       FOR UPDATE;

    -- The cascade is written here, whole, not left to this trigger firing
    -- again level by level: a chain of a thousand nested triggers passes
    -- PostgreSQL's stack depth limit (measured: a chain of 1,000 failed
    -- with "stack depth limit exceeded"). The descendants' own edges are
    -- closed when this update fires the trigger once more (one level).
    WITH RECURSIVE closed AS (
        UPDATE task_parents p
           SET outcome = n.status
          FROM new_rows n
         WHERE p.parent_id = n.id
           AND n.workflow_id IS NOT NULL
           AND n.status IN ('processed', 'failed', 'cancelled')
           AND p.outcome IS NULL
        RETURNING p.task_id, p.parent_id, p.parent_ref, n.status, n.task_output
    ), per_child AS (
        SELECT task_id, count(*)::int AS n,
               jsonb_object_agg(parent_ref, coalesce(task_output, 'null'::jsonb))
                   FILTER (WHERE status = 'processed') AS outputs,
               min(format('parent %s (task %s) %s', parent_ref, parent_id,
                          CASE WHEN status = 'failed' THEN 'failed' ELSE 'was cancelled' END))
                   FILTER (WHERE status <> 'processed') AS why
          FROM closed
         GROUP BY task_id
    ), next AS (
        SELECT c.id, d.n, d.outputs, d.why,
               CASE WHEN c.status <> 'waiting' THEN c.status
                    WHEN d.why IS NOT NULL AND c.on_parent_failure = 'cancel' THEN 'cancelled'
                    WHEN c.parents_left = d.n AND c.wait_signal IS NULL THEN 'pending'
                    ELSE c.status END AS status,
               c.status AS was
          FROM per_child d JOIN tasks c ON c.id = d.task_id
    ), doomed(id, why) AS (
        SELECT x.id, x.why FROM next x WHERE x.status = 'cancelled' AND x.was = 'waiting'
        UNION
        SELECT p.task_id, format('parent %s (task %s) was cancelled', p.parent_ref, p.parent_id)
          FROM doomed d JOIN task_parents p ON p.parent_id = d.id
          JOIN tasks c ON c.id = p.task_id
         WHERE c.status = 'waiting' AND c.on_parent_failure = 'cancel'
    ), target AS (
        SELECT x.id, x.n, x.outputs, x.why, x.status FROM next x
        UNION ALL
        SELECT d.id, 0, NULL, d.why, 'cancelled'
          FROM (SELECT DISTINCT ON (id) id, why FROM doomed ORDER BY id, why) d
         WHERE d.id NOT IN (SELECT id FROM next)
    ), changed AS (
        UPDATE tasks c
           SET parents_left = c.parents_left - x.n,
               parent_outputs = CASE WHEN x.outputs IS NULL THEN c.parent_outputs
                                     ELSE coalesce(c.parent_outputs, '{}'::jsonb) || x.outputs END,
               status = x.status,
               cancelled_at = CASE WHEN x.status = 'cancelled' AND c.status <> 'cancelled'
                                   THEN now() ELSE c.cancelled_at END,
               last_error = CASE WHEN x.status = 'cancelled' AND c.status <> 'cancelled'
                                 THEN 'cancelled: ' || x.why ELSE c.last_error END
          FROM target x
         WHERE c.id = x.id
        RETURNING c.status
    )
    SELECT count(*) FILTER (WHERE status = 'pending') INTO woken FROM changed;
    -- Children made claimable wake idle workers as an enqueue does, from
    -- here, so that every path that ends a parent wakes them, delivered
    -- only if the change commits. A NOTIFY serialises the commits of the
    -- transactions that send one: only these do, not every completion.
    IF woken > 0 THEN
        PERFORM pg_notify(changes_channel(), 'tasks,work');
    END IF;
    RETURN NULL;
END;
$$;

-- Trigger function (AFTER UPDATE ON tasks, per statement): a workflow
-- task's end reaches its children (issue 40). For every task the statement
-- ended (processed, failed or cancelled) whose edges to its children are
-- open (task_parents.outcome NULL), in the statement that ended it, so no
-- path (a completion batch, a failure, the rescuer, an operator's cancel,
-- a fenced transaction, psql) ends a parent and leaves its children
-- waiting:
--
-- * each open edge records how and when its parent ended (once: an edge closed is
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
-- And, in the statement that retries a workflow task (failed or cancelled
-- back to pending or waiting: an operator's retry, one or in bulk, or
-- psql), the tasks its end cancelled come back: each descendant the
-- cascade cancelled (cascaded_from set) below it returns to waiting, its
-- edges from the retried task and from the other tasks coming back
-- reopened, unless another of its parents stays failed or cancelled (that
-- parent's retry brings it back later). An edge from a parent processed
-- since is closed as processed, its output handed on.
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
-- * Two retries at once of two failed parents of one cancelled child: each
--   locks the child before it reads whether the child's other parents stay
--   failed, so the second reads the first's retry committed and brings the
--   child back; neither leaves it cancelled with both parents running
--   again. A parent ending while its child comes back locks the child too:
--   the child's open edges are counted after it.
--
-- Most statements end no workflow task (a claim, a heartbeat, a batch of
-- plain completions): the first test answers them from the transition
-- table alone.
CREATE OR REPLACE FUNCTION tasks_parents_ended() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    woken bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.workflow_id IS NOT NULL) THEN
        RETURN NULL;
    END IF;

    -- Retried: a workflow task pending or waiting again whose edge to a
    -- child is closed as failed or cancelled.
    IF EXISTS (SELECT 1 FROM new_rows n JOIN task_parents p ON p.parent_id = n.id
                WHERE n.workflow_id IS NOT NULL AND n.status IN ('pending', 'waiting')
                  AND p.outcome IN ('failed', 'cancelled')) THEN
        -- The descendants its end cancelled, locked in id order (the order
        -- of every other statement here) before anything about them is read.
        PERFORM 1 FROM tasks c
         WHERE c.id IN (
               WITH RECURSIVE back(id) AS (
                   SELECT p.task_id
                     FROM new_rows n JOIN task_parents p ON p.parent_id = n.id
                    WHERE n.workflow_id IS NOT NULL AND n.status IN ('pending', 'waiting')
                      AND p.outcome IN ('failed', 'cancelled')
                   UNION
                   SELECT p.task_id FROM back b JOIN task_parents p ON p.parent_id = b.id
                    WHERE p.outcome IN ('failed', 'cancelled')
               )
               SELECT id FROM back)
           AND c.status = 'cancelled' AND c.cascaded_from IS NOT NULL
         ORDER BY c.id
           FOR UPDATE;

        WITH RECURSIVE back(id) AS (
            -- Cancelled by the cascade, below a retried task, through
            -- edges closed as failed or cancelled.
            SELECT p.task_id
              FROM new_rows n JOIN task_parents p ON p.parent_id = n.id
              JOIN tasks c ON c.id = p.task_id
             WHERE n.workflow_id IS NOT NULL AND n.status IN ('pending', 'waiting')
               AND p.outcome IN ('failed', 'cancelled')
               AND c.status = 'cancelled' AND c.cascaded_from IS NOT NULL
            UNION
            SELECT p.task_id FROM back b JOIN task_parents p ON p.parent_id = b.id
              JOIN tasks c ON c.id = p.task_id
             WHERE p.outcome IN ('failed', 'cancelled')
               AND c.status = 'cancelled' AND c.cascaded_from IS NOT NULL
        ), held(id) AS (
            -- Those with another parent that stays failed or cancelled,
            -- and everything below them: they stay cancelled.
            SELECT b.id FROM back b JOIN task_parents p ON p.task_id = b.id
              JOIN tasks t ON t.id = p.parent_id
             WHERE p.outcome IN ('failed', 'cancelled')
               AND t.status IN ('failed', 'cancelled')
               AND t.id NOT IN (SELECT id FROM back)
            UNION
            SELECT p.task_id FROM held h JOIN task_parents p ON p.parent_id = h.id
             WHERE p.task_id IN (SELECT id FROM back)
        ), reopened AS (
            -- Their failed and cancelled edges: open again (the parent runs
            -- or comes back), or processed (it was retried and processed
            -- since, while the child was held).
            UPDATE task_parents p
               SET outcome = CASE WHEN t.status = 'processed' THEN 'processed' END,
                   ended_at = CASE WHEN t.status = 'processed' THEN now() END
              FROM tasks t
             WHERE t.id = p.parent_id
               AND p.task_id IN (SELECT id FROM back EXCEPT SELECT id FROM held)
               AND p.outcome IN ('failed', 'cancelled')
            RETURNING p.task_id, p.parent_ref, p.outcome, t.task_output
        ), per_child AS (
            SELECT task_id, count(*) FILTER (WHERE outcome IS NULL)::int AS n,
                   jsonb_object_agg(parent_ref, coalesce(task_output, 'null'::jsonb))
                       FILTER (WHERE outcome = 'processed') AS outputs
              FROM reopened
             GROUP BY task_id
        ), changed AS (
            UPDATE tasks c
               SET parents_left = c.parents_left + d.n,
                   parent_outputs = CASE WHEN d.outputs IS NULL THEN c.parent_outputs
                                         ELSE coalesce(c.parent_outputs, '{}'::jsonb) || d.outputs END,
                   status = CASE WHEN c.parents_left + d.n > 0 OR c.wait_signal IS NOT NULL
                                 THEN 'waiting' ELSE 'pending' END,
                   cancelled_at = NULL,
                   cascaded_from = NULL,
                   last_error = NULL
              FROM per_child d
             WHERE c.id = d.task_id
            RETURNING c.status
        )
        SELECT count(*) FILTER (WHERE status = 'pending') INTO woken FROM changed;
        IF woken > 0 THEN
            PERFORM pg_notify(changes_channel(), 'tasks,work');
        END IF;
    END IF;

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
           SET outcome = n.status, ended_at = now()
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
               (array_agg(format('parent %s (task %s) %s', parent_ref, parent_id,
                                 CASE WHEN status = 'failed' THEN 'failed' ELSE 'was cancelled' END)
                          ORDER BY parent_id)
                   FILTER (WHERE status <> 'processed'))[1] AS why,
               min(parent_id) FILTER (WHERE status <> 'processed') AS cause
          FROM closed
         GROUP BY task_id
    ), next AS (
        SELECT c.id, d.n, d.outputs, d.why, d.cause,
               CASE WHEN c.status <> 'waiting' THEN c.status
                    WHEN d.why IS NOT NULL AND c.on_parent_failure = 'cancel' THEN 'cancelled'
                    WHEN c.parents_left = d.n AND c.wait_signal IS NULL THEN 'pending'
                    ELSE c.status END AS status,
               c.status AS was
          FROM per_child d JOIN tasks c ON c.id = d.task_id
    ), doomed(id, why, cause) AS (
        SELECT x.id, x.why, x.cause FROM next x WHERE x.status = 'cancelled' AND x.was = 'waiting'
        UNION
        SELECT p.task_id, format('parent %s (task %s) was cancelled', p.parent_ref, p.parent_id),
               p.parent_id
          FROM doomed d JOIN task_parents p ON p.parent_id = d.id
          JOIN tasks c ON c.id = p.task_id
         WHERE c.status = 'waiting' AND c.on_parent_failure = 'cancel'
    ), target AS (
        SELECT x.id, x.n, x.outputs, x.why, x.cause, x.status FROM next x
        UNION ALL
        SELECT d.id, 0, NULL, d.why, d.cause, 'cancelled'
          FROM (SELECT DISTINCT ON (id) id, why, cause FROM doomed ORDER BY id, cause) d
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
                                 THEN 'cancelled: ' || x.why ELSE c.last_error END,
               cascaded_from = CASE WHEN x.status = 'cancelled' AND c.status <> 'cancelled'
                                    THEN x.cause ELSE c.cascaded_from END
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

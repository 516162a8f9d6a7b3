-- Trigger function (AFTER DELETE ON tasks, per statement): a task's
-- attempts are pruned with it, one DELETE per statement (a foreign key
-- would add a per-row check to every claim's attempt INSERT, and a per-row
-- cascade to every pruning batch).
CREATE OR REPLACE FUNCTION tasks_delete_attempts() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- By the primary key's index, one probe per deleted task, whatever the
    -- planner guesses of the transition table (it has no statistics; a
    -- join was planned as a merge over the whole index).
    DELETE FROM attempts a WHERE a.task_id = ANY (ARRAY(SELECT o.id FROM old_rows o));
    RETURN NULL;
END;
$$;

-- Trigger function (AFTER TRUNCATE ON tasks): no tasks, no counts. A new
-- status is a column here.
CREATE OR REPLACE FUNCTION task_counts_truncate() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE task_counts SET pending = 0, started = 0, processed = 0, failed = 0, cancelled = 0,
                           waiting = 0;
    RETURN NULL;
END;
$$;

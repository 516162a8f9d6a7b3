-- Trigger function (AFTER TRUNCATE ON tasks): no tasks, no attempts.
CREATE OR REPLACE FUNCTION tasks_truncate_attempts() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    TRUNCATE attempts;
    RETURN NULL;
END;
$$;

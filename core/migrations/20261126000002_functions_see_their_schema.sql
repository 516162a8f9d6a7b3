-- Every function and trigger function of leasekeeper resolves its table
-- names in leasekeeper's schema, whatever the calling session's
-- search_path: a host may enqueue on its own connection (search_path
-- `public`, where it may have tables called `tasks` or `task_counts` of its
-- own), and a connection through a pooler that drops startup parameters has
-- the server's default search_path. Without this, the triggers fired by such
-- an insert would fail on, or write into, the host's tables.
--
-- `SET search_path FROM CURRENT` pins each function to the search_path the
-- migration runs with: exactly this schema (leasekeeper's migrator sets it
-- for the migration's transaction). A later migration that creates or
-- replaces a function must pin it the same way; a test checks that every
-- function in the schema is pinned.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure
               FROM pg_proc p
              WHERE p.pronamespace = (SELECT oid FROM pg_namespace
                                        WHERE nspname = current_schema()) LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path FROM CURRENT', f);
    END LOOP;
END
$$;

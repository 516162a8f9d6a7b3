-- The channel of this schema's change announcements: '<schema>_changes'
-- ('leasekeeper_changes' by default), one per schema, so two leasekeeper
-- schemas in one database (channels are database-wide) do not wake each
-- other's listeners. current_schema() is the schema this function was
-- created in, pinned by its search_path. The application's announcer and
-- listener ask this function too, so the name is decided here alone.
CREATE OR REPLACE FUNCTION changes_channel() RETURNS text
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT current_schema() || '_changes';
$$;

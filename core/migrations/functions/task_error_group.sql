-- Function: a failed task's last_error as the group the dead letters'
-- summary counts it in (queue::failed): the same error about another id,
-- amount or moment reads the same. Numbers become <n>, UUIDs <uuid>,
-- hexadecimal literals <hex>; the first 200 characters. Immutable, so a
-- group can be matched again (the retry of a group) by the same words.
CREATE OR REPLACE FUNCTION task_error_group(error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT AS $$
    SELECT left(
        regexp_replace(
            regexp_replace(
                regexp_replace(coalesce(error, ''),
                    '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<uuid>', 'gi'),
                '0x[0-9a-f]+', '<hex>', 'gi'),
            '[0-9]+', '<n>', 'g'),
        200);
$$;

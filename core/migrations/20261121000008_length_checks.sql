-- Length limits on the text and jsonb columns that had none, each as loose
-- as what the application accepts and no looser, so a path that skips the
-- application's checks (a future route, a hand-written statement) still
-- cannot store a runaway value.
--
-- tasks is on the claim path (every claim, heartbeat and completion
-- updates its row, and PostgreSQL evaluates every CHECK on every update),
-- so its checks are the cheap kind: pg_column_size reads a varlena header
-- and never detoasts, and char_length reads last_error only where there is
-- one (NULL for every task that has not failed).
--
-- tasks.task_data, tasks.task_output: they come in request bodies of at
-- most 64 KiB (MAX_BODY_BYTES), or from the generator and the simulated
-- workers, which write small objects. The binary jsonb form is larger than
-- the JSON text: up to 6 times for an array of zeros (12 bytes an element
-- against "0,"), measured; 512 KiB is above 6 x 64 KiB. The text form
-- (col::text) is no measure: a 6-byte 1e300 prints as 301 digits.
--
-- tasks.last_error: the REST route refuses more than 4096 characters and
-- the task store cuts longer messages (a simulated worker's message quotes
-- the bad task_data value it got) to 4096.
--
-- workers.instance_id, instances.address, generator_state.updated_by: an
-- instance id (1 to 256 characters, like instances.id) and the instance's
-- host:port.
--
-- Left without a new check:
--   leases.resource and holder, tasks.processor, workers.id, instances.id
--   and failover_kills' names are checked already (1 to 256 characters);
--   lease_fencing.resource is copied from leases.resource by a trigger;
--   lease_events.resource, holder, previous_holder are copied from leases
--   by a trigger or written by the application from checked names
--   ('task:<id>', 'singleton:generator', 'worker:' or 'instance:' and a
--   checked id, a Holder), and lease_events.detail only ever holds small
--   objects the application builds; no request writes them directly, and
--   lease_events takes a row per acquire, renew and release (the claim
--   path), so they carry no check of their own.

ALTER TABLE tasks
    ADD CONSTRAINT tasks_task_data_size CHECK (pg_column_size(task_data) <= 524288),
    ADD CONSTRAINT tasks_task_output_size CHECK (pg_column_size(task_output) <= 524288),
    ADD CONSTRAINT tasks_last_error_length CHECK (char_length(last_error) <= 4096);

ALTER TABLE workers
    ADD CONSTRAINT workers_instance_id_length CHECK (char_length(instance_id) BETWEEN 1 AND 256);

ALTER TABLE instances
    ADD CONSTRAINT instances_address_length CHECK (char_length(address) BETWEEN 1 AND 256);

ALTER TABLE generator_state
    ADD CONSTRAINT generator_state_updated_by_length CHECK (char_length(updated_by) BETWEEN 1 AND 256);

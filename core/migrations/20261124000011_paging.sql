-- Paging everywhere (issue 14 item 5): every list is read newest first,
-- a page at a time, below a cursor. Tasks, leases and lease events page
-- by their serial ids; workers and instances have text ids, so they get a
-- sequence number in the order they were first recorded (existing rows
-- are numbered as PostgreSQL finds them), and an index to page by it.

ALTER TABLE workers ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY;
CREATE UNIQUE INDEX workers_seq_idx ON workers (seq);

ALTER TABLE instances ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY;
CREATE UNIQUE INDEX instances_seq_idx ON instances (seq);

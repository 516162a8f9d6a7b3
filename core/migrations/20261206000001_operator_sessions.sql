-- Operator sessions (issue 37): the dashboard's sign-in no longer keeps the
-- admin token in the browser's cookie. Signing in makes a row here; the
-- cookie holds only a random 32-byte session id, and this table only its
-- SHA-256, so a copy of the table opens nothing. `token_fingerprint` is the
-- SHA-256 of the session id followed by the admin token the session was
-- made with: a lookup sends the fingerprint of the token configured now,
-- so rotating the admin token ends every session made with the old one,
-- and (salted by the id, which is not stored) the column says nothing
-- about the token itself. Signing out deletes the row, on every instance
-- at once; expired rows are deleted by the next sign-in.
CREATE TABLE operator_sessions (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id_hash           bytea NOT NULL UNIQUE CHECK (octet_length(id_hash) = 32),
    token_fingerprint bytea NOT NULL CHECK (octet_length(token_fingerprint) = 32),
    created_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL
);
CREATE INDEX operator_sessions_expires_idx ON operator_sessions (expires_at);

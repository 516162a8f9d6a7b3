//! Operator sessions: what a dashboard's sign-in leaves behind instead of
//! the admin token itself.
//!
//! A host hashes the random id it puts in the browser's cookie and the
//! fingerprint of the admin token the session was made with; this module
//! only stores and matches those digests (the table `operator_sessions`).
//! A session is valid while its row exists, has not expired by the
//! database clock, and its fingerprint matches the one of the token
//! configured now.

use crate::db::Schema;
use sqlx::PgConnection;
use std::time::Duration;

/// A SHA-256 digest, as the host computed it.
pub type Digest = [u8; 32];

/// Records a session whose id hashes to `id_hash`, made with the token of
/// `token_fingerprint`, valid for `ttl` by the database clock. Expired
/// sessions are deleted in the same statement, so the table holds only
/// the live ones plus those expired since the last sign-in.
pub async fn create(
    conn: &mut PgConnection,
    schema: &Schema,
    id_hash: &Digest,
    token_fingerprint: &Digest,
    ttl: Duration,
) -> sqlx::Result<()> {
    schema
        .query(
            "WITH pruned AS (DELETE FROM $schema.operator_sessions WHERE expires_at <= now())
             INSERT INTO $schema.operator_sessions (id_hash, token_fingerprint, expires_at)
             VALUES ($1, $2, now() + make_interval(secs => $3::float8))",
        )
        .bind(id_hash.as_slice())
        .bind(token_fingerprint.as_slice())
        .bind(ttl.as_secs_f64())
        .execute(conn)
        .await?;
    Ok(())
}

/// Whether the session of `id_hash` exists, has not expired, and was made
/// with the token of `token_fingerprint`. One statement, judged by the
/// database clock: a sign-out committed on another instance is seen by the
/// next request here.
pub async fn is_valid(
    conn: &mut PgConnection,
    schema: &Schema,
    id_hash: &Digest,
    token_fingerprint: &Digest,
) -> sqlx::Result<bool> {
    schema
        .query_scalar(
            "SELECT EXISTS (SELECT 1 FROM $schema.operator_sessions
                             WHERE id_hash = $1 AND token_fingerprint = $2 AND expires_at > now())",
        )
        .bind(id_hash.as_slice())
        .bind(token_fingerprint.as_slice())
        .fetch_one(conn)
        .await
}

/// Ends the session of `id_hash` for every instance at once. `false` when
/// there was none.
pub async fn delete(
    conn: &mut PgConnection,
    schema: &Schema,
    id_hash: &Digest,
) -> sqlx::Result<bool> {
    let done = schema
        .query("DELETE FROM $schema.operator_sessions WHERE id_hash = $1")
        .bind(id_hash.as_slice())
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

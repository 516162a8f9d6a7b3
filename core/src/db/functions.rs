//! The SQL functions' current bodies: one file each in
//! `migrations/functions/`, applied after the versioned migrations, in the
//! migrating transaction (Flyway's repeatable migrations are the model).
//!
//! A versioned migration is applied once and never changes (sqlx records
//! its checksum and refuses an edited one), so a function replaced by a
//! later migration used to leave its earlier bodies behind in older files.
//! Now a function's text lives in its file alone; changing the function
//! means editing that file. The tables, columns, constraints and triggers
//! stay in versioned migrations (a trigger names its function, which must
//! exist when the migration creating the trigger runs: see the folder's
//! README for a new one).
//!
//! A file is applied when its text differs from the one last applied in
//! this schema (by checksum, kept in `<schema>._function_files`), or when
//! its function is missing; otherwise not at all. Not on every start:
//! `CREATE OR REPLACE FUNCTION` of an unchanged body would still write the
//! catalog and make every session that runs the function plan it again,
//! on every replica's start, and would need the starting role to own every
//! function even when nothing changed.

use super::Schema;
use anyhow::Context;
use futures::future::BoxFuture;
use sqlx::{Executor, PgConnection};

/// One function's file: the function's name (the file is
/// `migrations/functions/<name>.sql`) and its text, embedded at compile
/// time.
#[derive(Clone, Copy, Debug)]
pub struct FunctionFile {
    /// The function's name, without schema or arguments.
    pub name: &'static str,
    /// The file: comments and one `CREATE OR REPLACE FUNCTION` naming no
    /// schema, run with the schema alone on the search_path (and pinned
    /// to it by `SET search_path FROM CURRENT`).
    pub sql: &'static str,
}

/// `FunctionFile`s by name, each file embedded with `include_str!`, so a
/// binary that embeds the library carries them and a missing file fails
/// the build.
macro_rules! function_files {
    ($($name:literal),* $(,)?) => {
        &[$(FunctionFile {
            name: $name,
            sql: include_str!(concat!("../../migrations/functions/", $name, ".sql")),
        }),*]
    };
}

/// Every function file, in the order they are applied: a function after
/// those its definition needs when it is created (a `LANGUAGE sql`
/// function's body is checked against the catalog then, so one calling
/// another comes after it; PL/pgSQL bodies are resolved when they run).
/// A test checks that this list and the folder hold the same names.
pub static FUNCTIONS: &[FunctionFile] = function_files![
    // Called by the SQL-language functions below, or by many.
    "changes_channel",
    "pruning",
    "task_counts_shard",
    "task_counts_add",
    "leases_advance_fencing",
    // The rest, by name.
    "assert_fence",
    "leasekeeper_announce",
    "leases_deleted",
    "leases_inserted",
    "leases_updated",
    "queues_on_first_use",
    "task_counts_move",
    "task_counts_rows",
    "task_counts_truncate",
    "task_error_group",
    "tasks_delete_attempts",
    "tasks_parents_ended",
    "tasks_record_attempts",
    "tasks_truncate_attempts",
];

/// Applies the function files that changed since they were last applied in
/// `schema` (or whose function is missing), in [`FUNCTIONS`]' order, and
/// records their checksums. Runs inside the migrating transaction, after
/// the versioned migrations, with the schema alone on the transaction's
/// `search_path` and the migration lock held: replicas starting at once
/// apply each change once (the others wait for the lock, then find the
/// checksums recorded), and a failure rolls the whole migration back.
/// Unnamed statements only, and no session state, for a pooler in
/// transaction mode.
///
/// Boxed as `Send` here, where the connection's lifetime is one: as a
/// plain `async fn`, sqlx's executor bounds left the migration's future
/// not `Send` ("`Executor` is not general enough"), and a service
/// migrates from a spawned task.
pub(super) fn apply<'c>(
    conn: &'c mut PgConnection,
    schema: &'c Schema,
) -> BoxFuture<'c, anyhow::Result<()>> {
    Box::pin(apply_files(conn, schema))
}

async fn apply_files(conn: &mut PgConnection, schema: &Schema) -> anyhow::Result<()> {
    // Beside sqlx's `_sqlx_migrations`, and made the way sqlx makes that
    // one (which already asks for the CREATE privilege on the schema at
    // every start).
    sqlx::query(schema.sql(
        "CREATE TABLE IF NOT EXISTS $schema._function_files (
             name       text PRIMARY KEY,
             checksum   bytea NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    ))
    .persistent(false)
    .execute(&mut *conn)
    .await
    .context("creating the record of applied function files")?;

    let names: Vec<&str> = FUNCTIONS.iter().map(|f| f.name).collect();
    let texts: Vec<&str> = FUNCTIONS.iter().map(|f| f.sql).collect();
    // The checksum is the server's (sha256 of the file's UTF-8 text), so
    // the record reads the same whichever build wrote it.
    let stale: Vec<String> = sqlx::query_scalar(schema.sql(
        "SELECT f.name
           FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS f(name, sql, n)
           LEFT JOIN $schema._function_files a ON a.name = f.name
          WHERE a.checksum IS DISTINCT FROM sha256(convert_to(f.sql, 'UTF8'))
             OR NOT EXISTS (SELECT 1 FROM pg_proc p
                             WHERE p.pronamespace = $3::text::regnamespace AND p.proname = f.name)
          ORDER BY f.n",
    ))
    .persistent(false)
    .bind(&names)
    .bind(&texts)
    .bind(schema.as_str())
    .fetch_all(&mut *conn)
    .await
    .context("reading which function files changed")?;

    let to_apply: Vec<FunctionFile> = FUNCTIONS
        .iter()
        .filter(|f| stale.iter().any(|s| s == f.name))
        .copied()
        .collect();
    for file in to_apply {
        // A text without arguments goes by the simple query protocol:
        // nothing prepared by name, for a pooler in transaction mode.
        (&mut *conn)
            .execute(file.sql)
            .await
            .with_context(|| format!("applying migrations/functions/{}.sql", file.name))?;
        sqlx::query(schema.sql(
            "INSERT INTO $schema._function_files (name, checksum)
             VALUES ($1, sha256(convert_to($2, 'UTF8')))
             ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()",
        ))
        .persistent(false)
        .bind(file.name)
        .bind(file.sql)
        .execute(&mut *conn)
        .await
        .with_context(|| format!("recording migrations/functions/{}.sql", file.name))?;
        tracing::info!(function = file.name, %schema, "SQL function applied");
    }
    Ok(())
}

//! Database access: the schema, the pool, migrations, and the embedded local
//! PostgreSQL.
//!
//! Everything leasekeeper creates lives in one PostgreSQL [`Schema`]
//! (`leasekeeper` unless configured), never in `public`, so it can share a
//! database with a host service's own tables and its own `_sqlx_migrations`.
//! Every connection leasekeeper opens sees that schema only: build pools with
//! [`connect`] or [`connect_options`], and create or update the tables with
//! [`migrate`].

pub mod embedded;
mod schema;
#[doc(hidden)]
pub mod testing;

pub use schema::{DEFAULT_SCHEMA, MAX_SCHEMA_CHARS, Schema, SchemaError};

use anyhow::Context;
use embedded::EmbeddedPostgres;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use std::path::Path;
use std::time::Duration;

/// The schema migrations in `migrations/`, embedded in the binary. Run them
/// with [`migrate`], which puts them (and sqlx's record of them) in the
/// schema, never with `MIGRATOR.run` directly.
pub static MIGRATOR: Migrator = sqlx::migrate!();

/// The database name used inside the embedded cluster.
pub const EMBEDDED_DATABASE: &str = "leasekeeper";

/// A migrated pool, and the embedded cluster behind it when there is one.
pub struct Database {
    /// The connection pool; its connections see `schema` only.
    pub pool: PgPool,
    /// The embedded cluster, when no `DATABASE_URL` was given.
    pub embedded: Option<EmbeddedPostgres>,
}

impl Database {
    /// Connects to `database_url`, or starts (or reuses) the embedded cluster
    /// in `data_dir` when there is none; then migrates `schema`.
    pub async fn open(
        database_url: Option<&str>,
        data_dir: &Path,
        schema: &Schema,
    ) -> anyhow::Result<Self> {
        let (options, embedded) = match database_url {
            Some(url) => {
                let options: PgConnectOptions = url
                    .parse()
                    .context("DATABASE_URL is not a valid PostgreSQL URL")?;
                (options, None)
            }
            None => {
                let cluster = EmbeddedPostgres::start(data_dir).await?;
                cluster.ensure_database(EMBEDDED_DATABASE).await?;
                tracing::info!(url = %cluster.url(EMBEDDED_DATABASE), "using the embedded PostgreSQL cluster");
                (cluster.connect_options(EMBEDDED_DATABASE), Some(cluster))
            }
        };
        let pool = pool_options()
            .connect_with(connect_options(options, schema))
            .await
            .context("cannot connect to PostgreSQL")?;
        migrate(&pool, schema).await?;
        tracing::info!(%schema, "database migrated");
        Ok(Database { pool, embedded })
    }

    /// Closes the pool and stops the embedded cluster if this process started it.
    pub async fn close(self) -> anyhow::Result<()> {
        self.pool.close().await;
        if let Some(cluster) = self.embedded {
            cluster.stop_if_started_here().await?;
        }
        Ok(())
    }
}

/// Pool settings shared by the server and the tests.
pub fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(32)
        .acquire_timeout(Duration::from_secs(10))
}

/// `options` with every session's `search_path` set to `schema` alone, so
/// leasekeeper's unqualified table names mean its own tables and nothing it
/// creates lands in `public`. Every pool leasekeeper uses is built on it.
///
/// A host's own tables are then not visible by their bare names on these
/// connections, except in a handler's fenced transaction
/// ([`crate::queue::store::FencedTransaction`]), which switches to the
/// host's `search_path` for the handler's statements.
pub fn connect_options(options: PgConnectOptions, schema: &Schema) -> PgConnectOptions {
    // `-c search_path="name"` in the startup packet: applied before the
    // first statement, and again on every new connection of a pool.
    options.options([("search_path", schema.quoted())])
}

/// A pool on the database at `url` (a PostgreSQL URL) whose connections see
/// `schema` only ([`connect_options`], [`pool_options`]). It does not
/// migrate: call [`migrate`] once at start-up.
pub async fn connect(url: &str, schema: &Schema) -> anyhow::Result<PgPool> {
    let options: PgConnectOptions = url.parse().context("not a valid PostgreSQL URL")?;
    pool_options()
        .connect_with(connect_options(options, schema))
        .await
        .context("cannot connect to PostgreSQL")
}

/// Creates `schema` if it does not exist and applies the pending
/// [`MIGRATOR`] migrations inside it, on a connection of its own to `pool`'s
/// database. sqlx records them in `<schema>._sqlx_migrations`, apart from a
/// host's `public._sqlx_migrations`. Safe to call from every replica at
/// once: one migrates, the others wait and then find nothing to do.
pub async fn migrate(pool: &PgPool, schema: &Schema) -> anyhow::Result<()> {
    let options = connect_options((*pool.connect_options()).clone(), schema);
    let mut conn = PgConnection::connect_with(&options)
        .await
        .context("connecting to migrate")?;
    let migrated = migrate_on(&mut conn, schema).await;
    // Ending the session releases its advisory locks, ours and sqlx's,
    // whatever happened (sqlx leaves its own held when a migration fails).
    let closed = conn.close().await;
    migrated?;
    closed.context("closing the migration connection")
}

async fn migrate_on(conn: &mut PgConnection, schema: &Schema) -> anyhow::Result<()> {
    // Race prevented: replicas starting together on a fresh database. Two
    // `CREATE SCHEMA IF NOT EXISTS` at the same moment can both find no
    // schema and one fails on the catalog's unique index; sqlx's own
    // migration lock does not cover that step (it is taken inside
    // `Migrator::run`, once the schema must already exist for its
    // `_sqlx_migrations` table). So every migrator of this schema first
    // waits for this session lock (a two-key advisory lock, a key space
    // apart from sqlx's one-key lock on the database), and only the first
    // creates the schema and applies migrations; the rest find them applied.
    sqlx::query("SELECT pg_advisory_lock(hashtext('leasekeeper migrate'), hashtext($1))")
        .bind(schema.as_str())
        .execute(&mut *conn)
        .await
        .context("waiting for the migration lock")?;
    // Asked first, not `CREATE SCHEMA IF NOT EXISTS`: that needs the CREATE
    // privilege on the database even when the schema exists, and a host may
    // have made the schema for a role that has no such privilege.
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .bind(schema.as_str())
            .fetch_one(&mut *conn)
            .await
            .context("looking for the schema")?;
    if !exists {
        sqlx::query(&format!("CREATE SCHEMA {}", schema.quoted()))
            .execute(&mut *conn)
            .await
            .with_context(|| format!("creating schema {schema}"))?;
    }
    // `run_direct`, not `run`: `run(&mut PgConnection)` makes this future
    // not `Send` (sqlx's "`Acquire` is not general enough"), and a service
    // must be able to migrate from a spawned task; sqlx keeps `run_direct`
    // public for exactly that.
    MIGRATOR
        .run_direct(&mut *conn)
        .await
        .with_context(|| format!("running database migrations in schema {schema}"))?;
    sqlx::query("SELECT pg_advisory_unlock(hashtext('leasekeeper migrate'), hashtext($1))")
        .bind(schema.as_str())
        .execute(&mut *conn)
        .await
        .context("releasing the migration lock")?;
    Ok(())
}

/// Whether the database's migrations (in the connection's schema, on its
/// `search_path`) are those this build carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigrationState {
    /// Every migration of this build is applied, and nothing else.
    Current {
        /// How many migrations are applied.
        applied: usize,
    },
    /// Not ready, and why: a migration missing or failed, or one applied
    /// that this build does not know (a newer build migrated the database).
    Behind(String),
}

/// Compares the schema's `_sqlx_migrations` with [`MIGRATOR`]'s list, by
/// version, success and checksum: what a readiness check asks.
pub async fn migration_state(conn: &mut PgConnection) -> sqlx::Result<MigrationState> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(MigrationState::Behind(
            "no migrations applied in this schema".into(),
        ));
    }
    let applied: Vec<(i64, bool, Vec<u8>)> =
        sqlx::query_as("SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&mut *conn)
            .await?;
    for (version, success, _) in &applied {
        if !success {
            return Ok(MigrationState::Behind(format!(
                "migration {version} failed"
            )));
        }
        if !MIGRATOR.iter().any(|m| m.version == *version) {
            return Ok(MigrationState::Behind(format!(
                "migration {version} is applied but unknown to this build (a newer build migrated the database)"
            )));
        }
    }
    for m in MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
    {
        match applied.iter().find(|(v, ..)| *v == m.version) {
            None => {
                return Ok(MigrationState::Behind(format!(
                    "migration {} ({}) is not applied",
                    m.version, m.description
                )));
            }
            Some((_, _, checksum)) if checksum.as_slice() != &*m.checksum => {
                return Ok(MigrationState::Behind(format!(
                    "migration {} ({}) was applied with a different checksum",
                    m.version, m.description
                )));
            }
            Some(_) => {}
        }
    }
    Ok(MigrationState::Current {
        applied: applied.len(),
    })
}

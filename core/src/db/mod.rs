//! Database access: the schema, the pool, migrations, and the embedded local
//! PostgreSQL.
//!
//! Everything leasekeeper creates lives in one PostgreSQL [`Schema`]
//! (`leasekeeper` unless configured), never in `public`, so it can share a
//! database with a host service's own tables and its own `_sqlx_migrations`.
//! Every statement of the library names that schema ([`Schema::sql`]), so it
//! works on any connection, a host's own included, whatever its
//! `search_path`. A pool built with [`connect`] or [`connect_options`]
//! remembers its schema ([`Schema::of`]), and its sessions see that schema
//! first (handy for hand-written SQL); create or update the tables with
//! [`migrate`].

pub(crate) mod copy;
pub mod embedded;
mod functions;
mod schema;
mod statements;
#[doc(hidden)]
pub mod testing;

pub use functions::{FUNCTIONS, FunctionFile};
pub use schema::{DEFAULT_SCHEMA, MAX_SCHEMA_CHARS, Schema, SchemaError};
pub use statements::SCHEMA_MARKER;

/// Runs `$body` (an expression that may `.await` and use `?`) with `$conn`
/// (a `&mut PgConnection` variable); for a schema behind a transaction
/// pooler, inside a transaction of its own (a savepoint when `$conn` is
/// already in one) that commits when the body answers `Ok` and rolls back
/// otherwise, so the pooler keeps every round trip of it on one server
/// connection. Directly connected, it is just `$body`.
///
/// The body is written once in the expansion: it runs on an [`Atomic`],
/// which is the connection itself or the transaction begun on it. The
/// answer's type may be given (`atomically!(conn, schema, Result<T, E>,
/// body)`) or left to the enclosing function's return type.
macro_rules! atomically {
    ($conn:ident, $schema:expr, $answer:ty, $body:expr) => {{
        let answer: $answer = $crate::db::atomically!($conn, $schema, $body);
        answer
    }};
    ($conn:ident, $schema:expr, $body:expr) => {{
        let mut atomic =
            $crate::db::Atomic::begin(&mut *$conn, $schema.is_behind_transaction_pooler()).await?;
        let answer = {
            let $conn: &mut sqlx::PgConnection = &mut atomic;
            $body
        };
        if $crate::db::Atomic::answered_ok(&answer) {
            atomic.commit().await?;
        }
        answer
    }};
}
pub(crate) use atomically;

/// The connection [`atomically!`] runs its body on: the caller's own, or a
/// transaction begun on it (behind a transaction pooler). Dropped without
/// [`Atomic::commit`], the transaction rolls back.
pub(crate) enum Atomic<'c> {
    /// Directly connected: the caller's connection, as it is.
    Direct(&'c mut PgConnection),
    /// Behind a transaction pooler: a transaction (or savepoint) of its own.
    Transaction(sqlx::Transaction<'c, sqlx::Postgres>),
}

impl<'c> Atomic<'c> {
    /// `conn` as it is, or (`own_transaction`) a transaction begun on it.
    pub(crate) async fn begin(
        conn: &'c mut PgConnection,
        own_transaction: bool,
    ) -> sqlx::Result<Atomic<'c>> {
        Ok(if own_transaction {
            Atomic::Transaction(conn.begin().await?)
        } else {
            Atomic::Direct(conn)
        })
    }

    /// Commits the transaction, if this began one.
    pub(crate) async fn commit(self) -> sqlx::Result<()> {
        match self {
            Atomic::Direct(_) => Ok(()),
            Atomic::Transaction(tx) => tx.commit().await,
        }
    }

    /// Whether the body answered `Ok` (and its transaction commits): a
    /// function rather than a method, so the answer's type may still be
    /// open when the macro asks.
    pub(crate) fn answered_ok<T, E>(answer: &Result<T, E>) -> bool {
        answer.is_ok()
    }
}

impl std::ops::Deref for Atomic<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match self {
            Atomic::Direct(conn) => conn,
            Atomic::Transaction(tx) => tx,
        }
    }
}

impl std::ops::DerefMut for Atomic<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Atomic::Direct(conn) => conn,
            Atomic::Transaction(tx) => tx,
        }
    }
}

use anyhow::Context;
use embedded::EmbeddedPostgres;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use std::path::Path;
use std::sync::LazyLock;
use std::time::Duration;

/// The schema migrations in the crate's `migrations/`, embedded in the
/// binary. Run them with [`migrate`], which puts them (and sqlx's record of
/// them) in the schema, in one transaction, never with `MIGRATOR.run`
/// directly. sqlx's own session lock is off: [`migrate`] serialises
/// migrators with a transaction-scoped lock instead, which a pooler in
/// transaction mode keeps.
pub static MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| {
    let mut migrator = sqlx::migrate!();
    migrator.set_locking(false);
    migrator
});

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

/// `options` for a pool of `schema`: the pool remembers the schema
/// ([`Schema::of`]), which the library's handles built on the pool work in,
/// and its sessions see `schema` alone on their `search_path`, so
/// hand-written SQL on them finds leasekeeper's tables by their bare names.
/// The library itself never depends on that `search_path` (its statements
/// name their schema): a pooler may drop the startup parameter.
///
/// A host's own tables are not visible by their bare names on these
/// connections, except in a handler's fenced transaction
/// ([`crate::queue::store::FencedTransaction`]), which switches to the
/// host's `search_path` for the handler's statements.
///
/// For a schema [behind a transaction pooler](Schema::behind_transaction_pooler)
/// the options also say so (for [`Schema::of`]) and keep no statement cache.
pub fn connect_options(options: PgConnectOptions, schema: &Schema) -> PgConnectOptions {
    // `-c search_path="name"` in the startup packet: applied before the
    // first statement, and again on every new connection of a pool.
    let options = options.options([("search_path", schema.quoted())]);
    if schema.is_behind_transaction_pooler() {
        options
            .options([(statements::POOLER_OPTION, statements::POOLER_TRANSACTION)])
            .statement_cache_capacity(0)
    } else {
        options
    }
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

/// Where a process opens the connections that need a session of their
/// own: its liveness session ([`crate::liveness`]) and its `LISTEN`
/// ([`crate::live::LiveHub`]). Directly connected, that is the pool's own
/// database; behind a transaction pooler, where a session means nothing,
/// it is a direct URL to the same database, or nowhere (liveness off, the
/// TTL rules; no `LISTEN`, idle workers poll).
#[derive(Clone, Debug)]
pub struct Sessions {
    /// Options of a session connection (the schema's `search_path`).
    pub options: PgConnectOptions,
    /// The schema, on a direct connection.
    pub schema: Schema,
    /// Whether these sessions bypass the pool's transaction pooler.
    pub bypass_pooler: bool,
}

impl Sessions {
    /// Where `pool`'s process opens its sessions: `pool`'s own database
    /// when it is directly connected (`direct` unused); behind a
    /// transaction pooler, `direct` (a direct connection to the same
    /// database, checked: [`same_database`]), or `None` without it.
    pub async fn of(
        pool: &PgPool,
        direct: Option<PgConnectOptions>,
    ) -> anyhow::Result<Option<Self>> {
        let schema = Schema::of(pool);
        if !schema.is_behind_transaction_pooler() {
            return Ok(Some(Sessions {
                options: (*pool.connect_options()).clone(),
                schema,
                bypass_pooler: false,
            }));
        }
        let Some(direct) = direct else {
            return Ok(None);
        };
        let schema = schema.directly_connected();
        let options = connect_options(direct, &schema);
        same_database(pool, &options).await?;
        Ok(Some(Sessions {
            options,
            schema,
            bypass_pooler: true,
        }))
    }
}

/// Whether `direct` (options of a direct connection) reaches the very
/// database `pooled` does: the same database name on the same server
/// incarnation (the postmaster's start time). A liveness session on
/// another server would judge sessions it cannot see, so a direct URL that
/// points elsewhere is refused at start rather than trusted.
pub async fn same_database(pooled: &PgPool, direct: &PgConnectOptions) -> anyhow::Result<()> {
    const IDENTITY: &str = "SELECT current_database()::text, pg_postmaster_start_time()::text";
    // In a transaction: behind the pooler, parse and execute stay on one
    // server connection.
    let mut tx = pooled
        .begin()
        .await
        .context("reading the pooled database's identity")?;
    let through_pool: (String, String) = sqlx::query_as(IDENTITY)
        .persistent(false)
        .fetch_one(&mut *tx)
        .await
        .context("reading the pooled database's identity")?;
    tx.commit().await?;
    let mut conn = PgConnection::connect_with(direct)
        .await
        .context("connecting to the direct database URL")?;
    let directly: (String, String) = sqlx::query_as(IDENTITY)
        .fetch_one(&mut conn)
        .await
        .context("reading the direct database's identity")?;
    let _ = conn.close().await;
    anyhow::ensure!(
        through_pool == directly,
        "the direct database URL reaches database {:?} on a server started at {}, the pool database {:?} on a server started at {}: it must be the same database on the same server",
        directly.0,
        directly.1,
        through_pool.0,
        through_pool.1
    );
    Ok(())
}

/// Creates `schema` if it does not exist and applies the pending
/// [`MIGRATOR`] migrations inside it, then the [`FUNCTIONS`] files that
/// changed, all in one transaction on a connection of its own to `pool`'s
/// database. sqlx records them in
/// `<schema>._sqlx_migrations`, apart from a host's
/// `public._sqlx_migrations`. Safe to call from every replica at once (one
/// migrates, the others wait and then find nothing to do), and through a
/// pooler in transaction mode: it uses no session state.
pub async fn migrate(pool: &PgPool, schema: &Schema) -> anyhow::Result<()> {
    let options = connect_options((*pool.connect_options()).clone(), schema);
    let mut conn = PgConnection::connect_with(&options)
        .await
        .context("connecting to migrate")?;
    let migrated = migrate_on(&mut conn, schema).await;
    let closed = conn.close().await;
    migrated?;
    closed.context("closing the migration connection")
}

async fn migrate_on(conn: &mut PgConnection, schema: &Schema) -> anyhow::Result<()> {
    let mut tx = conn.begin().await.context("beginning the migration")?;
    // Behind a pooler in transaction mode this transaction may run on a
    // server connection where another client left statements prepared by
    // name; sqlx's migrator prepares its own by the same names. Our own
    // statements are unnamed, and both ends of the transaction clear the
    // names (the server connection outlives this client).
    deallocate_all(&mut tx).await?;
    // Race prevented: replicas starting together on a fresh database. Two
    // `CREATE SCHEMA` at the same moment can both find no schema and one
    // fails on the catalog's unique index, and two migrators could apply
    // one migration twice. So every migrator of this schema first waits for
    // this lock (a two-key advisory lock, a key space apart from sqlx's
    // one-key lock on the database), held to the end of its transaction:
    // only the first creates the schema and applies migrations; the rest
    // then find them applied. Transaction-scoped, not a session lock: a
    // pooler in transaction mode may hand the session's next statement to
    // another server connection, and a session lock left behind by a failed
    // migration would outlive this connection there.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('leasekeeper migrate'), hashtext($1))")
        .persistent(false)
        .bind(schema.as_str())
        .execute(&mut *tx)
        .await
        .context("waiting for the migration lock")?;
    // Asked first, not `CREATE SCHEMA IF NOT EXISTS`: that needs the CREATE
    // privilege on the database even when the schema exists, and a host may
    // have made the schema for a role that has no such privilege.
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
            .persistent(false)
            .bind(schema.as_str())
            .fetch_one(&mut *tx)
            .await
            .context("looking for the schema")?;
    if !exists {
        sqlx::query(&format!("CREATE SCHEMA {}", schema.quoted()))
            .persistent(false)
            .execute(&mut *tx)
            .await
            .with_context(|| format!("creating schema {schema}"))?;
    }
    // The migration files name no schema: they run with the schema alone on
    // the transaction's search_path (whatever the session's), and the
    // functions they create are pinned to it (`SET search_path FROM
    // CURRENT`).
    sqlx::query("SELECT set_config('search_path', $1, true)")
        .persistent(false)
        .bind(schema.quoted())
        .execute(&mut *tx)
        .await
        .context("setting the migration's search_path")?;
    // `run_direct`, not `run`: `run(&mut PgConnection)` makes this future
    // not `Send` (sqlx's "`Acquire` is not general enough"), and a service
    // must be able to migrate from a spawned task; sqlx keeps `run_direct`
    // public for exactly that. Each migration runs in a savepoint of this
    // transaction.
    MIGRATOR
        .run_direct(&mut *tx)
        .await
        .with_context(|| format!("running database migrations in schema {schema}"))?;
    // Then the functions' current bodies, on the tables the migrations
    // left, under the same lock and search_path.
    functions::apply(&mut tx, schema)
        .await
        .with_context(|| format!("applying the SQL functions in schema {schema}"))?;
    deallocate_all(&mut tx).await?;
    tx.commit().await.context("committing the migrations")?;
    Ok(())
}

/// Drops every statement prepared by name on this server connection.
async fn deallocate_all(conn: &mut PgConnection) -> anyhow::Result<()> {
    sqlx::query("DEALLOCATE ALL")
        .persistent(false)
        .execute(&mut *conn)
        .await
        .context("deallocating prepared statements")?;
    Ok(())
}

/// Whether the database's migrations (in `schema`) are those this build
/// carries.
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
pub async fn migration_state(
    conn: &mut PgConnection,
    schema: &Schema,
) -> sqlx::Result<MigrationState> {
    let exists: bool = schema
        .query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(format!("{}._sqlx_migrations", schema.quoted()))
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(MigrationState::Behind(
            "no migrations applied in this schema".into(),
        ));
    }
    let applied: Vec<(i64, bool, Vec<u8>)> = schema
        .query_as(
            "SELECT version, success, checksum FROM $schema._sqlx_migrations ORDER BY version",
        )
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

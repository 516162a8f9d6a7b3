//! Test support: a fresh, migrated database of its own for each test and
//! each doc-test, on a real PostgreSQL server.
//!
//! Not part of the public API (hidden from the docs): it is public only so
//! that this crate's doc-tests and the workspace's integration tests, which
//! are compiled as separate crates, share one harness.
//!
//! The server is `LEASEKEEPER_TEST_DATABASE_URL` when set (any superuser
//! URL, e.g. a local server for a quick inner loop); otherwise the embedded
//! cluster in `<workspace>/target/leasekeeper-test-db`, started on first use
//! and left running for the next run (`leasekeeper db stop --data-dir ...`
//! stops it). Every database is named after the process that made it
//! (`lk_<kind>_<pid>_<n>`), so later test processes drop those of processes
//! that have ended.
//!
//! A test process with many tests ([`TestDb`]) clones its databases from a
//! template it migrates once, and first drops every stale test database. A
//! doc-test ([`fresh_pool`]) is a process with one database: it creates and
//! migrates that one directly, and leaves dropping stale doc-test databases
//! to a background task it does not wait for. Each `DROP DATABASE` waits for
//! a checkpoint, and right after the integration tests the one in progress
//! syncs tens of thousands of files: measured here, a doc-test that waited
//! for its drops took 90 s instead of 2. A drop already sent completes in
//! the server even when the doc-test ends first; one not yet sent is left
//! for a later test process.
//!
//! Failing to reach or prepare the server panics: this is test set-up, and a
//! panic with the reason is what a test should report.

use super::embedded::EmbeddedPostgres;
use super::{Schema, connect_options, pool_options};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::OnceCell;

/// Where the embedded test cluster lives when no server URL is given: the
/// workspace's `target/` (this crate sits one folder below the workspace
/// root), next to the builds, so `cargo clean` removes it too.
const EMBEDDED_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/leasekeeper-test-db");

static SERVER: OnceLock<PgConnectOptions> = OnceLock::new();
static TEMPLATE: OnceCell<String> = OnceCell::const_new();
static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A pool of a fresh, migrated database of its own: the one-line set-up of
/// this crate's doc-tests.
pub async fn fresh_pool() -> PgPool {
    let server = server();
    let background = server.clone();
    tokio::spawn(async move {
        if let Ok(mut conn) = PgConnection::connect_with(&background).await {
            let _ = drop_stale(&mut conn, "lk\\_doc\\_%").await;
        }
    });
    let mut conn = maintenance().await;
    let name = unique_name("doc");
    create_database(&mut conn, &name, None).await;
    let pool = connect(schema_options(server.database(&name)), 4).await;
    migrate(&pool).await;
    pool
}

/// `plain` (a host's view: no search_path of ours) seen through the
/// default schema, as every leasekeeper pool sees its database.
fn schema_options(plain: PgConnectOptions) -> PgConnectOptions {
    connect_options(plain, &Schema::default())
}

/// A fresh, migrated database of its own for one test.
pub struct TestDb {
    /// Connection options for it, for extra pools or connections
    /// (search_path: the default schema).
    pub options: PgConnectOptions,
    /// A pool on it.
    pub pool: PgPool,
    /// Connection options as a host service would have them: no
    /// search_path of ours.
    pub plain: PgConnectOptions,
}

impl TestDb {
    /// Creates the database (a clone of the migrated template) and a pool of
    /// up to `max_connections` on it.
    pub async fn with_connections(max_connections: u32) -> Self {
        let template = template().await;
        let name = unique_name("test");
        create_database(&mut maintenance().await, &name, Some(template)).await;
        TestDb::on(&name, max_connections).await
    }

    /// A fresh database with nothing of leasekeeper's in it, not migrated
    /// (its pool's schema does not exist yet).
    pub async fn unmigrated() -> Self {
        let name = unique_name("test");
        create_database(&mut maintenance().await, &name, None).await;
        TestDb::on(&name, 16).await
    }

    async fn on(name: &str, max_connections: u32) -> Self {
        let plain = server().database(name);
        let options = schema_options(plain.clone());
        let pool = connect(options.clone(), max_connections).await;
        TestDb {
            options,
            pool,
            plain,
        }
    }

    /// The same database seen through `schema` (a pool of 16 whose
    /// connections see `schema` only), migrated there.
    pub async fn migrated_in(&self, schema: &Schema) -> TestDb {
        let options = connect_options(self.plain.clone(), schema);
        let pool = self.pool_in(schema, 16).await;
        super::migrate(&pool, schema)
            .await
            .expect("migrating another schema");
        TestDb {
            options,
            pool,
            plain: self.plain.clone(),
        }
    }

    /// A pool on the same database whose connections see `schema` only.
    pub async fn pool_in(&self, schema: &Schema, max_connections: u32) -> PgPool {
        connect(connect_options(self.plain.clone(), schema), max_connections).await
    }

    /// A fresh database with a pool of the default size.
    pub async fn new() -> Self {
        Self::with_connections(16).await
    }

    /// Another, independent pool on the same database.
    pub async fn pool(&self, max_connections: u32) -> PgPool {
        connect(self.options.clone(), max_connections).await
    }

    /// This database as a URL, for a process the test starts: host and
    /// port as query parameters, so a socket folder (the embedded
    /// cluster's) works as well as an address.
    pub fn url(&self) -> String {
        let o = &self.plain;
        let host = match o.get_socket() {
            Some(dir) => dir.display().to_string(),
            None => o.get_host().to_string(),
        };
        format!(
            "postgres://{}@localhost/{}?host={host}&port={}&sslmode=disable",
            o.get_username(),
            o.get_database().expect("a database name"),
            o.get_port(),
        )
    }
}

/// Every pool the harness hands out is made here, so how a test pool is set
/// up (its size, and whatever each connection needs) is decided once.
async fn connect(options: PgConnectOptions, max_connections: u32) -> PgPool {
    pool_options()
        .max_connections(max_connections)
        .connect_with(options)
        .await
        .expect("connecting to a test database")
}

/// Every test database (or template) is migrated here, in the default schema.
async fn migrate(pool: &PgPool) {
    super::migrate(pool, &Schema::default())
        .await
        .expect("migrating a test database");
}

/// `lk_<kind>_<pid>_<n>`: unique on the server while this process lives.
fn unique_name(kind: &str) -> String {
    format!(
        "lk_{kind}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// Creates database `name`, empty or as a copy of `template`.
async fn create_database(conn: &mut PgConnection, name: &str, template: Option<&str>) {
    // A database of that name can only be left by an ended process whose
    // pid this one got again; stale cleanup spares it, since the pid is alive.
    sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("dropping an old {name}: {e}"));
    let from = template
        .map(|t| format!(" TEMPLATE \"{t}\""))
        .unwrap_or_default();
    sqlx::query(&format!("CREATE DATABASE \"{name}\"{from}"))
        .execute(conn)
        .await
        .unwrap_or_else(|e| panic!("creating test database {name}: {e}"));
}

/// Drops the databases matching the LIKE `pattern` whose process (the pid
/// in their name) has ended.
async fn drop_stale(conn: &mut PgConnection, pattern: &str) -> sqlx::Result<()> {
    let stale: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE $1")
            .bind(pattern)
            .fetch_all(&mut *conn)
            .await?;
    for name in stale {
        let pid = name.split('_').nth(2).unwrap_or("");
        if !pid_alive(pid) {
            // Another process may be dropping it too: whoever is second
            // finds nothing to drop.
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .execute(&mut *conn)
                .await;
        }
    }
    Ok(())
}

/// Connection options for the test server's maintenance database.
fn server() -> PgConnectOptions {
    SERVER
        .get_or_init(|| {
            if let Ok(url) = std::env::var("LEASEKEEPER_TEST_DATABASE_URL") {
                return url
                    .parse()
                    .expect("LEASEKEEPER_TEST_DATABASE_URL is not a valid URL");
            }
            // Start the cluster on a runtime of its own: the caller may be
            // inside a test's runtime, which must not block.
            std::thread::spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime for the test cluster");
                rt.block_on(async {
                    let cluster = EmbeddedPostgres::start(Path::new(EMBEDDED_DIR))
                        .await
                        .expect("starting the embedded test cluster");
                    cluster.connect_options("postgres")
                })
            })
            .join()
            .expect("test cluster thread")
        })
        .clone()
}

async fn maintenance() -> PgConnection {
    PgConnection::connect_with(&server())
        .await
        .expect("connecting to the test server")
}

fn pid_alive(pid: &str) -> bool {
    Path::new("/proc").join(pid).exists()
}

/// The migrated template for this test process, created once.
async fn template() -> &'static str {
    TEMPLATE
        .get_or_init(|| async {
            let mut conn = maintenance().await;
            // Drop what earlier, finished test processes left behind.
            drop_stale(&mut conn, "lk\\_%")
                .await
                .expect("listing test databases");
            let name = unique_name("tpl");
            create_database(&mut conn, &name, None).await;
            // Closed before the template is cloned: CREATE DATABASE refuses a
            // template anyone is connected to.
            let tpl = connect(schema_options(server().database(&name)), 1).await;
            migrate(&tpl).await;
            tpl.close().await;
            name
        })
        .await
}

/// Shorthand for a validated resource name.
pub fn resource(name: &str) -> crate::lease::Resource {
    crate::lease::Resource::parse(name).expect("valid resource")
}

/// Shorthand for a validated holder name.
pub fn holder(name: &str) -> crate::lease::Holder {
    crate::lease::Holder::parse(name).expect("valid holder")
}

/// The kinds of `resource`'s events in order, oldest first.
pub async fn event_kinds(pool: &PgPool, resource: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT kind FROM lease_events WHERE resource = $1 ORDER BY id")
        .bind(resource)
        .fetch_all(pool)
        .await
        .expect("reading lease events")
}

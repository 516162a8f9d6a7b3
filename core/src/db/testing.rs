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
//! stops it). Databases are cloned from a template migrated once per test
//! process, and named after the process (`lk_test_<pid>_<n>`), so the next
//! test process drops those of processes that have ended.
//!
//! Failing to reach or prepare the server panics: this is test set-up, and a
//! panic with the reason is what a test should report.

use super::embedded::EmbeddedPostgres;
use super::{MIGRATOR, pool_options};
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
    TestDb::with_connections(4).await.pool
}

/// A fresh, migrated database of its own for one test.
pub struct TestDb {
    /// Connection options for it, for extra pools or connections.
    pub options: PgConnectOptions,
    /// A pool on it.
    pub pool: PgPool,
}

impl TestDb {
    /// Creates the database (a clone of the migrated template) and a pool of
    /// up to `max_connections` on it.
    pub async fn with_connections(max_connections: u32) -> Self {
        let template = template().await;
        let name = format!(
            "lk_test_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let mut conn = maintenance().await;
        sqlx::query(&format!(
            "CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""
        ))
        .execute(&mut conn)
        .await
        .expect("creating a test database");
        let options = server().database(&name);
        let pool = connect(options.clone(), max_connections).await;
        TestDb { options, pool }
    }

    /// A fresh database with a pool of the default size.
    pub async fn new() -> Self {
        Self::with_connections(16).await
    }

    /// Another, independent pool on the same database.
    pub async fn pool(&self, max_connections: u32) -> PgPool {
        connect(self.options.clone(), max_connections).await
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
            let stale: Vec<String> =
                sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 'lk\\_%'")
                    .fetch_all(&mut conn)
                    .await
                    .expect("listing test databases");
            for name in stale {
                let pid = name.split('_').nth(2).unwrap_or("");
                if !pid_alive(pid) {
                    let _ =
                        sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                            .execute(&mut conn)
                            .await;
                }
            }
            let name = format!("lk_tpl_{}", std::process::id());
            sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .execute(&mut conn)
                .await
                .expect("dropping the old template");
            sqlx::query(&format!("CREATE DATABASE \"{name}\""))
                .execute(&mut conn)
                .await
                .expect("creating the template");
            // Closed before the template is cloned: CREATE DATABASE refuses a
            // template anyone is connected to.
            let tpl = connect(server().database(&name), 1).await;
            MIGRATOR.run(&tpl).await.expect("migrating the template");
            tpl.close().await;
            name
        })
        .await
}

//! Test harness: a real PostgreSQL server and a fresh database per test.
//!
//! The server is `LEASEKEEPER_TEST_DATABASE_URL` when set (any superuser
//! URL, e.g. a local server for a quick inner loop); otherwise the embedded
//! cluster in `target/leasekeeper-test-db`, started on first use and left
//! running for the next run (`leasekeeper db stop --data-dir ...` stops it).
//! Databases are cloned from a template migrated once per test process,
//! in the default schema (`leasekeeper`); every pool sees that schema only,
//! as the server's does.

use leasekeeper::db::embedded::EmbeddedPostgres;
use leasekeeper::db::{Schema, connect_options, migrate, pool_options};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::OnceCell;

static SERVER: OnceLock<PgConnectOptions> = OnceLock::new();
static TEMPLATE: OnceCell<String> = OnceCell::const_new();
static COUNTER: AtomicUsize = AtomicUsize::new(0);

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
                    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("target/leasekeeper-test-db");
                    let cluster = EmbeddedPostgres::start(&dir)
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
    std::path::Path::new("/proc").join(pid).exists()
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
            let schema = Schema::default();
            let tpl = pool_options()
                .max_connections(1)
                .connect_with(connect_options(server().database(&name), &schema))
                .await
                .expect("connecting to the template");
            migrate(&tpl, &schema)
                .await
                .expect("migrating the template");
            tpl.close().await;
            name
        })
        .await
}

/// A fresh, migrated database of its own for one test.
pub struct TestDb {
    /// Connection options for it, for extra pools (search_path: the
    /// default schema).
    pub options: PgConnectOptions,
    /// A pool on it.
    pub pool: PgPool,
    /// Connection options as a host service would have them: no
    /// search_path of ours.
    pub plain: PgConnectOptions,
}

/// Creates a database of its own name, cloned from `template` (PostgreSQL's
/// `template1` when `None`: nothing of leasekeeper's in it).
async fn create_database(template: Option<&str>) -> String {
    let name = format!(
        "lk_test_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    );
    let mut conn = maintenance().await;
    let from = template.map_or(String::new(), |t| format!(" TEMPLATE \"{t}\""));
    sqlx::query(&format!("CREATE DATABASE \"{name}\"{from}"))
        .execute(&mut conn)
        .await
        .expect("creating a test database");
    name
}

impl TestDb {
    /// Creates the database and a pool of up to `max_connections`.
    pub async fn with_connections(max_connections: u32) -> Self {
        let name = create_database(Some(template().await)).await;
        TestDb::on(name, max_connections).await
    }

    /// A fresh database with nothing of leasekeeper's in it, not migrated
    /// (its pool's schema does not exist yet).
    pub async fn unmigrated() -> Self {
        TestDb::on(create_database(None).await, 16).await
    }

    async fn on(name: String, max_connections: u32) -> Self {
        let plain = server().database(&name);
        let options = connect_options(plain.clone(), &Schema::default());
        let pool = pool_options()
            .max_connections(max_connections)
            .connect_with(options.clone())
            .await
            .expect("connecting to the test database");
        TestDb {
            options,
            pool,
            plain,
        }
    }

    /// A fresh database with a pool of the default size.
    pub async fn new() -> Self {
        Self::with_connections(16).await
    }

    /// Another, independent pool on the same database.
    pub async fn pool(&self, max_connections: u32) -> PgPool {
        pool_options()
            .max_connections(max_connections)
            .connect_with(self.options.clone())
            .await
            .expect("connecting another pool")
    }

    /// The same database seen through `schema` (a pool of 16 whose
    /// connections see `schema` only), migrated there.
    pub async fn migrated_in(&self, schema: &Schema) -> TestDb {
        let options = connect_options(self.plain.clone(), schema);
        let pool = self.pool_in(schema, 16).await;
        migrate(&pool, schema)
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
        pool_options()
            .max_connections(max_connections)
            .connect_with(connect_options(self.plain.clone(), schema))
            .await
            .expect("connecting a pool in another schema")
    }
}

/// Shorthand for a validated resource name.
pub fn resource(name: &str) -> leasekeeper::lease::Resource {
    leasekeeper::lease::Resource::parse(name).expect("valid resource")
}

/// Shorthand for a validated holder name.
pub fn holder(name: &str) -> leasekeeper::lease::Holder {
    leasekeeper::lease::Holder::parse(name).expect("valid holder")
}

/// The kinds of `resource`'s events in order, oldest first.
pub async fn event_kinds(pool: &PgPool, resource: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT kind FROM lease_events WHERE resource = $1 ORDER BY id")
        .bind(resource)
        .fetch_all(pool)
        .await
        .expect("reading lease events")
}

//! Database access: the pool, migrations, and the embedded local PostgreSQL.

pub mod embedded;
#[doc(hidden)]
pub mod testing;

use anyhow::Context;
use embedded::EmbeddedPostgres;
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::path::Path;
use std::time::Duration;

/// The schema migrations in `migrations/`, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!();

/// The database name used inside the embedded cluster.
pub const EMBEDDED_DATABASE: &str = "leasekeeper";

/// A migrated pool, and the embedded cluster behind it when there is one.
pub struct Database {
    /// The connection pool.
    pub pool: PgPool,
    /// The embedded cluster, when no `DATABASE_URL` was given.
    pub embedded: Option<EmbeddedPostgres>,
}

impl Database {
    /// Connects to `database_url`, or starts (or reuses) the embedded cluster
    /// in `data_dir` when there is none; then runs pending migrations.
    pub async fn open(database_url: Option<&str>, data_dir: &Path) -> anyhow::Result<Self> {
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
            .connect_with(options)
            .await
            .context("cannot connect to PostgreSQL")?;
        MIGRATOR
            .run(&pool)
            .await
            .context("running database migrations")?;
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

//! The database a run uses: the single embedded server (the classic fault
//! kinds), or the highly available cluster (`pg_failover`, `clock_skew`).

use super::cut::Upstream;
use super::ha::{HaCluster, Replication};
use anyhow::Result;
use leasekeeper_core::db::embedded::EmbeddedPostgres;
use sqlx::postgres::PgConnectOptions;
use std::path::Path;

pub(super) enum Database {
    Single(EmbeddedPostgres),
    Ha(Box<HaCluster>),
}

impl Database {
    pub(super) async fn start(
        ha: bool,
        cluster_dir: &Path,
        ha_dir: &Path,
        replication: Replication,
    ) -> Result<Self> {
        use anyhow::Context;
        Ok(if ha {
            Database::Ha(Box::new(
                HaCluster::start(ha_dir, replication)
                    .await
                    .context("starting the harness's highly available PostgreSQL cluster")?,
            ))
        } else {
            Database::Single(
                EmbeddedPostgres::start(cluster_dir)
                    .await
                    .context("starting the harness's PostgreSQL cluster")?,
            )
        })
    }

    pub(super) fn connect_options(&self, database: &str) -> PgConnectOptions {
        match self {
            Database::Single(pg) => pg.connect_options(database),
            Database::Ha(ha) => ha.connect_options(database),
        }
    }

    pub(super) async fn recreate_database(&self, name: &str) -> Result<()> {
        match self {
            Database::Single(pg) => pg.recreate_database(name).await,
            Database::Ha(ha) => ha.recreate_database(name).await,
        }
    }

    /// What an instance's relay (its network link to the database) forwards to.
    pub(super) fn upstream(&self) -> Upstream {
        match self {
            Database::Single(pg) => Upstream::Unix(pg.socket_path()),
            Database::Ha(ha) => Upstream::Tcp(ha.addr()),
        }
    }

    pub(super) async fn stop(self) -> Result<()> {
        match self {
            Database::Single(pg) => pg.stop_if_started_here().await,
            Database::Ha(ha) => {
                (*ha).stop().await;
                Ok(())
            }
        }
    }
}

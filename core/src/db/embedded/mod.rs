//! The embedded default database.
//!
//! When no `DATABASE_URL` is given, leasekeeper starts and owns a private
//! PostgreSQL cluster in a local data folder, so that a newcomer needs no
//! database set-up at all. The cluster is run with the PostgreSQL server
//! binaries already installed on the machine (`initdb`, `pg_ctl`,
//! `postgres`); nothing is ever downloaded.
//!
//! Layout of the data folder:
//!
//! ```text
//! <data_dir>/
//!   pgdata/                 the cluster (created by initdb)
//!   postgres.log            the server log (pg_ctl -l; moved to postgres.log.1 when large)
//!   .s.PGSQL.5432           the unix socket (no TCP listener at all)
//!   .leasekeeper.lock       serialises start/stop between processes
//! ```
//!
//! If the socket path would exceed the kernel's limit for unix socket paths,
//! the socket lives in a short folder under `/tmp` named from a hash of the
//! data folder instead.
//!
//! `initdb` and `postgres` refuse to run as root. When this process runs as
//! root (sessions and CI do), the server commands run as the `postgres`
//! system user through `runuser`, and the data folder is owned by that user.
//!
//! One file per idea: this one starts and stops the cluster (its public
//! face); `cluster.rs` holds the lifecycle steps (initdb, settings, pg_ctl),
//! `runner.rs` finds the binaries and runs them as the right user,
//! `folder.rs` prepares the data and socket folders and their lock, and
//! `database.rs` connects to and creates databases.

mod cluster;
mod database;
mod folder;
mod runner;

pub use runner::find_server_binaries;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use folder::{DirLock, choose_socket_dir, prepare_data_dir};
use runner::Runner;

/// Superuser created by initdb; every connection to the embedded cluster uses it.
const SUPERUSER: &str = "leasekeeper";
/// System user that runs the server when this process is root.
const SERVER_SYSTEM_USER: &str = "postgres";
/// The port only names the socket file (`.s.PGSQL.<port>`): there is no TCP
/// listener, so the default port cannot clash with another server.
const PORT: u16 = 5432;
/// Longest unix socket path the kernel accepts: `sun_path` is 108 bytes
/// including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;
/// Subfolder of the data folder that holds the cluster.
const PGDATA: &str = "pgdata";
/// initdb writes into this folder first and it is renamed to `pgdata` only
/// once complete, so a half-finished initdb can never pass for a cluster.
const PGDATA_INIT: &str = "pgdata.initdb";
/// Server log, in the data folder.
const SERVER_LOG: &str = "postgres.log";
/// Size at which the server log is moved aside before a start.
const MAX_LOG_BYTES: u64 = 16 * 1024 * 1024;
/// Lock file in the data folder serialising start and stop.
const LOCK_FILE: &str = ".leasekeeper.lock";
/// Markers around the settings block leasekeeper keeps in postgresql.conf.
const CONF_BEGIN: &str = "# BEGIN leasekeeper settings (rewritten by leasekeeper at each start)";
/// End marker of that block.
const CONF_END: &str = "# END leasekeeper settings";
/// initdb of a fresh cluster takes seconds; the bound only stops a hang.
const INITDB_TIMEOUT: Duration = Duration::from_secs(300);
/// pg_ctl start/stop get `-t 60` themselves; this bounds the whole command.
const PG_CTL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long to wait for the socket to accept connections after start.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long to wait for another process that is starting or stopping the
/// same cluster (it may be running initdb, which is the slow part).
const LOCK_TIMEOUT: Duration = Duration::from_secs(240);
/// Attempts at `pg_ctl start`: after a crash, children of the dead postmaster
/// may hold the old shared memory for a moment and make the first try fail.
const START_ATTEMPTS: u32 = 4;

/// A PostgreSQL cluster in a local data folder, started (or found running)
/// by [`EmbeddedPostgres::start`].
///
/// Dropping it does not stop the server: call
/// [`EmbeddedPostgres::stop_if_started_here`] on shutdown.
#[derive(Debug)]
pub struct EmbeddedPostgres {
    /// Absolute, canonical data folder.
    data_dir: PathBuf,
    /// Folder holding initdb, pg_ctl and postgres.
    bin_dir: PathBuf,
    /// Folder holding the server's unix socket.
    socket_dir: PathBuf,
    /// Port naming the socket file.
    port: u16,
    /// Whether this process started the server (and so should stop it).
    started_here: bool,
    /// Who runs the server commands.
    runner: Runner,
}

impl EmbeddedPostgres {
    /// Finds the server binaries, runs initdb if the folder holds no cluster
    /// yet, and starts the server unless one is already running on that
    /// folder (then it is reused and [`started_here`](Self::started_here) is
    /// false). Returns once the server accepts connections.
    ///
    /// Idempotent, and safe if two processes call it at the same moment on the
    /// same folder: a lock file in the folder serialises them, so one starts
    /// the server and the other reuses it.
    pub async fn start(data_dir: &Path) -> Result<Self> {
        let bin_dir = find_server_binaries()?;
        let runner = Runner::detect()?;
        let data_dir = prepare_data_dir(data_dir, &runner).await?;
        // Held until this function returns: initdb, configuration and start
        // must not interleave with another process doing the same.
        let _lock = DirLock::acquire(&data_dir).await?;
        let socket_dir = choose_socket_dir(&data_dir, &runner)?;

        let mut pg = EmbeddedPostgres {
            data_dir,
            bin_dir,
            socket_dir,
            port: PORT,
            started_here: false,
            runner,
        };

        if pg.is_running().await? {
            tracing::info!(data_dir = %pg.data_dir.display(), "reusing the PostgreSQL server already running on the data folder");
            pg.adopt_running_server().await;
        } else {
            pg.ensure_cluster().await?;
            pg.write_settings(&pg.pgdata()).await?;
            pg.remove_zombie_lock_files().await?;
            pg.rotate_log().await?;
            pg.start_server().await?;
        }
        pg.wait_ready().await?;
        tracing::info!(
            data_dir = %pg.data_dir.display(),
            started_here = pg.started_here,
            "embedded PostgreSQL ready; connect with: psql '{}'",
            pg.url(SUPERUSER)
        );
        Ok(pg)
    }

    /// Whether this process started the server (false when it reused one
    /// that was already running on the folder).
    pub fn started_here(&self) -> bool {
        self.started_here
    }

    /// The data folder (absolute, symlinks resolved).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Stops the server (`pg_ctl stop -m fast`) if this process started it;
    /// otherwise does nothing, since another process owns it.
    pub async fn stop_if_started_here(&self) -> Result<()> {
        if !self.started_here {
            return Ok(());
        }
        let _lock = DirLock::acquire(&self.data_dir).await?;
        self.stop_server().await
    }

    /// Stops whatever server runs on the data folder `data_dir` (used by
    /// `leasekeeper db stop` and test scripts). Succeeds if none runs,
    /// including when the folder or its cluster does not exist.
    pub async fn stop(data_dir: &Path) -> Result<()> {
        if !tokio::fs::try_exists(data_dir)
            .await
            .with_context(|| format!("checking data folder {}", data_dir.display()))?
        {
            return Ok(());
        }
        let data_dir = tokio::fs::canonicalize(data_dir)
            .await
            .with_context(|| format!("resolving data folder {}", data_dir.display()))?;
        let pg = EmbeddedPostgres {
            bin_dir: find_server_binaries()?,
            runner: Runner::detect()?,
            // Neither is used for stopping; pg_ctl finds the server by its
            // postmaster.pid.
            socket_dir: data_dir.clone(),
            port: PORT,
            started_here: false,
            data_dir,
        };
        let _lock = DirLock::acquire(&pg.data_dir).await?;
        pg.stop_server().await
    }

    /// Crashes the server on purpose and starts it again (fault testing):
    /// `pg_ctl stop -m immediate` (every backend quits at once, no
    /// checkpoint; the next start runs crash recovery), then a normal start.
    /// Returns once it accepts connections again.
    pub async fn crash_restart(&mut self) -> Result<()> {
        let _lock = DirLock::acquire(&self.data_dir).await?;
        self.stop_server_with("immediate").await?;
        self.start_server().await?;
        self.wait_ready().await
    }
}

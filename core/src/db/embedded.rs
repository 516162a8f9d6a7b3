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

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgSslMode};
use tokio::process::Command;

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

    /// Connection options for database `database`: superuser `leasekeeper`
    /// over the unix socket (the cluster has no TCP listener).
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        // Start from the environment-free defaults and set everything that
        // matters, so stray PGHOST/PGPORT/PGUSER/PGSSLMODE variables meant for
        // some other server cannot redirect these connections.
        PgConnectOptions::new_without_pgpass()
            .host("localhost")
            .socket(&self.socket_dir)
            .port(self.port)
            .username(SUPERUSER)
            .database(database)
            .ssl_mode(PgSslMode::Disable)
            .application_name("leasekeeper")
    }

    /// A libpq-style URL for the same connection, e.g.
    /// `postgres://leasekeeper@localhost:5432/leasekeeper?host=/abs/path`,
    /// accepted by both sqlx and psql (it is logged so users can `psql` in).
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{SUPERUSER}@localhost:{}/{}?host={}",
            self.port,
            percent_encode(database, false),
            percent_encode(&self.socket_dir.to_string_lossy(), true)
        )
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

    /// Drops database `name` if it exists (closing its connections) and
    /// creates it anew, empty: for benchmarks and the fault harness.
    pub async fn recreate_database(&self, name: &str) -> Result<()> {
        let mut conn = PgConnection::connect_with(&self.connect_options("postgres"))
            .await
            .with_context(|| format!("connecting to {}", self.url("postgres")))?;
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            quote_ident(name)
        ))
        .execute(&mut conn)
        .await
        .with_context(|| format!("dropping database {name}"))?;
        let _ = conn.close().await;
        self.ensure_database(name).await
    }

    /// Ensures database `name` exists, creating it if missing. A concurrent
    /// creator is tolerated: "already exists" counts as success.
    pub async fn ensure_database(&self, name: &str) -> Result<()> {
        if name.is_empty() {
            bail!("database name must not be empty");
        }
        let mut conn = PgConnection::connect_with(&self.connect_options("postgres"))
            .await
            .with_context(|| format!("connecting to {}", self.url("postgres")))?;
        let exists: Option<i32> =
            sqlx::query_scalar("SELECT 1 FROM pg_catalog.pg_database WHERE datname = $1")
                .bind(name)
                .fetch_optional(&mut conn)
                .await
                .with_context(|| format!("looking up database {name:?}"))?;
        if exists.is_some() {
            return Ok(());
        }

        let sql = format!("CREATE DATABASE {}", quote_ident(name));
        let mut attempt = 0;
        let result = loop {
            attempt += 1;
            // CREATE DATABASE cannot run inside a transaction block; the
            // simple query protocol sends it as a single statement.
            match sqlx::raw_sql(&sql).execute(&mut conn).await {
                Ok(_) => break Ok(()),
                Err(err) => match err.as_database_error().and_then(|e| e.code()).as_deref() {
                    // duplicate_database: another process created it first.
                    // unique_violation: the same race caught one step later,
                    // at the insert into pg_database.
                    Some("42P04" | "23505") => break Ok(()),
                    // object_in_use: someone is connected to template1, which
                    // CREATE DATABASE copies; such sessions are short-lived.
                    Some("55006") if attempt < 10 => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    _ => break Err(err),
                },
            }
        };
        let _ = conn.close().await;
        result.with_context(|| format!("creating database {name:?}"))?;
        tracing::info!(database = name, "database ready in embedded PostgreSQL");
        Ok(())
    }

    fn pgdata(&self) -> PathBuf {
        self.data_dir.join(PGDATA)
    }

    fn log_path(&self) -> PathBuf {
        self.data_dir.join(SERVER_LOG)
    }

    fn pg_ctl(&self) -> PathBuf {
        self.bin_dir.join("pg_ctl")
    }

    /// Whether a server runs on the cluster (`pg_ctl status`: 0 = running,
    /// 3 = not running, 4 = no usable data directory).
    async fn is_running(&self) -> Result<bool> {
        let pgdata = self.pgdata();
        if !is_complete_cluster(&pgdata).await? {
            return Ok(false);
        }
        let args = [os("status"), os("-D"), pgdata.clone().into_os_string()];
        let out = self
            .runner
            .run(&self.data_dir, &self.pg_ctl(), &args, PG_CTL_TIMEOUT, false)
            .await?;
        match out.status.code() {
            // pg_ctl only asks kill(pid, 0), which also succeeds for a zombie:
            // a crashed postmaster that its parent (in containers often a PID
            // 1 that reaps lazily) has not reaped yet. That server is gone.
            Some(0) => Ok(!lock_file_owner_is_zombie(&pgdata.join("postmaster.pid")).await),
            Some(3) => Ok(false),
            _ => Err(command_failed(&self.pg_ctl(), &args, &out))
                .with_context(|| format!("checking whether a server runs on {}", pgdata.display())),
        }
    }

    /// Takes the socket folder and port from the running server's
    /// postmaster.pid: the server may have been started with other settings
    /// (for instance before the data folder was moved).
    async fn adopt_running_server(&mut self) {
        let pid_file = self.pgdata().join("postmaster.pid");
        let Ok(text) = tokio::fs::read_to_string(&pid_file).await else {
            return;
        };
        // Lines: pid, data dir, start time, port, first socket folder, ...
        let lines: Vec<&str> = text.lines().collect();
        if let Some(port) = lines.get(3).and_then(|l| l.trim().parse::<u16>().ok()) {
            self.port = port;
        }
        if let Some(dir) = lines.get(4).map(|l| l.trim()).filter(|l| !l.is_empty()) {
            let dir = PathBuf::from(dir);
            if dir != self.socket_dir {
                tracing::info!(socket_dir = %dir.display(), "the running server uses another socket folder; using it");
                self.socket_dir = dir;
            }
        }
    }

    /// Removes lock files left by a crashed postmaster that is still a
    /// zombie: postgres itself only ignores lock files of processes that are
    /// fully gone, and would refuse to start ("lock file already exists").
    async fn remove_zombie_lock_files(&self) -> Result<()> {
        let locks = [
            self.pgdata().join("postmaster.pid"),
            self.socket_dir.join(format!(".s.PGSQL.{}.lock", self.port)),
        ];
        for lock in locks {
            if !lock_file_owner_is_zombie(&lock).await {
                continue;
            }
            tracing::warn!(path = %lock.display(), "removing the lock file of a crashed PostgreSQL server");
            match tokio::fs::remove_file(&lock).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("removing stale lock file {}", lock.display()));
                }
            }
        }
        Ok(())
    }

    /// Moves a large server log aside (to `postgres.log.1`, replacing an
    /// older one): pg_ctl only ever appends, so the log would grow forever.
    async fn rotate_log(&self) -> Result<()> {
        let log = self.log_path();
        let Ok(meta) = tokio::fs::metadata(&log).await else {
            return Ok(());
        };
        if meta.len() < MAX_LOG_BYTES {
            return Ok(());
        }
        let old = self.data_dir.join(format!("{SERVER_LOG}.1"));
        tokio::fs::rename(&log, &old)
            .await
            .with_context(|| format!("renaming {} to {}", log.display(), old.display()))
    }

    /// Runs initdb unless the data folder already holds a complete cluster.
    async fn ensure_cluster(&self) -> Result<()> {
        let pgdata = self.pgdata();
        if is_complete_cluster(&pgdata).await? {
            return Ok(());
        }
        if tokio::fs::try_exists(&pgdata).await.unwrap_or(false) {
            // Only a rename of a finished initdb creates `pgdata`, so a folder
            // without PG_VERSION is debris, not data.
            tracing::warn!(path = %pgdata.display(), "removing incomplete cluster folder (no PG_VERSION)");
            remove_dir_all(&pgdata).await?;
        }
        let staging = self.data_dir.join(PGDATA_INIT);
        if tokio::fs::try_exists(&staging).await.unwrap_or(false) {
            tracing::warn!(path = %staging.display(), "removing the leftovers of an interrupted initdb");
            remove_dir_all(&staging).await?;
        }

        tracing::info!(path = %pgdata.display(), "creating a new PostgreSQL cluster (initdb)");
        let initdb = self.bin_dir.join("initdb");
        let args = [
            os("-D"),
            staging.clone().into_os_string(),
            os(&format!("--username={SUPERUSER}")),
            os("--auth=trust"),
            os("--encoding=UTF8"),
            // The C locale exists on every machine, whereas the locale named
            // by LANG may not be generated (initdb then fails); the program
            // needs no language-specific sorting.
            os("--locale=C"),
            os("--no-instructions"),
        ];
        let out = self
            .runner
            .run(&self.data_dir, &initdb, &args, INITDB_TIMEOUT, false)
            .await?;
        if !out.status.success() {
            return Err(command_failed(&initdb, &args, &out)).with_context(|| {
                format!("creating a PostgreSQL cluster in {}", staging.display())
            });
        }
        self.write_settings(&staging).await?;
        tokio::fs::rename(&staging, &pgdata)
            .await
            .with_context(|| format!("renaming {} to {}", staging.display(), pgdata.display()))?;
        Ok(())
    }

    /// Writes leasekeeper's settings block into `<cluster>/postgresql.conf`,
    /// replacing the block from an earlier start, so that a moved data folder
    /// gets the right socket folder.
    async fn write_settings(&self, cluster: &Path) -> Result<()> {
        let conf_path = cluster.join("postgresql.conf");
        let current = tokio::fs::read_to_string(&conf_path)
            .await
            .with_context(|| format!("reading {}", conf_path.display()))?;
        let updated = with_settings_block(&current, &self.socket_dir, self.port);
        if updated != current {
            // Writing into the existing file keeps its owner (the server user).
            tokio::fs::write(&conf_path, updated)
                .await
                .with_context(|| format!("writing {}", conf_path.display()))?;
        }
        Ok(())
    }

    /// Starts the server with pg_ctl; if that fails because another process
    /// started it meanwhile, reuses that server instead.
    async fn start_server(&mut self) -> Result<()> {
        let pgdata = self.pgdata();
        let log = self.log_path();
        let args = [
            os("-D"),
            pgdata.clone().into_os_string(),
            os("-l"),
            log.clone().into_os_string(),
            os("-w"),
            os("-t"),
            os("60"),
            os("start"),
        ];
        let mut attempt = 0;
        loop {
            attempt += 1;
            tracing::info!(path = %pgdata.display(), "starting PostgreSQL");
            let out = self
                .runner
                .run(&self.data_dir, &self.pg_ctl(), &args, PG_CTL_TIMEOUT, true)
                .await?;
            if out.status.success() {
                self.started_here = true;
                return Ok(());
            }
            let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
            if said.contains("did not start in time") && self.is_running().await? {
                // Ours, still busy (e.g. crash recovery of a large cluster):
                // wait_ready gives it more time.
                tracing::warn!("PostgreSQL is taking long to start; waiting for it");
                self.started_here = true;
                return Ok(());
            }
            if self.is_running().await? {
                tracing::info!("another process started PostgreSQL at the same moment; reusing it");
                self.adopt_running_server().await;
                return Ok(());
            }
            if attempt >= START_ATTEMPTS {
                let tail = log_tail(&log).await;
                return Err(command_failed(&self.pg_ctl(), &args, &out)).with_context(|| {
                    format!(
                        "starting PostgreSQL on {} failed; last lines of {}:\n{tail}",
                        pgdata.display(),
                        log.display()
                    )
                });
            }
            tracing::warn!(attempt, "PostgreSQL did not start; retrying shortly");
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// Polls until the server accepts connections on its socket.
    async fn wait_ready(&self) -> Result<()> {
        let options = self.connect_options("postgres");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let err = match PgConnection::connect_with(&options).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    return Ok(());
                }
                Err(err) => err,
            };
            if Instant::now() >= deadline {
                let tail = log_tail(&self.log_path()).await;
                return Err(anyhow::Error::new(err)).with_context(|| {
                    format!(
                        "PostgreSQL on {} did not accept connections on {} within {}s; last lines of {}:\n{tail}",
                        self.pgdata().display(),
                        self.socket_dir.display(),
                        READY_TIMEOUT.as_secs(),
                        self.log_path().display()
                    )
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `pg_ctl stop -m fast`; succeeds if no server runs.
    async fn stop_server(&self) -> Result<()> {
        self.stop_server_with("fast").await
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

    /// `pg_ctl stop -m <mode>`; succeeds if no server runs.
    async fn stop_server_with(&self, mode: &str) -> Result<()> {
        if !self.is_running().await? {
            return Ok(());
        }
        let pgdata = self.pgdata();
        let args = [
            os("-D"),
            pgdata.clone().into_os_string(),
            os("-m"),
            os(mode),
            os("-w"),
            os("-t"),
            os("60"),
            os("stop"),
        ];
        tracing::info!(path = %pgdata.display(), "stopping PostgreSQL");
        let out = self
            .runner
            .run(&self.data_dir, &self.pg_ctl(), &args, PG_CTL_TIMEOUT, false)
            .await?;
        // A server that stopped between the status check and pg_ctl stop is
        // just as stopped.
        if out.status.success() || !self.is_running().await? {
            return Ok(());
        }
        let tail = log_tail(&self.log_path()).await;
        Err(command_failed(&self.pg_ctl(), &args, &out)).with_context(|| {
            format!(
                "stopping PostgreSQL on {}; last lines of {}:\n{tail}",
                pgdata.display(),
                self.log_path().display()
            )
        })
    }
}

/// Where the PostgreSQL server binaries are: `LEASEKEEPER_PG_BIN` if set,
/// else the highest `/usr/lib/postgresql/<N>/bin` containing initdb, pg_ctl
/// and postgres, else `pg_config --bindir`, else the folder of `initdb` on
/// `PATH`. Fails with an error that says what to install when none is found.
pub fn find_server_binaries() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("LEASEKEEPER_PG_BIN") {
        let dir = PathBuf::from(dir);
        if has_server_binaries(&dir) {
            return Ok(dir);
        }
        bail!(
            "LEASEKEEPER_PG_BIN={} does not contain the PostgreSQL server binaries (initdb, pg_ctl, postgres)",
            dir.display()
        );
    }

    // Debian and Ubuntu install each major version side by side.
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let best = entries
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| {
                let major: u32 = entry.file_name().to_str()?.parse().ok()?;
                let bin = entry.path().join("bin");
                has_server_binaries(&bin).then_some((major, bin))
            })
            .max_by_key(|(major, _)| *major);
        if let Some((_, bin)) = best {
            return Ok(bin);
        }
    }

    // pg_config answers instantly; this function is synchronous (it is also
    // called outside async code), so std::process is the right tool here.
    if let Ok(out) = std::process::Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        && out.status.success()
    {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has_server_binaries(&dir) {
            return Ok(dir);
        }
    }

    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_server_binaries(&dir) {
                return Ok(dir);
            }
        }
    }

    bail!(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found; install them with \
         `apt-get install -y postgresql` or set DATABASE_URL to use an existing server \
         (or LEASEKEEPER_PG_BIN to point at their folder)"
    )
}

/// Whether `dir` holds executable initdb, pg_ctl and postgres.
fn has_server_binaries(dir: &Path) -> bool {
    ["initdb", "pg_ctl", "postgres"].iter().all(|name| {
        std::fs::metadata(dir.join(name))
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// Who runs initdb and pg_ctl.
#[derive(Debug, Clone)]
enum Runner {
    /// This process's user, directly.
    CurrentUser,
    /// This process is root: the `postgres` system user via runuser.
    SystemUser {
        uid: nix::unistd::Uid,
        gid: nix::unistd::Gid,
    },
}

impl Runner {
    fn detect() -> Result<Self> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(Runner::CurrentUser);
        }
        let user = nix::unistd::User::from_name(SERVER_SYSTEM_USER)
            .with_context(|| format!("looking up the `{SERVER_SYSTEM_USER}` system user"))?
            .ok_or_else(|| {
                anyhow!(
                    "running as root, but PostgreSQL refuses to run as root and there is no \
                     `{SERVER_SYSTEM_USER}` system user to run it as; install the `postgresql` \
                     package (it creates that user), run leasekeeper as a normal user, or set \
                     DATABASE_URL to use an existing server"
                )
            })?;
        Ok(Runner::SystemUser {
            uid: user.uid,
            gid: user.gid,
        })
    }

    /// Runs `program args` (as the server user when root) in `cwd` and returns
    /// its output whatever its exit status; fails only if it cannot run or
    /// exceeds `timeout`. `detach` puts it in its own process group, so that a
    /// Ctrl-C meant for leasekeeper does not hit a server it starts.
    async fn run(
        &self,
        cwd: &Path,
        program: &Path,
        args: &[OsString],
        timeout: Duration,
        detach: bool,
    ) -> Result<Output> {
        let mut cmd = match self {
            Runner::CurrentUser => Command::new(program),
            Runner::SystemUser { .. } => {
                let mut cmd = Command::new(runuser_path());
                cmd.args(["-u", SERVER_SYSTEM_USER, "--"]).arg(program);
                cmd
            }
        };
        cmd.args(args)
            // The server user may not be able to enter the caller's working
            // folder (e.g. /root); the data folder is always reachable.
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if detach {
            cmd.process_group(0);
        }
        let shown = show_command(program, args);
        match tokio::time::timeout(timeout, cmd.output()).await {
            Ok(result) => result.with_context(|| format!("running `{shown}`")),
            Err(_) => bail!("`{shown}` did not finish within {}s", timeout.as_secs()),
        }
    }

    /// The uid owning server files (None: whoever this process is).
    fn owner(&self) -> Option<(nix::unistd::Uid, nix::unistd::Gid)> {
        match self {
            Runner::CurrentUser => None,
            Runner::SystemUser { uid, gid } => Some((*uid, *gid)),
        }
    }
}

fn runuser_path() -> &'static str {
    // Root's PATH does not always include /usr/sbin (e.g. under `su`).
    if Path::new("/usr/sbin/runuser").exists() {
        "/usr/sbin/runuser"
    } else {
        "runuser"
    }
}

/// Creates the data folder (mode 0700) if needed, hands it to the server
/// user when root, and checks that user can reach it. Returns its canonical
/// path.
async fn prepare_data_dir(data_dir: &Path, runner: &Runner) -> Result<PathBuf> {
    if !tokio::fs::try_exists(data_dir).await.unwrap_or(false) {
        // Parents get the default mode: a 0700 root-owned parent would lock
        // the server user out.
        if let Some(parent) = data_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(parent)
                .await
                .with_context(|| format!("creating folder {}", parent.display()))?;
        }
        let mut builder = std::fs::DirBuilder::new();
        builder.mode(0o700);
        match builder.create(data_dir) {
            Ok(()) => {}
            // Another process created it at the same moment.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("creating data folder {}", data_dir.display()));
            }
        }
    }
    let data_dir = tokio::fs::canonicalize(data_dir)
        .await
        .with_context(|| format!("resolving data folder {}", data_dir.display()))?;

    if let Some((uid, gid)) = runner.owner() {
        let meta = tokio::fs::metadata(&data_dir)
            .await
            .with_context(|| format!("reading {}", data_dir.display()))?;
        if meta.uid() != uid.as_raw() {
            std::os::unix::fs::chown(&data_dir, Some(uid.as_raw()), Some(gid.as_raw()))
                .with_context(|| {
                    format!(
                        "handing data folder {} to the `{SERVER_SYSTEM_USER}` user (chown)",
                        data_dir.display()
                    )
                })?;
        }
        check_server_user_access(&data_dir, runner).await?;
    }
    Ok(data_dir)
}

/// Fails with a clear message if the server user cannot enter and write the
/// data folder (typically because an ancestor such as /root is private).
async fn check_server_user_access(data_dir: &Path, runner: &Runner) -> Result<()> {
    // Asking the kernel, as that user, is the only exact answer (ACLs,
    // group membership); mode bits below only help name the culprit.
    let args = [
        os("-w"),
        data_dir.as_os_str().to_owned(),
        os("-a"),
        os("-x"),
        data_dir.as_os_str().to_owned(),
    ];
    let test = if Path::new("/usr/bin/test").exists() {
        "/usr/bin/test"
    } else {
        "test"
    };
    let out = runner
        .run(
            Path::new("/"),
            Path::new(test),
            &args,
            PG_CTL_TIMEOUT,
            false,
        )
        .await?;
    if out.status.success() {
        return Ok(());
    }
    let blocker = data_dir
        .ancestors()
        .skip(1)
        .find(|dir| {
            std::fs::metadata(dir)
                .map(|m| m.permissions().mode() & 0o001 == 0)
                .unwrap_or(true)
        })
        .map(|dir| format!(" ({} is not traversable by other users)", dir.display()))
        .unwrap_or_default();
    bail!(
        "the `{SERVER_SYSTEM_USER}` user, which runs PostgreSQL because this process is root, \
         cannot reach the data folder {}{blocker}; set LEASEKEEPER_DATA_DIR to a folder it can \
         reach (e.g. under /var/lib or /srv), or set DATABASE_URL to use an existing server",
        data_dir.display()
    )
}

/// The socket folder: the data folder itself, unless the socket path would
/// be too long for the kernel; then a short folder under /tmp named from a
/// hash of the data folder (stable across runs and Rust versions).
fn choose_socket_dir(data_dir: &Path, runner: &Runner) -> Result<PathBuf> {
    let socket_name_len = format!("/.s.PGSQL.{PORT}").len();
    if data_dir.as_os_str().len() + socket_name_len <= MAX_SOCKET_PATH {
        return Ok(data_dir.to_path_buf());
    }
    let dir = PathBuf::from(format!(
        "/tmp/leasekeeper-{:016x}",
        fnv1a64(data_dir.as_os_str().as_encoded_bytes())
    ));
    tracing::info!(
        data_dir = %data_dir.display(),
        socket_dir = %dir.display(),
        "the data folder path is too long for a unix socket; using a short socket folder instead"
    );
    let mut builder = std::fs::DirBuilder::new();
    builder.mode(0o700);
    match builder.create(&dir) {
        Ok(()) => {
            if let Some((uid, gid)) = runner.owner() {
                std::os::unix::fs::chown(&dir, Some(uid.as_raw()), Some(gid.as_raw()))
                    .with_context(|| {
                        format!(
                            "handing socket folder {} to the `{SERVER_SYSTEM_USER}` user",
                            dir.display()
                        )
                    })?;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(e).with_context(|| format!("creating socket folder {}", dir.display()));
        }
    }
    // /tmp is shared: refuse a folder (or symlink) someone else planted there.
    let meta = std::fs::symlink_metadata(&dir)
        .with_context(|| format!("reading socket folder {}", dir.display()))?;
    let expected_uid = runner
        .owner()
        .map(|(uid, _)| uid.as_raw())
        .unwrap_or_else(|| nix::unistd::geteuid().as_raw());
    if !meta.is_dir() || meta.uid() != expected_uid {
        bail!(
            "socket folder {} exists but is not a folder owned by the server user; remove it or use a shorter LEASEKEEPER_DATA_DIR",
            dir.display()
        );
    }
    Ok(dir)
}

/// An exclusive lock on `<data_dir>/.leasekeeper.lock`, released on drop
/// (when the file closes), also if the process dies.
struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    async fn acquire(data_dir: &Path) -> Result<Self> {
        let path = data_dir.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening lock file {}", path.display()))?;
        let deadline = Instant::now() + LOCK_TIMEOUT;
        let mut told = false;
        loop {
            // try_lock and sleep, rather than a blocking lock, keep the async
            // runtime's threads free while another process runs initdb.
            match file.try_lock() {
                Ok(()) => return Ok(DirLock { _file: file }),
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("locking {}", path.display()));
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "another process has held {} for {}s (starting or stopping PostgreSQL there); giving up",
                    path.display(),
                    LOCK_TIMEOUT.as_secs()
                );
            }
            if !told {
                tracing::info!(path = %path.display(), "another process is starting or stopping PostgreSQL on this folder; waiting");
                told = true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Whether the process named on the first line of a PostgreSQL lock file
/// (postmaster.pid, .s.PGSQL.<port>.lock) is a zombie: dead, not yet reaped.
async fn lock_file_owner_is_zombie(lock_file: &Path) -> bool {
    let Ok(text) = tokio::fs::read_to_string(lock_file).await else {
        return false;
    };
    // A standalone backend writes its pid negated.
    let Some(pid) = text
        .lines()
        .next()
        .and_then(|line| line.trim().parse::<i64>().ok())
        .map(i64::unsigned_abs)
        .filter(|pid| *pid > 0)
    else {
        return false;
    };
    let Ok(stat) = tokio::fs::read_to_string(format!("/proc/{pid}/stat")).await else {
        return false;
    };
    // "<pid> (<comm>) <state> ...": comm may hold spaces and parentheses, so
    // the state is the first field after the last ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .is_some_and(|state| state == 'Z' || state == 'X')
}

/// A cluster is complete once `PG_VERSION` exists (initdb ran to the end:
/// see [`PGDATA_INIT`]).
async fn is_complete_cluster(pgdata: &Path) -> Result<bool> {
    let marker = pgdata.join("PG_VERSION");
    tokio::fs::try_exists(&marker)
        .await
        .with_context(|| format!("checking {}", marker.display()))
}

async fn remove_dir_all(path: &Path) -> Result<()> {
    tokio::fs::remove_dir_all(path)
        .await
        .with_context(|| format!("removing {}", path.display()))
}

/// `current` with leasekeeper's settings block replaced (or appended).
/// Later lines win in postgresql.conf, so the block goes at the end.
fn with_settings_block(current: &str, socket_dir: &Path, port: u16) -> String {
    let mut out = String::with_capacity(current.len() + 512);
    let mut inside = false;
    for line in current.lines() {
        if line == CONF_BEGIN {
            inside = true;
        } else if line == CONF_END {
            inside = false;
        } else if !inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    let socket_dir = socket_dir.to_string_lossy().replace('\'', "''");
    // `let _ =`: writing to a String cannot fail.
    let _ = write!(
        out,
        "{CONF_BEGIN}\n\
         listen_addresses = ''\n\
         unix_socket_directories = '{socket_dir}'\n\
         port = {port}\n\
         max_connections = 300\n\
         shared_buffers = 128MB\n\
         # Durable commits: benchmarks measure real commit costs.\n\
         fsync = on\n\
         synchronous_commit = on\n\
         {CONF_END}\n"
    );
    out
}

/// Last lines of the server log, for error messages.
async fn log_tail(log: &Path) -> String {
    match tokio::fs::read(log).await {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(30);
            lines[start..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", log.display()),
    }
}

/// An error describing a command that exited unsuccessfully.
fn command_failed(program: &Path, args: &[OsString], out: &Output) -> anyhow::Error {
    anyhow!(
        "`{}` exited with {}:\n{}{}",
        show_command(program, args),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim_end(),
        {
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stdout = stdout.trim_end();
            if stdout.is_empty() {
                String::new()
            } else {
                format!("\n{stdout}")
            }
        }
    )
}

fn show_command(program: &Path, args: &[OsString]) -> String {
    let mut shown = program.display().to_string();
    for arg in args {
        shown.push(' ');
        shown.push_str(&arg.to_string_lossy());
    }
    shown
}

fn os(s: &str) -> OsString {
    OsStr::new(s).to_owned()
}

/// Double-quotes an SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Percent-encodes `s` for a URL; `keep_slash` leaves `/` readable in paths.
fn percent_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// FNV-1a, 64 bits: a tiny hash whose value never changes between builds
/// (std's DefaultHasher makes no such promise), so every process derives
/// the same socket folder from the same data folder.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_block_is_replaced_not_duplicated() {
        let base = "max_connections = 100\n#fsync = on\n";
        let once = with_settings_block(base, Path::new("/a/b"), 5432);
        assert!(once.starts_with(base));
        assert!(once.contains("unix_socket_directories = '/a/b'"));
        assert!(once.contains("listen_addresses = ''"));
        let twice = with_settings_block(&once, Path::new("/c/it's"), 5432);
        assert_eq!(twice.matches(CONF_BEGIN).count(), 1);
        assert!(twice.contains("unix_socket_directories = '/c/it''s'"));
        assert!(!twice.contains("/a/b"));
        assert_eq!(
            with_settings_block(&twice, Path::new("/c/it's"), 5432),
            twice
        );
    }

    #[test]
    fn quoting_and_encoding() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(percent_encode("/x y/z", true), "/x%20y/z");
        assert_eq!(percent_encode("a/b", false), "a%2Fb");
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}

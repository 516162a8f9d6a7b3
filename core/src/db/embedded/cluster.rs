//! The cluster's lifecycle, step by step: initdb into a staging folder,
//! leasekeeper's settings block in `postgresql.conf`, `pg_ctl` status, start
//! and stop, readiness, and the debris a crash leaves (zombie lock files, a
//! log that only grows).

use super::runner::{command_failed, os};
use super::{
    CONF_BEGIN, CONF_END, EmbeddedPostgres, INITDB_TIMEOUT, MAX_LOG_BYTES, PG_CTL_TIMEOUT, PGDATA,
    PGDATA_INIT, READY_TIMEOUT, SERVER_LOG, START_ATTEMPTS, SUPERUSER,
};
use anyhow::{Context, Result};
use sqlx::Connection;
use sqlx::postgres::PgConnection;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

impl EmbeddedPostgres {
    pub(super) fn pgdata(&self) -> PathBuf {
        self.data_dir.join(PGDATA)
    }

    pub(super) fn log_path(&self) -> PathBuf {
        self.data_dir.join(SERVER_LOG)
    }

    pub(super) fn pg_ctl(&self) -> PathBuf {
        self.bin_dir.join("pg_ctl")
    }

    /// Whether a server runs on the cluster (`pg_ctl status`: 0 = running,
    /// 3 = not running, 4 = no usable data directory).
    pub(super) async fn is_running(&self) -> Result<bool> {
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
    pub(super) async fn adopt_running_server(&mut self) {
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
    pub(super) async fn remove_zombie_lock_files(&self) -> Result<()> {
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
    pub(super) async fn rotate_log(&self) -> Result<()> {
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
    pub(super) async fn ensure_cluster(&self) -> Result<()> {
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
    pub(super) async fn write_settings(&self, cluster: &Path) -> Result<()> {
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
    pub(super) async fn start_server(&mut self) -> Result<()> {
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
    pub(super) async fn wait_ready(&self) -> Result<()> {
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
    pub(super) async fn stop_server(&self) -> Result<()> {
        self.stop_server_with("fast").await
    }

    /// `pg_ctl stop -m <mode>`; succeeds if no server runs.
    pub(super) async fn stop_server_with(&self, mode: &str) -> Result<()> {
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
}

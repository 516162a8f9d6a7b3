//! The data folder: created with the right owner and mode, reachable by
//! the server user, a unix socket folder short enough for the kernel, and
//! a lock file that serialises start and stop between processes.

use super::runner::{Runner, os};
use super::{LOCK_FILE, LOCK_TIMEOUT, MAX_SOCKET_PATH, PG_CTL_TIMEOUT, PORT, SERVER_SYSTEM_USER};
use anyhow::{Context, Result, bail};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Creates the data folder (mode 0700) if needed, makes an existing one
/// 0700 too, hands it to the server user when root, and checks that user
/// can reach it. Returns its canonical path.
pub(super) async fn prepare_data_dir(data_dir: &Path, runner: &Runner) -> Result<PathBuf> {
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
    restrict_to_owner(&data_dir)?;

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

/// Makes the data folder 0700 if other users could enter or list it.
///
/// The cluster's unix socket lives in it and trusts every connection that
/// reaches it (no password: the folder's mode is the only lock), so a
/// folder left 0755, made by hand or by an older version, would let every
/// local user in as the superuser. Checked whenever the folder is used,
/// not only when created.
fn restrict_to_owner(data_dir: &Path) -> Result<()> {
    let mode = std::fs::metadata(data_dir)
        .with_context(|| format!("reading data folder {}", data_dir.display()))?
        .permissions()
        .mode()
        & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700)).with_context(
        || {
            format!(
                "data folder {} is open to other users (mode {mode:o}) and cannot be made 0700 (chmod); \
                 make it private or set LEASEKEEPER_DATA_DIR to a folder of this user's",
                data_dir.display()
            )
        },
    )?;
    tracing::warn!(
        data_dir = %data_dir.display(),
        was = %format!("{mode:o}"),
        "the data folder was open to other users (its socket admits anyone who can reach it); made it 0700"
    );
    Ok(())
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
pub(super) fn choose_socket_dir(data_dir: &Path, runner: &Runner) -> Result<PathBuf> {
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
pub(super) struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    pub(super) async fn acquire(data_dir: &Path) -> Result<Self> {
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

    #[tokio::test]
    async fn an_existing_open_data_folder_is_made_0700_and_a_new_one_is_0700() {
        let base = std::env::temp_dir().join(format!(
            "leasekeeper-folder-mode-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        let open = base.join("open");
        std::fs::create_dir_all(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mode = |dir: &Path| std::fs::metadata(dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&open), 0o755);

        let prepared = prepare_data_dir(&open, &Runner::CurrentUser).await.unwrap();
        assert_eq!(mode(&prepared), 0o700, "an existing 0755 folder is closed");

        let fresh = base.join("fresh");
        let prepared = prepare_data_dir(&fresh, &Runner::CurrentUser)
            .await
            .unwrap();
        assert_eq!(mode(&prepared), 0o700, "a new folder is 0700");

        // Already private: left as it is (0700 stays, nothing else changes).
        let prepared = prepare_data_dir(&open, &Runner::CurrentUser).await.unwrap();
        assert_eq!(mode(&prepared), 0o700);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}

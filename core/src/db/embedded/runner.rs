//! Running the server commands: where the PostgreSQL binaries are, and as
//! whom they run (this user, or the `postgres` system user through
//! `runuser` when this process is root).

use super::SERVER_SYSTEM_USER;
use anyhow::{Context, Result, anyhow, bail};
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;
use tokio::process::Command;

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
pub(super) enum Runner {
    /// This process's user, directly.
    CurrentUser,
    /// This process is root: the `postgres` system user via runuser.
    SystemUser {
        uid: nix::unistd::Uid,
        gid: nix::unistd::Gid,
    },
}

impl Runner {
    pub(super) fn detect() -> Result<Self> {
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
    pub(super) async fn run(
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
    pub(super) fn owner(&self) -> Option<(nix::unistd::Uid, nix::unistd::Gid)> {
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

/// An error describing a command that exited unsuccessfully.
pub(super) fn command_failed(program: &Path, args: &[OsString], out: &Output) -> anyhow::Error {
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

pub(super) fn os(s: &str) -> OsString {
    OsStr::new(s).to_owned()
}

//! The cluster's processes: found by walking `/proc`, stopped by signal,
//! leftovers of an interrupted run included.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::path::Path;
use std::time::Duration;

/// Kills what an earlier run left running in `dir` (a harness killed
/// before it could stop its cluster): every process whose command line
/// names the folder (etcd, Patroni, HAProxy, and PostgreSQL, whose config
/// file lies in it).
pub(super) fn kill_leftovers(dir: &Path) {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id() as i32;
    for pid in processes() {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if pid != me && String::from_utf8_lossy(&cmdline).contains(&needle) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    // Give the kernel a moment to release their ports and shared memory.
    std::thread::sleep(Duration::from_millis(300));
}

/// The processes whose parent is `parent`.
pub(super) fn children_of(parent: Pid) -> Vec<Pid> {
    processes()
        .filter(|pid| {
            // `pid (comm) state ppid …`; comm may hold spaces: split after ')'.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<i32>().ok()
                })
                == Some(parent.as_raw())
        })
        .map(Pid::from_raw)
        .collect()
}

/// Every process's pid, from `/proc`.
pub(super) fn processes() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
}

//! leasekeeper's tools, apart from the dashboard they drive: the local
//! cluster of the failover demo ([`cluster`]), the fault harness
//! ([`fault`], `leasekeeper-tools chaos`) and the benchmarks ([`mod@bench`]).
//!
//! They start real `leasekeeper` processes (instances, task workers) as
//! [`dashboard_command`]: this same binary, which carries the dashboard's
//! command line, so a harness never runs another build's server.

pub mod bench;
pub mod cli;
pub mod cluster;
pub mod fault;
pub mod testing;

/// The first argument that hands the rest of the command line to the
/// dashboard's own interface ([`leasekeeper::cli::main`]).
pub const DASHBOARD: &str = "dashboard";

/// A command that runs `leasekeeper` (add `serve …` or `worker …`) from
/// this very binary: `<this executable> dashboard …`.
pub fn dashboard_command() -> anyhow::Result<tokio::process::Command> {
    use anyhow::Context;
    let exe = std::env::current_exe().context("finding this program's path")?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg(DASHBOARD);
    Ok(cmd)
}

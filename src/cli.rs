//! Command-line interface: subcommands and the settings flags they share.
//! The tools (`leasekeeper-tools`: bench, chaos, cluster) run this same
//! interface in their own binary to start instances and workers, so the
//! processes they start are always of their own build.

use crate::settings::{SettingArgs, Settings};
use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::process::ExitCode;

/// leasekeeper: time-bound leases in PostgreSQL, made visible.
#[derive(Parser, Debug)]
#[command(name = "leasekeeper", version, about)]
pub struct Cli {
    /// What to do; `serve` when omitted.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Settings that override Leptos.toml.
    #[command(flatten)]
    pub settings: SettingArgs,
}

/// The subcommands.
#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Serve the dashboard and the REST API (the default).
    Serve,
    /// Run one task worker as a separate process, over the REST API of an
    /// instance, until SIGINT or SIGTERM. It presents the worker token
    /// (LEASEKEEPER_WORKER_TOKEN, or --token-file; the admin token when only
    /// that is set) and exits with status 1 when the server refuses it.
    Worker {
        /// The instance to work for: an http:// or https:// URL, e.g.
        /// http://127.0.0.1:3000.
        #[arg(long)]
        server: String,
        /// Read the token to present from this file (its contents, trimmed:
        /// 16-256 printable ASCII characters) instead of
        /// LEASEKEEPER_WORKER_TOKEN; keeps it out of the environment.
        #[arg(long, value_name = "PATH")]
        token_file: Option<std::path::PathBuf>,
        /// The worker's name (its holder name in every claim); generated when omitted.
        #[arg(long)]
        id: Option<String>,
        /// Append every claim, heartbeat, completion and failure report with
        /// its outcome to this file, one JSON line each (fault testing).
        #[arg(long)]
        history: Option<std::path::PathBuf>,
        /// Fault injection: ignore the local deadline and refused heartbeats,
        /// so a paused worker still sends its stale completion and only the
        /// queue's fencing stops it. Never use it for real work.
        #[arg(long)]
        trust_claims: bool,
    },
    /// Manage the embedded PostgreSQL cluster.
    Db {
        /// What to do with it.
        #[command(subcommand)]
        action: DbAction,
    },
}

/// Actions on the embedded cluster.
#[derive(Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbAction {
    /// Start it (if not running), run migrations, print its URL, and leave it running.
    Start,
    /// Stop it.
    Stop,
}

/// Parses `args` (the program name first) and runs the subcommand: the
/// whole of `leasekeeper`'s `main`, but for logging, which the caller sets
/// up. Exit code 2 for settings that do not parse or validate.
pub async fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli = Cli::parse_from(args);
    let settings = match Settings::load(&cli.settings) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("leasekeeper: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => crate::server::serve(settings).await,
        Command::Db { action } => db_command(settings, action).await,
        Command::Worker {
            server,
            token_file,
            id,
            history,
            trust_claims,
        } => {
            let faults = crate::worker::process::FaultOptions {
                history,
                trust_claims,
            };
            crate::worker::process::run(settings, &server, id, token_file.as_deref(), faults).await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasekeeper: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `leasekeeper db start|stop`: manage the embedded cluster by hand, e.g. to
/// share one cluster between several instances.
async fn db_command(settings: Settings, action: DbAction) -> anyhow::Result<()> {
    match action {
        DbAction::Start => {
            let db =
                leasekeeper_core::db::Database::open(None, &settings.data_dir, &settings.schema)
                    .await?;
            let url = db
                .embedded
                .as_ref()
                .map(|c| c.url(leasekeeper_core::db::EMBEDDED_DATABASE))
                .unwrap_or_default();
            db.pool.close().await;
            // Leave the cluster running: that is the point of `db start`.
            println!("{url}");
            Ok(())
        }
        DbAction::Stop => {
            leasekeeper_core::db::embedded::EmbeddedPostgres::stop(&settings.data_dir).await
        }
    }
}

//! Command-line interface: subcommands and the settings flags they share.

use crate::settings::SettingArgs;
use clap::{Parser, Subcommand};

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
    /// instance, until SIGINT or SIGTERM.
    Worker {
        /// The instance to work for, e.g. http://127.0.0.1:3000.
        #[arg(long)]
        server: String,
        /// The worker's name (its holder name in every claim); generated when omitted.
        #[arg(long)]
        id: Option<String>,
    },
    /// Manage the embedded PostgreSQL cluster.
    Db {
        /// What to do with it.
        #[command(subcommand)]
        action: DbAction,
    },
    /// Run several instances on consecutive ports against one database (the
    /// failover demo). Ctrl-C stops them all.
    Cluster {
        /// How many instances.
        #[arg(short = 'n', long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=32))]
        instances: u16,
        /// Port of the first instance; the others follow.
        #[arg(long, default_value_t = 3010)]
        base_port: u16,
    },
    /// Measure speed targets against baselines run alongside (build with
    /// --release for figures worth comparing). Without a subcommand: the
    /// queue suite (throughput, latency, depth, lease operations, failover,
    /// against the raw SQL, the original design and graphile-worker).
    Bench {
        /// Another benchmark instead of the queue suite.
        #[command(subcommand)]
        what: Option<BenchWhat>,
        /// Fewer and shorter samples: under two minutes.
        #[arg(long)]
        quick: bool,
        /// Also write the results to this file as a flat JSON object.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
}

/// The benchmarks.
#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum BenchWhat {
    /// Push latency (commit to page data, idle and under 1,000 workers'
    /// worth of events) and server-side render time of the tasks page with
    /// 1,000 and 1,000,000 tasks.
    Dashboard {
        /// Fewer samples: well under a minute.
        #[arg(long)]
        quick: bool,
        /// Also write the results to this file as a flat JSON object.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
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

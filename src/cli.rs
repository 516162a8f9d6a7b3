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
    /// Run the fault harness: real worker and server processes on a private
    /// PostgreSQL cluster, with kill -9, SIGSTOP past the TTL, generator
    /// holder kills, PostgreSQL crash restarts, dropped answers after commit
    /// and barrier races; then check the invariants on the history and the
    /// database. Exits non-zero when any invariant is broken.
    Chaos(ChaosArgs),
    /// Measure speed targets against baselines run alongside (build with
    /// --release for figures worth comparing). Without a subcommand: the
    /// queue suite (throughput, the worker runtime and its scale-out,
    /// latency, depth, history, lease operations, failover, against
    /// pgbench's ceilings, the original design and graphile-worker).
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
        /// Also write SVG charts of the results into this directory (the
        /// scale-out curve; ours against the baselines).
        #[arg(long)]
        charts: Option<std::path::PathBuf>,
    },
    /// One worker runtime with a no-op handler, on --database-url and
    /// --schema, until SIGTERM or for --seconds: the benchmark's scale-out
    /// phase starts several. Not for use by hand.
    #[command(hide = true)]
    BenchRuntime {
        /// Workers (tasks at once) of the runtime.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1000))]
        concurrency: u16,
        /// Stop after this many seconds at the latest.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// The runtime's instance id.
        #[arg(long, default_value = "bench-runtime")]
        id: String,
    },
}

/// The fault harness's runs.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct ChaosArgs {
    /// One 45-second round with a fault every 3-5 s (command 2 runs this).
    #[arg(long)]
    pub quick: bool,
    /// Rounds (each on a fresh database); default 5, or 1 with --quick.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: Option<u32>,
    /// Seconds of faults per round; default 120, or 45 with --quick.
    #[arg(long, value_parser = clap::value_parser!(u64).range(5..=3600))]
    pub seconds: Option<u64>,
    /// Where the harness's own PostgreSQL cluster lives (it restarts it).
    #[arg(long, default_value = "target/leasekeeper-chaos-db")]
    pub cluster_dir: std::path::PathBuf,
    /// Also write the report to this file as JSON.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Seed for the fault schedule (random when omitted; printed either way).
    #[arg(long)]
    pub seed: Option<u64>,
    /// The fault kinds to inject, in a shuffled cycle (default: the five
    /// kinds of the single-server harness). `pg_failover` and `clock_skew`
    /// run the round on a highly available cluster (Patroni, etcd and
    /// HAProxy) instead of the single embedded server.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub faults: Vec<crate::fault::FaultKind>,
    /// Replication of the highly available cluster: `sync` (the supported
    /// configuration) or `async` (to show what it breaks).
    #[arg(long, value_enum, default_value_t = crate::fault::Replication::Sync)]
    pub replication: crate::fault::Replication,
    /// How far the promoted standby's clock runs from the real one in a
    /// `clock_skew` fault, in milliseconds: ahead or behind at random (a
    /// negative value swaps the two, nothing more). At most 5 s
    /// either way: the checks compare `lease_events` times written by both
    /// clocks, which holds only while the skew is shorter than the failover.
    #[arg(long, default_value_t = 150, allow_hyphen_values = true,
          value_parser = clap::value_parser!(i64).range(-5_000..=5_000))]
    pub skew_ms: i64,
    /// The lease TTL of every process of the harness, in seconds (default
    /// 2); pauses, partitions and recovery bounds follow it. A TTL longer
    /// than a failover (about 5 s) keeps leases alive across it, so the
    /// promoted standby's clock judges leases the old primary granted.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=60))]
    pub ttl_secs: Option<u64>,
    /// Where the highly available cluster lives (etcd, two PostgreSQL nodes).
    #[arg(long, default_value = "target/leasekeeper-ha-db")]
    pub ha_dir: std::path::PathBuf,
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
    /// Push --tasks tasks (a million by default) through the worker runtime
    /// with the maintenance job pruning everything older than
    /// --prune-older-than-secs, then the same without retention: table
    /// sizes and throughput over time.
    Retention {
        /// Tasks pushed through each run.
        #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1000..))]
        tasks: u64,
        /// Retention of the pruning run, in seconds (not the serve setting
        /// --retention-secs, which must outlast two lease TTLs).
        #[arg(long, default_value_t = 20)]
        prune_older_than_secs: u64,
        /// Maintenance interval of the pruning run, in seconds.
        #[arg(long, default_value_t = 5)]
        prune_every_secs: u64,
        /// Skip the baseline run without retention.
        #[arg(long)]
        no_baseline: bool,
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

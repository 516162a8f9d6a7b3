//! `leasekeeper-tools`: the failover demo's local cluster, the fault
//! harness and the benchmarks, with the settings flags of the dashboard.

use clap::{Parser, Subcommand};
use leasekeeper::settings::SettingArgs;

/// leasekeeper's tools: a local cluster, the fault harness, the benchmarks.
#[derive(Parser, Debug)]
#[command(name = "leasekeeper-tools", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// Settings that override Leptos.toml (those of `leasekeeper`).
    #[command(flatten)]
    pub settings: SettingArgs,
}

/// The subcommands.
#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum Command {
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
    Chaos(crate::fault::ChaosArgs),
    /// Measure speed targets against baselines run alongside (build with
    /// --release for figures worth comparing). Without a subcommand: the
    /// queue suite (throughput, the worker runtime and its scale-out,
    /// latency, depth, history, lease operations, failover, against
    /// pgbench's ceilings, the original design, graphile-worker and Awa;
    /// bulk insert against both).
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
        /// Claims waiting per worker at most (the runtime's default if not
        /// given; not the dashboard's --prefetch setting).
        #[arg(long)]
        runtime_prefetch: Option<usize>,
        /// The completer's linger, in microseconds (the runtime's default if not given).
        #[arg(long)]
        runtime_linger_us: Option<u64>,
        /// The most completions one statement writes (the runtime's default if not given).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        runtime_batch_max: Option<u64>,
    },
}

/// The benchmarks.
#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
pub enum BenchWhat {
    /// Only the worker runtime's throughput (one instance, 16 workers,
    /// no-op handler): `fleet_w16` with its defaults and `fleet_best_w16`
    /// with the fastest settings it offers (prefetch, batching), named in
    /// the results.
    Fleet {
        /// Shorter runs.
        #[arg(long)]
        quick: bool,
        /// Also write the results to this file as a flat JSON object.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// Push latency (commit to page data, idle and under 1,000 workers'
    /// worth of events), push to pixel (commit to the painted frame in
    /// Chromium, idle and under 1,000 task events a second) and
    /// server-side render time of the tasks page with 1,000 and 1,000,000
    /// tasks.
    Dashboard {
        /// Fewer samples: well under a minute.
        #[arg(long)]
        quick: bool,
        /// Only push to pixel (needs `cargo leptos build` first): no push
        /// latency, no million tasks.
        #[arg(long)]
        pixel_only: bool,
        /// Also write the results to this file as a flat JSON object.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// The tuning pass: each contestant (the worker runtime, graphile-worker,
    /// Awa) through its sweep of settings, one short round each by the
    /// race's protocol; prints every candidate's rate and each
    /// contestant's winner (the settings `bench` then runs as its
    /// `*_best_w16`).
    Tune {
        /// Shorter rounds.
        #[arg(long)]
        quick: bool,
        /// Only this contestant's sweep: ours, graphile or awa.
        #[arg(long, value_parser = ["ours", "graphile", "awa"])]
        only: Option<String>,
        /// Also write the results to this file as JSON.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// What a task's attempt and history rows cost: our best settings as
    /// they are and with the tasks trigger off (an experiment: no
    /// deployment can turn it off), against graphile-worker's best, in one
    /// race by its protocol.
    Floor {
        /// Shorter rounds.
        #[arg(long)]
        quick: bool,
        /// Also write the results to this file as a flat JSON object.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// What limits cost (issue 39): the runtime with its defaults
    /// (`fleet_w16`), the same on a queue with `max_started_per_key` 5 and
    /// 1 over 100 keys, every key busy (`fleet_w16_keyed`,
    /// `fleet_w16_keyed_one`), and the same held to a fleet-wide rate
    /// (`fleet_w16_rate`), in one race by its protocol.
    Limits {
        /// Shorter rounds.
        #[arg(long)]
        quick: bool,
        /// Also write the results to this file as a flat JSON object.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// Only the peers' phases of the queue suite, with the same keys:
    /// graphile-worker and Awa at concurrency 16 (defaults and best
    /// settings) and the bulk inserts (enqueue_many, graphile-worker's
    /// addJobs, Awa's COPY).
    Peers {
        /// Fewer jobs: a few minutes.
        #[arg(long)]
        quick: bool,
        /// Only the bulk inserts (a minute): no fleets.
        #[arg(long)]
        bulk_only: bool,
        /// Also write the results to this file as a flat JSON object.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// Only the rescue phase: `kill -9` of a runtime process holding
    /// claims at the default TTL, --kills times; the time from each kill
    /// to each claim's takeover by an idle runtime process elsewhere.
    Rescue {
        /// How many kills.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=1000))]
        kills: u16,
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

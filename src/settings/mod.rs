//! The program's settings: `Leptos.toml` at the repository root, overridden
//! by environment variables, overridden by command-line flags.
//!
//! All three sources go through one parser, so a bad value gets the same
//! one-line error, naming the setting, wherever it came from.
//!
//! `keys.rs` names every setting; `sources.rs` reads the file, the
//! environment and the flags, and parses values.

mod exposure;
mod keys;
mod secret;
mod sources;
#[cfg(test)]
mod tests;

pub use exposure::Exposure;
pub use secret::Secret;
pub use sources::{DEFAULT_FILE, FILE_SECTION};

use clap::Args;
use keys::*;
use leasekeeper_core::db::Schema;
use sources::{Sources, boolean, count, host_names, probability, read_file_values, seconds, token};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Settings given on the command line or in the environment (flag wins).
/// Every field is optional: what is missing comes from `Leptos.toml`, then
/// from the built-in default.
#[derive(Args, Clone, Default)]
pub struct SettingArgs {
    /// The settings file.
    #[arg(long, global = true, env = "LEASEKEEPER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on, host:port.
    #[arg(long = "addr", global = true, env = "LEPTOS_SITE_ADDR")]
    pub site_addr: Option<String>,
    /// PostgreSQL URL; without it the embedded local cluster is used.
    #[arg(long, global = true, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// What stands between this server and PostgreSQL: `none` (directly
    /// connected, or a pooler in session mode) or `transaction` (PgBouncer
    /// in transaction mode).
    #[arg(long, global = true, env = "LEASEKEEPER_POOLER")]
    pub pooler: Option<String>,
    /// With `--pooler transaction`: the same database directly, for the
    /// liveness session and LISTEN; without it, liveness is off.
    #[arg(long, global = true, env = "LEASEKEEPER_DIRECT_DATABASE_URL")]
    pub direct_database_url: Option<String>,
    /// Folder of the embedded PostgreSQL cluster.
    #[arg(long, global = true, env = "LEASEKEEPER_DATA_DIR")]
    pub data_dir: Option<String>,
    /// PostgreSQL schema of leasekeeper's tables (default leasekeeper).
    #[arg(long, global = true, env = "LEASEKEEPER_SCHEMA")]
    pub schema: Option<String>,
    /// Lease TTL in seconds (fractions allowed).
    #[arg(long, global = true, env = "LEASEKEEPER_LEASE_TTL_SECS")]
    pub lease_ttl_secs: Option<String>,
    /// How often held leases are renewed, in seconds (default: TTL / 3).
    #[arg(long, global = true, env = "LEASEKEEPER_RENEW_INTERVAL_SECS")]
    pub renew_interval_secs: Option<String>,
    /// How often workers heartbeat their task, in seconds (default: TTL / 3).
    #[arg(long, global = true, env = "LEASEKEEPER_HEARTBEAT_INTERVAL_SECS")]
    pub heartbeat_interval_secs: Option<String>,
    /// How often the generator inserts a task, in seconds.
    #[arg(long, global = true, env = "LEASEKEEPER_GENERATOR_INTERVAL_SECS")]
    pub generator_interval_secs: Option<String>,
    /// Generated tasks sleep 1 to this many seconds (default 60).
    #[arg(long, global = true, env = "LEASEKEEPER_GENERATOR_MAX_SLEEP_SECS")]
    pub generator_max_sleep_secs: Option<String>,
    /// Simulated workers per instance.
    #[arg(long, global = true, env = "LEASEKEEPER_WORKERS")]
    pub workers: Option<String>,
    /// Tasks each simulated worker may claim ahead into its local queue
    /// (0, the default: none).
    #[arg(long, global = true, env = "LEASEKEEPER_PREFETCH")]
    pub prefetch: Option<String>,
    /// The longest a claim waits in a simulated worker's local queue
    /// before it is given back, in seconds (default 1).
    #[arg(long, global = true, env = "LEASEKEEPER_PREFETCH_WAIT_SECS")]
    pub prefetch_wait_secs: Option<String>,
    /// Chaos on (1/true) or off (0/false).
    #[arg(long, global = true, env = "LEASEKEEPER_CHAOS")]
    pub chaos: Option<String>,
    /// Probability that a worker crashes at a chaos check (every 5 ticks).
    #[arg(long, global = true, env = "LEASEKEEPER_CRASH_PROBABILITY")]
    pub crash_probability: Option<String>,
    /// Probability of a latency spike at a heartbeat.
    #[arg(long, global = true, env = "LEASEKEEPER_STALL_PROBABILITY")]
    pub stall_probability: Option<String>,
    /// Attempts before a task is marked failed.
    #[arg(long, global = true, env = "LEASEKEEPER_MAX_ATTEMPTS")]
    pub max_attempts: Option<String>,
    /// Finished tasks, history and dead instances/workers older than this
    /// many seconds are deleted (default 604800, 7 days).
    #[arg(long, global = true, env = "LEASEKEEPER_RETENTION_SECS")]
    pub retention_secs: Option<String>,
    /// Failed tasks older than this many seconds are deleted (default
    /// 2592000, 30 days; never less than the retention).
    #[arg(long, global = true, env = "LEASEKEEPER_FAILED_RETENTION_SECS")]
    pub failed_retention_secs: Option<String>,
    /// How often the maintenance job prunes, in seconds (default 60).
    #[arg(long, global = true, env = "LEASEKEEPER_MAINTENANCE_INTERVAL_SECS")]
    pub maintenance_interval_secs: Option<String>,
    /// Token the dashboard's controls and the operator API require; without
    /// it they are open to anyone who can reach the server.
    #[arg(
        long,
        global = true,
        env = "LEASEKEEPER_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// Token workers and producers present (enqueue, claim, heartbeat,
    /// complete, snooze, fail, worker self-report, application leases).
    #[arg(
        long,
        global = true,
        env = "LEASEKEEPER_WORKER_TOKEN",
        hide_env_values = true
    )]
    pub worker_token: Option<String>,
    /// Host names (comma-separated) this server answers to besides
    /// loopback names and IP addresses; `.example.com` allows subdomains.
    #[arg(long, global = true, env = "LEASEKEEPER_ALLOWED_HOSTS")]
    pub allowed_hosts: Option<String>,
    /// Serve beyond loopback without any token: "I know it is open".
    #[arg(long, global = true, env = "LEASEKEEPER_OPEN_NETWORK")]
    pub open_network: Option<String>,
    /// Statement timeout of a request's reads, in seconds (default 5).
    #[arg(long, global = true, env = "LEASEKEEPER_READ_TIMEOUT_SECS")]
    pub read_timeout_secs: Option<String>,
    /// The most queues that may exist; a new name past it is refused
    /// (default 1000).
    #[arg(long, global = true, env = "LEASEKEEPER_MAX_QUEUES")]
    pub max_queues: Option<String>,
}

impl std::fmt::Debug for SettingArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Hand-written so the tokens and the database URL's password never
        // reach a log line or a panic message.
        f.debug_struct("SettingArgs")
            .field("config", &self.config)
            .field("site_addr", &self.site_addr)
            .field(
                "database_url",
                &self.database_url.as_deref().map(secret::redact_url),
            )
            .field("pooler", &self.pooler)
            .field(
                "direct_database_url",
                &self.direct_database_url.as_deref().map(secret::redact_url),
            )
            .field("data_dir", &self.data_dir)
            .field("schema", &self.schema)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| secret::REDACTED),
            )
            .field(
                "worker_token",
                &self.worker_token.as_ref().map(|_| secret::REDACTED),
            )
            .finish_non_exhaustive()
    }
}

/// The resolved, validated settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Address to listen on.
    pub site_addr: SocketAddr,
    /// PostgreSQL URL, or `None` for the embedded cluster (a [`Secret`]:
    /// it may hold a password).
    pub database_url: Option<Secret>,
    /// Behind a transaction pooler: the same database directly, for the
    /// liveness session and `LISTEN` (a [`Secret`]).
    pub direct_database_url: Option<Secret>,
    /// Folder of the embedded cluster.
    pub data_dir: PathBuf,
    /// The PostgreSQL schema holding every table, function and trigger
    /// ([behind a transaction pooler](Schema::behind_transaction_pooler)
    /// when the setting `pooler` is `transaction`).
    pub schema: Schema,
    /// TTL of every acquisition and renewal.
    pub lease_ttl: Duration,
    /// Renewal period of held leases.
    pub renew_interval: Duration,
    /// Heartbeat period of task workers.
    pub heartbeat_interval: Duration,
    /// Generator period.
    pub generator_interval: Duration,
    /// Generated tasks sleep a whole number of seconds from 1 to this.
    pub generator_max_sleep: u32,
    /// Simulated workers per instance.
    pub workers: u32,
    /// Tasks each simulated worker may claim ahead (0: none).
    pub prefetch: u32,
    /// The longest a claim waits in a local queue before it is given back.
    pub prefetch_wait: Duration,
    /// Whether chaos (crashes, stalls) is on.
    pub chaos: bool,
    /// Crash probability per chaos check.
    pub crash_probability: f64,
    /// Stall probability per heartbeat.
    pub stall_probability: f64,
    /// Attempts before a task is marked failed.
    pub max_attempts: u32,
    /// What the maintenance job deletes must be older than this.
    pub retention: Duration,
    /// Failed tasks are deleted once older than this (at least `retention`).
    pub failed_retention: Duration,
    /// How often the maintenance job runs a pass.
    pub maintenance_interval: Duration,
    /// The operator token, when controls require one.
    pub admin_token: Option<Secret>,
    /// The token workers and producers present, when one is required.
    pub worker_token: Option<Secret>,
    /// Host names answered besides loopback names and IP addresses
    /// (lower case; a leading `.` allows every subdomain).
    pub allowed_hosts: Vec<String>,
    /// Serving beyond loopback without a token was asked for knowingly.
    pub open_network: bool,
    /// Statement timeout of a request's reads.
    pub read_timeout: Duration,
    /// The most queues that may exist.
    pub max_queues: u32,
}

/// A setting that could not be used. The message is one line and names the
/// setting in all three spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(String);

impl Settings {
    /// Reads the settings file (the named one, or `Leptos.toml` in the
    /// current folder if it exists) and applies `args` over it.
    pub fn load(args: &SettingArgs) -> Result<Self, SettingsError> {
        let (path, required) = match &args.config {
            Some(path) => (path.clone(), true),
            None => (PathBuf::from(DEFAULT_FILE), false),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(SettingsError(format!(
                    "settings file {}: {e}",
                    path.display()
                )));
            }
        };
        Self::resolve(text.as_deref(), &path, args)
    }

    /// Resolves settings from the text of a settings file (if any) and the
    /// flag/environment values in `args`, then validates them together.
    pub fn resolve(
        file_text: Option<&str>,
        origin: &Path,
        args: &SettingArgs,
    ) -> Result<Self, SettingsError> {
        let file = match file_text {
            Some(text) => read_file_values(text, origin)?,
            None => BTreeMap::new(),
        };
        let src = Sources { file };
        let lease_ttl = src.parse(
            &LEASE_TTL,
            &args.lease_ttl_secs,
            Duration::from_secs(15),
            seconds,
        )?;
        let renew_interval = src.parse(
            &RENEW_INTERVAL,
            &args.renew_interval_secs,
            lease_ttl / 3,
            seconds,
        )?;
        let heartbeat_interval = src.parse(
            &HEARTBEAT_INTERVAL,
            &args.heartbeat_interval_secs,
            lease_ttl / 3,
            seconds,
        )?;
        if renew_interval >= lease_ttl {
            return Err(SettingsError(format!(
                "{}: {:?} must be shorter than the lease TTL ({:?}), or leases expire between renewals",
                RENEW_INTERVAL.describe(),
                renew_interval,
                lease_ttl
            )));
        }
        // Up to 100 years; beyond that, nothing is ever old enough.
        let long_span = |raw: &str| {
            let secs: f64 = raw
                .parse()
                .map_err(|_| "is not a number of seconds".to_string())?;
            if !secs.is_finite() || secs <= 0.0 || secs > 3.2e9 {
                return Err("must be more than 0 seconds and at most 3200000000".into());
            }
            Ok(Duration::from_secs_f64(secs))
        };
        let retention = src.parse(
            &RETENTION,
            &args.retention_secs,
            leasekeeper_core::maintenance::DEFAULT_RETENTION,
            long_span,
        )?;
        let failed_retention = src.parse(
            &FAILED_RETENTION,
            &args.failed_retention_secs,
            leasekeeper_core::maintenance::DEFAULT_FAILED_RETENTION,
            long_span,
        )?;
        // A worker counts as alive for two TTLs after its last report, an
        // instance for two renew intervals and a second: a row not seen for
        // the retention must be dead by both, or a live one could be pruned.
        let liveness = lease_ttl * 2 + Duration::from_secs(1);
        if retention < liveness {
            return Err(SettingsError(format!(
                "{}: {:?} must be at least two lease TTLs and a second ({:?}), or live workers and instances could be pruned",
                RETENTION.describe(),
                retention,
                liveness
            )));
        }
        if let (Some(admin), Some(worker)) = (
            src.raw(&ADMIN_TOKEN, &args.admin_token),
            src.raw(&WORKER_TOKEN, &args.worker_token),
        ) && !admin.is_empty()
            && admin == worker
        {
            return Err(SettingsError(format!(
                "{}: must differ from the admin token, or every worker could use the controls",
                WORKER_TOKEN.describe()
            )));
        }
        if heartbeat_interval >= lease_ttl {
            return Err(SettingsError(format!(
                "{}: {:?} must be shorter than the lease TTL ({:?}), or tasks expire between heartbeats",
                HEARTBEAT_INTERVAL.describe(),
                heartbeat_interval,
                lease_ttl
            )));
        }
        let database_url = src
            .raw(&DATABASE_URL, &args.database_url)
            .filter(|url| !url.trim().is_empty())
            .map(Secret::from);
        // Whether a pooler in transaction mode stands between this server
        // and PostgreSQL; `none` is a direct connection or a session-mode
        // pooler, where sessions work.
        let transaction_pooler = src.parse(&POOLER, &args.pooler, false, |raw| {
            match raw.trim().to_ascii_lowercase().as_str() {
                "none" | "session" => Ok(false),
                "transaction" => Ok(true),
                _ => Err("must be none (directly connected, or a pooler in session mode) or transaction (PgBouncer's pool_mode = transaction)".into()),
            }
        })?;
        let direct_database_url = src
            .raw(&DIRECT_DATABASE_URL, &args.direct_database_url)
            .filter(|url| !url.trim().is_empty())
            .map(Secret::from);
        if transaction_pooler && database_url.is_none() {
            return Err(SettingsError(format!(
                "{}: transaction needs a database URL ({}): the embedded cluster has no pooler in front of it",
                POOLER.describe(),
                DATABASE_URL.describe()
            )));
        }
        if let Some(direct) = &direct_database_url {
            if !transaction_pooler {
                return Err(SettingsError(format!(
                    "{}: is used only behind a transaction pooler ({} = transaction); directly connected, the database URL itself serves the liveness session and LISTEN",
                    DIRECT_DATABASE_URL.describe(),
                    POOLER.describe()
                )));
            }
            let url = direct.expose();
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
                || url.parse::<sqlx::postgres::PgConnectOptions>().is_err()
            {
                return Err(SettingsError(format!(
                    "{}: is not a PostgreSQL URL (postgres://user:password@host:port/database)",
                    DIRECT_DATABASE_URL.describe()
                )));
            }
        }
        let schema = src.parse(&SCHEMA, &args.schema, Schema::default(), |raw| {
            Schema::parse(raw).map_err(|e| format!("cannot be used: {e}"))
        })?;
        Ok(Settings {
            site_addr: src.parse(
                &SITE_ADDR,
                &args.site_addr,
                SocketAddr::from(([127, 0, 0, 1], 3000)),
                |raw| {
                    raw.parse()
                        .map_err(|_| "is not a host:port address such as 127.0.0.1:3000".into())
                },
            )?,
            database_url,
            direct_database_url,
            data_dir: src.parse(
                &DATA_DIR,
                &args.data_dir,
                PathBuf::from("target/leasekeeper-db"),
                |raw| {
                    if raw.is_empty() {
                        Err("must not be empty".into())
                    } else {
                        Ok(PathBuf::from(raw))
                    }
                },
            )?,
            schema: if transaction_pooler {
                schema.behind_transaction_pooler()
            } else {
                schema
            },
            lease_ttl,
            renew_interval,
            heartbeat_interval,
            generator_interval: src.parse(
                &GENERATOR_INTERVAL,
                &args.generator_interval_secs,
                Duration::from_secs(2),
                seconds,
            )?,
            generator_max_sleep: src.parse(
                &GENERATOR_MAX_SLEEP,
                &args.generator_max_sleep_secs,
                60,
                |raw| match count(3600)(raw)? {
                    0 => Err("must be at least 1".into()),
                    n => Ok(n),
                },
            )?,
            workers: src.parse(&WORKERS, &args.workers, 4, count(1000))?,
            prefetch: src.parse(&PREFETCH, &args.prefetch, 0, count(100))?,
            prefetch_wait: src.parse(
                &PREFETCH_WAIT,
                &args.prefetch_wait_secs,
                Duration::from_secs(1),
                |raw| match seconds(raw)? {
                    d if d > Duration::from_secs(3600) => {
                        Err("must be at most 3600 seconds (one hour)".into())
                    }
                    d => Ok(d),
                },
            )?,
            chaos: src.parse(&CHAOS, &args.chaos, true, boolean)?,
            crash_probability: src.parse(
                &CRASH_PROBABILITY,
                &args.crash_probability,
                0.05,
                probability,
            )?,
            stall_probability: src.parse(
                &STALL_PROBABILITY,
                &args.stall_probability,
                0.10,
                probability,
            )?,
            max_attempts: src.parse(&MAX_ATTEMPTS, &args.max_attempts, 5, |raw| {
                let n = count(1000)(raw)?;
                if n == 0 {
                    Err("must be at least 1".into())
                } else {
                    Ok(n)
                }
            })?,
            retention,
            failed_retention,
            maintenance_interval: src.parse(
                &MAINTENANCE_INTERVAL,
                &args.maintenance_interval_secs,
                leasekeeper_core::maintenance::DEFAULT_INTERVAL,
                seconds,
            )?,
            admin_token: secret_token(&src, &ADMIN_TOKEN, &args.admin_token)?,
            worker_token: secret_token(&src, &WORKER_TOKEN, &args.worker_token)?,
            allowed_hosts: src.parse(
                &ALLOWED_HOSTS,
                &args.allowed_hosts,
                Vec::new(),
                host_names,
            )?,
            open_network: src.parse(&OPEN_NETWORK, &args.open_network, false, boolean)?,
            read_timeout: src.parse(
                &READ_TIMEOUT,
                &args.read_timeout_secs,
                Duration::from_secs(5),
                |raw| match seconds(raw)? {
                    d if d > Duration::from_secs(3600) => {
                        Err("must be at most 3600 seconds (one hour)".into())
                    }
                    d => Ok(d),
                },
            )?,
            max_queues: src.parse(
                &MAX_QUEUES,
                &args.max_queues,
                leasekeeper_core::queue::queues::DEFAULT_MAX_QUEUES,
                |raw| match count(100_000)(raw)? {
                    0 => Err("must be at least 1".into()),
                    n => Ok(n),
                },
            )?,
        })
    }
}

/// A token setting, checked by [`token`]; unlike other settings its error
/// never repeats the value.
fn secret_token(
    src: &Sources,
    key: &keys::Key,
    arg: &Option<String>,
) -> Result<Option<Secret>, SettingsError> {
    match src.raw(key, arg) {
        None => Ok(None),
        Some(raw) => {
            token(raw.trim()).map_err(|why| SettingsError(format!("{}: {why}", key.describe())))
        }
    }
}

/// The token in the file at `path` (`leasekeeper worker --token-file`):
/// its contents with surrounding whitespace trimmed, by the rule of the
/// token settings (16 to 256 printable ASCII characters). A file keeps the
/// token out of the process list and of the environment that children and
/// crash reports inherit. The errors name the file, never its contents.
pub fn token_file(path: &Path) -> Result<Secret, SettingsError> {
    let named = |why: String| SettingsError(format!("--token-file {}: {why}", path.display()));
    let raw = std::fs::read_to_string(path).map_err(|e| named(format!("cannot be read: {e}")))?;
    match token(raw.trim()) {
        Ok(Some(secret)) => Ok(secret),
        Ok(None) => Err(named("is empty; it must hold the worker token".into())),
        Err(why) => Err(named(format!("its contents {why}"))),
    }
}

impl Settings {
    /// A worker's timing from `lease_ttl` and `heartbeat_interval`.
    pub fn worker_config(&self) -> leasekeeper_core::worker::run::WorkerConfig {
        leasekeeper_core::worker::run::WorkerConfig::new(self.lease_ttl, self.heartbeat_interval)
    }

    /// The maintenance job's timing: `retention`, `maintenance_interval`,
    /// and the lease on `singleton:maintenance` held like every other
    /// (`lease_ttl`, renewed every `renew_interval`, a non-holder retrying
    /// once per renew interval).
    pub fn maintenance_config(&self) -> leasekeeper_core::maintenance::MaintenanceConfig {
        use leasekeeper_core::lease::client::LeaseTiming;
        leasekeeper_core::maintenance::MaintenanceConfig {
            timing: LeaseTiming {
                ttl: self.lease_ttl,
                renew_interval: self.renew_interval,
                safety_margin: self.lease_ttl / 10,
            },
            retry: self.renew_interval,
            failed_retention: self.failed_retention.max(self.retention),
            ..leasekeeper_core::maintenance::MaintenanceConfig::new(
                self.retention,
                self.maintenance_interval,
            )
        }
    }

    /// The scheduler's timing: the lease on `singleton:scheduler` held like
    /// every other (`lease_ttl`, renewed every `renew_interval`, a
    /// non-holder retrying once per renew interval), the default catch-up
    /// cap and on-time bound.
    pub fn scheduler_config(&self) -> leasekeeper_core::schedule::runtime::SchedulerConfig {
        use leasekeeper_core::lease::client::LeaseTiming;
        leasekeeper_core::schedule::runtime::SchedulerConfig {
            timing: LeaseTiming {
                ttl: self.lease_ttl,
                renew_interval: self.renew_interval,
                safety_margin: self.lease_ttl / 10,
            },
            retry: self.renew_interval,
            ..leasekeeper_core::schedule::runtime::SchedulerConfig::from_ttl(self.lease_ttl)
        }
    }

    /// The chaos settings (`chaos`, `crash_probability`,
    /// `stall_probability`), with crash checks every 5 ticks and 4-15 s stalls.
    pub fn chaos_settings(&self) -> leasekeeper_core::worker::chaos::ChaosSettings {
        leasekeeper_core::worker::chaos::ChaosSettings {
            enabled: self.chaos,
            crash_probability: self.crash_probability,
            stall_probability: self.stall_probability,
            ..leasekeeper_core::worker::chaos::ChaosSettings::off()
        }
    }

    /// The behaviour settings and the schema as environment variables, for
    /// child processes that must run exactly as this one was configured
    /// (`cluster`). Address, database and data folder are left to the caller.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        vec![
            (SCHEMA.env, self.schema.to_string()),
            (LEASE_TTL.env, self.lease_ttl.as_secs_f64().to_string()),
            (
                RENEW_INTERVAL.env,
                self.renew_interval.as_secs_f64().to_string(),
            ),
            (
                HEARTBEAT_INTERVAL.env,
                self.heartbeat_interval.as_secs_f64().to_string(),
            ),
            (
                GENERATOR_INTERVAL.env,
                self.generator_interval.as_secs_f64().to_string(),
            ),
            (
                GENERATOR_MAX_SLEEP.env,
                self.generator_max_sleep.to_string(),
            ),
            (WORKERS.env, self.workers.to_string()),
            (PREFETCH.env, self.prefetch.to_string()),
            (
                PREFETCH_WAIT.env,
                self.prefetch_wait.as_secs_f64().to_string(),
            ),
            (CHAOS.env, self.chaos.to_string()),
            (CRASH_PROBABILITY.env, self.crash_probability.to_string()),
            (STALL_PROBABILITY.env, self.stall_probability.to_string()),
            (MAX_ATTEMPTS.env, self.max_attempts.to_string()),
            (RETENTION.env, self.retention.as_secs_f64().to_string()),
            (
                FAILED_RETENTION.env,
                self.failed_retention.as_secs_f64().to_string(),
            ),
            (
                MAINTENANCE_INTERVAL.env,
                self.maintenance_interval.as_secs_f64().to_string(),
            ),
        ]
        .into_iter()
        .chain(
            self.admin_token
                .as_ref()
                .map(|t| (ADMIN_TOKEN.env, t.expose().to_string())),
        )
        .chain(
            self.worker_token
                .as_ref()
                .map(|t| (WORKER_TOKEN.env, t.expose().to_string())),
        )
        .chain([
            (ALLOWED_HOSTS.env, self.allowed_hosts.join(",")),
            (OPEN_NETWORK.env, self.open_network.to_string()),
            (
                READ_TIMEOUT.env,
                self.read_timeout.as_secs_f64().to_string(),
            ),
            (MAX_QUEUES.env, self.max_queues.to_string()),
        ])
        .collect()
    }
}

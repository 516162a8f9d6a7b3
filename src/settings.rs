//! The program's settings: `Leptos.toml` at the repository root, overridden
//! by environment variables, overridden by command-line flags.
//!
//! All three sources go through one parser, so a bad value gets the same
//! one-line error, naming the setting, wherever it came from.

use clap::Args;
use leasekeeper_core::db::Schema;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Settings given on the command line or in the environment (flag wins).
/// Every field is optional: what is missing comes from `Leptos.toml`, then
/// from the built-in default.
#[derive(Args, Clone, Debug, Default)]
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
}

/// The resolved, validated settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Address to listen on.
    pub site_addr: SocketAddr,
    /// PostgreSQL URL, or `None` for the embedded cluster.
    pub database_url: Option<String>,
    /// Folder of the embedded cluster.
    pub data_dir: PathBuf,
    /// The PostgreSQL schema holding every table, function and trigger.
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
    /// How often the maintenance job runs a pass.
    pub maintenance_interval: Duration,
    /// The operator token, when controls require one.
    pub admin_token: Option<String>,
}

/// A setting that could not be used. The message is one line and names the
/// setting in all three spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(String);

/// One setting: its key in `Leptos.toml`, its environment variable, its flag.
struct Key {
    file: &'static str,
    env: &'static str,
    flag: &'static str,
}

impl Key {
    fn describe(&self) -> String {
        format!("setting {} (--{} / {})", self.file, self.flag, self.env)
    }
}

const SITE_ADDR: Key = Key {
    file: "site_addr",
    env: "LEPTOS_SITE_ADDR",
    flag: "addr",
};
const DATABASE_URL: Key = Key {
    file: "database_url",
    env: "DATABASE_URL",
    flag: "database-url",
};
const DATA_DIR: Key = Key {
    file: "data_dir",
    env: "LEASEKEEPER_DATA_DIR",
    flag: "data-dir",
};
const SCHEMA: Key = Key {
    file: "schema",
    env: "LEASEKEEPER_SCHEMA",
    flag: "schema",
};
const LEASE_TTL: Key = Key {
    file: "lease_ttl_secs",
    env: "LEASEKEEPER_LEASE_TTL_SECS",
    flag: "lease-ttl-secs",
};
const RENEW_INTERVAL: Key = Key {
    file: "renew_interval_secs",
    env: "LEASEKEEPER_RENEW_INTERVAL_SECS",
    flag: "renew-interval-secs",
};
const HEARTBEAT_INTERVAL: Key = Key {
    file: "heartbeat_interval_secs",
    env: "LEASEKEEPER_HEARTBEAT_INTERVAL_SECS",
    flag: "heartbeat-interval-secs",
};
const GENERATOR_INTERVAL: Key = Key {
    file: "generator_interval_secs",
    env: "LEASEKEEPER_GENERATOR_INTERVAL_SECS",
    flag: "generator-interval-secs",
};
const GENERATOR_MAX_SLEEP: Key = Key {
    file: "generator_max_sleep_secs",
    env: "LEASEKEEPER_GENERATOR_MAX_SLEEP_SECS",
    flag: "generator-max-sleep-secs",
};
const WORKERS: Key = Key {
    file: "workers",
    env: "LEASEKEEPER_WORKERS",
    flag: "workers",
};
const CHAOS: Key = Key {
    file: "chaos",
    env: "LEASEKEEPER_CHAOS",
    flag: "chaos",
};
const CRASH_PROBABILITY: Key = Key {
    file: "crash_probability",
    env: "LEASEKEEPER_CRASH_PROBABILITY",
    flag: "crash-probability",
};
const STALL_PROBABILITY: Key = Key {
    file: "stall_probability",
    env: "LEASEKEEPER_STALL_PROBABILITY",
    flag: "stall-probability",
};
const ADMIN_TOKEN: Key = Key {
    file: "admin_token",
    env: "LEASEKEEPER_ADMIN_TOKEN",
    flag: "admin-token",
};

const MAX_ATTEMPTS: Key = Key {
    file: "max_attempts",
    env: "LEASEKEEPER_MAX_ATTEMPTS",
    flag: "max-attempts",
};

const RETENTION: Key = Key {
    file: "retention_secs",
    env: "LEASEKEEPER_RETENTION_SECS",
    flag: "retention-secs",
};
const MAINTENANCE_INTERVAL: Key = Key {
    file: "maintenance_interval_secs",
    env: "LEASEKEEPER_MAINTENANCE_INTERVAL_SECS",
    flag: "maintenance-interval-secs",
};

const ALL_KEYS: [&Key; 16] = [
    &SITE_ADDR,
    &DATABASE_URL,
    &DATA_DIR,
    &SCHEMA,
    &LEASE_TTL,
    &RENEW_INTERVAL,
    &HEARTBEAT_INTERVAL,
    &GENERATOR_INTERVAL,
    &GENERATOR_MAX_SLEEP,
    &WORKERS,
    &CHAOS,
    &CRASH_PROBABILITY,
    &STALL_PROBABILITY,
    &MAX_ATTEMPTS,
    &RETENTION,
    &MAINTENANCE_INTERVAL,
];

/// The section of `Leptos.toml` that holds the program's settings.
pub const FILE_SECTION: &str = "leasekeeper";

/// The settings file used when none is named.
pub const DEFAULT_FILE: &str = "Leptos.toml";

/// The values read from a settings file, as strings, by key.
fn read_file_values(text: &str, origin: &Path) -> Result<BTreeMap<String, String>, SettingsError> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        SettingsError(format!(
            "{}: not valid TOML: {}",
            origin.display(),
            e.message()
        ))
    })?;
    let Some(section) = table.get(FILE_SECTION) else {
        return Ok(BTreeMap::new());
    };
    let section = section.as_table().ok_or_else(|| {
        SettingsError(format!(
            "{}: [{FILE_SECTION}] must be a table",
            origin.display()
        ))
    })?;
    let mut values = BTreeMap::new();
    for (key, value) in section {
        if !ALL_KEYS.iter().any(|k| k.file == key) {
            let known: Vec<_> = ALL_KEYS.iter().map(|k| k.file).collect();
            return Err(SettingsError(format!(
                "{}: unknown setting [{FILE_SECTION}].{key}; known settings: {}",
                origin.display(),
                known.join(", ")
            )));
        }
        let text = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                return Err(SettingsError(format!(
                    "{}: [{FILE_SECTION}].{key} must be a string, number or boolean, got {}",
                    origin.display(),
                    other.type_str()
                )));
            }
        };
        values.insert(key.clone(), text);
    }
    Ok(values)
}

struct Sources {
    file: BTreeMap<String, String>,
}

impl Sources {
    fn raw(&self, key: &Key, arg: &Option<String>) -> Option<String> {
        arg.clone().or_else(|| self.file.get(key.file).cloned())
    }

    fn parse<T>(
        &self,
        key: &Key,
        arg: &Option<String>,
        default: T,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, SettingsError> {
        match self.raw(key, arg) {
            None => Ok(default),
            Some(raw) => parse(raw.trim())
                .map_err(|why| SettingsError(format!("{}: {raw:?} {why}", key.describe()))),
        }
    }
}

fn seconds(raw: &str) -> Result<Duration, String> {
    let secs: f64 = raw
        .parse()
        .map_err(|_| "is not a number of seconds".to_string())?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err("must be more than 0 seconds".into());
    }
    if secs > 86_400.0 {
        return Err("must be at most 86400 seconds (one day)".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

fn probability(raw: &str) -> Result<f64, String> {
    let p: f64 = raw.parse().map_err(|_| "is not a number".to_string())?;
    if !(0.0..=1.0).contains(&p) {
        return Err("must be between 0 and 1".into());
    }
    Ok(p)
}

fn boolean(raw: &str) -> Result<bool, String> {
    match raw.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err("must be 0/1, true/false, on/off or yes/no".into()),
    }
}

fn count(max: u32) -> impl Fn(&str) -> Result<u32, String> {
    move |raw| {
        let n: u32 = raw
            .parse()
            .map_err(|_| "is not a whole number".to_string())?;
        if n > max {
            return Err(format!("must be at most {max}"));
        }
        Ok(n)
    }
}

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
        let retention = src.parse(
            &RETENTION,
            &args.retention_secs,
            leasekeeper_core::maintenance::DEFAULT_RETENTION,
            |raw| {
                let secs: f64 = raw
                    .parse()
                    .map_err(|_| "is not a number of seconds".to_string())?;
                // Up to 100 years; beyond that, nothing is ever old enough.
                if !secs.is_finite() || secs <= 0.0 || secs > 3.2e9 {
                    return Err("must be more than 0 seconds and at most 3200000000".into());
                }
                Ok(Duration::from_secs_f64(secs))
            },
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
        if heartbeat_interval >= lease_ttl {
            return Err(SettingsError(format!(
                "{}: {:?} must be shorter than the lease TTL ({:?}), or tasks expire between heartbeats",
                HEARTBEAT_INTERVAL.describe(),
                heartbeat_interval,
                lease_ttl
            )));
        }
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
            database_url: src
                .raw(&DATABASE_URL, &args.database_url)
                .filter(|url| !url.trim().is_empty()),
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
            schema: src.parse(&SCHEMA, &args.schema, Schema::default(), |raw| {
                Schema::parse(raw).map_err(|e| format!("cannot be used: {e}"))
            })?,
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
            maintenance_interval: src.parse(
                &MAINTENANCE_INTERVAL,
                &args.maintenance_interval_secs,
                leasekeeper_core::maintenance::DEFAULT_INTERVAL,
                seconds,
            )?,
            admin_token: match src
                .raw(&ADMIN_TOKEN, &args.admin_token)
                .filter(|t| !t.is_empty())
            {
                None => None,
                Some(t)
                    if t.len() < 16
                        || t.len() > 256
                        || t.chars().any(|c| !c.is_ascii_graphic()) =>
                {
                    return Err(SettingsError(format!(
                        "{}: must be 16 to 256 printable ASCII characters without spaces",
                        ADMIN_TOKEN.describe()
                    )));
                }
                Some(t) => Some(t),
            },
        })
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
            ..leasekeeper_core::maintenance::MaintenanceConfig::new(
                self.retention,
                self.maintenance_interval,
            )
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
            (CHAOS.env, self.chaos.to_string()),
            (CRASH_PROBABILITY.env, self.crash_probability.to_string()),
            (STALL_PROBABILITY.env, self.stall_probability.to_string()),
            (MAX_ATTEMPTS.env, self.max_attempts.to_string()),
            (RETENTION.env, self.retention.as_secs_f64().to_string()),
            (
                MAINTENANCE_INTERVAL.env,
                self.maintenance_interval.as_secs_f64().to_string(),
            ),
        ]
        .into_iter()
        .chain(self.admin_token.clone().map(|t| (ADMIN_TOKEN.env, t)))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(file: Option<&str>, args: SettingArgs) -> Result<Settings, SettingsError> {
        Settings::resolve(file, Path::new("Leptos.toml"), &args)
    }

    #[test]
    fn defaults_without_file_or_overrides() {
        let s = resolve(None, SettingArgs::default()).unwrap();
        assert_eq!(s.lease_ttl, Duration::from_secs(15));
        assert_eq!(s.renew_interval, Duration::from_secs(5));
        assert_eq!(s.site_addr.to_string(), "127.0.0.1:3000");
        assert_eq!(s.database_url, None);
        assert_eq!(s.schema.as_str(), "leasekeeper");
        assert_eq!(s.workers, 4);
    }

    #[test]
    fn schema_layers_file_env_and_flag_and_refuses_bad_names() {
        let file = "[leasekeeper]\nschema = \"from_file\"\n";
        assert_eq!(
            resolve(Some(file), SettingArgs::default())
                .unwrap()
                .schema
                .as_str(),
            "from_file"
        );
        let args = SettingArgs {
            schema: Some("svc_jobs".into()),
            ..Default::default()
        };
        assert_eq!(
            resolve(Some(file), args).unwrap().schema.as_str(),
            "svc_jobs"
        );
        for bad in ["public", "Jobs", "svc-jobs", "pg_jobs", ""] {
            let args = SettingArgs {
                schema: Some(bad.into()),
                ..Default::default()
            };
            let err = resolve(None, args).unwrap_err().to_string();
            assert!(
                err.contains("setting schema (--schema / LEASEKEEPER_SCHEMA)")
                    && err.contains("schema name"),
                "{bad}: {err}"
            );
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn the_repository_settings_file_parses() {
        let text = include_str!("../Leptos.toml");
        let s = resolve(Some(text), SettingArgs::default()).unwrap();
        assert_eq!(s.lease_ttl, Duration::from_secs(15));
    }

    #[test]
    fn flags_and_env_override_the_file() {
        let file = "[leasekeeper]\nlease_ttl_secs = 20\nsite_addr = \"127.0.0.1:4000\"\n";
        let from_file = resolve(Some(file), SettingArgs::default()).unwrap();
        assert_eq!(from_file.lease_ttl, Duration::from_secs(20));
        assert_eq!(from_file.site_addr.port(), 4000);
        let args = SettingArgs {
            lease_ttl_secs: Some("2.5".into()),
            site_addr: Some("127.0.0.1:5000".into()),
            ..Default::default()
        };
        let s = resolve(Some(file), args).unwrap();
        assert_eq!(s.lease_ttl, Duration::from_millis(2500));
        assert_eq!(s.site_addr.port(), 5000);
        // The renew default follows the effective TTL.
        assert_eq!(s.renew_interval, Duration::from_millis(2500) / 3);
    }

    #[test]
    fn bad_values_name_the_setting_in_one_line() {
        let args = SettingArgs {
            lease_ttl_secs: Some("abc".into()),
            ..Default::default()
        };
        let err = resolve(None, args).unwrap_err().to_string();
        assert!(err.contains("lease_ttl_secs"), "{err}");
        assert!(err.contains("LEASEKEEPER_LEASE_TTL_SECS"), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn ttl_must_exceed_the_renew_interval() {
        let args = SettingArgs {
            lease_ttl_secs: Some("3".into()),
            renew_interval_secs: Some("3".into()),
            ..Default::default()
        };
        let err = resolve(None, args).unwrap_err().to_string();
        assert!(err.contains("renew_interval_secs"), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_toml_are_refused() {
        let err = resolve(
            Some("[leasekeeper]\nlease_tll_secs = 3\n"),
            SettingArgs::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("unknown setting [leasekeeper].lease_tll_secs"),
            "{err}"
        );
        let err = resolve(Some("[leasekeeper\n"), SettingArgs::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("not valid TOML"), "{err}");
    }

    #[test]
    fn admin_token_is_checked_and_empty_means_unset() {
        let with = |t: &str| {
            resolve(
                None,
                SettingArgs {
                    admin_token: Some(t.into()),
                    ..SettingArgs::default()
                },
            )
        };
        let err = with("short").unwrap_err().to_string();
        assert!(
            err.contains("LEASEKEEPER_ADMIN_TOKEN") && err.contains("16 to 256"),
            "{err}"
        );
        assert!(with("has a space in it, sixteen+").is_err());
        assert_eq!(with("").unwrap().admin_token, None);
        let ok = with("0123456789abcdef").unwrap();
        assert_eq!(ok.admin_token.as_deref(), Some("0123456789abcdef"));
        assert!(
            ok.to_env()
                .contains(&("LEASEKEEPER_ADMIN_TOKEN", "0123456789abcdef".to_string()))
        );
    }

    #[test]
    fn to_env_round_trips_through_resolve() {
        let args = SettingArgs {
            lease_ttl_secs: Some("2.5".into()),
            workers: Some("7".into()),
            chaos: Some("0".into()),
            schema: Some("svc_jobs".into()),
            retention_secs: Some("90.5".into()),
            maintenance_interval_secs: Some("7".into()),
            ..Default::default()
        };
        let original = resolve(None, args).unwrap();
        let env: BTreeMap<_, _> = original.to_env().into_iter().collect();
        let again = resolve(
            None,
            SettingArgs {
                schema: env.get("LEASEKEEPER_SCHEMA").cloned(),
                lease_ttl_secs: env.get("LEASEKEEPER_LEASE_TTL_SECS").cloned(),
                renew_interval_secs: env.get("LEASEKEEPER_RENEW_INTERVAL_SECS").cloned(),
                heartbeat_interval_secs: env.get("LEASEKEEPER_HEARTBEAT_INTERVAL_SECS").cloned(),
                generator_interval_secs: env.get("LEASEKEEPER_GENERATOR_INTERVAL_SECS").cloned(),
                generator_max_sleep_secs: env.get("LEASEKEEPER_GENERATOR_MAX_SLEEP_SECS").cloned(),
                workers: env.get("LEASEKEEPER_WORKERS").cloned(),
                chaos: env.get("LEASEKEEPER_CHAOS").cloned(),
                crash_probability: env.get("LEASEKEEPER_CRASH_PROBABILITY").cloned(),
                stall_probability: env.get("LEASEKEEPER_STALL_PROBABILITY").cloned(),
                max_attempts: env.get("LEASEKEEPER_MAX_ATTEMPTS").cloned(),
                retention_secs: env.get("LEASEKEEPER_RETENTION_SECS").cloned(),
                maintenance_interval_secs: env
                    .get("LEASEKEEPER_MAINTENANCE_INTERVAL_SECS")
                    .cloned(),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(again, original);
    }

    #[test]
    fn retention_defaults_to_a_week_and_must_outlast_liveness() {
        let s = resolve(None, SettingArgs::default()).unwrap();
        assert_eq!(s.retention, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(s.maintenance_interval, Duration::from_secs(60));
        let file = "[leasekeeper]\nretention_secs = 120\nmaintenance_interval_secs = 5\n";
        let s = resolve(Some(file), SettingArgs::default()).unwrap();
        assert_eq!(
            (s.retention, s.maintenance_interval),
            (Duration::from_secs(120), Duration::from_secs(5))
        );
        // Default TTL 15 s: a live worker may be silent for 30 s.
        let short = SettingArgs {
            retention_secs: Some("30".into()),
            ..Default::default()
        };
        let err = resolve(None, short).unwrap_err().to_string();
        assert!(err.contains("LEASEKEEPER_RETENTION_SECS"), "{err}");
        assert!(err.contains("two lease TTLs"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        for bad in ["0", "-5", "NaN", "week", "1e12"] {
            let args = SettingArgs {
                retention_secs: Some(bad.into()),
                ..Default::default()
            };
            let err = resolve(None, args).unwrap_err().to_string();
            assert!(err.contains("retention_secs"), "{bad}: {err}");
        }
        for bad in ["0", "-1", "x", "100000"] {
            let args = SettingArgs {
                maintenance_interval_secs: Some(bad.into()),
                ..Default::default()
            };
            let err = resolve(None, args).unwrap_err().to_string();
            assert!(err.contains("maintenance_interval_secs"), "{bad}: {err}");
        }
    }

    #[test]
    fn zero_negative_and_nan_durations_are_refused() {
        for bad in ["0", "-1", "NaN", "inf"] {
            let args = SettingArgs {
                generator_interval_secs: Some(bad.into()),
                ..Default::default()
            };
            assert!(resolve(None, args).is_err(), "{bad}");
        }
    }
}

//! Every setting's three names: its key in `Leptos.toml`, its environment
//! variable and its flag, in one place so an error names all three.

/// One setting: its key in `Leptos.toml`, its environment variable, its flag.
pub(super) struct Key {
    pub(super) file: &'static str,
    pub(super) env: &'static str,
    pub(super) flag: &'static str,
}

impl Key {
    pub(super) fn describe(&self) -> String {
        format!("setting {} (--{} / {})", self.file, self.flag, self.env)
    }
}

pub(super) const SITE_ADDR: Key = Key {
    file: "site_addr",
    env: "LEPTOS_SITE_ADDR",
    flag: "addr",
};
pub(super) const DATABASE_URL: Key = Key {
    file: "database_url",
    env: "DATABASE_URL",
    flag: "database-url",
};
pub(super) const POOLER: Key = Key {
    file: "pooler",
    env: "LEASEKEEPER_POOLER",
    flag: "pooler",
};
pub(super) const DIRECT_DATABASE_URL: Key = Key {
    file: "direct_database_url",
    env: "LEASEKEEPER_DIRECT_DATABASE_URL",
    flag: "direct-database-url",
};
pub(super) const DATA_DIR: Key = Key {
    file: "data_dir",
    env: "LEASEKEEPER_DATA_DIR",
    flag: "data-dir",
};
pub(super) const SCHEMA: Key = Key {
    file: "schema",
    env: "LEASEKEEPER_SCHEMA",
    flag: "schema",
};
pub(super) const LEASE_TTL: Key = Key {
    file: "lease_ttl_secs",
    env: "LEASEKEEPER_LEASE_TTL_SECS",
    flag: "lease-ttl-secs",
};
pub(super) const RENEW_INTERVAL: Key = Key {
    file: "renew_interval_secs",
    env: "LEASEKEEPER_RENEW_INTERVAL_SECS",
    flag: "renew-interval-secs",
};
pub(super) const HEARTBEAT_INTERVAL: Key = Key {
    file: "heartbeat_interval_secs",
    env: "LEASEKEEPER_HEARTBEAT_INTERVAL_SECS",
    flag: "heartbeat-interval-secs",
};
pub(super) const GENERATOR_INTERVAL: Key = Key {
    file: "generator_interval_secs",
    env: "LEASEKEEPER_GENERATOR_INTERVAL_SECS",
    flag: "generator-interval-secs",
};
pub(super) const GENERATOR_MAX_SLEEP: Key = Key {
    file: "generator_max_sleep_secs",
    env: "LEASEKEEPER_GENERATOR_MAX_SLEEP_SECS",
    flag: "generator-max-sleep-secs",
};
pub(super) const WORKERS: Key = Key {
    file: "workers",
    env: "LEASEKEEPER_WORKERS",
    flag: "workers",
};
pub(super) const PREFETCH: Key = Key {
    file: "prefetch",
    env: "LEASEKEEPER_PREFETCH",
    flag: "prefetch",
};
pub(super) const PREFETCH_WAIT: Key = Key {
    file: "prefetch_wait_secs",
    env: "LEASEKEEPER_PREFETCH_WAIT_SECS",
    flag: "prefetch-wait-secs",
};
pub(super) const CHAOS: Key = Key {
    file: "chaos",
    env: "LEASEKEEPER_CHAOS",
    flag: "chaos",
};
pub(super) const CRASH_PROBABILITY: Key = Key {
    file: "crash_probability",
    env: "LEASEKEEPER_CRASH_PROBABILITY",
    flag: "crash-probability",
};
pub(super) const STALL_PROBABILITY: Key = Key {
    file: "stall_probability",
    env: "LEASEKEEPER_STALL_PROBABILITY",
    flag: "stall-probability",
};
pub(super) const ADMIN_TOKEN: Key = Key {
    file: "admin_token",
    env: "LEASEKEEPER_ADMIN_TOKEN",
    flag: "admin-token",
};

pub(super) const MAX_ATTEMPTS: Key = Key {
    file: "max_attempts",
    env: "LEASEKEEPER_MAX_ATTEMPTS",
    flag: "max-attempts",
};

pub(super) const RETENTION: Key = Key {
    file: "retention_secs",
    env: "LEASEKEEPER_RETENTION_SECS",
    flag: "retention-secs",
};
pub(super) const FAILED_RETENTION: Key = Key {
    file: "failed_retention_secs",
    env: "LEASEKEEPER_FAILED_RETENTION_SECS",
    flag: "failed-retention-secs",
};
pub(super) const MAINTENANCE_INTERVAL: Key = Key {
    file: "maintenance_interval_secs",
    env: "LEASEKEEPER_MAINTENANCE_INTERVAL_SECS",
    flag: "maintenance-interval-secs",
};

pub(super) const WORKER_TOKEN: Key = Key {
    file: "worker_token",
    env: "LEASEKEEPER_WORKER_TOKEN",
    flag: "worker-token",
};
pub(super) const ALLOWED_HOSTS: Key = Key {
    file: "allowed_hosts",
    env: "LEASEKEEPER_ALLOWED_HOSTS",
    flag: "allowed-hosts",
};
pub(super) const OPEN_NETWORK: Key = Key {
    file: "open_network",
    env: "LEASEKEEPER_OPEN_NETWORK",
    flag: "open-network",
};
pub(super) const READ_TIMEOUT: Key = Key {
    file: "read_timeout_secs",
    env: "LEASEKEEPER_READ_TIMEOUT_SECS",
    flag: "read-timeout-secs",
};
pub(super) const MAX_QUEUES: Key = Key {
    file: "max_queues",
    env: "LEASEKEEPER_MAX_QUEUES",
    flag: "max-queues",
};

pub(super) const ALL_KEYS: [&Key; 27] = [
    &SITE_ADDR,
    &DATABASE_URL,
    &POOLER,
    &DIRECT_DATABASE_URL,
    &DATA_DIR,
    &SCHEMA,
    &LEASE_TTL,
    &RENEW_INTERVAL,
    &HEARTBEAT_INTERVAL,
    &GENERATOR_INTERVAL,
    &GENERATOR_MAX_SLEEP,
    &WORKERS,
    &PREFETCH,
    &PREFETCH_WAIT,
    &CHAOS,
    &CRASH_PROBABILITY,
    &STALL_PROBABILITY,
    &MAX_ATTEMPTS,
    &RETENTION,
    &FAILED_RETENTION,
    &MAINTENANCE_INTERVAL,
    &ADMIN_TOKEN,
    &WORKER_TOKEN,
    &ALLOWED_HOSTS,
    &OPEN_NETWORK,
    &READ_TIMEOUT,
    &MAX_QUEUES,
];

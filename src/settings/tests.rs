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
    let text = include_str!("../../Leptos.toml");
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
    assert_eq!(
        ok.admin_token.as_ref().map(Secret::expose),
        Some("0123456789abcdef")
    );
    assert!(!format!("{ok:?}").contains("0123456789abcdef"));
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
        prefetch: Some("3".into()),
        prefetch_wait_secs: Some("2.5".into()),
        worker_token: Some("worker-token-0123456789".into()),
        allowed_hosts: Some("jobs.example.com,.internal".into()),
        open_network: Some("yes".into()),
        read_timeout_secs: Some("2.5".into()),
        max_queues: Some("50".into()),
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
            prefetch: env.get("LEASEKEEPER_PREFETCH").cloned(),
            prefetch_wait_secs: env.get("LEASEKEEPER_PREFETCH_WAIT_SECS").cloned(),
            chaos: env.get("LEASEKEEPER_CHAOS").cloned(),
            crash_probability: env.get("LEASEKEEPER_CRASH_PROBABILITY").cloned(),
            stall_probability: env.get("LEASEKEEPER_STALL_PROBABILITY").cloned(),
            max_attempts: env.get("LEASEKEEPER_MAX_ATTEMPTS").cloned(),
            retention_secs: env.get("LEASEKEEPER_RETENTION_SECS").cloned(),
            failed_retention_secs: env.get("LEASEKEEPER_FAILED_RETENTION_SECS").cloned(),
            maintenance_interval_secs: env.get("LEASEKEEPER_MAINTENANCE_INTERVAL_SECS").cloned(),
            worker_token: env.get("LEASEKEEPER_WORKER_TOKEN").cloned(),
            allowed_hosts: env.get("LEASEKEEPER_ALLOWED_HOSTS").cloned(),
            open_network: env.get("LEASEKEEPER_OPEN_NETWORK").cloned(),
            read_timeout_secs: env.get("LEASEKEEPER_READ_TIMEOUT_SECS").cloned(),
            max_queues: env.get("LEASEKEEPER_MAX_QUEUES").cloned(),
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
    assert_eq!(s.failed_retention, Duration::from_secs(30 * 24 * 3600));
    assert_eq!(
        s.maintenance_config().failed_retention,
        Duration::from_secs(30 * 24 * 3600)
    );
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

#[test]
fn the_prefetch_wait_defaults_to_a_second_and_refuses_what_is_not_a_wait() {
    let s = resolve(None, SettingArgs::default()).unwrap();
    assert_eq!(s.prefetch_wait, Duration::from_secs(1));
    let s = resolve(
        Some("[leasekeeper]\nprefetch_wait_secs = 5\n"),
        SettingArgs::default(),
    )
    .unwrap();
    assert_eq!(s.prefetch_wait, Duration::from_secs(5));
    for bad in ["0", "-1", "NaN", "soon", "3601"] {
        let args = SettingArgs {
            prefetch_wait_secs: Some(bad.into()),
            ..Default::default()
        };
        let err = resolve(None, args).unwrap_err().to_string();
        assert!(err.contains("prefetch_wait_secs"), "{bad}: {err}");
    }
}

#[test]
fn worker_token_follows_the_admin_tokens_rules_and_must_differ() {
    let with = |admin: Option<&str>, worker: &str| {
        resolve(
            None,
            SettingArgs {
                admin_token: admin.map(Into::into),
                worker_token: Some(worker.into()),
                ..SettingArgs::default()
            },
        )
    };
    let err = with(None, "short-secret").unwrap_err().to_string();
    assert!(
        err.contains("LEASEKEEPER_WORKER_TOKEN") && err.contains("16 to 256"),
        "{err}"
    );
    assert!(
        !err.contains("short-secret"),
        "a token error repeats the token: {err}"
    );
    let same = "0123456789abcdef";
    let err = with(Some(same), same).unwrap_err().to_string();
    assert!(err.contains("must differ"), "{err}");
    let ok = with(Some("fedcba9876543210"), same).unwrap();
    assert_eq!(ok.worker_token.as_ref().map(Secret::expose), Some(same));
    assert_eq!(with(None, "").unwrap().worker_token, None);
}

#[test]
fn allowed_hosts_are_names_lower_cased() {
    let with = |hosts: &str| {
        resolve(
            None,
            SettingArgs {
                allowed_hosts: Some(hosts.into()),
                ..SettingArgs::default()
            },
        )
    };
    assert_eq!(
        with(" Jobs.Example.com, .internal ,")
            .unwrap()
            .allowed_hosts,
        vec!["jobs.example.com".to_string(), ".internal".to_string()]
    );
    for bad in ["10.0.0.1", "jobs.example.com:3000", "a b", "."] {
        let err = with(bad).unwrap_err().to_string();
        assert!(err.contains("LEASEKEEPER_ALLOWED_HOSTS"), "{bad}: {err}");
    }
    assert!(
        resolve(None, SettingArgs::default())
            .unwrap()
            .allowed_hosts
            .is_empty()
    );
}

#[test]
fn debug_output_hides_secrets() {
    let s = resolve(
        None,
        SettingArgs {
            admin_token: Some("admin-secret-0123456789".into()),
            worker_token: Some("worker-secret-0123456789".into()),
            database_url: Some("postgres://app:hunter2@db/jobs".into()),
            pooler: Some("transaction".into()),
            direct_database_url: Some("postgres://app:directpass@db-direct/jobs".into()),
            ..SettingArgs::default()
        },
    )
    .unwrap();
    for text in [
        format!("{s:?}"),
        format!(
            "{:?}",
            SettingArgs {
                admin_token: Some("admin-secret-0123456789".into()),
                database_url: Some("postgres://app:hunter2@db/jobs".into()),
                direct_database_url: Some("postgres://app:directpass@db-direct/jobs".into()),
                ..SettingArgs::default()
            }
        ),
    ] {
        for secret in ["admin-secret", "worker-secret", "hunter2", "directpass"] {
            assert!(!text.contains(secret), "{secret} shows in {text}");
        }
    }
}

#[test]
fn a_transaction_pooler_marks_the_schema_and_takes_a_direct_url_for_sessions() {
    let url = "postgres://app:pw@bouncer:6432/jobs";
    let direct = "postgres://app:pw@db:5432/jobs";
    // Default: directly connected, nothing marked.
    let s = resolve(None, SettingArgs::default()).unwrap();
    assert!(!s.schema.is_behind_transaction_pooler());
    assert_eq!(s.direct_database_url, None);
    // Transaction mode marks the schema (every pool and handle follows it),
    // from the file, the environment or the flag, in any case.
    let file = format!("[leasekeeper]\ndatabase_url = \"{url}\"\npooler = \"Transaction\"\n");
    let s = resolve(Some(&file), SettingArgs::default()).unwrap();
    assert!(s.schema.is_behind_transaction_pooler());
    assert_eq!(s.schema.as_str(), "leasekeeper");
    let s = resolve(
        None,
        SettingArgs {
            database_url: Some(url.into()),
            pooler: Some("transaction".into()),
            direct_database_url: Some(direct.into()),
            ..SettingArgs::default()
        },
    )
    .unwrap();
    assert_eq!(
        s.direct_database_url.as_ref().map(Secret::expose),
        Some(direct)
    );
    // Session mode keeps sessions: the same as none.
    let s = resolve(
        None,
        SettingArgs {
            database_url: Some(url.into()),
            pooler: Some("session".into()),
            ..SettingArgs::default()
        },
    )
    .unwrap();
    assert!(!s.schema.is_behind_transaction_pooler());

    // Refused, each naming the setting in one line.
    let refused = |args: SettingArgs, names: &str, says: &str| {
        let err = resolve(None, args).unwrap_err().to_string();
        assert!(err.contains(names) && err.contains(says), "{err}");
        assert!(!err.contains('\n'), "{err}");
        assert!(!err.contains("pw@"), "a URL's password in {err}");
    };
    refused(
        SettingArgs {
            database_url: Some(url.into()),
            pooler: Some("statement".into()),
            ..SettingArgs::default()
        },
        "setting pooler (--pooler / LEASEKEEPER_POOLER)",
        "must be none",
    );
    refused(
        SettingArgs {
            pooler: Some("transaction".into()),
            ..SettingArgs::default()
        },
        "setting pooler",
        "embedded cluster has no pooler",
    );
    refused(
        SettingArgs {
            database_url: Some(url.into()),
            direct_database_url: Some(direct.into()),
            ..SettingArgs::default()
        },
        "setting direct_database_url (--direct-database-url / LEASEKEEPER_DIRECT_DATABASE_URL)",
        "only behind a transaction pooler",
    );
    refused(
        SettingArgs {
            database_url: Some(url.into()),
            pooler: Some("transaction".into()),
            direct_database_url: Some("mysql://app:pw@db/jobs".into()),
            ..SettingArgs::default()
        },
        "setting direct_database_url",
        "is not a PostgreSQL URL",
    );
}

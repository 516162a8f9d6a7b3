//! The binary's start-up: bad settings stop it with one line naming the
//! setting, before it touches a database or a port.

use std::process::Command;

fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leasekeeper"));
    cmd.args(args).env_remove("DATABASE_URL").env(
        "LEASEKEEPER_CONFIG",
        concat!(env!("CARGO_MANIFEST_DIR"), "/Leptos.toml"),
    );
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running leasekeeper");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_unparsable_setting_stops_start_up_naming_it() {
    let (code, stderr) = run(&[], &[("LEASEKEEPER_LEASE_TTL_SECS", "abc")]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("LEASEKEEPER_LEASE_TTL_SECS"), "{stderr}");
}

#[test]
fn a_ttl_not_above_the_renew_interval_stops_start_up() {
    let (code, stderr) = run(
        &["--renew-interval-secs", "4"],
        &[("LEASEKEEPER_LEASE_TTL_SECS", "3")],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("renew_interval_secs"), "{stderr}");
    assert!(stderr.contains("shorter than the lease TTL"), "{stderr}");
}

#[test]
fn a_bad_listen_address_flag_wins_over_the_environment_and_is_named() {
    let (code, stderr) = run(
        &["--addr", "nonsense"],
        &[("LEPTOS_SITE_ADDR", "127.0.0.1:3999")],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("site_addr") && stderr.contains("\"nonsense\""),
        "{stderr}"
    );
}

#[test]
fn changing_only_the_ttl_moves_the_renew_interval_with_it() {
    // With the repository's Leptos.toml, a short TTL alone must be a valid
    // configuration (the intervals default to TTL / 3): start-up then gets
    // past settings and fails later, on the bad database URL we give it.
    let (code, stderr) = run(
        &["--database-url", "postgres://nobody@127.0.0.1:1/none"],
        &[("LEASEKEEPER_LEASE_TTL_SECS", "2")],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(!stderr.contains("setting "), "{stderr}");
    assert!(stderr.contains("cannot connect to PostgreSQL"), "{stderr}");
}

#[test]
fn a_schema_leasekeeper_must_not_use_stops_start_up_naming_it() {
    // The flag wins over the environment's valid name.
    let (code, stderr) = run(
        &["--schema", "public"],
        &[("LEASEKEEPER_SCHEMA", "svc_jobs")],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("setting schema (--schema / LEASEKEEPER_SCHEMA)")
            && stderr.contains("\"public\"")
            && stderr.contains("default schema"),
        "{stderr}"
    );
    let (code, stderr) = run(&[], &[("LEASEKEEPER_SCHEMA", "Svc-Jobs")]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("lowercase identifier"), "{stderr}");
}

//! `leasekeeper bench retention` end to end, small. Its own test binary,
//! so it never runs beside the queue bench's smoke test: both use the
//! benchmark's embedded cluster, and one run's clean-up would end the
//! other's connections.

use std::process::Command;

/// `leasekeeper bench retention` on a small run: it writes its figures, and
/// the pruning run really pruned (its most task rows stay well below the
/// baseline's, which keeps every task). Sizes, not speeds, are asserted.
#[test]
fn a_small_retention_bench_prunes_and_the_baseline_does_not() {
    let json = std::env::temp_dir().join(format!(
        "leasekeeper-bench-retention-{}.json",
        std::process::id()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_leasekeeper"))
        .args([
            "bench",
            "retention",
            "--tasks",
            "10000",
            "--prune-older-than-secs",
            "1",
            "--prune-every-secs",
            "1",
            "--json",
        ])
        .arg(&json)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "error")
        .env(
            "LEASEKEEPER_CONFIG",
            concat!(env!("CARGO_MANIFEST_DIR"), "/Leptos.toml"),
        )
        .output()
        .expect("running leasekeeper bench retention");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench retention failed:\n{stderr}");
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("the JSON file")).unwrap();
    let _ = std::fs::remove_file(&json);
    let n = |key: &str| {
        results[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} is not a number: {results}"))
    };
    for key in [
        "retention_tasks_per_s",
        "baseline_tasks_per_s",
        "retention_max_mb",
    ] {
        assert!(n(key) > 0.0, "{key}: {results}");
    }
    assert_eq!(n("baseline_max_task_rows"), 10_000.0, "{results}");
    assert!(
        n("retention_max_task_rows") < 0.8 * n("baseline_max_task_rows"),
        "the pruning run kept too many rows: {results}"
    );
    assert!(
        n("retention_max_event_rows") < 0.8 * n("baseline_max_event_rows"),
        "{results}"
    );
}

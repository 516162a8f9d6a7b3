//! `leasekeeper-tools chaos` on the highly available database (Patroni, etcd,
//! HAProxy; two PostgreSQL nodes), both ways:
//!
//! - with synchronous replication (the supported configuration), primary
//!   failovers, partitions of an instance from the database and a failover
//!   to a standby whose clock is off break no invariant (the every-second
//!   schedule's ticks included), and every process recovers by itself;
//! - with asynchronous replication, the same failover (the standby a second
//!   behind when the primary dies) loses acknowledged commits, and the
//!   checks catch it: the proof that they can fail.
//!
//! One test, so the two runs never share the machine; its own binary, so it
//! runs alone.

use leasekeeper_tools::testing;

const TOOLS: &str = env!("CARGO_BIN_EXE_leasekeeper-tools");

use serde_json::Value;

fn chaos(args: &[&str]) -> (bool, Value, String) {
    let run = testing::run(TOOLS, &[&["chaos"], args].concat());
    (run.ok, run.report().clone(), run.text)
}

fn faults_of<'a>(report: &'a Value, kind: &str) -> Vec<&'a Value> {
    report["faults"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == kind)
        .collect()
}

#[test]
fn failovers_keep_every_invariant_with_sync_replication_and_async_is_caught() {
    let (ok, report, out) = chaos(&[
        "--quick",
        "--faults",
        "pg_failover,partition,clock_skew",
        "--seconds",
        "50",
    ]);
    assert!(ok, "chaos failed on the supported configuration:\n{out}");
    assert_eq!(report["violations"], Value::Array(vec![]), "{out}");
    assert_eq!(report["database"]["replication"], "sync", "{out}");
    for zero in [
        "duplicates",
        "lost",
        "stale_writes_accepted",
        "claims_missing_from_lease_events",
        "token_order_violations",
        "two_live_holders",
        "two_believing_holders",
        "generated_outside_term",
        "schedule_ticks_missing",
        "schedule_ticks_doubled",
        "schedule_tokens_backwards",
        "schedule_task_mismatches",
        "schedule_ticks_late",
    ] {
        assert_eq!(report["totals"][zero], 0, "{zero}:\n{out}");
    }
    assert!(
        report["totals"]["schedule_ticks"].as_u64().unwrap_or(0) >= 40,
        "{out}"
    );
    let failovers: Vec<&Value> = faults_of(&report, "pg_failover")
        .into_iter()
        .chain(faults_of(&report, "clock_skew"))
        .collect();
    assert!(!failovers.is_empty(), "no failover injected:\n{out}");
    for f in &failovers {
        // Patroni promoted the standby, and every process came back.
        assert!(f["promoted_ms"].as_f64().is_some(), "{f}");
        for what in ["first claim", "generator"] {
            assert!(f["recoveries"][what].as_f64().is_some(), "{what}: {f}");
        }
    }
    for f in faults_of(&report, "clock_skew") {
        let measured = f["skew_measured_ms"]
            .as_f64()
            .expect("the skew was measured");
        // 150 ms ahead or behind, as set.
        let set = f["skew_ms"].as_f64().expect("the skew set");
        assert_eq!(set.abs(), 150.0, "{f}");
        assert!(
            (measured - set).abs() < 100.0,
            "the standby's clock was not skewed as set: {f}"
        );
    }
    let partitions = faults_of(&report, "partition");
    assert!(!partitions.is_empty(), "no partition injected:\n{out}");
    for f in partitions.iter().filter(|f| f["taken_over_ms"].is_number()) {
        // The cut-off generator holder stopped before anyone took over.
        assert!(
            f["stepped_down_ms"].as_f64().unwrap() < f["taken_over_ms"].as_f64().unwrap(),
            "{f}"
        );
    }

    let (ok, report, out) = chaos(&[
        "--quick",
        "--faults",
        "pg_failover",
        "--replication",
        "async",
        "--seconds",
        "30",
    ]);
    assert!(
        !ok,
        "asynchronous replication lost nothing across failovers?\n{out}"
    );
    assert_eq!(report["database"]["replication"], "async", "{out}");
    assert!(!faults_of(&report, "pg_failover").is_empty(), "{out}");
    let totals = &report["totals"];
    let caught: u64 = [
        "lost",
        "duplicates",
        "stale_writes_accepted",
        "claims_missing_from_lease_events",
        "token_order_violations",
    ]
    .iter()
    .map(|k| totals[*k].as_u64().unwrap_or(0))
    .sum();
    assert!(
        caught > 0,
        "the failover lost commits but no check saw it:\n{out}"
    );
}

//! `leasekeeper-tools bench --quick --json PATH` runs every phase of the queue
//! suite end to end and writes every key the issue asks for. No timing is
//! asserted here (speed is the benchmark's business, not a test's); what is
//! asserted: each figure is a positive number (graphile-worker's, and the
//! ratios to them, may be `null` when npm is unavailable, with a note on
//! stderr; Awa's may not: cargo is always there, and `.ci/setup` builds it),
//! and the failover phase lost no task and completed none twice.
//! Its own test binary, so it runs alone.

use leasekeeper_tools::testing;

const TOOLS: &str = env!("CARGO_BIN_EXE_leasekeeper-tools");

const KEYS: &[&str] = &[
    "throughput_w1",
    "throughput_w16",
    "throughput_w64",
    "throughput_batched",
    "raw_ceiling_w16",
    "minimal_ceiling_w16",
    "original_design_w16",
    "graphile_default_w16",
    "graphile_best_w16",
    "graphile_best_w16_rows_per_task",
    "fleet_w16",
    "fleet_w16_rows_per_task",
    "fleet_best_w16",
    "fleet_best_w16_rows_per_task",
    "fleet_w16_vs_graphile_default",
    "fleet_best_vs_fastest_peer",
    "lease_events_per_task",
    "fleet_latency_p50_ms",
    "rows_per_task",
    "rows_per_task_tasks",
    "rows_per_task_lease_events",
    "rows_per_task_attempts",
    "fleet_latency_no_linger_p50_ms",
    "pickup_p50_ms",
    "pickup_p99_ms",
    "fleet_instances_1",
    "fleet_instances_2",
    "fleet_instances_4",
    "history_rows",
    "fleet_w16_history",
    "history_vs_empty",
    "claim_p50_ms",
    "claim_p99_ms",
    "wakeup_p50_ms",
    "depth_ratio_1m_vs_1k",
    "renew_p99_ms",
    "renews_per_s",
    "failover_p99_s",
    "failover_bound_s",
    "rescue_p50_ms",
    "rescue_p99_ms",
    "rescue_ttl_s",
    "rescue_worker_p50_ms",
    "rescue_worker_p99_ms",
    "w16_vs_raw_ceiling",
    "batched_vs_w16",
    "fleet_w16_vs_graphile_best",
    "throughput_w16_vs_graphile_default",
    "awa_default_w16",
    "awa_best_w16",
    "enqueue_many_per_s",
    "graphile_add_jobs_per_s",
    "awa_insert_many_per_s",
    "fleet_w16_vs_awa_default",
    "fleet_w16_vs_awa_best",
    "enqueue_many_vs_fastest_peer",
];

/// Keys that are `null` when graphile-worker could not run (no npm or
/// node), which the bench then says on stderr.
const GRAPHILE_KEYS: &[&str] = &[
    "graphile_add_jobs_per_s",
    "graphile_best_w16_rows_per_task",
    "graphile_default_w16",
    "graphile_best_w16",
    "fleet_w16_vs_graphile_best",
    "throughput_w16_vs_graphile_default",
    "fleet_w16_vs_graphile_default",
];

#[test]
fn the_quick_queue_bench_writes_every_key_and_loses_no_task() {
    let charts =
        std::env::temp_dir().join(format!("leasekeeper-bench-charts-{}", std::process::id()));
    let run = testing::run(
        TOOLS,
        &["bench", "--quick", "--charts", charts.to_str().unwrap()],
    );
    let results = run.succeeded();
    let stderr = &run.stderr;
    for key in KEYS {
        let v = &results[key];
        if GRAPHILE_KEYS.contains(key) && v.is_null() {
            assert!(
                stderr.contains("graphile-worker skipped"),
                "null without a reason:\n{stderr}"
            );
            continue;
        }
        let n = v
            .as_f64()
            .unwrap_or_else(|| panic!("{key} is not a number: {v}"));
        assert!(n > 0.0, "{key} = {n}");
    }
    for (file, series) in [
        ("scale_out.svg", "16 workers per process"),
        ("baselines.svg", "fleet_w16"),
    ] {
        let svg = std::fs::read_to_string(charts.join(file)).expect("the chart");
        assert!(svg.contains(series), "{file} lacks {series}");
    }
    let _ = std::fs::remove_dir_all(&charts);
    // The race's protocol and every contestant's rounds and settings are
    // written beside the figures: alternated rounds, two at least in a
    // quick run (three in a full one, a unit test of the protocol says).
    let protocol = &results["protocol"];
    assert!(protocol["rounds"].as_u64() >= Some(2), "{protocol}");
    for key in [
        "fleet_w16",
        "fleet_best_w16",
        "awa_default_w16",
        "awa_best_w16",
    ] {
        let rounds = results[format!("{key}_rounds")]
            .as_array()
            .unwrap_or_else(|| panic!("{key}_rounds: {results}"));
        assert_eq!(
            rounds.len() as u64,
            protocol["rounds"].as_u64().unwrap(),
            "{key}"
        );
        assert!(
            rounds.iter().all(|v| v.as_f64() > Some(0.0)),
            "{key}: {rounds:?}"
        );
        assert!(
            results[format!("{key}_settings")].is_object(),
            "{key}_settings"
        );
    }
    assert_eq!(
        results["fleet_best_w16_settings"]["workers"], 16,
        "{results}"
    );
    assert!(
        results["enqueue_many_per_s_rounds"]
            .as_array()
            .map(Vec::len)
            >= Some(3),
        "three bulk rounds at least in a quick run (five in a full one)"
    );
    assert_eq!(results["failover_tasks_lost"], 0.0, "{results}");
    assert_eq!(results["failover_tasks_completed_twice"], 0.0, "{results}");
    assert_eq!(results["rescue_tasks_lost"], 0.0, "{results}");
    assert_eq!(results["rescue_tasks_completed_twice"], 0.0, "{results}");
    // Rescued by the closed session, not by the leases running out.
    assert!(
        results["rescue_max_ms"].as_f64()
            < Some(results["rescue_ttl_s"].as_f64().unwrap() * 1000.0),
        "{results}"
    );
    // Worker processes too, by their closed session streams.
    assert_eq!(results["rescue_worker_tasks_lost"], 0.0, "{results}");
    assert_eq!(
        results["rescue_worker_tasks_completed_twice"], 0.0,
        "{results}"
    );
    assert!(
        results["rescue_worker_max_ms"].as_f64()
            < Some(results["rescue_ttl_s"].as_f64().unwrap() * 1000.0),
        "{results}"
    );
    // The table went to stdout, the phases to stderr.
    assert!(run.stdout.contains("throughput_w16"), "{}", run.stdout);
    // Every phase ran: the last one numbered is the last of all.
    let last = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("bench ["))
        .filter_map(|l| l.split(']').next())
        .next_back()
        .expect("phase lines on stderr");
    let (n, total) = last.split_once('/').expect("bench [n/total]");
    assert_eq!(n, total, "the last phase reached: {stderr}");
}

//! `leasekeeper-tools bench retention` end to end, small. Its own test binary,
//! so it never runs beside the queue bench's smoke test: both use the
//! benchmark's embedded cluster, and one run's clean-up would end the
//! other's connections.

use leasekeeper_tools::testing;

const TOOLS: &str = env!("CARGO_BIN_EXE_leasekeeper-tools");

/// `leasekeeper-tools bench retention` on a small run: it writes its figures, and
/// the pruning run really pruned (its most task rows stay well below the
/// baseline's, which keeps every task). Sizes, not speeds, are asserted.
///
/// The run must last several retention periods whatever the machine's
/// speed: with 10,000 tasks a fast machine finished in two seconds, before
/// the first prune had anything older than a second to delete, and kept
/// every row. 60,000 tasks take at least six seconds at the fastest rate
/// seen here (about 10,000/s), while the producer's backlog of 22,000 and
/// two seconds of completions stay below 80 % of them.
#[test]
fn a_small_retention_bench_prunes_and_the_baseline_does_not() {
    let run = testing::run(
        TOOLS,
        &[
            "bench",
            "retention",
            "--tasks",
            "60000",
            "--prune-older-than-secs",
            "1",
            "--prune-every-secs",
            "1",
        ],
    );
    let results = run.succeeded();
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
    assert_eq!(n("baseline_max_task_rows"), 60_000.0, "{results}");
    assert!(
        n("retention_max_task_rows") < 0.8 * n("baseline_max_task_rows"),
        "the pruning run kept too many rows: {results}"
    );
    assert!(
        n("retention_max_event_rows") < 0.8 * n("baseline_max_event_rows"),
        "{results}"
    );
}

//! `leasekeeper-tools chaos --quick`: one 60-second round of every fault kind
//! against real worker and server processes on the harness's own
//! PostgreSQL cluster, with a schedule ticking every second, then 500
//! barrier races. The harness itself fails (non-zero exit) when an
//! invariant breaks; here we also read its JSON report: every fault kind
//! was injected, no task lost or done twice, no stale write accepted, every
//! refusal recorded, every tick fired once and in time, the queue's limits
//! held and reached, workflows ran in order and cascaded, waiting tasks
//! were signalled once, the races real.
//! Its own test binary, so it runs alone.

use leasekeeper_tools::testing;

const TOOLS: &str = env!("CARGO_BIN_EXE_leasekeeper-tools");

use serde_json::Value;

const KINDS: [&str; 9] = [
    "killworker",
    "pauseworker",
    "killgeneratorholder",
    "restartpostgres",
    "loseanswer",
    "killschedulerholder",
    "pauseschedulerholder",
    "cutliveness",
    "freezemidclaim",
];

#[test]
fn a_quick_chaos_round_breaks_no_invariant() {
    let run = testing::run(TOOLS, &["chaos", "--quick"]);
    let report = run.succeeded();
    let stdout = &run.stdout;
    assert_eq!(report["violations"], Value::Array(vec![]), "{stdout}");
    for kind in KINDS {
        let row = &report["per_fault"][kind];
        assert!(
            row["faults"].as_u64().unwrap_or(0) >= 1,
            "{kind} never injected:\n{stdout}"
        );
        assert_eq!(row["duplicates"], 0, "{kind}:\n{stdout}");
        assert_eq!(row["lost"], 0, "{kind}:\n{stdout}");
    }
    let totals = &report["totals"];
    for zero in [
        "duplicates",
        "lost",
        "stale_writes_accepted",
        "refusals_missing_from_lease_events",
        "claims_missing_from_lease_events",
        "takeovers_misrecorded",
        "token_order_violations",
        "two_live_holders",
        "two_believing_holders",
        "generated_outside_term",
        "schedule_ticks_missing",
        "schedule_ticks_doubled",
        "schedule_tokens_backwards",
        "schedule_task_mismatches",
        "schedule_ticks_unexpected",
        "schedule_ticks_late",
        "limits_over_max_started",
        "limits_over_max_per_key",
        "limits_over_bucket",
        "workflow_children_claimed_early",
        "workflow_children_not_cascaded",
        "workflow_edges_miscounted",
        "workflow_children_not_revived",
        "waits_signals_wrong",
    ] {
        assert_eq!(totals[zero], 0, "{zero}:\n{stdout}");
    }
    // Workflows ran (a diamond every 3 s, a third of them cascading) and
    // tasks waited for signals that reached them through the faults.
    for some in [
        "workflows",
        "workflow_children_cascaded",
        "workflow_parents_retried",
        "workflow_children_revived",
        "waits",
        "waits_signalled",
    ] {
        assert!(totals[some].as_u64().unwrap_or(0) >= 3, "{some}:\n{stdout}");
    }
    // The schedule ticked through the whole round (a tick a second), and
    // the faults hit its holder (killed and paused at least).
    assert!(
        totals["schedule_ticks"].as_u64().unwrap_or(0) >= 50,
        "{stdout}"
    );
    assert!(
        totals["schedule_worst_lateness_ms"].as_u64().is_some(),
        "{stdout}"
    );
    assert!(
        totals["schedule_holder_hits"].as_u64().unwrap_or(0) >= 2,
        "{stdout}"
    );
    // Work was done, by both the enqueuer and the generator, and some of it
    // was taken over from dead or paused holders.
    assert!(totals["processed"].as_u64().unwrap_or(0) >= 100, "{stdout}");
    assert!(totals["generated"].as_u64().unwrap_or(0) >= 10, "{stdout}");
    assert!(totals["takeovers"].as_u64().unwrap_or(0) >= 1, "{stdout}");
    // The queue's limits bound: the fleet reached max_started and a key its
    // max_started_per_key, and the bucket ran (all but) empty.
    let set = &totals["limits_set"];
    assert_eq!(
        totals["limits_most_started"], set["max_started"],
        "{stdout}"
    );
    assert_eq!(
        totals["limits_most_started_per_key"], set["max_started_per_key"],
        "{stdout}"
    );
    assert!(
        totals["limits_claim_instants_at_bucket_edge"]
            .as_u64()
            .unwrap_or(0)
            >= 1,
        "{stdout}"
    );
    let races = &report["barrier_races"];
    assert_eq!(races["rounds"], 500, "{stdout}");
    assert!(stdout.contains("all invariants hold"), "{stdout}");
}

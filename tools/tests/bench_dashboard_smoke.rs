//! `leasekeeper-tools bench dashboard --quick --pixel-only`: the push-to-pixel
//! phase end to end (Chromium through playwright-core), writing every key.
//! No speed is asserted (that is the benchmark's business). Its own test
//! binary, so it never runs beside the other benches' smoke tests: all use
//! the benchmark's embedded cluster.
//!
//! The browser needs a site built by `cargo leptos build` at this commit
//! and profile (the server refuses another build's bundle), and node,
//! playwright-core and Chromium. Where one is missing (command 2 runs the
//! Rust tests before `cargo leptos end-to-end` builds the site), the bench
//! writes every key as `null` and says why on stderr; this test then checks
//! exactly that, so it never passes on silence. Command 2 builds the site
//! first and sets `LEASEKEEPER_BENCH_REQUIRE_BROWSER=1`: there a skipped
//! phase is a failure, so the browser really runs in CI.

use leasekeeper_tools::bench::pixel::KEYS;
use leasekeeper_tools::testing;

const TOOLS: &str = env!("CARGO_BIN_EXE_leasekeeper-tools");

#[test]
fn the_quick_push_to_pixel_bench_writes_every_key() {
    let run = testing::run(TOOLS, &["bench", "dashboard", "--quick", "--pixel-only"]);
    let results = run.succeeded();
    let skipped = run.stderr.contains("push to pixel skipped");
    assert!(
        !(skipped && std::env::var_os("LEASEKEEPER_BENCH_REQUIRE_BROWSER").is_some()),
        "the browser was required (LEASEKEEPER_BENCH_REQUIRE_BROWSER) but the phase was skipped:\n{}",
        run.stderr
    );
    for key in KEYS {
        let v = &results[key];
        if skipped {
            assert!(v.is_null(), "{key} = {v} although the phase was skipped");
            continue;
        }
        let n = v
            .as_f64()
            .unwrap_or_else(|| panic!("{key} is not a number: {v}\n{}", run.text));
        // The target's flag is 0 or 1; every other figure is a time, a
        // rate or a ratio, all positive.
        if key == "push_to_pixel_p95_within_150ms" {
            assert!(n == 0.0 || n == 1.0, "{key} = {n}");
        } else {
            assert!(n > 0.0, "{key} = {n}");
        }
    }
    if !skipped {
        // The profile went to stderr, a line per page and phase.
        assert_eq!(
            run.stderr.matches("ms after the commit").count(),
            4,
            "{}",
            run.stderr
        );
    }
}

//! The task claim raced for real, 500 rounds (see
//! `leasekeeper_tools::fault::race`, which `leasekeeper-tools chaos` runs too): a
//! takeover racing the old holder's completion or heartbeat at the instant
//! its deadline passes never lets both win, takes the next token, and is
//! recorded, as is every refused write. `race::run` fails at the first
//! broken invariant; here we also require that both outcomes happened, so
//! the race was real and not decided by the setup.

use crate::common::TestDb;
use leasekeeper_tools::fault::race;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_takeover_racing_the_old_holders_write_never_lets_both_win() {
    let db = TestDb::with_connections(8).await;
    let report = race::run(&db.pool, 500).await.unwrap();
    eprintln!("{report:?}");
    assert_eq!(report.rounds, 500);
    assert_eq!(
        report.old_won + report.new_won + report.neither,
        500,
        "{report:?}"
    );
    assert!(report.old_won > 0 && report.new_won > 0, "{report:?}");
    assert_eq!(report.takeovers_recorded, report.new_won as i64);
    assert_eq!(report.refusals_recorded, report.refusals_expected);
}

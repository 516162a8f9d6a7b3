//! The fault harness's checker (`leasekeeper_tools::fault::check`) can fail: on a
//! database and a history where a task was done twice, a refusal went
//! unrecorded, a claim is missing from `lease_events` and a task never
//! finished, it reports each of them; on the honest version of the same
//! story it reports nothing.

use crate::common::{TestDb, holder};
use leasekeeper::worker::history::{Op, OpKind, Outcome};
use leasekeeper_core::queue::store;
use leasekeeper_tools::fault::check::check;
use serde_json::json;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

fn op(worker: &str, kind: OpKind, task: i64, token: i64, outcome: Outcome) -> Op {
    Op {
        worker: worker.into(),
        op: kind,
        task: Some(task),
        token: Some(token),
        outcome,
        sent_ms: 0,
        returned_ms: 0,
    }
}

#[tokio::test]
async fn the_checker_reports_what_is_wrong_and_only_that() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    // Task a: claimed by w1, completed by w1; w2's late completion refused.
    let a = store::enqueue(
        &mut conn,
        &Default::default(),
        &leasekeeper_core::queue::NewTask::new(
            leasekeeper_core::worker::simulated::KIND,
            json!({}),
        )
        .max_attempts(5),
    )
    .await
    .unwrap();
    let claim = store::claim_next(&mut conn, &Default::default(), &holder("w1"), TTL)
        .await
        .unwrap()
        .unwrap();
    let token = claim.fencing_token.unwrap();
    store::complete(
        &mut conn,
        &Default::default(),
        a.id,
        &holder("w1"),
        token,
        None,
    )
    .await
    .unwrap();
    assert!(
        store::complete(
            &mut conn,
            &Default::default(),
            a.id,
            &holder("w2"),
            token,
            None
        )
        .await
        .is_err()
    );
    // Task b: enqueued and never claimed.
    let b = store::enqueue(
        &mut conn,
        &Default::default(),
        &leasekeeper_core::queue::NewTask::new(
            leasekeeper_core::worker::simulated::KIND,
            json!({}),
        )
        .max_attempts(5),
    )
    .await
    .unwrap();
    let honest = vec![
        op("w1", OpKind::Claim, a.id, token, Outcome::Ok),
        op("w1", OpKind::Complete, a.id, token, Outcome::Ok),
        op("w2", OpKind::Complete, a.id, token, Outcome::Refused),
    ];
    let c = check(
        &db.pool,
        &honest,
        0,
        TTL,
        &Default::default(),
        &Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(c.lost, vec![b.id], "{c:?}");
    assert_eq!(c.confirmed_by_both, 1);
    assert_eq!(c.refused_completions, 1);
    assert_eq!(c.refusals_recorded, 1);
    assert_eq!(
        c.violations().len(),
        1,
        "only b is wrong: {:?}",
        c.violations()
    );

    // Finish b, then tell a history that the database contradicts.
    let claim = store::claim_next(&mut conn, &Default::default(), &holder("w3"), TTL)
        .await
        .unwrap()
        .unwrap();
    store::complete(
        &mut conn,
        &Default::default(),
        b.id,
        &holder("w3"),
        claim.fencing_token.unwrap(),
        None,
    )
    .await
    .unwrap();
    let c = check(
        &db.pool,
        &honest,
        0,
        TTL,
        &Default::default(),
        &Default::default(),
    )
    .await
    .unwrap();
    assert!(c.violations().is_empty(), "{:?}", c.violations());
    let mut lying = honest.clone();
    // A second accepted completion of a (done twice).
    lying.push(op("w2", OpKind::Complete, a.id, token, Outcome::Ok));
    // A refusal that lease_events never saw.
    lying.push(op("w4", OpKind::Heartbeat, b.id, 99, Outcome::Refused));
    // A claim that lease_events never saw.
    lying.push(op("w5", OpKind::Claim, b.id, 7, Outcome::Ok));
    let c = check(
        &db.pool,
        &lying,
        0,
        TTL,
        &Default::default(),
        &Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(c.duplicates, vec![a.id], "{c:?}");
    assert_eq!(c.refusals_unrecorded, 1, "{c:?}");
    assert_eq!(c.claims_unrecorded, 1, "{c:?}");
    assert!(c.lost.is_empty());
    assert_eq!(c.violations().len(), 3, "{:?}", c.violations());

    // A completion accepted with a token the database did not keep.
    let stale = vec![op("w1", OpKind::Complete, b.id, 1, Outcome::Ok)];
    let c = check(
        &db.pool,
        &stale,
        0,
        TTL,
        &Default::default(),
        &Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(c.stale_accepted.len(), 1, "{c:?}");
}

/// The check of the workers without the token fails one that got in (it
/// exited 0, a call of its was answered, rows of its are in the database),
/// one that never stopped, and one whose last line does not name the 401;
/// it passes one that was refused and left nothing.
#[tokio::test]
async fn the_intruder_check_fails_a_worker_let_in_and_passes_one_refused() {
    use leasekeeper_tools::fault::check::intruders::{Intruder, intruders};
    use std::os::unix::process::ExitStatusExt;
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    store::enqueue(
        &mut conn,
        &Default::default(),
        &leasekeeper_core::queue::NewTask::new(
            leasekeeper_core::worker::simulated::KIND,
            json!({}),
        ),
    )
    .await
    .unwrap();
    let got_in = store::claim_next(&mut conn, &Default::default(), &holder("in"), TTL)
        .await
        .unwrap()
        .unwrap();
    let refused_claim = Op {
        worker: "out".into(),
        op: OpKind::Claim,
        task: None,
        token: None,
        outcome: Outcome::Unauthorized,
        sent_ms: 0,
        returned_ms: 0,
    };
    let refused_line = "leasekeeper: the server at http://127.0.0.1:1 requires a worker token \
                        (401 Unauthorized: a worker token is required): set LEASEKEEPER_WORKER_TOKEN";
    let seen = [
        Intruder {
            id: "in".into(),
            exit: Some(std::process::ExitStatus::from_raw(0)),
            log: String::new(),
            ops: vec![op(
                "in",
                OpKind::Claim,
                got_in.id,
                got_in.fencing_token.unwrap(),
                Outcome::Ok,
            )],
        },
        Intruder {
            id: "stuck".into(),
            exit: None,
            log: String::new(),
            ops: vec![Op {
                worker: "stuck".into(),
                ..refused_claim.clone()
            }],
        },
        Intruder {
            id: "mute".into(),
            exit: Some(std::process::ExitStatus::from_raw(256)),
            log: "leasekeeper: something else".into(),
            ops: vec![Op {
                worker: "mute".into(),
                ..refused_claim.clone()
            }],
        },
        Intruder {
            id: "out".into(),
            exit: Some(std::process::ExitStatus::from_raw(256)),
            log: format!("WARN a line before\n{refused_line}\n"),
            ops: vec![refused_claim],
        },
    ];
    let mut c = leasekeeper_tools::fault::check::Checks::default();
    intruders(&db.pool, &seen, &mut c).await.unwrap();
    let about = |id: &str| {
        c.intrusions
            .iter()
            .filter(|v| v.starts_with(&format!("{id}: ")))
            .cloned()
            .collect::<Vec<_>>()
    };
    let got_in = about("in");
    assert!(
        got_in.iter().any(|v| v.contains("not refused")),
        "{got_in:?}"
    );
    assert!(got_in.iter().any(|v| v.contains("1 call(s)")), "{got_in:?}");
    assert!(
        got_in.iter().any(|v| v.contains("row(s) of its")),
        "{got_in:?}"
    );
    assert_eq!(about("stuck"), vec!["stuck: did not stop by itself"]);
    assert!(
        about("mute")[0].contains("does not name the 401"),
        "{:?}",
        c.intrusions
    );
    assert_eq!(about("out"), Vec::<String>::new());
    assert_eq!(c.intruders_refused, 1);
    assert!(
        c.violations()
            .iter()
            .any(|v| v.starts_with("workers without the token let in: "))
    );
}

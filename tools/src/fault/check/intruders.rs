//! Workers without the run's token: each must be refused (401) before the
//! server touches the database, and must stop by itself naming the cause.
//! Nothing of theirs may be recorded: no claim, no lease event, no refused
//! write, no row in `workers`, no task processed by them.

use super::Checks;
use anyhow::Result;
use leasekeeper::worker::history::{Op, Outcome};
use sqlx::PgPool;
use std::process::ExitStatus;

/// What the harness saw of one intruding worker process.
#[derive(Debug)]
pub struct Intruder {
    /// Its worker id.
    pub id: String,
    /// Its exit status, when it exited by itself in time.
    pub exit: Option<ExitStatus>,
    /// What it wrote to stderr.
    pub log: String,
    /// Its history: every call it made, with what came back.
    pub ops: Vec<Op>,
}

/// Checks every intruder against what it saw and the database behind
/// `pool`, adding what is wrong to [`Checks::intrusions`].
pub async fn intruders(pool: &PgPool, seen: &[Intruder], c: &mut Checks) -> Result<()> {
    for intruder in seen {
        let id = &intruder.id;
        let mut problems: Vec<String> = Vec::new();
        let mut wrong = |what: String| problems.push(format!("{id}: {what}"));
        match intruder.exit {
            None => wrong("did not stop by itself".into()),
            Some(status) if status.success() => wrong(format!("exited {status}, not refused")),
            Some(_) => {}
        }
        // 401 by the contract (a made-up token may get a 403: refused too).
        let last = intruder.log.lines().last().unwrap_or_default();
        if intruder.exit.is_some() && !last.contains("(401") && !last.contains("(403") {
            wrong(format!("its last line does not name the 401: {last:?}"));
        }
        if intruder.ops.is_empty() {
            wrong("made no call at all".into());
        }
        let answered = intruder
            .ops
            .iter()
            .filter(|op| op.outcome != Outcome::Unauthorized)
            .count();
        if answered > 0 {
            wrong(format!("{answered} call(s) not refused 401/403"));
        }
        let recorded: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM lease_events
                      WHERE holder = $1 OR previous_holder = $1)
                  + (SELECT count(*) FROM workers WHERE id = $1)
                  + (SELECT count(*) FROM tasks WHERE processor = $1)",
        )
        .bind(id)
        .fetch_one(pool)
        .await?;
        if recorded > 0 {
            wrong(format!(
                "{recorded} row(s) of its in lease_events, workers or tasks"
            ));
        }
        if problems.is_empty() {
            c.intruders_refused += 1;
        }
        c.intrusions.extend(problems);
    }
    Ok(())
}

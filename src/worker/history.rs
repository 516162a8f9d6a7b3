//! The client's side of the history: every claim, heartbeat, completion and
//! failure report a worker process sends, with what it saw come back: what
//! `leasekeeper worker --history FILE` writes, and what the fault harness
//! (`leasekeeper-tools chaos`) reads back to check against the database.
//!
//! [`Recorded`] wraps a worker's [`Transport`] and appends one JSON line per
//! call to a file once the call returns (a claim that found nothing too, as
//! proof the worker reaches the queue; a report of itself only when its
//! credential was refused). Each line is one `write` on a file opened for
//! appending, so a `kill -9` loses at most the call in flight, which the
//! history then simply does not show; the checker never needs it, because
//! it takes the database's word for what happened and uses the history as
//! an independent witness of what the clients were told.
//!
//! Outcomes: `ok` (the queue accepted), `refused` (HTTP 409/404: the claim
//! is lost), `unauthorized` (HTTP 401/403: the credential was refused and
//! nothing written) and `unknown` (no answer, or an unusable one: the write
//! may or may not have happened, e.g. when the connection dropped after the
//! server committed).

use leasekeeper_core::lease::Holder;
use leasekeeper_core::worker::Report;
use leasekeeper_core::worker::transport::{Claim, ClaimRef, Transport, TransportError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// What was asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    Claim,
    Heartbeat,
    Complete,
    Fail,
    /// The claim ended waiting for a signal (`Done::wait_for`): like a
    /// completion, its belief ends when the answer arrives.
    Wait,
    /// The worker stopped trusting its claim without a write (its local
    /// deadline passed, or its session stream broke): its belief ends
    /// here. Always `ok`, sent and returned at the same instant.
    GaveUp,
    /// A worker's report of itself (`PUT /api/workers/{id}`), recorded
    /// only when its credential was refused: a worker's first call is its
    /// report, so a refused worker's history would otherwise be empty.
    Report,
}

/// What came back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    Refused,
    /// The credential was refused (HTTP 401/403): nothing was written, and
    /// the worker stops.
    Unauthorized,
    Unknown,
}

/// One call, as one line of a history file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Op {
    pub worker: String,
    pub op: OpKind,
    /// The task (unknown for a claim that got no usable answer).
    pub task: Option<i64>,
    pub token: Option<i64>,
    pub outcome: Outcome,
    /// When the call was sent and when it returned, by this machine's wall
    /// clock in Unix milliseconds: for ordering against the harness's own
    /// events only, never for deciding who held what.
    pub sent_ms: i64,
    pub returned_ms: i64,
}

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A transport that records every call of `inner` to a history file.
pub struct Recorded<T> {
    inner: T,
    file: Option<Mutex<std::fs::File>>,
}

impl<T: Transport> Recorded<T> {
    /// Records to `path` (appending) when given; otherwise only passes calls on.
    pub fn new(inner: T, path: Option<&Path>) -> std::io::Result<Self> {
        let file = match path {
            Some(path) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            )),
            None => None,
        };
        Ok(Recorded { inner, file })
    }

    fn record<R>(
        &self,
        worker: &Holder,
        op: OpKind,
        task: Option<i64>,
        token: Option<i64>,
        sent_ms: i64,
        result: &Result<R, TransportError>,
    ) {
        let Some(file) = &self.file else { return };
        let outcome = match result {
            Ok(_) => Outcome::Ok,
            Err(TransportError::Lost(_)) => Outcome::Refused,
            Err(TransportError::Unauthorized(_)) => Outcome::Unauthorized,
            Err(TransportError::Transient(_)) => Outcome::Unknown,
        };
        let line = Op {
            worker: worker.as_str().to_string(),
            op,
            task,
            token,
            outcome,
            sent_ms,
            returned_ms: now_ms(),
        };
        let mut text = serde_json::to_string(&line).expect("an Op serializes");
        text.push('\n');
        let written = file
            .lock()
            .map_err(|_| std::io::Error::other("history lock poisoned"))
            .and_then(|mut f| f.write_all(text.as_bytes()));
        if let Err(e) = written {
            tracing::error!(error = %e, "cannot append to the history file");
        }
    }

    /// [`Recorded::record`] for a write to a claimed task.
    fn record_write<R>(
        &self,
        claim: ClaimRef<'_>,
        op: OpKind,
        sent_ms: i64,
        result: &Result<R, TransportError>,
    ) {
        self.record(
            claim.worker,
            op,
            Some(claim.task_id),
            Some(claim.token),
            sent_ms,
            result,
        );
    }
}

impl<T: Transport> Transport for Recorded<T> {
    async fn claim(&self, worker: &Holder) -> Result<Option<Claim>, TransportError> {
        let sent = now_ms();
        let result = self.inner.claim(worker).await;
        match &result {
            // Recorded too: proof that the worker reaches the queue again
            // after a fault, even when there is nothing to do.
            Ok(None) => self.record(worker, OpKind::Claim, None, None, sent, &result),
            Ok(Some(claim)) => self.record(
                worker,
                OpKind::Claim,
                Some(claim.task_id),
                Some(claim.token),
                sent,
                &result,
            ),
            Err(_) => self.record(worker, OpKind::Claim, None, None, sent, &result),
        }
        result
    }

    async fn heartbeat(&self, claim: ClaimRef<'_>) -> Result<Option<Duration>, TransportError> {
        let sent = now_ms();
        let result = self.inner.heartbeat(claim).await;
        self.record_write(claim, OpKind::Heartbeat, sent, &result);
        result
    }

    async fn complete(&self, claim: ClaimRef<'_>, output: &Value) -> Result<(), TransportError> {
        let sent = now_ms();
        let result = self.inner.complete(claim, output).await;
        self.record_write(claim, OpKind::Complete, sent, &result);
        result
    }

    async fn fail(&self, claim: ClaimRef<'_>, error: &str) -> Result<(), TransportError> {
        let sent = now_ms();
        let result = self.inner.fail(claim, error).await;
        self.record_write(claim, OpKind::Fail, sent, &result);
        result
    }

    async fn fail_as(
        &self,
        claim: ClaimRef<'_>,
        error: &str,
        outcome: leasekeeper_core::queue::AttemptOutcome,
    ) -> Result<(), TransportError> {
        let sent = now_ms();
        let result = self.inner.fail_as(claim, error, outcome).await;
        self.record_write(claim, OpKind::Fail, sent, &result);
        result
    }

    // Not recorded: the simulated work (the only work the fault harness
    // runs through this) never snoozes, so the checker knows no such op.
    async fn snooze(&self, claim: ClaimRef<'_>, delay: Duration) -> Result<(), TransportError> {
        self.inner.snooze(claim, delay).await
    }

    async fn wait_for(
        &self,
        claim: ClaimRef<'_>,
        signal: &str,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        let sent = now_ms();
        let result = self.inner.wait_for(claim, signal, timeout).await;
        self.record_write(claim, OpKind::Wait, sent, &result);
        result
    }

    fn gave_up(&self, worker: &Holder, claim: &Claim) {
        self.inner.gave_up(worker, claim);
        let ok: Result<(), TransportError> = Ok(());
        self.record(
            worker,
            OpKind::GaveUp,
            Some(claim.task_id),
            Some(claim.token),
            now_ms(),
            &ok,
        );
    }

    async fn report(&self, worker: &Holder, report: &Report) -> Result<(), TransportError> {
        let sent = now_ms();
        let result = self.inner.report(worker, report).await;
        if matches!(result, Err(TransportError::Unauthorized(_))) {
            self.record(worker, OpKind::Report, None, None, sent, &result);
        }
        result
    }
}

/// Reads every `*.jsonl` history file in `dir`. A torn last line (the
/// writer killed mid-write, which one `write` of a short line makes
/// unlikely) is skipped and counted.
pub fn read_dir(dir: &Path) -> anyhow::Result<(Vec<Op>, usize)> {
    let mut ops = Vec::new();
    let mut torn = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            for line in std::fs::read_to_string(&path)?.lines() {
                match serde_json::from_str::<Op>(line) {
                    Ok(op) => ops.push(op),
                    Err(_) => torn += 1,
                }
            }
        }
    }
    ops.sort_by_key(|op| (op.sent_ms, op.returned_ms));
    Ok((ops, torn))
}

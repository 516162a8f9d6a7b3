//! What the loop tells the `workers` table about itself, named at the call
//! site: `Status::working(&claim).just_accepted()`, `Status::idle()`.

use super::super::transport::{Claim, Transport};
use super::super::{Report, WorkerState};
use super::Worker;
use tokio::time::Instant;

/// One report's content, before the tallies are added.
#[derive(Clone, Copy, Debug)]
pub(super) struct Status<'c> {
    state: WorkerState,
    claim: Option<&'c Claim>,
    just_accepted: bool,
    first_of_run: bool,
}

impl<'c> Status<'c> {
    fn of(state: WorkerState, claim: Option<&'c Claim>) -> Self {
        Status {
            state,
            claim,
            just_accepted: false,
            first_of_run: false,
        }
    }

    /// Waiting for work, holding no claim.
    pub(super) fn idle() -> Self {
        Status::of(WorkerState::Idle, None)
    }

    /// Working on `claim`.
    pub(super) fn working(claim: &'c Claim) -> Self {
        Status::of(WorkerState::Working, Some(claim))
    }

    /// Frozen by a pause, holding `claim` if any.
    pub(super) fn paused(claim: Option<&'c Claim>) -> Self {
        Status::of(WorkerState::Paused, claim)
    }

    /// Stopped gracefully.
    pub(super) fn stopped() -> Self {
        Status::of(WorkerState::Stopped, None)
    }

    /// Sent right after the queue accepted the claim or its heartbeat (the
    /// table's last heartbeat moves).
    pub(super) fn just_accepted(self) -> Self {
        Status {
            just_accepted: true,
            ..self
        }
    }

    /// The first report of a run: it replaces whatever an earlier run under
    /// the same id left.
    pub(super) fn first_of_run(self) -> Self {
        Status {
            first_of_run: true,
            ..self
        }
    }
}

impl<T: Transport> Worker<T> {
    /// Records what the worker does; a failure is logged, never fatal but
    /// for a refused credential, which stops the loop at its next turn.
    pub(super) async fn report(&mut self, status: Status<'_>) {
        self.last_report = Instant::now();
        let report = Report {
            state: status.state,
            task_id: status.claim.map(|c| c.task_id),
            fencing_token: status.claim.map(|c| c.token),
            heartbeat: status.just_accepted,
            tasks_done: self.tally.done(),
            tasks_abandoned: self.tally.abandoned(),
            fresh: status.first_of_run,
        };
        let sent = tokio::time::timeout(
            self.config.report_timeout,
            self.transport.report(&self.id, &report),
        )
        .await;
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(super::TransportError::Unauthorized(why))) => {
                tracing::debug!(worker = %self.id, error = %why, "the report's credential was refused");
                self.refused = Some(why);
            }
            Ok(Err(e)) => {
                tracing::debug!(worker = %self.id, error = %e, "could not record the worker's state");
            }
            Err(_) => {
                tracing::debug!(worker = %self.id, "recording the worker's state timed out");
            }
        }
    }
}

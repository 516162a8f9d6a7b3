//! A pause ordered from outside (the dashboard's fleet, the fault demo):
//! the worker freezes, no ticks and no heartbeats, then resumes as a
//! process after a long GC pause would, still believing it holds its claim.

use super::super::transport::{Claim, Transport};
use super::Worker;
use super::running::{Outcome, Running};
use super::status::Status;
use std::time::Duration;
use tokio::time::sleep;

impl<T: Transport> Worker<T> {
    /// Freezes for `duration`; true when stopped meanwhile.
    pub(super) async fn freeze(&mut self, duration: Duration, claim: Option<&Claim>) -> bool {
        tracing::warn!(worker = %self.id, pause_ms = duration.as_millis() as u64,
            task_id = claim.map(|c| c.task_id), "paused: no ticks, no heartbeats");
        self.report(Status::paused(claim)).await;
        tokio::select! {
            biased;
            () = self.stop.cancelled() => true,
            () = sleep(duration) => false,
        }
    }

    /// Freezes for `duration` while working on `claim`, then lets the
    /// handler finish: resumed, as a process after a long GC pause, the
    /// worker still believes it holds the claim, so no heartbeat and no
    /// deadline; it writes its completion, which the fencing token refuses
    /// if the task was taken over. The handler's answer, or `None` when the
    /// worker was stopped meanwhile.
    pub(super) async fn pause_mid_task(
        &mut self,
        duration: Duration,
        claim: &Claim,
        running: &mut Running,
    ) -> Option<Outcome> {
        if self.freeze(duration, Some(claim)).await {
            return None;
        }
        tokio::select! {
            biased;
            () = self.stop.cancelled() => None,
            result = &mut running.0 => Some(result),
        }
    }
}

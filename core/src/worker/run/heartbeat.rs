//! A heartbeat in flight, on a timer of its own beside the handler's work:
//! sent (after a chaos stall, if one was drawn) and answered while the loop
//! goes on polling the handler.

use super::super::transport::{Claim, ClaimRef, Transport, TransportError};
use crate::lease::Holder;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// A heartbeat in flight: the instant its request was sent, and the answer
/// (what is left of the lease, when the queue says).
pub(super) type Beat =
    Pin<Box<dyn Future<Output = (Instant, Result<Option<Duration>, TransportError>)> + Send>>;

/// Heartbeats `claim` for `worker`, after `stall` when chaos drew one.
pub(super) fn beat<T: Transport>(
    transport: Arc<T>,
    worker: Holder,
    claim: &Claim,
    stall: Option<Duration>,
) -> Beat {
    let (task_id, token, kind) = (claim.task_id, claim.token, claim.kind.clone());
    Box::pin(async move {
        let claim = ClaimRef {
            worker: &worker,
            task_id,
            token,
            kind: &kind,
        };
        if let Some(stall) = stall {
            tracing::warn!(worker = %worker, task_id, stall_ms = stall.as_millis() as u64,
                "chaos: stalling before a heartbeat (latency spike)");
            sleep(stall).await;
        }
        let sent = Instant::now();
        let answer = transport.heartbeat(claim).await;
        (sent, answer)
    })
}

/// The in-flight heartbeat's answer; never ready when there is none.
pub(super) async fn answer(
    beat: &mut Option<Beat>,
) -> (Instant, Result<Option<Duration>, TransportError>) {
    match beat {
        Some(beat) => beat.as_mut().await,
        None => std::future::pending().await,
    }
}

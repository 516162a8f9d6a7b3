//! Waking idle workers when work arrives, instead of at their next poll;
//! and busy workers when an operator ends a claim ([`CancelSignal`]).
//!
//! An enqueue announces [`Topics::WORK`] right after its commit; the
//! instance's [`LiveHub`] hears it on its one `LISTEN` connection (from any
//! instance, so a task enqueued through instance A wakes workers on B) and
//! passes it to every [`WorkSignal`]. An idle worker waits on its signal
//! with its poll interval as the timeout: the poll remains the fallback for
//! what is never announced (a late task whose lease just expired, a retry
//! whose backoff ended, a hand-written INSERT).

use crate::live::{LiveHub, Topics};
use std::time::Duration;
use tokio::sync::broadcast::{self, error::RecvError};

/// One idle worker's ear for new work.
#[derive(Debug)]
pub struct WorkSignal {
    changes: Option<broadcast::Receiver<Topics>>,
}

impl WorkSignal {
    /// Hears the work announced through `hub`. Announcements made from now
    /// on are kept until [`WorkSignal::wait`] takes them, so work announced
    /// while the worker was busy claiming is not missed.
    pub fn new(hub: &LiveHub) -> Self {
        WorkSignal {
            changes: Some(hub.subscribe()),
        }
    }

    /// Hears nothing: [`WorkSignal::wait`] always waits out its timeout.
    pub fn deaf() -> Self {
        WorkSignal { changes: None }
    }

    /// Waits until new work is announced (true) or `timeout` passes (false).
    /// Missed announcements (the receiver lagged) count as work.
    pub async fn wait(&mut self, timeout: Duration) -> bool {
        let Some(changes) = self.changes.as_mut() else {
            tokio::time::sleep(timeout).await;
            return false;
        };
        let heard = async {
            loop {
                match changes.recv().await {
                    Ok(topics) if topics.contains(Topics::WORK) => return true,
                    Ok(_) => continue,
                    Err(RecvError::Lagged(_)) => return true,
                    Err(RecvError::Closed) => return false,
                }
            }
        };
        match tokio::time::timeout(timeout, heard).await {
            Ok(true) => true,
            Ok(false) => {
                // The hub is gone: fall back to polling for good.
                self.changes = None;
                false
            }
            Err(_) => false,
        }
    }
}

/// One busy worker's ear for cancels: an operator ended a started task's
/// claim ([`Topics::CANCELS`]: a cancel, one or in bulk, or a
/// force-release of its lease), somewhere.
///
/// The announcement does not say whose claim: a worker that hears it
/// heartbeats at once rather than at its next interval, and the database
/// judges. The one whose claim ended is refused, loses the claim, and its
/// handler's [`TaskContext::cancelled`](crate::worker::handler::TaskContext::cancelled)
/// completes; the others' heartbeats are accepted as usual. Cancels are
/// operator actions, rare next to heartbeats, so the extra heartbeats
/// cost little; nothing polls faster than before.
///
/// A worker without a hub (one over the REST API, or behind a transaction
/// pooler, where nothing is heard) learns of the cancel at its next
/// heartbeat, as before.
#[derive(Debug)]
pub struct CancelSignal {
    changes: Option<broadcast::Receiver<Topics>>,
}

impl CancelSignal {
    /// Hears the cancels announced through `hub`.
    pub fn new(hub: &LiveHub) -> Self {
        CancelSignal {
            changes: Some(hub.subscribe()),
        }
    }

    /// Hears nothing: [`CancelSignal::heard`] never completes.
    pub fn deaf() -> Self {
        CancelSignal { changes: None }
    }

    /// Forgets what was announced so far: called before a claim, so the
    /// cancels of earlier claims do not count, while one made after the
    /// claim's request was sent is kept.
    pub fn forget(&mut self) {
        if let Some(changes) = self.changes.as_mut() {
            *changes = changes.resubscribe();
        }
    }

    /// Completes when a cancel is announced (or announcements were missed:
    /// the receiver lagged, the listener reconnected); never when deaf.
    pub async fn heard(&mut self) {
        let Some(changes) = self.changes.as_mut() else {
            return std::future::pending().await;
        };
        loop {
            match changes.recv().await {
                Ok(topics) if topics.contains(Topics::CANCELS) => return,
                Ok(_) => continue,
                Err(RecvError::Lagged(_)) => return,
                Err(RecvError::Closed) => break,
            }
        }
        // The hub is gone: deaf for good.
        self.changes = None;
        std::future::pending().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn wakes_on_work_only_and_otherwise_times_out() {
        let hub = LiveHub::detached();
        let mut signal = WorkSignal::new(&hub);
        hub.publish(Topics::LEASES | Topics::TASKS);
        assert!(!signal.wait(Duration::from_millis(50)).await, "not work");
        hub.publish(Topics::TASKS | Topics::WORK);
        assert!(signal.wait(Duration::from_secs(60)).await);
        // Announced while busy: kept for the next wait.
        hub.publish(Topics::WORK);
        assert!(signal.wait(Duration::from_millis(1)).await);
        assert!(!WorkSignal::deaf().wait(Duration::from_millis(5)).await);
    }

    #[tokio::test(start_paused = true)]
    async fn hears_cancels_only_and_forgets_the_old_ones() {
        let hub = LiveHub::detached();
        let mut signal = CancelSignal::new(&hub);
        let quiet = Duration::from_millis(50);
        hub.publish(Topics::TASKS | Topics::WORK);
        assert!(
            tokio::time::timeout(quiet, signal.heard()).await.is_err(),
            "not a cancel"
        );
        hub.publish(Topics::TASKS | Topics::CANCELS);
        assert!(tokio::time::timeout(quiet, signal.heard()).await.is_ok());
        // A reconnect's "everything" counts.
        hub.publish(Topics::ALL);
        assert!(tokio::time::timeout(quiet, signal.heard()).await.is_ok());
        // Announced before the claim: forgotten.
        hub.publish(Topics::CANCELS);
        signal.forget();
        assert!(tokio::time::timeout(quiet, signal.heard()).await.is_err());
        let mut deaf = CancelSignal::deaf();
        assert!(tokio::time::timeout(quiet, deaf.heard()).await.is_err());
        // The hub gone: deaf, not spinning.
        drop(hub);
        assert!(tokio::time::timeout(quiet, signal.heard()).await.is_err());
    }
}

//! Waking idle workers when work arrives, instead of at their next poll.
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
}

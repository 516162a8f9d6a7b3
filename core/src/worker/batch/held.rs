//! What the batcher's loops share to wait and to write: a connection kept
//! while a loop is busy, a channel to wait on, and the shared state lock
//! that a panicking worker cannot poison.

use super::Setup;
use crate::worker::transport::TransportError;
use std::time::Duration;
use tokio::sync::mpsc;

/// Takes whatever else is waiting in `rx` right now, up to `max` in all.
pub(super) fn drain<T>(rx: &mut mpsc::UnboundedReceiver<T>, batch: &mut Vec<T>, max: usize) {
    while batch.len() < max {
        match rx.try_recv() {
            Ok(item) => batch.push(item),
            Err(_) => break,
        }
    }
}

/// How long a loop keeps its connection after its last statement: while
/// busy it keeps one (no round trip to check a pooled connection before
/// every statement); idle, it gives it back to the pool.
const HOLD_IDLE: Duration = Duration::from_millis(100);

/// A loop's connection, taken from the pool when needed and kept while
/// the loop is busy.
#[derive(Default)]
pub(super) struct Held(Option<sqlx::pool::PoolConnection<sqlx::Postgres>>);

/// A channel a loop waits on.
pub(super) trait Inbox<T> {
    fn recv(&mut self) -> impl std::future::Future<Output = Option<T>> + Send;
}

impl<T: Send> Inbox<T> for mpsc::UnboundedReceiver<T> {
    fn recv(&mut self) -> impl std::future::Future<Output = Option<T>> + Send {
        mpsc::UnboundedReceiver::recv(self)
    }
}

impl<T: Send> Inbox<T> for mpsc::Receiver<T> {
    fn recv(&mut self) -> impl std::future::Future<Output = Option<T>> + Send {
        mpsc::Receiver::recv(self)
    }
}

impl Held {
    /// The next message; the connection goes back to the pool if none
    /// comes within [`HOLD_IDLE`].
    pub(super) async fn next<T>(&mut self, rx: &mut impl Inbox<T>) -> Option<T> {
        if self.0.is_some() {
            match tokio::time::timeout(HOLD_IDLE, rx.recv()).await {
                Ok(msg) => return msg,
                Err(_) => self.0 = None,
            }
        }
        rx.recv().await
    }

    pub(super) async fn conn(
        &mut self,
        setup: &Setup,
    ) -> Result<&mut sqlx::PgConnection, TransportError> {
        let conn = match &mut self.0 {
            Some(conn) => conn,
            slot => slot.insert(
                setup
                    .pool
                    .acquire()
                    .await
                    .map_err(|e| TransportError::Transient(format!("database: {e}")))?,
            ),
        };
        Ok(&mut **conn)
    }

    /// After a failed statement the connection may be broken: take a
    /// fresh one (checked by the pool) next time.
    pub(super) fn failed(&mut self, e: &TransportError) {
        if matches!(e, TransportError::Transient(_)) {
            self.0 = None;
        }
    }
}

/// A mutex shared by the workers and the producer whose lock does not
/// poison: a worker that panicked while holding it (it never does, the
/// sections are short and do not call out) must not take the other
/// workers down with it, and what it guards stays consistent between
/// statements of those sections.
#[derive(Debug, Default)]
pub(super) struct Shared<T>(std::sync::Mutex<T>);

impl<T> Shared<T> {
    /// The guard, whether or not an earlier holder panicked.
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

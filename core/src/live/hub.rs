//! The server side of live updates: the batched announcer, the one `LISTEN`
//! connection per instance, and the server-sent events stream to browsers.

use super::Topics;
use crate::db::Schema;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use std::sync::LazyLock;
use std::time::Duration;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long the announcer gathers changes before one `NOTIFY`.
pub const BATCH_WINDOW: Duration = Duration::from_millis(10);

/// Changes made by this process, waiting for the announcer(s).
static MADE_HERE: LazyLock<broadcast::Sender<Topics>> =
    LazyLock::new(|| broadcast::channel(4096).0);

/// Records that this process just committed a change to `topics`. Cheap and
/// non-blocking; the [`Announcer`] sends it on within [`BATCH_WINDOW`]. Call
/// it after the commit: a browser that refetches on the announcement must
/// see the change.
pub fn announce(topics: Topics) {
    // An error only means no announcer runs (a test, a CLI command).
    let _ = MADE_HERE.send(topics);
}

/// Announces `topics` when dropped: `let _announced =
/// live::announce_on_return(...)` at the top of a store function announces
/// after its last statement (its commit), whichever way it returns.
#[must_use = "announces when dropped; bind it to a named variable"]
pub struct AnnounceOnReturn(Topics);

impl Drop for AnnounceOnReturn {
    fn drop(&mut self) {
        announce(self.0);
    }
}

/// See [`AnnounceOnReturn`].
pub fn announce_on_return(topics: Topics) -> AnnounceOnReturn {
    AnnounceOnReturn(topics)
}

/// Sends what [`announce`] collected as one `NOTIFY` per batch.
pub struct Announcer;

impl Announcer {
    /// Runs until `stop` is cancelled.
    pub fn spawn(pool: PgPool, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let schema = Schema::of(&pool);
        let mut made = MADE_HERE.subscribe();
        tokio::spawn(async move {
            loop {
                let first = tokio::select! {
                    _ = stop.cancelled() => return,
                    got = made.recv() => got,
                };
                let mut topics = match first {
                    Ok(t) => t,
                    Err(RecvError::Lagged(_)) => Topics::ALL,
                    Err(RecvError::Closed) => return,
                };
                // New work and cancels go out at once (idle workers wait on
                // the one, busy workers on the other); anything else waits
                // out the window, gathering company.
                let until = if !(topics & Topics::URGENT).is_empty() {
                    Instant::now()
                } else {
                    Instant::now() + BATCH_WINDOW
                };
                while let Ok(got) = tokio::time::timeout_at(until, made.recv()).await {
                    match got {
                        // New work or a cancel cuts the window short.
                        Ok(t) if !(t & Topics::URGENT).is_empty() => {
                            topics |= t;
                            break;
                        }
                        Ok(t) => topics |= t,
                        Err(RecvError::Lagged(_)) => topics = Topics::ALL,
                        Err(RecvError::Closed) => break,
                    }
                }
                // Its own statement, outside any write transaction: it has no
                // transaction id, so its commit flushes no WAL while holding
                // the notify queue lock (see the module documentation).
                // A NOTIFY commits like any transaction, and by default
                // waits for its commit record to reach the disk (about a
                // millisecond here). A notification is not data: if the
                // server crashed before the flush, listeners reconnect and
                // refetch everything anyway. So it does not wait: idle
                // workers wake a flush sooner, and a busy instance's
                // announcer adds no fsyncs to the load.
                // The channel is the pool's schema's (see the module
                // documentation), named by the same SQL function the
                // triggers use.
                // Behind a transaction pooler, in a transaction of its own
                // (see `Schema::behind_transaction_pooler`).
                let sent = async {
                    let mut conn = pool.acquire().await?;
                    let conn = &mut *conn;
                    crate::db::atomically!(
                        conn,
                        schema,
                        sqlx::Result<()>,
                        async {
                            schema
                                .query(
                                    "SELECT set_config('synchronous_commit', 'off', true), \
                                 pg_notify($schema.changes_channel(), $1)",
                                )
                                .bind(topics.to_names())
                                .execute(&mut *conn)
                                .await?;
                            Ok(())
                        }
                        .await
                    )
                };
                if let Err(e) = sent.await {
                    tracing::debug!(error = %e, "cannot announce a change; browsers catch up on the next one");
                }
            }
        })
    }
}

/// This instance's fan-out of announcements to its browsers.
#[derive(Clone, Debug)]
pub struct LiveHub {
    changes: broadcast::Sender<Topics>,
    stop: CancellationToken,
}

impl LiveHub {
    /// A hub with nothing feeding it (tests drive it with [`LiveHub::publish`]).
    pub fn detached() -> Self {
        LiveHub {
            changes: broadcast::channel(1024).0,
            stop: CancellationToken::new(),
        }
    }

    /// Starts the `LISTEN` connection and the announcer; both stop with
    /// [`LiveHub::shutdown`].
    pub fn start(pool: PgPool) -> Self {
        LiveHub::start_listening_on(pool.clone(), pool)
    }

    /// [`LiveHub::start`], announcing through `pool` and listening on a
    /// connection of `listen`: behind a transaction pooler, where `LISTEN`
    /// hears nothing, `listen_on` is a pool on the database directly
    /// ([`LiveHub::start_for`]). A `listen_on` pool that is itself behind
    /// a transaction pooler listens to nothing, as [`LiveHub::start`] does
    /// there.
    pub fn start_listening_on(pool: PgPool, listen_on: PgPool) -> Self {
        let hub = LiveHub::detached();
        Announcer::spawn(pool, hub.stop.clone());
        tokio::spawn(listen(listen_on, hub.clone()));
        hub
    }

    /// The change announcements of `pool`'s process: announced through
    /// `pool`, heard on `sessions` ([`crate::db::Sessions`]): behind a
    /// transaction pooler, on a small pool of its own on the direct URL;
    /// without sessions there nothing is heard and idle workers poll, as
    /// with [`LiveHub::start`].
    pub fn start_for(pool: &PgPool, sessions: Option<&crate::db::Sessions>) -> Self {
        match sessions {
            Some(sessions) if sessions.bypass_pooler => {
                let listen = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_lazy_with(sessions.options.clone());
                LiveHub::start_listening_on(pool.clone(), listen)
            }
            _ => LiveHub::start(pool.clone()),
        }
    }

    /// Hands `topics` to every browser of this instance.
    pub fn publish(&self, topics: Topics) {
        let _ = self.changes.send(topics);
    }

    /// A receiver of every change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Topics> {
        self.changes.subscribe()
    }

    /// Cancelled by [`LiveHub::shutdown`]: long-lived readers (an event
    /// stream to a browser) end with it.
    pub fn stopped(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Ends the listener, the announcer and every open event stream (so a
    /// graceful shutdown does not wait for browsers to hang up).
    pub fn shutdown(&self) {
        self.stop.cancel();
    }
}

/// The one `LISTEN` connection of this instance. After a connection loss it
/// reconnects and tells every browser that everything may have changed.
async fn listen(pool: PgPool, hub: LiveHub) {
    let schema = Schema::of(&pool);
    if schema.is_behind_transaction_pooler() {
        // LISTEN is session state: a pooler in transaction mode would leave
        // it on whichever server connection ran it, and pass on nothing.
        // Idle workers then wake by their poll (250-500 ms), and pages
        // refresh on their own timers.
        tracing::info!(%schema, "behind a transaction pooler: not listening for changes; idle workers poll");
        return;
    }
    let mut backoff = Duration::from_millis(250);
    loop {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            let channel: String = schema
                .query_scalar("SELECT $schema.changes_channel()")
                .fetch_one(&mut listener)
                .await?;
            listener.listen(&channel).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = tokio::select! {
            _ = hub.stop.cancelled() => return,
            got = connected => match got {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for changes; retrying in {backoff:?}");
                    tokio::select! {
                        _ = hub.stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            },
        };
        backoff = Duration::from_millis(250);
        // Whatever happened while we were not listening is unknown.
        hub.publish(Topics::ALL);
        loop {
            let got = tokio::select! {
                _ = hub.stop.cancelled() => return,
                got = listener.try_recv() => got,
            };
            match got {
                Ok(Some(n)) => hub.publish(Topics::from_names(n.payload())),
                // Connection lost: the next try_recv reconnects; changes in
                // between are lost, so refresh everything.
                Ok(None) => hub.publish(Topics::ALL),
                Err(e) => {
                    tracing::warn!(error = %e, "lost the change listener; reconnecting");
                    break;
                }
            }
        }
    }
}

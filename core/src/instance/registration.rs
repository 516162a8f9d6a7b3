//! This process's own row in `instances`, kept fresh by a heartbeat task.

use super::store;
use crate::db::Schema;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A registered instance whose heartbeat runs in the background until
/// [`Registration::shutdown`] (clean: `stopped_at` is set) or
/// [`Registration::abort`] (a crash: the row just goes stale).
#[derive(Debug)]
pub struct Registration {
    pool: PgPool,
    id: Arc<str>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Registration {
    /// Registers instance `id` on `address` and heartbeats it every `interval`.
    pub async fn start(
        pool: PgPool,
        id: Arc<str>,
        address: &str,
        interval: Duration,
    ) -> sqlx::Result<Self> {
        store::register(
            &mut *pool.acquire().await?,
            &Schema::of(&pool),
            &id,
            address,
        )
        .await?;
        let stop = CancellationToken::new();
        let task = tokio::spawn(heartbeat_loop(
            pool.clone(),
            id.clone(),
            interval,
            stop.clone(),
        ));
        Ok(Registration {
            pool,
            id,
            stop,
            task,
        })
    }

    /// The instance id.
    pub fn id(&self) -> &Arc<str> {
        &self.id
    }

    /// Stops the heartbeat, then records the clean shutdown.
    pub async fn shutdown(self) -> sqlx::Result<()> {
        // The heartbeat must be over before stopped_at is set, or a late
        // heartbeat could land after it (it would change nothing, since it
        // checks stopped_at, but the order keeps the story simple).
        self.stop.cancel();
        let _ = self.task.await;
        store::mark_stopped(
            &mut *self.pool.acquire().await?,
            &Schema::of(&self.pool),
            &self.id,
        )
        .await
    }

    /// Stops the heartbeat as a crash would: the row is left to go stale.
    pub fn abort(self) {
        self.task.abort();
    }
}

async fn heartbeat_loop(pool: PgPool, id: Arc<str>, interval: Duration, stop: CancellationToken) {
    let schema = Schema::of(&pool);
    let mut warned = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let beat =
            async { store::heartbeat(&mut *pool.acquire().await?, &schema, &id).await }.await;
        match beat {
            Ok(true) => warned = false,
            Ok(false) if !warned => {
                warned = true;
                tracing::warn!(instance = %id, "instance row missing or marked stopped; heartbeat ignored");
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(instance = %id, error = %e, "instance heartbeat failed"),
        }
    }
}

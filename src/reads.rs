//! Bounded reads: every request's read runs on a pool of its own, under a
//! statement timeout, and is cancelled in the database when its client
//! goes away.
//!
//! - **Apart from the workers.** Reads (the `GET /api/*` lists, the pages'
//!   server functions, the event stream's catch-up) take their connection
//!   from the read pool ([`READ_POOL_SIZE`] connections), never from the
//!   main pool that workers' claims, heartbeats and completions and the
//!   singletons' renewals share: a storm of slow searches waits for a read
//!   connection and leaves the main pool alone.
//! - **Timed out.** Each read is one transaction that begins with
//!   `SET LOCAL statement_timeout` (the `read_timeout` setting,
//!   `LEASEKEEPER_READ_TIMEOUT_SECS`). Transaction-local on purpose: a
//!   session `SET` (or `-c statement_timeout` in the startup packet, which
//!   PgBouncer is told to drop, see docs/operations.md) would not survive a
//!   transaction pooler handing each transaction to another server
//!   connection; `SET LOCAL` lives exactly as long as the transaction the
//!   read runs in, directly connected or not. A statement that runs past
//!   it ends with SQLSTATE 57014, which answers 503 naming the setting
//!   ([`crate::error::AppError::from`]).
//! - **Cancelled when the client goes.** A read's future is dropped when
//!   its client disconnects (reads are not run to completion, see
//!   [`crate::http::run_to_completion`]). sqlx cannot stop a statement the
//!   server is running, so the guard here does: dropped before the read
//!   finished, it asks the database to cancel its backend
//!   (`pg_cancel_backend`, from a connection of the main pool) and then
//!   closes its connection instead of handing it back to the pool with a
//!   statement or a transaction still open. The cancel comes before the
//!   close, so the backend id cannot belong to another session yet.

use crate::error::AppError;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool, Postgres};
use std::time::Duration;

/// The read pool's connections: enough for a few dashboards and scripts
/// at once; the main pool's 32 stay for workers and singletons.
pub const READ_POOL_SIZE: u32 = 8;

/// How long a read waits for a connection of the read pool before it
/// answers 503.
pub const READ_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// A pool for reads on the same database and schema as `main` (its connect
/// options: the schema's `search_path`, the pooler's mark): at most
/// [`READ_POOL_SIZE`] connections, opened as needed.
pub fn read_pool(main: &PgPool) -> PgPool {
    PgPoolOptions::new()
        .max_connections(READ_POOL_SIZE)
        .min_connections(0)
        .acquire_timeout(READ_ACQUIRE_TIMEOUT)
        .connect_lazy_with((*main.connect_options()).clone())
}

/// A read's connection, in a transaction whose statements time out after
/// the read timeout. Dropped before [`ReadConn::finish`], it cancels what
/// its backend runs and closes the connection (see the module).
pub struct ReadConn {
    /// Taken only by `finish` or `drop`.
    conn: Option<PoolConnection<Postgres>>,
    /// The backend serving this connection, for `pg_cancel_backend`, once
    /// the read's transaction has begun.
    pid: Option<i32>,
    /// Where the cancel is sent from.
    cancel_via: PgPool,
}

impl ReadConn {
    /// A connection of `reads`, in a transaction under `timeout`; `main`
    /// is where a cancel is sent from if the read is abandoned.
    pub async fn begin(reads: &PgPool, main: &PgPool, timeout: Duration) -> Result<Self, AppError> {
        let conn = reads.acquire().await.map_err(|e| match e {
            sqlx::Error::PoolTimedOut => AppError::Unavailable(format!(
                "every one of the {READ_POOL_SIZE} read connections is busy; try again shortly"
            )),
            e => AppError::from(e),
        })?;
        // The guard first: dropped while `BEGIN` is on its way, the
        // connection is closed, never pooled inside a transaction.
        let mut guard = ReadConn {
            conn: Some(conn),
            pid: None,
            cancel_via: main.clone(),
        };
        // At least a millisecond: 0 would mean no timeout at all.
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128);
        // One round trip: the transaction, its timeout, and the backend's
        // id (behind a transaction pooler, the server connection this
        // transaction holds until its end). `ms` is a number formatted
        // here, not input.
        let sql = format!("BEGIN; SET LOCAL statement_timeout = {ms}; SELECT pg_backend_pid()");
        // A statement without arguments goes by the simple query protocol,
        // which takes several statements at once.
        let row = sqlx::Executor::fetch_one(guard.conn()?, sql.as_str()).await?;
        guard.pid = Some(sqlx::Row::try_get::<i32, _>(&row, 0)?);
        Ok(guard)
    }

    /// The connection, while the read runs.
    pub fn conn(&mut self) -> Result<&mut PgConnection, AppError> {
        self.conn
            .as_deref_mut()
            .ok_or_else(|| AppError::internal("a read's connection was used after its end"))
    }

    /// Ends the read with its `answer`: `COMMIT` after an answer, `ROLLBACK`
    /// after a refusal (a bad name, a timeout: nothing to cancel), and the
    /// connection goes back to the pool.
    pub async fn end<T, E>(self, answer: Result<T, E>) -> Result<T, AppError>
    where
        AppError: From<E>,
    {
        match answer {
            Ok(answer) => {
                self.finish("COMMIT").await?;
                Ok(answer)
            }
            Err(e) => {
                let _ = self.finish("ROLLBACK").await;
                Err(AppError::from(e))
            }
        }
    }

    /// Ends the read's transaction (`COMMIT` or `ROLLBACK`) and hands the
    /// connection back; if that fails, the guard's drop closes it.
    async fn finish(mut self, end: &'static str) -> Result<(), AppError> {
        if let Some(conn) = self.conn.as_deref_mut() {
            sqlx::Executor::execute(conn, end).await?;
            self.conn = None;
        }
        Ok(())
    }
}

impl Drop for ReadConn {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        // Dropped mid-read (its client went away, or its handler failed
        // between statements): a statement may still be running on the
        // backend. Cancel first, then close, never back to the pool.
        let raw = conn.detach();
        let Some(pid) = self.pid else {
            // Its transaction was still beginning: nothing of the read ran.
            drop(raw);
            return;
        };
        let via = self.cancel_via.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = sqlx::query("SELECT pg_cancel_backend($1)")
                    .bind(pid)
                    .execute(&via)
                    .await
                {
                    tracing::warn!(error = %e, pid, "cannot cancel an abandoned read");
                }
                // Dropped, the socket closes; the backend, its statement
                // cancelled, sees that and ends.
                drop(raw);
            });
        }
    }
}

/// Runs a read on the read pool ([`crate::state::AppState::begin_read`]):
/// `read!(state, |conn| expr)`, or with a body of statements and its
/// answer's type, `read!(state, |conn| -> Result<T, AppError> { … })`.
/// `conn` is a `&mut PgConnection` in the read's transaction; the answer
/// (`Result<T, E>`, `AppError: From<E>`) ends the transaction, and the
/// macro's value is `Result<T, AppError>`. A macro rather than a function
/// taking an async closure: a closure's future borrowing its argument is
/// not `Send` for every lifetime, which handlers and server functions need.
macro_rules! read {
    ($state:expr, |$c:ident| -> $ty:ty $body:block) => {
        async {
            let mut guard = $state.begin_read().await?;
            let $c = match guard.conn() {
                Ok(c) => c,
                Err(e) => return Err(e),
            };
            let answer: $ty = async { $body }.await;
            guard.end(answer).await
        }
        .await
    };
    ($state:expr, |$c:ident| $body:expr) => {
        async {
            let mut guard = $state.begin_read().await?;
            let $c = match guard.conn() {
                Ok(c) => c,
                Err(e) => return Err(e),
            };
            let answer = $body;
            guard.end(answer).await
        }
        .await
    };
}
pub(crate) use read;

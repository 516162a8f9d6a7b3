//! Liveness: a crashed process's claims rescued within a second, by its
//! closed database session, with the TTL left for pauses and partitions.
//!
//! A lease ends when it is not renewed in time (the TTL), which must be
//! long enough to ride out a pause or a slow network. But a process that
//! crashes on a host that stays up closes its TCP connections, and
//! PostgreSQL sees its sessions end within milliseconds. So each process
//! keeps one **liveness session**: a dedicated, direct connection whose
//! `application_name` is `leasekeeper liveness <instance id>`, registered
//! in the table `liveness` with its backend's pid and start time and the
//! lease holders it vouches for (the process's workers, and the instance
//! itself, which holds its singleton leases). Every process asks a few
//! times a second ([`CHECK_EVERY`]) whether PostgreSQL still lists each
//! registered session ([`store::suspects`]); when it does not, the holders'
//! live claims and leases are ended at once ([`store::end_dead`]) and the
//! claim rule takes the tasks over as if their deadline had passed. The
//! fencing token moves with every takeover, as always, so a holder that
//! was not dead after all cannot write over its successor.
//!
//! Only a certainly dead holder is rescued early:
//!
//! - a paused, slow or partitioned process still has its session open
//!   (PostgreSQL sees no closed connection), so the TTL rules as before;
//! - after a PostgreSQL restart or failover every session is gone at once,
//!   and nobody is dead: a registration is judged only by the server
//!   incarnation that hosted it (the postmaster's start time), otherwise
//!   left to the TTL;
//! - a live process whose liveness session was cut (terminated, a network
//!   blip) stops trusting its claims the moment it notices: its standing
//!   goes [`Standing::Down`], the runtime's workers give their claims up
//!   (handlers see [`cancelled`](crate::worker::handler::TaskContext::cancelled)),
//!   and it connects, registers again and goes on serving.
//!
//! Behind a transaction pooler a session means nothing: the liveness
//! connection must be direct, or liveness is off and the TTL rules.

pub mod store;

use crate::db::Schema;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgConnection};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How often each process checks the registered sessions (and, by the
/// same round trip, that its own liveness connection still answers).
pub const CHECK_EVERY: Duration = Duration::from_millis(200);

/// A check not answered within this long counts as a lost session (a
/// connection that silently stopped carrying packets): generous, since a
/// busy database answers slowly, and a partition is the TTL's to judge.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest wait between two attempts to connect the liveness session
/// again.
const RECONNECT_AT_MOST: Duration = Duration::from_secs(2);

/// The `application_name` of instance `id`'s liveness session. PostgreSQL
/// keeps the first 63 bytes; the registration, not the name, identifies
/// the session.
pub fn application_name(id: &str) -> String {
    format!("leasekeeper liveness {id}")
}

/// Whether this process's liveness session is registered now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Registered, in the n-th session of this process (1, 2, ...).
    Up(u64),
    /// The n-th session was lost; claims made under it are not trusted.
    Down(u64),
}

/// A process's liveness session, kept open (and registered again after a
/// loss) in the background until [`Liveness::shutdown`] or
/// [`Liveness::abort`].
#[derive(Debug)]
pub struct Liveness {
    id: Arc<str>,
    standing: watch::Receiver<Standing>,
    vouch: Voucher,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// A request to vouch for one more holder, and who waits for it.
type Vouch = (String, tokio::sync::oneshot::Sender<()>);

/// Adds holders to those a [`Liveness`] session vouches for (a worker
/// started after the process). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Voucher(tokio::sync::mpsc::UnboundedSender<Vouch>);

impl Voucher {
    /// Vouches for `holder` from now on, and in every registration after;
    /// answers once the registration says so (then a crash rescues its
    /// claims at once), or `false` after `within` (the session is down: it
    /// is vouched for when registered again, and until then its claims
    /// wait out their TTL).
    pub async fn vouch(&self, holder: &str, within: Duration) -> bool {
        let (done, written) = tokio::sync::oneshot::channel();
        if self.0.send((holder.to_string(), done)).is_err() {
            return false;
        }
        matches!(tokio::time::timeout(within, written).await, Ok(Ok(())))
    }
}

impl Liveness {
    /// Opens instance `id`'s liveness session on the database of
    /// `options` (a direct connection: never through a transaction
    /// pooler), registers it vouching for `holders`, and keeps it so in
    /// the background. Fails when the first registration does.
    pub async fn start(
        options: PgConnectOptions,
        schema: Schema,
        id: Arc<str>,
        holders: Vec<String>,
    ) -> sqlx::Result<Self> {
        let options = options
            .application_name(&application_name(&id))
            .statement_cache_capacity(16);
        let mut holders = holders;
        if !holders.iter().any(|h| **h == *id) {
            holders.push(id.to_string());
        }
        let conn = open(&options, &schema, &id, &holders).await?;
        let (standing_tx, standing) = watch::channel(Standing::Up(1));
        let (vouch, vouched) = tokio::sync::mpsc::unbounded_channel();
        let vouch = Voucher(vouch);
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep(Keep {
            options,
            schema,
            id: id.clone(),
            holders,
            standing: standing_tx,
            vouched,
            stop: stop.clone(),
            conn: Some(conn),
        }));
        Ok(Liveness {
            id,
            standing,
            vouch,
            stop,
            task,
        })
    }

    /// The instance id.
    pub fn id(&self) -> &Arc<str> {
        &self.id
    }

    /// What workers watch: see [`LivenessSignal`].
    pub fn signal(&self) -> LivenessSignal {
        LivenessSignal(Some(self.standing.clone()))
    }

    /// What adds holders to those this session vouches for.
    pub fn voucher(&self) -> Voucher {
        self.vouch.clone()
    }

    /// Ends the session cleanly: the registration is deleted (call it
    /// after the claims were given back and the leases released).
    pub async fn shutdown(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }

    /// Drops the session as a crash would: the connection closes without
    /// a goodbye and the registration stays, for others to judge.
    pub fn abort(self) {
        self.task.abort();
    }
}

/// A worker's view of its process's [`Liveness`]: whether claims may be
/// made and trusted now. [`LivenessSignal::none`] (no liveness: behind a
/// transaction pooler, or a process that has none) is always up.
#[derive(Clone, Debug, Default)]
pub struct LivenessSignal(Option<watch::Receiver<Standing>>);

impl LivenessSignal {
    /// No liveness: always up, never lost.
    pub fn none() -> Self {
        LivenessSignal(None)
    }

    /// The session in force now, or `None` while it is down. Without
    /// liveness, `Some(0)`.
    pub fn session(&self) -> Option<u64> {
        match &self.0 {
            None => Some(0),
            Some(rx) => match *rx.borrow() {
                Standing::Up(n) => Some(n),
                Standing::Down(_) => None,
            },
        }
    }

    /// Waits until a session is in force, and answers it.
    pub async fn up(&mut self) -> u64 {
        let Some(rx) = &mut self.0 else { return 0 };
        let standing = rx
            .wait_for(|s| matches!(s, Standing::Up(_)))
            .await
            .map(|s| *s);
        match standing {
            Ok(Standing::Up(n) | Standing::Down(n)) => n,
            // The liveness was shut down: the process is stopping.
            Err(_) => std::future::pending().await,
        }
    }

    /// Resolves when session `n` is no longer in force (lost, or replaced
    /// by a later one); never without liveness.
    pub async fn ended(&mut self, n: u64) {
        let Some(rx) = &mut self.0 else {
            return std::future::pending().await;
        };
        let ended = rx.wait_for(|s| *s != Standing::Up(n)).await.is_ok();
        if !ended {
            std::future::pending::<()>().await;
        }
    }
}

/// Connects, and registers the session.
async fn open(
    options: &PgConnectOptions,
    schema: &Schema,
    id: &str,
    holders: &[String],
) -> sqlx::Result<PgConnection> {
    let mut conn = options.connect().await?;
    store::register(&mut conn, schema, id, holders).await?;
    Ok(conn)
}

struct Keep {
    options: PgConnectOptions,
    schema: Schema,
    id: Arc<str>,
    holders: Vec<String>,
    standing: watch::Sender<Standing>,
    vouched: tokio::sync::mpsc::UnboundedReceiver<Vouch>,
    stop: CancellationToken,
    conn: Option<PgConnection>,
}

/// The background loop: checks every [`CHECK_EVERY`] on the liveness
/// connection (which also proves it still answers); on a failure, goes
/// down at once, then connects and registers again, backing off.
async fn keep(mut k: Keep) {
    let mut session = 1;
    let mut backoff = CHECK_EVERY;
    loop {
        let Some(conn) = k.conn.as_mut() else {
            tokio::select! {
                () = k.stop.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            match open(&k.options, &k.schema, &k.id, &k.holders).await {
                Ok(conn) => {
                    k.conn = Some(conn);
                    session += 1;
                    backoff = CHECK_EVERY;
                    k.standing.send_replace(Standing::Up(session));
                    tracing::info!(instance = %k.id, session, "liveness session registered again");
                }
                Err(e) => {
                    backoff = (backoff * 2).min(RECONNECT_AT_MOST);
                    tracing::warn!(instance = %k.id, error = %e,
                        "cannot register the liveness session; claims wait");
                }
            }
            continue;
        };
        tokio::select! {
            () = k.stop.cancelled() => {
                if let Err(e) = store::deregister(conn, &k.schema, &k.id).await {
                    tracing::warn!(instance = %k.id, error = %e, "could not end the liveness registration");
                }
                return;
            }
            () = tokio::time::sleep(CHECK_EVERY) => {}
        }
        let checked = tokio::time::timeout(
            CHECK_TIMEOUT,
            check(conn, &k.schema, &k.id, &mut k.holders, &mut k.vouched),
        )
        .await
        .unwrap_or_else(|_| Err(sqlx::Error::PoolTimedOut));
        match checked {
            Ok(ended) if ended.any() => {
                tracing::info!(instance = %k.id, sessions = ended.sessions, leases = ended.leases,
                    tasks = ended.tasks, "ended the claims of dead sessions");
                crate::live::announce(
                    crate::live::Topics::WORK
                        | crate::live::Topics::TASKS
                        | crate::live::Topics::LEASES,
                );
            }
            Ok(_) => {}
            Err(e) => {
                k.standing.send_replace(Standing::Down(session));
                k.conn = None;
                tracing::warn!(instance = %k.id, session, error = %e,
                    "liveness session lost: its claims are no longer trusted");
            }
        }
    }
}

/// One check: vouches for the holders added since, then ends the claims
/// of every registered session PostgreSQL no longer lists. An error means
/// the liveness connection is no longer to be trusted.
async fn check(
    conn: &mut PgConnection,
    schema: &Schema,
    id: &str,
    holders: &mut Vec<String>,
    vouched: &mut tokio::sync::mpsc::UnboundedReceiver<Vouch>,
) -> sqlx::Result<store::Ended> {
    while let Ok((holder, done)) = vouched.try_recv() {
        // Kept first: a registration after a loss vouches for it too.
        if !holders.contains(&holder) {
            holders.push(holder.clone());
        }
        if !store::vouch(conn, schema, id, &holder).await? {
            // Our registration was replaced or deleted: this session no
            // longer vouches for anyone.
            return Err(sqlx::Error::Protocol(
                "the liveness registration is no longer this session's".into(),
            ));
        }
        let _ = done.send(());
    }
    let suspects = store::suspects(conn, schema).await?;
    if suspects.is_empty() {
        return Ok(store::Ended::default());
    }
    store::end_dead(conn, schema, &suspects).await
}

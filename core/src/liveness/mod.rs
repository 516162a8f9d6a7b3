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
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Told each time this process's liveness check ended leases of dead
/// holders ([`freed`]).
static FREED: LazyLock<tokio::sync::Notify> = LazyLock::new(tokio::sync::Notify::new);

/// Wakes whoever waits on it when this process has just ended leases of
/// dead holders: a singleton waiting out its retry pause tries again at
/// once ([`crate::lease::singleton`]), so a dead holder's singleton moves
/// within a check or so, not a retry pause later. Only this process's own
/// check wakes it; in a process that did not do the ending, the retry
/// pause rules as before.
pub fn freed() -> &'static tokio::sync::Notify {
    &FREED
}

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

/// The standing of the session vouching for each holder name in this
/// process, for code that knows only its holder (a singleton's lease
/// client): see [`LivenessSignal::of`].
static VOUCHED: LazyLock<Mutex<HashMap<String, watch::Receiver<Standing>>>> =
    LazyLock::new(Default::default);

fn vouched_holders() -> std::sync::MutexGuard<'static, HashMap<String, watch::Receiver<Standing>>> {
    // Every change is one insert or remove: a poisoned map is whole.
    VOUCHED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether this process's liveness session is registered now. The number
/// is the *term* of its claims: it moves only when claims made before
/// can no longer be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Registered; claims made in term n are trusted (under their TTL).
    Up(u64),
    /// The connection failed and the process is connecting again: no new
    /// claims, but those of term n are kept until it knows whether anyone
    /// could have judged the lost session (see [`Liveness`]).
    Reconnecting(u64),
    /// The session of term n is gone while its server still runs: others
    /// may be rescuing its claims, which are given up.
    Down(u64),
}

/// A process's liveness session, kept open (and registered again after a
/// loss) in the background until [`Liveness::shutdown`] or
/// [`Liveness::abort`].
///
/// When its connection fails, new claims wait ([`Standing::Reconnecting`])
/// and it connects again at once. Then it asks the server's start time:
/// the same server as before means the old session ended while the server
/// ran, so others may already be ending its claims: the term's claims are
/// given up ([`Standing::Down`]) before it registers again under a new
/// term. Another server (a restart, a failover) means nobody could judge
/// the old session (a registration is judged only by its own server): the
/// claims are kept, under their TTL, and the term goes on.
#[derive(Debug)]
pub struct Liveness {
    id: Arc<str>,
    standing: watch::Receiver<Standing>,
    vouch: Voucher,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// What a [`Voucher`] asks of the session, and who waits for the answer
/// (whether this session's registration did it).
enum Ask {
    /// Vouch for one more holder ([`store::vouch`]).
    Vouch(String),
    /// Vouch for a holder as a new term ([`store::adopt`]).
    Adopt(String),
    /// Stop vouching for a holder; with `end`, end its claims now
    /// ([`store::disown`]).
    Disown { holder: String, end: bool },
}

type Asked = (Ask, tokio::sync::oneshot::Sender<bool>);

/// Changes the holders a [`Liveness`] session vouches for: a worker
/// started after the process, a worker process streaming to this
/// instance, a worker that died. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Voucher(
    tokio::sync::mpsc::UnboundedSender<Asked>,
    watch::Receiver<Standing>,
);

impl std::fmt::Debug for Ask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ask::Vouch(h) => write!(f, "vouch {h}"),
            Ask::Adopt(h) => write!(f, "adopt {h}"),
            Ask::Disown { holder, end } => write!(f, "disown {holder} (end: {end})"),
        }
    }
}

impl Voucher {
    /// Vouches for `holder` from now on, and in every registration after;
    /// answers once the registration says so (then a crash rescues its
    /// claims at once), or `false` after `within` (the session is down: it
    /// is vouched for when registered again, and until then its claims
    /// wait out their TTL).
    pub async fn vouch(&self, holder: &str, within: Duration) -> bool {
        vouched_holders().insert(holder.to_string(), self.1.clone());
        self.ask(Ask::Vouch(holder.to_string()), within).await
    }

    /// [`vouch`](Self::vouch) for `holder` as a **new term**: every claim
    /// and lease it held before (through an earlier stream, on this
    /// instance or another) is ended first, and any other session stops
    /// vouching for it ([`store::adopt`]). For a holder that lives in
    /// another process (a worker process streaming to this instance),
    /// which gave up its earlier claims when its earlier stream broke and
    /// claims again only once this answers `true`.
    pub async fn adopt(&self, holder: &str, within: Duration) -> bool {
        self.ask(Ask::Adopt(holder.to_string()), within).await
    }

    /// Stops vouching for `holder`. With `end` (it died: its stream closed
    /// without a goodbye, or it was killed), its live claims and leases
    /// are ended now, so an idle worker takes its tasks over within a
    /// second, as after a crash of its process ([`store::disown`]);
    /// without, it said goodbye and held nothing. Answers `false` when the
    /// session is down or did not answer within `within`: then its claims
    /// wait out their TTL.
    pub async fn disown(&self, holder: &str, end: bool, within: Duration) -> bool {
        {
            let mut map = vouched_holders();
            if map.get(holder).is_some_and(|s| s.same_channel(&self.1)) {
                map.remove(holder);
            }
        }
        let holder = holder.to_string();
        self.ask(Ask::Disown { holder, end }, within).await
    }

    async fn ask(&self, ask: Ask, within: Duration) -> bool {
        let (done, answered) = tokio::sync::oneshot::channel();
        if self.0.send((ask, done)).is_err() {
            return false;
        }
        matches!(tokio::time::timeout(within, answered).await, Ok(Ok(true)))
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
        let (conn, server) = open(&options, &schema, &id, &holders).await?;
        let (standing_tx, standing) = watch::channel(Standing::Up(1));
        let (vouch, asks) = tokio::sync::mpsc::unbounded_channel();
        let vouch = Voucher(vouch, standing.clone());
        {
            let mut map = vouched_holders();
            for holder in &holders {
                map.insert(holder.clone(), standing.clone());
            }
        }
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep(Keep {
            options,
            schema,
            id: id.clone(),
            holders,
            standing: standing_tx,
            asks,
            pending: Vec::new(),
            stop: stop.clone(),
            conn: Some(conn),
            server,
        }));
        Ok(Liveness {
            id,
            standing,
            vouch,
            stop,
            task,
        })
    }

    /// [`Liveness::start`] where `sessions` says a process opens its
    /// sessions ([`crate::db::Sessions`]: the pool's database, or behind a
    /// transaction pooler the direct URL).
    pub async fn start_in(
        sessions: &crate::db::Sessions,
        id: Arc<str>,
        holders: Vec<String>,
    ) -> sqlx::Result<Self> {
        Liveness::start(
            sessions.options.clone(),
            sessions.schema.clone(),
            id,
            holders,
        )
        .await
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
        self.forget();
        let _ = self.task.await;
    }

    /// Removes this session's holders from [`LivenessSignal::of`].
    fn forget(&self) {
        vouched_holders().retain(|_, standing| !standing.same_channel(&self.standing));
    }

    /// Drops the session as a crash would: the connection closes without
    /// a goodbye and the registration stays, for others to judge.
    pub fn abort(self) {
        self.forget();
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

    /// The signal of a session kept elsewhere than in a [`Liveness`] of
    /// this process: a worker process's stream to its instance
    /// (`Http::session` in `worker::http`, feature `http-client`), whose
    /// instance vouches for it.
    pub fn following(standing: watch::Receiver<Standing>) -> Self {
        LivenessSignal(Some(standing))
    }

    /// The signal of the session in this process that vouches for
    /// `holder` ([`Liveness::start`], [`Voucher::vouch`]), or
    /// [`none`](Self::none): how a singleton's lease client, which knows
    /// only its holder, learns that its term can no longer be trusted.
    pub fn of(holder: &str) -> Self {
        LivenessSignal(vouched_holders().get(holder).cloned())
    }

    /// The session in force now, or `None` while it is down. Without
    /// liveness, `Some(0)`.
    pub fn session(&self) -> Option<u64> {
        match &self.0 {
            None => Some(0),
            Some(rx) => match *rx.borrow() {
                Standing::Up(n) => Some(n),
                Standing::Reconnecting(_) | Standing::Down(_) => None,
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
            Ok(Standing::Up(n) | Standing::Reconnecting(n) | Standing::Down(n)) => n,
            // The liveness was shut down: the process is stopping.
            Err(_) => std::future::pending().await,
        }
    }

    /// Resolves when the claims of term `n` are no longer to be trusted
    /// (its session lost while its server runs, or a later term began);
    /// never without liveness.
    pub async fn ended(&mut self, n: u64) {
        let Some(rx) = &mut self.0 else {
            return std::future::pending().await;
        };
        let ended = rx
            .wait_for(|s| !matches!(s, Standing::Up(m) | Standing::Reconnecting(m) if *m == n))
            .await
            .is_ok();
        if !ended {
            std::future::pending::<()>().await;
        }
    }
}

/// Connects, and registers the session; answers the connection and the
/// start time of its server.
async fn open(
    options: &PgConnectOptions,
    schema: &Schema,
    id: &str,
    holders: &[String],
) -> sqlx::Result<(PgConnection, Incarnation)> {
    let mut conn = options.connect().await?;
    let server = store::register(&mut conn, schema, id, holders).await?;
    Ok((conn, server))
}

/// A server incarnation: its postmaster's start time.
type Incarnation = chrono::DateTime<chrono::Utc>;

struct Keep {
    options: PgConnectOptions,
    schema: Schema,
    id: Arc<str>,
    holders: Vec<String>,
    standing: watch::Sender<Standing>,
    asks: tokio::sync::mpsc::UnboundedReceiver<Asked>,
    /// Asks received while waiting for the next check.
    pending: Vec<Asked>,
    stop: CancellationToken,
    conn: Option<PgConnection>,
    /// The server the registration in force was made on.
    server: Incarnation,
}

/// The background loop: checks every [`CHECK_EVERY`] on the liveness
/// connection (which also proves it still answers); on a failure, stops
/// new claims and connects again at once, backing off (see [`Liveness`]
/// for what happens to the claims made before).
async fn keep(mut k: Keep) {
    let mut term = 1;
    let mut backoff = Duration::ZERO;
    loop {
        let Some(conn) = k.conn.as_mut() else {
            tokio::select! {
                () = k.stop.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).clamp(CHECK_EVERY, RECONNECT_AT_MOST);
            match reconnect(&k).await {
                Ok((conn, same_server)) => {
                    if same_server {
                        // Judged dead, perhaps, already: the claims go.
                        k.standing.send_replace(Standing::Down(term));
                        term += 1;
                    }
                    let (conn, server) = conn;
                    k.conn = Some(conn);
                    k.server = server;
                    backoff = Duration::ZERO;
                    k.standing.send_replace(Standing::Up(term));
                    tracing::info!(instance = %k.id, term, same_server,
                        "liveness session registered again");
                }
                Err(e) => {
                    tracing::warn!(instance = %k.id, error = %e,
                        "cannot register the liveness session; new claims wait");
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
            // An ask (a worker killed, a stream opened) is done at once.
            Some(ask) = k.asks.recv() => k.pending.push(ask),
        }
        let checked = tokio::time::timeout(
            CHECK_TIMEOUT,
            check(
                conn,
                &k.schema,
                &k.id,
                &mut k.holders,
                &mut k.pending,
                &mut k.asks,
            ),
        )
        .await
        .unwrap_or_else(|_| Err(sqlx::Error::PoolTimedOut));
        match checked {
            Ok(ended) if ended.any() => {
                tracing::info!(instance = %k.id, sessions = ended.sessions, leases = ended.leases,
                    tasks = ended.tasks, "ended the claims of dead holders (sessions gone, workers killed, streams closed)");
                if ended.leases > 0 {
                    FREED.notify_waiters();
                }
                crate::live::announce(
                    crate::live::Topics::WORK
                        | crate::live::Topics::TASKS
                        | crate::live::Topics::LEASES,
                );
            }
            Ok(_) => {}
            Err(e) => {
                k.standing.send_replace(Standing::Reconnecting(term));
                k.conn = None;
                tracing::warn!(instance = %k.id, term, error = %e,
                    "liveness session lost: no new claims until it is registered again");
            }
        }
    }
}

/// Connects and registers again; answers whether the server is the one
/// the lost session was on. Bounded, so a connection hanging in a
/// partition is tried again.
async fn reconnect(k: &Keep) -> sqlx::Result<((PgConnection, Incarnation), bool)> {
    let attempt = async {
        let (conn, server) = open(&k.options, &k.schema, &k.id, &k.holders).await?;
        Ok(((conn, server), server == k.server))
    };
    tokio::time::timeout(CHECK_TIMEOUT, attempt)
        .await
        .unwrap_or(Err(sqlx::Error::PoolTimedOut))
}

/// One check: does what was asked since (vouch, adopt, disown), then
/// ends the claims of every registered session PostgreSQL no longer
/// lists. An error means the liveness connection is no longer to be
/// trusted.
async fn check(
    conn: &mut PgConnection,
    schema: &Schema,
    id: &str,
    holders: &mut Vec<String>,
    pending: &mut Vec<Asked>,
    asks: &mut tokio::sync::mpsc::UnboundedReceiver<Asked>,
) -> sqlx::Result<store::Ended> {
    while let Ok(ask) = asks.try_recv() {
        pending.push(ask);
    }
    let mut ended = store::Ended::default();
    for (ask, done) in std::mem::take(pending) {
        // The holders are kept first: a registration after a loss vouches
        // for exactly these.
        let registered = match &ask {
            Ask::Vouch(holder) => {
                keep_holder(holders, holder);
                store::vouch(conn, schema, id, holder).await?
            }
            Ask::Adopt(holder) => {
                keep_holder(holders, holder);
                let moved = store::adopt(conn, schema, id, holder).await?;
                add(&mut ended, moved.ended);
                moved.registered
            }
            Ask::Disown { holder, end } => {
                holders.retain(|h| h != holder);
                let moved = store::disown(conn, schema, id, holder, *end).await?;
                add(&mut ended, moved.ended);
                moved.registered
            }
        };
        if !registered {
            // Our registration was replaced or deleted: this session no
            // longer vouches for anyone.
            return Err(sqlx::Error::Protocol(
                "the liveness registration is no longer this session's".into(),
            ));
        }
        tracing::debug!(instance = id, ?ask, "liveness: done as asked");
        let _ = done.send(true);
    }
    let suspects = store::suspects(conn, schema).await?;
    if !suspects.is_empty() {
        add(&mut ended, store::end_dead(conn, schema, &suspects).await?);
    }
    Ok(ended)
}

/// Adds `holder` to the holders every registration vouches for.
fn keep_holder(holders: &mut Vec<String>, holder: &str) {
    if !holders.iter().any(|h| h == holder) {
        holders.push(holder.to_string());
    }
}

fn add(total: &mut store::Ended, more: store::Ended) {
    total.sessions += more.sessions;
    total.leases += more.leases;
    total.tasks += more.tasks;
}

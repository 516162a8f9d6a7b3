//! Test harness: a real PostgreSQL server and a fresh database per test,
//! from the library's harness (`leasekeeper_core::db::testing`, shared with
//! its doc-tests and both crates' integration tests): the server is
//! `LEASEKEEPER_TEST_DATABASE_URL` when set, otherwise the embedded cluster
//! in `target/leasekeeper-test-db`, started on first use and left running.

pub use leasekeeper_core::db::testing::{TestDb, event_kinds, holder, resource};

/// Waits up to `within` for `check` to hold, polling every 25 ms; panics
/// naming `what` when it does not.
pub async fn until<F, Fut>(what: &str, within: std::time::Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    while !check().await {
        assert!(start.elapsed() < within, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

/// The backend pid of `conn`'s server session.
pub async fn backend_pid(conn: &mut sqlx::PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// A new connection of `pool`, detached, whose backend pid modulo 16 is
/// `pid`'s: the counter shard it shared with `pid`'s connection while
/// counters were sharded by connection (until migration `20261203000001`).
pub async fn connection_on_old_shard_of(pool: &sqlx::PgPool, pid: i32) -> sqlx::PgConnection {
    use sqlx::Connection;
    for _ in 0..500 {
        let mut conn = pool.acquire().await.unwrap().detach();
        if backend_pid(&mut conn).await % 16 == pid % 16 {
            return conn;
        }
        conn.close().await.unwrap();
    }
    panic!("no connection on the old shard of pid {pid} in 500 tries");
}

/// The text of `EXPLAIN` (no `ANALYZE`) of the store's `statement` with
/// its `$schema` resolved and each `(placeholder, value)` of `args`
/// written in: what the planner would do, without running it.
pub async fn explain(pool: &sqlx::PgPool, statement: &str, args: &[(&str, &str)]) -> String {
    let mut sql = leasekeeper_core::db::Schema::default()
        .sql(statement)
        .to_string();
    for (placeholder, value) in args {
        sql = sql.replace(placeholder, value);
    }
    let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {sql}"))
        .fetch_all(pool)
        .await
        .unwrap();
    plan.join("\n")
}

/// The text of `EXPLAIN EXECUTE` of the store's `statement` prepared with
/// parameters of `types`, under `plan_cache_mode = force_generic_plan`,
/// executed with `args`: the plan made once for every value of them, as
/// a statement that sets that mode runs it (on a connection of its own,
/// closed after).
pub async fn explain_generic(
    pool: &sqlx::PgPool,
    statement: &str,
    types: &[&str],
    args: &[&str],
) -> String {
    use sqlx::Connection;
    let sql = leasekeeper_core::db::Schema::default()
        .sql(statement)
        .to_string();
    let mut conn = pool.acquire().await.unwrap().detach();
    for setup in [
        "SET plan_cache_mode = force_generic_plan".to_string(),
        format!("PREPARE generic_plan ({}) AS {sql}", types.join(", ")),
    ] {
        sqlx::raw_sql(&setup).execute(&mut conn).await.unwrap();
    }
    let plan: Vec<String> = sqlx::query_scalar(&format!(
        "EXPLAIN EXECUTE generic_plan ({})",
        args.join(", ")
    ))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    plan.join("\n")
}

/// A worker that only an announcement can wake: one worker of `name`
/// serving `filter`, its poll a minute long, waking on the live hub's work
/// signal; each start of a `kind` task is sent on `starts` with its
/// instant. For the tests that a change wakes idle workers.
pub struct IdleWorker {
    pub starts: tokio::sync::mpsc::UnboundedReceiver<(i64, tokio::time::Instant)>,
    controls: leasekeeper_core::worker::run::Controls,
    running: tokio::task::JoinHandle<leasekeeper_core::worker::run::Exit>,
    transport: leasekeeper_core::worker::in_process::InProcess,
    live: leasekeeper_core::live::LiveHub,
}

impl IdleWorker {
    pub fn start(
        db: &TestDb,
        name: &str,
        kind: &str,
        filter: leasekeeper_core::queue::ClaimFilter,
    ) -> IdleWorker {
        use leasekeeper_core::live::LiveHub;
        use leasekeeper_core::queue::wake::WorkSignal;
        use leasekeeper_core::worker::chaos::{Chaos, ChaosSettings};
        use leasekeeper_core::worker::handler::{Done, Handlers, Job, TaskContext};
        use leasekeeper_core::worker::in_process::InProcess;
        use leasekeeper_core::worker::run::{Worker, WorkerConfig};
        use std::time::Duration;
        let ttl = Duration::from_secs(30);
        let (started, starts) = tokio::sync::mpsc::unbounded_channel();
        let handlers = Handlers::new().register(kind, move |job: Job, _: TaskContext| {
            let _ = started.send((job.id, tokio::time::Instant::now()));
            async { Ok(Done::empty()) }
        });
        let minute = Duration::from_secs(60);
        let config = WorkerConfig {
            poll: minute..=minute,
            ..WorkerConfig::new(ttl, Duration::from_secs(10))
        };
        let live = LiveHub::start(db.pool.clone());
        let transport =
            InProcess::new(db.pool.clone(), ttl, std::sync::Arc::from(name)).serving(filter);
        let (worker, controls) = Worker::new(
            holder(&format!("{name}-w1")),
            transport.clone(),
            handlers,
            config,
            Chaos::from_os(ChaosSettings::off()),
        );
        let running = tokio::spawn(worker.waking_on(WorkSignal::new(&live)).run());
        IdleWorker {
            starts,
            controls,
            running,
            transport,
            live,
        }
    }

    /// Stops it and waits for it to end.
    pub async fn stop(self) {
        self.controls.stop();
        self.running.await.unwrap();
        self.transport.flush().await;
        self.live.shutdown();
    }
}

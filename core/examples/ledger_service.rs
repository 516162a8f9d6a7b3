//! A small service embedding leasekeeper: run two (or more) replicas of
//! this one binary on one database, and kill any of them at any moment.
//!
//! - It enqueues work of two kinds (`--enqueue N`): `deposit` (a row in the
//!   service's own `ledger` table) and `welcome_email` (a row in its
//!   `outbox`). Each handler writes its effect in a fenced transaction, so
//!   the row commits with the task's completion, and only if the
//!   completion is accepted: a replica that dies or stalls mid-task leaves
//!   no row, and the replica that takes the task over writes it once.
//! - One replica at a time runs a singleton job (`singleton:daily-report`,
//!   on the library's singleton lock): every 200 ms it writes a `reports`
//!   row with its term's fencing token, fenced in the database too.
//!
//! ```sh
//! cargo run -p leasekeeper-core --example ledger_service -- \
//!     --database-url postgres://localhost/shop --replica a --enqueue 500
//! cargo run -p leasekeeper-core --example ledger_service -- \
//!     --database-url postgres://localhost/shop --replica b
//! ```
//!
//! Flags: `--database-url URL` (or `DATABASE_URL`), `--replica NAME`,
//! `--enqueue N`, `--lease-ttl-ms MS` (default 15000), `--run-for-secs S`
//! (default: until Ctrl-C).

use leasekeeper_core::db;
use leasekeeper_core::lease::client::{LeaseClient, LeaseTiming};
use leasekeeper_core::lease::singleton::{HeldTerm, Singleton};
use leasekeeper_core::lease::{Holder, Resource};
use leasekeeper_core::queue::NewTask;
use leasekeeper_core::queue::store as tasks;
use leasekeeper_core::worker::handler::{Done, HandlerError, HandlerResult, Job, TaskContext};
use leasekeeper_core::worker::runtime::Runtime;
use serde_json::json;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    database_url: String,
    replica: String,
    enqueue: usize,
    lease_ttl: Duration,
    run_for: Option<Duration>,
}

fn args() -> Result<Args, Error> {
    let mut args = Args {
        database_url: std::env::var("DATABASE_URL").unwrap_or_default(),
        replica: format!("replica-{}", std::process::id()),
        enqueue: 0,
        lease_ttl: Duration::from_secs(15),
        run_for: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--database-url" => args.database_url = value()?,
            "--replica" => args.replica = value()?,
            "--enqueue" => args.enqueue = value()?.parse()?,
            "--lease-ttl-ms" => args.lease_ttl = Duration::from_millis(value()?.parse()?),
            "--run-for-secs" => args.run_for = Some(Duration::from_secs(value()?.parse()?)),
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if args.database_url.is_empty() {
        return Err("--database-url (or DATABASE_URL) is required".into());
    }
    Ok(args)
}

/// The service's own tables, in its own schema, created once whichever
/// replica starts first (an advisory lock keeps two from racing).
async fn migrate_service(pool: &PgPool) -> Result<(), Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(4242)")
        .execute(&mut *tx)
        .await?;
    for ddl in [
        "CREATE TABLE IF NOT EXISTS public.ledger (
             task_id int NOT NULL, account text NOT NULL, cents bigint NOT NULL,
             replica text NOT NULL, token bigint NOT NULL)",
        "CREATE TABLE IF NOT EXISTS public.outbox (
             task_id int NOT NULL, recipient text NOT NULL,
             replica text NOT NULL, token bigint NOT NULL)",
        "CREATE TABLE IF NOT EXISTS public.reports (
             replica text NOT NULL, token bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
    ] {
        sqlx::query(ddl).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// `deposit`: credit an account, exactly once.
async fn deposit(job: Job, ctx: TaskContext, replica: Arc<str>) -> HandlerResult {
    let account = job.data["account"]
        .as_str()
        .ok_or("deposit needs an account")?;
    let cents = job.data["cents"].as_i64().ok_or("deposit needs cents")?;
    // Some real work before the effect, so a kill can land mid-task.
    tokio::time::sleep(Duration::from_millis(30 + (job.id % 5) as u64 * 20)).await;
    let mut tx = ctx.transaction().await?;
    sqlx::query(
        "INSERT INTO ledger (task_id, account, cents, replica, token) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(job.id)
    .bind(account)
    .bind(cents)
    .bind(&*replica)
    .bind(job.fencing_token)
    .execute(&mut *tx)
    .await?;
    Ok(Done::in_transaction(json!({ "credited": cents }), tx))
}

/// `welcome_email`: queue one email in the outbox, exactly once.
async fn welcome_email(job: Job, ctx: TaskContext, replica: Arc<str>) -> HandlerResult {
    let to = job.data["to"].as_str().ok_or("welcome_email needs `to`")?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut tx = ctx.transaction().await?;
    sqlx::query("INSERT INTO outbox (task_id, recipient, replica, token) VALUES ($1, $2, $3, $4)")
        .bind(job.id)
        .bind(to)
        .bind(&*replica)
        .bind(job.fencing_token)
        .execute(&mut *tx)
        .await?;
    Ok(Done::in_transaction(json!({ "queued_for": to }), tx))
}

/// The singleton job: while this replica holds `singleton:daily-report`,
/// a report row every 200 ms, each fenced by the term's token in the
/// database (the lease row is locked `FOR SHARE` with the insert, so a
/// takeover waits for it, and a stale term inserts nothing).
async fn report_while_held(pool: PgPool, replica: Arc<str>, term: HeldTerm) {
    while term.is_held() {
        let written: Result<(), HandlerError> = async {
            let mut tx = pool.begin().await?;
            let live: Option<i64> = sqlx::query_scalar(
                "SELECT fencing_token FROM leases
                  WHERE resource = 'singleton:daily-report' AND holder = $1
                    AND fencing_token = $2 AND released_at IS NULL
                    AND expires_at > clock_timestamp()
                  FOR SHARE",
            )
            .bind(&*replica)
            .bind(term.token())
            .fetch_optional(&mut *tx)
            .await?;
            if live.is_some() {
                sqlx::query("INSERT INTO public.reports (replica, token) VALUES ($1, $2)")
                    .bind(&*replica)
                    .bind(term.token())
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(())
        }
        .await;
        if let Err(e) = written {
            eprintln!("{replica}: report failed: {e}");
        }
        tokio::select! {
            _ = term.stop().cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = args()?;
    let replica: Arc<str> = Arc::from(args.replica.as_str());
    // leasekeeper's tables live in their own schema; many replicas may
    // migrate at the same moment.
    let schema = db::Schema::default();
    let pool = db::connect(&args.database_url, &schema).await?;
    db::migrate(&pool, &schema).await?;
    migrate_service(&pool).await?;

    if args.enqueue > 0 {
        let mut conn = pool.acquire().await?;
        for n in 0..args.enqueue {
            let task = if n % 2 == 0 {
                NewTask::new(
                    "deposit",
                    json!({ "account": format!("acct-{}", n % 7), "cents": 100 + n }),
                )
            } else {
                NewTask::new(
                    "welcome_email",
                    json!({ "to": format!("user{n}@example.org") }),
                )
                .queue("mail")
            };
            tasks::enqueue(&mut conn, &schema, &task).await?;
        }
        println!("{replica}: enqueued {}", args.enqueue);
    }

    let ttl = args.lease_ttl;
    let (r1, r2) = (replica.clone(), replica.clone());
    let runtime = Runtime::builder(pool.clone())
        .id(&*replica)
        .lease(ttl, ttl / 3)
        .queue("default", 4)
        .queue("mail", 2)
        .handler("deposit", move |job, ctx| deposit(job, ctx, r1.clone()))
        .handler("welcome_email", move |job, ctx| {
            welcome_email(job, ctx, r2.clone())
        })
        .start()
        .await?;

    let reporter = {
        let client = LeaseClient::new(
            pool.clone(),
            Resource::parse("singleton:daily-report")?,
            Holder::parse(&*replica)?,
            LeaseTiming::from_ttl(ttl),
        );
        let (pool, replica) = (pool.clone(), replica.clone());
        let singleton = Singleton::spawn_with_term(
            client,
            ttl / 5,
            Arc::new(move |term| Box::pin(report_while_held(pool.clone(), replica.clone(), term))),
        );
        singleton.start();
        singleton
    };
    println!("{replica}: running");

    let run_for = args.run_for.unwrap_or(Duration::MAX);
    tokio::select! {
        stopped = tokio::signal::ctrl_c() => stopped?,
        () = tokio::time::sleep(run_for) => {}
    }
    reporter.shutdown().await;
    runtime.shutdown().await;
    println!("{replica}: stopped");
    Ok(())
}

//! A small service embedding leasekeeper: run two (or more) replicas of
//! this one binary on one database, and kill any of them at any moment.
//!
//! - It enqueues work of two kinds (`--enqueue N`): `deposit` (a row in the
//!   service's own `ledger` table) and `welcome_email` (a row in its
//!   `outbox`). Each handler writes its effect in a fenced transaction, so
//!   the row commits with the task's completion, and only if the
//!   completion is accepted: a replica that dies or stalls mid-task leaves
//!   no row, and the replica that takes the task over writes it once.
//! - Two more kinds write effects that do NOT pass through the completion,
//!   fenced by the claim's token ([`leasekeeper_core::lease::fence`]):
//!   `ship` writes a `shipments` row in a transaction of its own, opened
//!   with `leasekeeper.assert_fence('task:<id>', token)`, which raises
//!   (SQLSTATE LK001) once the claim is over and holds the term open until
//!   that transaction commits; it checks for an earlier shipment first, so
//!   a task ships once even when a stalled claim and its successor both
//!   run. `notify` (only with `--receiver`) sends its effect to a separate
//!   receiver process with the token; the receiver keeps the highest token
//!   per task and refuses lower ones, so a claim that stalled past its
//!   lease and wakes up after its successor spoke is refused there.
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
//! The receiver, for `notify` (no database; answers until Ctrl-C):
//!
//! ```sh
//! cargo run -p leasekeeper-core --example ledger_service -- --serve-receiver 127.0.0.1:7700
//! ```
//!
//! Flags: `--database-url URL` (or `DATABASE_URL`), `--replica NAME`,
//! `--enqueue N`, `--enqueue-only` (enqueue them and exit, running no
//! runtime), `--lease-ttl-ms MS` (default 15000), `--run-for-secs S`
//! (default: until Ctrl-C), `--receiver ADDR` (where `notify` sends),
//! `--serve-receiver ADDR` (be the receiver instead).

use leasekeeper_core::db;
use leasekeeper_core::lease::client::{LeaseClient, LeaseTiming};
use leasekeeper_core::lease::fence::{self, TokenGate};
use leasekeeper_core::lease::singleton::{HeldTerm, Singleton};
use leasekeeper_core::lease::{Holder, Resource};
use leasekeeper_core::queue::NewTask;
use leasekeeper_core::queue::store as tasks;
use leasekeeper_core::worker::handler::{Done, HandlerError, HandlerResult, Job, TaskContext};
use leasekeeper_core::worker::runtime::Runtime;
use serde_json::json;
use sqlx::PgPool;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Args {
    database_url: String,
    replica: String,
    enqueue: usize,
    enqueue_only: bool,
    lease_ttl: Duration,
    run_for: Option<Duration>,
    receiver: Option<String>,
    serve_receiver: Option<String>,
}

fn args() -> Result<Args, Error> {
    let mut args = Args {
        database_url: std::env::var("DATABASE_URL").unwrap_or_default(),
        replica: format!("replica-{}", std::process::id()),
        enqueue: 0,
        enqueue_only: false,
        lease_ttl: Duration::from_secs(15),
        run_for: None,
        receiver: None,
        serve_receiver: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--database-url" => args.database_url = value()?,
            "--replica" => args.replica = value()?,
            "--enqueue" => args.enqueue = value()?.parse()?,
            "--enqueue-only" => args.enqueue_only = true,
            "--lease-ttl-ms" => args.lease_ttl = Duration::from_millis(value()?.parse()?),
            "--run-for-secs" => args.run_for = Some(Duration::from_secs(value()?.parse()?)),
            "--receiver" => args.receiver = Some(value()?),
            "--serve-receiver" => args.serve_receiver = Some(value()?),
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if args.database_url.is_empty() && args.serve_receiver.is_none() {
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
        // No unique key on purpose: `ship` must ship once by itself.
        "CREATE TABLE IF NOT EXISTS public.shipments (
             task_id bigint NOT NULL, replica text NOT NULL, token bigint NOT NULL,
             at timestamptz NOT NULL DEFAULT clock_timestamp())",
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

/// `ship`: ship an order once, in a transaction that is not the
/// completion's (say, the shipping system's own tables, written before the
/// task completes). Its first statement is the fence: if this claim is
/// over, `assert_fence` raises LK001 and nothing is written; if not, the
/// claim's term cannot end until this transaction commits (a takeover
/// waits for it), so the check for an earlier shipment and the insert
/// cannot interleave with a successor's.
async fn ship(job: Job, pool: PgPool, replica: Arc<str>) -> HandlerResult {
    let order = job.data["order"].as_i64().ok_or("ship needs an order")?;
    tokio::time::sleep(Duration::from_millis(20 + (job.id % 3) as u64 * 20)).await;
    let mut tx = pool.begin().await?;
    // Refused (LK001): the claim is over and another replica has, or will
    // have, the task; the handler fails and its failure is refused too.
    fence::assert_fence(
        &mut tx,
        &db::Schema::default(),
        &job.resource(),
        job.fencing_token,
    )
    .await?;
    let shipped: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM public.shipments WHERE task_id = $1)")
            .bind(job.id)
            .fetch_one(&mut *tx)
            .await?;
    if !shipped {
        // Some work between the check and the write, where a stall would
        // double the shipment without the fence.
        tokio::time::sleep(Duration::from_millis(10)).await;
        sqlx::query("INSERT INTO public.shipments (task_id, replica, token) VALUES ($1, $2, $3)")
            .bind(job.id)
            .bind(&*replica)
            .bind(job.fencing_token)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(Done::output(
        json!({ "order": order, "shipped_now": !shipped }),
    ))
}

/// `notify`: tell the receiver, outside the database, with the claim's
/// token; the receiver refuses a token lower than one it has seen for the
/// task (a stalled claim whose successor already spoke).
async fn notify(job: Job, receiver: Option<Arc<str>>, replica: Arc<str>) -> HandlerResult {
    let receiver = receiver.ok_or("notify needs --receiver")?;
    tokio::time::sleep(Duration::from_millis(20 + (job.id % 4) as u64 * 15)).await;
    let stream = TcpStream::connect(&*receiver).await?;
    let (read, mut write) = stream.into_split();
    write
        .write_all(format!("PUT {} {} {replica}\n", job.resource(), job.fencing_token).as_bytes())
        .await?;
    let mut answer = String::new();
    BufReader::new(read).read_line(&mut answer).await?;
    match answer.trim() {
        "OK" => Ok(Done::output(json!({ "notified": true }))),
        refused => Err(format!("the receiver refused: {refused}").into()),
    }
}

/// The receiver of `notify`: the recipe for fencing an effect outside the
/// database. Every request carries the task's resource and its claim's
/// token; a [`TokenGate`] keeps the highest token seen per resource and
/// refuses lower ones. The effect here is "the task's notification is
/// this replica's, by this term", kept per task: a refused request changes
/// nothing. One line per request: `PUT <resource> <token> <value>` answers
/// `OK` or `STALE <highest>`; `DUMP` answers one line per resource,
/// `<resource> <token> <value> <accepted requests>`, then `REFUSED <n>` and
/// `END`.
async fn serve_receiver(addr: &str) -> Result<(), Error> {
    #[derive(Default)]
    struct Receiver {
        gate: TokenGate,
        latest: std::collections::BTreeMap<String, (i64, String, u64)>,
        refused: u64,
    }
    let state = Arc::new(Mutex::new(Receiver::default()));
    let listener = TcpListener::bind(addr).await?;
    println!("receiver: listening on {}", listener.local_addr()?);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            stopped = tokio::signal::ctrl_c() => return Ok(stopped?),
        };
        let state = state.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let words: Vec<&str> = line.split_whitespace().collect();
                let answer = match words.as_slice() {
                    ["PUT", resource, token, value] => match token.parse::<i64>() {
                        Ok(token) => {
                            let mut r = state.lock().expect("receiver state");
                            match r.gate.admit(resource, token) {
                                Ok(()) => {
                                    let entry = r.latest.entry(resource.to_string()).or_insert((
                                        token,
                                        String::new(),
                                        0,
                                    ));
                                    *entry = (token, value.to_string(), entry.2 + 1);
                                    "OK\n".to_string()
                                }
                                Err(stale) => {
                                    r.refused += 1;
                                    format!("STALE {}\n", stale.highest)
                                }
                            }
                        }
                        Err(_) => "ERROR bad token\n".to_string(),
                    },
                    ["DUMP"] => {
                        let r = state.lock().expect("receiver state");
                        let mut out = String::new();
                        for (resource, (token, value, accepted)) in &r.latest {
                            out.push_str(&format!("{resource} {token} {value} {accepted}\n"));
                        }
                        out.push_str(&format!("REFUSED {}\nEND\n", r.refused));
                        out
                    }
                    _ => "ERROR expected PUT <resource> <token> <value> or DUMP\n".to_string(),
                };
                if write.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// The singleton job: while this replica holds `singleton:daily-report`,
/// a report row every 200 ms, each fenced by the term's token in the
/// database (the lease row is locked `FOR SHARE` with the insert, so a
/// takeover waits for it, and a stale term inserts nothing).
async fn report_while_held(pool: PgPool, replica: Arc<str>, term: HeldTerm) {
    while term.is_held() {
        let written: Result<(), HandlerError> = async {
            let mut tx = pool.begin().await?;
            // The same fence as `ship`'s, on the singleton's term.
            fence::assert_fence(
                &mut tx,
                &db::Schema::default(),
                "singleton:daily-report",
                term.token(),
            )
            .await?;
            sqlx::query("INSERT INTO public.reports (replica, token) VALUES ($1, $2)")
                .bind(&*replica)
                .bind(term.token())
                .execute(&mut *tx)
                .await?;
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
    if let Some(addr) = &args.serve_receiver {
        return serve_receiver(addr).await;
    }
    let replica: Arc<str> = Arc::from(args.replica.as_str());
    // leasekeeper's tables live in their own schema; many replicas may
    // migrate at the same moment.
    let schema = db::Schema::default();
    let pool = db::connect(&args.database_url, &schema).await?;
    db::migrate(&pool, &schema).await?;
    migrate_service(&pool).await?;

    if args.enqueue > 0 {
        let mut conn = pool.acquire().await?;
        let kinds = if args.receiver.is_some() { 4 } else { 3 };
        for n in 0..args.enqueue {
            let task = if n % kinds == 2 {
                NewTask::new("ship", json!({ "order": n }))
            } else if n % kinds == 3 {
                NewTask::new("notify", json!({ "order": n }))
            } else if n % kinds == 0 {
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
    if args.enqueue_only {
        return Ok(());
    }

    let ttl = args.lease_ttl;
    let (r1, r2, r3, r4) = (
        replica.clone(),
        replica.clone(),
        replica.clone(),
        replica.clone(),
    );
    let receiver: Option<Arc<str>> = args.receiver.as_deref().map(Arc::from);
    let ship_pool = pool.clone();
    let runtime = Runtime::builder(pool.clone())
        .id(&*replica)
        .lease(ttl, ttl / 3)
        .queue("default", 4)
        .queue("mail", 2)
        .handler("deposit", move |job, ctx| deposit(job, ctx, r1.clone()))
        .handler("welcome_email", move |job, ctx| {
            welcome_email(job, ctx, r2.clone())
        })
        .handler("ship", move |job, _ctx| {
            ship(job, ship_pool.clone(), r3.clone())
        })
        .handler("notify", move |job, _ctx| {
            notify(job, receiver.clone(), r4.clone())
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

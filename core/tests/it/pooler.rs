//! Behind PgBouncer in transaction mode, configured as hosted poolers
//! commonly are (`pool_mode = transaction`, `ignore_startup_parameters =
//! extra_float_digits, options`, fewer server connections than clients):
//! Debian's 1.18 has no prepared statements in this mode, drops the
//! `search_path` startup option, and hands every transaction to whichever
//! server connection is free. The library migrates, the runtime claims,
//! heartbeats and completes, a dead claimer's task is taken over and its
//! late completion refused, the generator's singleton fails over with the
//! next fencing token, and idle workers wake by their poll.

use crate::bouncer::Bouncer;
use crate::common::{TestDb, until};
use leasekeeper_core::db::{self, Schema};
use leasekeeper_core::generator::runtime::{Generator, GeneratorConfig};
use leasekeeper_core::generator::{Desired, store as generator_store};
use leasekeeper_core::lease::Holder;
use leasekeeper_core::lease::client::LeaseTiming;
use leasekeeper_core::queue::store::{self as tasks, TaskError};
use leasekeeper_core::queue::{NewTask, TaskStatus};
use leasekeeper_core::worker::handler::{Done, HandlerResult, Job, TaskContext};
use leasekeeper_core::worker::runtime::Runtime;
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use std::time::{Duration, Instant};

async fn count(direct: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(direct).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_in_transaction_mode_every_guarantee_holds() {
    let db = TestDb::unmigrated().await;
    let bouncer = Bouncer::start(&db.plain);
    let schema = Schema::default().behind_transaction_pooler();
    let pooled = PgPoolOptions::new()
        .max_connections(24)
        .connect_with(db::connect_options(bouncer.options(&db.plain), &schema))
        .await
        .unwrap_or_else(|e| panic!("connecting through pgbouncer: {e}\n{}", bouncer.log()));
    assert_eq!(Schema::of(&pooled), schema);
    // The pooler dropped the search_path startup option: every statement
    // must name its schema.
    let seen: String = sqlx::query_scalar("SHOW search_path")
        .persistent(false)
        .fetch_one(&pooled)
        .await
        .unwrap();
    assert!(!seen.contains("leasekeeper"), "{seen}");

    // Replicas migrating at once through the pooler.
    let migrations: Vec<_> = (0..3)
        .map(|_| {
            let (pooled, schema) = (pooled.clone(), schema.clone());
            tokio::spawn(async move { db::migrate(&pooled, &schema).await })
        })
        .collect();
    let mut failed = Vec::new();
    for m in migrations {
        if let Err(e) = m.await.unwrap() {
            failed.push(format!("{e:#}"));
        }
    }
    assert!(
        failed.is_empty(),
        "migrating through the pooler: {failed:#?}\n{}",
        bouncer.log()
    );
    let direct = db.pool.clone();

    // A claimer that dies holding a task: it never heartbeats or completes.
    let ghost = Holder::parse("ghost-worker").unwrap();
    let mut conn = pooled.acquire().await.unwrap();
    let orphan = tasks::enqueue(
        &mut conn,
        &schema,
        &NewTask::new("noop", json!({"orphan": true})),
    )
    .await
    .unwrap();
    let claimed = tasks::claim_next(&mut conn, &schema, &ghost, Duration::from_millis(800))
        .await
        .unwrap()
        .expect("the orphan");
    assert_eq!(claimed.id, orphan.id);
    let ghost_token = claimed.fencing_token.unwrap();
    let n: i64 = 300;
    for i in 0..n {
        tasks::enqueue(&mut conn, &schema, &NewTask::new("noop", json!({ "i": i })))
            .await
            .unwrap();
    }
    drop(conn);

    // Two runtimes through the pooler, more workers than server connections.
    let start_runtime = |id: &str| {
        Runtime::builder(pooled.clone())
            .id(id)
            .queue("default", 8)
            .lease(Duration::from_millis(900), Duration::from_millis(300))
            .handler("noop", |job: Job, _: TaskContext| async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                HandlerResult::Ok(Done::output(json!({ "done": job.id })))
            })
            .start()
    };
    let a = start_runtime("pgb-a").await.unwrap();
    let b = start_runtime("pgb-b").await.unwrap();
    until("every task processed", Duration::from_secs(60), || async {
        count(
            &direct,
            "SELECT count(*) FROM tasks WHERE status = 'processed'",
        )
        .await
            == n + 1
    })
    .await;
    // Each task claimed once, but the orphan, taken over once.
    let claims_per_task: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT substr(resource, 6)::bigint AS task, count(*) FROM lease_events
          WHERE resource LIKE 'task:%' AND kind IN ('acquired', 'taken_over')
          GROUP BY 1 HAVING count(*) <> 1",
    )
    .fetch_all(&direct)
    .await
    .unwrap();
    assert_eq!(claims_per_task, vec![(orphan.id, 2)], "claims per task");
    let orphan_now = tasks::get(
        &mut direct.acquire().await.unwrap(),
        &Default::default(),
        orphan.id,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(orphan_now.status, TaskStatus::Processed);
    assert_eq!(orphan_now.fencing_token, Some(ghost_token + 1));
    // The dead claimer's late completion is refused and changes nothing.
    let late = tasks::complete(
        &mut pooled.acquire().await.unwrap(),
        &schema,
        orphan.id,
        &ghost,
        ghost_token,
        None,
    )
    .await;
    assert!(matches!(late, Err(TaskError::Stale { .. })), "{late:?}");

    // Idle workers wake by their poll: no LISTEN through the pooler.
    let enqueued = Instant::now();
    let last = tasks::enqueue(
        &mut pooled.acquire().await.unwrap(),
        &schema,
        &NewTask::new("noop", json!({"last": true})),
    )
    .await
    .unwrap();
    until("the last task", Duration::from_secs(5), || async {
        let t = tasks::get(
            &mut direct.acquire().await.unwrap(),
            &Default::default(),
            last.id,
        )
        .await
        .unwrap()
        .unwrap();
        t.status == TaskStatus::Processed
    })
    .await;
    let pickup = enqueued.elapsed();
    eprintln!("behind pgbouncer: enqueue to completion on an idle runtime {pickup:?}");
    a.shutdown().await;
    b.shutdown().await;

    // The generator's singleton fails over: the holder dies (no release),
    // the other replica takes the lease with the next token, and every
    // generated task was inserted under a live term.
    generator_store::set_desired(
        &mut pooled.acquire().await.unwrap(),
        &schema,
        Desired::Running,
        "test",
    )
    .await
    .unwrap();
    let config = GeneratorConfig::new(
        LeaseTiming::from_ttl(Duration::from_millis(1500)),
        Duration::from_millis(100),
        3,
        1,
        "generated",
    );
    let first = Generator::spawn(pooled.clone(), Holder::parse("replica-1").unwrap(), config);
    until(
        "the first replica generating",
        Duration::from_secs(10),
        || async {
            count(
                &direct,
                "SELECT count(*) FROM tasks WHERE kind = 'generated'",
            )
            .await
                > 0
        },
    )
    .await;
    let second = Generator::spawn(pooled.clone(), Holder::parse("replica-2").unwrap(), config);
    let (holder, token): (String, i64) = sqlx::query_as(
        "SELECT holder, fencing_token FROM leases WHERE resource = 'singleton:generator'",
    )
    .fetch_one(&direct)
    .await
    .unwrap();
    assert_eq!(holder, "replica-1");
    first.abort();
    until(
        "the second replica taking over",
        Duration::from_secs(10),
        || async {
            let now: (String, i64) = sqlx::query_as(
                "SELECT holder, fencing_token FROM leases WHERE resource = 'singleton:generator'",
            )
            .fetch_one(&direct)
            .await
            .unwrap();
            now == ("replica-2".to_string(), token + 1)
        },
    )
    .await;
    let before = count(
        &direct,
        "SELECT count(*) FROM tasks WHERE kind = 'generated'",
    )
    .await;
    until(
        "the second replica generating",
        Duration::from_secs(10),
        || async {
            count(
                &direct,
                "SELECT count(*) FROM tasks WHERE kind = 'generated'",
            )
            .await
                > before
        },
    )
    .await;
    second.shutdown().await;
    // Every generated task names the term it was inserted under: the
    // first replica's, then the second's with the next token.
    let terms: Vec<(String, i64)> = sqlx::query_as(
        "SELECT DISTINCT task_data->>'generator', (task_data->>'generator_token')::bigint
           FROM tasks WHERE kind = 'generated' ORDER BY 2",
    )
    .fetch_all(&direct)
    .await
    .unwrap();
    assert_eq!(
        terms,
        vec![
            ("replica-1".to_string(), token),
            ("replica-2".to_string(), token + 1)
        ]
    );
    assert!(
        !bouncer.log().contains("prepared statement"),
        "pgbouncer saw prepared-statement errors:\n{}",
        bouncer.log()
    );
}

/// Behind the pooler with a direct connection ([`Runtime::builder`]'s
/// `direct`): a direct URL to another database is refused at start; the
/// right one carries the runtime's liveness session, so when that session
/// is cut the runtime's claim ends at once and is taken over within two
/// seconds at the default TTL of 15 s; without it there is no liveness
/// session at all (the TTL rules).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_a_direct_connection_carries_the_liveness_session() {
    let db = TestDb::new().await;
    let bouncer = Bouncer::start(&db.plain);
    let schema = Schema::default().behind_transaction_pooler();
    let pooled = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(db::connect_options(bouncer.options(&db.plain), &schema))
        .await
        .unwrap_or_else(|e| panic!("connecting through pgbouncer: {e}\n{}", bouncer.log()));
    let sessions_of = |id: &'static str| {
        let direct = db.pool.clone();
        async move {
            count(
                &direct,
                &format!(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'leasekeeper liveness {id}'"
                ),
            )
            .await
        }
    };
    let builder = |id: &str| {
        Runtime::builder(pooled.clone())
            .id(id)
            .queue("default", 1)
            .scheduler(None)
            .handler("long", |job: Job, ctx: TaskContext| async move {
                if job.fencing_token > 1 {
                    // The rescue's run: done at once.
                    return HandlerResult::Ok(Done::empty());
                }
                ctx.cancelled().await;
                Err("cancelled".into())
            })
    };

    // Another database of the same server: refused, saying why.
    let elsewhere = db.plain.clone().database("postgres");
    let refused = match builder("pgb-elsewhere").direct(elsewhere).start().await {
        Ok(_) => panic!("a direct URL to another database was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(refused.contains("must be the same database"), "{refused}");

    // Without a direct connection: no liveness session.
    let without = builder("pgb-without").start().await.unwrap();
    assert_eq!(sessions_of("pgb-without").await, 0);
    without.shutdown().await;

    // With it: the session is there, on the direct connection.
    let runtime = builder("pgb-direct")
        .direct(db.plain.clone())
        .start()
        .await
        .unwrap();
    assert_eq!(sessions_of("pgb-direct").await, 1);
    let mut conn = pooled.acquire().await.unwrap();
    let task = tasks::enqueue(&mut conn, &schema, &NewTask::new("long", json!({})))
        .await
        .unwrap();
    drop(conn);
    until("the long task started", Duration::from_secs(10), || async {
        count(
            &db.pool,
            &format!(
                "SELECT count(*) FROM tasks WHERE id = {} AND status = 'started'",
                task.id
            ),
        )
        .await
            == 1
    })
    .await;
    let cut = Instant::now();
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE application_name = 'leasekeeper liveness pgb-direct'",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    until(
        "taken over and processed by a new term",
        Duration::from_secs(2),
        || async {
            count(
                &db.pool,
                &format!(
                    "SELECT count(*) FROM tasks WHERE id = {} AND status = 'processed' AND fencing_token >= 2",
                    task.id
                ),
            )
            .await
                == 1
        },
    )
    .await;
    assert!(cut.elapsed() < Duration::from_secs(2));
    // Registered again, on a new direct session.
    until("registered again", Duration::from_secs(5), || async {
        sessions_of("pgb-direct").await == 1
    })
    .await;
    runtime.shutdown().await;
}

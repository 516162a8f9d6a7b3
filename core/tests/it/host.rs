//! A host service's own connections and tables: every statement of the
//! library names its schema, so it works on a pool whose `search_path` is
//! the host's (`public`), inside the host's transactions, and never touches
//! the host's tables, even ones that share leasekeeper's table names and
//! columns (the trap: a statement that resolved a bare name by the
//! `search_path` would succeed silently on them). The same holds for a pool
//! behind a pooler that drops the `search_path` startup parameter.

use crate::common::{TestDb, holder, resource, until};
use leasekeeper_core::db::{self, Schema};
use leasekeeper_core::generator::runtime::{Generator, GeneratorConfig};
use leasekeeper_core::generator::{Desired, store as generator_store};
use leasekeeper_core::instance::Registration;
use leasekeeper_core::lease::client::{LeaseClient, LeaseTiming};
use leasekeeper_core::live::{LiveHub, Topics};
use leasekeeper_core::maintenance;
use leasekeeper_core::queue::store as tasks;
use leasekeeper_core::queue::{NewTask, TaskStatus};
use leasekeeper_core::worker::handler::{Done, HandlerResult, Job, TaskContext};
use leasekeeper_core::worker::runtime::Runtime;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgPool};
use std::sync::Arc;
use std::time::Duration;

/// Every table of leasekeeper's schema.
async fn our_tables(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = 'leasekeeper' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The host's `public`: a table of its own, and a copy of every one of
/// leasekeeper's tables (same name, same columns, same defaults), which a
/// statement that named no schema would find first.
async fn host_tables(pool: &PgPool) -> Vec<String> {
    let ours = our_tables(pool).await;
    let mut conn = pool.acquire().await.unwrap();
    sqlx::raw_sql("CREATE TABLE public.orders (id serial PRIMARY KEY, total int NOT NULL)")
        .execute(&mut *conn)
        .await
        .unwrap();
    for table in &ours {
        sqlx::raw_sql(&format!(
            "CREATE TABLE public.{table} (LIKE leasekeeper.{table} INCLUDING DEFAULTS)"
        ))
        .execute(&mut *conn)
        .await
        .unwrap();
    }
    ours
}

/// The rows in the host's copies of leasekeeper's tables, by table.
async fn rows_in_host_copies(pool: &PgPool, tables: &[String]) -> Vec<(String, i64)> {
    let mut found = Vec::new();
    for table in tables {
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM public.{table}"))
            .fetch_one(pool)
            .await
            .unwrap();
        if n > 0 {
            found.push((table.clone(), n));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_hosts_own_pool_everything_works_and_the_hosts_tables_stay_untouched() {
    let db = TestDb::unmigrated().await;
    // The host's pool: its own connect options, search_path `"$user", public`.
    let host = PgPoolOptions::new()
        .max_connections(16)
        .connect_with(db.plain.clone())
        .await
        .unwrap();
    let search_path: String = sqlx::query_scalar("SHOW search_path")
        .fetch_one(&host)
        .await
        .unwrap();
    assert!(search_path.contains("public"), "{search_path}");
    let schema = Schema::default();
    assert_eq!(
        Schema::of(&host),
        schema,
        "a host's pool means the default schema"
    );
    db::migrate(&host, &schema).await.unwrap();
    let copies = host_tables(&host).await;
    assert!(copies.len() >= 9, "{copies:?}");

    // Enqueue inside the host's own transaction, with its own write: both
    // commit together, or neither does.
    let mut conn = host.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (total) VALUES (42)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let kept = tasks::enqueue(&mut tx, &schema, &NewTask::new("ship", json!({"order": 1})))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let dropped = tasks::enqueue(&mut tx, &schema, &NewTask::new("ship", json!({"order": 2})))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(
        tasks::get(&mut conn, &schema, dropped.id)
            .await
            .unwrap()
            .is_none()
    );
    let second = tasks::enqueue(
        &mut conn,
        &schema,
        &NewTask::new("ship", json!({"order": 3})),
    )
    .await
    .unwrap();
    drop(conn);

    // Change announcements on the schema's channel, heard on the host's pool.
    let hub = LiveHub::start(host.clone());
    let mut heard = hub.subscribe();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The runtime on the host's pool; the handler writes the host's table by
    // its bare name in its fenced transaction, which commits with the
    // completion.
    let runtime = Runtime::builder(host.clone())
        .id("host-rt")
        .queue("default", 2)
        .handler("ship", |job: Job, ctx: TaskContext| async move {
            let mut tx = ctx.transaction().await?;
            sqlx::query("UPDATE orders SET total = total + 1")
                .execute(&mut *tx)
                .await?;
            HandlerResult::Ok(Done::in_transaction(json!({ "shipped": job.id }), tx))
        })
        .start()
        .await
        .unwrap();
    until("both tasks processed", Duration::from_secs(20), || async {
        let mut conn = host.acquire().await.unwrap();
        let mut done = true;
        for id in [kept.id, second.id] {
            let t = tasks::get(&mut conn, &schema, id).await.unwrap().unwrap();
            done &= t.status == TaskStatus::Processed;
        }
        done
    })
    .await;
    runtime.shutdown().await;
    let total: i32 = sqlx::query_scalar("SELECT total FROM orders")
        .fetch_one(&host)
        .await
        .unwrap();
    assert_eq!(
        total, 44,
        "each handler's write committed with its completion"
    );
    let topics = tokio::time::timeout(Duration::from_secs(5), heard.recv())
        .await
        .expect("a change announcement")
        .unwrap();
    assert!(topics.contains(Topics::TASKS), "{}", topics.to_names());
    hub.shutdown();

    // A lease held, renewed and released through a client on the host's pool.
    let client = LeaseClient::new(
        host.clone(),
        resource("singleton:host-report"),
        holder("replica-a"),
        LeaseTiming::from_ttl(Duration::from_secs(2)),
    );
    let held = client.acquire().await.unwrap().expect("the lease");
    assert!(held.token() >= 1);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(held.release().await.unwrap(), "still held after renewals");

    // The generator (a singleton's fenced inserts) and an instance's row.
    let registration = Registration::start(
        host.clone(),
        Arc::from("host-replica"),
        "10.0.0.1:8080",
        Duration::from_millis(200),
    )
    .await
    .unwrap();
    generator_store::set_desired(
        &mut host.acquire().await.unwrap(),
        &schema,
        Desired::Running,
        "test",
    )
    .await
    .unwrap();
    let generator = Generator::spawn(
        host.clone(),
        holder("host-replica"),
        GeneratorConfig::new(
            LeaseTiming::from_ttl(Duration::from_secs(2)),
            Duration::from_millis(100),
            3,
            1,
            "generated",
        ),
    );
    until("a generated task", Duration::from_secs(10), || async {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM leasekeeper.tasks WHERE kind = 'generated'")
                .fetch_one(&host)
                .await
                .unwrap();
        n > 0
    })
    .await;
    generator.shutdown().await;
    registration.shutdown().await.unwrap();

    // Retention on the host's pool: everything finished is old enough.
    let pruned = maintenance::prune_once(&host, Duration::ZERO, 100, || true)
        .await
        .unwrap();
    assert!(pruned.total() >= 2, "{pruned:?}");

    assert_eq!(
        rows_in_host_copies(&host, &copies).await,
        Vec::<(String, i64)>::new(),
        "leasekeeper wrote into the host's tables"
    );
}

#[tokio::test]
async fn every_function_is_pinned_to_its_schema() {
    let db = TestDb::new().await;
    let unpinned: Vec<String> = sqlx::query_scalar(
        "SELECT p.oid::regprocedure::text FROM pg_proc p
          WHERE p.pronamespace = 'leasekeeper'::regnamespace
            AND NOT coalesce(p.proconfig @> ARRAY['search_path=\"leasekeeper\"'], false)",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        unpinned.is_empty(),
        "functions that resolve names by the caller's search_path: {unpinned:?}"
    );
}

/// The library's source names no table of its schema bare: a statement that
/// did would depend on the session's `search_path`. (What the tests above
/// cannot reach, this reading can.)
#[test]
fn no_statement_of_the_library_names_a_table_without_its_schema() {
    // Every table the migrations create (a new one is covered the day it
    // is added), and sqlx's own.
    let migrations = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut tables = vec!["_sqlx_migrations".to_string()];
    for entry in std::fs::read_dir(&migrations).unwrap() {
        let path = entry.unwrap().path();
        // The function files (migrations/functions/) create no table.
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        for line in text.lines() {
            if let Some(rest) = line.trim_start().strip_prefix("CREATE TABLE ") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                tables.push(name);
            }
        }
    }
    assert!(tables.iter().any(|t| t == "schedule_ticks"), "{tables:?}");
    let keywords = ["FROM", "JOIN", "INTO", "UPDATE", "TABLE", "TRUNCATE"];
    let mut bare = Vec::new();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            // The test harness's own helpers read through a pool whose
            // search_path is the schema; they are not the library.
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("db/testing.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                let words: Vec<&str> = line
                    .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$' || c == '.'))
                    .filter(|w| !w.is_empty())
                    .collect();
                // A name put in by format! is a table too, and needs its schema.
                if keywords.iter().any(|k| line.contains(&format!("{k} {{"))) {
                    bare.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                }
                for pair in words.windows(2) {
                    if keywords.contains(&pair[0]) && tables.iter().any(|t| t == pair[1]) {
                        bare.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(
        bare.is_empty(),
        "unqualified table names:\n{}",
        bare.join("\n")
    );
}

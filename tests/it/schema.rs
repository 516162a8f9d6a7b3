//! leasekeeper in a schema of its own: nothing in `public`, its migrations
//! recorded apart from the host's, schemas in one database independent of
//! each other, replicas migrating at once, and the dashboard reading a host
//! service's schema.

use crate::api::Api;
use crate::common::{TestDb, holder, resource};
use axum::http::StatusCode;
use leasekeeper::settings::{SettingArgs, Settings};
use leasekeeper_core::db::{Database, MIGRATOR, Schema, migrate};
use leasekeeper_core::instance;
use leasekeeper_core::lease::store as leases;
use leasekeeper_core::live::{LiveHub, Topics};
use leasekeeper_core::queue::store as tasks;
use leasekeeper_core::worker::Report;
use leasekeeper_core::worker::registry;
use leasekeeper_core::worker::{WorkerKind, WorkerState};
use serde_json::{Value, json};
use sqlx::postgres::PgListener;
use sqlx::{ConnectOptions, Connection, PgConnection};
use std::sync::Arc;
use std::time::Duration;

fn schema(name: &str) -> Schema {
    Schema::parse(name).expect("a valid schema name")
}

/// Every relation, function, trigger and type in schema `nsp`, by name.
async fn objects_in(conn: &mut PgConnection, nsp: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT 'relation ' || c.relname || ' (' || c.relkind::text || ')'
           FROM pg_class c WHERE c.relnamespace = $1::text::regnamespace
         UNION ALL
         SELECT 'function ' || p.proname FROM pg_proc p
          WHERE p.pronamespace = $1::text::regnamespace
         UNION ALL
         SELECT 'trigger ' || t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
          WHERE c.relnamespace = $1::text::regnamespace AND NOT t.tgisinternal
         UNION ALL
         SELECT 'type ' || t.typname FROM pg_type t WHERE t.typnamespace = $1::text::regnamespace
         ORDER BY 1",
    )
    .bind(nsp)
    .fetch_all(conn)
    .await
    .expect("listing a schema's objects")
}

/// What a host service has in `public` before it adds leasekeeper: a table
/// of its own, one whose name happens to be one of ours, and its own sqlx
/// migrations record with one row.
async fn host_tables(conn: &mut PgConnection) {
    sqlx::raw_sql(
        "CREATE TABLE orders (id serial PRIMARY KEY, total int NOT NULL);
         CREATE TABLE task_counts (shard smallint PRIMARY KEY, pending bigint NOT NULL DEFAULT 0);
         INSERT INTO task_counts (shard) SELECT generate_series(0, 15);
         CREATE TABLE _sqlx_migrations (
             version BIGINT PRIMARY KEY, description TEXT NOT NULL,
             installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL,
             checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL);
         INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (20200101000000, 'host orders', true, '\\x00', 1);",
    )
    .execute(conn)
    .await
    .expect("creating the host's tables");
}

async fn count(conn: &mut PgConnection, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

#[tokio::test]
async fn migrating_creates_nothing_in_public_and_leaves_the_hosts_migrations_alone() {
    let db = TestDb::unmigrated().await;
    // The host's own connection: no search_path of ours.
    let mut host = PgConnection::connect_with(&db.plain).await.unwrap();
    host_tables(&mut host).await;
    let public_before = objects_in(&mut host, "public").await;

    let ours = Schema::default();
    migrate(&db.pool, &ours).await.expect("migrating");
    // Again, as the next start-up does: nothing to do, no error.
    migrate(&db.pool, &ours).await.expect("migrating again");

    assert_eq!(objects_in(&mut host, "public").await, public_before);
    let inside = objects_in(&mut host, "leasekeeper").await;
    for expected in [
        "relation _sqlx_migrations (r)",
        "relation tasks (r)",
        "relation leases (r)",
        "relation tasks_id_seq (S)",
        "function changes_channel",
        "function task_counts_move",
        "trigger leases_record_event",
    ] {
        assert!(
            inside.contains(&expected.to_string()),
            "{expected} in {inside:?}"
        );
    }
    // The host's record of its migrations is as it was; ours is apart.
    let host_rows: Vec<(i64, String)> =
        sqlx::query_as("SELECT version, description FROM public._sqlx_migrations")
            .fetch_all(&mut host)
            .await
            .unwrap();
    assert_eq!(host_rows, vec![(20200101000000, "host orders".to_string())]);
    assert_eq!(
        count(
            &mut host,
            "SELECT count(*) FROM leasekeeper._sqlx_migrations WHERE success"
        )
        .await,
        MIGRATOR.iter().count() as i64
    );

    // Every function of ours pins its search_path, so a migration that
    // forgets it is caught here rather than by a host's session.
    let unpinned: Vec<String> = sqlx::query_scalar(
        "SELECT proname::text FROM pg_proc
          WHERE pronamespace = 'leasekeeper'::regnamespace
            AND coalesce(array_to_string(proconfig, ','), '') NOT LIKE '%search_path=%leasekeeper%'",
    )
    .fetch_all(&mut host)
    .await
    .unwrap();
    assert_eq!(unpinned, Vec::<String>::new());

    // Triggers fired from the host's session (search_path public, where a
    // table of the host's is also called task_counts) still write our
    // tables, not the host's.
    sqlx::raw_sql(
        "INSERT INTO leasekeeper.tasks (kind, task_data) VALUES ('sleep', '{}');
         INSERT INTO leasekeeper.leases (resource, holder, expires_at, ttl_ms, fencing_token)
         VALUES ('host:r', 'host', now() + interval '1 minute', 60000, 1);",
    )
    .execute(&mut host)
    .await
    .expect("writing our tables from the host's session");
    assert_eq!(
        count(
            &mut host,
            "SELECT sum(pending)::int8 FROM leasekeeper.task_counts"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &mut host,
            "SELECT sum(pending)::int8 FROM public.task_counts"
        )
        .await,
        0
    );
    assert_eq!(
        count(
            &mut host,
            "SELECT count(*) FROM leasekeeper.lease_events WHERE resource = 'host:r' AND kind = 'acquired'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &mut host,
            "SELECT last_token FROM leasekeeper.lease_fencing WHERE resource = 'host:r'"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn two_schemas_in_one_database_are_independent() {
    let default = TestDb::new().await;
    let svc = default.migrated_in(&schema("svc_a")).await;
    let mut a = default.pool.acquire().await.unwrap();
    let mut b = svc.pool.acquire().await.unwrap();

    let first_a = tasks::enqueue(
        &mut a,
        &Default::default(),
        &leasekeeper_core::queue::NewTask::new(
            leasekeeper_core::worker::simulated::KIND,
            json!({"in": "default"}),
        )
        .max_attempts(3),
    )
    .await
    .unwrap();
    tasks::enqueue(
        &mut a,
        &Default::default(),
        &leasekeeper_core::queue::NewTask::new(
            leasekeeper_core::worker::simulated::KIND,
            json!({"in": "default"}),
        )
        .max_attempts(3),
    )
    .await
    .unwrap();
    let first_b = tasks::enqueue(
        &mut b,
        &schema("svc_a"),
        &leasekeeper_core::queue::NewTask::new(
            leasekeeper_core::worker::simulated::KIND,
            json!({"in": "svc_a"}),
        )
        .max_attempts(3),
    )
    .await
    .unwrap();
    // Sequences are the schema's own: both start at 1.
    assert_eq!((first_a.id, first_b.id), (1, 1));
    assert_eq!(count(&mut a, "SELECT count(*) FROM tasks").await, 2);
    assert_eq!(count(&mut b, "SELECT count(*) FROM tasks").await, 1);
    let seen_by_b = tasks::claim_next(
        &mut b,
        &schema("svc_a"),
        &holder("w-b"),
        Duration::from_secs(30),
    )
    .await
    .unwrap()
    .expect("svc_a's task");
    assert_eq!(seen_by_b.task_data, json!({"in": "svc_a"}));
    assert!(
        tasks::claim_next(
            &mut b,
            &schema("svc_a"),
            &holder("w-b"),
            Duration::from_secs(30)
        )
        .await
        .unwrap()
        .is_none(),
        "svc_a's worker sees no task of the default schema"
    );

    // Fencing tokens are per schema: the same resource name starts afresh.
    let r = resource("shared:r");
    let ttl = Duration::from_secs(30);
    let t1 = leases::acquire(&mut a, &Default::default(), &r, &holder("h"), ttl)
        .await
        .unwrap();
    leases::release(
        &mut a,
        &Default::default(),
        &r,
        &holder("h"),
        Some(t1.lease().fencing_token),
    )
    .await
    .unwrap();
    let t2 = leases::acquire(&mut a, &Default::default(), &r, &holder("h"), ttl)
        .await
        .unwrap();
    let other = leases::acquire(&mut b, &schema("svc_a"), &r, &holder("other"), ttl)
        .await
        .expect("the resource is free in svc_a");
    assert_eq!(
        (
            t1.lease().fencing_token,
            t2.lease().fencing_token,
            other.lease().fencing_token
        ),
        (1, 2, 1)
    );
}

#[tokio::test]
async fn notifications_stay_in_their_schema() {
    let db = TestDb::unmigrated().await;
    let a = db.migrated_in(&schema("svc_a")).await;
    let b = db.migrated_in(&schema("svc_b")).await;
    let channel = |pool: sqlx::PgPool| async move {
        sqlx::query_scalar::<_, String>("SELECT changes_channel()")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let (channel_a, channel_b) = (channel(a.pool.clone()).await, channel(b.pool.clone()).await);
    assert_eq!(
        (channel_a.as_str(), channel_b.as_str()),
        ("svc_a_changes", "svc_b_changes")
    );
    let default = TestDb::new().await;
    assert_eq!(channel(default.pool.clone()).await, "leasekeeper_changes");

    let mut listen_a = PgListener::connect_with(&a.pool).await.unwrap();
    listen_a.listen(&channel_a).await.unwrap();
    let mut listen_b = PgListener::connect_with(&b.pool).await.unwrap();
    listen_b.listen(&channel_b).await.unwrap();
    // The hub derives its channel from its pool, like the triggers.
    let hub = LiveHub::start(a.pool.clone());
    let mut rx = hub.subscribe();
    let first = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert!(
        matches!(first, Ok(Ok(Topics::ALL))),
        "the hub listens: {first:?}"
    );

    sqlx::query("UPDATE generator_state SET desired = 'running'")
        .execute(&a.pool)
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(2), listen_a.recv())
        .await
        .expect("svc_a's trigger announced")
        .unwrap();
    assert_eq!(got.payload(), "generator");
    let heard = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match rx.recv().await {
                Ok(t) if t.contains(Topics::GENERATOR) => return,
                Ok(_) => continue,
                Err(e) => panic!("announcements stopped: {e}"),
            }
        }
    })
    .await;
    assert!(heard.is_ok(), "svc_a's hub heard svc_a's change");
    let crossed = tokio::time::timeout(Duration::from_millis(500), listen_b.recv()).await;
    assert!(crossed.is_err(), "svc_b heard svc_a's change: {crossed:?}");
    hub.shutdown();
}

/// Replicas starting together on a fresh database. Without the migration's
/// own lock (and with `CREATE SCHEMA IF NOT EXISTS`), this failed in 5 runs
/// out of 5: concurrent creators both found no schema, and all but one hit
/// the catalog's unique index (`pg_namespace_nspname_index`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_migrating_at_the_same_moment_all_succeed_once() {
    const REPLICAS: usize = 8;
    let db = TestDb::unmigrated().await;
    let mut conn = PgConnection::connect_with(&db.plain).await.unwrap();
    for round in 0..4 {
        let name = format!("race_{round}");
        let schema = schema(&name);
        let mut pools = Vec::new();
        for _ in 0..REPLICAS {
            pools.push(db.pool_in(&schema, 1).await);
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(REPLICAS));
        let replicas: Vec<_> = pools
            .into_iter()
            .map(|pool| {
                let (barrier, schema) = (barrier.clone(), schema.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    migrate(&pool, &schema).await
                })
            })
            .collect();
        for (i, replica) in replicas.into_iter().enumerate() {
            replica
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}, replica {i}: {e:#}"));
        }
        // Applied once each: one record per migration, the one-row table
        // with one row, the counters with their 16 shards and the pruner's
        // own row.
        let applied: Vec<(i64, bool)> = sqlx::query_as(&format!(
            "SELECT version, success FROM {name}._sqlx_migrations ORDER BY version"
        ))
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let expected: Vec<(i64, bool)> = MIGRATOR.iter().map(|m| (m.version, true)).collect();
        assert_eq!(applied, expected, "round {round}");
        assert_eq!(
            count(
                &mut conn,
                &format!("SELECT count(*) FROM {name}.generator_state")
            )
            .await,
            1
        );
        assert_eq!(
            count(
                &mut conn,
                &format!("SELECT count(*) FROM {name}.task_counts")
            )
            .await,
            17
        );
    }
    // No migration lock is left behind: each migrator's session ended (a
    // closed connection's backend exits a moment after the close).
    let locks = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = \
                 (SELECT oid FROM pg_database WHERE datname = current_database())";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while count(&mut conn, locks).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "advisory locks still held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// River UI's standalone binary, our way: the dashboard started with the
/// host service's `DATABASE_URL` and `LEASEKEEPER_SCHEMA` shows the work the
/// service did through the library in that schema.
#[tokio::test]
async fn the_dashboard_on_a_hosts_database_shows_its_schema() {
    let db = TestDb::unmigrated().await;
    let mut host = PgConnection::connect_with(&db.plain).await.unwrap();
    host_tables(&mut host).await;

    // The host service: the library in schema svc_jobs.
    let svc = schema("svc_jobs");
    let service = db.migrated_in(&svc).await;
    let mut conn = service.pool.acquire().await.unwrap();
    let mut enqueued = Vec::new();
    for order in 1..=3 {
        enqueued.push(
            tasks::enqueue(
                &mut conn,
                &svc,
                &leasekeeper_core::queue::NewTask::new(
                    leasekeeper_core::worker::simulated::KIND,
                    json!({"order": order}),
                )
                .max_attempts(3),
            )
            .await
            .unwrap()
            .id,
        );
    }
    let ttl = Duration::from_secs(60);
    let worker = holder("svc-worker-1");
    let claimed = tasks::claim_next(&mut conn, &svc, &worker, ttl)
        .await
        .unwrap()
        .expect("a task");
    registry::record(
        &mut conn,
        &svc,
        &worker,
        WorkerKind::Http,
        Some("svc-replica-1"),
        &Report {
            state: WorkerState::Working,
            task_id: Some(claimed.id),
            fencing_token: claimed.fencing_token,
            heartbeat: true,
            tasks_done: 0,
            tasks_abandoned: 0,
            fresh: true,
        },
        ttl,
    )
    .await
    .unwrap()
    .expect("the worker's row");
    instance::store::register(&mut conn, &svc, "svc-replica-1", "10.0.0.7:8080")
        .await
        .unwrap();
    leases::acquire(
        &mut conn,
        &svc,
        &resource("singleton:nightly-report"),
        &holder("svc-replica-1"),
        ttl,
    )
    .await
    .unwrap();
    drop(conn);

    // The dashboard, configured as `leasekeeper serve` is.
    let url = db.plain.to_url_lossy().to_string();
    let settings = Settings::resolve(
        None,
        std::path::Path::new("none"),
        &SettingArgs {
            database_url: Some(url),
            schema: Some("svc_jobs".into()),
            ..SettingArgs::default()
        },
    )
    .unwrap();
    let dashboard = Database::open(
        settings.database_url.as_ref().map(|u| u.expose()),
        &settings.data_dir,
        &settings.schema,
    )
    .await
    .expect("opening the host's database");
    assert!(dashboard.embedded.is_none());
    let api = Api::over(
        TestDb {
            options: service.options.clone(),
            pool: dashboard.pool,
            plain: db.plain.clone(),
        },
        settings,
        |_| {},
    );

    let ids = |list: &Value, key: &str| -> Vec<Value> {
        list.as_array()
            .unwrap_or_else(|| panic!("not a list: {list}"))
            .iter()
            .map(|item| item[key].clone())
            .collect()
    };
    let (s, listed) = api.get("/api/tasks").await;
    assert_eq!(s, StatusCode::OK, "{listed}");
    let mut listed_ids: Vec<i64> = ids(&listed, "id")
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    listed_ids.sort();
    assert_eq!(listed_ids, enqueued.clone());
    let (_, started) = api.get("/api/tasks/started").await;
    assert_eq!(ids(&started, "processor"), vec![json!("svc-worker-1")]);
    let (s, listed) = api.get("/api/leases").await;
    assert_eq!(s, StatusCode::OK, "{listed}");
    let mut resources = ids(&listed, "resource");
    resources.sort_by_key(|v| v.to_string());
    // A task's claim is its task row, listed with the started tasks above.
    assert_eq!(resources, vec![json!("singleton:nightly-report")]);
    let (s, listed) = api.get("/api/workers").await;
    assert_eq!(s, StatusCode::OK, "{listed}");
    assert_eq!(ids(&listed, "id"), vec![json!("svc-worker-1")]);
    assert_eq!(ids(&listed, "task_id"), vec![json!(claimed.id)]);
    let (s, listed) = api.get("/api/instances").await;
    assert_eq!(s, StatusCode::OK, "{listed}");
    assert_eq!(ids(&listed, "id"), vec![json!("svc-replica-1")]);

    // And the dashboard made nothing of its own anywhere else.
    assert_eq!(
        count(
            &mut host,
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'leasekeeper'"
        )
        .await,
        0
    );
    assert_eq!(
        count(&mut host, "SELECT count(*) FROM public._sqlx_migrations").await,
        1
    );
}

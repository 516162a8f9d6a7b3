//! `/healthz` and `/readyz`: ready only while the database answers and its
//! migrations are exactly this build's; each way of not being ready says why.

use crate::api::Api;
use axum::http::StatusCode;
use leasekeeper_core::db::MIGRATOR;

#[tokio::test]
async fn healthz_answers_while_the_process_runs_even_without_a_database() {
    let api = Api::new().await;
    let (s, body) = api.get("/healthz").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "ok");
    api.db.pool.close().await;
    let (s, _) = api.get("/healthz").await;
    assert_eq!(
        s,
        StatusCode::OK,
        "liveness does not depend on the database"
    );
    not_ready_because(&api, "the database does not answer").await;
}

#[tokio::test]
async fn readyz_says_what_is_wrong_without_the_drivers_words() {
    use leasekeeper::settings::{SettingArgs, Settings};
    use leasekeeper_core::db::testing::TestDb;
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    // Nothing listens on port 1: the driver's error names the address,
    // and the user and database are in the options.
    let options = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(1)
        .username("secret_user_name")
        .password("secret-password")
        .database("secret_database");
    let pool = PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(1))
        .connect_lazy_with(options.clone());
    let db = TestDb {
        options: options.clone(),
        pool,
        plain: options,
    };
    let settings =
        Settings::resolve(None, std::path::Path::new("none"), &SettingArgs::default()).unwrap();
    let api = Api::over(db, settings, |_| {});
    let (s, body) = api.get("/readyz").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let reason = body["reason"].as_str().unwrap();
    assert!(reason.starts_with("the database does not answer"), "{body}");
    for secret in ["127.0.0.1", ":1", "secret", "refused", "error", "io"] {
        assert!(!reason.contains(secret), "{secret} in {reason}");
    }
}

/// `/readyz` answers 503 with a reason containing `why`.
async fn not_ready_because(api: &Api, why: &str) {
    let (s, body) = api.get("/readyz").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["ready"], false, "{body}");
    assert!(body["reason"].as_str().unwrap().contains(why), "{body}");
}

#[tokio::test]
async fn readyz_is_ready_only_with_exactly_this_builds_migrations() {
    let api = Api::new().await;
    let known = MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .count();
    let (s, body) = api.get("/readyz").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert_eq!(body["ready"], true);
    assert_eq!(body["migrations"], known);

    let newest = MIGRATOR.iter().map(|m| m.version).max().unwrap();
    let exec = |sql: String| {
        let pool = api.db.pool.clone();
        async move { sqlx::raw_sql(&sql).execute(&pool).await.unwrap() }
    };
    exec(format!(
        "CREATE TABLE saved_migration AS SELECT * FROM _sqlx_migrations WHERE version = {newest}"
    ))
    .await;
    // A migration failed half-way.
    exec(format!(
        "UPDATE _sqlx_migrations SET success = false WHERE version = {newest}"
    ))
    .await;
    not_ready_because(&api, &format!("migration {newest} failed")).await;

    // A migration of this build not applied (an old database).
    exec(format!(
        "DELETE FROM _sqlx_migrations WHERE version = {newest}"
    ))
    .await;
    not_ready_because(&api, "is not applied").await;

    // Put back as it was: ready again.
    exec("INSERT INTO _sqlx_migrations SELECT * FROM saved_migration".to_string()).await;
    let (s, body) = api.get("/readyz").await;
    assert_eq!(s, StatusCode::OK, "{body}");

    // One applied that this build does not know (a newer build migrated).
    exec(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (99991231000000, 'from the future', true, '\\x00', 0)"
            .to_string(),
    )
    .await;
    not_ready_because(&api, "unknown to this build").await;
}

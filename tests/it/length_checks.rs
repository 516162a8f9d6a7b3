//! The database backs the application's length limits (migration
//! `20261121000008_length_checks`): each new CHECK refuses an over-long
//! value written with raw SQL (check_violation, 23514) and takes one at the
//! limit; the largest bodies the REST API accepts still fit; and the task
//! store cuts a long failure message to the limit rather than have it
//! refused.

use crate::api::Api;
use crate::common::{TestDb, holder};
use axum::http::StatusCode;
use leasekeeper::http::MAX_BODY_BYTES;
use leasekeeper_core::queue::store::{self, MAX_ERROR_CHARS, RetryPolicy};
use serde_json::json;
use std::time::Duration;

/// Runs `sql` and expects `constraint` to refuse it.
async fn refused(db: &TestDb, constraint: &str, sql: &str) {
    let err = sqlx::query(sql)
        .execute(&db.pool)
        .await
        .expect_err(&format!("{constraint} let through: {sql:.120}"));
    let db_err = err
        .as_database_error()
        .unwrap_or_else(|| panic!("{constraint}: not a database error: {err}"));
    assert_eq!(
        db_err.code().as_deref(),
        Some("23514"),
        "{constraint}: {db_err}"
    );
    assert_eq!(db_err.constraint(), Some(constraint), "{db_err}");
}

async fn accepted(db: &TestDb, sql: &str) {
    sqlx::query(sql)
        .execute(&db.pool)
        .await
        .unwrap_or_else(|e| panic!("refused: {sql:.120}: {e}"));
}

#[tokio::test]
async fn every_new_check_refuses_an_over_long_value_and_takes_one_at_the_limit() {
    let db = TestDb::new().await;
    accepted(
        &db,
        "INSERT INTO tasks (id, kind, task_data) VALUES (1, 'sleep', '{}')",
    )
    .await;

    // jsonb: 512 KiB of binary jsonb (a one-string array: 12 bytes of
    // headers and the string). The check sees the value before TOAST
    // compresses it, so a compressible value is no way around it.
    let limit = 524_288 - 12;
    refused(
        &db,
        "tasks_task_data_size",
        &format!(
            "INSERT INTO tasks (kind, task_data) VALUES ('sleep', jsonb_build_array(repeat('x', {})))",
            limit + 1
        ),
    )
    .await;
    accepted(
        &db,
        &format!("INSERT INTO tasks (kind, task_data) VALUES ('sleep', jsonb_build_array(repeat('x', {limit})))"),
    )
    .await;
    refused(
        &db,
        "tasks_task_output_size",
        &format!(
            "UPDATE tasks SET task_output = jsonb_build_array(repeat('x', {})) WHERE id = 1",
            limit + 1
        ),
    )
    .await;
    accepted(
        &db,
        &format!(
            "UPDATE tasks SET task_output = jsonb_build_array(repeat('x', {limit})) WHERE id = 1"
        ),
    )
    .await;

    // Text: characters, not bytes ('é' is two bytes).
    refused(
        &db,
        "tasks_last_error_length",
        &format!(
            "UPDATE tasks SET last_error = repeat('é', {}) WHERE id = 1",
            MAX_ERROR_CHARS + 1
        ),
    )
    .await;
    accepted(
        &db,
        &format!("UPDATE tasks SET last_error = repeat('é', {MAX_ERROR_CHARS}) WHERE id = 1"),
    )
    .await;

    for (constraint, template) in [
        (
            "workers_instance_id_length",
            "INSERT INTO workers (id, instance_id, kind, state) VALUES ('w-{n}', {value}, 'http', 'idle')",
        ),
        (
            "instances_address_length",
            "INSERT INTO instances (id, address) VALUES ('i-{n}', {value})",
        ),
        (
            "generator_state_updated_by_length",
            "UPDATE generator_state SET updated_by = {value} WHERE id",
        ),
    ] {
        for (n, value) in ["repeat('é', 257)", "''"].iter().enumerate() {
            let sql = template
                .replace("{n}", &n.to_string())
                .replace("{value}", value);
            refused(&db, constraint, &sql).await;
        }
        let sql = template
            .replace("{n}", "9")
            .replace("{value}", "repeat('é', 256)");
        accepted(&db, &sql).await;
    }
}

/// The largest body the API takes with the heaviest jsonb per byte of
/// JSON (an array of zeros: 12 bytes each against "0,").
fn zeros_filling(prefix: &str, suffix: &str) -> String {
    let room = MAX_BODY_BYTES - prefix.len() - suffix.len() - 2;
    let zeros = room.div_ceil(2);
    let body = format!("{prefix}[{}0]{suffix}", "0,".repeat(zeros - 1));
    assert!(body.len() <= MAX_BODY_BYTES && body.len() > MAX_BODY_BYTES - 3);
    body
}

#[tokio::test]
async fn the_largest_bodies_the_api_takes_fit_the_checks() {
    let api = Api::new().await;
    let body = zeros_filling(r#"{"task_data":"#, "}");
    let (s, task) = api
        .raw(axum::http::Method::POST, "/api/tasks", body.into())
        .await;
    assert_eq!(s, StatusCode::CREATED, "{task}");
    let (s, claimed) = api.post("/api/tasks/next", json!({"processor": "p"})).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{claimed}");
    let body = zeros_filling(
        &format!(
            r#"{{"processor":"p","fencing_token":{},"task_output":"#,
            claimed["fencing_token"]
        ),
        "}",
    );
    let (s, done) = api
        .raw(
            axum::http::Method::PUT,
            &format!("/api/tasks/{}/complete", task["id"]),
            body.into(),
        )
        .await;
    assert_eq!(s, StatusCode::ACCEPTED, "{:.300}", done.to_string());
    // Measured as the checks saw them, before TOAST compressed them: the
    // heavy case, several times the body.
    let (data, output): (i32, i32) = sqlx::query_as(
        "SELECT pg_column_size(task_data::text::jsonb), pg_column_size(task_output::text::jsonb)
           FROM tasks",
    )
    .fetch_one(&api.db.pool)
    .await
    .unwrap();
    for size in [data, output] {
        assert!(
            size as usize > 5 * MAX_BODY_BYTES,
            "{size} bytes: not the worst case"
        );
    }
}

#[tokio::test]
async fn the_task_store_cuts_a_long_failure_message_to_the_limit() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    store::enqueue(
        &mut conn,
        &Default::default(),
        &leasekeeper_core::queue::NewTask::new(
            leasekeeper_core::worker::simulated::KIND,
            json!({}),
        )
        .max_attempts(3),
    )
    .await
    .unwrap();
    let w = holder("w");
    let task = store::claim_next(&mut conn, &Default::default(), &w, Duration::from_secs(30))
        .await
        .unwrap()
        .expect("a task");
    let long = "é".repeat(3 * MAX_ERROR_CHARS);
    let failed = store::fail(
        &mut conn,
        &Default::default(),
        task.id,
        &w,
        task.fencing_token.unwrap(),
        &long,
        RetryPolicy::default(),
    )
    .await
    .expect("a long message is cut, not refused");
    let kept = failed.last_error.expect("the message");
    assert_eq!(kept.chars().count(), MAX_ERROR_CHARS);
    assert!(kept.starts_with("éé") && kept.ends_with('…'), "{kept:.20}");
}

//! Searching the tasks list: each filter (status, kind, queue, data) and
//! every combination finds exactly the matching tasks, paged newest first
//! with no task skipped or repeated, and oldest first too; a bulk action
//! with the same filter changes exactly the tasks the list shows.

use crate::common::TestDb;
use leasekeeper_core::db::Schema;
use leasekeeper_core::lease::store::Page;
use leasekeeper_core::paging::Cursor;
use leasekeeper_core::queue::control::{self, TaskFilter};
use leasekeeper_core::queue::store;
use leasekeeper_core::queue::{NewTask, Task, TaskSearch, TaskStatus};
use serde_json::{Map, Value, json};

/// 60 tasks: kinds `a`/`b`, queues `q1`/`q2`, data `{"customer": i % 4,
/// "vip": i % 3 == 0, "n": i}`; every fifth cancelled, every seventh
/// failed.
async fn tasks(db: &TestDb) -> Vec<Task> {
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    let mut out = Vec::new();
    for i in 0..60 {
        let task = NewTask::new(
            if i % 2 == 0 { "a" } else { "b" },
            json!({"customer": i % 4, "vip": i % 3 == 0, "n": i}),
        )
        .queue(if i % 5 < 2 { "q1" } else { "q2" });
        let id = store::enqueue(&mut conn, &schema, &task).await.unwrap().id;
        if i % 5 == 0 {
            control::cancel(&mut conn, &schema, id, "test")
                .await
                .unwrap();
        } else if i % 7 == 0 {
            sqlx::query("UPDATE tasks SET status = 'failed', failed_at = now() WHERE id = $1")
                .bind(id)
                .execute(&db.pool)
                .await
                .unwrap();
        }
        out.push(store::get(&mut conn, &schema, id).await.unwrap().unwrap());
    }
    out
}

/// Whether `task` matches `search`, computed here (flat data only).
fn matches(task: &Task, search: &TaskSearch) -> bool {
    search.status.is_none_or(|s| s == task.status)
        && search.kind.as_ref().is_none_or(|k| *k == task.kind)
        && search.queue.as_ref().is_none_or(|q| *q == task.queue)
        && search
            .data
            .as_ref()
            .is_none_or(|d| d.iter().all(|(k, v)| task.task_data.get(k) == Some(v)))
}

fn object(v: Value) -> Option<Map<String, Value>> {
    v.as_object().cloned()
}

/// Every combination of the four filters (each absent or given).
fn searches() -> Vec<TaskSearch> {
    let mut all = Vec::new();
    for status in [None, Some(TaskStatus::Pending), Some(TaskStatus::Cancelled)] {
        for kind in [None, Some("a".to_string())] {
            for queue in [None, Some("q2".to_string())] {
                for data in [
                    None,
                    object(json!({"customer": 1})),
                    object(json!({"customer": 2, "vip": true})),
                    object(json!({"customer": 99})),
                ] {
                    all.push(TaskSearch {
                        status,
                        kind: kind.clone(),
                        queue: queue.clone(),
                        data,
                    });
                }
            }
        }
    }
    all
}

#[tokio::test]
async fn every_combination_of_filters_pages_through_exactly_the_matching_tasks() {
    let db = TestDb::new().await;
    let all = tasks(&db).await;
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    let mut nonempty = 0;
    for search in searches() {
        let mut expected: Vec<i64> = all
            .iter()
            .filter(|t| matches(t, &search))
            .map(|t| t.id)
            .collect();
        expected.reverse();
        if !expected.is_empty() {
            nonempty += 1;
        }
        // Newest first, three at a time, following each page's cursor.
        let mut seen = Vec::new();
        let mut before = None;
        for _ in 0..100 {
            let page = store::list_page(
                &mut conn,
                &schema,
                search.clone(),
                Cursor::new(before, Some(3)),
            )
            .await
            .unwrap();
            assert!(page.items.len() <= 3);
            seen.extend(page.items.iter().map(|t| t.id));
            match page.next {
                Some(next) => before = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, expected, "newest first, {search:?}");
        // Oldest first, four at a time.
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let rows = store::list(
                &mut conn,
                &schema,
                search.clone(),
                Page::new(after, Some(4)),
            )
            .await
            .unwrap();
            let Some(last) = rows.last() else { break };
            after = Some(last.id);
            seen.extend(rows.iter().map(|t| t.id));
        }
        expected.reverse();
        assert_eq!(seen, expected, "oldest first, {search:?}");
    }
    assert!(nonempty >= 20, "the searches find something: {nonempty}");
}

#[tokio::test]
async fn data_is_matched_by_containment_at_any_depth() {
    let db = TestDb::new().await;
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    let nested = NewTask::new(
        "a",
        json!({"customer": {"id": 7, "region": "eu"}, "tags": ["x", "y"]}),
    );
    let id = store::enqueue(&mut conn, &schema, &nested)
        .await
        .unwrap()
        .id;
    store::enqueue(
        &mut conn,
        &schema,
        &NewTask::new("a", json!({"customer": 7})),
    )
    .await
    .unwrap();
    store::enqueue(
        &mut conn,
        &schema,
        &NewTask::new("a", json!([{"customer": 7}])),
    )
    .await
    .unwrap();
    let found = |data: &str| {
        let search = TaskSearch::parse(None, None, None, Some(data)).unwrap();
        let schema = schema.clone();
        let pool = db.pool.clone();
        async move {
            let mut conn = pool.acquire().await.unwrap();
            let page = store::list_page(&mut conn, &schema, search, Cursor::first())
                .await
                .unwrap();
            page.items.iter().map(|t| t.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(found(r#"{"customer": {"id": 7}}"#).await, vec![id]);
    assert_eq!(found(r#"{"tags": ["y"]}"#).await, vec![id]);
    assert_eq!(found(r#"{"tags": ["z"]}"#).await, Vec::<i64>::new());
    assert_eq!(found(r#"{"customer": 7}"#).await, vec![id + 1]);
    // An empty object filters nothing: every task, the array's too.
    assert_eq!(found("{}").await.len(), 3);
}

#[tokio::test]
async fn a_bulk_action_with_a_data_filter_changes_exactly_what_the_list_shows() {
    let db = TestDb::new().await;
    let all = tasks(&db).await;
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    let search = TaskSearch {
        status: Some(TaskStatus::Pending),
        kind: Some("b".into()),
        queue: None,
        data: object(json!({"customer": 1})),
    };
    let shown: Vec<i64> = store::list_page(&mut conn, &schema, search.clone(), Cursor::first())
        .await
        .unwrap()
        .items
        .iter()
        .map(|t| t.id)
        .collect();
    assert!(!shown.is_empty());
    let filter = TaskFilter {
        status: TaskStatus::Pending,
        kind: search.kind.clone(),
        queue: None,
        data: search.data.clone(),
        error_group: None,
    };
    let n = control::cancel_matching(&db.pool, &schema, &filter, "test")
        .await
        .unwrap();
    assert_eq!(n as usize, shown.len());
    let mut cancelled_now: Vec<i64> = sqlx::query_scalar(
        "SELECT (detail->>'task_id')::bigint FROM lease_events
          WHERE kind = 'operator' AND (detail->>'bulk')::bool ORDER BY 1 DESC",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    cancelled_now.dedup();
    assert_eq!(
        cancelled_now, shown,
        "one audit row per task shown, no other"
    );
    // Every other task is as it was.
    for task in all.iter().filter(|t| !shown.contains(&t.id)) {
        let now = store::get(&mut conn, &schema, task.id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(now.status, task.status, "task {}", task.id);
    }
    // A bad filter changes nothing and says why.
    let bad = TaskFilter {
        kind: Some("a\u{0}".into()),
        ..filter
    };
    let err = control::cancel_matching(&db.pool, &schema, &bad, "test")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("kind"), "{err}");
}

/// A search by data is planned with its value every time: no statement
/// with `@>` stays prepared on the connection (a prepared one could switch
/// to a generic plan that reads the whole table; see the plan test in
/// `overview.rs`), while a search by kind alone is prepared as usual.
#[tokio::test]
async fn a_search_by_data_is_never_a_prepared_statement() {
    let db = TestDb::new().await;
    tasks(&db).await;
    let schema = Schema::default();
    let mut conn = db.pool.acquire().await.unwrap();
    for _ in 0..8 {
        let by_data = TaskSearch {
            kind: Some("a".into()),
            data: object(json!({"customer": 2})),
            ..TaskSearch::default()
        };
        let page = store::list_page(&mut conn, &schema, by_data, Cursor::first())
            .await
            .unwrap();
        assert!(!page.items.is_empty());
        let by_kind = TaskSearch {
            kind: Some("a".into()),
            ..TaskSearch::default()
        };
        store::list_page(&mut conn, &schema, by_kind, Cursor::first())
            .await
            .unwrap();
    }
    let prepared: Vec<String> = sqlx::query_scalar(
        "SELECT statement FROM pg_prepared_statements WHERE statement LIKE '%FROM%tasks%kind = $3%'",
    )
    .persistent(false)
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert_eq!(prepared.len(), 1, "{prepared:#?}");
    assert!(!prepared[0].contains("@>"), "{prepared:#?}");
}

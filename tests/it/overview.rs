//! The overview's REST route against a real database (its readings are
//! the library's, tested in `core/tests/it/overview.rs`).

use crate::api::Api;
use serde_json::json;

#[tokio::test]
async fn rest_overview_counts_enqueued_tasks() {
    let api = Api::new().await;
    let (status, before) = api.get("/api/overview").await;
    assert_eq!(status, 200, "{before}");
    assert_eq!(before["counts"]["tasks_pending"], 0);
    for _ in 0..3 {
        let (status, _) = api
            .post(
                "/api/tasks",
                json!({"task_data": {"sleep_duration_seconds": 1}}),
            )
            .await;
        assert_eq!(status, 201);
    }
    let (_, after) = api.get("/api/overview").await;
    assert_eq!(after["counts"]["tasks_pending"], 3);
    assert_eq!(after["answered_by"], "i-test");
    assert!(
        after["split_brain"]["overlaps"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(after["throughput"]["buckets"].as_array().unwrap().len(), 30);
}

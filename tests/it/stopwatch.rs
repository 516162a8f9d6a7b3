//! The failover stopwatch: a kill records what the victim held; each lease
//! is timed until a term with a higher token begins; silent deaths are
//! timed from the old holder's last renewal.

use crate::api::Api;
use crate::common::{TestDb, holder, resource};
use leasekeeper_core::lease::stopwatch::{recent, record_kill};
use leasekeeper_core::lease::store as leases;
use serde_json::json;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

async fn expire(db: &TestDb, name: &str) {
    sqlx::query("UPDATE leases SET expires_at = now() - interval '1 ms' WHERE resource = $1")
        .bind(name)
        .execute(&db.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_kill_is_timed_until_each_of_its_leases_is_taken_over() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    for name in ["job:1", "job:2"] {
        leases::acquire(
            &mut conn,
            &Default::default(),
            &resource(name),
            &holder("w-dead"),
            TTL,
        )
        .await
        .unwrap();
    }
    leases::acquire(
        &mut conn,
        &Default::default(),
        &resource("job:3"),
        &holder("w-alive"),
        TTL,
    )
    .await
    .unwrap();
    let held = record_kill(
        &mut conn,
        &Default::default(),
        "worker",
        "w-dead",
        &["w-dead".to_string()],
    )
    .await
    .unwrap();
    assert_eq!(held, 2, "only the victim's live leases");

    let waiting = recent(&mut conn, &Default::default(), 10).await.unwrap();
    assert_eq!(waiting.len(), 2);
    assert!(
        waiting
            .iter()
            .all(|f| f.cause == "killed" && f.taken_at.is_none() && f.elapsed_ms.is_none())
    );

    tokio::time::sleep(Duration::from_millis(50)).await;
    expire(&db, "job:1").await;
    let taken = leases::acquire(
        &mut conn,
        &Default::default(),
        &resource("job:1"),
        &holder("w-next"),
        TTL,
    )
    .await
    .unwrap();
    let rows = recent(&mut conn, &Default::default(), 10).await.unwrap();
    let one = rows.iter().find(|f| f.resource == "job:1").unwrap();
    assert_eq!(one.new_holder.as_deref(), Some("w-next"));
    assert_eq!(one.new_token, Some(taken.lease().fencing_token));
    assert!(one.new_token > one.old_token);
    assert!(one.elapsed_ms.unwrap() >= 50, "{one:?}");
    assert_eq!(one.rule.as_deref(), Some("ttl"), "it ran out: {one:?}");
    let two = rows.iter().find(|f| f.resource == "job:2").unwrap();
    assert!(
        two.taken_at.is_none(),
        "job:2 was never taken over: {two:?}"
    );
    assert_eq!(two.rule, None, "no rule before a takeover");
    // A takeover the dashboard caused is not counted again as a silent death.
    assert_eq!(rows.iter().filter(|f| f.resource == "job:1").count(), 1);
}

#[tokio::test]
async fn a_silent_death_is_timed_from_the_last_renewal() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    let r = resource("singleton:generator");
    leases::acquire(&mut conn, &Default::default(), &r, &holder("i-a"), TTL)
        .await
        .unwrap();
    leases::renew(
        &mut conn,
        &Default::default(),
        &r,
        &holder("i-a"),
        None,
        Some(TTL),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    expire(&db, "singleton:generator").await;
    leases::acquire(&mut conn, &Default::default(), &r, &holder("i-b"), TTL)
        .await
        .unwrap();
    let rows = recent(&mut conn, &Default::default(), 10).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let f = &rows[0];
    assert_eq!(f.cause, "found_dead");
    assert_eq!(f.old_holder.as_deref(), Some("i-a"));
    assert_eq!(f.new_holder.as_deref(), Some("i-b"));
    assert_eq!((f.old_token, f.new_token), (Some(1), Some(2)));
    assert!(f.elapsed_ms.unwrap() >= 30, "{f:?}");
    assert_eq!(f.rule.as_deref(), Some("ttl"));
}

/// A task's claim an operator released, then taken over, is no silent
/// death; a late one taken over is.
#[tokio::test]
async fn a_released_claim_taken_over_is_not_a_silent_death() {
    use leasekeeper_core::queue::{NewTask, control, store as tasks};
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let task = tasks::enqueue(
            &mut conn,
            &Default::default(),
            &NewTask::new("t", json!({})),
        )
        .await
        .unwrap();
        ids.push(task.id);
    }
    let released = tasks::claim_next(&mut conn, &Default::default(), &holder("w-old"), TTL)
        .await
        .unwrap()
        .unwrap();
    let late = tasks::claim_next(&mut conn, &Default::default(), &holder("w-gone"), TTL)
        .await
        .unwrap()
        .unwrap();
    control::release(&mut conn, &Default::default(), released.id, 1, "ops")
        .await
        .unwrap();
    sqlx::query("UPDATE tasks SET must_heartbeat_before = now() - interval '1 ms' WHERE id = $1")
        .bind(late.id)
        .execute(&mut *conn)
        .await
        .unwrap();
    for who in ["w-new1", "w-new2"] {
        tasks::claim_next(&mut conn, &Default::default(), &holder(who), TTL)
            .await
            .unwrap()
            .unwrap();
    }
    let rows = recent(&mut conn, &Default::default(), 10).await.unwrap();
    let resources: Vec<String> = rows.iter().map(|f| f.resource.clone()).collect();
    assert_eq!(resources, vec![format!("task:{}", late.id)], "{rows:?}");
    assert_eq!(rows[0].cause, "found_dead");
}

#[tokio::test]
async fn killing_a_busy_worker_through_the_api_starts_the_stopwatch() {
    let api = Api::new().await;
    let (_, task) = api
        .post(
            "/api/tasks",
            json!({"task_data": {"sleep_duration_seconds": 30}}),
        )
        .await;
    let (s, worker) = api.post("/api/workers", json!({})).await;
    assert!(s.is_success(), "{worker}");
    let id = worker["id"].as_str().unwrap().to_string();
    // Wait for it to claim the task.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, t) = api.get(&format!("/api/tasks/{}", task["id"])).await;
        if t["processor"] == id.as_str() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never claimed the task"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (s, body) = api
        .post(&format!("/api/workers/{id}/kill"), json!({}))
        .await;
    assert!(s.is_success(), "{body}");
    let mut conn = api.db.pool.acquire().await.unwrap();
    let rows = recent(&mut conn, &Default::default(), 10).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].resource, format!("task:{}", task["id"]));
    assert_eq!(rows[0].subject.as_deref(), Some(id.as_str()));
    api.fleet.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_kill_stays_listed_behind_newer_failovers_until_it_resolves() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    leases::acquire(
        &mut conn,
        &Default::default(),
        &resource("job:77"),
        &holder("w-killed"),
        TTL,
    )
    .await
    .unwrap();
    record_kill(
        &mut conn,
        &Default::default(),
        "worker",
        "w-killed",
        &["w-killed".to_string()],
    )
    .await
    .unwrap();
    // Twelve silent deaths after the kill, each newer than it.
    for i in 0..12 {
        let name = format!("singleton:s{i}");
        leases::acquire(
            &mut conn,
            &Default::default(),
            &resource(&name),
            &holder("i-silent"),
            TTL,
        )
        .await
        .unwrap();
        expire(&db, &name).await;
        leases::acquire(
            &mut conn,
            &Default::default(),
            &resource(&name),
            &holder("i-next"),
            TTL,
        )
        .await
        .unwrap();
    }
    let rows = recent(&mut conn, &Default::default(), 10).await.unwrap();
    assert_eq!(rows.iter().filter(|f| f.cause == "found_dead").count(), 10);
    let kill = rows.iter().find(|f| f.resource == "job:77");
    assert!(
        kill.is_some_and(|k| k.taken_at.is_none() && k.ended.is_none()),
        "the unresolved kill must stay listed: {rows:?}"
    );
    // Ordered newest first, the kill (the oldest) last.
    assert_eq!(rows.last().map(|f| f.resource.as_str()), Some("job:77"));

    // Resolved by a takeover: still listed (for a few minutes), with its time.
    expire(&db, "job:77").await;
    leases::acquire(
        &mut conn,
        &Default::default(),
        &resource("job:77"),
        &holder("w-next"),
        TTL,
    )
    .await
    .unwrap();
    let rows = recent(&mut conn, &Default::default(), 10).await.unwrap();
    let kill = rows.iter().find(|f| f.resource == "job:77").unwrap();
    assert_eq!(kill.new_holder.as_deref(), Some("w-next"));
    assert!(kill.elapsed_ms.is_some() && kill.ended.is_none());
    // Killed an hour ago and resolved long since: no longer kept.
    sqlx::raw_sql(
        "UPDATE failover_kills SET killed_at = killed_at - interval '2 hours';
         UPDATE lease_events SET at = at - interval '2 hours' WHERE resource = 'job:77'",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let rows = recent(&mut conn, &Default::default(), 10).await.unwrap();
    assert!(rows.iter().all(|f| f.resource != "job:77"), "{rows:?}");
}

#[tokio::test]
async fn a_killed_task_that_runs_out_of_attempts_says_it_failed() {
    use leasekeeper_core::queue::{NewTask, TaskStatus, store as tasks};
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    let task = tasks::enqueue(
        &mut conn,
        &Default::default(),
        &NewTask::new(leasekeeper_core::worker::simulated::KIND, json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    let claimed = tasks::claim_next(&mut conn, &Default::default(), &holder("w-killed"), TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, task.id);
    record_kill(
        &mut conn,
        &Default::default(),
        "worker",
        "w-killed",
        &["w-killed".to_string()],
    )
    .await
    .unwrap();
    let name = format!("task:{}", task.id);
    let waiting = recent(&mut conn, &Default::default(), 10).await.unwrap();
    assert_eq!(waiting[0].resource, name);
    assert_eq!(waiting[0].ended, None);
    // Its claim runs out; no claimer takes it (it is out of attempts), and
    // the rescuer's pass fails it.
    sqlx::query("UPDATE tasks SET must_heartbeat_before = now() - interval '1 ms' WHERE id = $1")
        .bind(task.id)
        .execute(&mut *conn)
        .await
        .unwrap();
    assert!(
        tasks::claim_next(&mut conn, &Default::default(), &holder("w-next"), TTL)
            .await
            .unwrap()
            .is_none()
    );
    let me = holder("maintainer");
    let lease = leases::acquire(
        &mut conn,
        &Default::default(),
        &resource(leasekeeper_core::maintenance::RESOURCE),
        &me,
        TTL,
    )
    .await
    .unwrap()
    .into_lease();
    let fence = leasekeeper_core::queue::rescuer::Fence {
        resource: leasekeeper_core::maintenance::RESOURCE,
        holder: &me,
        token: lease.fencing_token,
    };
    let rescued = leasekeeper_core::queue::rescuer::rescue_once(&db.pool, fence, 10, || true)
        .await
        .unwrap();
    assert_eq!(rescued.failed, 1);
    assert_eq!(
        tasks::get(&mut conn, &Default::default(), task.id)
            .await
            .unwrap()
            .unwrap()
            .status,
        TaskStatus::Failed
    );
    let rows = recent(&mut conn, &Default::default(), 10).await.unwrap();
    let row = rows.iter().find(|f| f.resource == name).unwrap();
    assert_eq!(row.ended.as_deref(), Some("task failed"), "{row:?}");
    assert!(row.taken_at.is_none());
}

//! Schedules against a real database: ticks fired once each, with their
//! task, holder and token; the fenced firing refused for a stale term and
//! raced against a takeover for real; the catch-up policies; pause and
//! resume; a leader killed mid-run; declarations from many replicas at once.

use crate::common::{TestDb, holder, resource, until};
use leasekeeper_core::db::Schema;
use leasekeeper_core::lease::client::LeaseTiming;
use leasekeeper_core::lease::store as leases;
use leasekeeper_core::schedule::runtime::{Scheduler, SchedulerConfig};
use leasekeeper_core::schedule::store::{self, FirePolicy, Fired};
use leasekeeper_core::schedule::{CatchUp, NewSchedule, RESOURCE};
use sqlx::{Connection, PgPool};
use std::time::Duration;

fn every_second(name: &str, catch_up: CatchUp) -> NewSchedule {
    NewSchedule::new(name, "* * * * * *", "tick").catch_up(catch_up)
}

fn fast() -> SchedulerConfig {
    SchedulerConfig {
        timing: LeaseTiming {
            ttl: Duration::from_millis(1500),
            renew_interval: Duration::from_millis(400),
            safety_margin: Duration::from_millis(150),
        },
        retry: Duration::from_millis(200),
        poll: Duration::from_millis(200),
        ..SchedulerConfig::from_ttl(Duration::from_millis(1500))
    }
}

const POLICY: FirePolicy = FirePolicy {
    cap: 100,
    on_time: Duration::from_secs(5),
};

/// Every tick of `schedule`: (tick_at, task_id, holder, token), by tick.
async fn ticks(
    pool: &PgPool,
    schedule: &str,
) -> Vec<(chrono::DateTime<chrono::Utc>, i64, String, i64)> {
    sqlx::query_as(
        "SELECT tick_at, task_id, holder, fencing_token FROM schedule_ticks
          WHERE schedule = $1 ORDER BY tick_at",
    )
    .bind(schedule)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The ticks are whole seconds one after another: none missing, none twice
/// (the table's unique key says none twice; this says none missing too).
fn assert_consecutive(ticks: &[(chrono::DateTime<chrono::Utc>, i64, String, i64)]) {
    for w in ticks.windows(2) {
        assert_eq!((w[1].0 - w[0].0).num_milliseconds(), 1000, "{ticks:?}");
        assert!(w[1].3 >= w[0].3, "tokens never go backwards: {ticks:?}");
    }
}

/// Takes `singleton:scheduler` for `who` directly; answers the token.
async fn lead(pool: &PgPool, who: &str) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    leases::acquire(
        &mut conn,
        &Schema::default(),
        &resource(RESOURCE),
        &holder(who),
        Duration::from_secs(30),
    )
    .await
    .unwrap()
    .lease()
    .fencing_token
}

/// Moves the schedule's cursor back: as if nobody had led for `secs`.
async fn nobody_led_for(pool: &PgPool, name: &str, secs: i64) {
    sqlx::query(
        "UPDATE schedules SET fire_after = date_trunc('second', now()) - make_interval(secs => $2) - interval '1 millisecond',
                              last_tick_at = NULL WHERE name = $1",
    )
    .bind(name)
    .bind(secs as f64)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tick_fires_once_with_its_task_holder_and_token() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let schema = Schema::default();
    let (s, created) = store::upsert(
        &mut pool.acquire().await.unwrap(),
        &schema,
        &every_second("beat", CatchUp::All).data(serde_json::json!({"x": 1})),
        "test",
    )
    .await
    .unwrap();
    assert!(created);
    assert_eq!(s.cron_text, "Every second (UTC)");
    let scheduler = Scheduler::spawn(pool.clone(), holder("rep-a"), fast());
    until("three ticks", Duration::from_secs(10), || async {
        ticks(pool, "beat").await.len() >= 3
    })
    .await;
    scheduler.shutdown().await;
    let fired = ticks(pool, "beat").await;
    assert_consecutive(&fired);
    for (tick_at, task_id, who, token) in &fired {
        assert_eq!(who, "rep-a");
        let (schedule, at, kind, data, fencing): (
            Option<String>,
            Option<chrono::DateTime<chrono::Utc>>,
            String,
            serde_json::Value,
            i64,
        ) = sqlx::query_as(
            "SELECT t.schedule, t.tick_at, t.kind, t.task_data, l.fencing_token
                   FROM tasks t, leases l WHERE t.id = $1 AND l.resource = 'singleton:scheduler'",
        )
        .bind(task_id)
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!(schedule.as_deref(), Some("beat"));
        assert_eq!(at, Some(*tick_at));
        assert_eq!((kind.as_str(), data), ("tick", serde_json::json!({"x": 1})));
        assert_eq!(*token, fencing);
    }
    // The schedule says where it is.
    let s = store::get(&mut pool.acquire().await.unwrap(), &schema, "beat")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(s.last_tick_at, fired.last().map(|t| t.0));
    assert!(s.next_tick_at > s.last_tick_at);
    assert_eq!(s.leader, None, "released at shutdown");
}

#[tokio::test]
async fn a_stale_term_fires_nothing_and_the_refusal_is_recorded() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let schema = Schema::default();
    let mut conn = pool.acquire().await.unwrap();
    store::upsert(&mut conn, &schema, &every_second("s", CatchUp::All), "test")
        .await
        .unwrap();
    nobody_led_for(pool, "s", 3).await;
    let token = lead(pool, "rep-a").await;
    // Not the holder, and the holder with an old token: refused.
    for (who, t) in [("rep-b", token), ("rep-a", token - 1)] {
        let fired = store::fire(&mut conn, &schema, &holder(who), t, "s", POLICY)
            .await
            .unwrap();
        assert_eq!(fired, Fired::Refused);
    }
    assert!(ticks(pool, "s").await.is_empty());
    let refused: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM lease_events WHERE resource = $1 AND kind = 'stale_write_refused'
            AND detail->>'op' = 'schedule_tick'",
    )
    .bind(RESOURCE)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(refused, 2);
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(tasks, 0);
    // The holder with its token fires the missed ticks, once.
    let Fired::Ticks {
        ticks: fired,
        skipped,
    } = store::fire(&mut conn, &schema, &holder("rep-a"), token, "s", POLICY)
        .await
        .unwrap()
    else {
        panic!("the holder fires");
    };
    assert_eq!(skipped, 0);
    assert!(fired.len() >= 3, "{fired:?}");
    assert!(
        fired
            .iter()
            .all(|t| t.holder == "rep-a" && t.fencing_token == token)
    );
    let again = store::fire(&mut conn, &schema, &holder("rep-a"), token, "s", POLICY)
        .await
        .unwrap();
    assert!(
        matches!(&again, Fired::Nothing)
            || matches!(&again, Fired::Ticks { ticks, .. }
                if ticks.len() <= 1 && ticks.iter().all(|t| t.tick_at > fired.last().unwrap().tick_at)),
        "no tick twice: {again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_raced_with_a_takeover_waits_then_is_refused() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let schema = Schema::default();
    store::upsert(
        &mut pool.acquire().await.unwrap(),
        &schema,
        &every_second("r", CatchUp::All),
        "test",
    )
    .await
    .unwrap();
    nobody_led_for(pool, "r", 2).await;
    let token = lead(pool, "old").await;
    // A takeover in flight: the lease row is updated (to a new holder and
    // term) in a transaction that has not committed yet.
    let mut takeover = pool.acquire().await.unwrap();
    let mut tx = takeover.begin().await.unwrap();
    sqlx::query(
        "UPDATE leases SET holder = 'new', fencing_token = fencing_token + 1,
                acquired_at = now(), expires_at = now() + interval '30 seconds'
          WHERE resource = $1",
    )
    .bind(RESOURCE)
    .execute(&mut *tx)
    .await
    .unwrap();
    // The old holder fires: its fenced check waits for the takeover's row.
    let firing = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            store::fire(
                &mut conn,
                &Schema::default(),
                &holder("old"),
                token,
                "r",
                POLICY,
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!firing.is_finished(), "the firing waits for the takeover");
    tx.commit().await.unwrap();
    let fired = firing.await.unwrap().unwrap();
    assert_eq!(
        fired,
        Fired::Refused,
        "the takeover committed first: refused"
    );
    assert!(ticks(pool, "r").await.is_empty());
}

#[tokio::test]
async fn catch_up_policies_all_capped_latest_and_none() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let schema = Schema::default();
    let mut conn = pool.acquire().await.unwrap();
    for (name, policy) in [
        ("all", CatchUp::All),
        ("capped", CatchUp::All),
        ("latest", CatchUp::Latest),
        ("none", CatchUp::None),
        ("none-late", CatchUp::None),
    ] {
        store::upsert(&mut conn, &schema, &every_second(name, policy), "test")
            .await
            .unwrap();
        nobody_led_for(pool, name, 10).await;
    }
    let token = lead(pool, "rep").await;
    let me = holder("rep");
    let fire = |name: &'static str, policy: FirePolicy| {
        let pool = pool.clone();
        let me = me.clone();
        async move {
            let mut conn = pool.acquire().await.unwrap();
            match store::fire(&mut conn, &Schema::default(), &me, token, name, policy)
                .await
                .unwrap()
            {
                Fired::Ticks { ticks, skipped } => (ticks, skipped),
                Fired::Nothing => (Vec::new(), 0),
                Fired::Refused => panic!("refused"),
            }
        }
    };
    let (all, skipped) = fire("all", POLICY).await;
    assert!((10..=12).contains(&all.len()), "{}", all.len());
    assert_eq!(skipped, 0);
    assert!(all[..all.len() - 1].iter().all(|t| t.caught_up));
    let (capped, skipped) = fire("capped", FirePolicy { cap: 3, ..POLICY }).await;
    assert_eq!(capped.len(), 3);
    assert!(skipped >= 7, "{skipped}");
    let (latest, skipped) = fire("latest", POLICY).await;
    assert_eq!(latest.len(), 1);
    assert!(skipped >= 9, "{skipped}");
    assert!(!latest[0].caught_up, "the newest tick is on time");
    // None: the newest tick is less than a second late, on time: fired.
    let (none, _) = fire("none", POLICY).await;
    assert_eq!(none.len(), 1);
    // None with a zero on-time bound: every due tick is late; none fires.
    let (late, skipped) = fire(
        "none-late",
        FirePolicy {
            on_time: Duration::ZERO,
            ..POLICY
        },
    )
    .await;
    assert!(late.is_empty());
    assert!(skipped >= 10, "{skipped}");
    // Whatever the policy, the cursor moved: the skipped ticks never fire.
    for name in ["capped", "latest", "none-late"] {
        let (again, _) = fire(name, POLICY).await;
        assert!(again.len() <= 1, "{name}: {again:?}");
        let s = store::get(&mut conn, &schema, name).await.unwrap().unwrap();
        assert!(s.last_tick_at.is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_schedule_fires_nothing_and_does_not_catch_up_on_resume() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let schema = Schema::default();
    let mut conn = pool.acquire().await.unwrap();
    store::upsert(&mut conn, &schema, &every_second("p", CatchUp::All), "test")
        .await
        .unwrap();
    let paused = store::set_paused(&mut conn, &schema, "p", true, "ops")
        .await
        .unwrap();
    assert!(paused.paused);
    assert_eq!(paused.next_tick_at, None);
    let token = lead(pool, "rep").await;
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(
        store::fire(&mut conn, &schema, &holder("rep"), token, "p", POLICY)
            .await
            .unwrap(),
        Fired::Nothing
    );
    let resumed = store::set_paused(&mut conn, &schema, "p", false, "ops")
        .await
        .unwrap();
    assert!(!resumed.paused);
    let resumed_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT fire_after FROM schedules WHERE name = 'p'")
            .fetch_one(pool)
            .await
            .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let Fired::Ticks { ticks: fired, .. } =
        store::fire(&mut conn, &schema, &holder("rep"), token, "p", POLICY)
            .await
            .unwrap()
    else {
        panic!("a tick after the resume fires");
    };
    assert!(
        fired.iter().all(|t| t.tick_at > resumed_at),
        "nothing of the paused time: {fired:?}"
    );
    // Unknown names.
    assert!(matches!(
        store::set_paused(&mut conn, &schema, "nope", true, "ops").await,
        Err(store::ScheduleError::NotFound(_))
    ));
    // The actions are audited.
    let actions: Vec<String> = sqlx::query_scalar(
        "SELECT detail->>'action' FROM lease_events WHERE resource = 'schedule:p' ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        actions,
        ["schedule_create", "schedule_pause", "schedule_resume"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_run_loses_no_tick_and_doubles_none() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    store::upsert(
        &mut pool.acquire().await.unwrap(),
        &Schema::default(),
        &every_second("k", CatchUp::All),
        "test",
    )
    .await
    .unwrap();
    let a = Scheduler::spawn(pool.clone(), holder("rep-a"), fast());
    until("a leads", Duration::from_secs(5), || async {
        a.singleton().token().is_some()
    })
    .await;
    let b = Scheduler::spawn(pool.clone(), holder("rep-b"), fast());
    until("two ticks", Duration::from_secs(10), || async {
        ticks(pool, "k").await.len() >= 2
    })
    .await;
    a.abort();
    // b takes over after a's lease ran out and fires the gap.
    until("b fires", Duration::from_secs(15), || async {
        ticks(pool, "k")
            .await
            .iter()
            .filter(|t| t.2 == "rep-b")
            .count()
            >= 2
    })
    .await;
    b.shutdown().await;
    let fired = ticks(pool, "k").await;
    assert_consecutive(&fired);
    assert!(fired.iter().any(|t| t.2 == "rep-a"));
    let first_b = fired.iter().position(|t| t.2 == "rep-b").unwrap();
    assert!(
        fired[first_b..].iter().all(|t| t.2 == "rep-b"),
        "terms do not interleave: {fired:?}"
    );
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE schedule = 'k'")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(tasks as usize, fired.len(), "one task per tick");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_replicas_declaring_at_once_make_one_schedule_and_keep_a_pause() {
    let db = TestDb::with_connections(20).await;
    let declare = || {
        let pool = db.pool.clone();
        tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            store::upsert(
                &mut conn,
                &Schema::default(),
                &NewSchedule::new("n", "0 2 * * *", "report"),
                "rep",
            )
            .await
            .unwrap()
            .1
        })
    };
    let created: Vec<bool> = futures::future::join_all((0..16).map(|_| declare()))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(created.iter().filter(|c| **c).count(), 1);
    let mut conn = db.pool.acquire().await.unwrap();
    store::set_paused(&mut conn, &Schema::default(), "n", true, "ops")
        .await
        .unwrap();
    assert!(!declare().await.unwrap(), "declared again at a restart");
    let s = store::get(&mut conn, &Schema::default(), "n")
        .await
        .unwrap()
        .unwrap();
    assert!(s.paused, "a restart keeps the operator's pause");
    // Bad declarations name the field and store nothing.
    for (bad, field) in [
        (NewSchedule::new("x", "61 * * * *", "k"), "cron"),
        (
            NewSchedule::new("x", "0 2 * * *", "k").time_zone("Mars/Base"),
            "time_zone",
        ),
        (NewSchedule::new("bad name", "0 2 * * *", "k"), "name"),
        (NewSchedule::new("x", "0 2 * * *", ""), "kind"),
    ] {
        let e = store::upsert(&mut conn, &Schema::default(), &bad, "ops")
            .await
            .unwrap_err();
        assert!(
            matches!(&e, store::ScheduleError::BadInput { field: f, .. } if *f == field),
            "{e:?}"
        );
    }
    assert!(
        store::get(&mut conn, &Schema::default(), "x")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_mid_tick_leaves_nothing_half_done_and_the_next_fires_it_once() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let schema = Schema::default();
    store::upsert(
        &mut pool.acquire().await.unwrap(),
        &schema,
        &every_second("m", CatchUp::All),
        "test",
    )
    .await
    .unwrap();
    nobody_led_for(pool, "m", 3).await;
    let old = lead(pool, "old").await;
    // Hold the schedule's row so the old leader's firing stops half-way:
    // fenced (the lease row locked) but not yet inserted.
    let mut blocker = pool.acquire().await.unwrap();
    let mut hold = blocker.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM schedules WHERE name = 'm' FOR UPDATE")
        .execute(&mut *hold)
        .await
        .unwrap();
    let firing = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            store::fire(
                &mut conn,
                &Schema::default(),
                &holder("old"),
                old,
                "m",
                POLICY,
            )
            .await
        })
    };
    until("the firing waits on the row", Duration::from_secs(5), || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        waiting > 0
    })
    .await;
    // The old leader dies mid-tick (its process gone: the task dropped,
    // its connection closed, its transaction rolled back).
    firing.abort();
    let _ = firing.await;
    hold.rollback().await.unwrap();
    // Its lease runs out; a new leader takes over.
    sqlx::query("UPDATE leases SET expires_at = now() WHERE resource = $1")
        .bind(RESOURCE)
        .execute(pool)
        .await
        .unwrap();
    let new = lead(pool, "new").await;
    assert_eq!(new, old + 1);
    let mut conn = pool.acquire().await.unwrap();
    let Fired::Ticks { ticks: fired, .. } =
        store::fire(&mut conn, &schema, &holder("new"), new, "m", POLICY)
            .await
            .unwrap()
    else {
        panic!("the new leader fires the missed ticks");
    };
    assert!(fired.len() >= 3, "{fired:?}");
    let all = ticks(pool, "m").await;
    assert_consecutive(&all);
    assert!(
        all.iter().all(|t| t.2 == "new"),
        "nothing of the dead leader's: {all:?}"
    );
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE schedule = 'm'")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(
        tasks as usize,
        all.len(),
        "one task per tick, none orphaned"
    );
}

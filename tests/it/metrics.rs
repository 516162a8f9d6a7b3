//! `GET /metrics`: Prometheus text with the task gauge read from the
//! database and the library's counters and histograms moving with what
//! happens. The recorder is global to the test process, and other tests
//! run meanwhile, so counters are checked to rise by at least what this
//! test did; everything is in one test so that no two scrapes race to set
//! the gauge.

use crate::api::Api;
use axum::http::StatusCode;
use http_body_util::BodyExt;
use leasekeeper_core::lease::store as leases;
use leasekeeper_core::queue::{NewTask, store as tasks};
use serde_json::json;
use std::time::Duration;

/// The value of the sample `series` (a name with its labels, exactly as
/// rendered), or `None` when absent.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

async fn scrape(api: &Api) -> String {
    let res = api.open("/metrics").await;
    assert_eq!(res.status(), StatusCode::OK);
    let ctype = res.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test]
async fn metrics_show_task_counts_and_count_claims_takeovers_refusals_and_renewals() {
    let api = Api::new().await;
    let before = scrape(&api).await;
    let count = |text: &str, series: &str| sample(text, series).unwrap_or(0.0);
    let mut conn = api.db.pool.acquire().await.unwrap();
    let holder = |n: &str| leasekeeper_core::lease::Holder::parse(n).unwrap();
    let resource = |n: &str| leasekeeper_core::lease::Resource::parse(n).unwrap();
    for i in 0..5 {
        tasks::enqueue(
            &mut conn,
            &Default::default(),
            &NewTask::new("sleep", json!({ "i": i })),
        )
        .await
        .unwrap();
    }
    // Three claims; one runs out and is taken over; its old holder's
    // completion is refused.
    let short = Duration::from_millis(150);
    let first = tasks::claim_next(&mut conn, &Default::default(), &holder("m-a"), short)
        .await
        .unwrap()
        .unwrap();
    for _ in 0..2 {
        tasks::claim_next(
            &mut conn,
            &Default::default(),
            &holder("m-b"),
            Duration::from_secs(60),
        )
        .await
        .unwrap()
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let taken = tasks::claim_next(
        &mut conn,
        &Default::default(),
        &holder("m-c"),
        Duration::from_secs(60),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(taken.id, first.id, "the late task first");
    let stale = tasks::complete(
        &mut conn,
        &Default::default(),
        first.id,
        &holder("m-a"),
        first.fencing_token.unwrap(),
        None,
    )
    .await;
    assert!(stale.is_err());
    // A lease renewed twice; another runs out and is taken over.
    leases::acquire(
        &mut conn,
        &Default::default(),
        &resource("m-lease"),
        &holder("m-a"),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    for _ in 0..2 {
        leases::renew(
            &mut conn,
            &Default::default(),
            &resource("m-lease"),
            &holder("m-a"),
            None,
            None,
        )
        .await
        .unwrap();
    }
    leases::acquire(
        &mut conn,
        &Default::default(),
        &resource("m-single"),
        &holder("m-a"),
        short,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    leases::acquire(
        &mut conn,
        &Default::default(),
        &resource("m-single"),
        &holder("m-b"),
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    // A schedule whose leader fires three missed ticks at once (two of
    // them caught up).
    let ticked = {
        use leasekeeper_core::schedule::store::{FirePolicy, Fired, fire, upsert};
        use leasekeeper_core::schedule::{CatchUp, NewSchedule, RESOURCE};
        upsert(
            &mut conn,
            &Default::default(),
            &NewSchedule::new("m-sched", "* * * * * *", "tick").catch_up(CatchUp::All),
            "test",
        )
        .await
        .unwrap();
        sqlx::query(
            "UPDATE schedules SET fire_after = date_trunc('second', now()) - interval '3 seconds' + interval '1 millisecond'
              WHERE name = 'm-sched'",
        )
        .execute(&api.db.pool)
        .await
        .unwrap();
        let lease = leases::acquire(
            &mut conn,
            &Default::default(),
            &resource(RESOURCE),
            &holder("m-s"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
        let policy = FirePolicy {
            cap: 100,
            on_time: Duration::from_secs(5),
        };
        let fired = fire(
            &mut conn,
            &Default::default(),
            &holder("m-s"),
            lease.lease().fencing_token,
            "m-sched",
            policy,
        )
        .await
        .unwrap();
        match fired {
            Fired::Ticks { ticks, .. } if ticks.len() >= 3 => ticks.len() as f64,
            other => panic!("{other:?}"),
        }
    };

    let after = scrape(&api).await;
    for name in [
        "leasekeeper_claims_total",
        "leasekeeper_takeovers_total",
        "leasekeeper_stale_writes_refused_total",
    ] {
        assert!(after.contains(&format!("# TYPE {name} counter")), "{after}");
    }
    for name in [
        "leasekeeper_lease_renew_seconds",
        "leasekeeper_failover_seconds",
    ] {
        assert!(
            after.contains(&format!("# TYPE {name} histogram")),
            "{after}"
        );
    }
    assert!(after.contains("# TYPE leasekeeper_tasks gauge"), "{after}");
    // This test's database: 5 tasks, 2 started by m-b, 1 by m-c; and the
    // schedule's tasks, pending.
    assert_eq!(
        sample(&after, r#"leasekeeper_tasks{status="pending"}"#),
        Some(2.0 + ticked),
        "{after}"
    );
    assert_eq!(
        sample(&after, r#"leasekeeper_tasks{status="started"}"#),
        Some(3.0),
        "{after}"
    );
    let rose = |series: &str| count(&after, series) - count(&before, series);
    assert!(
        rose(r#"leasekeeper_claims_total{queue="default",kind="sleep"}"#) >= 4.0,
        "{after}"
    );
    assert!(rose("leasekeeper_takeovers_total") >= 2.0, "{after}");
    assert!(
        rose(
            r#"leasekeeper_stale_writes_refused_total{source="task",queue="default",kind="sleep"}"#
        ) >= 1.0,
        "{after}"
    );
    assert!(
        rose("leasekeeper_lease_renew_seconds_count") >= 2.0,
        "{after}"
    );
    assert!(rose("leasekeeper_failover_seconds_count") >= 2.0, "{after}");
    assert!(
        rose(r#"leasekeeper_schedule_ticks_total{schedule="m-sched"}"#) >= 3.0,
        "{after}"
    );
    assert!(
        rose("leasekeeper_schedule_ticks_caught_up_total") >= 2.0,
        "{after}"
    );
    assert!(
        rose("leasekeeper_schedule_lateness_seconds_count") >= 3.0,
        "{after}"
    );
    // Both takeovers came some 300 ms after their holder's last renewal.
    assert!(
        rose(r#"leasekeeper_failover_seconds_bucket{le="2"}"#) >= 2.0,
        "{after}"
    );
    assert!(
        after.contains("leasekeeper_lease_renew_seconds_bucket{le=\"0.001\"}"),
        "{after}"
    );
}

/// The metric names an alert rule of `docs/alerts/leasekeeper.rules.yml`
/// uses (without `_bucket`/`_count`/`_sum`), Prometheus' own `up` aside.
fn names_in_alert_rules() -> std::collections::BTreeSet<String> {
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/alerts/leasekeeper.rules.yml"
    ))
    .expect("the alert rules file");
    let mut names = std::collections::BTreeSet::new();
    for (at, _) in rules.match_indices("leasekeeper_") {
        let name: String = rules[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        let name = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name)
            .to_string();
        if name != "leasekeeper_" && !name.ends_with('_') {
            names.insert(name);
        }
    }
    names
}

/// A fresh `leasekeeper serve` process (its own metrics recorder), scraped
/// once at once: every family is there from the first scrape, counters at
/// 0 for the label values the instance knows (its fleet's queue and kind;
/// the singleton and `assert_fence` refusals; every table the pruner
/// prunes), histograms with zero counts, so `rate()` and `absent()` alerts
/// do not misfire after a restart; and every metric the example alert
/// rules use is among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_instance_exports_every_family_from_its_first_scrape() {
    let db = crate::common::TestDb::new().await;
    // One queue in use, for the per-queue gauges.
    tasks::enqueue(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &NewTask::new("sleep", json!({ "sleep_duration_seconds": 1 })),
    )
    .await
    .unwrap();
    let server = crate::common::Served::start(&db, &[]).await;
    let res = reqwest::get(format!("{}/metrics", server.base))
        .await
        .unwrap();
    assert!(res.status().is_success(), "/metrics: {}", res.status());
    let text = res.text().await.unwrap();
    drop(server);

    for (family, kind) in [
        ("leasekeeper_tasks", "gauge"),
        ("leasekeeper_claims_total", "counter"),
        ("leasekeeper_completions_total", "counter"),
        ("leasekeeper_failures_total", "counter"),
        ("leasekeeper_takeovers_total", "counter"),
        ("leasekeeper_stale_writes_refused_total", "counter"),
        ("leasekeeper_pruned_rows_total", "counter"),
        ("leasekeeper_schedule_ticks_caught_up_total", "counter"),
        ("leasekeeper_lease_renew_seconds", "histogram"),
        ("leasekeeper_failover_seconds", "histogram"),
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} {kind}")),
            "{family} ({kind}) missing from the first scrape:\n{text}"
        );
    }
    for series in [
        r#"leasekeeper_claims_total{queue="default",kind="sleep"} 0"#,
        r#"leasekeeper_completions_total{queue="default",kind="sleep"} 0"#,
        r#"leasekeeper_failures_total{queue="default",kind="sleep"} 0"#,
        r#"leasekeeper_stale_writes_refused_total{source="task",queue="default",kind="sleep"} 0"#,
        r#"leasekeeper_stale_writes_refused_total{source="singleton"} 0"#,
        r#"leasekeeper_stale_writes_refused_total{source="assert_fence"} 0"#,
        r#"leasekeeper_pruned_rows_total{table="tasks"} 0"#,
        r#"leasekeeper_failover_seconds_count 0"#,
        r#"leasekeeper_lease_renew_seconds_count 0"#,
        r#"leasekeeper_tasks{status="pending"} 1"#,
    ] {
        assert!(
            text.lines().any(|l| l == series),
            "{series} missing from the first scrape:\n{text}"
        );
    }
    // The bucket the failover alert reads exists by that name.
    assert!(
        text.contains(r#"leasekeeper_failover_seconds_bucket{le="21"} 0"#),
        "{text}"
    );
    let rules = names_in_alert_rules();
    assert!(rules.len() >= 4, "{rules:?}");
    for name in rules {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "the alert rules use {name}, which a fresh instance does not export:\n{text}"
        );
    }
}

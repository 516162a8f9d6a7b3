//! The lease store against a real database: the documented semantics of
//! acquire, renew, release, delete and the lists, and the history trigger.

use crate::common::{TestDb, event_kinds, holder, resource};
use leasekeeper_core::lease::LeaseFilter;
use leasekeeper_core::lease::LeaseState;
use leasekeeper_core::lease::store::{self, Acquired, LeaseError, Page};
use leasekeeper_core::paging::Cursor;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

/// Makes the lease on `name` expire now, as if its holder stopped renewing
/// long ago (only the database clock counts, so this is the honest way).
async fn expire(db: &TestDb, name: &str) {
    sqlx::query(
        "UPDATE leases SET expires_at = now() - interval '1 millisecond' WHERE resource = $1",
    )
    .bind(name)
    .execute(&db.pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn acquire_is_exclusive_and_idempotent_for_the_holder() {
    let db = TestDb::new().await;
    let r = resource("r1");
    let first = store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("a"),
        TTL,
    )
    .await
    .unwrap();
    let Acquired::New(lease) = first else {
        panic!("expected a new term, got {first:?}")
    };
    assert_eq!(lease.fencing_token, 1);
    assert_eq!(lease.state, LeaseState::Active);
    assert!(
        lease.expires_in_ms > 29_000 && lease.expires_in_ms <= 30_000,
        "{}",
        lease.expires_in_ms
    );

    let again = store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("a"),
        TTL,
    )
    .await
    .unwrap();
    assert!(
        matches!(&again, Acquired::AlreadyHeld(l) if l.fencing_token == 1),
        "{again:?}"
    );

    let other = store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("b"),
        TTL,
    )
    .await;
    assert!(
        matches!(&other, Err(LeaseError::Held { holder, .. }) if holder == "a"),
        "{other:?}"
    );
    assert_eq!(event_kinds(&db.pool, "r1").await, ["acquired"]);
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_with_the_next_token() {
    let db = TestDb::new().await;
    let r = resource("r1");
    store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("a"),
        TTL,
    )
    .await
    .unwrap();
    expire(&db, "r1").await;
    let taken = store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("b"),
        TTL,
    )
    .await
    .unwrap();
    let Acquired::New(lease) = taken else {
        panic!("expected takeover, got {taken:?}")
    };
    assert_eq!(lease.holder.as_deref(), Some("b"));
    assert_eq!(lease.fencing_token, 2);
    let history = store::history(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        "r1",
        10,
    )
    .await
    .unwrap();
    assert_eq!(history[0].kind, "taken_over");
    assert_eq!(history[0].previous_holder.as_deref(), Some("a"));
    assert_eq!(history[0].fencing_token, Some(2));
}

#[tokio::test]
async fn a_stale_holder_can_neither_renew_nor_release() {
    let db = TestDb::new().await;
    let r = resource("r1");
    store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("a"),
        TTL,
    )
    .await
    .unwrap();
    expire(&db, "r1").await;
    // Expired but not yet taken over: still no renewal, it must re-acquire.
    let renew = store::renew(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("a"),
        None,
        None,
    )
    .await;
    assert!(matches!(renew, Err(LeaseError::NotFound(_))), "{renew:?}");
    store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("b"),
        TTL,
    )
    .await
    .unwrap();
    let before = store::get_by_resource(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
    )
    .await
    .unwrap()
    .unwrap();

    let renew = store::renew(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("a"),
        None,
        None,
    )
    .await;
    assert!(matches!(renew, Err(LeaseError::NotFound(_))), "{renew:?}");
    let release = store::release(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("a"),
        None,
    )
    .await;
    assert!(
        matches!(release, Err(LeaseError::NotFound(_))),
        "{release:?}"
    );
    // The new holder renewing with the old term's token is refused too.
    let renew = store::renew(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("b"),
        Some(1),
        None,
    )
    .await;
    assert!(matches!(renew, Err(LeaseError::NotFound(_))), "{renew:?}");

    let after = store::get_by_resource(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(before.holder, after.holder);
    assert_eq!(before.fencing_token, after.fencing_token);
    assert_eq!(before.expires_at, after.expires_at);
    assert_eq!(before.renew_count, after.renew_count);
    assert_eq!(
        event_kinds(&db.pool, "r1").await,
        ["acquired", "taken_over"]
    );
}

#[tokio::test]
async fn renew_extends_and_release_frees_at_once() {
    let db = TestDb::new().await;
    let r = resource("r1");
    let a = holder("a");
    let lease = store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &a,
        Duration::from_secs(2),
    )
    .await
    .unwrap()
    .into_lease();
    let renewed = store::renew(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &a,
        Some(lease.fencing_token),
        Some(TTL),
    )
    .await
    .unwrap();
    assert_eq!(renewed.renew_count, 1);
    assert_eq!(renewed.fencing_token, lease.fencing_token);
    assert!(renewed.expires_at > lease.expires_at);
    assert!(renewed.renewed_at.is_some());

    let released = store::release(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &a,
        None,
    )
    .await
    .unwrap();
    assert_eq!(released.state, LeaseState::Released);
    assert!(released.released_at.is_some());
    // Released means free: another holder gets it immediately, next token.
    let b = store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("b"),
        TTL,
    )
    .await
    .unwrap();
    assert!(
        matches!(&b, Acquired::New(l) if l.fencing_token == 2),
        "{b:?}"
    );
    assert_eq!(
        event_kinds(&db.pool, "r1").await,
        ["acquired", "renewed", "released", "acquired"]
    );
}

#[tokio::test]
async fn fencing_tokens_survive_row_deletion() {
    let db = TestDb::new().await;
    let r = resource("r1");
    for expected in 1..=3 {
        let lease = store::acquire(
            &mut db.pool.acquire().await.unwrap(),
            &Default::default(),
            &r,
            &holder("a"),
            TTL,
        )
        .await
        .unwrap()
        .into_lease();
        assert_eq!(lease.fencing_token, expected);
        let deleted = store::delete(
            &mut db.pool.acquire().await.unwrap(),
            &Default::default(),
            lease.id,
            &r,
            &holder("a"),
            Some(lease.fencing_token),
        )
        .await
        .unwrap();
        assert_eq!(deleted.id, lease.id);
        assert!(
            store::get(
                &mut db.pool.acquire().await.unwrap(),
                &Default::default(),
                lease.id
            )
            .await
            .unwrap()
            .is_none()
        );
    }
    // Even a hand-written DELETE cannot reset the counter.
    let lease = store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("a"),
        TTL,
    )
    .await
    .unwrap()
    .into_lease();
    sqlx::query("DELETE FROM leases")
        .execute(&db.pool)
        .await
        .unwrap();
    let again = store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("b"),
        TTL,
    )
    .await
    .unwrap()
    .into_lease();
    assert_eq!(again.fencing_token, lease.fencing_token + 1);
}

#[tokio::test]
async fn a_token_that_does_not_advance_is_refused_by_the_database() {
    let db = TestDb::new().await;
    let r = resource("r1");
    store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("a"),
        TTL,
    )
    .await
    .unwrap();
    let err =
        sqlx::query("UPDATE leases SET fencing_token = 1, holder = 'x' WHERE resource = 'r1'")
            .execute(&db.pool)
            .await;
    // Same token: not a new term, allowed. Going backwards after a delete is not:
    assert!(err.is_ok());
    sqlx::query("DELETE FROM leases")
        .execute(&db.pool)
        .await
        .unwrap();
    let err = sqlx::query(
        "INSERT INTO leases (resource, holder, expires_at, ttl_ms, fencing_token)
         VALUES ('r1', 'x', now() + interval '1 minute', 60000, 1)",
    )
    .execute(&db.pool)
    .await
    .unwrap_err();
    let code = err
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.to_string());
    assert_eq!(code.as_deref(), Some("40001"), "{err}");
}

#[tokio::test]
async fn delete_needs_the_right_resource_and_holder() {
    let db = TestDb::new().await;
    let r = resource("r1");
    let lease = store::acquire(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &r,
        &holder("a"),
        TTL,
    )
    .await
    .unwrap()
    .into_lease();
    for (res, hold) in [("r1", "b"), ("r2", "a")] {
        let err = store::delete(
            &mut db.pool.acquire().await.unwrap(),
            &Default::default(),
            lease.id,
            &resource(res),
            &holder(hold),
            None,
        )
        .await;
        assert!(matches!(err, Err(LeaseError::NotFound(_))), "{err:?}");
    }
    assert!(
        store::get(
            &mut db.pool.acquire().await.unwrap(),
            &Default::default(),
            lease.id
        )
        .await
        .unwrap()
        .is_some()
    );
}

#[tokio::test]
async fn lists_filter_by_state_and_paginate() {
    let db = TestDb::new().await;
    let a = holder("a");
    for name in ["active", "expired", "renewed", "released"] {
        store::acquire(
            &mut db.pool.acquire().await.unwrap(),
            &Default::default(),
            &resource(name),
            &a,
            TTL,
        )
        .await
        .unwrap();
    }
    expire(&db, "expired").await;
    store::renew(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &resource("renewed"),
        &a,
        None,
        None,
    )
    .await
    .unwrap();
    store::release(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        &resource("released"),
        &a,
        None,
    )
    .await
    .unwrap();

    let names = |leases: Vec<leasekeeper_core::lease::Lease>| -> Vec<String> {
        leases.into_iter().map(|l| l.resource).collect()
    };
    let mut conn = db.pool.acquire().await.unwrap();
    for (filter, expected) in [
        (
            LeaseFilter::All,
            vec!["active", "expired", "renewed", "released"],
        ),
        (LeaseFilter::Active, vec!["active", "renewed"]),
        (LeaseFilter::Expired, vec!["expired"]),
        (LeaseFilter::Renewed, vec!["renewed"]),
        (LeaseFilter::Released, vec!["released"]),
    ] {
        let got = store::list(&mut conn, &Default::default(), filter, Page::default())
            .await
            .unwrap();
        assert_eq!(names(got), expected, "{filter:?}");
    }

    let first = store::list(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        LeaseFilter::All,
        Page::new(None, Some(2)),
    )
    .await
    .unwrap();
    assert_eq!(names(first.clone()), ["active", "expired"]);
    let next = store::list(
        &mut db.pool.acquire().await.unwrap(),
        &Default::default(),
        LeaseFilter::All,
        Page::new(Some(first[1].id), Some(2)),
    )
    .await
    .unwrap();
    assert_eq!(names(next), ["renewed", "released"]);
}

#[tokio::test]
async fn bad_ttls_are_refused_before_the_database() {
    let db = TestDb::new().await;
    for ttl in [Duration::ZERO, store::MAX_TTL + Duration::from_secs(1)] {
        let err = store::acquire(
            &mut db.pool.acquire().await.unwrap(),
            &Default::default(),
            &resource("r"),
            &holder("a"),
            ttl,
        )
        .await;
        assert!(matches!(err, Err(LeaseError::BadTtl)), "{err:?}");
    }
}

#[tokio::test]
async fn the_database_backs_the_name_length_limit() {
    let db = TestDb::new().await;
    let long = "x".repeat(257);
    let err = sqlx::query(
        "INSERT INTO leases (resource, holder, expires_at, ttl_ms, fencing_token) VALUES ($1, 'a', now(), 1, 1)",
    )
    .bind(&long)
    .execute(&db.pool)
    .await
    .unwrap_err();
    let code = err
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.to_string());
    assert_eq!(code.as_deref(), Some("23514"), "{err}");
}

#[tokio::test]
async fn the_dashboard_list_shows_the_newest_leases_past_a_page() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    for i in 0..150 {
        store::acquire(
            &mut conn,
            &Default::default(),
            &resource(&format!("many-{i}")),
            &holder("h"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    }
    let page = store::list_page(
        &mut conn,
        &Default::default(),
        LeaseFilter::All,
        Cursor::first(),
    )
    .await
    .unwrap();
    let newest = page.items;
    assert_eq!(newest.len(), 100);
    assert_eq!(newest[0].resource, "many-149", "newest first");
    assert!(newest.windows(2).all(|w| w[0].id > w[1].id));
    assert!(newest.iter().all(|l| l.resource != "many-0"));
    // The next page goes on below the first, to the oldest, and ends.
    let more = store::list_page(
        &mut conn,
        &Default::default(),
        LeaseFilter::All,
        Cursor::new(page.next, None),
    )
    .await
    .unwrap();
    assert_eq!(more.items.len(), 50);
    assert_eq!(more.items[0].id, newest[99].id - 1);
    assert_eq!(more.items[49].resource, "many-0");
    assert_eq!(more.next, None, "the last page");
    store::release(
        &mut conn,
        &Default::default(),
        &resource("many-149"),
        &holder("h"),
        None,
    )
    .await
    .unwrap();
    let released = store::list_page(
        &mut conn,
        &Default::default(),
        LeaseFilter::Released,
        Cursor::new(None, Some(10)),
    )
    .await
    .unwrap()
    .items;
    assert_eq!(released.len(), 1);
    let active = store::list_page(
        &mut conn,
        &Default::default(),
        LeaseFilter::Active,
        Cursor::new(None, Some(10)),
    )
    .await
    .unwrap()
    .items;
    assert_eq!(active[0].resource, "many-148");
}

#[tokio::test]
async fn delete_with_a_token_ends_only_that_term() {
    let db = TestDb::new().await;
    let r = resource("r1");
    let mut conn = db.pool.acquire().await.unwrap();
    let first = store::acquire(&mut conn, &Default::default(), &r, &holder("a"), TTL)
        .await
        .unwrap()
        .into_lease();
    store::release(&mut conn, &Default::default(), &r, &holder("a"), None)
        .await
        .unwrap();
    let second = store::acquire(&mut conn, &Default::default(), &r, &holder("a"), TTL)
        .await
        .unwrap()
        .into_lease();
    assert_eq!(second.fencing_token, first.fencing_token + 1);
    let stale = store::delete(
        &mut conn,
        &Default::default(),
        second.id,
        &r,
        &holder("a"),
        Some(first.fencing_token),
    )
    .await;
    assert!(matches!(stale, Err(LeaseError::NotFound(_))), "{stale:?}");
    assert!(
        store::get(&mut conn, &Default::default(), second.id)
            .await
            .unwrap()
            .is_some()
    );
    let gone = store::delete(
        &mut conn,
        &Default::default(),
        second.id,
        &r,
        &holder("a"),
        Some(second.fencing_token),
    )
    .await
    .unwrap();
    assert_eq!(gone.fencing_token, second.fencing_token);
}

/// A delete of term N, barrier-started against the same holder beginning
/// term N + 1: whichever wins, term N + 1 is never deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_of_an_old_term_racing_a_new_term_never_deletes_the_new_one() {
    let db = TestDb::new().await;
    let (mut deleted_first, mut refused) = (0, 0);
    for round in 0..30 {
        let r = resource(&format!("race-{round}"));
        let mut conn = db.pool.acquire().await.unwrap();
        let old = store::acquire(&mut conn, &Default::default(), &r, &holder("a"), TTL)
            .await
            .unwrap()
            .into_lease();
        store::release(&mut conn, &Default::default(), &r, &holder("a"), None)
            .await
            .unwrap();
        drop(conn);
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
        let (pool, b, r2) = (db.pool.clone(), barrier.clone(), r.clone());
        let deleter = tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            b.wait().await;
            store::delete(
                &mut conn,
                &Default::default(),
                old.id,
                &r2,
                &holder("a"),
                Some(old.fencing_token),
            )
            .await
        });
        let (pool, b, r2) = (db.pool.clone(), barrier.clone(), r.clone());
        let acquirer = tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            b.wait().await;
            store::acquire(&mut conn, &Default::default(), &r2, &holder("a"), TTL).await
        });
        let deleted = deleter.await.unwrap();
        let new = acquirer.await.unwrap().unwrap().into_lease();
        assert_eq!(new.fencing_token, old.fencing_token + 1);
        match deleted {
            Ok(l) => {
                assert_eq!(l.fencing_token, old.fencing_token, "only the old term");
                deleted_first += 1;
            }
            Err(LeaseError::NotFound(_)) => refused += 1,
            Err(e) => panic!("round {round}: {e}"),
        }
        let now = store::get_by_resource(
            &mut db.pool.acquire().await.unwrap(),
            &Default::default(),
            &r,
        )
        .await
        .unwrap()
        .expect("the new term survives");
        assert_eq!(now.fencing_token, new.fencing_token, "round {round}");
    }
    assert_eq!(deleted_first + refused, 30);
}

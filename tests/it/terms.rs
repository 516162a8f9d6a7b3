//! Checks shared by the in-process and the process-level generator tests
//! (this file is also included by `tests/generator_failover.rs`): the
//! generator's terms never overlap, and neither do the tasks they produced.

use leasekeeper_core::generator::RESOURCE;
use sqlx::PgPool;
use std::collections::BTreeMap;

/// Checks from `lease_events` that no term of the generator lease began
/// before the previous one ended (by release, or by the expiry of its last
/// acquisition or renewal), and returns the holder of each token.
pub async fn assert_terms_do_not_overlap(pool: &PgPool) -> BTreeMap<i64, String> {
    type Row = (
        i64,
        Option<String>,
        String,
        chrono::DateTime<chrono::Utc>,
        chrono::DateTime<chrono::Utc>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT fencing_token, holder, kind, expires_at, at FROM lease_events
          WHERE resource = $1
            AND kind IN ('acquired', 'taken_over', 'renewed', 'released', 'session_ended')
          ORDER BY id",
    )
    .bind(RESOURCE)
    .fetch_all(pool)
    .await
    .unwrap();
    // token -> (holder, start, end)
    let mut terms: BTreeMap<
        i64,
        (
            String,
            chrono::DateTime<chrono::Utc>,
            chrono::DateTime<chrono::Utc>,
            bool,
        ),
    > = BTreeMap::new();
    for (token, holder, kind, expires_at, at) in rows {
        let holder = holder.unwrap_or_default();
        match kind.as_str() {
            "acquired" | "taken_over" => {
                assert!(
                    terms
                        .insert(token, (holder, at, expires_at, false))
                        .is_none(),
                    "token {token} began twice"
                );
            }
            "renewed" => {
                let term = terms.get_mut(&token).expect("renewal of a known term");
                assert!(!term.3, "token {token} renewed after its release");
                term.2 = term.2.max(expires_at);
            }
            // A release, or the end of the holder's liveness session.
            _ => {
                let term = terms.get_mut(&token).expect("release of a known term");
                term.2 = expires_at;
                term.3 = true;
            }
        }
    }
    let list: Vec<_> = terms.iter().collect();
    for pair in list.windows(2) {
        let (t0, (h0, _, end0, _)) = pair[0];
        let (t1, (h1, start1, _, _)) = pair[1];
        assert!(
            start1 >= end0,
            "term {t1} ({h1}) began at {start1} before term {t0} ({h0}) ended at {end0}"
        );
    }
    terms.into_iter().map(|(t, (h, ..))| (t, h)).collect()
}

/// Checks that the tasks' terms never interleave: by id, tokens never go
/// down, and each task names the holder of its token.
pub fn assert_tasks_follow_terms(tasks: &[(i64, String, i64)], holders: &BTreeMap<i64, String>) {
    for pair in tasks.windows(2) {
        assert!(
            pair[0].2 <= pair[1].2,
            "task {} of term {} came after task {} of term {}",
            pair[1].0,
            pair[1].2,
            pair[0].0,
            pair[0].2
        );
    }
    for (id, generator, token) in tasks {
        assert_eq!(
            holders.get(token),
            Some(generator),
            "task {id} names {generator} for token {token}"
        );
    }
}

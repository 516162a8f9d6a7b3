//! Reading leases and their history: one lease, the lists, a resource's
//! events and the operator audit log. Nothing here decides who owns what.

use super::super::{Lease, LeaseDetail, LeaseEvent, LeaseFilter, Resource};
use super::LEASE_COLUMNS;
use crate::db::Schema;
use crate::paging::{Cursor, Paged};
use sqlx::PgConnection;

/// The lease with row id `id`, if any.
pub async fn get(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
) -> Result<Option<Lease>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<Lease>, sqlx::Error>,
        async {
            schema
                .query_as(&format!(
                    "SELECT {LEASE_COLUMNS} FROM $schema.leases WHERE id = $1"
                ))
                .bind(id)
                .fetch_optional(&mut *conn)
                .await
        }
        .await
    )
}

/// The lease on `resource`, if any.
pub async fn get_by_resource(
    conn: &mut PgConnection,
    schema: &Schema,
    resource: &Resource,
) -> Result<Option<Lease>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<Lease>, sqlx::Error>,
        async {
            schema
                .query_as(&format!(
                    "SELECT {LEASE_COLUMNS} FROM $schema.leases WHERE resource = $1"
                ))
                .bind(resource.as_str())
                .fetch_optional(&mut *conn)
                .await
        }
        .await
    )
}

/// One page of a lease list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Page {
    /// Only rows with an id above this (keyset pagination; 0 for the first page).
    pub after_id: i64,
    /// At most this many rows.
    pub limit: i64,
}

impl Page {
    /// The largest page a caller may ask for.
    pub const MAX_LIMIT: i64 = 1000;
    /// The page size when none is asked for.
    pub const DEFAULT_LIMIT: i64 = 100;

    /// A page, with the limit clamped to 1..=[`Page::MAX_LIMIT`].
    pub fn new(after_id: Option<i64>, limit: Option<i64>) -> Self {
        Page {
            after_id: after_id.unwrap_or(0).max(0),
            limit: limit
                .unwrap_or(Self::DEFAULT_LIMIT)
                .clamp(1, Self::MAX_LIMIT),
        }
    }
}

impl Default for Page {
    fn default() -> Self {
        Page::new(None, None)
    }
}

/// The SQL condition of `filter`, by the database clock.
fn filter_condition(filter: LeaseFilter) -> &'static str {
    match filter {
        LeaseFilter::All => "TRUE",
        LeaseFilter::Active => "released_at IS NULL AND expires_at > now()",
        LeaseFilter::Expired => "released_at IS NULL AND expires_at <= now()",
        LeaseFilter::Renewed => "renew_count > 0",
        LeaseFilter::Released => "released_at IS NOT NULL",
    }
}

/// Leases matching `filter`, ordered by id, one page at a time.
pub async fn list(
    conn: &mut PgConnection,
    schema: &Schema,
    filter: LeaseFilter,
    page: Page,
) -> Result<Vec<Lease>, sqlx::Error> {
    crate::db::atomically!(conn, schema, async {
        let condition = filter_condition(filter);
        schema.query_as(&format!(
            "SELECT {LEASE_COLUMNS} FROM $schema.leases WHERE {condition} AND id > $1 ORDER BY id LIMIT $2"
        ))
        .bind(page.after_id)
        .bind(page.limit)
        .fetch_all(&mut *conn)
        .await
    }
    .await)
}

/// A page of the leases matching `filter`, newest first: what the
/// dashboard shows and `GET /api/leases?before=` answers (oldest first, as
/// [`list`] pages them, would never show a new lease past the first page).
pub async fn list_page(
    conn: &mut PgConnection,
    schema: &Schema,
    filter: LeaseFilter,
    cursor: Cursor,
) -> Result<Paged<Lease>, sqlx::Error> {
    crate::db::atomically!(conn, schema, async {
        let rows = schema.query_as(&format!(
            "SELECT {LEASE_COLUMNS} FROM $schema.leases WHERE {} AND id < $1 ORDER BY id DESC LIMIT $2",
            filter_condition(filter)
        ))
        .bind(cursor.bound())
        .bind(cursor.limit)
        .fetch_all(&mut *conn)
        .await?;
        Ok(Paged::of(rows, cursor, |l: &Lease| l.id))
    }
    .await)
}

/// The most recent `limit` events of `resource`, newest first.
pub async fn history(
    conn: &mut PgConnection,
    schema: &Schema,
    resource: &str,
    limit: i64,
) -> Result<Vec<LeaseEvent>, sqlx::Error> {
    crate::db::atomically!(conn, schema, async {
        schema.query_as(
            "SELECT id, resource, holder, fencing_token, kind, previous_holder, expires_at, detail, at
               FROM $schema.lease_events WHERE resource = $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(resource)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await
    }
    .await)
}

/// The columns of a [`LeaseEvent`].
const EVENT_COLUMNS: &str =
    "id, resource, holder, fencing_token, kind, previous_holder, expires_at, detail, at";

/// A page of `resource`'s events, newest first.
pub async fn events(
    conn: &mut PgConnection,
    schema: &Schema,
    resource: &str,
    cursor: Cursor,
) -> Result<Paged<LeaseEvent>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Paged<LeaseEvent>, sqlx::Error>,
        async {
            let rows = schema
                .query_as(&format!(
                    "SELECT {EVENT_COLUMNS} FROM $schema.lease_events
              WHERE resource = $1 AND id < $2 ORDER BY id DESC LIMIT $3"
                ))
                .bind(resource)
                .bind(cursor.bound())
                .bind(cursor.limit)
                .fetch_all(&mut *conn)
                .await?;
            Ok(Paged::of(rows, cursor, |e: &LeaseEvent| e.id))
        }
        .await
    )
}

/// A page of the audit log, newest first: every operator action (kind
/// `operator`), whatever its resource. Read through the partial index
/// `lease_events_operator_idx`, so the log stays quick to page however
/// many other events there are.
pub async fn audit(
    conn: &mut PgConnection,
    schema: &Schema,
    cursor: Cursor,
) -> Result<Paged<LeaseEvent>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Paged<LeaseEvent>, sqlx::Error>,
        async {
            let rows = schema
                .query_as(&format!(
                    "SELECT {EVENT_COLUMNS} FROM $schema.lease_events
              WHERE kind = 'operator' AND id < $1 ORDER BY id DESC LIMIT $2"
                ))
                .bind(cursor.bound())
                .bind(cursor.limit)
                .fetch_all(&mut *conn)
                .await?;
            Ok(Paged::of(rows, cursor, |e: &LeaseEvent| e.id))
        }
        .await
    )
}

/// Lease `id` with its most recent history, if the lease exists.
pub async fn detail(
    conn: &mut PgConnection,
    schema: &Schema,
    id: i64,
) -> Result<Option<LeaseDetail>, sqlx::Error> {
    crate::db::atomically!(
        conn,
        schema,
        Result<Option<LeaseDetail>, sqlx::Error>,
        async {
            let Some(lease) = get(&mut *conn, schema, id).await? else {
                return Ok(None);
            };
            let history = history(conn, schema, &lease.resource, 50).await?;
            Ok(Some(LeaseDetail { lease, history }))
        }
        .await
    )
}

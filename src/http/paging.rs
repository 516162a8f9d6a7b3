//! Paged answers: a list route answers its page as a JSON array, newest
//! first, and, when older rows remain, a `Link: <...?before=N&limit=L>;
//! rel="next"` header naming the next page (the convention of GitHub's
//! API), so the body stays the plain array clients already read.

use axum::Json;
use axum::http::{Uri, header};
use axum::response::{IntoResponse, Response};
use leasekeeper_core::paging::{Cursor, Paged};
use serde::{Deserialize, Serialize};

/// `?before=ID&limit=N` on a newest-first list route.
#[derive(Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct CursorQuery {
    /// Rows with an id (or sequence number) below this: the cursor of the
    /// `Link: rel="next"` header.
    pub before: Option<i64>,
    /// At most this many (default 100, 1 to 1000).
    pub limit: Option<i64>,
}

impl CursorQuery {
    /// The cursor asked for.
    pub fn cursor(&self) -> Cursor {
        Cursor::new(self.before, self.limit)
    }
}

/// `page` of the list at `path` (read with `cursor`) as a response.
pub fn answer<T: Serialize>(path: &str, cursor: Cursor, page: Paged<T>) -> Response {
    answer_to(&path.parse().unwrap_or_default(), cursor, page)
}

/// `page`, read with `cursor`, as the answer to a request for `uri`: the
/// next page's link keeps the request's other parameters (a status
/// filter, say) and sets `before` and `limit`.
pub fn answer_to<T: Serialize>(uri: &Uri, cursor: Cursor, page: Paged<T>) -> Response {
    let next = page.next.map(|before| {
        let mut params: Vec<&str> = uri
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty() && !p.starts_with("before=") && !p.starts_with("limit="))
            .collect();
        let cursor_params = format!("before={before}&limit={}", cursor.limit);
        params.push(&cursor_params);
        format!("<{}?{}>; rel=\"next\"", uri.path(), params.join("&"))
    });
    let mut resp = Json(page.items).into_response();
    if let Some(link) = next.and_then(|l| header::HeaderValue::from_str(&l).ok()) {
        resp.headers_mut().insert(header::LINK, link);
    }
    resp
}

/// Which way a lease or task list reads.
pub enum Direction {
    /// Newest first, below a cursor (the default).
    Newest(Cursor),
    /// Oldest first, above an id (`?after=`), for a client following new
    /// rows; with `?before=` too, only rows below that (a window).
    Oldest(leasekeeper_core::lease::store::Page, Option<i64>),
}

impl Direction {
    /// The direction `?before=`, `?after=` and `?limit=` ask for: `after`
    /// reads oldest first, bounded by `before` when both are given.
    pub fn of(before: Option<i64>, after: Option<i64>, limit: Option<i64>) -> Direction {
        match after {
            Some(after) => Direction::Oldest(
                leasekeeper_core::lease::store::Page::new(Some(after), limit),
                before,
            ),
            None => Direction::Newest(Cursor::new(before, limit)),
        }
    }
}

/// `rows` read oldest first above some id, without those at or above
/// `before`: the first rows of the window (after, before), since every row
/// below `before` comes before every row at or above it.
pub fn below<T>(rows: Vec<T>, before: Option<i64>, id: impl Fn(&T) -> i64) -> Vec<T> {
    match before {
        Some(before) => rows.into_iter().take_while(|r| id(r) < before).collect(),
        None => rows,
    }
}

/// Declares the list routes of a resource: one handler per filter, each
/// answering `list(&state, filter, uri, query)` of the module it is called
/// in, documented with the given tag and response rows.
macro_rules! list_routes {
    (
        tag = $tag:literal, responses $responses:tt;
        $($name:ident: $path:literal, $summary:literal, $filter:expr;)+
    ) => {$(
        #[utoipa::path(
            get,
            path = $path,
            tag = $tag,
            summary = $summary,
            params(ListQuery),
            responses $responses
        )]
        pub(crate) async fn $name(
            axum::extract::State(s): axum::extract::State<crate::state::AppState>,
            uri: axum::http::Uri,
            crate::http::extract::ApiQuery(q): crate::http::extract::ApiQuery<ListQuery>,
        ) -> Result<axum::response::Response, crate::error::AppError> {
            list(&s, $filter, uri, q).await
        }
    )+};
}

pub(crate) use list_routes;

/// `value` percent-encoded for a URL's query (every byte but the
/// unreserved characters of RFC 3986), e.g. a queue name as a cursor.
pub fn query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

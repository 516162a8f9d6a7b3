//! Keyset paging, newest first: every list (tasks, leases, workers,
//! instances, lease events, the audit log) is read a page at a time with
//! a cursor, the id below which the next page starts. A cursor stays
//! right while rows are added (new rows land before the first page, never
//! inside a later one), which an offset would not.

use serde::{Deserialize, Serialize};

/// Which page: rows whose id is below `before` (the newest when `None`),
/// at most `limit` of them, newest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// Only rows with an id below this; `None` for the first page.
    pub before: Option<i64>,
    /// At most this many rows.
    pub limit: i64,
}

impl Cursor {
    /// The largest page a caller may ask for.
    pub const MAX_LIMIT: i64 = 1000;
    /// The page size when none is asked for.
    pub const DEFAULT_LIMIT: i64 = 100;

    /// A cursor, the limit clamped to 1..=[`Cursor::MAX_LIMIT`] and a
    /// non-positive `before` read as "before the first row" (an empty page).
    pub fn new(before: Option<i64>, limit: Option<i64>) -> Self {
        Cursor {
            before: before.map(|b| b.max(0)),
            limit: limit
                .unwrap_or(Self::DEFAULT_LIMIT)
                .clamp(1, Self::MAX_LIMIT),
        }
    }

    /// The first page of the default size.
    pub fn first() -> Self {
        Cursor::new(None, None)
    }

    /// `before` as a bound for SQL: `i64::MAX` for the first page.
    pub fn bound(&self) -> i64 {
        self.before.unwrap_or(i64::MAX)
    }

    /// The cursor of the page after one that held `ids` (newest first):
    /// `None` when that page was not full, so there is nothing older.
    pub fn next(
        &self,
        ids: impl DoubleEndedIterator<Item = i64> + ExactSizeIterator,
    ) -> Option<i64> {
        if (ids.len() as i64) < self.limit {
            return None;
        }
        ids.last()
    }
}

impl Default for Cursor {
    fn default() -> Self {
        Cursor::first()
    }
}

/// One page of a list, newest first, and the cursor of the next (older)
/// page, `None` on the last page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Paged<T> {
    /// The rows, newest first.
    pub items: Vec<T>,
    /// Pass as `before` for the next page; `None` when this is the last.
    pub next: Option<i64>,
}

impl<T> Paged<T> {
    /// `items` read with `cursor`; `id` gives a row's id.
    pub fn of(items: Vec<T>, cursor: Cursor, id: impl Fn(&T) -> i64) -> Self {
        let next = cursor.next(items.iter().map(id));
        Paged { items, next }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_page_points_below_its_oldest_row_and_a_short_page_ends() {
        let c = Cursor::new(None, Some(3));
        assert_eq!(c.bound(), i64::MAX);
        assert_eq!(Paged::of(vec![9, 7, 4], c, |x| *x).next, Some(4));
        assert_eq!(Paged::of(vec![9, 7], c, |x| *x).next, None);
        assert_eq!(Paged::<i64>::of(vec![], c, |x| *x).next, None);
        assert_eq!(Cursor::new(Some(4), Some(3)).bound(), 4);
    }

    #[test]
    fn limits_are_clamped_and_negative_cursors_end_the_list() {
        assert_eq!(Cursor::new(None, Some(0)).limit, 1);
        assert_eq!(Cursor::new(None, Some(1_000_000)).limit, Cursor::MAX_LIMIT);
        assert_eq!(Cursor::new(None, None).limit, Cursor::DEFAULT_LIMIT);
        assert_eq!(Cursor::new(Some(-5), None).before, Some(0));
    }
}

//! Searching the tasks list: which tasks a list shows, by status, kind,
//! queue and data (a JSON object the task's data must contain, as
//! PostgreSQL's `@>` says: `{"customer": 7}` finds every task whose data
//! has `"customer": 7` among its fields). Shared with the browser, which
//! writes a search into the tasks page's URL.
//!
//! ```
//! use leasekeeper_core::queue::{TaskSearch, TaskStatus};
//! let search = TaskSearch::parse(Some("failed"), Some("email"), None, Some(r#"{"customer":7}"#)).unwrap();
//! assert_eq!(search.status, Some(TaskStatus::Failed));
//! assert_eq!(search.query(), "status=failed&kind=email&data=%7B%22customer%22%3A7%7D");
//! assert!(TaskSearch::parse(None, None, None, Some("[7]")).is_err());
//! ```

use super::{TaskStatus, check_name};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The longest `data` filter accepted, in characters of its JSON text.
pub const MAX_DATA_FILTER_CHARS: usize = 8192;

/// What a data filter that is not a JSON object is refused with.
pub const DATA_NOT_AN_OBJECT: &str = "data must be a JSON object, e.g. {\"customer\":7}";

/// Which tasks a list shows: every field given must match (`None`: any).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskSearch {
    /// Tasks in this status.
    pub status: Option<TaskStatus>,
    /// Tasks of this kind.
    pub kind: Option<String>,
    /// Tasks in this queue.
    pub queue: Option<String>,
    /// Tasks whose data contains this object (`task_data @> data`); never
    /// an empty object (that filters nothing, so it is `None`).
    pub data: Option<Map<String, Value>>,
}

impl From<Option<TaskStatus>> for TaskSearch {
    fn from(status: Option<TaskStatus>) -> Self {
        TaskSearch {
            status,
            ..TaskSearch::default()
        }
    }
}

impl TaskSearch {
    /// The search that raw parameters (a URL's, a form's) ask for; an
    /// empty or blank parameter, `status=all` and `data={}` mean "any".
    /// Refuses, with a message naming the parameter, a status that is not
    /// one, a kind or queue name that breaks the naming rules
    /// ([`check_name`]), and a `data` that is too long, not JSON, not an
    /// object ([`DATA_NOT_AN_OBJECT`]) or not storable.
    pub fn parse(
        status: Option<&str>,
        kind: Option<&str>,
        queue: Option<&str>,
        data: Option<&str>,
    ) -> Result<TaskSearch, String> {
        let status = match given(status) {
            None | Some("all") => None,
            Some(name) => Some(TaskStatus::parse(name).ok_or_else(|| {
                format!(
                    "status must be one of all, pending, started, processed, failed, cancelled; got {name:?}"
                )
            })?),
        };
        let search = TaskSearch {
            status,
            kind: given(kind).map(str::to_string),
            queue: given(queue).map(str::to_string),
            data: given(data).map(parse_data).transpose()?.flatten(),
        };
        search.check()?;
        Ok(search)
    }

    /// Whether the search's kind and queue follow the naming rules and its
    /// data is a storable object (what [`TaskSearch::parse`] checks).
    pub fn check(&self) -> Result<(), String> {
        for (name, value) in [("kind", &self.kind), ("queue", &self.queue)] {
            if let Some(value) = value {
                check_name(name, value)?;
            }
        }
        if let Some(data) = &self.data {
            crate::json::storable(&Value::Object(data.clone()), "data")?;
        }
        Ok(())
    }

    /// Whether it lets every task through.
    pub fn is_any(&self) -> bool {
        *self == TaskSearch::default()
    }

    /// The data filter as JSON text, if any.
    pub fn data_text(&self) -> Option<String> {
        self.data
            .as_ref()
            .map(|d| Value::Object(d.clone()).to_string())
    }

    /// The search as URL query parameters (`status=failed&kind=email&...`,
    /// percent-encoded, in that order; empty for [`TaskSearch::is_any`]),
    /// which [`TaskSearch::parse`] reads back.
    pub fn query(&self) -> String {
        let pairs = [
            ("status", self.status.map(|s| s.as_str().to_string())),
            ("kind", self.kind.clone()),
            ("queue", self.queue.clone()),
            ("data", self.data_text()),
        ];
        pairs
            .into_iter()
            .filter_map(|(name, value)| value.map(|v| format!("{name}={}", percent_encoded(&v))))
            .collect::<Vec<_>>()
            .join("&")
    }
}

/// `raw`, unless it is blank: empty or plain spaces (a form's untouched
/// field). Other whitespace is not blank: a control character such as a
/// form feed goes on to the name rules, which refuse it.
fn given(raw: Option<&str>) -> Option<&str> {
    raw.filter(|r| !r.trim_matches(' ').is_empty())
}

/// `raw` as a data filter: a JSON object, `None` when it is empty.
fn parse_data(raw: &str) -> Result<Option<Map<String, Value>>, String> {
    let chars = raw.chars().count();
    if chars > MAX_DATA_FILTER_CHARS {
        return Err(format!(
            "data must be at most {MAX_DATA_FILTER_CHARS} characters of JSON, got {chars}"
        ));
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(Value::Object(map)) if map.is_empty() => Ok(None),
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(_) => Err(DATA_NOT_AN_OBJECT.to_string()),
        Err(e) => Err(format!("{DATA_NOT_AN_OBJECT}; not JSON: {e}")),
    }
}

/// `text` with every byte but the unreserved ones (RFC 3986) percent-encoded.
fn percent_encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{DATA_NOT_AN_OBJECT, MAX_DATA_FILTER_CHARS, TaskSearch};
    use crate::queue::TaskStatus;
    use serde_json::json;

    #[test]
    fn blank_parameters_mean_any_and_each_given_one_is_kept() {
        let any = TaskSearch::parse(Some("all"), Some(""), Some("  "), Some("{}")).unwrap();
        assert!(any.is_any(), "{any:?}");
        // A control character is not blank: refused, not read as "any".
        assert!(TaskSearch::parse(None, None, Some("\u{c}"), None).is_err());
        assert!(TaskSearch::parse(None, Some("\t"), None, None).is_err());
        assert_eq!(any.query(), "");
        let s = TaskSearch::parse(
            Some("pending"),
            Some("email"),
            Some("mail q"),
            Some(r#" {"customer": 7, "tags": ["a&b"]} "#),
        )
        .unwrap();
        assert_eq!(s.status, Some(TaskStatus::Pending));
        assert_eq!(s.kind.as_deref(), Some("email"));
        assert_eq!(s.queue.as_deref(), Some("mail q"));
        assert_eq!(
            s.data,
            json!({"customer": 7, "tags": ["a&b"]}).as_object().cloned()
        );
        assert_eq!(
            s.query(),
            "status=pending&kind=email&queue=mail%20q&data=%7B%22customer%22%3A7%2C%22tags%22%3A%5B%22a%26b%22%5D%7D"
        );
    }

    #[test]
    fn bad_parameters_are_refused_naming_what_is_wrong() {
        fn err(s: Option<&str>, k: Option<&str>, q: Option<&str>, d: Option<&str>) -> String {
            TaskSearch::parse(s, k, q, d).unwrap_err()
        }
        assert!(err(Some("done"), None, None, None).starts_with("status must be one of"));
        assert!(err(None, Some("a\u{7}b"), None, None).starts_with("kind must not"));
        assert!(
            err(None, None, Some(&"q".repeat(129)), None).starts_with("queue must be 1 to 128")
        );
        for not_an_object in ["[1]", "7", "\"customer\"", "null", "true"] {
            assert_eq!(
                err(None, None, None, Some(not_an_object)),
                DATA_NOT_AN_OBJECT
            );
        }
        assert!(err(None, None, None, Some("{customer:7}")).starts_with(DATA_NOT_AN_OBJECT));
        let long = format!(r#"{{"k":"{}"}}"#, "x".repeat(MAX_DATA_FILTER_CHARS));
        assert!(err(None, None, None, Some(&long)).starts_with("data must be at most"));
        assert!(err(None, None, None, Some(r#"{"k":"a\u0000"}"#)).contains("NUL"));
    }
}

//! Rows for `COPY … FROM STDIN` in PostgreSQL's text format: fields apart
//! by a tab, rows ended by a newline, `\N` for NULL, and a backslash, tab,
//! newline or carriage return inside a value written as its backslash
//! escape (the format's rules: PostgreSQL's documentation of COPY, "Text
//! Format").

use chrono::{DateTime, Utc};
use std::fmt::Write;

/// One field of a row.
pub(crate) enum Field<'a> {
    /// An integer column (int2, int4 or int8).
    Int(i64),
    /// An integer column that may be NULL.
    OptInt(Option<i64>),
    /// A json or jsonb column.
    Json(&'a serde_json::Value),
    /// A text column that may be NULL.
    Text(Option<&'a str>),
    /// A timestamptz column that may be NULL, written in UTC to the
    /// microsecond (ISO 8601, read the same under any DateStyle).
    Time(Option<DateTime<Utc>>),
}

/// Rows of text-format COPY data, built one at a time.
#[derive(Default)]
pub(crate) struct Rows {
    out: String,
    /// The last timestamp written and its text: a batch's rows mostly
    /// share one (the statement's clock), printed once.
    time: Option<(DateTime<Utc>, String)>,
}

impl Rows {
    /// Room for `n` rows of about `width` bytes.
    pub(crate) fn with_capacity(n: usize, width: usize) -> Self {
        Rows {
            out: String::with_capacity(n * width),
            time: None,
        }
    }

    /// Appends one row of `fields`.
    pub(crate) fn push(&mut self, fields: &[Field<'_>]) {
        for (i, field) in fields.iter().enumerate() {
            if i > 0 {
                self.out.push('\t');
            }
            match field {
                Field::Int(n) | Field::OptInt(Some(n)) => {
                    write!(self.out, "{n}").expect("writing to a String cannot fail");
                }
                Field::Json(value) => escaped(&mut self.out, &value.to_string()),
                Field::Text(Some(text)) => escaped(&mut self.out, text),
                Field::Time(Some(at)) => {
                    if self.time.as_ref().is_none_or(|(last, _)| last != at) {
                        let text = at.format("%Y-%m-%d %H:%M:%S%.6f+00").to_string();
                        self.time = Some((*at, text));
                    }
                    let (_, text) = self.time.as_ref().expect("just set");
                    self.out.push_str(text);
                }
                Field::OptInt(None) | Field::Text(None) | Field::Time(None) => {
                    self.out.push_str("\\N")
                }
            }
        }
        self.out.push('\n');
    }

    /// The rows written since the last take, as COPY takes them.
    pub(crate) fn take(&mut self) -> Vec<u8> {
        let capacity = self.out.capacity();
        std::mem::replace(&mut self.out, String::with_capacity(capacity)).into_bytes()
    }
}

/// `text` with the format's four special characters escaped.
fn escaped(out: &mut String, text: &str) {
    let mut rest = text;
    while let Some(at) = rest.find(['\\', '\t', '\n', '\r']) {
        out.push_str(&rest[..at]);
        out.push_str(match rest.as_bytes()[at] {
            b'\\' => "\\\\",
            b'\t' => "\\t",
            b'\n' => "\\n",
            _ => "\\r",
        });
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specials_are_escaped_and_nulls_are_marked() {
        let mut rows = Rows::default();
        let at = DateTime::parse_from_rfc3339("2026-11-27T02:03:04.005006Z")
            .unwrap()
            .with_timezone(&Utc);
        let json = serde_json::json!({"a": "tab\there\\N"});
        rows.push(&[
            Field::Int(-7),
            Field::OptInt(None),
            Field::Json(&json),
            Field::Text(Some("line\nbreak\r\\N")),
            Field::Text(None),
            Field::Time(Some(at)),
            Field::Time(None),
        ]);
        rows.push(&[
            Field::Time(Some(at)),
            Field::Time(Some(at + chrono::TimeDelta::milliseconds(1))),
        ]);
        assert_eq!(
            String::from_utf8(rows.take()).unwrap(),
            "-7\t\\N\t{\"a\":\"tab\\\\there\\\\\\\\N\"}\tline\\nbreak\\r\\\\N\t\\N\t\
             2026-11-27 02:03:04.005006+00\t\\N\n\
             2026-11-27 02:03:04.005006+00\t2026-11-27 02:03:04.006006+00\n"
        );
    }
}

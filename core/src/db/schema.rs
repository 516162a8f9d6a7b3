//! The PostgreSQL schema that holds every table, function and trigger of
//! leasekeeper: parse, don't validate.
//!
//! A host service's database has its own tables, usually in `public`, and
//! its own `_sqlx_migrations`; leasekeeper keeps out of both by living in a
//! schema of its own (`leasekeeper` unless configured). The name is checked
//! once, where it enters (a setting, a flag, a library call); past that it is
//! a plain identifier that needs no escaping anywhere.

use std::fmt;
use std::str::FromStr;

/// The longest schema name accepted, in characters: the schema's change
/// notifications go out on the channel `<schema>_changes`, and PostgreSQL
/// channel names are at most 63 bytes.
pub const MAX_SCHEMA_CHARS: usize = 63 - "_changes".len();

/// The schema used when none is configured.
pub const DEFAULT_SCHEMA: &str = "leasekeeper";

/// Why a schema name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// Empty or only white space.
    #[error("schema name must not be empty")]
    Empty,
    /// Longer than [`MAX_SCHEMA_CHARS`].
    #[error(
        "schema name must be at most {MAX_SCHEMA_CHARS} characters (its notification channel <schema>_changes must fit PostgreSQL's 63), got {0}"
    )]
    TooLong(usize),
    /// A character other than `a`-`z`, `0`-`9` and `_`, or a digit first.
    #[error(
        "schema name must be a plain lowercase identifier (a-z, 0-9 and _, not starting with a digit), got {0:?} at position {1}"
    )]
    NotAnIdentifier(char, usize),
    /// `public`, `information_schema`, or a `pg_` name.
    #[error("schema name {0} is reserved: {1}")]
    Reserved(String, &'static str),
}

/// A valid schema name: a plain lowercase PostgreSQL identifier
/// (`[a-z_][a-z0-9_]*`, at most [`MAX_SCHEMA_CHARS`]), other than `public`,
/// `information_schema` and names starting with `pg_`.
///
/// ```
/// use leasekeeper_core::db::Schema;
///
/// assert_eq!(Schema::default().as_str(), "leasekeeper");
/// assert_eq!(Schema::parse("svc_jobs").unwrap().as_str(), "svc_jobs");
/// assert!(Schema::parse("public").is_err());
/// assert!(Schema::parse("Jobs").is_err());
/// ```
///
/// It also says how statements reach the server: prepared once per
/// connection and reused (the default), or, for a schema reached
/// [behind a transaction pooler](Schema::behind_transaction_pooler), as
/// unnamed statements each inside a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schema {
    name: String,
    pooled: bool,
}

impl Schema {
    /// Parses a schema name, refusing anything but a plain lowercase
    /// identifier, and the schemas leasekeeper must not take over.
    pub fn parse(raw: &str) -> Result<Self, SchemaError> {
        if raw.trim().is_empty() {
            return Err(SchemaError::Empty);
        }
        let chars = raw.chars().count();
        if chars > MAX_SCHEMA_CHARS {
            return Err(SchemaError::TooLong(chars));
        }
        for (i, c) in raw.chars().enumerate() {
            let ok = c.is_ascii_lowercase() || c == '_' || (i > 0 && c.is_ascii_digit());
            if !ok {
                return Err(SchemaError::NotAnIdentifier(c, i + 1));
            }
        }
        let reserved = match raw {
            "public" => Some("it is PostgreSQL's default schema, where the host's own tables live"),
            "information_schema" => Some("it is PostgreSQL's own catalog schema"),
            _ if raw.starts_with("pg_") => Some("names starting with pg_ belong to PostgreSQL"),
            _ => None,
        };
        if let Some(why) = reserved {
            return Err(SchemaError::Reserved(raw.to_string(), why));
        }
        Ok(Schema {
            name: raw.to_string(),
            pooled: false,
        })
    }

    /// This schema reached through a pooler in transaction mode (PgBouncer
    /// with `pool_mode = transaction`), which hands each transaction to
    /// whichever server connection is free: no statement is prepared by
    /// name (the next transaction may run on a connection that never saw
    /// it, or that another client prepared the same name on), and every
    /// statement runs inside a transaction (a statement's parse and its
    /// execution are two round trips, and between two transactions the
    /// pooler may switch connections). Pools built with
    /// [`super::connect_options`] for it remember it ([`Schema::of`]).
    pub fn behind_transaction_pooler(mut self) -> Self {
        self.pooled = true;
        self
    }

    /// This schema on a direct connection (or a pooler in session mode):
    /// the opposite of [`Schema::behind_transaction_pooler`], for the
    /// connections that need a session of their own behind such a pooler
    /// (the liveness session, `LISTEN`), opened on a direct URL.
    pub fn directly_connected(mut self) -> Self {
        self.pooled = false;
        self
    }

    /// Whether [`Schema::behind_transaction_pooler`] was asked for.
    pub fn is_behind_transaction_pooler(&self) -> bool {
        self.pooled
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The name as a quoted SQL identifier (`"leasekeeper"`), safe to splice
    /// into a statement: the name holds no quote, so none needs doubling,
    /// and quoting keeps a name that is also a keyword (`user`) usable.
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.name)
    }
}

impl Default for Schema {
    /// The `leasekeeper` schema.
    fn default() -> Self {
        Schema {
            name: DEFAULT_SCHEMA.to_string(),
            pooled: false,
        }
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl FromStr for Schema {
    type Err = SchemaError;

    fn from_str(raw: &str) -> Result<Self, SchemaError> {
        Schema::parse(raw)
    }
}

impl AsRef<str> for Schema {
    fn as_ref(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_leasekeeper_and_valid() {
        assert_eq!(Schema::default().as_str(), "leasekeeper");
        assert_eq!(Schema::parse(DEFAULT_SCHEMA), Ok(Schema::default()));
        assert_eq!(Schema::default().quoted(), "\"leasekeeper\"");
    }

    #[test]
    fn accepts_plain_lowercase_identifiers_up_to_the_limit() {
        for ok in [
            "svc_jobs", "_private", "jobs2", "a", "user", "public2", "pgx",
        ] {
            assert_eq!(Schema::parse(ok).map(|s| s.to_string()), Ok(ok.to_string()));
        }
        let longest = "s".repeat(MAX_SCHEMA_CHARS);
        assert!(Schema::parse(&longest).is_ok());
        assert!(format!("{longest}_changes").len() <= 63);
    }

    #[test]
    fn refuses_empty_long_and_non_identifier_names() {
        assert_eq!(Schema::parse(""), Err(SchemaError::Empty));
        assert_eq!(Schema::parse("  "), Err(SchemaError::Empty));
        assert_eq!(
            Schema::parse(&"s".repeat(MAX_SCHEMA_CHARS + 1)),
            Err(SchemaError::TooLong(MAX_SCHEMA_CHARS + 1))
        );
        assert_eq!(
            Schema::parse("Jobs"),
            Err(SchemaError::NotAnIdentifier('J', 1))
        );
        assert_eq!(
            Schema::parse("1jobs"),
            Err(SchemaError::NotAnIdentifier('1', 1))
        );
        for bad in ["svc-jobs", "svc jobs", "a\"b", "a.b", "é", " jobs", "jobs;"] {
            assert!(
                matches!(Schema::parse(bad), Err(SchemaError::NotAnIdentifier(..))),
                "{bad}"
            );
        }
    }

    #[test]
    fn refuses_the_schemas_of_others() {
        for bad in [
            "public",
            "information_schema",
            "pg_catalog",
            "pg_temp",
            "pg_x",
        ] {
            let err = Schema::parse(bad).unwrap_err();
            assert!(matches!(err, SchemaError::Reserved(..)), "{bad}");
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn messages_say_what_is_wrong_in_one_line() {
        let err = Schema::parse("Svc-Jobs").unwrap_err().to_string();
        assert!(
            err.contains("lowercase identifier") && err.contains("'S'"),
            "{err}"
        );
        let err = Schema::parse("public").unwrap_err().to_string();
        assert!(err.contains("default schema"), "{err}");
        let err = Schema::parse(&"x".repeat(60)).unwrap_err().to_string();
        assert!(
            err.contains("at most 55") && err.contains("got 60"),
            "{err}"
        );
        for e in [err, Schema::parse("").unwrap_err().to_string()] {
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn from_str_is_parse() {
        assert_eq!("svc_jobs".parse::<Schema>(), Schema::parse("svc_jobs"));
        assert!("public".parse::<Schema>().is_err());
    }
}

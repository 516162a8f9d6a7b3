//! Validated names for resources and holders: parse, don't validate.
//!
//! Every edge (REST body, server function argument, lease client) turns a raw
//! string into a [`Resource`] or [`Holder`] once; code past the edge never
//! re-checks. The database backs the same limit with CHECK constraints.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The longest resource or holder name accepted, in characters.
pub const MAX_NAME_CHARS: usize = 256;

/// The rules of [`Holder::parse`] and [`Resource::parse`] as a regular
/// expression, for the OpenAPI document: no control character, and
/// something other than white space.
pub const NAME_PATTERN: &str =
    r"^[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f][^\x00-\x1f\x7f-\x9f]*$";

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Missing, empty or only white space.
    #[error("{0} must not be empty")]
    Empty(&'static str),
    /// Longer than [`MAX_NAME_CHARS`].
    #[error("{0} must be at most {MAX_NAME_CHARS} characters, got {1}")]
    TooLong(&'static str, usize),
    /// Contains a control character (NUL cannot be stored by PostgreSQL at all).
    #[error("{0} must not contain control characters")]
    Control(&'static str),
}

fn check(what: &'static str, raw: &str) -> Result<(), NameError> {
    if raw.trim().is_empty() {
        return Err(NameError::Empty(what));
    }
    let chars = raw.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(NameError::TooLong(what, chars));
    }
    if raw.chars().any(char::is_control) {
        return Err(NameError::Control(what));
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $ty:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $ty(String);

        /// A string of 1 to 256 characters matching [`NAME_PATTERN`], so a
        /// client (or a fuzzer) reading the document knows the rules.
        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $ty {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .min_length(Some(1))
                    .max_length(Some(MAX_NAME_CHARS))
                    .pattern(Some(NAME_PATTERN))
                    .into()
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $ty {
            fn name() -> std::borrow::Cow<'static, str> {
                std::borrow::Cow::Borrowed(stringify!($ty))
            }
        }

        impl $ty {
            /// Parses a raw name, refusing empty, over-long or control-character names.
            pub fn parse(raw: impl Into<String>) -> Result<Self, NameError> {
                let raw = raw.into();
                check($what, &raw)?;
                Ok(Self(raw))
            }

            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let raw = String::deserialize(d)?;
                $ty::parse(raw).map_err(serde::de::Error::custom)
            }
        }
    };
}

name_type!(
    /// A resource name such as `task:42` or `singleton:generator`: 1 to 256
    /// characters, not all white space, no control characters.
    Resource,
    "resource"
);
name_type!(
    /// A holder name, a worker id or an instance id: 1 to 256 characters,
    /// not all white space, no control characters.
    Holder,
    "holder"
);

/// The resource prefixes the library itself names leases and history
/// with, kept out of reach of a public lease API (the dashboard's
/// `/api/leases` refuses them for every caller, its operator included):
///
/// - `task:` — every claim is a lease on `task:<id>`; holding one by hand
///   would stall the task or let a stranger's term fence out its worker.
/// - `singleton:` — the generator, maintenance and scheduler jobs (and a
///   service's own [`Singleton`](crate::lease::singleton)s) lead by
///   holding `singleton:<name>`.
/// - `queue:`, `schedule:`, `worker:`, `instance:` — the history an
///   operator's change is audited under; a lease there would write rows
///   into that audit trail.
///
/// The operator's force-release ends a term of any of them; that is the
/// one public way to touch them.
pub const RESERVED_PREFIXES: &[&str] = &[
    "task:",
    "singleton:",
    "queue:",
    "schedule:",
    "worker:",
    "instance:",
];

impl Resource {
    /// The reserved prefix this name starts with, if any (see
    /// [`RESERVED_PREFIXES`]). Compared as written: `Task:1` is an
    /// application's own name, since the library only writes lower case.
    pub fn reserved_prefix(&self) -> Option<&'static str> {
        RESERVED_PREFIXES
            .iter()
            .copied()
            .find(|prefix| self.0.starts_with(prefix))
    }

    /// Whether the library itself uses this name (see [`RESERVED_PREFIXES`]).
    pub fn is_reserved(&self) -> bool {
        self.reserved_prefix().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_s_own_names_are_reserved() {
        for name in [
            "task:2",
            "singleton:generator",
            "singleton:maintenance",
            "singleton:scheduler",
            "queue:default",
            "schedule:nightly",
            "worker:w-1",
            "instance:i-1",
        ] {
            assert!(Resource::parse(name).unwrap().is_reserved(), "{name}");
        }
        assert_eq!(
            Resource::parse("task:7").unwrap().reserved_prefix(),
            Some("task:")
        );
        for name in ["app:x", "tasks", "my-task:1", "Task:1", "singleton"] {
            assert!(!Resource::parse(name).unwrap().is_reserved(), "{name}");
        }
    }

    #[test]
    #[cfg(feature = "postgres")]
    fn every_name_the_library_builds_is_reserved() {
        let built = [
            crate::queue::Task::resource_name(1),
            crate::generator::RESOURCE.to_string(),
            crate::maintenance::RESOURCE.to_string(),
            crate::schedule::RESOURCE.to_string(),
            crate::queue::queues::resource("q"),
            crate::schedule::store::resource("s"),
        ];
        for name in built {
            assert!(Resource::parse(&name).unwrap().is_reserved(), "{name}");
        }
    }

    #[test]
    fn accepts_ordinary_names_up_to_the_limit() {
        assert_eq!(Resource::parse("task:42").unwrap().as_str(), "task:42");
        let longest = "é".repeat(MAX_NAME_CHARS);
        assert!(Holder::parse(longest).is_ok());
    }

    #[test]
    fn refuses_empty_long_and_control_names() {
        assert_eq!(Resource::parse(""), Err(NameError::Empty("resource")));
        assert_eq!(Holder::parse("   "), Err(NameError::Empty("holder")));
        assert_eq!(
            Holder::parse("x".repeat(MAX_NAME_CHARS + 1)),
            Err(NameError::TooLong("holder", MAX_NAME_CHARS + 1))
        );
        assert_eq!(Resource::parse("a\0b"), Err(NameError::Control("resource")));
    }

    #[test]
    fn deserializing_applies_the_same_rules() {
        let err = serde_json::from_str::<Holder>("\"\"").unwrap_err();
        assert!(
            err.to_string().contains("holder must not be empty"),
            "{err}"
        );
        let ok: Resource = serde_json::from_str("\"r1\"").unwrap();
        assert_eq!(ok.as_str(), "r1");
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

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

//! The name of a task kind or a queue: one rule, checked by
//! [`TaskName::check`] wherever a kind or queue comes in (an enqueue, a
//! claim, a search, a queue's pause, a schedule's task), and described
//! once for the OpenAPI document ([`NAME_PATTERN`], and `TaskName`'s
//! schema under feature `openapi`), so no body or parameter writes the
//! pattern again.

use std::fmt;

/// The longest task kind or queue name, in characters.
pub const MAX_NAME_CHARS: usize = 128;

/// A kind or queue name's rule as a regular expression, for the OpenAPI
/// document: no control character (the length is said apart).
pub const NAME_PATTERN: &str = r"^[^\x00-\x1f\x7f-\x9f]*$";

/// A task kind or queue name: 1 to [`MAX_NAME_CHARS`] characters, none a
/// control character. [`NewTask`](super::NewTask) keeps its kind and queue
/// as strings (a service builds them from literals); the enqueue checks
/// them by this rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TaskName(String);

impl TaskName {
    /// Checks `name` by the rule; `what` (`kind`, `queue`) names it in the
    /// error: `kind must be 1 to 128 characters, got 0`.
    pub fn check(what: &str, name: &str) -> Result<(), String> {
        let chars = name.chars().count();
        if chars == 0 || chars > MAX_NAME_CHARS {
            return Err(format!(
                "{what} must be 1 to {MAX_NAME_CHARS} characters, got {chars}"
            ));
        }
        if name.chars().any(char::is_control) {
            return Err(format!("{what} must not contain control characters"));
        }
        Ok(())
    }

    /// `raw` as a name, or why not ([`TaskName::check`]).
    pub fn parse(what: &str, raw: impl Into<String>) -> Result<Self, String> {
        let raw = raw.into();
        Self::check(what, &raw)?;
        Ok(TaskName(raw))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name's schema inline: for a parameter, whose schema cannot
    /// refer to a component.
    #[cfg(feature = "openapi")]
    pub fn inline_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        Self::string_schema(1)
    }

    /// A list's filter by name: the rule, but empty (any) allowed.
    #[cfg(feature = "openapi")]
    pub fn filter_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        Self::string_schema(0)
    }

    #[cfg(feature = "openapi")]
    fn string_schema(min: usize) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .min_length((min > 0).then_some(min))
            .max_length(Some(MAX_NAME_CHARS))
            .pattern(Some(NAME_PATTERN))
            .into()
    }
}

impl fmt::Display for TaskName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A string of 1 to 128 characters matching [`NAME_PATTERN`].
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for TaskName {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        Self::inline_schema()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for TaskName {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("TaskName")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_and_its_words() {
        assert_eq!(
            TaskName::parse("kind", "é".repeat(MAX_NAME_CHARS)).map(|n| n.as_str().chars().count()),
            Ok(MAX_NAME_CHARS)
        );
        assert_eq!(
            TaskName::check("kind", ""),
            Err("kind must be 1 to 128 characters, got 0".into())
        );
        assert_eq!(
            TaskName::check("queue", &"q".repeat(MAX_NAME_CHARS + 1)),
            Err("queue must be 1 to 128 characters, got 129".into())
        );
        for control in ['\0', '\u{1f}', '\u{7f}', '\u{9f}'] {
            assert_eq!(
                TaskName::check("queue", &format!("a{control}")),
                Err("queue must not contain control characters".into())
            );
        }
    }
}

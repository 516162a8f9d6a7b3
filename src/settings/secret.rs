//! A setting that must never be printed: a token, a database URL that may
//! hold a password. Its `Debug` says `<redacted>`; the value is read only
//! through [`Secret::expose`], so every use of it is easy to find.

/// What a redacted value prints as.
pub(super) const REDACTED: &str = "<redacted>";

/// A value kept out of `Debug` output and logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The value itself: for comparing, sending or connecting, never for
    /// printing.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Secret(value.to_string())
    }
}

/// A URL with its password, if any, replaced by `<redacted>`.
pub(super) fn redact_url(url: &str) -> String {
    // scheme://user:password@host/...: only the part between the first ':'
    // after the scheme and the last '@' before the path is the password.
    let Some((scheme, rest)) = url.split_once("://") else {
        return REDACTED.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            if userinfo.contains(':') {
                format!("{scheme}://{user}:{REDACTED}@{host}{tail}")
            } else {
                url.to_string()
            }
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let s = Secret::from("correct-horse-battery-staple");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some(<redacted>)");
        assert_eq!(s.expose(), "correct-horse-battery-staple");
    }

    #[test]
    fn urls_lose_only_their_password() {
        assert_eq!(
            redact_url("postgres://app:hunter2@db.internal:5432/jobs?sslmode=require"),
            "postgres://app:<redacted>@db.internal:5432/jobs?sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://app@db/jobs"),
            "postgres://app@db/jobs"
        );
        assert_eq!(redact_url("not a url"), "<redacted>");
    }
}

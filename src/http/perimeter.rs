//! Answers only requests addressed to this server: the DNS-rebinding fence.
//!
//! A page on `evil.example` can make its own name resolve to 127.0.0.1 (or
//! to a LAN address) after it loaded; the browser then sends the page's
//! requests here, same-origin in its eyes, with `Host: evil.example` and a
//! matching `Origin`. The cross-site check ([`super::origin`]) compares
//! those two and is satisfied, so the fence is the `Host` itself: a request
//! whose `Host` is a DNS name this server was not told about answers
//! **421 Misdirected Request** and reaches no handler, reads included.
//!
//! Always answered (Vite's and Jupyter's rule; a rebinding attack needs a
//! DNS name it controls, so none of these can carry one):
//! - an IP literal, v4 or `[v6]` (a probe or scrape to the pod's address);
//! - `localhost` and any `*.localhost` (browsers resolve them to loopback
//!   themselves);
//! - a name in `allowed_hosts` (`LEASEKEEPER_ALLOWED_HOSTS`): equal, or,
//!   for an entry with a leading `.`, that name or any name under it.
//!
//! The port is ignored and a trailing dot (`example.com.`) is the same
//! name. A request with no `Host` at all (HTTP/1.0, or an in-process test)
//! and no authority in its URI passes: no browser sends one.

use crate::error::AppError;
use crate::settings::Settings;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// Middleware: 421 for a request whose `Host` this server does not answer
/// for. Its state is the settings (for `allowed_hosts`).
pub async fn known_hosts_only(
    State(settings): State<Arc<Settings>>,
    req: Request,
    next: Next,
) -> Response {
    let host = match req.headers().get(header::HOST) {
        Some(value) => Some(value.to_str().unwrap_or("\u{fffd}").to_string()),
        // HTTP/2 carries the host in the URI's authority instead.
        None => req.uri().authority().map(|a| a.as_str().to_string()),
    };
    match host {
        Some(host) if !host_is_answered(&host, &settings.allowed_hosts) => {
            tracing::warn!(
                host = %host.escape_debug(),
                method = %req.method(),
                path = %req.uri().path(),
                "request for a host this server does not answer for refused"
            );
            AppError::MisdirectedRequest(format!(
                "this server does not answer for host {:?}; add the name to LEASEKEEPER_ALLOWED_HOSTS (comma-separated, a leading '.' allows subdomains) to serve it",
                host_name(&host)
            ))
            .into_response()
        }
        _ => next.run(req).await,
    }
}

/// Whether a `Host` value (port allowed) is answered: an IP literal,
/// `localhost` or a `*.localhost` name, or a name `allowed` lists.
pub fn host_is_answered(host: &str, allowed: &[String]) -> bool {
    let name = host_name(host);
    if let Some(inner) = name.strip_prefix('[') {
        // Only an IPv6 literal is bracketed.
        return inner
            .strip_suffix(']')
            .is_some_and(|ip| ip.parse::<Ipv6Addr>().is_ok());
    }
    if name.parse::<Ipv4Addr>().is_ok() || name.parse::<Ipv6Addr>().is_ok() {
        return true;
    }
    let name = name.to_ascii_lowercase();
    let name = name.strip_suffix('.').unwrap_or(&name);
    if name.is_empty() {
        return false;
    }
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    allowed.iter().any(|entry| match entry.strip_prefix('.') {
        Some(domain) => {
            name == domain
                || name
                    .strip_suffix(domain)
                    .is_some_and(|sub| sub.ends_with('.'))
        }
        None => name == entry,
    })
}

/// The host part of a `Host` value: without its port, brackets kept.
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if host.starts_with('[') {
        // `[v6]` or `[v6]:port`.
        return match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.rsplit_once(':') {
        // One colon: name:port. More: an unbracketed IPv6 address.
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::host_is_answered;

    fn allowed() -> Vec<String> {
        vec!["jobs.example.com".into(), ".internal".into()]
    }

    #[test]
    fn ip_literals_and_loopback_names_are_always_answered() {
        for host in [
            "127.0.0.1:3000",
            "127.0.0.1",
            "10.1.2.3:80",
            "[::1]:3000",
            "[::1]",
            "[fe80::1]:8080",
            "localhost",
            "localhost:3000",
            "LocalHost:3000",
            "app.localhost:3000",
            "localhost.:3000",
        ] {
            assert!(host_is_answered(host, &[]), "{host}");
        }
    }

    #[test]
    fn allowed_names_exact_and_under_a_dot_entry() {
        for host in [
            "jobs.example.com",
            "JOBS.example.com:443",
            "jobs.example.com.",
            "internal",
            "a.internal:3000",
            "a.b.internal",
        ] {
            assert!(host_is_answered(host, &allowed()), "{host}");
        }
    }

    #[test]
    fn other_names_are_refused() {
        for host in [
            "evil.example",
            "evil.example:3000",
            "example.com",
            "x.jobs.example.com",
            "jobs.example.com.evil.example",
            "notinternal",
            "evilinternal:3000",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "[not-an-ip]",
            "[::1",
            "",
            ":3000",
            "\u{fffd}",
        ] {
            assert!(!host_is_answered(host, &allowed()), "{host:?}");
        }
    }
}

//! Reaching the cluster's databases: connection options and a URL for
//! psql, and creating (or recreating) a database.

use super::{EmbeddedPostgres, SUPERUSER};
use anyhow::{Context, Result, bail};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgSslMode};
use std::fmt::Write as _;
use std::time::Duration;

impl EmbeddedPostgres {
    /// Connection options for database `database`: superuser `leasekeeper`
    /// over the unix socket (the cluster has no TCP listener).
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        // Start from the environment-free defaults and set everything that
        // matters, so stray PGHOST/PGPORT/PGUSER/PGSSLMODE variables meant for
        // some other server cannot redirect these connections.
        PgConnectOptions::new_without_pgpass()
            .host("localhost")
            .socket(&self.socket_dir)
            .port(self.port)
            .username(SUPERUSER)
            .database(database)
            .ssl_mode(PgSslMode::Disable)
            .application_name("leasekeeper")
    }

    /// A libpq-style URL for the same connection, e.g.
    /// `postgres://leasekeeper@localhost:5432/leasekeeper?host=/abs/path`,
    /// accepted by both sqlx and psql (it is logged so users can `psql` in).
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{SUPERUSER}@localhost:{}/{}?host={}",
            self.port,
            percent_encode(database, false),
            percent_encode(&self.socket_dir.to_string_lossy(), true)
        )
    }

    /// The server's unix socket file (for a relay in front of it, as the
    /// fault harness's network partitions use).
    pub fn socket_path(&self) -> std::path::PathBuf {
        self.socket_dir.join(format!(".s.PGSQL.{}", self.port))
    }

    /// Drops database `name` if it exists (closing its connections) and
    /// creates it anew, empty: for benchmarks and the fault harness.
    pub async fn recreate_database(&self, name: &str) -> Result<()> {
        let mut conn = PgConnection::connect_with(&self.connect_options("postgres"))
            .await
            .with_context(|| format!("connecting to {}", self.url("postgres")))?;
        sqlx::query(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            quote_ident(name)
        ))
        .execute(&mut conn)
        .await
        .with_context(|| format!("dropping database {name}"))?;
        let _ = conn.close().await;
        self.ensure_database(name).await
    }

    /// Ensures database `name` exists, creating it if missing. A concurrent
    /// creator is tolerated: "already exists" counts as success.
    pub async fn ensure_database(&self, name: &str) -> Result<()> {
        if name.is_empty() {
            bail!("database name must not be empty");
        }
        let mut conn = PgConnection::connect_with(&self.connect_options("postgres"))
            .await
            .with_context(|| format!("connecting to {}", self.url("postgres")))?;
        let exists: Option<i32> =
            sqlx::query_scalar("SELECT 1 FROM pg_catalog.pg_database WHERE datname = $1")
                .bind(name)
                .fetch_optional(&mut conn)
                .await
                .with_context(|| format!("looking up database {name:?}"))?;
        if exists.is_some() {
            return Ok(());
        }

        let sql = format!("CREATE DATABASE {}", quote_ident(name));
        let mut attempt = 0;
        let result = loop {
            attempt += 1;
            // CREATE DATABASE cannot run inside a transaction block; the
            // simple query protocol sends it as a single statement.
            match sqlx::raw_sql(&sql).execute(&mut conn).await {
                Ok(_) => break Ok(()),
                Err(err) => match err.as_database_error().and_then(|e| e.code()).as_deref() {
                    // duplicate_database: another process created it first.
                    // unique_violation: the same race caught one step later,
                    // at the insert into pg_database.
                    Some("42P04" | "23505") => break Ok(()),
                    // object_in_use: someone is connected to template1, which
                    // CREATE DATABASE copies; such sessions are short-lived.
                    Some("55006") if attempt < 10 => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    _ => break Err(err),
                },
            }
        };
        let _ = conn.close().await;
        result.with_context(|| format!("creating database {name:?}"))?;
        tracing::info!(database = name, "database ready in embedded PostgreSQL");
        Ok(())
    }
}

/// Double-quotes an SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Percent-encodes `s` for a URL; `keep_slash` leaves `/` readable in paths.
fn percent_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_and_encoding() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(percent_encode("/x y/z", true), "/x%20y/z");
        assert_eq!(percent_encode("a/b", false), "a%2Fb");
    }
}

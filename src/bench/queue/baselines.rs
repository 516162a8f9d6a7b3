//! The baselines our figures are measured next to: the original design's
//! claim and completion (driven by [`super::throughput`]), the raw SQL
//! ceiling (pgbench driving the store's own statements) and
//! graphile-worker from npm.

use super::{Plan, Progress};
use crate::db::Schema;
use crate::lease::Holder;
use crate::queue::store as tasks;
use anyhow::{Context, Result, bail};
use serde_json::json;
use sqlx::{Connection, PgConnection};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The graphile-worker release measured (the newest that runs on Node 20).
const GRAPHILE_VERSION: &str = "0.16.6";

/// The original design's claim: in one transaction, the `offset`-th pending
/// task by `scheduled_at`, locked and waited for (`FOR UPDATE`, no `SKIP
/// LOCKED`), then its lease in a separate statement, then the task row.
pub(super) async fn original_claim(
    conn: &mut PgConnection,
    me: &Holder,
    offset: i64,
) -> Result<Option<(i32, i64)>> {
    let mut tx = conn.begin().await?;
    let id: Option<i32> = sqlx::query_scalar(
        "SELECT id FROM tasks WHERE status = 'pending' AND scheduled_at <= now()
          ORDER BY scheduled_at LIMIT 1 OFFSET $1 FOR UPDATE",
    )
    .bind(offset)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(id) = id else {
        tx.commit().await?;
        return Ok(None);
    };
    let token: Option<i64> = sqlx::query_scalar(
        "INSERT INTO leases AS l (resource, holder, expires_at, ttl_ms, fencing_token)
         VALUES ('task:' || $1, $2, now() + interval '30 s', 30000, 1)
         ON CONFLICT (resource) DO UPDATE
            SET holder = EXCLUDED.holder, acquired_at = now(), released_at = NULL,
                expires_at = EXCLUDED.expires_at, renew_count = 0,
                fencing_token = l.fencing_token + 1
          WHERE l.expires_at <= now()
         RETURNING fencing_token",
    )
    .bind(id)
    .bind(me.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(token) = token else {
        tx.rollback().await?;
        return Ok(None);
    };
    sqlx::query(
        "UPDATE tasks SET status = 'started', processor = $2, fencing_token = $3,
                started_at = now(), last_heartbeat_at = now(),
                must_heartbeat_before = now() + interval '30 s', attempts = attempts + 1
          WHERE id = $1",
    )
    .bind(id)
    .bind(me.as_str())
    .bind(token)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some((id, token)))
}

/// The original design's completion: the task row, then the lease release.
pub(super) async fn original_complete(
    conn: &mut PgConnection,
    me: &Holder,
    id: i32,
    token: i64,
) -> Result<()> {
    let mut tx = conn.begin().await?;
    sqlx::query(
        "UPDATE tasks SET status = 'processed', processed_at = now(), must_heartbeat_before = NULL
          WHERE id = $1 AND processor = $2 AND fencing_token = $3 AND status = 'started'",
    )
    .bind(id)
    .bind(me.as_str())
    .bind(token)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE leases SET released_at = now(), expires_at = now()
          WHERE resource = 'task:' || $1 AND holder = $2 AND fencing_token = $3",
    )
    .bind(id)
    .bind(me.as_str())
    .bind(token)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The pgbench script: [`tasks::claim_sql`] for one task, then
/// [`tasks::complete_sql`] for it, with pgbench variables for the binds.
fn pgbench_script() -> String {
    let processor = "('raw-' || :client_id)";
    let claim = tasks::claim_sql(1, false)
        .replace("$1::text[]", &format!("ARRAY[{processor}]"))
        .replace("$2", "30000")
        .replace("$3", "'default'");
    let complete = tasks::complete_sql()
        .replace("$1::int4[]", "ARRAY[:id]::int4[]")
        .replace("$2::int8[]", "ARRAY[:fencing_token]::int8[]")
        .replace("$3::text[]", &format!("ARRAY[{processor}]"))
        .replace("$4::jsonb[]", "ARRAY[NULL]::jsonb[]");
    format!("{claim}\n\\gset\n{complete};\n")
}

fn pgbench_binary() -> Result<PathBuf> {
    let bin = crate::db::embedded::find_server_binaries()?.join("pgbench");
    if !bin.exists() {
        bail!(
            "pgbench is not installed next to the server ({})",
            bin.display()
        );
    }
    Ok(bin)
}

/// Tasks per second when pgbench drives the same statements with
/// `clients` connections (prepared statements, two threads) on the tables
/// in `schema`.
pub(super) async fn raw_ceiling(
    conninfo: &str,
    schema: &Schema,
    clients: usize,
    plan: &Plan,
) -> Result<f64> {
    let script = std::env::temp_dir().join(format!("leasekeeper-bench-{}.sql", std::process::id()));
    std::fs::write(&script, pgbench_script())?;
    let seconds = (plan.warmup + plan.run).as_secs().max(1).to_string();
    let out = tokio::process::Command::new(pgbench_binary()?)
        .args([
            "-n",
            "-M",
            "prepared",
            "-j",
            "2",
            "-c",
            &clients.to_string(),
            "-T",
            &seconds,
            "-f",
        ])
        .arg(&script)
        .arg(conninfo)
        .env_remove("PGHOST")
        .env_remove("PGPORT")
        .env("PGOPTIONS", format!("-c search_path={}", schema.quoted()))
        .output()
        .await
        .context("running pgbench")?;
    let _ = std::fs::remove_file(&script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "pgbench failed: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let failed = stdout
        .lines()
        .find(|l| l.starts_with("number of failed transactions"))
        .is_some_and(|l| !l.contains(": 0 "));
    if failed {
        bail!("pgbench reported failed transactions: {stdout}");
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .map(f64::round)
        .with_context(|| format!("no tps in pgbench's output: {stdout}"))
}

/// graphile-worker's no-op jobs per second, or `None` (with a note) when
/// npm or node is unavailable or the install fails.
pub(super) async fn graphile_worker(
    conninfo: &str,
    jobs: i64,
    concurrency: usize,
    progress: &Progress,
) -> Option<f64> {
    match try_graphile_worker(conninfo, jobs, concurrency).await {
        Ok(rate) => Some(rate.round()),
        Err(e) => {
            progress.note(&format!("bench: graphile-worker skipped: {e:#}"));
            None
        }
    }
}

async fn try_graphile_worker(conninfo: &str, jobs: i64, concurrency: usize) -> Result<f64> {
    let dir = Path::new("target/bench-graphile");
    std::fs::create_dir_all(dir)?;
    let package = json!({
        "private": true,
        "type": "module",
        "dependencies": {"graphile-worker": GRAPHILE_VERSION},
    });
    std::fs::write(
        dir.join("package.json"),
        serde_json::to_string_pretty(&package)?,
    )?;
    std::fs::write(dir.join("run.mjs"), include_str!("graphile.mjs"))?;
    let installed = dir.join("node_modules/graphile-worker/package.json");
    let have: Option<String> = std::fs::read_to_string(&installed)
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|v| v["version"].as_str().map(str::to_string));
    if have.as_deref() != Some(GRAPHILE_VERSION) {
        let status = tokio::time::timeout(
            Duration::from_secs(600),
            tokio::process::Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                .current_dir(dir)
                .stdout(std::process::Stdio::null())
                .status(),
        )
        .await
        .context("npm install took over 10 minutes")?
        .context("npm is not available")?;
        if !status.success() {
            bail!("npm install graphile-worker@{GRAPHILE_VERSION} failed ({status})");
        }
    }
    let out = tokio::time::timeout(
        Duration::from_secs(600),
        tokio::process::Command::new("node")
            .arg("run.mjs")
            .current_dir(dir)
            .env("DATABASE_URL", conninfo)
            .env("JOBS", jobs.to_string())
            .env("CONCURRENCY", concurrency.to_string())
            .output(),
    )
    .await
    .context("graphile-worker took over 10 minutes")?
    .context("node is not available")?;
    if !out.status.success() {
        bail!(
            "graphile-worker run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim().lines().last().unwrap_or(""))
        .with_context(|| format!("graphile-worker's output: {line}"))?;
    v["jobs_per_s"].as_f64().context("no jobs_per_s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pgbench_script_is_the_stores_sql_with_every_bind_replaced() {
        let script = pgbench_script();
        for n in 1..=4 {
            assert!(
                !script.contains(&format!("${n}")),
                "${n} left in:\n{script}"
            );
        }
        assert!(script.contains("FOR UPDATE SKIP LOCKED"));
        assert!(script.contains("\\gset"));
        assert!(script.contains("ARRAY[:id]::int4[]"));
        assert!(script.trim_end().ends_with(';'));
    }
}

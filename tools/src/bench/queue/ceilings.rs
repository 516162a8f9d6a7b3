//! The two ceilings our throughput is read against, both measured with
//! pgbench (16 clients, prepared statements, no application code):
//!
//! - the **raw SQL ceiling**: the store's own claim and complete
//!   statements ([`tasks::sql::claim`], [`tasks::sql::complete`]), so what
//!   our SQL can do at best on this machine;
//! - the **minimal ceiling**: a bare `SKIP LOCKED` queue in a table of its
//!   own (no lease, no token, no history, no counters), claimed with one
//!   `UPDATE` and completed with another: the physical reference, what any
//!   queue that commits a claim and a completion per task can do here.

use super::Plan;
use anyhow::{Context, Result, bail};
use leasekeeper_core::db::Schema;
use leasekeeper_core::queue::store as tasks;
use sqlx::PgPool;
use std::path::PathBuf;

/// The minimal queue's table, in the bench schema (created and dropped by
/// [`minimal_ceiling`]).
const MINIMAL_TABLE: &str = "bench_minimal_queue";

/// The raw ceiling's script: [`tasks::sql::claim`] for one task, then
/// [`tasks::sql::complete`] for it, with pgbench variables for the binds.
fn raw_script(schema: &Schema) -> String {
    let processor = "('raw-' || :client_id)";
    let claim = schema
        .sql(&tasks::sql::claim(1, false))
        .replace("$1::text[]", &format!("ARRAY[{processor}]"))
        .replace("$2", "30000")
        .replace("$3", "'default'");
    let complete = schema
        .sql(&tasks::sql::complete())
        .replace("$1::int8[]", "ARRAY[:id]::int8[]")
        .replace("$2::int8[]", "ARRAY[:fencing_token]::int8[]")
        .replace("$3::text[]", &format!("ARRAY[{processor}]"))
        .replace("$4::jsonb[]", "ARRAY[NULL]::jsonb[]");
    format!("{claim}\n\\gset\n{complete};\n")
}

/// The minimal ceiling's script: two statements, each its own commit.
fn minimal_script() -> String {
    format!(
        // Race prevented: two clients claiming the same row. The subquery
        // locks the first pending row it can (FOR UPDATE) and passes over
        // rows another client has locked (SKIP LOCKED) instead of waiting
        // for them; the outer UPDATE then owns the row it locked.
        "UPDATE {MINIMAL_TABLE} SET status = 'running', locked_by = 'c' || :client_id, \
                locked_at = now() \
          WHERE id = (SELECT id FROM {MINIMAL_TABLE} WHERE status = 'pending' \
                       ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) \
         RETURNING id\n\\gset\n\
         UPDATE {MINIMAL_TABLE} SET status = 'done', done_at = now() WHERE id = :id;\n"
    )
}

/// Tasks per second when pgbench drives the store's own claim and complete
/// statements with `clients` connections on the tables in `schema`.
pub(super) async fn raw_ceiling(
    conninfo: &str,
    schema: &Schema,
    clients: usize,
    plan: &Plan,
) -> Result<f64> {
    pgbench(conninfo, schema, clients, plan, &raw_script(schema)).await
}

/// Tasks per second of the bare SKIP LOCKED queue under pgbench with
/// `clients` connections: its table is created in `schema`, filled with
/// `tasks` rows, vacuumed and checkpointed, measured, then dropped.
pub(super) async fn minimal_ceiling(
    pool: &PgPool,
    conninfo: &str,
    schema: &Schema,
    clients: usize,
    tasks: i64,
    plan: &Plan,
) -> Result<f64> {
    sqlx::query(&format!("DROP TABLE IF EXISTS {MINIMAL_TABLE}"))
        .execute(pool)
        .await?;
    sqlx::query(&format!(
        "CREATE TABLE {MINIMAL_TABLE} (
             id        bigserial PRIMARY KEY,
             status    text NOT NULL DEFAULT 'pending',
             payload   jsonb NOT NULL DEFAULT '{{}}',
             locked_by text,
             locked_at timestamptz,
             done_at   timestamptz
         )"
    ))
    .execute(pool)
    .await?;
    sqlx::query(&format!(
        "CREATE INDEX {MINIMAL_TABLE}_pending_idx ON {MINIMAL_TABLE} (id) WHERE status = 'pending'"
    ))
    .execute(pool)
    .await?;
    sqlx::query(&format!(
        "INSERT INTO {MINIMAL_TABLE} (payload) SELECT '{{}}' FROM generate_series(1, $1::bigint)"
    ))
    .bind(tasks)
    .execute(pool)
    .await?;
    sqlx::query(&format!("VACUUM ANALYZE {MINIMAL_TABLE}"))
        .execute(pool)
        .await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    let measured = pgbench(conninfo, schema, clients, plan, &minimal_script()).await;
    sqlx::query(&format!("DROP TABLE IF EXISTS {MINIMAL_TABLE}"))
        .execute(pool)
        .await?;
    measured
}

fn pgbench_binary() -> Result<PathBuf> {
    let bin = leasekeeper_core::db::embedded::find_server_binaries()?.join("pgbench");
    if !bin.exists() {
        bail!(
            "pgbench is not installed next to the server ({})",
            bin.display()
        );
    }
    Ok(bin)
}

/// Transactions per second of pgbench running `script` with `clients`
/// connections (prepared statements, two threads) for the plan's warm-up
/// and run, on the tables in `schema`. A failed transaction fails the run
/// (e.g. a claim that found the queue empty: `\gset` wants one row).
async fn pgbench(
    conninfo: &str,
    schema: &Schema,
    clients: usize,
    plan: &Plan,
    script: &str,
) -> Result<f64> {
    let path = std::env::temp_dir().join(format!("leasekeeper-bench-{}.sql", std::process::id()));
    std::fs::write(&path, script)?;
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
        .arg(&path)
        .arg(conninfo)
        .env_remove("PGHOST")
        .env_remove("PGPORT")
        .env("PGOPTIONS", format!("-c search_path={}", schema.quoted()))
        .output()
        .await
        .context("running pgbench")?;
    let _ = std::fs::remove_file(&path);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_raw_script_is_the_stores_sql_with_every_bind_replaced() {
        let script = raw_script(&Schema::default());
        assert!(!script.contains("$schema"), "{script}");
        assert!(script.contains("\"leasekeeper\".tasks"), "{script}");
        for n in 1..=4 {
            assert!(
                !script.contains(&format!("${n}")),
                "${n} left in:\n{script}"
            );
        }
        assert!(script.contains("FOR UPDATE SKIP LOCKED"));
        assert!(script.contains("\\gset"));
        assert!(script.contains("ARRAY[:id]::int8[]"));
        assert!(script.trim_end().ends_with(';'));
    }

    #[test]
    fn the_minimal_script_claims_with_skip_locked_then_completes_what_it_claimed() {
        let script = minimal_script();
        let (claim, complete) = script.split_once("\\gset").expect("a \\gset");
        assert!(claim.contains("FOR UPDATE SKIP LOCKED") && claim.contains("RETURNING id"));
        assert!(complete.contains("WHERE id = :id"));
        assert!(!script.contains("tasks") && !script.contains("lease"));
    }
}

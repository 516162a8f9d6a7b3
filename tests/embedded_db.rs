//! Integration tests of the embedded default database: a private PostgreSQL
//! cluster started from the server binaries installed on the machine.
//!
//! Each test uses its own fresh folder under `target/` (not /tmp: when the
//! tests run as root, the `postgres` user must be able to reach the folder)
//! and removes it at the end, also when a check fails.
#![cfg(feature = "ssr")]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use leasekeeper_core::db::embedded::{EmbeddedPostgres, find_server_binaries};
use sqlx::Connection;
use sqlx::postgres::PgConnection;

/// A fresh, not yet existing folder `target/tmp-embedded-test-<random>`.
fn fresh_data_dir(tag: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(format!(
            "tmp-embedded-test-{tag}-{:08x}",
            rand::random::<u32>()
        ))
}

/// Runs `body`, then stops any server on `data_dir` and removes the folder
/// whatever happened, and only then reports the body's outcome.
async fn with_cleanup<F>(data_dir: &Path, body: F)
where
    F: Future<Output = Result<()>>,
{
    with_cleanup_in(data_dir, data_dir, body).await;
}

/// [`with_cleanup`] for a data folder inside the test folder `remove`.
async fn with_cleanup_in<F>(data_dir: &Path, remove: &Path, body: F)
where
    F: Future<Output = Result<()>>,
{
    let outcome = body.await;
    let stopped = EmbeddedPostgres::stop(data_dir).await;
    let _ = tokio::fs::remove_dir_all(remove).await;
    if let Err(err) = outcome {
        panic!("{err:#}");
    }
    if let Err(err) = stopped {
        panic!("final stop failed: {err:#}");
    }
}

async fn connect(url: &str) -> Result<PgConnection> {
    PgConnection::connect(url)
        .await
        .with_context(|| format!("connecting to {url}"))
}

async fn select_one(conn: &mut PgConnection) -> Result<i32> {
    Ok(sqlx::query_scalar("SELECT 1").fetch_one(conn).await?)
}

#[tokio::test]
async fn finds_the_installed_server_binaries() {
    let found = find_server_binaries().expect("server binaries should be found");
    if let Some(dir) = std::env::var_os("LEASEKEEPER_PG_BIN") {
        assert_eq!(found, PathBuf::from(dir));
        return;
    }
    // The highest Debian-style major version wins; on the project's machines
    // that is PostgreSQL 15.
    let highest = std::fs::read_dir("/usr/lib/postgresql")
        .expect("/usr/lib/postgresql should exist")
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|major| Path::new(&format!("/usr/lib/postgresql/{major}/bin/initdb")).exists())
        .max()
        .expect("a /usr/lib/postgresql/<N>/bin with initdb");
    assert_eq!(
        found,
        PathBuf::from(format!("/usr/lib/postgresql/{highest}/bin"))
    );
    if highest == 15 {
        assert_eq!(found, Path::new("/usr/lib/postgresql/15/bin"));
    }
    for name in ["initdb", "pg_ctl", "postgres"] {
        assert!(found.join(name).is_file(), "{name} in {}", found.display());
    }
}

#[tokio::test]
async fn start_reuse_persist_stop() {
    let data_dir = fresh_data_dir("lifecycle");
    with_cleanup(&data_dir, async {
        // First start: initdb and start.
        let pg = EmbeddedPostgres::start(&data_dir).await?;
        ensure!(pg.started_here(), "the first start should start the server");
        ensure!(
            pg.data_dir().join("pgdata/PG_VERSION").is_file(),
            "cluster in <data_dir>/pgdata"
        );
        let url = pg.url("leasekeeper");
        let mut conn = PgConnection::connect_with(&pg.connect_options("postgres")).await?;
        ensure!(select_one(&mut conn).await? == 1, "SELECT 1");
        conn.close().await?;

        // The durable-commit settings must hold (benchmarks depend on them).
        let mut conn = connect(&pg.url("postgres")).await?;
        let fsync: String = sqlx::query_scalar("SHOW fsync")
            .fetch_one(&mut conn)
            .await?;
        let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&mut conn)
            .await?;
        let listen: String = sqlx::query_scalar("SHOW listen_addresses")
            .fetch_one(&mut conn)
            .await?;
        let max_conn: String = sqlx::query_scalar("SHOW max_connections")
            .fetch_one(&mut conn)
            .await?;
        ensure!(
            fsync == "on" && sync == "on",
            "fsync={fsync} synchronous_commit={sync}"
        );
        ensure!(
            listen.is_empty(),
            "no TCP listener, got listen_addresses={listen:?}"
        );
        ensure!(max_conn == "300", "max_connections={max_conn}");
        conn.close().await?;

        // Second start on the same folder reuses the running server.
        let again = EmbeddedPostgres::start(&data_dir).await?;
        ensure!(
            !again.started_here(),
            "the second start should reuse the server"
        );
        ensure!(again.url("leasekeeper") == url, "same URL on reuse");
        // stop_if_started_here on the reusing handle must leave it running.
        again.stop_if_started_here().await?;

        // ensure_database is idempotent.
        pg.ensure_database("x").await?;
        pg.ensure_database("x").await?;
        again.ensure_database("leasekeeper").await?;

        // The same URL works (the reused server is the running one).
        let mut conn = connect(&again.url("x")).await?;
        ensure!(select_one(&mut conn).await? == 1, "SELECT 1 in x");
        sqlx::raw_sql("CREATE TABLE kept (v text); INSERT INTO kept VALUES ('persisted')")
            .execute(&mut conn)
            .await?;
        conn.close().await?;

        // Stop, start again: the data is still there.
        pg.stop_if_started_here().await?;
        ensure!(
            connect(&url).await.is_err(),
            "the server should be down after stop_if_started_here"
        );
        let pg = EmbeddedPostgres::start(&data_dir).await?;
        ensure!(
            pg.started_here(),
            "start after stop should start the server"
        );
        let mut conn = connect(&pg.url("x")).await?;
        let v: String = sqlx::query_scalar("SELECT v FROM kept")
            .fetch_one(&mut conn)
            .await?;
        ensure!(v == "persisted", "data persisted across restart, got {v:?}");
        conn.close().await?;

        // The public stop works too, and is fine when nothing runs.
        EmbeddedPostgres::stop(&data_dir).await?;
        EmbeddedPostgres::stop(&data_dir).await?;
        ensure!(connect(&url).await.is_err(), "server down after stop");
        Ok(())
    })
    .await;
    assert!(!data_dir.exists(), "test folder removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_on_a_fresh_folder_share_one_server() {
    let data_dir = fresh_data_dir("concurrent");
    with_cleanup(&data_dir, async {
        let (a, b) = tokio::join!(
            EmbeddedPostgres::start(&data_dir),
            EmbeddedPostgres::start(&data_dir)
        );
        let (a, b) = (a?, b?);
        ensure!(
            a.started_here() != b.started_here(),
            "exactly one of two concurrent starts should start the server (a={}, b={})",
            a.started_here(),
            b.started_here()
        );
        let (da, db) = tokio::join!(a.ensure_database("same"), b.ensure_database("same"));
        da?;
        db?;
        for pg in [&a, &b] {
            let mut conn = connect(&pg.url("same")).await?;
            ensure!(select_one(&mut conn).await? == 1, "SELECT 1");
            conn.close().await?;
        }
        Ok(())
    })
    .await;
}

/// Whether `pid` exists and is not a zombie.
fn is_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X')
    })
}

#[tokio::test]
async fn restarts_after_a_crash_that_left_a_stale_pid_file() {
    let data_dir = fresh_data_dir("crash");
    with_cleanup(&data_dir, async {
        let pg = EmbeddedPostgres::start(&data_dir).await?;
        let mut conn = connect(&pg.url("postgres")).await?;
        sqlx::raw_sql("CREATE TABLE survived (v int); INSERT INTO survived VALUES (7)")
            .execute(&mut conn)
            .await?;
        conn.close().await?;

        // Kill the postmaster outright: postmaster.pid stays behind.
        let pid_file = pg.data_dir().join("pgdata/postmaster.pid");
        let text = tokio::fs::read_to_string(&pid_file).await?;
        let pid: i32 = text
            .lines()
            .next()
            .context("empty postmaster.pid")?
            .trim()
            .parse()?;
        let pid = nix::unistd::Pid::from_raw(pid);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)?;
        // Wait until it is dead (a zombie or gone), then restart at once:
        // with a lazily reaping parent the zombie still answers kill(pid, 0),
        // which is exactly the case the restart must handle.
        let deadline = Instant::now() + Duration::from_secs(10);
        while is_alive(pid.as_raw()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ensure!(
            pid_file.exists(),
            "the crash should leave postmaster.pid behind"
        );

        let pg = EmbeddedPostgres::start(&data_dir).await?;
        ensure!(
            pg.started_here(),
            "start after a crash should start the server"
        );
        let mut conn = connect(&pg.url("postgres")).await?;
        let v: i32 = sqlx::query_scalar("SELECT v FROM survived")
            .fetch_one(&mut conn)
            .await?;
        ensure!(v == 7, "committed data survives the crash");
        conn.close().await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn long_data_dir_gets_a_short_socket_folder() {
    let base = fresh_data_dir("long");
    let data_dir =
        base.join("a-rather-long-folder-name-to-push-the-socket-path-over-the-kernel-limit");
    let mut socket_dir = None;
    with_cleanup_in(&data_dir, &base, async {
        let pg = EmbeddedPostgres::start(&data_dir).await?;
        let socket = pg
            .connect_options("postgres")
            .get_socket()
            .cloned()
            .context("socket folder in connect options")?;
        socket_dir = Some(socket.clone());
        ensure!(
            socket.starts_with("/tmp") && socket.as_os_str().len() < 50,
            "socket folder should be short, got {}",
            socket.display()
        );
        let mut conn = connect(&pg.url("postgres")).await?;
        ensure!(select_one(&mut conn).await? == 1, "SELECT 1");
        conn.close().await?;
        Ok(())
    })
    .await;
    if let Some(dir) = socket_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
}

//! The highly available database of the harness: what a team running
//! PostgreSQL for availability deploys, from the machine's packages only.
//!
//! - **etcd** (one member): the store the orchestrator keeps its leader key in;
//! - **Patroni** on each of two PostgreSQL 15 nodes: it bootstraps the
//!   primary, clones the standby with `pg_basebackup`, runs streaming
//!   replication and promotes the standby when the primary's leader key
//!   expires. With `--replication sync` Patroni's `synchronous_mode` keeps
//!   the standby synchronous (`synchronous_commit = on`: a commit returns
//!   only once the standby has it), and it fails over only to that standby;
//!   with `--replication async` the standby may be behind when promoted;
//! - **HAProxy** in front: the address every client uses. It asks each
//!   node's Patroni REST API `GET /primary` every 500 ms and routes to the
//!   one answering 200; when a node goes down, its sessions are shut.
//!
//! Each node's `postgres` runs under libfaketime with a clock offset read
//! from a file of its own (`<node>/skew`, `+0` unless a `clock_skew` fault
//! sets it), so a promoted standby can judge lease expiry by a clock that
//! disagrees with the old primary's.
//!
//! Layout under the harness's `--ha-dir` (wiped at each start):
//!
//! ```text
//! etcd/            etcd's data        etcd.log
//! pg0/ pg1/        per node: patroni.yml, data/, skew, patroni.log, bin/postgres (libfaketime wrapper)
//! haproxy.cfg      haproxy.log
//! ```
//!
//! `config.rs` writes the nodes' and HAProxy's configuration; `procs.rs`
//! finds and stops the cluster's processes.

mod config;
mod procs;

use config::{chown_tree, haproxy_config, options, patroni_config, write_postgres_wrapper};
use procs::{children_of, kill_leftovers};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, User};
use serde::Serialize;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The superuser every connection uses (trust authentication on 127.0.0.1).
const SUPERUSER: &str = "leasekeeper";
/// PostgreSQL 15's server binaries (Debian's layout).
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// A cold start (etcd, bootstrap, clone) is seconds; this only stops a hang.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// How the standby follows the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Replication {
    /// Patroni's synchronous mode: a commit is acknowledged only once the
    /// standby has it. The configuration leasekeeper supports.
    Sync,
    /// Plain streaming replication: a commit is acknowledged before the
    /// standby has it, and a failover can lose it.
    Async,
}

struct Node {
    name: String,
    dir: PathBuf,
    pg_port: u16,
    rest_port: u16,
    patroni: Option<Child>,
    /// Its clock offset as last set, in ms.
    skew_ms: i64,
}

impl Node {
    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn skew_file(&self) -> PathBuf {
        self.dir.join("skew")
    }

    /// The postmaster's pid, from `postmaster.pid`.
    fn postmaster(&self) -> Option<Pid> {
        let text = std::fs::read_to_string(self.data_dir().join("postmaster.pid")).ok()?;
        text.lines()
            .next()?
            .trim()
            .parse::<i32>()
            .ok()
            .map(Pid::from_raw)
    }
}

/// The running cluster; [`HaCluster::stop`] ends every process of it
/// (dropping it kills them).
pub struct HaCluster {
    dir: PathBuf,
    pub replication: Replication,
    etcd: Child,
    haproxy: Child,
    nodes: Vec<Node>,
    /// HAProxy's port: the address of the current primary.
    pub port: u16,
    http: reqwest::Client,
    owner: (nix::unistd::Uid, nix::unistd::Gid),
}

fn free_port() -> Result<u16> {
    super::rig::free_port()
}

impl HaCluster {
    /// Starts etcd, both nodes and HAProxy in `dir` (wiped first) and
    /// returns once HAProxy reaches a primary whose standby streams (in
    /// sync mode: as its synchronous standby).
    pub async fn start(dir: &Path, replication: Replication) -> Result<Self> {
        for program in [
            "/usr/bin/etcd",
            "/usr/bin/patroni",
            "/usr/sbin/haproxy",
            LIBFAKETIME,
        ] {
            if !Path::new(program).exists() {
                bail!(
                    "{program} is missing: the highly available harness needs Debian's etcd-server, \
                     patroni, haproxy and libfaketime packages (`bash .ci/setup --ha` installs them)"
                );
            }
        }
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        kill_leftovers(&dir);
        std::fs::remove_dir_all(&dir)?;
        std::fs::create_dir_all(&dir)?;
        let user = User::from_name("postgres")?.context("no `postgres` system user")?;
        let owner = (user.uid, user.gid);
        let (etcd_client, etcd_peer) = (free_port()?, free_port()?);
        let etcd = Command::new("/usr/bin/etcd")
            .args([
                "--name",
                "leasekeeper-ha",
                "--data-dir",
                &dir.join("etcd").to_string_lossy(),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{etcd_client}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{etcd_client}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{etcd_peer}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{etcd_peer}"),
                "--initial-cluster",
                &format!("leasekeeper-ha=http://127.0.0.1:{etcd_peer}"),
                "--enable-v2=true",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("etcd.log"))?)
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .context("starting etcd")?;
        let mut nodes = Vec::new();
        for i in 0..2 {
            let node = Node {
                name: format!("pg{i}"),
                dir: dir.join(format!("pg{i}")),
                pg_port: free_port()?,
                rest_port: free_port()?,
                patroni: None,
                skew_ms: 0,
            };
            std::fs::create_dir_all(node.dir.join("bin"))?;
            std::fs::write(node.skew_file(), "+0\n")?;
            write_postgres_wrapper(&node)?;
            std::fs::write(
                node.dir.join("patroni.yml"),
                patroni_config(&node, etcd_client, replication),
            )?;
            chown_tree(&node.dir, owner)?;
            nodes.push(node);
        }
        let port = free_port()?;
        std::fs::write(dir.join("haproxy.cfg"), haproxy_config(port, &nodes))?;
        let haproxy = Command::new("/usr/sbin/haproxy")
            .args(["-db", "-f"])
            .arg(dir.join("haproxy.cfg"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("haproxy.log"))?)
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .context("starting haproxy")?;
        let mut cluster = HaCluster {
            dir,
            replication,
            etcd,
            haproxy,
            nodes,
            port,
            http: reqwest::Client::new(),
            owner,
        };
        // The first node bootstraps alone; the second clones it.
        cluster.start_node(0)?;
        let deadline = Instant::now() + START_TIMEOUT;
        while cluster.primary().await != Some(0) {
            cluster.check_alive()?;
            if Instant::now() > deadline {
                bail!(
                    "pg0 did not become primary within {}s; see {}",
                    START_TIMEOUT.as_secs(),
                    cluster.dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        cluster.start_node(1)?;
        cluster.wait_standby(1, deadline).await?;
        Ok(cluster)
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Ok(Some(status)) = self.etcd.try_wait() {
            bail!(
                "etcd exited ({status}); see {}",
                self.dir.join("etcd.log").display()
            );
        }
        if let Ok(Some(status)) = self.haproxy.try_wait() {
            bail!(
                "haproxy exited ({status}); see {}",
                self.dir.join("haproxy.log").display()
            );
        }
        Ok(())
    }

    /// Starts node `i`'s Patroni (which starts, clones or rewinds its
    /// PostgreSQL as needed).
    pub fn start_node(&mut self, i: usize) -> Result<()> {
        let node = &mut self.nodes[i];
        let log = std::fs::File::create(node.dir.join(format!(
            "patroni-{}.log",
            chrono::Utc::now().format("%H%M%S%3f")
        )))?;
        let child = Command::new("/usr/bin/patroni")
            .arg(node.dir.join("patroni.yml"))
            .current_dir(&node.dir)
            .env("HOME", &node.dir)
            .env_remove("PGHOST")
            .env_remove("PGPORT")
            .env_remove("PGUSER")
            .env_remove("DATABASE_URL")
            .uid(self.owner.0.as_raw())
            .gid(self.owner.1.as_raw())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting patroni for {}", node.name))?;
        node.patroni = Some(child);
        Ok(())
    }

    /// kill -9 of node `i` as a machine dying: its Patroni, its postmaster
    /// and every process of that postmaster at once (a stopped WAL sender
    /// would never notice its postmaster's death, and would keep the node
    /// from starting again). Killing PostgreSQL alone would not do: Patroni
    /// would restart it in place.
    pub async fn kill_node(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let postmaster = node.postmaster();
        let children = postmaster.map(children_of).unwrap_or_default();
        if let Some(mut child) = node.patroni.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        for pid in postmaster.into_iter().chain(children) {
            let _ = kill(pid, Signal::SIGKILL);
        }
    }

    /// Which node's Patroni says it is the primary (`GET /primary` = 200).
    pub async fn primary(&self) -> Option<usize> {
        for (i, node) in self.nodes.iter().enumerate() {
            let url = format!("http://127.0.0.1:{}/primary", node.rest_port);
            if let Ok(r) = self
                .http
                .get(&url)
                .timeout(Duration::from_millis(500))
                .send()
                .await
                && r.status().is_success()
            {
                return Some(i);
            }
        }
        None
    }

    /// Waits until node `i` is the primary; answers when it became so.
    pub async fn wait_primary(&self, i: usize, within: Duration) -> Option<Instant> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.primary().await == Some(i) {
                return Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// Waits until node `i` streams from the primary and Patroni counts it
    /// as a standby it can fail over to: in sync mode, the synchronous
    /// standby recorded in etcd (`GET /sync` = 200). PostgreSQL's own
    /// `pg_stat_replication` says `sync` a moment before Patroni records
    /// it, and a primary lost in between is not failed over at all: Patroni
    /// promotes only the standby it knows had every commit.
    pub async fn wait_standby(&self, i: usize, deadline: Instant) -> Result<()> {
        let (want, check) = match self.replication {
            Replication::Sync => ("sync", "sync"),
            Replication::Async => ("async", "replica"),
        };
        loop {
            let state: Option<String> = async {
                let mut conn = PgConnection::connect_with(&self.connect_options("postgres"))
                    .await
                    .ok()?;
                sqlx::query_scalar(
                    "SELECT sync_state FROM pg_stat_replication
                      WHERE application_name = $1 AND state = 'streaming'",
                )
                .bind(&self.nodes[i].name)
                .fetch_optional(&mut conn)
                .await
                .ok()
                .flatten()
            }
            .await;
            let url = format!("http://127.0.0.1:{}/{check}", self.nodes[i].rest_port);
            let patroni = match self
                .http
                .get(&url)
                .timeout(Duration::from_millis(500))
                .send()
                .await
            {
                Ok(r) => r.status().is_success(),
                Err(_) => false,
            };
            if state.as_deref() == Some(want) && patroni {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} is not a streaming {want} standby (pg_stat_replication: {state:?}, \
                     Patroni's /{check}: {patroni}); see {}",
                    self.nodes[i].name,
                    self.nodes[i].dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The pid of the primary's WAL sender streaming to node `i`.
    pub async fn wal_sender_to(&self, i: usize) -> Option<Pid> {
        let mut conn = PgConnection::connect_with(&self.connect_options("postgres"))
            .await
            .ok()?;
        let pid: Option<i32> =
            sqlx::query_scalar("SELECT pid FROM pg_stat_replication WHERE application_name = $1")
                .bind(&self.nodes[i].name)
                .fetch_optional(&mut conn)
                .await
                .ok()
                .flatten();
        pid.map(Pid::from_raw)
    }

    /// Sets node `i`'s clock offset (libfaketime re-reads the file every
    /// second), e.g. `+0.25` or `-1`: seconds.
    pub fn set_skew(&mut self, i: usize, ms: i64) -> Result<()> {
        let secs = ms as f64 / 1000.0;
        std::fs::write(self.nodes[i].skew_file(), format!("{secs:+}\n"))?;
        self.nodes[i].skew_ms = ms;
        Ok(())
    }

    /// Node `i`'s clock offset as last set, in ms.
    pub fn skew_ms(&self, i: usize) -> i64 {
        self.nodes[i].skew_ms
    }

    /// How far node `i`'s `now()` is from this machine's clock, in ms.
    pub async fn clock_offset_ms(&self, i: usize) -> Option<f64> {
        let mut conn = PgConnection::connect_with(&self.node_options(i, "postgres"))
            .await
            .ok()?;
        let before = chrono::Utc::now();
        let theirs: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&mut conn)
            .await
            .ok()?;
        let after = chrono::Utc::now();
        let mid = before + (after - before) / 2;
        Some((theirs - mid).num_microseconds()? as f64 / 1000.0)
    }

    pub fn node_name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// Connection options through HAProxy (the current primary).
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        options(self.port, database)
    }

    /// Connection options to node `i` itself.
    fn node_options(&self, i: usize, database: &str) -> PgConnectOptions {
        options(self.nodes[i].pg_port, database)
    }

    /// HAProxy's address, for a relay in front of it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Drops database `name` if it exists and creates it anew, on the primary.
    pub async fn recreate_database(&self, name: &str) -> Result<()> {
        let mut conn = PgConnection::connect_with(&self.connect_options("postgres"))
            .await
            .context("connecting to the primary through HAProxy")?;
        sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .execute(&mut conn)
            .await?;
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut conn)
            .await?;
        Ok(())
    }

    /// Stops everything: both nodes' Patroni and PostgreSQL, HAProxy, etcd.
    pub async fn stop(mut self) {
        for i in 0..self.nodes.len() {
            let postmaster = self.nodes[i].postmaster();
            if let Some(child) = &self.nodes[i].patroni
                && let Some(pid) = child.id()
            {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
            if let Some(mut child) = self.nodes[i].patroni.take()
                && tokio::time::timeout(Duration::from_secs(20), child.wait())
                    .await
                    .is_err()
            {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
            if let Some(pid) = postmaster {
                // Patroni stops its PostgreSQL; one left behind is ended.
                if kill(pid, None).is_ok() {
                    let _ = kill(pid, Signal::SIGQUIT);
                }
            }
        }
        let _ = self.haproxy.start_kill();
        let _ = self.haproxy.wait().await;
        let _ = self.etcd.start_kill();
        let _ = self.etcd.wait().await;
    }
}

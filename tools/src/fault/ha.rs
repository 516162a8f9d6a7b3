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

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, User};
use serde::Serialize;
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgSslMode};
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

/// Kills what an earlier run left running in `dir` (a harness killed
/// before it could stop its cluster): every process whose command line
/// names the folder (etcd, Patroni, HAProxy, and PostgreSQL, whose config
/// file lies in it).
fn kill_leftovers(dir: &Path) {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id() as i32;
    for pid in processes() {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if pid != me && String::from_utf8_lossy(&cmdline).contains(&needle) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    // Give the kernel a moment to release their ports and shared memory.
    std::thread::sleep(Duration::from_millis(300));
}

/// The processes whose parent is `parent`.
fn children_of(parent: Pid) -> Vec<Pid> {
    processes()
        .filter(|pid| {
            // `pid (comm) state ppid …`; comm may hold spaces: split after ')'.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let (_, rest) = stat.rsplit_once(')')?;
                    rest.split_whitespace().nth(1)?.parse::<i32>().ok()
                })
                == Some(parent.as_raw())
        })
        .map(Pid::from_raw)
        .collect()
}

/// Every process's pid, from `/proc`.
fn processes() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
}

fn options(port: u16, database: &str) -> PgConnectOptions {
    PgConnectOptions::new_without_pgpass()
        .host("127.0.0.1")
        .port(port)
        .username(SUPERUSER)
        .database(database)
        .ssl_mode(PgSslMode::Disable)
        .application_name("leasekeeper-chaos")
}

fn chown_tree(path: &Path, owner: (nix::unistd::Uid, nix::unistd::Gid)) -> Result<()> {
    // lchown: the links in `bin/` point at the system's binaries, which
    // must keep their owner.
    std::os::unix::fs::lchown(path, Some(owner.0.as_raw()), Some(owner.1.as_raw()))?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), owner)?;
        }
    }
    Ok(())
}

/// A `bin/` folder whose `postgres` runs the real one under libfaketime
/// (offset from the node's `skew` file); the other binaries are links.
fn write_postgres_wrapper(node: &Node) -> Result<()> {
    use std::os::unix::fs::{PermissionsExt, symlink};
    let bin = node.dir.join("bin");
    for entry in std::fs::read_dir(PG_BIN)? {
        let entry = entry?;
        if entry.file_name() != "postgres" {
            symlink(entry.path(), bin.join(entry.file_name()))?;
        }
    }
    let wrapper = bin.join("postgres");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n\
             # PostgreSQL under libfaketime: the clock offset comes from {skew}\n\
             export LD_PRELOAD={LIBFAKETIME}\n\
             export FAKETIME_TIMESTAMP_FILE={skew}\n\
             export FAKETIME_CACHE_DURATION=1\n\
             export FAKETIME_DONT_FAKE_MONOTONIC=1\n\
             export DONT_FAKE_MONOTONIC=1\n\
             exec {PG_BIN}/postgres \"$@\"\n",
            skew = node.skew_file().display()
        ),
    )?;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn patroni_config(node: &Node, etcd_port: u16, replication: Replication) -> String {
    let sync = replication == Replication::Sync;
    format!(
        r#"scope: leasekeeper-chaos
name: {name}
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    # Fast failover on one machine: the leader key lives 5 s, each node
    # looks every second, and etcd and PostgreSQL calls give up after 2 s
    # (Patroni wants loop_wait + 2 x retry_timeout <= ttl).
    ttl: 5
    loop_wait: 1
    retry_timeout: 2
    maximum_lag_on_failover: 1048576
    synchronous_mode: {sync}
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        synchronous_commit: "on"
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        max_connections: 200
  initdb:
    - encoding: UTF8
    - locale: C
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {dir}/pgpass
  remove_data_directory_on_rewind_failure: true
  authentication:
    superuser:
      username: {SUPERUSER}
      password: leasekeeper
    replication:
      username: replicator
      password: replicator
    rewind:
      username: {SUPERUSER}
      password: leasekeeper
  parameters:
    unix_socket_directories: {dir}
tags:
  nofailover: false
  noloadbalance: false
"#,
        name = node.name,
        rest = node.rest_port,
        pg = node.pg_port,
        data = node.data_dir().display(),
        bin = node.dir.join("bin").display(),
        dir = node.dir.display(),
    )
}

fn haproxy_config(port: u16, nodes: &[Node]) -> String {
    let mut servers = String::new();
    for node in nodes {
        servers.push_str(&format!(
            "    server {} 127.0.0.1:{} maxconn 500 check port {}\n",
            node.name, node.pg_port, node.rest_port
        ));
    }
    format!(
        "global\n    maxconn 1000\n\n\
         defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30m\n    timeout server 30m\n    timeout check 1s\n\n\
         listen primary\n    bind 127.0.0.1:{port}\n    option httpchk OPTIONS /primary\n    http-check expect status 200\n    \
         default-server inter 500ms fall 2 rise 1 on-marked-down shutdown-sessions\n{servers}"
    )
}

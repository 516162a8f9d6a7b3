//! The processes of one round: `leasekeeper serve` instances behind their
//! answer-losing proxies and in front of their database links (which a
//! partition cuts), and `leasekeeper worker` processes writing their
//! history, started, signalled, replaced and stopped by the harness.
//!
//! Every run is locked, as a deployment on a network is: the instances get
//! an admin token and a worker token drawn for the run ([`Tokens`]), the
//! workers present the worker token (half of them from the environment,
//! half from `--token-file`), and the harness's own reads carry it too.

use super::{cut, proxy};
use anyhow::{Context, Result, bail};
use leasekeeper_core::db::Schema;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The credentials of a run, drawn at random for it (never printed).
#[derive(Clone)]
pub(super) struct Tokens {
    pub(super) admin: String,
    pub(super) worker: String,
    /// A file holding `worker`, for `leasekeeper worker --token-file`.
    pub(super) worker_file: PathBuf,
}

impl Tokens {
    /// Two fresh tokens; the worker's also written to a file in `dir`,
    /// readable by its owner only.
    pub(super) fn draw(dir: &std::path::Path) -> Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let draw = |prefix: &str| {
            let tail: String = rand::Rng::sample_iter(rand::rng(), rand::distr::Alphanumeric)
                .take(32)
                .map(char::from)
                .collect();
            format!("{prefix}-{tail}")
        };
        let worker = draw("chaos-worker");
        let worker_file = dir.join("worker-token");
        std::fs::write(&worker_file, format!("{worker}\n"))?;
        std::fs::set_permissions(&worker_file, std::fs::Permissions::from_mode(0o600))?;
        Ok(Tokens {
            admin: draw("chaos-admin"),
            worker,
            worker_file,
        })
    }

    /// `Authorization: Bearer <worker token>`, for the harness's own requests.
    fn header(&self) -> Result<reqwest::header::HeaderMap> {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {}", self.worker))?;
        value.set_sensitive(true);
        Ok([(reqwest::header::AUTHORIZATION, value)]
            .into_iter()
            .collect())
    }

    /// A client whose every request carries the worker token.
    pub(super) fn client(&self) -> Result<reqwest::Client> {
        Ok(reqwest::Client::builder()
            .default_headers(self.header()?)
            .build()?)
    }
}

/// A worker without the run's token (`leasekeeper worker` with none, or a
/// made-up one): the server must refuse it before touching the database,
/// and it must exit on its own, naming the 401.
pub(super) struct Intruder {
    pub(super) id: String,
    pub(super) child: Child,
    pub(super) history: PathBuf,
    pub(super) log: PathBuf,
}

/// Simulated workers in each `leasekeeper serve` instance.
const INSTANCE_WORKERS: u32 = 1;
/// Tasks each of them may claim ahead.
const INSTANCE_PREFETCH: u32 = 2;

pub(super) struct Instance {
    pub(super) port: u16,
    pub(super) proxy: proxy::Proxy,
    /// Its link to the database (a restarted instance keeps it).
    pub(super) link: cut::Cut,
    pub(super) child: Child,
    /// When a cut link is to be healed.
    pub(super) heal_at: Option<Instant>,
    /// When a paused instance is to be continued.
    pub(super) resume_at: Option<Instant>,
}

pub(super) struct WorkerProc {
    pub(super) id: String,
    pub(super) child: Child,
    /// The instance it works for.
    pub(super) slot: usize,
    pub(super) trust: bool,
    /// When a paused worker is to be continued.
    pub(super) resume_at: Option<Instant>,
}

/// The processes of one round.
pub(super) struct Rig {
    pub(super) dir: PathBuf,
    /// The round's database (reached through each instance's link).
    pub(super) database: String,
    /// The schema of the round's tables, the harness's and its servers'.
    pub(super) schema: Schema,
    pub(super) config: PathBuf,
    pub(super) instances: Vec<Instance>,
    pub(super) workers: Vec<WorkerProc>,
    /// Worker processes started so far (names them).
    pub(super) spawned: usize,
    /// Every worker started this round, and whether it trusts its claims.
    pub(super) all_workers: Vec<(String, bool)>,
    /// The lease TTL of every process.
    pub(super) ttl: Duration,
    pub(super) instance_starts: usize,
    /// Sends the worker token with every request.
    pub(super) http: reqwest::Client,
    /// The run's credentials.
    pub(super) tokens: Tokens,
}

fn pid(child: &Child) -> Option<Pid> {
    child.id().map(|id| Pid::from_raw(id as i32))
}

pub(super) fn signal(child: &Child, sig: Signal) {
    if let Some(pid) = pid(child) {
        let _ = kill(pid, sig);
    }
}

pub(super) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Rig {
    fn base_command(&self, log: &str) -> Result<Command> {
        let mut cmd = crate::dashboard_command()?;
        cmd.env("LEASEKEEPER_CONFIG", &self.config)
            .env("LEASEKEEPER_SCHEMA", self.schema.as_str())
            .env(
                "LEASEKEEPER_LEASE_TTL_SECS",
                self.ttl.as_secs_f64().to_string(),
            )
            .env("LEASEKEEPER_CHAOS", "0")
            .env("LEASEKEEPER_WORKERS", "0")
            .env("LEASEKEEPER_MAX_ATTEMPTS", "10")
            .env("LEASEKEEPER_GENERATOR_INTERVAL_SECS", "0.5")
            .env("LEASEKEEPER_GENERATOR_MAX_SLEEP_SECS", "1")
            .env_remove("LEASEKEEPER_RENEW_INTERVAL_SECS")
            .env_remove("LEASEKEEPER_HEARTBEAT_INTERVAL_SECS")
            // Each kind of process gets its credentials below, and no other.
            .env_remove("LEASEKEEPER_ADMIN_TOKEN")
            .env_remove("LEASEKEEPER_WORKER_TOKEN")
            .env("RUST_LOG", "warn,sqlx=error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join(log))?)
            .kill_on_drop(true);
        Ok(cmd)
    }

    /// Starts `leasekeeper serve` on `port`, reaching the database through
    /// the link on `link_port` (each start logs to a file of its own).
    pub(super) fn spawn_instance(&mut self, port: u16, link_port: u16) -> Result<Child> {
        self.instance_starts += 1;
        let url = format!(
            "postgres://leasekeeper@127.0.0.1:{link_port}/{}?sslmode=disable",
            self.database
        );
        self.base_command(&format!("instance-{port}-{}.log", self.instance_starts))?
            .args(["serve", "--addr", &format!("127.0.0.1:{port}")])
            .env("DATABASE_URL", url)
            // A prefetching fleet among the workers: one simulated worker
            // per instance claiming up to two tasks ahead into its local
            // queue, so an instance killed or paused takes running and
            // waiting claims down with it, and waits past the bound give
            // tasks back, all under the same checks.
            .env("LEASEKEEPER_WORKERS", INSTANCE_WORKERS.to_string())
            .env("LEASEKEEPER_PREFETCH", INSTANCE_PREFETCH.to_string())
            // Its tasks take 0.8 s on average: a local queue is only as
            // deep as its worker starts within half the wait, so a wait of
            // 5 s keeps both claims ahead (with 1 s, none).
            .env("LEASEKEEPER_PREFETCH_WAIT_SECS", "5")
            .env("LEASEKEEPER_ADMIN_TOKEN", &self.tokens.admin)
            .env("LEASEKEEPER_WORKER_TOKEN", &self.tokens.worker)
            .spawn()
            .context("starting leasekeeper serve")
    }

    pub(super) fn spawn_worker(&mut self, slot: usize) -> Result<()> {
        let n = self.spawned;
        self.spawned += 1;
        let id = format!("chaos-w{n}");
        let trust = n.is_multiple_of(2);
        let server = format!("http://127.0.0.1:{}", self.instances[slot].proxy.port);
        let history = self.dir.join(format!("{id}.jsonl"));
        let mut cmd = self.base_command(&format!("{id}.log"))?;
        cmd.args(["worker", "--server", &server, "--id", &id, "--history"])
            .arg(&history);
        if trust {
            cmd.arg("--trust-claims");
        }
        // Both ways a worker is given its token.
        if n % 4 < 2 {
            cmd.env("LEASEKEEPER_WORKER_TOKEN", &self.tokens.worker);
        } else {
            cmd.arg("--token-file").arg(&self.tokens.worker_file);
        }
        let child = cmd.spawn().context("starting leasekeeper worker")?;
        self.all_workers.push((id.clone(), trust));
        self.workers.push(WorkerProc {
            id,
            child,
            slot,
            trust,
            resume_at: None,
        });
        Ok(())
    }

    /// Starts a worker named `id` for instance `slot` presenting `token`
    /// (none when `None`), which the server must refuse: its history and
    /// log are kept apart from the round's workers'.
    pub(super) fn spawn_intruder(
        &self,
        slot: usize,
        id: &str,
        token: Option<&str>,
    ) -> Result<Intruder> {
        let server = format!("http://127.0.0.1:{}", self.instances[slot].port);
        let history = self.dir.join(format!("{id}.history"));
        let log = self.dir.join(format!("{id}.log"));
        let mut cmd = self.base_command(&format!("{id}.log"))?;
        cmd.args(["worker", "--server", &server, "--id", id, "--history"])
            .arg(&history);
        if let Some(token) = token {
            cmd.env("LEASEKEEPER_WORKER_TOKEN", token);
        }
        let child = cmd
            .spawn()
            .context("starting an intruding leasekeeper worker")?;
        Ok(Intruder {
            id: id.to_string(),
            child,
            history,
            log,
        })
    }

    /// Whether instance `port` answers a database-backed request.
    pub(super) async fn answers(&self, port: u16) -> bool {
        let url = format!("http://127.0.0.1:{port}/api/generator/status");
        matches!(
            self.http.get(&url).timeout(Duration::from_secs(2)).send().await,
            Ok(r) if r.status().is_success()
        )
    }

    /// Instance `port`'s own generator state, from memory (`/healthz`
    /// reads nothing from the database, so it answers during a partition).
    pub(super) async fn local_generator(&self, port: u16) -> Option<String> {
        let url = format!("http://127.0.0.1:{port}/healthz");
        let body: serde_json::Value = self
            .http
            .get(&url)
            .timeout(Duration::from_secs(1))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        body["generator"].as_str().map(str::to_string)
    }

    pub(super) async fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for instance in &self.instances {
            while !self.answers(instance.port).await {
                if Instant::now() > deadline {
                    bail!(
                        "instance on port {} did not start; see {}",
                        instance.port,
                        self.dir.display()
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Continues every paused worker and instance whose pause is over, and
    /// heals every cut link whose partition is over (all with `force`).
    pub(super) fn resume_due(&mut self, force: bool) {
        let now = Instant::now();
        for i in &mut self.instances {
            if i.heal_at.is_some_and(|at| force || at <= now) {
                i.link.heal();
                i.heal_at = None;
            }
            if i.resume_at.is_some_and(|at| force || at <= now) {
                signal(&i.child, Signal::SIGCONT);
                i.resume_at = None;
            }
        }
        for w in &mut self.workers {
            if w.resume_at.is_some_and(|at| force || at <= now) {
                signal(&w.child, Signal::SIGCONT);
                w.resume_at = None;
            }
        }
    }

    /// Stops every process: SIGTERM, then SIGKILL after 10 s.
    pub(super) async fn shutdown(&mut self) {
        self.resume_due(true);
        let mut children: Vec<&mut Child> = self
            .workers
            .iter_mut()
            .map(|w| &mut w.child)
            .chain(self.instances.iter_mut().map(|i| &mut i.child))
            .collect();
        for child in &children {
            signal(child, Signal::SIGTERM);
        }
        for child in &mut children {
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
    }
}

/// Replaces worker processes that died on their own (none should).
pub(super) fn reap(rig: &mut Rig) -> Result<()> {
    let mut dead = Vec::new();
    for (i, w) in rig.workers.iter_mut().enumerate() {
        if let Ok(Some(status)) = w.child.try_wait() {
            tracing::warn!(worker = %w.id, %status, "a worker process exited by itself");
            dead.push(i);
        }
    }
    for i in dead.into_iter().rev() {
        let w = rig.workers.remove(i);
        rig.spawn_worker(w.slot)?;
    }
    Ok(())
}

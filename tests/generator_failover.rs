//! Generator failover between real processes: two `leasekeeper serve`
//! instances on one shared embedded cluster. Start the generator through
//! one, stop it through the non-holder, start it again, SIGKILL the holder,
//! and watch the other take over after the TTL with no operator action.
//!
//! The same two processes also run behind PgBouncer in transaction mode
//! (`LEASEKEEPER_POOLER=transaction`, the liveness session and `LISTEN` on
//! `LEASEKEEPER_DIRECT_DATABASE_URL`): they serve, enqueue, claim, fail
//! over in about a second at the default TTL, and stay live.
//!
//! Everything lives in a fresh folder under `target/` (not /tmp: when the
//! tests run as root, PostgreSQL runs as `postgres` and must reach it); a
//! guard kills the children and stops the cluster whatever happens.
#![cfg(feature = "ssr")]

#[path = "it/terms.rs"]
mod terms;

#[path = "../core/tests/it/bouncer.rs"]
mod bouncer;

use leasekeeper_core::db::embedded::EmbeddedPostgres;
use serde_json::Value;
use sqlx::PgPool;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(2);
/// The default renew interval: TTL / 3.
const RENEW: Duration = Duration::from_millis(667);
/// Slack for polling and a loaded machine.
const SLACK: Duration = Duration::from_secs(1);

/// One `leasekeeper serve` child.
struct Instance {
    port: u16,
    child: Child,
    log: PathBuf,
}

/// The test's folder, cluster and children; cleaned up on drop.
struct Fleet {
    dir: PathBuf,
    /// The cluster, directly.
    url: String,
    /// What the instances are given as their database URL: `url`, or the
    /// pooler's.
    serve_url: String,
    /// A PgBouncer in transaction mode between the instances and the
    /// cluster, when the fleet runs behind one.
    bouncer: Option<bouncer::Bouncer>,
    instances: Vec<Instance>,
}

impl Fleet {
    /// Two instances on one cluster, directly connected.
    async fn start() -> Self {
        Fleet::start_with(false).await
    }

    /// The same, `behind_pooler` through PgBouncer in transaction mode.
    async fn start_with(behind_pooler: bool) -> Self {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join(format!("tmp-failover-test-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).expect("creating the test folder");
        // The guard exists before the cluster does, so a failed start is cleaned up too.
        let mut fleet = Fleet {
            dir: dir.clone(),
            url: String::new(),
            serve_url: String::new(),
            bouncer: None,
            instances: Vec::new(),
        };
        let cluster = EmbeddedPostgres::start(&dir.join("pg"))
            .await
            .expect("starting the shared cluster");
        cluster
            .ensure_database("leasekeeper")
            .await
            .expect("creating the database");
        fleet.url = cluster.url("leasekeeper");
        fleet.serve_url = fleet.url.clone();
        if behind_pooler {
            let server = cluster.connect_options("leasekeeper");
            let bouncer = bouncer::Bouncer::start(&server);
            fleet.serve_url = format!(
                "postgres://{}@127.0.0.1:{}/leasekeeper?sslmode=disable",
                server.get_username(),
                bouncer.port
            );
            fleet.bouncer = Some(bouncer);
        }
        // Defaults only: Leptos.toml's renew interval does not fit a 2 s TTL.
        std::fs::write(dir.join("settings.toml"), "").expect("writing the settings file");
        fleet
    }

    fn spawn(&mut self) -> usize {
        self.spawn_with(&[])
    }

    /// An instance with `env` over the test's settings.
    fn spawn_with(&mut self, env: &[(&str, &str)]) -> usize {
        let port = free_port();
        let log = self.dir.join(format!("instance-{port}.log"));
        let out = std::fs::File::create(&log).expect("creating a log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasekeeper"));
        command
            .args(["serve", "--addr", &format!("127.0.0.1:{port}")])
            .env("DATABASE_URL", &self.serve_url)
            .env_remove("LEASEKEEPER_POOLER")
            .env_remove("LEASEKEEPER_DIRECT_DATABASE_URL")
            .env("LEASEKEEPER_CONFIG", self.dir.join("settings.toml"))
            .env_remove("LEASEKEEPER_SCHEMA")
            .env("LEASEKEEPER_WORKERS", "0")
            .env("LEASEKEEPER_CHAOS", "0")
            .env("LEASEKEEPER_LEASE_TTL_SECS", TTL.as_secs().to_string())
            .env("LEASEKEEPER_GENERATOR_INTERVAL_SECS", "0.2")
            .env_remove("LEASEKEEPER_RENEW_INTERVAL_SECS")
            .env_remove("LEASEKEEPER_HEARTBEAT_INTERVAL_SECS")
            .env("RUST_LOG", "info,leasekeeper=debug,sqlx=warn");
        if self.bouncer.is_some() {
            command
                .env("LEASEKEEPER_POOLER", "transaction")
                .env("LEASEKEEPER_DIRECT_DATABASE_URL", &self.url);
        }
        command.envs(env.iter().copied());
        let child = command
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("starting leasekeeper serve");
        self.instances.push(Instance { port, child, log });
        self.instances.len() - 1
    }

    async fn pool(&self) -> PgPool {
        leasekeeper_core::db::connect(&self.url, &Default::default())
            .await
            .expect("connecting to the shared cluster")
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for instance in &mut self.instances {
            let _ = instance.child.kill();
            let _ = instance.child.wait();
            if std::thread::panicking() {
                let log = std::fs::read_to_string(&instance.log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("---- instance on port {} (last lines) ----", instance.port);
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
        // The pooler goes before the cluster it fronts.
        drop(self.bouncer.take());
        let pg = self.dir.join("pg");
        let stopped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(EmbeddedPostgres::stop(&pg)))
        })
        .join();
        if !matches!(stopped, Ok(Ok(()))) {
            eprintln!("stopping the test cluster failed: {stopped:?}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("finding a free port")
}

/// A minimal HTTP/1.1 request (no client library in the dependencies).
async fn http(port: u16, method: &str, path: &str) -> std::io::Result<(u16, Value)> {
    http_json(port, method, path, None).await
}

/// [`http`] with a JSON body.
async fn http_json(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<(u16, Value)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let (kind, body) = match body {
            Some(body) => ("Content-Type: application/json\r\n", body.to_string()),
            None => ("", String::new()),
        };
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n{kind}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| std::io::Error::other("HTTP request timed out"))??;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {text}")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {head}")))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    let value = serde_json::from_str(&body).unwrap_or(Value::String(body));
    Ok((status, value))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

async fn get(port: u16, path: &str) -> Value {
    let (status, body) = http(port, "GET", path)
        .await
        .unwrap_or_else(|e| panic!("GET {path} on {port}: {e}"));
    assert_eq!(status, 200, "GET {path} on {port}: {body}");
    body
}

/// Polls `check` every 50 ms until it gives a value; panics after `within`.
async fn eventually<T, F, Fut>(within: Duration, what: &str, mut check: F) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return (value, start.elapsed());
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_ready(port: u16) -> String {
    let (id, _) = eventually(Duration::from_secs(60), "instance ready", || async move {
        match http(port, "GET", "/api/generator/status").await {
            Ok((200, status)) => status["answered_by"].as_str().map(str::to_string),
            _ => None,
        }
    })
    .await;
    id
}

/// The holder both instances report, once they agree on a live one.
async fn agreed_holder(ports: &[u16]) -> (String, i64) {
    let mut answers = Vec::new();
    for &port in ports {
        let s = get(port, "/api/generator/status").await;
        answers.push((
            s["holder"].as_str().map(str::to_string),
            s["fencing_token"].as_i64(),
            s["desired"].clone(),
        ));
    }
    assert!(
        answers.windows(2).all(|w| w[0] == w[1]),
        "instances disagree on the generator: {answers:?}"
    );
    let (holder, token, _) = answers.swap_remove(0);
    (
        holder.expect("a live holder"),
        token.expect("a fencing token"),
    )
}

/// How many tasks the term with fencing token `token` generated.
async fn tasks_of(pool: &PgPool, token: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM tasks WHERE (task_data->>'generator_token')::bigint = $1",
    )
    .bind(token)
    .fetch_one(pool)
    .await
    .expect("counting a term's tasks")
}

/// SIGKILLs instance `victim` and waits (at most `within`) until
/// `survivor`, whose id is `survivor_id`, says it holds the generator:
/// answers the new holder, its token, and how long after the kill.
async fn kill_and_wait_for_takeover(
    fleet: &mut Fleet,
    victim: usize,
    survivor: usize,
    survivor_id: &str,
    within: Duration,
) -> (String, i64, Duration) {
    fleet.instances[victim].child.kill().expect("SIGKILL");
    fleet.instances[victim]
        .child
        .wait()
        .expect("reaping the holder");
    let killed = Instant::now();
    let port = fleet.instances[survivor].port;
    let ((holder, token), _) = eventually(within, "takeover", || async {
        holder_on(port).await.filter(|(h, _)| h == survivor_id)
    })
    .await;
    (holder, token, killed.elapsed())
}

async fn holder_on(port: u16) -> Option<(String, i64)> {
    let s = get(port, "/api/generator/status").await;
    Some((
        s["holder"].as_str()?.to_string(),
        s["fencing_token"].as_i64()?,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generator_fails_over_between_processes() {
    let mut fleet = Fleet::start().await;
    let a = fleet.spawn();
    let id_a = wait_ready(fleet.instances[a].port).await;
    let b = fleet.spawn();
    let id_b = wait_ready(fleet.instances[b].port).await;
    let ports = [fleet.instances[a].port, fleet.instances[b].port];
    let id_of = |i: usize| if i == a { &id_a } else { &id_b };
    let pool = fleet.pool().await;

    let instances = get(ports[0], "/api/instances").await;
    let alive: Vec<&str> = instances
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["alive"] == true)
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(alive.len(), 2, "{instances}");
    assert!(alive.contains(&id_a.as_str()) && alive.contains(&id_b.as_str()));

    // Start through B; exactly one instance becomes the holder, and both say so.
    let (status, body) = http(ports[1], "POST", "/api/generator/start")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["desired"], "running");
    eventually(Duration::from_secs(5), "a holder", || holder_on(ports[0])).await;
    let (holder, token) = agreed_holder(&ports).await;
    assert!(holder == id_a || holder == id_b, "{holder}");

    // Stop through the non-holder: the holder releases within a renew interval.
    let non_holder = if holder == id_a { b } else { a };
    let (status, body) = http(
        fleet.instances[non_holder].port,
        "DELETE",
        "/api/generator/stop",
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["desired"], "stopped");
    let (_, took) = eventually(RENEW + SLACK, "release after a remote stop", || async {
        let s = get(ports[0], "/api/generator/status").await;
        s["holder"].is_null().then_some(())
    })
    .await;
    assert!(took <= RENEW + SLACK / 2, "released after {took:?}");

    // Start again, let it generate, then SIGKILL the holder.
    http(ports[1], "POST", "/api/generator/start")
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "a holder again", || {
        holder_on(ports[0])
    })
    .await;
    let (holder, second_token) = agreed_holder(&ports).await;
    assert_eq!(second_token, token + 1);
    eventually(Duration::from_secs(10), "the holder generates", || async {
        (tasks_of(&pool, second_token).await > 0).then_some(())
    })
    .await;
    let victim = if holder == id_a { a } else { b };
    let survivor = if victim == a { b } else { a };
    let (new_holder, new_token, takeover) = kill_and_wait_for_takeover(
        &mut fleet,
        victim,
        survivor,
        id_of(survivor),
        TTL + RENEW + SLACK + SLACK,
    )
    .await;
    let survivor_port = fleet.instances[survivor].port;
    assert!(
        takeover <= TTL + RENEW + SLACK,
        "takeover took {takeover:?}"
    );
    assert_eq!(new_holder, *id_of(survivor));
    assert_eq!(new_token, second_token + 1);
    // The dead instance drops out of the alive list (2 × renew + 1 s).
    eventually(
        Duration::from_secs(6),
        "the killed instance not alive",
        || async {
            let list = get(survivor_port, "/api/instances").await;
            let dead = list
                .as_array()?
                .iter()
                .find(|i| i["id"] == id_of(victim).as_str())?;
            (dead["alive"] == false && dead["stopped_at"].is_null()).then_some(())
        },
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the survivor generates",
        || async { (tasks_of(&pool, new_token).await > 0).then_some(()) },
    )
    .await;

    // A clean shutdown of the survivor releases the lease and says goodbye.
    let pid = nix::unistd::Pid::from_raw(fleet.instances[survivor].child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let child = &mut fleet.instances[survivor].child;
    let (code, _) = eventually(Duration::from_secs(15), "clean exit", || {
        let exited = child.try_wait().expect("waiting for the survivor");
        async move { exited }
    })
    .await;
    assert!(code.success(), "{code:?}");
    let (released, stopped): (bool, bool) = sqlx::query_as(
        "SELECT (SELECT released_at IS NOT NULL FROM leases WHERE resource = 'singleton:generator'),
                (SELECT stopped_at IS NOT NULL FROM instances WHERE id = $1)",
    )
    .bind(id_of(survivor))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(released, "a clean shutdown releases the generator lease");
    assert!(stopped, "a clean shutdown marks the instance stopped");

    // The history: three terms, never overlapping, and tasks in term order.
    let holders = terms::assert_terms_do_not_overlap(&pool).await;
    assert_eq!(holders.len(), 3, "{holders:?}");
    let rows: Vec<(i64, Value)> = sqlx::query_as("SELECT id, task_data FROM tasks ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    let tasks: Vec<(i64, String, i64)> = rows
        .into_iter()
        .map(|(id, d)| {
            (
                id,
                d["generator"].as_str().unwrap().to_string(),
                d["generator_token"].as_i64().unwrap(),
            )
        })
        .collect();
    assert!(
        tasks.iter().any(|t| t.2 == second_token) && tasks.iter().any(|t| t.2 == new_token),
        "both the killed holder and the survivor generated: {tasks:?}"
    );
    terms::assert_tasks_follow_terms(&tasks, &holders);
    eprintln!(
        "remote stop released after {took:?}; takeover {takeover:?} after SIGKILL; {} tasks over terms {holders:?}",
        tasks.len()
    );
    pool.close().await;
}

async fn count(pool: &PgPool, sql: &str, bind: &str) -> i64 {
    sqlx::query_scalar(sql)
        .bind(bind)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Opens `GET /api/events` on `port` and returns the stream once its
/// `ready` event arrived.
async fn event_stream(port: u16) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connecting to the event stream");
    let request = format!(
        "GET /api/events?topics=tasks HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    read_until(&mut stream, "event: ready", Duration::from_secs(5)).await;
    stream
}

/// Reads `stream` until `wanted` arrives; panics after `within`.
async fn read_until(stream: &mut tokio::net::TcpStream, wanted: &str, within: Duration) {
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    while !seen.contains(wanted) {
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {wanted:?} within {within:?}; the stream said {seen:?}"))
            .expect("reading the event stream");
        assert!(n > 0, "the event stream ended; it said {seen:?}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

/// Behind PgBouncer 1.18 in transaction mode (as hosted poolers run it),
/// with the liveness session and `LISTEN` on the direct URL: two
/// instances answer every REST enqueue and their simulated workers claim
/// and complete through the pooler (none lost, none twice); one instance's
/// event stream hears a change made through the other (only `LISTEN` can
/// carry it); and after a SIGKILL of the generator's holder the survivor
/// takes the singleton over and the dead instance's claims are rescued in
/// about a second at the default TTL of 15 s, because the dead process's
/// liveness session closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_two_instances_serve_claim_stay_live_and_fail_over_in_a_second() {
    let mut fleet = Fleet::start_with(true).await;
    let env = [
        ("LEASEKEEPER_LEASE_TTL_SECS", "15"),
        ("LEASEKEEPER_WORKERS", "2"),
        ("LEASEKEEPER_GENERATOR_MAX_SLEEP_SECS", "1"),
    ];
    let a = fleet.spawn_with(&env);
    let id_a = wait_ready(fleet.instances[a].port).await;
    let b = fleet.spawn_with(&env);
    let id_b = wait_ready(fleet.instances[b].port).await;
    let ports = [fleet.instances[a].port, fleet.instances[b].port];
    let id_of = |i: usize| if i == a { &id_a } else { &id_b };
    // Directly, for the test's own reads.
    let pool = fleet.pool().await;
    for i in [a, b] {
        let log = std::fs::read_to_string(&fleet.instances[i].log).unwrap();
        assert!(
            log.contains("the liveness session and LISTEN use the direct database URL"),
            "{log}"
        );
        assert_eq!(
            count(
                &pool,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'leasekeeper liveness ' || $1",
                id_of(i),
            )
            .await,
            1,
            "{}'s liveness session",
            id_of(i)
        );
    }

    // Every enqueue answered and kept, through either instance.
    for i in 0..60 {
        let port = ports[i % 2];
        let task = serde_json::json!({"task_data": {"sleep_duration_seconds": 0.1, "n": i}});
        let (status, body) = http_json(port, "POST", "/api/tasks", Some(&task))
            .await
            .unwrap_or_else(|e| panic!("enqueue {i} through {port}: {e}"));
        assert_eq!(status, 201, "enqueue {i} through {port}: {body}");
    }
    let ours =
        "SELECT count(*) FROM tasks WHERE task_data ->> 'n' IS NOT NULL AND status::text LIKE $1";
    assert_eq!(count(&pool, ours, "%").await, 60);
    eventually(Duration::from_secs(60), "all 60 processed", || async {
        (count(&pool, ours, "processed").await == 60).then_some(())
    })
    .await;
    for i in [a, b] {
        assert!(
            count(
                &pool,
                "SELECT count(*) FROM tasks WHERE task_data ->> 'n' IS NOT NULL AND processor LIKE $1 || '-%'",
                id_of(i),
            )
            .await
                > 0,
            "{}'s workers claimed through the pooler",
            id_of(i)
        );
    }

    // Live: B's stream hears a task enqueued through A.
    let mut stream = event_stream(ports[1]).await;
    let task = serde_json::json!({"task_data": {"sleep_duration_seconds": 0}});
    let (status, body) = http_json(ports[0], "POST", "/api/tasks", Some(&task))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    read_until(&mut stream, "event: change", Duration::from_secs(3)).await;
    drop(stream);

    // The generator, held through the pooler, moves about a second after
    // its holder is killed (its liveness session closed), not after 15 s.
    let (status, body) = http(ports[1], "POST", "/api/generator/start")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    eventually(Duration::from_secs(5), "a holder", || holder_on(ports[0])).await;
    let (holder, token) = agreed_holder(&ports).await;
    eventually(Duration::from_secs(10), "the holder generates", || async {
        (tasks_of(&pool, token).await > 0).then_some(())
    })
    .await;
    let victim = if holder == id_a { a } else { b };
    let survivor = if victim == a { b } else { a };
    // Busy: the victim's workers hold claims when it dies.
    eventually(
        Duration::from_secs(10),
        "the victim's workers busy",
        || async {
            (count(
                &pool,
                "SELECT count(*) FROM tasks WHERE status = 'started' AND processor LIKE $1 || '-%'",
                id_of(victim),
            )
            .await
                > 0)
            .then_some(())
        },
    )
    .await;
    let (new_holder, new_token, takeover) = kill_and_wait_for_takeover(
        &mut fleet,
        victim,
        survivor,
        id_of(survivor),
        Duration::from_secs(10),
    )
    .await;
    let survivor_port = fleet.instances[survivor].port;
    assert!(
        takeover < Duration::from_secs(5),
        "the generator moved {takeover:?} after the kill: by the TTL (15 s), not by the closed session"
    );
    assert_eq!(
        (new_holder.as_str(), new_token),
        (id_of(survivor).as_str(), token + 1)
    );
    // The dead instance's claims were ended by its closed session.
    eventually(Duration::from_secs(5), "the victim's claims ended", || async {
        (count(
            &pool,
            "SELECT count(*) FROM lease_events WHERE kind = 'session_ended' AND holder LIKE $1 || '-%'",
            id_of(victim),
        )
        .await
            > 0)
        .then_some(())
    })
    .await;

    // Stop generating; every task ends processed, each completed once.
    let (status, body) = http(survivor_port, "DELETE", "/api/generator/stop")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    eventually(Duration::from_secs(60), "every task processed", || async {
        (count(
            &pool,
            "SELECT count(*) FROM tasks WHERE status::text <> $1",
            "processed",
        )
        .await
            == 0)
            .then_some(())
    })
    .await;
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM (SELECT resource FROM lease_events
                                    WHERE resource LIKE $1 AND kind = 'released'
                                    GROUP BY resource HAVING count(*) > 1) twice",
            "task:%",
        )
        .await,
        0,
        "a task completed twice"
    );
    let holders = terms::assert_terms_do_not_overlap(&pool).await;
    assert_eq!(holders.len(), 2, "{holders:?}");
    eprintln!("behind the pooler: the generator moved {takeover:?} after SIGKILL (TTL 15 s)");
    pool.close().await;
}

//! Test harness: a real PostgreSQL server and a fresh database per test,
//! from the library's harness (`leasekeeper_core::db::testing`, shared with
//! its doc-tests and both crates' integration tests): the server is
//! `LEASEKEEPER_TEST_DATABASE_URL` when set, otherwise the embedded cluster
//! in `target/leasekeeper-test-db`, started on first use and left running.

pub use leasekeeper_core::db::testing::{TestDb, event_kinds, holder, resource};

/// A real `leasekeeper serve` process over a test database, on a free
/// loopback port, with no simulated workers, no chaos and none of the
/// caller's tokens (unless `env` sets them); killed when dropped. For the
/// tests that must see the server from outside (its memory, its first
/// scrape, a worker process against it).
pub struct Served {
    /// The process.
    pub child: tokio::process::Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
}

impl Served {
    /// Starts it over `db` with `env` on top, and waits (up to 60 s) until
    /// `/healthz` answers.
    pub async fn start(db: &TestDb, env: &[(&str, &str)]) -> Served {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasekeeper"));
        cmd.arg("serve")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("LEASEKEEPER_WORKER_TOKEN")
            .env_remove("LEASEKEEPER_ADMIN_TOKEN")
            .env("DATABASE_URL", db.url())
            .env("LEPTOS_SITE_ADDR", format!("127.0.0.1:{port}"))
            .env("LEASEKEEPER_WORKERS", "0")
            .env("LEASEKEEPER_CHAOS", "0")
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        let child = cmd.spawn().expect("starting leasekeeper serve");
        let served = Served {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let client = reqwest::Client::new();
        let started = std::time::Instant::now();
        while !client
            .get(format!("{}/healthz", served.base))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "leasekeeper serve did not answer /healthz within 60 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        served
    }

    /// The process id (for its `/proc` figures).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the server is running")
    }
}

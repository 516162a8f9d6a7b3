//! A PgBouncer 1.18 in transaction mode in front of a test server,
//! configured as hosted poolers commonly are (`pool_mode = transaction`,
//! `ignore_startup_parameters = extra_float_digits, options`, fewer server
//! connections than clients). Shared by the library's pooler test and the
//! dashboard's (`tests/generator_failover.rs` includes this file by path).
#![allow(
    dead_code,
    reason = "included by path into test crates that use only part of it"
)]

use sqlx::postgres::{PgConnectOptions, PgSslMode};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PGBOUNCER: &str = "/usr/sbin/pgbouncer";
/// Server connections per database and user: fewer than the clients, so
/// transactions of different clients share server connections.
const SERVER_CONNECTIONS: usize = 4;

/// A PgBouncer in transaction mode in front of the test server, stopped on
/// drop.
pub struct Bouncer {
    child: Child,
    dir: PathBuf,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
}

impl Bouncer {
    pub fn start(server: &PgConnectOptions) -> Bouncer {
        assert!(
            std::path::Path::new(PGBOUNCER).exists(),
            "{PGBOUNCER} is missing: `bash .ci/setup` installs Debian's pgbouncer"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("lk-pgbouncer-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // PgBouncer refuses to run as root; as root it runs as `postgres`,
        // which must be able to write its log here.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let host = match server.get_socket() {
            Some(socket_dir) => socket_dir.display().to_string(),
            None => server.get_host().to_string(),
        };
        let ini = format!(
            "[databases]\n\
             * = host={host} port={server_port} user={user}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = any\n\
             pool_mode = transaction\n\
             ignore_startup_parameters = extra_float_digits, options\n\
             default_pool_size = {SERVER_CONNECTIONS}\n\
             max_client_conn = 500\n\
             server_reset_query =\n\
             logfile = {dir}/pgbouncer.log\n\
             pidfile = {dir}/pgbouncer.pid\n",
            server_port = server.get_port(),
            user = server.get_username(),
            dir = dir.display(),
        );
        let ini_path = dir.join("pgbouncer.ini");
        std::fs::write(&ini_path, ini).unwrap();
        let mut cmd = if nix::unistd::geteuid().is_root() {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--", PGBOUNCER]);
            cmd
        } else {
            Command::new(PGBOUNCER)
        };
        let child = cmd
            .arg(&ini_path)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting pgbouncer");
        let bouncer = Bouncer { child, dir, port };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "pgbouncer did not start: {}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        bouncer
    }

    /// Options for `database` through the pooler.
    pub fn options(&self, server: &PgConnectOptions) -> PgConnectOptions {
        PgConnectOptions::new_without_pgpass()
            .host("127.0.0.1")
            .port(self.port)
            .username(server.get_username())
            .database(server.get_database().expect("a test database"))
            .ssl_mode(PgSslMode::Disable)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        // runuser passes SIGTERM on to pgbouncer.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

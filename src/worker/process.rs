//! `leasekeeper worker --server URL`: the worker loop as a separate process,
//! over the REST API of an instance, until SIGINT or SIGTERM.
//!
//! A graceful stop gives the current task back (as a failed attempt, soon
//! retried). `kill -9` is the real crash: nothing is given back; the
//! worker's session stream to its instance closes, the instance ends its
//! claims at once, and an idle worker takes the task over within a second
//! (without the stream, an older instance or its liveness down, at the end
//! of the lease's TTL). A chaos crash imitates that: the process exits at
//! once with status 1, writing nothing.
//!
//! Its credential, sent as `Authorization: Bearer …` with every request:
//! the token in `--token-file`, else the worker token
//! (`LEASEKEEPER_WORKER_TOKEN`), else the admin token, else none. When the
//! server refuses it (401/403) the process exits with status 1 and a line
//! naming the cause, instead of retrying forever; a task it held is left to
//! its lease, which runs out so that another worker takes it over. The
//! token is never logged.

use crate::settings::{Secret, Settings};
use anyhow::{Context, anyhow, bail};
use leasekeeper_core::lease::Holder;
use leasekeeper_core::queue::ClaimFilter;
use leasekeeper_core::worker::chaos::Chaos;
use leasekeeper_core::worker::http::Http;
use leasekeeper_core::worker::run::{Exit, Worker};
use rand::Rng;
use std::path::Path;

/// A worker id for a process started without `--id`: `worker-<pid>-<hex>`.
pub fn generated_id() -> String {
    let suffix: u16 = rand::rng().random();
    format!("worker-{}-{suffix:04x}", std::process::id())
}

/// Fault-injection options of a worker process (`leasekeeper-tools chaos` uses them).
#[derive(Clone, Debug, Default)]
pub struct FaultOptions {
    /// Append every claim, heartbeat, completion and failure report, with
    /// its outcome, to this file (see [`super::history`]).
    pub history: Option<std::path::PathBuf>,
    /// Never give a claim up on this side (see [`WorkerConfig::trust_claims`]).
    pub trust_claims: bool,
}

/// Where the worker's credential came from, to name it when refused.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Credential {
    /// No token: enough only for a server that requires none.
    None,
    /// `--token-file PATH`.
    File(std::path::PathBuf),
    /// The worker token setting (`LEASEKEEPER_WORKER_TOKEN`).
    WorkerToken,
    /// The admin token setting, for want of a worker token.
    AdminToken,
}

impl Credential {
    /// What was presented, in words.
    fn describe(&self) -> String {
        match self {
            Credential::None => "no token".into(),
            Credential::File(path) => format!("the token in {}", path.display()),
            Credential::WorkerToken => "the worker token (LEASEKEEPER_WORKER_TOKEN)".into(),
            Credential::AdminToken => "the admin token (LEASEKEEPER_ADMIN_TOKEN)".into(),
        }
    }

    /// The one line a refused worker exits with, `why` being the server's
    /// answer (status and reason). A 403 may not be about the token (the
    /// server's reason says what), so its line only says what was shown.
    fn refused(&self, server: &str, why: &str) -> String {
        if why.starts_with("421") {
            return format!(
                "the server at {server} does not answer to that host name ({why}): use its IP \
                 address, or add the name to the server's LEASEKEEPER_ALLOWED_HOSTS"
            );
        }
        if why.starts_with("403") {
            return format!(
                "the server at {server} forbids this worker ({why}); it presented {}",
                self.describe()
            );
        }
        match self {
            Credential::None => format!(
                "the server at {server} requires a worker token ({why}): set \
                 LEASEKEEPER_WORKER_TOKEN or pass --token-file FILE with the server's worker token"
            ),
            Credential::File(path) => format!(
                "the server at {server} refused the token in {} ({why}): the file must hold \
                 the server's worker token (LEASEKEEPER_WORKER_TOKEN)",
                path.display()
            ),
            Credential::WorkerToken => format!(
                "the server at {server} refused the worker token ({why}): set \
                 LEASEKEEPER_WORKER_TOKEN (or --token-file) to the server's worker token"
            ),
            Credential::AdminToken => format!(
                "the server at {server} refused the admin token this worker fell back on \
                 ({why}): set LEASEKEEPER_WORKER_TOKEN (or --token-file) to the server's worker token"
            ),
        }
    }
}

/// The token to present: `--token-file`'s, else the worker token, else the
/// admin token (which passes the worker's routes too), else none.
fn credential(
    settings: &Settings,
    token_file: Option<&Path>,
) -> anyhow::Result<(Option<Secret>, Credential)> {
    if let Some(path) = token_file {
        let token = crate::settings::token_file(path)?;
        return Ok((Some(token), Credential::File(path.to_path_buf())));
    }
    Ok(match (&settings.worker_token, &settings.admin_token) {
        (Some(token), _) => (Some(token.clone()), Credential::WorkerToken),
        (None, Some(token)) => (Some(token.clone()), Credential::AdminToken),
        (None, None) => (None, Credential::None),
    })
}

/// Whether `server`'s host is this machine (a token sent there in clear
/// text does not cross a network).
fn is_loopback(server: &reqwest::Url) -> bool {
    let host = server.host_str().unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Runs one worker named `id` (or a generated name) against the instance at
/// `server` until a signal stops it, presenting the token in `token_file`
/// or the settings' (see [`credential`]).
pub async fn run(
    settings: Settings,
    server: &str,
    id: Option<String>,
    token_file: Option<&Path>,
    faults: FaultOptions,
) -> anyhow::Result<()> {
    let id = Holder::parse(id.unwrap_or_else(generated_id)).context("--id")?;
    let (token, source) = credential(&settings, token_file)?;
    let handlers = leasekeeper_core::worker::simulated::handlers(&settings.chaos_settings());
    let mut transport = Http::new(server)
        .map_err(|e| anyhow!(e))?
        .serving(ClaimFilter::default().kinds(handlers.kinds()));
    if let Some(token) = &token {
        transport = transport
            .with_token(token.expose())
            .map_err(|e| anyhow!(e))?;
        if !transport.is_tls() && reqwest::Url::parse(server).is_ok_and(|u| !is_loopback(&u)) {
            tracing::warn!(
                server,
                "the worker token crosses the network in clear text: \
                serve the instance behind TLS and give an https:// --server"
            );
        }
    }
    // The session stream: while it is open the instance vouches for this
    // worker, so a kill -9 of this process has its claims taken over within
    // a second; when it breaks, the worker gives its claim up at once.
    let (liveness, session) = transport.session(&id);
    let transport =
        super::history::Recorded::new(transport, faults.history.as_deref()).context("--history")?;
    let mut config = settings.worker_config();
    config.trust_claims = faults.trust_claims;
    let (worker, controls) = Worker::new(
        id.clone(),
        transport,
        handlers,
        config,
        Chaos::from_os(settings.chaos_settings()),
    );
    let worker = worker.vouched_by(liveness);
    tracing::info!(worker = %id, server, chaos = settings.chaos, credential = ?source,
        "worker process started");
    let stop = controls.stop_token();
    tokio::spawn(async move {
        crate::signals::shutdown_signal().await;
        stop.cancel();
    });
    // A name the instance refuses a stream stops the worker (it never
    // claimed under it: it was never vouched for).
    let keep_session = session.abort_handle();
    let (refused_tx, mut refused) = tokio::sync::oneshot::channel();
    let stop = controls.stop_token();
    let watch = tokio::spawn(async move {
        if let Ok(Err(why)) = session.await {
            let _ = refused_tx.send(why);
            stop.cancel();
        }
    });
    let exit = worker.run().await;
    // Its claims were given back or completed: the stream's close ends
    // nothing.
    keep_session.abort();
    watch.abort();
    if let Ok(why) = refused.try_recv() {
        bail!("{why}");
    }
    match exit {
        Exit::Stopped => Ok(()),
        Exit::Crashed => {
            bail!("worker {id} crashed (chaos; set LEASEKEEPER_CHAOS=0 to turn it off)")
        }
        Exit::Unauthorized(why) => bail!("{}", source.refused(server, &why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(worker: Option<&str>, admin: Option<&str>) -> Settings {
        let mut s = Settings::resolve(
            None,
            Path::new("none"),
            &crate::settings::SettingArgs::default(),
        )
        .unwrap();
        s.worker_token = worker.map(Into::into);
        s.admin_token = admin.map(Into::into);
        s
    }

    const WORKER: &str = "worker-token-0123456789";
    const ADMIN: &str = "admin-token-0123456789";

    #[test]
    fn the_token_file_wins_then_the_worker_token_then_the_admin_token() {
        let dir = std::env::temp_dir().join(format!("lk-token-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "  file-token-0123456789\n").unwrap();

        let (token, source) =
            credential(&settings(Some(WORKER), Some(ADMIN)), Some(&file)).unwrap();
        assert_eq!(token.unwrap().expose(), "file-token-0123456789", "trimmed");
        assert_eq!(source, Credential::File(file.clone()));
        let (token, source) = credential(&settings(Some(WORKER), Some(ADMIN)), None).unwrap();
        assert_eq!(
            (token.unwrap().expose(), source),
            (WORKER, Credential::WorkerToken)
        );
        let (token, source) = credential(&settings(None, Some(ADMIN)), None).unwrap();
        assert_eq!(
            (token.unwrap().expose(), source),
            (ADMIN, Credential::AdminToken)
        );
        assert_eq!(
            credential(&settings(None, None), None).unwrap(),
            (None, Credential::None)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bad_token_file_is_named_and_its_contents_never_repeated() {
        let dir = std::env::temp_dir().join(format!("lk-bad-token-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = settings(None, None);
        let short = dir.join("short");
        std::fs::write(&short, "tooshort").unwrap();
        let spaced = dir.join("spaced");
        std::fs::write(&spaced, "has a space in it 0123456789").unwrap();
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").unwrap();
        for (path, secret) in [(&short, "tooshort"), (&spaced, "space in it"), (&empty, "")] {
            let err = credential(&s, Some(path)).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("--token-file {}: ", path.display())),
                "{err}"
            );
            assert!(secret.is_empty() || !err.contains(secret), "{err}");
        }
        let missing = dir.join("missing");
        let err = credential(&s, Some(&missing)).unwrap_err().to_string();
        assert!(err.contains("missing: cannot be read"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_refusal_names_the_credential_and_what_to_set() {
        let why = "401 Unauthorized: a worker token is required";
        let line = Credential::None.refused("http://h:3000", why);
        assert!(
            line.contains("requires a worker token (401")
                && line.contains("LEASEKEEPER_WORKER_TOKEN")
        );
        let line = Credential::WorkerToken.refused("http://h:3000", why);
        assert!(line.contains("refused the worker token (401"), "{line}");
        assert!(!line.contains('\n'), "one line");
        let line = Credential::File("/run/t".into()).refused("http://h:3000", "403 Forbidden: no");
        assert_eq!(
            line,
            "the server at http://h:3000 forbids this worker (403 Forbidden: no); it presented the token in /run/t"
        );
        let line = Credential::WorkerToken
            .refused("http://jobs.example:3000", "421 Misdirected Request: no");
        assert!(
            line.contains("LEASEKEEPER_ALLOWED_HOSTS") && !line.contains("token"),
            "{line}"
        );
    }

    #[test]
    fn loopback_servers_are_told_apart() {
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        assert!(is_loopback(&url("http://127.0.0.1:3000")));
        assert!(is_loopback(&url("http://[::1]:3000")));
        assert!(is_loopback(&url("http://LOCALHOST:3000")));
        assert!(!is_loopback(&url("http://10.0.0.5:3000")));
        assert!(!is_loopback(&url("http://queue.internal:3000")));
    }
}

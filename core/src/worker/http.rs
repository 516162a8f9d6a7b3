//! The HTTP transport (feature `http-client`): a worker in another process
//! reaches the queue through an instance's REST API, over `http://` or
//! `https://` (rustls, with the Mozilla roots and the system's own).
//!
//! When the instance requires a credential (`LEASEKEEPER_WORKER_TOKEN` or
//! `LEASEKEEPER_ADMIN_TOKEN` set), [`Http::with_token`] makes every request
//! carry it as `Authorization: Bearer <token>`. A 401 or 403 answer is
//! [`TransportError::Unauthorized`]: the worker loop stops instead of
//! retrying. The server refused the request before doing anything, so
//! nothing is lost by stopping: a refused claim claimed nothing, and a task
//! whose heartbeat or completion was refused is abandoned, its lease left
//! to run out so that another worker takes it over.

use super::Report;
use super::transport::{Claim, ClaimRef, Transport, TransportError, ms};
use crate::lease::Holder;
use crate::queue::{
    AttemptOutcome, ClaimFilter, ClaimRequest, CompleteBody, FailBody, HeartbeatBody, SnoozeBody,
    Task,
};
use reqwest::header::HeaderValue;
use serde::Serialize;
use serde_json::Value;
use std::time::Duration;

/// The HTTP transport: calls the REST API of a leasekeeper instance.
///
/// Its `Debug` never shows the token: the header value is marked
/// sensitive, which prints as `Sensitive`.
///
/// ```
/// use leasekeeper_core::worker::http::Http;
///
/// let mut transport = Http::new("https://queue.internal:3000")?;
/// if let Ok(token) = std::env::var("LEASEKEEPER_WORKER_TOKEN") {
///     transport = transport.with_token(&token)?;
/// }
/// // Then `Worker::new(id, transport, handlers, config, chaos).run()`,
/// // which answers `Exit::Unauthorized(why)` when the server refuses it.
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, Debug)]
pub struct Http {
    client: reqwest::Client,
    base: reqwest::Url,
    filter: ClaimFilter,
    /// `Bearer <token>`, sent with every request, when set.
    authorization: Option<HeaderValue>,
}

impl Http {
    /// A client for the instance at `server`, an `http://` or `https://`
    /// URL such as `http://127.0.0.1:3000` (a path is kept as a prefix).
    pub fn new(server: &str) -> Result<Self, String> {
        let base = reqwest::Url::parse(server)
            .map_err(|e| format!("--server {server:?} is not a URL: {e}"))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(format!(
                "--server {server:?} must be an http:// or https:// URL"
            ));
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Http {
            client,
            base,
            filter: ClaimFilter::default(),
            authorization: None,
        })
    }

    /// Sends `token` as `Authorization: Bearer <token>` with every request:
    /// the instance's worker token (`LEASEKEEPER_WORKER_TOKEN`), or its
    /// admin token, which passes the worker's routes too. The error never
    /// repeats the token.
    ///
    /// Over plain `http://` the token crosses the network in clear text:
    /// beyond a trusted network, serve the instance behind TLS and give an
    /// `https://` URL.
    pub fn with_token(mut self, token: &str) -> Result<Self, String> {
        let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            "the worker token cannot be sent in an HTTP header (printable ASCII only)".to_string()
        })?;
        // Kept out of `Debug` (and of HTTP/2's header compression tables).
        value.set_sensitive(true);
        self.authorization = Some(value);
        Ok(self)
    }

    /// Whether the instance is reached over TLS (`https://`).
    pub fn is_tls(&self) -> bool {
        self.base.scheme() == "https"
    }

    /// Claims only what `filter` lets through (every kind in the default
    /// queue unless set).
    pub fn serving(mut self, filter: ClaimFilter) -> Self {
        self.filter = filter;
        self
    }

    fn url(&self, segments: &[&str]) -> reqwest::Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// Sends `body` with `method` to the path `segments`; answers the
    /// status and JSON body, or a transient error when there is no answer.
    async fn call(
        &self,
        method: reqwest::Method,
        segments: &[&str],
        body: &(impl Serialize + ?Sized),
    ) -> Result<(reqwest::StatusCode, Value), TransportError> {
        let url = self.url(segments);
        let mut request = self.client.request(method.clone(), url.clone()).json(body);
        if let Some(authorization) = &self.authorization {
            request = request.header(reqwest::header::AUTHORIZATION, authorization.clone());
        }
        let response = request
            .send()
            .await
            .map_err(|e| TransportError::Transient(format!("{method} {url}: {e}")))?;
        let status = response.status();
        let value = response.json::<Value>().await.unwrap_or(Value::Null);
        Ok((status, value))
    }

    /// PUTs `body` to `/api/tasks/{task_id}/{op}`: the JSON answer on
    /// success, the mapped refusal otherwise.
    async fn task_write(
        &self,
        task_id: i64,
        op: &str,
        body: &(impl Serialize + ?Sized),
    ) -> Result<Value, TransportError> {
        let id = task_id.to_string();
        let (status, answer) = self
            .call(reqwest::Method::PUT, &["api", "tasks", &id, op], body)
            .await?;
        if status.is_success() {
            Ok(answer)
        } else {
            Err(Self::refusal(status, &answer))
        }
    }

    /// Maps a non-success answer: 409 and 404 mean the claim is lost, 401
    /// and 403 that the credential was refused, 421 that the server does
    /// not answer to the host name in the URL (its allowed hosts): this
    /// worker can do nothing more, retrying would never help. Anything else
    /// is worth retrying.
    fn refusal(status: reqwest::StatusCode, body: &Value) -> TransportError {
        let why = body["error"].as_str().unwrap_or("no error message");
        match status {
            reqwest::StatusCode::CONFLICT | reqwest::StatusCode::NOT_FOUND => {
                TransportError::Lost(format!("{status}: {why}"))
            }
            reqwest::StatusCode::UNAUTHORIZED
            | reqwest::StatusCode::FORBIDDEN
            | reqwest::StatusCode::MISDIRECTED_REQUEST => {
                TransportError::Unauthorized(format!("{status}: {why}"))
            }
            _ => TransportError::Transient(format!("{status}: {why}")),
        }
    }
}

/// How long a session stream may stay silent (the instance sends a
/// keep-alive every 200 ms) before the worker takes it for broken and
/// gives up its claims: as long as an unanswered liveness check
/// ([`crate::liveness`]), so a slow instance is not mistaken for a lost one.
const SESSION_SILENCE: Duration = Duration::from_secs(5);

/// The longest wait between two attempts to open the session stream.
const SESSION_RETRY_AT_MOST: Duration = Duration::from_secs(2);

/// How a session stream could not be opened.
enum Unopened {
    /// The instance has no session streams (an older version: 404, 405):
    /// the TTL alone rules, as before.
    Unsupported(String),
    /// The instance will never open one for this name (409: it is an
    /// instance's, a runtime's or a simulated worker's own): the session
    /// task ends with this refusal, for the process to stop on.
    Refused(String),
    /// Anything else: tried again.
    Failed(String),
}

impl Http {
    /// Keeps worker `holder`'s **session stream** open to the instance
    /// (`POST /api/workers/{id}/session`), in the background until the
    /// answered handle is aborted or dropped with the runtime, and answers
    /// what the worker loop watches ([`Worker::vouched_by`](super::run::Worker::vouched_by)).
    ///
    /// While the stream is open the instance's liveness session vouches
    /// for the worker, so a crash of this process (its connection closed)
    /// has its claims taken over within a second, not at the end of their
    /// TTL. The standing is up once the instance says `ready`; when the
    /// stream breaks (closed, or silent for 5 s) the worker stops trusting
    /// every claim at once (the instance may already be ending them),
    /// opens a new stream, and claims again under a new term once it is
    /// ready. An instance without session streams (an older version)
    /// leaves the worker up, under the TTL alone. An instance that refuses
    /// this name a stream (409: the name is an instance's, a runtime's or
    /// a simulated worker's own) ends the task with its reason: the worker
    /// stays down (it never claims) and its process should stop.
    pub fn session(
        &self,
        holder: &Holder,
    ) -> (
        crate::liveness::LivenessSignal,
        tokio::task::JoinHandle<Result<(), String>>,
    ) {
        let (standing, signal) = tokio::sync::watch::channel(crate::liveness::Standing::Down(0));
        let http = self.clone();
        let holder = holder.as_str().to_string();
        let task = tokio::spawn(async move { http.keep_session(&holder, standing).await });
        (crate::liveness::LivenessSignal::following(signal), task)
    }

    async fn keep_session(
        &self,
        holder: &str,
        standing: tokio::sync::watch::Sender<crate::liveness::Standing>,
    ) -> Result<(), String> {
        use crate::liveness::Standing;
        // No total timeout: the answer never ends. Silence is judged below.
        let client = match reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .build()
        {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(worker = holder, error = %e,
                    "cannot build the session stream's client; the TTL alone rules");
                standing.send_replace(Standing::Up(1));
                return Ok(());
            }
        };
        let mut term = 1;
        let mut backoff = Duration::ZERO;
        loop {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).clamp(Duration::from_millis(100), SESSION_RETRY_AT_MOST);
            let mut response = match self.open_session(&client, holder).await {
                Ok(response) => response,
                Err(Unopened::Unsupported(why)) => {
                    tracing::warn!(
                        worker = holder,
                        why,
                        "the instance has no session streams: a crash of this worker waits out its claims' TTL"
                    );
                    standing.send_replace(Standing::Up(term));
                    return Ok(());
                }
                Err(Unopened::Refused(why)) => {
                    tracing::error!(
                        worker = holder,
                        why,
                        "the instance refuses this worker a session stream"
                    );
                    return Err(format!(
                        "the instance refuses worker {holder} a session stream ({why}): give the worker a name of its own (--id)"
                    ));
                }
                Err(Unopened::Failed(why)) => {
                    tracing::warn!(
                        worker = holder,
                        why,
                        "cannot open the session stream; trying again"
                    );
                    continue;
                }
            };
            // Up once the instance says it vouches for this worker.
            let mut seen = String::new();
            let ready = loop {
                match tokio::time::timeout(SESSION_SILENCE, response.chunk()).await {
                    Ok(Ok(Some(bytes))) => {
                        seen.push_str(&String::from_utf8_lossy(&bytes));
                        if seen.contains("event: ready") {
                            break true;
                        }
                    }
                    _ => break false,
                }
            };
            if !ready {
                continue;
            }
            standing.send_replace(Standing::Up(term));
            backoff = Duration::ZERO;
            tracing::info!(worker = holder, term, "session stream open");
            // Open while bytes come.
            while let Ok(Ok(Some(_))) =
                tokio::time::timeout(SESSION_SILENCE, response.chunk()).await
            {}
            // The instance may be ending this term's claims now.
            standing.send_replace(Standing::Down(term));
            term += 1;
            tracing::warn!(
                worker = holder,
                term,
                "session stream broken: claims given up; opening a new one"
            );
        }
    }

    async fn open_session(
        &self,
        client: &reqwest::Client,
        holder: &str,
    ) -> Result<reqwest::Response, Unopened> {
        let url = self.url(&["api", "workers", holder, "session"]);
        let mut request = client
            .post(url.clone())
            .json(&serde_json::json!({}))
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(authorization) = &self.authorization {
            request = request.header(reqwest::header::AUTHORIZATION, authorization.clone());
        }
        // The head is awaited for a bounded time; the body, which never
        // ends, under SESSION_SILENCE by the caller.
        let response = tokio::time::timeout(Duration::from_secs(10), request.send())
            .await
            .map_err(|_| Unopened::Failed(format!("POST {url}: no answer within 10 s")))?
            .map_err(|e| Unopened::Failed(format!("POST {url}: {e}")))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.json::<Value>().await.unwrap_or(Value::Null);
        let why = format!(
            "{status}: {}",
            body["error"].as_str().unwrap_or("no error message")
        );
        match status {
            reqwest::StatusCode::NOT_FOUND | reqwest::StatusCode::METHOD_NOT_ALLOWED => {
                Err(Unopened::Unsupported(why))
            }
            reqwest::StatusCode::CONFLICT => Err(Unopened::Refused(why)),
            _ => Err(Unopened::Failed(why)),
        }
    }
}

impl Transport for Http {
    async fn claim(&self, worker: &Holder) -> Result<Option<Claim>, TransportError> {
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                &["api", "tasks", "next"],
                &ClaimRequest::new(worker.clone(), &self.filter),
            )
            .await?;
        match status {
            reqwest::StatusCode::ACCEPTED => {
                let task: Task = serde_json::from_value(body).map_err(|e| {
                    TransportError::Transient(format!("unreadable claimed task: {e}"))
                })?;
                if task.fencing_token.is_none() {
                    return Err(TransportError::Transient(
                        "claimed task has no fencing_token".into(),
                    ));
                }
                Ok(Some(Claim::of(task)))
            }
            reqwest::StatusCode::OK => Ok(None),
            other => Err(match Self::refusal(other, &body) {
                refused @ TransportError::Unauthorized(_) => refused,
                // Nothing about a claim can be "lost" before it exists.
                other => TransportError::Transient(other.to_string()),
            }),
        }
    }

    async fn heartbeat(&self, claim: ClaimRef<'_>) -> Result<Option<Duration>, TransportError> {
        let body = self
            .task_write(
                claim.task_id,
                "heartbeat",
                &HeartbeatBody {
                    processor: claim.worker.clone(),
                    fencing_token: claim.token,
                },
            )
            .await?;
        Ok(ms(body["heartbeat_in_ms"].as_i64()))
    }

    async fn complete(&self, claim: ClaimRef<'_>, output: &Value) -> Result<(), TransportError> {
        self.task_write(
            claim.task_id,
            "complete",
            &CompleteBody {
                processor: claim.worker.clone(),
                fencing_token: claim.token,
                task_output: Some(output.clone()),
            },
        )
        .await?;
        Ok(())
    }

    async fn fail(&self, claim: ClaimRef<'_>, error: &str) -> Result<(), TransportError> {
        self.fail_as(claim, error, AttemptOutcome::Failed).await
    }

    async fn fail_as(
        &self,
        claim: ClaimRef<'_>,
        error: &str,
        outcome: AttemptOutcome,
    ) -> Result<(), TransportError> {
        self.task_write(
            claim.task_id,
            "fail",
            &FailBody {
                processor: claim.worker.clone(),
                fencing_token: claim.token,
                error: error.to_owned(),
                // Left out when plain, as a worker before attempts wrote it.
                outcome: (outcome != AttemptOutcome::Failed).then_some(outcome),
            },
        )
        .await?;
        Ok(())
    }

    async fn wait_for(
        &self,
        claim: ClaimRef<'_>,
        signal: &str,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        self.task_write(
            claim.task_id,
            "wait",
            &crate::queue::WaitBody {
                processor: claim.worker.clone(),
                fencing_token: claim.token,
                signal: signal.to_string(),
                timeout_seconds: timeout.as_secs_f64(),
            },
        )
        .await?;
        Ok(())
    }

    async fn snooze(&self, claim: ClaimRef<'_>, delay: Duration) -> Result<(), TransportError> {
        self.task_write(
            claim.task_id,
            "snooze",
            &SnoozeBody {
                processor: claim.worker.clone(),
                fencing_token: claim.token,
                seconds: delay.as_secs_f64(),
            },
        )
        .await?;
        Ok(())
    }

    async fn report(&self, worker: &Holder, report: &Report) -> Result<(), TransportError> {
        let (status, body) = self
            .call(
                reqwest::Method::PUT,
                &["api", "workers", worker.as_str()],
                report,
            )
            .await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(Self::refusal(status, &body))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A fake instance's answer to one request on `socket`: reads the
    /// request (head and its `{}` body), answers `head`, and hands the
    /// socket back for what follows.
    async fn answer(socket: &mut tokio::net::TcpStream, head: &str) -> String {
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&seen).contains("\r\n\r\n{}") {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0, "the request ended early");
            seen.extend_from_slice(&buf[..n]);
        }
        socket.write_all(head.as_bytes()).await.unwrap();
        String::from_utf8_lossy(&seen).to_string()
    }

    const STREAM: &str =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

    /// The fake instance says `ready` on `socket`; answers the term the
    /// worker is then up in.
    async fn ready(
        socket: &mut tokio::net::TcpStream,
        signal: &mut crate::liveness::LivenessSignal,
    ) -> u64 {
        socket
            .write_all(chunk("event: ready\ndata: i\n\n").as_bytes())
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(2), signal.up())
            .await
            .unwrap()
    }

    /// One chunk of a chunked body.
    fn chunk(text: &str) -> String {
        format!("{:x}\r\n{text}\r\n", text.len())
    }

    #[tokio::test]
    async fn a_worker_is_up_while_its_session_stream_is_open_and_stops_trusting_the_moment_it_breaks()
     {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = Http::new(&format!("http://{}", listener.local_addr().unwrap()))
            .unwrap()
            .with_token("a-worker-token-0123456789")
            .unwrap();
        let (mut signal, task) = http.session(&Holder::parse("pw").unwrap());
        assert_eq!(
            signal.session(),
            None,
            "no claim before the instance vouches"
        );

        let (mut first, _) = listener.accept().await.unwrap();
        let request = answer(&mut first, STREAM).await;
        assert!(
            request.starts_with("POST /api/workers/pw/session HTTP/1.1"),
            "{request}"
        );
        assert!(
            request.contains("authorization: Bearer a-worker-token-0123456789"),
            "{request}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(signal.session(), None, "not before ready");
        let term = ready(&mut first, &mut signal).await;
        assert_eq!(term, 1);
        first.write_all(chunk(":\n\n").as_bytes()).await.unwrap();

        // The instance goes away: the term's claims are not to be trusted
        // from this moment.
        let broken = std::time::Instant::now();
        drop(first);
        tokio::time::timeout(Duration::from_secs(1), signal.ended(1))
            .await
            .expect("noticed within a second");
        assert!(broken.elapsed() < Duration::from_secs(1));
        assert_eq!(signal.session(), None);

        // It opens a new stream at once, and is up under a new term.
        let (mut second, _) = tokio::time::timeout(Duration::from_secs(3), listener.accept())
            .await
            .unwrap()
            .unwrap();
        answer(&mut second, STREAM).await;
        let term = ready(&mut second, &mut signal).await;
        assert_eq!(term, 2);
        task.abort();
    }

    #[tokio::test]
    async fn an_instance_without_session_streams_leaves_the_worker_to_the_ttl() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = Http::new(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let (mut signal, task) = http.session(&Holder::parse("pw").unwrap());
        let (mut socket, _) = listener.accept().await.unwrap();
        answer(
            &mut socket,
            "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
        )
        .await;
        let term = tokio::time::timeout(Duration::from_secs(2), signal.up())
            .await
            .unwrap();
        assert_eq!(signal.session(), Some(term));
        // And it never asks again.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), listener.accept())
                .await
                .is_err()
        );
        assert_eq!(task.await.unwrap(), Ok(()));
    }

    #[tokio::test]
    async fn a_name_the_instance_refuses_a_stream_ends_the_session_task_with_the_reason() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = Http::new(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let (signal, task) = http.session(&Holder::parse("i-3000-ab12").unwrap());
        let (mut socket, _) = listener.accept().await.unwrap();
        let body = r#"{"error":"i-3000-ab12 is an instance's own name"}"#;
        answer(
            &mut socket,
            &format!(
                "HTTP/1.1 409 Conflict\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            ),
        )
        .await;
        let refused = tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("no retrying a refusal")
            .unwrap()
            .unwrap_err();
        assert!(
            refused.contains("409") && refused.contains("an instance's own name"),
            "{refused}"
        );
        // It never claims under that name.
        assert_eq!(signal.session(), None);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), listener.accept())
                .await
                .is_err(),
            "asked again"
        );
    }

    #[test]
    fn http_urls_keep_the_base_path_and_encode_segments() {
        let http = Http::new("http://127.0.0.1:3000").unwrap();
        assert_eq!(
            http.url(&["api", "tasks", "7", "heartbeat"]).as_str(),
            "http://127.0.0.1:3000/api/tasks/7/heartbeat"
        );
        let http = Http::new("http://127.0.0.1:3000/prefix/").unwrap();
        assert_eq!(
            http.url(&["api", "workers", "a b/c"]).as_str(),
            "http://127.0.0.1:3000/prefix/api/workers/a%20b%2Fc"
        );
    }

    #[test]
    fn http_and_https_urls_are_accepted_and_nothing_else() {
        assert!(!Http::new("http://127.0.0.1:3000").unwrap().is_tls());
        assert!(Http::new("https://example.org").unwrap().is_tls());
        assert!(Http::new("ftp://example.org").is_err());
        assert!(Http::new("not a url").is_err());
    }

    #[test]
    fn the_token_stays_out_of_debug_and_out_of_errors() {
        let token = "s3cret-worker-token-0123456789";
        let http = Http::new("http://127.0.0.1:3000")
            .unwrap()
            .with_token(token)
            .unwrap();
        let debug = format!("{http:?}");
        assert!(!debug.contains(token), "{debug}");
        assert!(debug.contains("Sensitive"), "{debug}");
        let err = Http::new("http://127.0.0.1:3000")
            .unwrap()
            .with_token("bad\ntoken-0123456789")
            .unwrap_err();
        assert!(!err.contains("token-0123456789"), "{err}");
    }

    /// A one-request HTTP server on a free port: answers `status` with
    /// `{"error": …}` and hands back the request it read (head and body).
    async fn stub(status: &'static str) -> (String, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let served = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            // The head, then as much body as it announced.
            let body_end = loop {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before a whole request");
                seen.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&seen).to_ascii_lowercase();
                if let Some(head) = text.find("\r\n\r\n") {
                    let length = text
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if seen.len() >= head + 4 + length {
                        break head + 4 + length;
                    }
                }
            };
            let body = r#"{"error":"a worker token is required"}"#;
            let answer = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(answer.as_bytes()).await.unwrap();
            conn.shutdown().await.unwrap();
            String::from_utf8_lossy(&seen[..body_end]).into_owned()
        });
        (url, served)
    }

    fn claim_ref(worker: &Holder) -> ClaimRef<'_> {
        ClaimRef {
            worker,
            task_id: 7,
            token: 3,
            kind: "sleep",
        }
    }

    #[tokio::test]
    async fn every_call_sends_the_bearer_token_and_401_is_a_refused_credential() {
        let token = "worker-token-0123456789abcdef";
        let worker = Holder::parse("w1").unwrap();
        let (url, served) = stub("401 Unauthorized").await;
        let http = Http::new(&url).unwrap().with_token(token).unwrap();
        let claimed = http.claim(&worker).await;
        let request = served.await.unwrap();
        assert!(request.starts_with("POST /api/tasks/next "), "{request}");
        assert!(
            request
                .lines()
                .any(|l| l.eq_ignore_ascii_case(&format!("authorization: Bearer {token}"))),
            "{request}"
        );
        assert_eq!(
            claimed,
            Err(TransportError::Unauthorized(
                "401 Unauthorized: a worker token is required".into()
            ))
        );

        // A write to a claimed task, and a 403: the same.
        let (url, served) = stub("403 Forbidden").await;
        let http = Http::new(&url).unwrap().with_token(token).unwrap();
        let beat = http.heartbeat(claim_ref(&worker)).await;
        let request = served.await.unwrap();
        assert!(
            request.starts_with("PUT /api/tasks/7/heartbeat "),
            "{request}"
        );
        assert!(
            request
                .to_ascii_lowercase()
                .contains("authorization: bearer")
        );
        assert!(matches!(beat, Err(TransportError::Unauthorized(why)) if why.starts_with("403")));

        // A host name the server does not answer to: retrying never helps.
        let (url, served) = stub("421 Misdirected Request").await;
        let http = Http::new(&url).unwrap();
        let claimed = http.claim(&worker).await;
        served.await.unwrap();
        assert!(
            matches!(claimed, Err(TransportError::Unauthorized(ref why)) if why.starts_with("421")),
            "{claimed:?}"
        );
    }

    #[tokio::test]
    async fn without_a_token_no_authorization_header_is_sent() {
        let worker = Holder::parse("w1").unwrap();
        let (url, served) = stub("401 Unauthorized").await;
        let http = Http::new(&url).unwrap();
        let done = http
            .complete(claim_ref(&worker), &json!({"ok": true}))
            .await;
        let request = served.await.unwrap();
        assert!(
            request.starts_with("PUT /api/tasks/7/complete "),
            "{request}"
        );
        assert!(
            !request.to_ascii_lowercase().contains("authorization"),
            "{request}"
        );
        assert!(matches!(done, Err(TransportError::Unauthorized(_))));
    }

    #[tokio::test]
    async fn an_https_server_is_spoken_to_in_tls() {
        use tokio::io::AsyncReadExt;
        // Not a TLS server: what matters is that the client opens with a
        // TLS handshake (a ClientHello record, type 0x16) instead of
        // refusing the scheme or speaking plain HTTP.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let first = tokio::spawn(tokio::time::timeout(Duration::from_secs(5), async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut byte = [0u8; 1];
            conn.read_exact(&mut byte).await.unwrap();
            byte[0]
        }));
        let http = Http::new(&format!("https://127.0.0.1:{port}"))
            .unwrap()
            .with_token("worker-token-0123456789abcdef")
            .unwrap();
        let worker = Holder::parse("w1").unwrap();
        let claimed = tokio::time::timeout(Duration::from_secs(5), http.claim(&worker));
        let (claimed, first) = tokio::join!(claimed, first);
        let first = first.unwrap().expect("the client connected");
        assert_eq!(first, 0x16, "a TLS handshake record");
        // The handshake then fails: a transient failure, worth retrying.
        assert!(
            matches!(claimed, Ok(Err(TransportError::Transient(_)))),
            "{claimed:?}"
        );
    }

    #[test]
    fn refusals_409_and_404_are_lost_claims_others_transient() {
        let body = json!({"error": "task 3: already processed"});
        assert_eq!(
            Http::refusal(reqwest::StatusCode::CONFLICT, &body),
            TransportError::Lost("409 Conflict: task 3: already processed".into())
        );
        assert!(matches!(
            Http::refusal(reqwest::StatusCode::NOT_FOUND, &body),
            TransportError::Lost(_)
        ));
        assert!(matches!(
            Http::refusal(reqwest::StatusCode::INTERNAL_SERVER_ERROR, &body),
            TransportError::Transient(_)
        ));
        for status in [
            reqwest::StatusCode::UNAUTHORIZED,
            reqwest::StatusCode::FORBIDDEN,
        ] {
            assert!(matches!(
                Http::refusal(status, &body),
                TransportError::Unauthorized(_)
            ));
        }
    }
}

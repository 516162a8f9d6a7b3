//! A TCP proxy between worker processes and an instance that can lose an
//! answer on purpose: the ambiguous-outcome fault.
//!
//! Armed for a kind of request, it lets the next such request through, waits
//! for the instance's answer (sent only after its transaction committed),
//! swallows it and closes both connections. The worker sees the connection
//! die and cannot tell whether its claim or completion happened; the queue
//! must stay right whichever it guesses.

use leasekeeper::worker::history::now_ms;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Which request's answer to lose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `POST /api/tasks/next`: the worker never learns it holds the task.
    Claim,
    /// `PUT /api/tasks/{id}/complete`: the worker never learns it finished.
    Complete,
}

/// An answer that was lost.
#[derive(Clone, Debug, PartialEq)]
pub struct Dropped {
    pub target: Target,
    /// The task concerned, when it could be read off the request or answer.
    pub task: Option<i64>,
    pub at_ms: i64,
}

#[derive(Default)]
struct Shared {
    armed: Option<Target>,
    dropped: Vec<Dropped>,
}

/// A proxy on a loopback port in front of `127.0.0.1:<upstream>`.
pub struct Proxy {
    /// Where workers connect.
    pub port: u16,
    shared: Arc<Mutex<Shared>>,
    stop: CancellationToken,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: u16) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = CancellationToken::new();
        {
            let (shared, stop) = (shared.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    let client = tokio::select! {
                        () = stop.cancelled() => return,
                        accepted = listener.accept() => match accepted {
                            Ok((client, _)) => client,
                            Err(_) => continue,
                        },
                    };
                    let (shared, stop) = (shared.clone(), stop.child_token());
                    tokio::spawn(async move {
                        if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                            tokio::select! {
                                () = stop.cancelled() => {}
                                () = pipe(client, server, shared) => {}
                            }
                        }
                    });
                }
            });
        }
        Ok(Proxy { port, shared, stop })
    }

    /// Loses the answer to the next request of kind `target`.
    pub fn arm(&self, target: Target) {
        self.lock().armed = Some(target);
    }

    /// Whether an armed loss is still waiting for its request.
    pub fn is_armed(&self) -> bool {
        self.lock().armed.is_some()
    }

    /// Disarms it (a loss that never found its request).
    pub fn disarm(&self) {
        self.lock().armed = None;
    }

    /// The answers lost so far, oldest first; the list is emptied.
    pub fn take_dropped(&self) -> Vec<Dropped> {
        std::mem::take(&mut self.lock().dropped)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A request's kind, and the task id in its path.
type Request = (Target, Option<i64>);

/// `Some` when `chunk` starts a request (its request line): the kind of
/// request we may lose the answer to, or `None` for any other request.
/// `None` when the chunk does not start a request (more of a body).
fn classify(chunk: &[u8]) -> Option<Option<Request>> {
    let line = chunk.split(|&b| b == b'\r').next()?;
    let line = std::str::from_utf8(line).ok()?;
    if !(line.ends_with(" HTTP/1.1") || line.ends_with(" HTTP/1.0")) {
        return None;
    }
    Some(kind(line))
}

/// The kind of request `line` asks, and the task id in its path.
fn kind(line: &str) -> Option<Request> {
    let mut parts = line.split(' ');
    let (method, path) = (parts.next()?, parts.next()?);
    if method == "POST" && path == "/api/tasks/next" {
        return Some((Target::Claim, None));
    }
    let id = path
        .strip_prefix("/api/tasks/")?
        .strip_suffix("/complete")?;
    (method == "PUT").then(|| (Target::Complete, id.parse().ok()))
}

/// The first `"id":N` in a JSON answer (a claimed task's id).
fn answer_id(body: &[u8]) -> Option<i64> {
    let text = String::from_utf8_lossy(body);
    let at = text.find("\"id\":")? + 5;
    let digits: String = text[at..]
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Copies both ways until either side closes or an armed answer is lost.
async fn pipe(client: TcpStream, server: TcpStream, shared: Arc<Mutex<Shared>>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    // The request now being answered on this connection (HTTP/1.1 without
    // pipelining: one at a time).
    let current: Arc<Mutex<Option<Request>>> = Arc::new(Mutex::new(None));
    let requests = {
        let current = current.clone();
        async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = match client_rx.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                // A new request replaces the one answered before it on
                // this connection, whatever its kind: the answer to a
                // heartbeat after a claim is not the claim's.
                if let Some(request) = classify(&buf[..n]) {
                    *current.lock().unwrap_or_else(|e| e.into_inner()) = request;
                }
                if server_tx.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let answers = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let request = *current.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((target, task)) = request {
                let mut shared = shared.lock().unwrap_or_else(|e| e.into_inner());
                if shared.armed == Some(target) {
                    shared.armed = None;
                    let task = task.or_else(|| answer_id(&buf[..n]));
                    shared.dropped.push(Dropped {
                        target,
                        task,
                        at_ms: now_ms(),
                    });
                    // Returning drops both connections: the answer is lost.
                    return;
                }
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = requests => {}
        () = answers => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_told_apart() {
        assert_eq!(
            classify(b"POST /api/tasks/next HTTP/1.1\r\nhost: x\r\n\r\n{}"),
            Some(Some((Target::Claim, None)))
        );
        assert_eq!(
            classify(b"PUT /api/tasks/42/complete HTTP/1.1\r\n"),
            Some(Some((Target::Complete, Some(42))))
        );
        // Other requests are requests too: they end the one before.
        assert_eq!(
            classify(b"PUT /api/tasks/42/heartbeat HTTP/1.1\r\n"),
            Some(None)
        );
        assert_eq!(classify(b"GET /api/tasks/next HTTP/1.1\r\n"), Some(None));
        // More of a body is not a request.
        assert_eq!(classify(b"{\"processor\": \"w\"}"), None);
        assert_eq!(classify(b"PUT /api/tasks/42/complete"), None);
    }

    #[test]
    fn a_claimed_tasks_id_is_read_off_the_answer() {
        let answer = b"HTTP/1.1 202 Accepted\r\n\r\n{\"id\": 17, \"task_data\": {\"id\": 3}}";
        assert_eq!(answer_id(answer), Some(17));
        assert_eq!(
            answer_id(b"HTTP/1.1 200 OK\r\n\r\n{\"message\":\"none\"}"),
            None
        );
    }

    /// Sends `request` on `conn` and reads one short answer (empty when the
    /// proxy closed the connection instead).
    async fn exchange(conn: &mut TcpStream, request: &str) -> String {
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 1024];
        let n = conn.read(&mut buf).await.unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).to_string()
    }

    #[tokio::test]
    async fn an_armed_answer_is_lost_after_the_request_went_through() {
        // An upstream that answers every request on one kept-alive
        // connection, and reports each request it received.
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream_port = upstream.local_addr().unwrap().port();
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel::<String>();
        tokio::spawn(async move {
            let (mut conn, _) = upstream.accept().await.unwrap();
            let mut buf = vec![0u8; 1024];
            loop {
                let n = conn.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                let _ = seen_tx.send(String::from_utf8_lossy(&buf[..n]).to_string());
                let body = br#"{"id": 9}"#;
                let head = format!(
                    "HTTP/1.1 202 Accepted\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(&[head.as_bytes(), body].concat()).await;
            }
        });
        let proxy = Proxy::start(upstream_port).await.unwrap();
        let mut conn = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        let claim = "POST /api/tasks/next HTTP/1.1\r\ncontent-length: 0\r\n\r\n";
        let beat = "PUT /api/tasks/9/heartbeat HTTP/1.1\r\ncontent-length: 0\r\n\r\n";
        assert!(exchange(&mut conn, claim).await.starts_with("HTTP/1.1 202"));
        proxy.arm(Target::Claim);
        // The heartbeat after the claim on the same connection is answered.
        assert!(exchange(&mut conn, beat).await.starts_with("HTTP/1.1 202"));
        assert!(proxy.is_armed());
        // The next claim went through, and its answer is lost.
        assert_eq!(exchange(&mut conn, claim).await, "");
        let mut received = Vec::new();
        while let Ok(r) = seen.try_recv() {
            received.push(r);
        }
        assert_eq!(received.len(), 3, "{received:?}");
        assert!(received[2].starts_with("POST /api/tasks/next"));
        let dropped = proxy.take_dropped();
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].target, Target::Claim);
        assert_eq!(dropped[0].task, Some(9), "read off the lost answer");
        assert!(!proxy.is_armed());
    }
}

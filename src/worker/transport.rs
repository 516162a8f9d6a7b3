//! How a worker reaches the task queue: in-process over a [`PgPool`], or
//! over the REST API. The worker loop sees only [`Transport`], so both kinds
//! of worker run the very same code.
//!
//! Every call answers `Ok`, [`TransportError::Lost`] (the queue refused the
//! write because the claim is no longer this worker's: HTTP 409/404, the
//! store's `Stale`/`NotFound`), or [`TransportError::Transient`] (the queue
//! could not be asked: network, database or server trouble; worth retrying
//! while the local deadline allows).

use super::{WorkerKind, WorkerState};
use crate::lease::Holder;
use crate::queue::store::{self, RetryPolicy, TaskError};
use crate::worker::registry;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgPool;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Why a transport call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The claim is lost: the write was refused (stale token, expired lease,
    /// finished or unknown task). Stop working on it.
    #[error("claim lost: {0}")]
    Lost(String),
    /// The queue could not be reached or failed; the claim may still be held.
    #[error("transient failure: {0}")]
    Transient(String),
}

/// A claimed task, as much of it as a worker needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// The task.
    pub task_id: i32,
    /// The claim's fencing token; every later write carries it.
    pub token: i64,
    /// What to do.
    pub task_data: Value,
    /// What is left of the lease by the database clock when it answered
    /// (`None` if the answer did not say; the worker then assumes its TTL).
    pub remaining: Option<Duration>,
}

/// What a worker tells the `workers` table about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// What it is doing.
    pub state: WorkerState,
    /// The task it holds, if any.
    pub task_id: Option<i32>,
    /// That claim's fencing token.
    pub fencing_token: Option<i64>,
    /// True when this report follows an accepted claim or heartbeat.
    #[serde(default)]
    pub heartbeat: bool,
    /// Tasks completed so far by this run.
    #[serde(default)]
    pub tasks_done: i32,
    /// Tasks abandoned so far by this run.
    #[serde(default)]
    pub tasks_abandoned: i32,
    /// True for the first report of a run: it replaces whatever an earlier
    /// run under the same id left (even `crashed` or `stopped`).
    #[serde(default)]
    pub fresh: bool,
}

/// The operations a worker needs from the queue.
pub trait Transport: Send + Sync + 'static {
    /// Claims the next task for `worker`, or `None` when nothing is claimable.
    fn claim(
        &self,
        worker: &Holder,
    ) -> impl Future<Output = Result<Option<Claim>, TransportError>> + Send;

    /// Extends the claim; answers what is left of the lease.
    fn heartbeat(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
    ) -> impl Future<Output = Result<Option<Duration>, TransportError>> + Send;

    /// Completes the task with `output`.
    fn complete(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
        output: &Value,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// Reports a failed attempt; the queue retries it after a backoff.
    fn fail(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
        error: &str,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// Records what the worker is doing in the `workers` table.
    fn report(
        &self,
        worker: &Holder,
        report: &Report,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;
}

fn ms(ms: Option<i64>) -> Option<Duration> {
    ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// The in-process transport: calls [`crate::queue::store`] directly.
#[derive(Clone, Debug)]
pub struct InProcess {
    pool: PgPool,
    ttl: Duration,
    retry: RetryPolicy,
    instance_id: Arc<str>,
}

impl InProcess {
    /// Claims and heartbeats ask for `ttl`; reports name `instance_id`.
    pub fn new(pool: PgPool, ttl: Duration, instance_id: Arc<str>) -> Self {
        InProcess {
            pool,
            ttl,
            retry: RetryPolicy::default(),
            instance_id,
        }
    }

    async fn conn(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, TransportError> {
        self.pool
            .acquire()
            .await
            .map_err(|e| TransportError::Transient(format!("database: {e}")))
    }
}

impl From<TaskError> for TransportError {
    fn from(err: TaskError) -> Self {
        match err {
            TaskError::Stale { .. } | TaskError::NotFound(_) => {
                TransportError::Lost(err.to_string())
            }
            other => TransportError::Transient(other.to_string()),
        }
    }
}

impl Transport for InProcess {
    async fn claim(&self, worker: &Holder) -> Result<Option<Claim>, TransportError> {
        let task = store::claim_next(&mut *self.conn().await?, worker, self.ttl).await?;
        Ok(task.map(|task| Claim {
            task_id: task.id,
            token: task.fencing_token.unwrap_or_default(),
            remaining: ms(task.heartbeat_in_ms),
            task_data: task.task_data,
        }))
    }

    async fn heartbeat(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
    ) -> Result<Option<Duration>, TransportError> {
        let task =
            store::heartbeat(&mut *self.conn().await?, task_id, worker, token, self.ttl).await?;
        Ok(ms(task.heartbeat_in_ms))
    }

    async fn complete(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
        output: &Value,
    ) -> Result<(), TransportError> {
        store::complete(
            &mut *self.conn().await?,
            task_id,
            worker,
            token,
            Some(output),
        )
        .await?;
        Ok(())
    }

    async fn fail(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
        error: &str,
    ) -> Result<(), TransportError> {
        store::fail(
            &mut *self.conn().await?,
            task_id,
            worker,
            token,
            error,
            self.retry,
        )
        .await?;
        Ok(())
    }

    async fn report(&self, worker: &Holder, report: &Report) -> Result<(), TransportError> {
        let recorded = registry::record(
            &mut *self.conn().await?,
            worker,
            WorkerKind::Simulated,
            Some(&self.instance_id),
            report,
            self.ttl,
        )
        .await
        .map_err(|e| TransportError::Transient(format!("database: {e}")))?;
        match recorded {
            Some(_) => Ok(()),
            None => Err(TransportError::Lost(format!(
                "the workers table refused the report of {worker}"
            ))),
        }
    }
}

/// The HTTP transport: calls the REST API of a leasekeeper instance.
/// Plain `http://` only (no TLS), as workers talk to an instance nearby.
#[derive(Clone, Debug)]
pub struct Http {
    client: reqwest::Client,
    base: reqwest::Url,
}

/// The parts of a task answer a worker reads.
#[derive(Deserialize)]
struct TaskAnswer {
    id: i32,
    fencing_token: Option<i64>,
    #[serde(default)]
    task_data: Value,
    heartbeat_in_ms: Option<i64>,
}

impl Http {
    /// A client for the instance at `server`, e.g. `http://127.0.0.1:3000`.
    pub fn new(server: &str) -> Result<Self, String> {
        let base = reqwest::Url::parse(server)
            .map_err(|e| format!("--server {server:?} is not a URL: {e}"))?;
        if base.scheme() != "http" {
            return Err(format!(
                "--server {server:?} must be an http:// URL (workers speak plain HTTP to an instance nearby)"
            ));
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Http { client, base })
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
        body: &Value,
    ) -> Result<(reqwest::StatusCode, Value), TransportError> {
        let url = self.url(segments);
        let response = self
            .client
            .request(method.clone(), url.clone())
            .json(body)
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
        task_id: i32,
        op: &str,
        body: &Value,
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

    /// Maps a non-success answer: 409 and 404 mean the claim is lost.
    fn refusal(status: reqwest::StatusCode, body: &Value) -> TransportError {
        let why = body["error"].as_str().unwrap_or("no error message");
        match status {
            reqwest::StatusCode::CONFLICT | reqwest::StatusCode::NOT_FOUND => {
                TransportError::Lost(format!("{status}: {why}"))
            }
            _ => TransportError::Transient(format!("{status}: {why}")),
        }
    }
}

impl Transport for Http {
    async fn claim(&self, worker: &Holder) -> Result<Option<Claim>, TransportError> {
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                &["api", "tasks", "next"],
                &json!({ "processor": worker }),
            )
            .await?;
        match status {
            reqwest::StatusCode::ACCEPTED => {
                let task: TaskAnswer = serde_json::from_value(body).map_err(|e| {
                    TransportError::Transient(format!("unreadable claimed task: {e}"))
                })?;
                let token = task.fencing_token.ok_or_else(|| {
                    TransportError::Transient("claimed task has no fencing_token".into())
                })?;
                Ok(Some(Claim {
                    task_id: task.id,
                    token,
                    task_data: task.task_data,
                    remaining: ms(task.heartbeat_in_ms),
                }))
            }
            reqwest::StatusCode::OK => Ok(None),
            // Nothing about a claim can be "lost" before it exists.
            other => Err(TransportError::Transient(
                Self::refusal(other, &body).to_string(),
            )),
        }
    }

    async fn heartbeat(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
    ) -> Result<Option<Duration>, TransportError> {
        let body = self
            .task_write(
                task_id,
                "heartbeat",
                &json!({ "processor": worker, "fencing_token": token }),
            )
            .await?;
        Ok(ms(body["heartbeat_in_ms"].as_i64()))
    }

    async fn complete(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
        output: &Value,
    ) -> Result<(), TransportError> {
        self.task_write(
            task_id,
            "complete",
            &json!({ "processor": worker, "fencing_token": token, "task_output": output }),
        )
        .await?;
        Ok(())
    }

    async fn fail(
        &self,
        worker: &Holder,
        task_id: i32,
        token: i64,
        error: &str,
    ) -> Result<(), TransportError> {
        self.task_write(
            task_id,
            "fail",
            &json!({ "processor": worker, "fencing_token": token, "error": error }),
        )
        .await?;
        Ok(())
    }

    async fn report(&self, worker: &Holder, report: &Report) -> Result<(), TransportError> {
        let body = serde_json::to_value(report)
            .map_err(|e| TransportError::Transient(format!("cannot encode the report: {e}")))?;
        let (status, body) = self
            .call(
                reqwest::Method::PUT,
                &["api", "workers", worker.as_str()],
                &body,
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
    fn only_plain_http_urls_are_accepted() {
        assert!(Http::new("https://example.org").is_err());
        assert!(Http::new("not a url").is_err());
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
    }
}

//! The HTTP transport (feature `http-client`): a worker in another process
//! reaches the queue through an instance's REST API.

use super::Report;
use super::transport::{Claim, ClaimRef, Transport, TransportError, ms};
use crate::lease::Holder;
use crate::queue::{
    AttemptOutcome, ClaimFilter, ClaimRequest, CompleteBody, FailBody, HeartbeatBody, SnoozeBody,
    Task,
};
use serde::Serialize;
use serde_json::Value;
use std::time::Duration;

/// The HTTP transport: calls the REST API of a leasekeeper instance.
/// Plain `http://` only (no TLS), as workers talk to an instance nearby.
#[derive(Clone, Debug)]
pub struct Http {
    client: reqwest::Client,
    base: reqwest::Url,
    filter: ClaimFilter,
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
        Ok(Http {
            client,
            base,
            filter: ClaimFilter::default(),
        })
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
                &ClaimRequest::new(worker.clone(), &self.filter),
            )
            .await?;
        match status {
            reqwest::StatusCode::ACCEPTED => {
                let task: Task = serde_json::from_value(body).map_err(|e| {
                    TransportError::Transient(format!("unreadable claimed task: {e}"))
                })?;
                let token = task.fencing_token.ok_or_else(|| {
                    TransportError::Transient("claimed task has no fencing_token".into())
                })?;
                Ok(Some(Claim {
                    task_id: task.id,
                    token,
                    kind: task.kind,
                    queue: task.queue,
                    attempt: task.attempts,
                    remaining: ms(task.heartbeat_in_ms),
                    timeout: ms(task.timeout_ms.map(i64::from)),
                    task_data: task.task_data,
                }))
            }
            reqwest::StatusCode::OK => Ok(None),
            // Nothing about a claim can be "lost" before it exists.
            other => Err(TransportError::Transient(
                Self::refusal(other, &body).to_string(),
            )),
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

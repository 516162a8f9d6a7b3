//! The bodies of the REST worker protocol, one type each for the server
//! that reads it and the client that sends it (the HTTP worker transport,
//! a service's own client): enqueue, claim, heartbeat, complete, fail,
//! snooze. Each reads its fields against the task's limits
//! ([`super::limits`]), so a body refused over REST is refused with the
//! same words as the [`NewTask`] it becomes.

use super::limits::{check_error, seconds};
use super::{
    AttemptOutcome, ClaimFilter, InvalidTask, NewTask, TaskField, TaskName, Unique, UniqueScope,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

/// The body of `POST /api/tasks` (and each item of `POST /api/tasks/batch`).
/// `kind` defaults to the server's (the simulated work, `sleep`), `queue`
/// to `default`, `priority` to 0 (lower runs first). [`EnqueueBody::task`]
/// reads it into a [`NewTask`], checked.
// Only the integer fields take `#[serde(default)]` (their reader needs
// it): on every field it would let a JSON array of two values read as a
// body, a struct's other form in serde.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnqueueBody {
    /// What to do (any JSON but null), e.g. `{"sleep_duration_seconds": 5}`
    /// for the simulated work.
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::json::any_but_null))]
    pub task_data: Value,
    /// Claims allowed before the task is marked failed (the server's
    /// `max_attempts` setting when absent).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    #[serde(
        default,
        deserialize_with = "crate::json::opt_int",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_attempts: Option<i32>,
    /// Not claimed before this many seconds from now (0 to 86400).
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 86400))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_seconds: Option<f64>,
    /// Which handler runs it, 1 to 128 characters (`sleep` when absent).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<TaskName>))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The queue it waits in, 1 to 128 characters (`default` when absent).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<TaskName>))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Lower runs first (0 when absent).
    #[serde(
        default,
        deserialize_with = "crate::json::opt_int",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schema(minimum = -32768, maximum = 32767))]
    pub priority: Option<i16>,
    /// A key that keeps the task unique among tasks of its kind (1 to 256
    /// characters): while a task of the kind holds it (see `unique_scope`),
    /// the enqueue adds nothing and answers that task with 200.
    #[cfg_attr(
        feature = "openapi",
        schema(min_length = 1, max_length = 256, pattern = "^[^\\x00]*$")
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unique_key: Option<String>,
    /// Among which tasks the key is unique: `active` (pending or started;
    /// the default) or `always` (every task still on record). Ignored
    /// without `unique_key`.
    #[cfg_attr(feature = "openapi", schema(pattern = "^(active|always)$"))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unique_scope: Option<String>,
    /// Each attempt may run at most this many seconds (0.001 to 86400):
    /// then the handler is cancelled and the attempt fails ("timed out
    /// after …"). Without it, the runtime's default for the kind, if any.
    #[cfg_attr(feature = "openapi", schema(minimum = 0.001, maximum = 86400))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
    /// When given, the key is unique only among the tasks enqueued in the
    /// same period of this many seconds (1 to 31,622,400; fixed periods
    /// counted from the Unix epoch). Ignored without `unique_key`.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 31622400))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unique_period_seconds: Option<f64>,
    /// The key the queue's limits count the task under (1 to 256
    /// characters: a tenant, an account, an API): at most the queue's
    /// `max_started_per_key` tasks of one key are started at once, and a
    /// limited queue serves its keys fairly. Without one, the task counts
    /// toward the queue's `max_started` only.
    #[cfg_attr(
        feature = "openapi",
        schema(min_length = 1, max_length = 256, pattern = "^[^\\x00]*$")
    )]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
}

impl EnqueueBody {
    /// The task this body asks for, checked ([`NewTask::validate`]), with
    /// `default_kind` and `default_max_attempts` where the body names
    /// none; else the first field refused.
    pub fn task(
        self,
        default_kind: &str,
        default_max_attempts: i32,
    ) -> Result<NewTask, InvalidTask> {
        // The body's own rule: `null` is no work to do (a client that
        // meant "nothing" omits the task instead).
        if self.task_data.is_null() {
            return Err(InvalidTask::new(
                TaskField::Data,
                "task_data must not be null",
            ));
        }
        let delay = self
            .delay_seconds
            .map(|s| seconds(TaskField::Delay, s))
            .transpose()?;
        let scope = match self.unique_scope.as_deref() {
            None => UniqueScope::Active,
            Some(name) => UniqueScope::parse(name).ok_or_else(|| {
                InvalidTask::new(
                    TaskField::UniqueScope,
                    format!("unique_scope must be active or always; got {name:?}"),
                )
            })?,
        };
        let period = self
            .unique_period_seconds
            .map(|s| seconds(TaskField::UniquePeriod, s))
            .transpose()?;
        let timeout = self
            .timeout_seconds
            .map(|s| seconds(TaskField::Timeout, s))
            .transpose()?;
        let mut task = NewTask::new(
            self.kind.unwrap_or_else(|| default_kind.to_string()),
            self.task_data,
        )
        .max_attempts(self.max_attempts.unwrap_or(default_max_attempts))
        .priority(self.priority.unwrap_or(0));
        if let Some(queue) = self.queue {
            task = task.queue(queue);
        }
        task.delay = delay;
        task.timeout = timeout;
        task.unique = self.unique_key.map(|key| Unique { key, scope, period });
        task.concurrency_key = self.concurrency_key;
        task.validate()?;
        Ok(task)
    }
}

/// The most kinds one claim may name.
pub const MAX_CLAIM_KINDS: usize = 100;

/// The body of a claim over REST (`POST /api/tasks/next`), one type for the
/// server that reads it and the HTTP worker transport that sends it: claims
/// for `processor` from `queue` (`default` when absent), only tasks of
/// `kinds` when given (every kind when absent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClaimRequest {
    /// Who claims (the holder of the task's lease).
    pub processor: crate::lease::Holder,
    /// The queue claimed from (1 to 128 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<TaskName>))]
    pub queue: Option<String>,
    /// The kinds claimed (1 to 100 of them, each 1 to 128 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = kind_list))]
    pub kinds: Option<Vec<String>>,
}

/// 1 to 100 kind names of 1 to [`MAX_NAME_CHARS`](super::MAX_NAME_CHARS) characters, or null, for
/// the OpenAPI document.
#[cfg(feature = "openapi")]
fn kind_list() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, SchemaType, Type};
    ArrayBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
        .items(TaskName::inline_schema())
        .min_items(Some(1))
        .max_items(Some(MAX_CLAIM_KINDS))
        .build()
}

impl ClaimRequest {
    /// A claim by `processor` of what `filter` lets through.
    pub fn new(processor: crate::lease::Holder, filter: &ClaimFilter) -> Self {
        ClaimRequest {
            processor,
            queue: Some(filter.queue.clone()),
            kinds: filter.kinds.clone(),
        }
    }

    /// The filter this request asks for, or why it is not a valid one
    /// (a bad queue or kind name, no kinds, or more than [`MAX_CLAIM_KINDS`]).
    pub fn filter(&self) -> Result<ClaimFilter, String> {
        let mut filter = ClaimFilter::default();
        if let Some(queue) = &self.queue {
            TaskName::check("queue", queue)?;
            filter = ClaimFilter::queue(queue.clone());
        }
        if let Some(kinds) = &self.kinds {
            if kinds.is_empty() || kinds.len() > MAX_CLAIM_KINDS {
                return Err(format!(
                    "kinds must name 1 to {MAX_CLAIM_KINDS} kinds, got {}",
                    kinds.len()
                ));
            }
            for kind in kinds {
                TaskName::check("kind", kind)?;
            }
            filter = filter.kinds(kinds.iter().cloned());
        }
        Ok(filter)
    }
}

/// The body of `PUT /api/tasks/{id}/heartbeat`, one type for the server
/// and the HTTP worker transport: the claim a write presents.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeartbeatBody {
    /// Who holds the claim.
    pub processor: crate::lease::Holder,
    /// The claim's token.
    #[serde(deserialize_with = "crate::json::int")]
    pub fencing_token: i64,
}

/// The body of `PUT /api/tasks/{id}/complete` (server and HTTP transport).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CompleteBody {
    /// Who holds the claim.
    pub processor: crate::lease::Holder,
    /// The claim's token.
    #[serde(deserialize_with = "crate::json::int")]
    pub fencing_token: i64,
    /// What the work produced (any JSON).
    pub task_output: Option<serde_json::Value>,
}

/// The body of `PUT /api/tasks/{id}/fail` (server and HTTP transport).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FailBody {
    /// Who holds the claim.
    pub processor: crate::lease::Holder,
    /// The claim's token.
    #[serde(deserialize_with = "crate::json::int")]
    pub fencing_token: i64,
    /// Why the attempt failed (at most 4096 characters, no NUL).
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 4096, pattern = "^[^\\x00]*$")
    )]
    pub error: String,
    /// How the attempt's record ends: `failed` (the default: the handler
    /// failed), `timed_out` (the worker stopped it at its time limit) or
    /// `interrupted` (the worker let go of it unfinished; `given_back`, an
    /// earlier version's name for it, is recorded as `interrupted`). The
    /// queue treats each as a failed attempt. Any other outcome is refused
    /// (400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<String>, pattern = "^(failed|timed_out|interrupted|given_back)$")
    )]
    pub outcome: Option<AttemptOutcome>,
}

impl FailBody {
    /// Refuses an `error` past [`MAX_ERROR_CHARS`](super::MAX_ERROR_CHARS) or holding NUL.
    pub fn check(&self) -> Result<(), InvalidTask> {
        check_error(&self.error)
    }
}

/// The body of `PUT /api/tasks/{id}/snooze` (server and HTTP transport).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnoozeBody {
    /// Who holds the claim.
    pub processor: crate::lease::Holder,
    /// The claim's token.
    #[serde(deserialize_with = "crate::json::int")]
    pub fencing_token: i64,
    /// Due again in this many seconds (0 to 31,622,400).
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 31622400))]
    pub seconds: f64,
}

impl SnoozeBody {
    /// How long the task sleeps: `seconds` within 0 to [`MAX_SNOOZE`](super::MAX_SNOOZE).
    pub fn delay(&self) -> Result<Duration, InvalidTask> {
        seconds(TaskField::Snooze, self.seconds)
    }
}

/// The body of `PUT /api/tasks/{id}/wait` (server and HTTP transport): the
/// claim ends with the task waiting for the signal `signal`, at most
/// `timeout_seconds`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WaitBody {
    /// Who holds the claim.
    pub processor: crate::lease::Holder,
    /// The claim's token.
    #[serde(deserialize_with = "crate::json::int")]
    pub fencing_token: i64,
    /// The signal's name (1 to 128 characters).
    #[cfg_attr(feature = "openapi", schema(value_type = TaskName))]
    pub signal: String,
    /// Pending again without the signal after this many seconds (0.001 to
    /// 31,622,400).
    #[cfg_attr(feature = "openapi", schema(minimum = 0.001, maximum = 31622400))]
    pub timeout_seconds: f64,
}

impl WaitBody {
    /// The wait's timeout, or what is wrong with it.
    pub fn timeout(&self) -> Result<Duration, String> {
        let s = self.timeout_seconds;
        let most = super::MAX_WAIT.as_secs_f64();
        if !s.is_finite() || !(0.001..=most).contains(&s) {
            return Err(format!("timeout_seconds must be between 0.001 and {most}"));
        }
        Ok(Duration::from_secs_f64(s))
    }
}

/// The body of `POST /api/tasks/{id}/signal` (a producer's): the signal's
/// name and its payload, which the task's next claim carries in `signals`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SignalBody {
    /// The signal's name (1 to 128 characters): the one the task waits for.
    #[cfg_attr(feature = "openapi", schema(value_type = TaskName))]
    pub name: String,
    /// Any JSON (null when absent).
    #[serde(default)]
    pub payload: Value,
}

/// The body of `POST /api/tasks/batch`: a JSON array of
/// [`EnqueueBody`]s, read one element at a time so that an over-long array
/// is refused while it is read. Past [`MAX_ENQUEUE_BATCH`](super::MAX_ENQUEUE_BATCH)
/// elements nothing more is kept: the rest is only counted (serde's
/// `IgnoredAny`, which allocates nothing), so a 16 MiB `[0,0,…]` costs
/// the 10,000 values kept, not millions. Each element stays a JSON value
/// until [`EnqueueBatch::bodies`] reads it, so an error names its index.
#[derive(Clone, Debug, PartialEq)]
pub enum EnqueueBatch {
    /// The elements, at most [`MAX_ENQUEUE_BATCH`](super::MAX_ENQUEUE_BATCH).
    Items(Vec<Value>),
    /// The array had more elements than that: how many.
    TooMany(usize),
}

impl EnqueueBatch {
    /// The elements as bodies, in order; else what is wrong, in the words
    /// `enqueue_many` uses (`at most 10000 tasks at once, got …`,
    /// `tasks[3]: …`).
    pub fn bodies(self) -> Result<Vec<EnqueueBody>, String> {
        let items = match self {
            EnqueueBatch::Items(items) => items,
            EnqueueBatch::TooMany(n) => return Err(too_many(n)),
        };
        items
            .into_iter()
            .enumerate()
            .map(|(i, item)| serde_json::from_value(item).map_err(|e| format!("tasks[{i}]: {e}")))
            .collect()
    }
}

/// The refusal of a batch of `n` tasks, past the most one batch takes.
pub fn too_many(n: usize) -> String {
    format!(
        "at most {} tasks at once, got {n}",
        super::MAX_ENQUEUE_BATCH
    )
}

impl<'de> Deserialize<'de> for EnqueueBatch {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Elements;
        impl<'de> serde::de::Visitor<'de> for Elements {
            type Value = EnqueueBatch;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON array of tasks")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<EnqueueBatch, A::Error> {
                use super::MAX_ENQUEUE_BATCH;
                // The size hint is the client's to give (none from JSON);
                // never trusted past the cap.
                let mut items =
                    Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_ENQUEUE_BATCH));
                while let Some(item) = seq.next_element::<Value>()? {
                    items.push(item);
                    if items.len() == MAX_ENQUEUE_BATCH {
                        let mut more = 0usize;
                        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                            more += 1;
                        }
                        if more > 0 {
                            return Ok(EnqueueBatch::TooMany(MAX_ENQUEUE_BATCH + more));
                        }
                        break;
                    }
                }
                Ok(EnqueueBatch::Items(items))
            }
        }
        deserializer.deserialize_seq(Elements)
    }
}

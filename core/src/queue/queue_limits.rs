//! A queue's limits (issue 39): at most so many of its tasks started at
//! once, in all and per concurrency key, and at most so many claims a
//! second across the fleet; and fairness between its keys.
//!
//! - **Exact across the fleet.** The limits are the queue row's columns and
//!   the claim enforces them in the database
//!   ([`sql::limited_claim`](crate::queue::store::sql::limited_claim)):
//!   every claim of a limited queue takes the queue row's lock first, so
//!   they take turns, and counts the started tasks in a snapshot taken
//!   after its turn began. No runtime, instance or REST claimer anywhere
//!   can start more, and nothing has to be told of a change: the next claim
//!   reads it. "Started" counts every claimed task until it ends, a
//!   prefetched claim waiting in a runtime's local queue included.
//! - **A rate shared by the fleet.** `rate_per_second` and `rate_burst`
//!   are a token bucket in the queue row, spent by the claim statement:
//!   in any window of `t` seconds at most `burst + rate × t` claims (a
//!   takeover of a late task is one). Ten instances get the queue's rate,
//!   not ten times it. There is no rate per key.
//! - **Fair between keys.** A limited queue serves the key with the fewest
//!   started tasks first (each candidate's turn is its key's started tasks
//!   plus its rank within the key), so a key with one task waiting starts
//!   it at the next free slot, however many tasks other keys have queued;
//!   within a key, priority then due time orders as in any queue. A queue
//!   with no limit is served in priority order, keys or not: set a limit
//!   (`max_started_per_key` at the most a key may hold) to have fairness.
//! - **A limit applies to claims made after it is set.** Tasks started
//!   before a limit was lowered run on and finish; none is stopped.
//!
//! Claims of a limited queue take turns (one claim statement at a time per
//! queue, each a few milliseconds for a batch), which is what makes them
//! exact; queues without limits claim as before, concurrently.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), leasekeeper_core::queue::queues::QueueError> {
//! use leasekeeper_core::queue::queue_limits::QueueLimits;
//! use leasekeeper_core::queue::queues;
//! let mut conn = pool.acquire().await?;
//! let schema = leasekeeper_core::db::Schema::of(&pool);
//! let limits = QueueLimits {
//!     max_started_per_key: Some(2), // two syncs per customer at once
//!     rate_per_second: Some(5.0),   // five calls a second to the payment API
//!     ..QueueLimits::default()
//! };
//! let sync = queues::set_limits(&mut conn, &schema, "sync", &limits, "ops@example").await?;
//! assert_eq!(sync.limits, limits);
//! # Ok(()) }
//! ```

use serde::{Deserialize, Serialize};

/// The most `max_started` and `max_started_per_key` may be.
pub const MAX_STARTED: i32 = 100_000;
/// The lowest `rate_per_second`: one claim in about 11.6 days. Not any
/// number above 0: the bucket's refill (rate × seconds) of a rate near the
/// smallest float underflows, which PostgreSQL refuses as an error (the
/// API fuzzer sent one, and every claim of the queue failed).
pub const MIN_RATE: f64 = 0.000_001;
/// The highest `rate_per_second`.
pub const MAX_RATE: f64 = 1_000_000.0;
/// The largest `rate_burst`.
pub const MAX_BURST: i32 = 1_000_000;

/// A queue's limits; `None` is no limit (the type is shared with the
/// browser, and is the body of `PUT /api/queues/{name}/limits`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct QueueLimits {
    /// At most this many of the queue's tasks started at once (1 to
    /// 100,000).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100000))]
    #[serde(default)]
    pub max_started: Option<i32>,
    /// At most this many started at once per concurrency key (1 to
    /// 100,000); tasks without a key are not counted per key.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100000))]
    #[serde(default)]
    pub max_started_per_key: Option<i32>,
    /// Claims a second across the fleet (0.000001 to 1,000,000).
    #[cfg_attr(feature = "openapi", schema(minimum = 0.000001, maximum = 1000000))]
    #[serde(default)]
    pub rate_per_second: Option<f64>,
    /// Claims the rate may take at once after a quiet spell (1 to
    /// 1,000,000; one second's worth, at least 1, when not set). Only with
    /// `rate_per_second`: ignored without it over REST, refused by
    /// [`QueueLimits::validate`] from code.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000000))]
    #[serde(default)]
    pub rate_burst: Option<i32>,
}

/// A refused limit: the field, by its name in the body, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct InvalidLimit {
    /// The field refused: `max_started`, `max_started_per_key`,
    /// `rate_per_second` or `rate_burst`.
    pub field: &'static str,
    /// What is wrong, naming the field.
    pub reason: String,
}

impl QueueLimits {
    /// True when any limit is set: the queue's claims take turns.
    pub fn any(&self) -> bool {
        self.max_started.is_some()
            || self.max_started_per_key.is_some()
            || self.rate_per_second.is_some()
    }

    /// Checks each limit against its range; the error names the first field
    /// refused.
    ///
    /// ```
    /// use leasekeeper_core::queue::queue_limits::QueueLimits;
    /// let bad = QueueLimits { max_started_per_key: Some(0), ..QueueLimits::default() };
    /// let err = bad.validate().unwrap_err();
    /// assert_eq!(err.field, "max_started_per_key");
    /// assert_eq!(err.to_string(), "max_started_per_key must be between 1 and 100000, got 0");
    /// ```
    pub fn validate(&self) -> Result<(), InvalidLimit> {
        let count = |field: &'static str, value: Option<i32>, max: i32| match value {
            Some(v) if !(1..=max).contains(&v) => Err(InvalidLimit {
                field,
                reason: format!("{field} must be between 1 and {max}, got {v}"),
            }),
            _ => Ok(()),
        };
        count("max_started", self.max_started, MAX_STARTED)?;
        count("max_started_per_key", self.max_started_per_key, MAX_STARTED)?;
        if let Some(rate) = self.rate_per_second
            && !(rate.is_finite() && (MIN_RATE..=MAX_RATE).contains(&rate))
        {
            return Err(InvalidLimit {
                field: "rate_per_second",
                reason: format!(
                    "rate_per_second must be between {MIN_RATE} and {MAX_RATE}, got {rate}"
                ),
            });
        }
        count("rate_burst", self.rate_burst, MAX_BURST)?;
        if self.rate_burst.is_some() && self.rate_per_second.is_none() {
            return Err(InvalidLimit {
                field: "rate_burst",
                reason: "rate_burst needs rate_per_second".into(),
            });
        }
        Ok(())
    }

    /// The limits a JSON body asks for (`PUT /api/queues/{name}/limits`),
    /// checked ([`QueueLimits::validate`]): an object whose fields are each
    /// absent, null or a number in range (the counts whole). Every refusal
    /// names its field, a wrong type or an unknown field included. A
    /// `rate_burst` without a `rate_per_second` is ignored (as the REST
    /// API's other fields that only mean something beside another are), so
    /// every body its schema allows is answered; the answer's `limits` show
    /// it unset. [`QueueLimits::validate`] refuses it from code.
    ///
    /// ```
    /// use leasekeeper_core::queue::queue_limits::QueueLimits;
    /// let ok = QueueLimits::from_json(&serde_json::json!({"max_started_per_key": 2, "rate_per_second": null})).unwrap();
    /// assert_eq!(ok.max_started_per_key, Some(2));
    /// let err = QueueLimits::from_json(&serde_json::json!({"max_started": "ten"})).unwrap_err();
    /// assert_eq!(err.field, "max_started");
    /// ```
    pub fn from_json(body: &serde_json::Value) -> Result<QueueLimits, InvalidLimit> {
        const FIELDS: [&str; 4] = [
            "max_started",
            "max_started_per_key",
            "rate_per_second",
            "rate_burst",
        ];
        let object = body.as_object().ok_or(InvalidLimit {
            field: "body",
            reason: "the body must be a JSON object of limits".into(),
        })?;
        if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(InvalidLimit {
                field: "body",
                reason: format!(
                    "unknown field {unknown:?}; the limits are {}",
                    FIELDS.join(", ")
                ),
            });
        }
        let number = |field: &'static str| -> Result<Option<f64>, InvalidLimit> {
            match object.get(field) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => v.as_f64().map(Some).ok_or_else(|| InvalidLimit {
                    field,
                    reason: format!("{field} must be a number or null, got {v}"),
                }),
            }
        };
        let count = |field: &'static str, max: i32| -> Result<Option<i32>, InvalidLimit> {
            match number(field)? {
                None => Ok(None),
                Some(n) if n.fract() == 0.0 && (1.0..=f64::from(max)).contains(&n) => {
                    Ok(Some(n as i32))
                }
                Some(n) => Err(InvalidLimit {
                    field,
                    reason: format!("{field} must be a whole number between 1 and {max}, got {n}"),
                }),
            }
        };
        let rate_per_second = number("rate_per_second")?;
        let rate_burst = count("rate_burst", MAX_BURST)?.filter(|_| rate_per_second.is_some());
        let limits = QueueLimits {
            max_started: count("max_started", MAX_STARTED)?,
            max_started_per_key: count("max_started_per_key", MAX_STARTED)?,
            rate_per_second,
            rate_burst,
        };
        limits.validate()?;
        Ok(limits)
    }

    /// The bucket's size: `rate_burst`, or one second's worth of the rate
    /// (at least 1); `None` without a rate.
    pub fn burst(&self) -> Option<i32> {
        self.rate_per_second.map(|rate| {
            self.rate_burst
                .unwrap_or_else(|| rate.ceil().clamp(1.0, MAX_BURST as f64) as i32)
        })
    }
}

/// A concurrency key and its started tasks (the busiest keys of a queue).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KeyStarted {
    /// The key.
    pub key: String,
    /// Its tasks started now.
    pub started: i64,
}

/// How many of a queue's busiest keys the queue's figures show.
pub const BUSIEST_KEYS: i64 = 5;

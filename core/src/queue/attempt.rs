//! A task's attempts on record: each claim of a task, who held it, under
//! which fencing token, and how it ended. Recorded by the database (the
//! attempts migration's triggers on `tasks`), read by
//! [`store::attempts`](super::store::attempts).

use crate::text::text_enum;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

text_enum! {
    stored;
    /// How an attempt ended, or that it has not.
    pub enum AttemptOutcome {
        /// Its claim is current: the processor is working on it.
        Running = "running",
        /// Its processor completed the task.
        Completed = "completed",
        /// Its handler failed (the task was retried after the backoff, or
        /// failed for good), or its lease ran out on the task's last attempt.
        Failed = "failed",
        /// Its lease ran out and another claim took the task.
        TakenOver = "taken_over",
        /// An operator cancelled the task while it ran.
        Cancelled = "cancelled",
        /// It ran past the task's time limit; the worker failed it.
        TimedOut = "timed_out",
        /// Its handler snoozed the task (the attempt is not counted).
        Snoozed = "snoozed",
        /// Its worker gave the task back unstarted, without using an
        /// attempt: claimed ahead into a runtime's local queue, it went back
        /// (a graceful stop, or it waited past its bound) pending again at
        /// once, the attempt not counted (see
        /// [`give_back_each`](super::store::give_back_each)).
        GivenBack = "given_back",
        /// Its worker let go of the task unfinished, the attempt spent: the
        /// worker stopped mid-task, or has no handler for the task's kind.
        /// A failed attempt, retried after the backoff.
        Interrupted = "interrupted",
        /// Its handler put the task to wait for a signal (a durable wait):
        /// the attempt is not counted, and the task is claimed again once
        /// the signal comes or the wait times out.
        Waited = "waited",
    }
}

/// One attempt of a task, as the API and the task page show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "postgres", derive(sqlx::FromRow))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Attempt {
    /// Its number among the task's attempts, from 1 (a snoozed attempt is
    /// numbered too, though the task does not count it).
    pub number: i32,
    /// The processor (worker) that held the claim.
    pub processor: String,
    /// The claim's fencing token: each attempt's is above the one before.
    pub fencing_token: i64,
    /// When it was claimed (database clock).
    pub claimed_at: DateTime<Utc>,
    /// When it ended; `None` while running.
    pub ended_at: Option<DateTime<Utc>>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The error it ended with (a failure, a time-out, a give-back).
    pub error: Option<String>,
}

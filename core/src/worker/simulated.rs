//! The simulated work of the dashboard and the fault harness: a handler for
//! kind [`KIND`] (`sleep`) that sleeps in ticks, optionally crashing its
//! worker (chaos). The dashboard registers it like any other handler; it
//! lives here so the worker loop's own tests and any service that wants a
//! load or fault demonstration can use it too.
//!
//! Task data: `sleep_duration_seconds` (0 to 3600, fractions allowed) is
//! how long the work takes, in ticks of at most [`TICK`]. When it is
//! missing the work takes one second; when it is present but not such a
//! number the attempt fails with an error naming the field, so a malformed
//! task ends `failed` after its attempts instead of being guessed at.
//!
//! With `wait_for` (a signal's name), the work first waits for that
//! signal ([`Done::wait_for`], at most `wait_seconds`, 60 by default, 1 to
//! 3600), then sleeps; its output names the signals it got and the one it
//! gave up waiting for. The fault harness runs such tasks and signals them
//! during its faults.
//!
//! Ticks are scheduled on the monotonic clock from the start of the work:
//! a worker frozen by a pause catches up on the missed ticks at once when
//! it resumes, as a process frozen mid-work would find its timers overdue.

use super::chaos::{Chaos, ChaosSettings, SimulatedCrash};
use super::handler::{Done, HandlerResult, Handlers, Job, TaskContext};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::time::{Instant, sleep_until};

/// The task kind of simulated work.
pub const KIND: &str = "sleep";

/// One tick of work.
pub const TICK: Duration = Duration::from_secs(1);

/// The longest `sleep_duration_seconds` a task may ask for.
pub const MAX_SLEEP: Duration = Duration::from_secs(3600);

/// How long the work on `task_data` takes (see the module docs).
pub fn sleep_duration(task_data: &Value) -> Result<Duration, String> {
    match task_data.get("sleep_duration_seconds") {
        None | Some(Value::Null) => Ok(Duration::from_secs(1)),
        Some(value) => match value.as_f64() {
            Some(secs) if secs.is_finite() && (0.0..=MAX_SLEEP.as_secs_f64()).contains(&secs) => {
                Ok(Duration::from_secs_f64(secs))
            }
            _ => Err(format!(
                "task_data.sleep_duration_seconds must be a number of seconds from 0 to {}, got {value}",
                MAX_SLEEP.as_secs()
            )),
        },
    }
}

/// The simulated-work handler: sleeps in ticks, with `chaos` deciding at
/// every tick whether the worker crashes (see [`ChaosSettings`]).
pub fn handler(
    chaos: ChaosSettings,
) -> impl Fn(Job, TaskContext) -> std::pin::Pin<Box<dyn Future<Output = HandlerResult> + Send>>
+ Send
+ Sync
+ 'static {
    move |job, ctx| Box::pin(work(job, ctx, Chaos::from_os(chaos.clone())))
}

/// The handlers of a simulated worker: this work, under kind [`KIND`].
pub fn handlers(chaos: &ChaosSettings) -> Handlers {
    Handlers::new().register(KIND, handler(chaos.clone()))
}

/// The signal `task_data` asks to wait for first, and for how long at most.
pub fn wait_for(task_data: &Value) -> Result<Option<(String, Duration)>, String> {
    let Some(name) = task_data.get("wait_for") else {
        return Ok(None);
    };
    let Some(name) = name.as_str() else {
        return Err(format!(
            "task_data.wait_for must be a signal's name, got {name}"
        ));
    };
    let secs = match task_data.get("wait_seconds") {
        None | Some(Value::Null) => 60.0,
        Some(v) => match v.as_f64() {
            Some(s) if s.is_finite() && (1.0..=3600.0).contains(&s) => s,
            _ => {
                return Err(format!(
                    "task_data.wait_seconds must be from 1 to 3600, got {v}"
                ));
            }
        },
    };
    Ok(Some((name.to_string(), Duration::from_secs_f64(secs))))
}

async fn work(job: Job, ctx: TaskContext, mut chaos: Chaos) -> HandlerResult {
    let plan = sleep_duration(&job.data)?;
    if let Some((signal, timeout)) = wait_for(&job.data)?
        && !job.signals.contains_key(&signal)
        && job.wait_timed_out.is_none()
    {
        return Ok(Done::wait_for(signal, timeout));
    }
    let mut left = plan;
    let mut ticks: u32 = 0;
    let mut next_tick = Instant::now() + left.min(TICK);
    while !left.is_zero() {
        tokio::select! {
            biased;
            // Cancelled by an operator, lost, or past its time limit: stop
            // sleeping at once, so the worker is free for the next task.
            () = ctx.cancelled() => return Err("cancelled, or the claim was lost or timed out".into()),
            () = sleep_until(next_tick) => {}
        }
        left -= left.min(TICK);
        ticks += 1;
        if chaos.crash_at_tick(ticks) {
            tracing::warn!(worker = %ctx.worker(), task_id = job.id, ticks,
                "chaos: crashing (no completion, no release)");
            return Err(Box::new(SimulatedCrash));
        }
        next_tick += left.min(TICK);
    }
    let mut output = json!({
        "worker": ctx.worker(),
        "ticks": ticks,
        "slept_seconds": plan.as_secs_f64(),
    });
    if !job.signals.is_empty() {
        output["signals"] = Value::Object(job.signals.clone());
    }
    if let Some(gave_up) = &job.wait_timed_out {
        output["wait_timed_out"] = json!(gave_up);
    }
    Ok(Done::output(output))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleep_durations() {
        assert_eq!(sleep_duration(&json!({})), Ok(Duration::from_secs_f64(1.0)));
        assert_eq!(
            sleep_duration(&json!("text")),
            Ok(Duration::from_secs_f64(1.0))
        );
        assert_eq!(
            sleep_duration(&json!({"sleep_duration_seconds": 0})),
            Ok(Duration::ZERO)
        );
        assert_eq!(
            sleep_duration(&json!({"sleep_duration_seconds": 2.5})),
            Ok(Duration::from_secs_f64(2.5))
        );
        for bad in [json!(-1), json!(3601), json!("5"), json!(true)] {
            assert!(sleep_duration(&json!({ "sleep_duration_seconds": bad })).is_err());
        }
    }
}

//! What the library counts and times, through the [`metrics`] facade. A
//! service installs whichever recorder it likes (the dashboard exports
//! Prometheus text at `/metrics`) and calls [`describe`] once; without a
//! recorder every call here is a no-op.
//!
//! Counted where it happens, per process: a claim, takeover or refusal made
//! through this process's stores (its runtime's workers, or the REST
//! requests it serves). Sum them over the processes for the whole cluster.

use std::time::Duration;

/// Counter: tasks claimed.
pub const CLAIMS_TOTAL: &str = "leasekeeper_claims_total";
/// Counter: new terms begun on a lease whose previous term ran out
/// unreleased (a task taken over from a silent worker, a singleton from a
/// dead instance).
pub const TAKEOVERS_TOTAL: &str = "leasekeeper_takeovers_total";
/// Counter: writes refused because their fencing token or claim was no
/// longer current (each also in `lease_events` as `stale_write_refused`).
pub const STALE_WRITES_REFUSED_TOTAL: &str = "leasekeeper_stale_writes_refused_total";
/// Histogram: how long a lease renewal (a lease's renew, a task's
/// heartbeat) took, in seconds.
pub const LEASE_RENEW_SECONDS: &str = "leasekeeper_lease_renew_seconds";
/// Histogram: for each takeover, seconds from the old holder's last sign
/// of life (its last renewal or heartbeat) to the new term.
pub const FAILOVER_SECONDS: &str = "leasekeeper_failover_seconds";
/// Counter, label `table`: rows the maintenance job deleted because they
/// were older than the retention.
pub const PRUNED_ROWS_TOTAL: &str = "leasekeeper_pruned_rows_total";
/// Counter, label `schedule`: ticks fired by this process.
pub const SCHEDULE_TICKS_TOTAL: &str = "leasekeeper_schedule_ticks_total";
/// Histogram: seconds from a tick's time to its firing (`fired_at - tick_at`).
pub const SCHEDULE_LATENESS_SECONDS: &str = "leasekeeper_schedule_lateness_seconds";
/// Counter: ticks fired late to catch up a gap nobody led through.
pub const SCHEDULE_TICKS_CAUGHT_UP_TOTAL: &str = "leasekeeper_schedule_ticks_caught_up_total";
/// Gauge, label `status`: tasks by status (set by the host when scraped).
pub const TASKS: &str = "leasekeeper_tasks";
/// Gauge, labels `queue` and `status` (`pending`, `started`, `failed`):
/// tasks of each queue by status (set by the host when scraped, from
/// [`crate::queue::queues::list`]).
pub const QUEUE_DEPTH: &str = "leasekeeper_queue_depth";
/// Gauge, label `queue`: seconds the queue's longest-waiting due pending
/// task has waited (0 when none is due; set by the host when scraped).
pub const QUEUE_OLDEST_PENDING_SECONDS: &str = "leasekeeper_queue_oldest_pending_seconds";

/// Registers each metric's unit and help text with the installed recorder.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(CLAIMS_TOTAL, "Tasks claimed through this process.");
    describe_counter!(
        TAKEOVERS_TOTAL,
        "New lease terms begun after the previous term ran out unreleased."
    );
    describe_counter!(
        STALE_WRITES_REFUSED_TOTAL,
        "Writes refused because their fencing token or claim was no longer current."
    );
    describe_histogram!(
        LEASE_RENEW_SECONDS,
        Unit::Seconds,
        "Time a lease renewal or task heartbeat took."
    );
    describe_histogram!(
        FAILOVER_SECONDS,
        Unit::Seconds,
        "Time from the old holder's last renewal to another holder's term."
    );
    describe_gauge!(TASKS, "Tasks by status.");
    describe_gauge!(QUEUE_DEPTH, "Tasks of each queue by status.");
    describe_gauge!(
        QUEUE_OLDEST_PENDING_SECONDS,
        Unit::Seconds,
        "How long each queue's longest-waiting due pending task has waited."
    );
    describe_counter!(
        SCHEDULE_TICKS_TOTAL,
        "Schedule ticks fired by this process, by schedule."
    );
    describe_histogram!(
        SCHEDULE_LATENESS_SECONDS,
        Unit::Seconds,
        "Time from a schedule tick's time to its firing."
    );
    describe_counter!(
        SCHEDULE_TICKS_CAUGHT_UP_TOTAL,
        "Schedule ticks fired late to catch up a gap nobody led through."
    );
    describe_counter!(
        PRUNED_ROWS_TOTAL,
        "Rows deleted by the maintenance job as older than the retention, by table."
    );
}

/// `n` tasks were claimed.
pub(crate) fn claimed(n: usize) {
    if n > 0 {
        metrics::counter!(CLAIMS_TOTAL).increment(n as u64);
    }
}

/// A term began on a lease whose previous term ran out unreleased, its
/// holder silent for `silent_ms`.
pub(crate) fn took_over(silent_ms: i64) {
    metrics::counter!(TAKEOVERS_TOTAL).increment(1);
    metrics::histogram!(FAILOVER_SECONDS).record(silent_ms.max(0) as f64 / 1000.0);
}

/// A stale write was refused.
pub(crate) fn refused() {
    metrics::counter!(STALE_WRITES_REFUSED_TOTAL).increment(1);
}

/// `n` renewals took `took` (one statement for all of them).
pub(crate) fn renewed(took: Duration, n: usize) {
    let histogram = metrics::histogram!(LEASE_RENEW_SECONDS);
    for _ in 0..n {
        histogram.record(took);
    }
}

/// The maintenance job deleted `n` rows of `table`.
pub(crate) fn pruned(table: &'static str, n: u64) {
    if n > 0 {
        metrics::counter!(PRUNED_ROWS_TOTAL, "table" => table).increment(n);
    }
}

/// A tick of `schedule` fired `lateness_ms` after its time.
pub(crate) fn schedule_tick(schedule: &str, lateness_ms: i64, caught_up: bool) {
    metrics::counter!(SCHEDULE_TICKS_TOTAL, "schedule" => schedule.to_string()).increment(1);
    metrics::histogram!(SCHEDULE_LATENESS_SECONDS).record(lateness_ms.max(0) as f64 / 1000.0);
    if caught_up {
        metrics::counter!(SCHEDULE_TICKS_CAUGHT_UP_TOTAL).increment(1);
    }
}

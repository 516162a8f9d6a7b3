//! What the library counts and times, through the [`metrics`] facade. A
//! service installs whichever recorder it likes (the dashboard exports
//! Prometheus text at `/metrics`) and calls [`describe`] once; without a
//! recorder every call here is a no-op.
//!
//! Counted where it happens, per process: a claim, takeover or refusal made
//! through this process's stores (its runtime's workers, or the REST
//! requests it serves). Sum them over the processes for the whole cluster.
//!
//! Every family is there from the first scrape, as Prometheus'
//! instrumentation guidelines ask (so `rate()` and `absent()` do not
//! misfire after a restart): [`describe`] registers the families without
//! per-task labels (counters at 0, histograms with zero counts), and
//! [`register_work`] the counters of each `(queue, kind)` a process serves
//! (a runtime registers its queues × its handlers' kinds when it starts).
//! A pair first seen later (a REST worker's claim of another kind) appears
//! with its first event.
//!
//! Labels: the task counters carry `queue` and `kind`;
//! [`STALE_WRITES_REFUSED_TOTAL`] carries `source` (`task`, whose refusals
//! also carry `queue` and `kind`; `singleton`, a singleton's fenced write;
//! `assert_fence`, a host's own write through [`crate::lease::fence`]).

use std::time::Duration;

/// Counter, labels `queue`, `kind`: tasks claimed.
pub const CLAIMS_TOTAL: &str = "leasekeeper_claims_total";
/// Counter, labels `queue`, `kind`: tasks completed (accepted completions).
pub const COMPLETIONS_TOTAL: &str = "leasekeeper_completions_total";
/// Counter, labels `queue`, `kind`: failed attempts (retried or failed for
/// good), as reported by their claim's holder.
pub const FAILURES_TOTAL: &str = "leasekeeper_failures_total";
/// Counter, label `queue`: claims a queue's limits turned down: each time
/// a claim of a limited queue took fewer tasks than it asked for while due
/// tasks waited, the shortfall (at most the due tasks left). See
/// [`crate::queue::queue_limits`].
pub const CLAIMS_DEFERRED_TOTAL: &str = "leasekeeper_claims_deferred_total";
/// Counter: new terms begun on a lease whose previous term ran out
/// unreleased (a task taken over from a silent worker, a singleton from a
/// dead instance).
pub const TAKEOVERS_TOTAL: &str = "leasekeeper_takeovers_total";
/// Counter, label `source` (and `queue`, `kind` for `task`): writes refused
/// because their fencing token or claim was no longer current (each also
/// in `lease_events` as `stale_write_refused`, but `assert_fence`'s, which
/// abort the caller's transaction).
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

/// The values of [`STALE_WRITES_REFUSED_TOTAL`]'s label `source` that
/// carry no queue and kind.
const UNTASKED_SOURCES: [&str; 2] = ["singleton", "assert_fence"];

/// Registers each metric's unit and help text with the installed recorder,
/// and every family that has no per-task labels (counters at 0, histograms
/// empty), so they are exported from the first scrape.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(CLAIMS_TOTAL, "Tasks claimed through this process.");
    describe_counter!(
        COMPLETIONS_TOTAL,
        "Tasks completed through this process (accepted completions)."
    );
    describe_counter!(
        FAILURES_TOTAL,
        "Failed attempts reported through this process (retried or failed for good)."
    );
    describe_counter!(
        CLAIMS_DEFERRED_TOTAL,
        "Claims of a limited queue turned down by its limits while due tasks waited."
    );
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
    // Registering a handle is enough: the exporter renders a counter at 0
    // and a histogram with zero counts until the first event.
    metrics::counter!(TAKEOVERS_TOTAL).absolute(0);
    metrics::counter!(SCHEDULE_TICKS_CAUGHT_UP_TOTAL).absolute(0);
    for source in UNTASKED_SOURCES {
        metrics::counter!(STALE_WRITES_REFUSED_TOTAL, "source" => source).absolute(0);
    }
    // The pruner's own list, not the maintenance job's: the job (a
    // singleton on a lease) counts here, so naming it would make this
    // module, which every store counts through, depend on the leases.
    for table in crate::maintenance::store::Table::ALL {
        metrics::counter!(PRUNED_ROWS_TOTAL, "table" => table.as_str()).absolute(0);
    }
    let _ = metrics::histogram!(LEASE_RENEW_SECONDS);
    let _ = metrics::histogram!(FAILOVER_SECONDS);
    let _ = metrics::histogram!(SCHEDULE_LATENESS_SECONDS);
}

/// Registers the task counters of every `(queue, kind)` pair at 0 (claims,
/// completions, failures, refused stale writes), so they are exported
/// before their first event. A runtime calls it with its queues × its
/// handlers' kinds when it starts; a host that serves other workers (the
/// dashboard's REST API) calls it for the pairs it knows.
pub fn register_work<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) {
    for (queue, kind) in pairs {
        let labels = [("queue", queue.to_string()), ("kind", kind.to_string())];
        metrics::counter!(CLAIMS_TOTAL, &labels).absolute(0);
        metrics::counter!(COMPLETIONS_TOTAL, &labels).absolute(0);
        metrics::counter!(FAILURES_TOTAL, &labels).absolute(0);
        metrics::counter!(
            STALE_WRITES_REFUSED_TOTAL,
            &[
                ("source", "task".to_string()),
                ("queue", queue.to_string()),
                ("kind", kind.to_string()),
            ]
        )
        .absolute(0);
    }
}

/// `tasks` were claimed.
pub(crate) fn claimed(tasks: &[crate::queue::Task]) {
    for task in tasks {
        metrics::counter!(CLAIMS_TOTAL, "queue" => task.queue.clone(), "kind" => task.kind.clone())
            .increment(1);
    }
}

/// A claim of `queue` got `n` tasks fewer than it asked for, its limits
/// holding back due tasks.
pub(crate) fn deferred(queue: &str, n: u64) {
    metrics::counter!(CLAIMS_DEFERRED_TOTAL, "queue" => queue.to_string()).increment(n);
}

/// `task` was completed.
pub(crate) fn completed(task: &crate::queue::Task) {
    metrics::counter!(COMPLETIONS_TOTAL, "queue" => task.queue.clone(), "kind" => task.kind.clone())
        .increment(1);
}

/// An attempt at `task` failed.
pub(crate) fn failed(task: &crate::queue::Task) {
    metrics::counter!(FAILURES_TOTAL, "queue" => task.queue.clone(), "kind" => task.kind.clone())
        .increment(1);
}

/// A term began on a lease whose previous term ran out unreleased, its
/// holder silent for `silent_ms`.
pub(crate) fn took_over(silent_ms: i64) {
    metrics::counter!(TAKEOVERS_TOTAL).increment(1);
    metrics::histogram!(FAILOVER_SECONDS).record(silent_ms.max(0) as f64 / 1000.0);
}

/// What made a refused stale write.
pub(crate) enum Refused<'a> {
    /// A processor's write to `task` (whose queue and kind label it).
    Task(&'a crate::queue::Task),
    /// A singleton's fenced write.
    Singleton,
    /// A host's own write through `assert_fence`.
    AssertFence,
}

/// A stale write was refused.
pub(crate) fn refused(what: Refused<'_>) {
    match what {
        Refused::Task(task) => metrics::counter!(
            STALE_WRITES_REFUSED_TOTAL,
            "source" => "task", "queue" => task.queue.clone(), "kind" => task.kind.clone()
        )
        .increment(1),
        Refused::Singleton => {
            metrics::counter!(STALE_WRITES_REFUSED_TOTAL, "source" => "singleton").increment(1)
        }
        Refused::AssertFence => {
            metrics::counter!(STALE_WRITES_REFUSED_TOTAL, "source" => "assert_fence").increment(1)
        }
    }
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

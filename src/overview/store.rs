//! The overview's reads: counts that stay cheap with a million tasks, and
//! the whole [`Overview`] assembled for the page and the REST route.

use super::Overview;
use super::sampler::Sampler;
use leasekeeper_core::counts::counts;
use leasekeeper_core::worker::WorkerState;
use sqlx::PgConnection;
use std::time::Duration;

/// Whose overview [`read`] assembles: the answering instance, its sampler,
/// and how it judges who is alive.
#[derive(Clone, Copy, Debug)]
pub struct Viewpoint<'a> {
    /// The schema of leasekeeper's tables.
    pub schema: &'a leasekeeper_core::db::Schema,
    /// The instance that answers (shown as `answered_by`).
    pub instance_id: &'a str,
    /// That instance's throughput sampler and split-brain check.
    pub sampler: &'a Sampler,
    /// The instances' heartbeat period; an instance silent for
    /// [`leasekeeper_core::instance::alive_window`] of it is no longer alive.
    pub renew_interval: Duration,
    /// The lease TTL; a worker silent for longer is no longer alive.
    pub lease_ttl: Duration,
}

/// Everything the overview shows, as `at`'s instance sees it: counts,
/// instances and workers read now; throughput and the split-brain result
/// from the instance's sampler (the check runs here when the sampler has
/// none yet). The REST route and the page's server function both call this,
/// on a read connection ([`crate::state::AppState::read`]).
pub async fn read(conn: &mut PgConnection, at: Viewpoint<'_>) -> sqlx::Result<Overview> {
    use leasekeeper_core::lease::history::split_brain::{MAX_EVENTS, WINDOW, check};
    let counts = counts(&mut *conn, at.schema).await?;
    let alive_window = leasekeeper_core::instance::alive_window(at.renew_interval);
    let instances =
        leasekeeper_core::instance::store::list(&mut *conn, at.schema, alive_window).await?;
    // A simulated worker dies with its instance: leave out those of dead
    // instances at once, not only when their own rows go stale.
    let dead = leasekeeper_core::instance::dead_ids(&instances);
    let workers: Vec<_> =
        leasekeeper_core::worker::registry::list_alive(&mut *conn, at.schema, at.lease_ttl)
            .await?
            .into_iter()
            .filter(|w| w.alive_given(&dead))
            .collect();
    let now_ms: i64 = sqlx::query_scalar("SELECT (EXTRACT(EPOCH FROM now()) * 1000)::bigint")
        .fetch_one(&mut *conn)
        .await?;
    let split_brain = match at.sampler.split_brain() {
        Some(known) => known,
        None => check(&mut *conn, at.schema, WINDOW, MAX_EVENTS).await?,
    };
    let busy = workers
        .iter()
        .filter(|w| w.state == WorkerState::Working && w.task_id.is_some())
        .count();
    Ok(Overview {
        counts,
        instances_alive: instances.iter().filter(|i| i.alive).count() as i64,
        workers_alive: workers.len() as i64,
        workers_busy: busy as i64,
        instances,
        workers,
        throughput: at.sampler.throughput(now_ms),
        split_brain,
        answered_by: at.instance_id.to_string(),
    })
}

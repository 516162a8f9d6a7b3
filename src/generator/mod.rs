//! The lease-guarded task generator of the dashboard: the per-instance
//! runtime ([`Generator`]) over the library's singleton, and the status the
//! REST route and the dashboard show. Its types and SQL are the library's
//! ([`leasekeeper_core::generator`]).

#[cfg(feature = "ssr")]
use leasekeeper_core::generator::{Desired, GeneratorStatus, store};

#[cfg(feature = "ssr")]
mod runtime;
#[cfg(feature = "ssr")]
pub use runtime::{Generator, GeneratorConfig, GeneratorHandle};

/// The status as `answered_by` this instance, with its local singleton
/// state when it runs a generator: what the REST route and the dashboard show.
#[cfg(feature = "ssr")]
pub async fn report(
    conn: &mut sqlx::PgConnection,
    instance_id: &str,
    local: Option<&GeneratorHandle>,
) -> sqlx::Result<GeneratorStatus> {
    let mut status = store::status(conn).await?;
    status.answered_by = Some(instance_id.to_string());
    status.local_state = local.map(|g| g.state().as_str().to_string());
    Ok(status)
}

/// Records the operator's wish through this instance, wakes the local
/// generator so it acts at once, and reports the new status.
#[cfg(feature = "ssr")]
pub async fn request(
    conn: &mut sqlx::PgConnection,
    desired: Desired,
    instance_id: &str,
    local: Option<&GeneratorHandle>,
) -> sqlx::Result<GeneratorStatus> {
    store::set_desired(&mut *conn, desired, instance_id).await?;
    if let Some(generator) = local {
        generator.nudge();
    }
    report(conn, instance_id, local).await
}

//! What every request handler and server function can reach: the state the
//! router is built over, assembled once at start-up (`server::serve`) or by a
//! test or benchmark harness.

use crate::settings::Settings;
use crate::worker::fleet::Fleet;
use axum::extract::FromRef;
use leasekeeper_core::generator::runtime::GeneratorHandle;
use leasekeeper_core::live::LiveHub;
use leptos::config::LeptosOptions;
use sqlx::PgPool;
use std::sync::Arc;

/// What every request handler and server function can reach.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Leptos' rendering options (site root, output name, address).
    pub leptos_options: LeptosOptions,
    /// The database pool: workers' writes, operator controls, the
    /// singletons.
    pub pool: PgPool,
    /// The pool requests' reads run on, under the read timeout
    /// ([`crate::reads`]), so slow reads never take the workers'
    /// connections.
    pub read_pool: PgPool,
    /// The resolved settings.
    pub settings: Arc<Settings>,
    /// This process's instance id (its row in `instances`, its holder name
    /// for the generator lease; simulated workers are named after it).
    pub instance_id: Arc<str>,
    /// The local generator runtime, when one runs in this process.
    pub generator: Option<GeneratorHandle>,
    /// The local scheduler, when one runs in this process (nudged after a
    /// schedule changes through this instance).
    pub scheduler: Option<leasekeeper_core::schedule::runtime::SchedulerHandle>,
    /// This instance's simulated workers.
    pub fleet: Fleet,
    /// The fan-out of database changes to this instance's browsers.
    pub live: LiveHub,
    /// The overview's throughput sampler and split-brain check.
    pub overview: crate::overview::sampler::Sampler,
}

impl AppState {
    /// The schema of leasekeeper's tables, which every statement names.
    pub fn schema(&self) -> &leasekeeper_core::db::Schema {
        &self.settings.schema
    }

    /// This instance's view for [`crate::overview::store::read`].
    pub fn viewpoint(&self) -> crate::overview::store::Viewpoint<'_> {
        crate::overview::store::Viewpoint {
            schema: self.schema(),
            instance_id: &self.instance_id,
            sampler: &self.overview,
            renew_interval: self.settings.renew_interval,
            lease_ttl: self.settings.lease_ttl,
        }
    }
}

impl AppState {
    /// A read on the read pool, in a transaction whose statements time
    /// out after the `read_timeout` setting, cancelled in the database if
    /// the request is dropped half-way ([`crate::reads`]; run one with
    /// [`crate::reads::read!`]).
    pub async fn begin_read(&self) -> Result<crate::reads::ReadConn, crate::error::AppError> {
        crate::reads::ReadConn::begin(&self.read_pool, &self.pool, self.settings.read_timeout).await
    }
}

impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> Self {
        state.leptos_options.clone()
    }
}

//! The OpenAPI descriptions of the path parameters many routes share,
//! written once: a handler's `#[utoipa::path(params(...))]` names them, e.g.
//! `params(TaskIdPath, CursorQuery)`. What a route really accepts is its
//! extractor's ([`Id`](super::extract::Id) for row ids).

use utoipa::IntoParams;

/// `{id}` of a task route.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TaskIdPath {
    /// The task's row id (a positive integer)
    #[param(minimum = 1)]
    pub id: i64,
}

/// `{id}` of a lease route.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct LeaseIdPath {
    /// The lease's row id (a positive integer)
    #[param(minimum = 1)]
    pub id: i64,
}

/// `{id}` of a worker route.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct WorkerIdPath {
    /// The worker's id (1 to 256 characters, no control characters)
    #[param(value_type = leasekeeper_core::lease::Holder)]
    pub id: String,
}

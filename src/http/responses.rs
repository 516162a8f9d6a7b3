//! The OpenAPI response rows many routes share, written once: a handler's
//! `#[utoipa::path(responses(...))]` names them beside its own rows, e.g.
//! `responses((status = 200, ...), BadId, TaskNotFound, Unauthorized)`.
//!
//! Each is a type only for the document (`utoipa::IntoResponses`); what a
//! route really answers comes from [`AppError`](crate::error::AppError),
//! whose body is [`ErrorBody`].

use crate::error::ErrorBody;
use leasekeeper_core::lease::Lease;
use leasekeeper_core::queue::Task;
use utoipa::IntoResponses;

/// `200` of a lease list.
#[derive(IntoResponses)]
#[response(
    status = 200,
    description = "A page of leases, newest first (oldest first with `after`)",
    headers(("Link" = String, description = "The next (older) page, `<...?before=ID&limit=N>; rel=\"next\"`, when older rows remain"))
)]
pub struct LeasePage(pub Vec<Lease>);

/// `200` of a task list.
#[derive(IntoResponses)]
#[response(
    status = 200,
    description = "A page of tasks, newest first (oldest first with `after`)",
    headers(("Link" = String, description = "The next (older) page, `<...?before=ID&limit=N>; rel=\"next\"`, when older rows remain"))
)]
pub struct TaskPage(pub Vec<Task>);

/// `400` of a lease list.
#[derive(IntoResponses)]
#[response(
    status = 400,
    description = "A bad query: unknown parameter, not a number, `before` with `after`"
)]
pub struct BadLeaseQuery(pub ErrorBody);

/// `400` of a task list.
#[derive(IntoResponses)]
#[response(
    status = 400,
    description = "A bad query: unknown parameter or status, a bad kind or queue name, a `data` that is not a JSON object, not a number, `before` with `after`"
)]
pub struct BadTaskQuery(pub ErrorBody);

/// `400` of a route whose only input is an id in its path.
#[derive(IntoResponses)]
#[response(status = 400, description = "A bad id")]
pub struct BadId(pub ErrorBody);

/// `404` of a route that names a task.
#[derive(IntoResponses)]
#[response(status = 404, description = "No task with that id")]
pub struct TaskNotFound(pub ErrorBody);

/// `404` of a route that names a lease.
#[derive(IntoResponses)]
#[response(status = 404, description = "No lease with that id")]
pub struct LeaseNotFound(pub ErrorBody);

/// `404` of a route that names a worker.
#[derive(IntoResponses)]
#[response(status = 404, description = "No such worker")]
pub struct WorkerNotFound(pub ErrorBody);

/// `409` of a write a worker's claim fences.
#[derive(IntoResponses)]
#[response(
    status = 409,
    description = "A stale write: the claim was lost (another token, deadline passed) or the task finished; recorded as `stale_write_refused`"
)]
pub struct StaleWrite(pub ErrorBody);

/// `401` of an operator route.
#[derive(IntoResponses)]
#[response(
    status = 401,
    description = "The admin token is set and the request lacks it"
)]
pub struct Unauthorized(pub ErrorBody);

/// `401` of a worker or producer route (enqueue, claim, a claim's writes,
/// a worker's report, application leases).
#[derive(IntoResponses)]
#[response(
    status = 401,
    description = "A token is set on the server (LEASEKEEPER_WORKER_TOKEN or LEASEKEEPER_ADMIN_TOKEN) and the request carries neither; nothing was read or recorded"
)]
pub struct NeedsCredential(pub ErrorBody);

/// `403` of a lease route given a name the library keeps for itself.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "The resource starts with a reserved prefix (`task:`, `singleton:`, `queue:`, `schedule:`, `worker:`, `instance:`): the library's own leases are not reachable here, for any caller; an operator ends one with force-release"
)]
pub struct ReservedResource(pub ErrorBody);

/// `413` of a route that reads a body.
#[derive(IntoResponses)]
#[response(status = 413, description = "The body is over 64 KiB")]
pub struct TooLarge(pub ErrorBody);

/// `400` of a paged list that takes only `before` and `limit`.
#[derive(IntoResponses)]
#[response(status = 400, description = "A bad query")]
pub struct BadQuery(pub ErrorBody);

/// `415` of a route that reads a JSON body.
#[derive(IntoResponses)]
#[response(
    status = 415,
    description = "The body is not said to be JSON: `Content-Type` must be `application/json` (parameters allowed) or `application/*+json`"
)]
pub struct NotJson(pub ErrorBody);

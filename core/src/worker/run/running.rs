//! A handler at work on one claim: polled by the loop, not spawned, so a
//! pause freezes it too; its panics caught and turned into a message.

use super::super::handler::{Handler, HandlerFuture, HandlerResult, TaskContext};
use super::super::transport::Claim;
use futures::FutureExt;
use std::panic::AssertUnwindSafe;

/// What a handler answered, or the panic it ended in.
pub(super) type Outcome = std::thread::Result<HandlerResult>;

/// A handler at work on one claim, its panics caught.
pub(super) struct Running(pub(super) futures::future::CatchUnwind<AssertUnwindSafe<HandlerFuture>>);

impl Running {
    /// Starts `handler` on `claim`.
    pub(super) fn start(handler: &dyn Handler, claim: &Claim, ctx: TaskContext) -> Self {
        Running(AssertUnwindSafe(handler.handle(claim.job(), ctx)).catch_unwind())
    }
}

/// The message of a caught panic.
pub(super) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

//! The dashboard's workers: the simulated fleet inside each instance
//! ([`fleet`]) and the `leasekeeper worker` process ([`process`]). The
//! worker loop, its transports and the `workers` table are the library's
//! ([`leasekeeper_core::worker`]).

#[cfg(feature = "ssr")]
pub mod fleet;
#[cfg(feature = "ssr")]
pub mod history;
#[cfg(feature = "ssr")]
pub mod process;

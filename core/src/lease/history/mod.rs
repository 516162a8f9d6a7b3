//! The one reading of `lease_events`, the history of every term: a
//! resource's timeline (terms, the gaps between them, refused writes and
//! operator actions) for the lease page ([`timeline`]), and the split-brain
//! check (two live holders of one resource at once, in a bounded recent
//! window, and tasks that disagree with their leases) for the overview
//! ([`split_brain`]). The dashboard renders them; a new reading of the
//! history goes here.
//!
//! The fault harness keeps its own, independent walk of the same table (in
//! `tools/`): an oracle that shared this code could not catch its bugs.

pub mod split_brain;
pub mod timeline;
